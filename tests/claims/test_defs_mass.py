"""Notebook 04's claim definitions after issue 48: the regime checks of the MASS comparisons (frontier range, runs
that expanded, active experts per token), each with a table that passes and one that fails and a reason naming its
numbers; the gate the claims use; every paper row quotes the paper verbatim; the change-point calibration row; the
GLUE rows pair seeds by the seed index."""
import glob
import re

import numpy as np
import pandas as pd
import pytest

from moelab.claims import Insufficient, Level, Seeds, evaluate
from moelab.mass import REGIME_MARGIN, mass_regime_checks
from moelab.mass import claims as nb04

from helpers import PAPERS_DIR, ROOT, paper_text
from helpers.claims import tables_folder


def _claim(cid):
    return next(c for c in nb04.CLAIMS if c.id == cid)


def _grid(drop, sd=0.01, counts=(1, 2, 4, 8), seeds=5):
    """A naive grid whose seed-mean frontier falls by ``drop`` nats from E = 1 to 8; seed offsets of s.d. ``sd``."""
    off = np.linspace(-1, 1, seeds)
    off = off / off.std(ddof=1) * sd
    return pd.DataFrame([dict(num_experts=E, top_k=min(2, E), seed=s, test_loss=1.1 - drop * i / 3 + off[s])
                         for i, E in enumerate(counts) for s in range(seeds)])


def _runs(init, final, active):
    return pd.DataFrame(dict(seed=range(len(final)), init_experts=init, final_experts=final, mean_active=active,
                             test_loss=1.0))


def test_frontier_range_check_passes_a_falling_frontier_and_fails_a_flat_one():
    runs = _runs(4, [5, 6, 4, 5], 1.5)
    ok = mass_regime_checks(_grid(0.05), runs).set_index("check").loc["frontier_range"]
    assert ok.passed and ok.value == pytest.approx(5.0)
    bad = mass_regime_checks(_grid(0.02), runs).set_index("check").loc["frontier_range"]
    assert not bad.passed and bad.value == pytest.approx(2.0) and "2.0 seed s.d." in bad.reason


def test_expanded_check_needs_half_of_the_runs_to_grow():
    g = _grid(0.05)
    ok = mass_regime_checks(g, _runs([3, 3, 4, 4], [4, 3, 5, 4], 1.5)).set_index("check").loc["mass_expanded"]
    assert ok.passed and ok.value == 0.5
    bad = mass_regime_checks(g, _runs([3, 3, 4, 4], [4, 3, 4, 4], 1.5)).set_index("check").loc["mass_expanded"]
    assert not bad.passed and "1 of 4 runs" in bad.reason and "3->4, 3->3, 4->4, 4->4" in bad.reason


def test_router_check_needs_more_than_one_active_expert():
    g = _grid(0.05)
    ok = mass_regime_checks(g, _runs(4, [5, 5], [1.2, 1.4])).set_index("check").loc["router_active"]
    assert ok.passed and ok.value == pytest.approx(1.3)
    bad = mass_regime_checks(g, _runs(4, [5, 5], [1.0, 1.0])).set_index("check").loc["router_active"]
    assert not bad.passed and "1.000 experts per test token" in bad.reason


def _refs(grid, margin):
    best = grid.groupby(["num_experts", "top_k"]).test_loss.mean().min()
    return pd.DataFrame(dict(name=["Bayes", "trigram"], fit_on=["exact", "targets"], target_nll=[0.5, best + margin]))


def test_claims_gate_on_the_checks_they_name_and_fail_with_the_numbers(tmp_path):
    grid = _grid(0.05)
    good = _runs([3, 3, 4, 4, 4], [4, 5, 6, 4, 5], [1.3, 1.5, 1.6, 1.2, 1.4])
    T = tables_folder(tmp_path, {"fig2_naive_grid": grid, "fig2_mass_runs": good,
                                 "data_reference_levels": _refs(grid, REGIME_MARGIN + 0.2)})
    for cid in ("pool_near_elbow", "mass_vs_best_static", "active_experts_per_token", "entity_jsd_mass_vs_naive"):
        reg = nb04.CLAIMS[[c.id for c in nb04.CLAIMS].index(cid)].regime(T)
        assert reg.passed, (cid, reg)
    (tmp_path / "flat").mkdir()
    saturated = good.assign(mean_active=1.0)
    T2 = tables_folder(tmp_path / "flat", {"fig2_naive_grid": _grid(0.02), "fig2_mass_runs": saturated,
                                           "data_reference_levels": _refs(grid, REGIME_MARGIN + 0.2)})
    r = _claim("pool_near_elbow").regime(T2)
    assert not r.passed and "2.0 seed s.d." in r.value
    r = _claim("mass_vs_best_static").regime(T2)       # frontier not needed; the saturated router fails it
    assert not r.passed and "1.000 experts per test token" in r.value and "seed s.d." not in r.value
    assert _claim("active_experts_per_token").regime(T2).passed    # its own answer is never its gate
    rec = evaluate(_claim("mass_vs_best_static"), T2)
    assert rec["verdict"] == "outside the regime" and "1.000 experts per test token" in rec["reason"]


