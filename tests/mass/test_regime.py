"""Notebook 04's regime check (moelab.mass): the within-example Bayes predictor against a loop over examples, add-k
chosen on the validation draw, the seed-level gap to the best n-gram against scipy, the per-profile config."""
import dataclasses

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import moelab.mass as ms


def _setup(**kw):
    return ms.SynthSetup(steps=20, batch_size=8, n_test=16, data_format="incontext", n_examples=3, example_len=4,
                         entity_switch="uniform", n_entities=3, n_properties=3, n_symbols=6, **kw)


def test_within_example_bayes_is_bayes_of_each_example_alone():
    s = _setup()
    g, _, test = s.data()
    got = ms.within_example_bayes(g, test)["target_nll"]
    L = s.example_len
    for i in range(4):                                  # loop: every example as a one-example sequence
        per = []
        for e in range(s.n_examples):
            tok = test["tokens"][i:i + 1, e * (L + 1): e * (L + 1) + L]
            one = dict(tokens=tok, n_examples=1, example_len=L)
            per.append(ms.incontext_bayes(g, one)["target_nll"][0])
        assert got[i] == pytest.approx(np.mean(per), rel=1e-9)
    full = ms.incontext_bayes(g, test)["target_nll"]
    assert got.mean() >= full.mean() - 1e-9            # seeing fewer tokens cannot beat the Bayes floor on average
    one = ms.sample_incontext(g, 8, 1, L, seed=3)      # one example: both predictors see the same tokens
    np.testing.assert_allclose(ms.within_example_bayes(g, one)["target_nll"], ms.incontext_bayes(g, one)["target_nll"])


def test_reference_levels_choose_k_on_validation_and_add_the_4gram():
    s = _setup()
    t = ms.reference_levels(s, orders=(3, 4), k_grid=(0.1, 1.0))
    assert {"Bayes", "within-example Bayes", "trigram", "4-gram"} <= set(t.name)
    g, tr, te = s.data()
    val = ms.sample_incontext(g, s.n_test, s.n_examples, s.example_len, seed=s.data_seed + ms.EVAL_SPLITS["validation"])
    for r in t[t.order > 0].itertuples():
        on_val = {k: ms.ngram_baselines(tr, val, 6, orders=(r.order,), k=k, fit_on=r.fit_on).target_nll[0]
                  for k in (0.1, 1.0)}
        assert r.k == min(on_val, key=on_val.get) and r.val_target_nll == pytest.approx(min(on_val.values()))
        test_nll = ms.ngram_baselines(tr, te, 6, orders=(r.order,), k=r.k, fit_on=r.fit_on).target_nll[0]
        assert r.target_nll == pytest.approx(test_nll)


def _grid(levels):
    return pd.DataFrame([dict(num_experts=E, top_k=1, seed=s, test_loss=v) for E, vs in levels.items()
                         for s, v in enumerate(vs)])


REFS = pd.DataFrame(dict(name=["Bayes", "within-example Bayes", "trigram", "4-gram", "4-gram"],
                         fit_on=["exact", "exact", "targets", "targets", "all"], k=[np.nan, np.nan, 1.0, 0.3, 0.3],
                         target_nll=[0.9, 0.95, 1.4, 1.2, 1.25]))


def test_regime_gap_and_interval_against_scipy():
    grid = _grid({1: [1.3, 1.32, 1.31], 2: [1.00, 1.04, 1.02]})
    r = ms.regime(grid, REFS)
    gap = np.array([1.00, 1.04, 1.02]) - 1.2
    half = stats.t.ppf(0.975, 2) * gap.std(ddof=1) / np.sqrt(3)
    assert (r["best_E"], r["best_ngram"], r["best_ngram_name"]) == (2, 1.2, "4-gram (targets)")
    assert r["gap"] == pytest.approx(gap.mean()) and r["gap_hi"] == pytest.approx(gap.mean() + half)
    assert r["ok"] is bool(gap.mean() + half <= -0.1)
    assert ms.regime(_grid({2: [1.00, 1.01, 1.00]}), REFS)["ok"] is True
    assert ms.regime(_grid({2: [1.15, 1.16, 1.15]}), REFS)["ok"] is False      # beats the n-gram, not by 0.1
    assert ms.regime(grid, None)["ok"] is None


def test_regime_table_rows():
    t = ms.regime_table(_grid({2: [1.00, 1.01, 1.00]}), REFS)
    assert t.row.tolist() == ["baseline"] * 5 + ["seed"] * 3 + ["check"]
    chk = t[t.row == "check"].iloc[0]
    assert bool(chk.passed) and chk.margin == 0.1 and chk.gap_hi <= -0.1
    np.testing.assert_allclose(t[t.row == "seed"].gap, np.array([1.00, 1.01, 1.00]) - 1.2)


def test_profiles_are_frozen_and_build_setups():
    assert list(ms.PROFILES) == ["smoke", "default", "full", "paper"]
    p = ms.profile("default")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.steps = 1
    s = p.setup(0)
    assert (s.n_entities, s.n_symbols, s.steps, s.device, s.ginc_seed) == (5, 10, p.synth.steps, "auto", 0)
    assert p.mass_config(2).init_experts == 2 and max(p.counts) <= s.max_experts
    assert ms.profile("full").synth.n_symbols == 50 and ms.profile("full").synth.attn_layers >= 2
    with pytest.raises(ValueError, match="unknown PROFILE"):
        ms.profile("fast")
    assert "default (this run)" in ms.profile_table("default").index