def _paper_text():
    """Paper 003's text (docs/papers/)."""
    return paper_text("003")


def test_every_paper_row_quotes_the_paper_and_the_extension_is_marked():
    text = re.sub(r"\s+", " ", _paper_text())
    for c in nb04.CLAIMS:
        if c.extension:
            assert c.id == "cpd_false_alarms_on_noise"
            continue
        assert c.paper_quote, c.id
        if c.paper_quote.startswith("Table"):
            assert all(v in text for v in re.findall(r"\d+\.\d", c.paper_quote)), c.id
        else:
            assert re.sub(r"\s+", " ", c.paper_quote) in text, c.id


def test_cpd_row_scores_the_measured_autocorrelation_per_series(tmp_path):
    cal = pd.DataFrame(dict(rho=[0.0] * 3 + [0.3] * 3, series=[0, 1, 2] * 2, tests=31, fires=[0, 1, 0, 2, 3, 1],
                            measured=[False] * 3 + [True] * 3)).assign(fire_rate=lambda d: d.fires / d.tests,
                                                                       fired=lambda d: d.fires > 0)
    ev = nb04.cpd_noise_evidence(tables_folder(tmp_path, {"appC_cpd_calibration": cal}))
    assert isinstance(ev, Level) and ev.unit_of_replication == "items" and np.allclose(ev.values, [2 / 31, 3 / 31, 1 / 31])
    (tmp_path / "n").mkdir()
    ev = nb04.cpd_noise_evidence(tables_folder(tmp_path / "n", {"appC_cpd_calibration": cal.assign(tests=0)}))
    assert isinstance(ev, Insufficient)
    c = _claim("cpd_false_alarms_on_noise")
    assert c.extension and c.regime is None and c.equivalence


def test_glue_rows_pair_seeds_on_the_seed_index(tmp_path):
    rows = [dict(task=t, method=m, seed=s, acc=0.5 + 0.1 * (m == "mass") + 0.01 * s, mean_active=2.0 + (m == "dynmoe"),
                 chance=0.3, n_test=10) for t in ("a", "b") for m in ("mass", "dynmoe", "cosine") for s in (2, 0, 1)]
    T = tables_folder(tmp_path, {"fig4_glue_standin_runs": pd.DataFrame(rows)})
    ev = nb04.glue_evidence("acc", "dynmoe")(T)
    assert isinstance(ev, Seeds) and ev.paired and isinstance(ev.a, pd.Series)
    assert list(ev.a.index) == list(ev.b.index) == [0, 1, 2] and np.allclose(ev.a - ev.b, 0.1)


def _glue_runs(mass_expansions, with_dense: bool, dense_acc: float = 0.70):
    rows = []
    for seed in range(3):
        for method, acc in (("mass", 0.85), ("dynmoe", 0.80), ("cosine", 0.78)) + ((("dense", dense_acc),)
                                                                                    if with_dense else ()):
            exp = mass_expansions[seed] if method == "mass" else 0
            rows.append(dict(task="t", method=method, seed=seed, acc=acc, chance=0.5, final_pool=4 + exp,
                             mean_active=2.0, expansions=exp, n_test=100))
    return pd.DataFrame(rows)


def test_glue_regime_passes_and_fails(tmp_path):
    """The GLUE stand-in's regime (third reader): MASS expanded in >= half of its runs and the reference MoE no worse
    than a saved dense parent; a table without a dense run cannot pass."""
    cases = {"pass": (_glue_runs([1, 2, 0], True), True),
             "no_dense": (_glue_runs([1, 2, 0], False), False),
             "no_growth": (_glue_runs([0, 0, 1], True), False),
             "dense_better": (_glue_runs([1, 2, 0], True, dense_acc=0.9), False)}
    for name, (runs, ok) in cases.items():
        (tmp_path / name).mkdir()
        reg = nb04.glue_regime(tables_folder(tmp_path / name, {"fig4_glue_standin_runs": runs}))
        assert reg.passed is ok, (name, reg.value)
    assert "no dense-parent run saved" in nb04.glue_regime(
        tables_folder(tmp_path / "no_dense", {"fig4_glue_standin_runs": _glue_runs([1, 2, 0], False)})).value
