"""Claim definitions of notebook 00 (the primer, ``moelab.primer.claims``) on small synthetic tables: the identities
hold by construction only within rounding (a broken one stops the rebuild), the balancing comparison is paired by
seed (never by row position) and gated by a regime check that can pass and fail, top-p's varying count is a test
that decides, and every quoted sentence is in the paper it names. (Definitions and signs: test_defs_primer_mass.py.)
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from moelab.claims import ClaimEvidenceError, Seeds, evaluate
from moelab.claims.engine import FEW_SEEDS
from moelab.primer import claims as nb00

from helpers import PAPERS_DIR, ROOT, paper_text
from helpers.claims import tables_folder


def _claim(cid):
    return next(c for c in nb00.CLAIMS if c.id == cid)


# ---------------------------------------------------------------- identities: holds, or a failed check
def _agg(linear_dev=0.0, sba_dev=0.0):
    ang = np.arange(0.0, 180.0, 15.0)
    cos = np.cos(np.deg2rad(ang) / 2)
    return pd.DataFrame(dict(angle_deg=ang, linear_norm=cos + linear_dev, cos_half_angle=cos, sba_norm=1.0 + sba_dev,
                             mean_expert_norm=1.0))


def _real(linear_ratio=0.9996, sba_ratio=1.0 - 2e-7):
    return pd.DataFrame(dict(layer=0, token=range(20), linear_ratio=linear_ratio, sba_ratio=sba_ratio,
                             cos_top2=0.998))


def _identity_tables(tmp_path, **kw):
    up = pd.DataFrame(dict(text=["a", "b"], max_abs_diff=[kw.get("upcycle", 1.1e-7), 5e-8], cosine=1.0))
    return tables_folder(tmp_path, {"table1_upcycling_equivalence": up,
                                    "table7_aggregation_two_vectors": _agg(kw.get("linear", 0.0), kw.get("sba", 0.0)),
                                    "table8_aggregation_real": _real(kw.get("real_linear", 0.9996),
                                                                     kw.get("real_sba", 1.0 - 2e-7))})


IDENTITIES = ("upcycling_equals_dense", "linear_mix_norm_cos_half", "sba_keeps_norm")


def test_identities_within_rounding_hold_by_construction_with_their_measured_deviation(tmp_path):
    T = _identity_tables(tmp_path)
    for cid in IDENTITIES:
        rec = evaluate(_claim(cid), T)
        assert rec["verdict"] == "holds by construction" and rec["ci_low"] is None, rec
        assert rec["ours"] is not None and rec["ours"] <= _claim(cid).tolerance
    assert "max |deviation| 1.1e-07" in evaluate(_claim("upcycling_equals_dense"), T)["reason"]


@pytest.mark.parametrize("cid, broken", [
    ("upcycling_equals_dense", dict(upcycle=3e-3)),           # an upcycled model that is not the dense one
    ("linear_mix_norm_cos_half", dict(linear=-0.05)),         # a mix norm that is not cos(θ/2)
    ("linear_mix_norm_cos_half", dict(real_linear=1.01)),     # a real linear mix outside the weighted mean norm
    ("sba_keeps_norm", dict(sba=0.01)),                       # SBA off its radius (two unit vectors)
    ("sba_keeps_norm", dict(real_sba=0.999)),                 # SBA off its radius (real mixes)
])
def test_a_broken_identity_is_a_failed_check_never_a_label(tmp_path, cid, broken):
    """Before engine v4 a broken identity read 'holds by construction whichever way it falls'; now it raises."""
    with pytest.raises(ClaimEvidenceError, match="failed check"):
        evaluate(_claim(cid), _identity_tables(tmp_path, **broken))


# ---------------------------------------------------------------- the balancing comparison
def _balancing_tables(tmp_path, seeds=(0, 1, 2), effect=-0.8, final_loss=1.0, moved=1.5, shuffle=True):
    """table4 with a shared per-seed effect (so pairing by seed matters), table2b (dense 1.15 at step 0) and table2c."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    seed_level = {s: 0.3 * rng.standard_normal() for s in seeds}
    imb = pd.DataFrame([dict(seed=s, run=r, layer=l, batch=b,
                             imbalance=1.0 + seed_level[s] + (effect if r == "with balancing loss" else 0.0)
                             + 0.05 * rng.standard_normal() + (0.1 * s if r == "with balancing loss" else 0.0))
                        for s in seeds for r in ("at initialisation", "no balancing loss", "with balancing loss")
                        for l in range(3) for b in range(4)])
    if shuffle:
        imb = imb.sample(frac=1.0, random_state=1)
    held = pd.DataFrame([dict(seed=s, step=0, heldout_contrastive=1.15, run="both") for s in seeds]
                        + [dict(seed=s, step=st, heldout_contrastive=fl, run=r) for s in seeds
                           for r in ("no balancing loss", "with balancing loss")
                           for st, fl in ((20, 1.08), (40, final_loss))])
    mv = pd.DataFrame([dict(seed=s, run=r, layer=l, rel_change=moved) for s in seeds
                       for r in ("no balancing loss", "with balancing loss") for l in range(3)])
    return tables_folder(tmp_path, {"table4_load_imbalance": imb, "table2b_heldout_loss": held,
                                    "table2c_router_change": mv}), imb


def test_balancing_pairs_by_seed_and_matches_scipys_paired_t(tmp_path):
    """Rows shuffled and a seed effect shared by both arms: the interval is scipy's paired t on the per-seed means
    joined on ``seed``; the evidence is a Series indexed by seed (never an array paired by position)."""
    T, imb = _balancing_tables(tmp_path)
    ev = nb00.balancing_evidence(T)
    assert isinstance(ev, Seeds) and ev.paired and isinstance(ev.a, pd.Series) and list(ev.a.index) == [0, 1, 2]
    means = imb.groupby(["seed", "run"]).imbalance.mean().unstack("run")
    d = (means["with balancing loss"] - means["no balancing loss"]).to_numpy()
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    rec = evaluate(_claim("balancing_loss_lowers_imbalance"), T)
    assert rec["n_seeds"] == 3 and rec["n_items"] == 4 and np.isclose(rec["ours"], d.mean(), rtol=1e-5)
    assert np.isclose(rec["ci_low"], lo, rtol=1e-5) and np.isclose(rec["ci_high"], hi, rtol=1e-5)
    assert rec["verdict"] == "reproduced" and rec["regime"]["passed"], rec


def test_balancing_training_regime_can_pass_and_fail(tmp_path):
    ok, _ = _balancing_tables(tmp_path / "ok")
    reg = nb00.training_regime(ok)
    assert reg.passed and "router change 1.50-1.50" in reg.value
    worse, _ = _balancing_tables(tmp_path / "worse", final_loss=1.2)     # a run ends worse than dense MiniLM
    reg = nb00.training_regime(worse)
    assert not reg.passed and "+0.050" in reg.value
    rec = evaluate(_claim("balancing_loss_lowers_imbalance"), worse)
    assert rec["verdict"] == "outside the regime" and "measured anyway" in rec["reason"]
    still, _ = _balancing_tables(tmp_path / "still", moved=0.05)          # routers stayed near their draw
    assert not nb00.training_regime(still).passed
    assert evaluate(_claim("balancing_loss_lowers_imbalance"), still)["verdict"] == "outside the regime"


def test_balancing_with_one_training_seed_is_not_decided(tmp_path):
    """The smoke profile trains one seed per arm: inconclusive for few seeds, with its measured difference."""
    T, _ = _balancing_tables(tmp_path, seeds=(0,), shuffle=False)
    rec = evaluate(_claim("balancing_loss_lowers_imbalance"), T)
    assert rec["verdict"] == "inconclusive" and rec["n_seeds"] == 1 and FEW_SEEDS in rec["reason"]
    assert np.isclose(rec["ours"], -0.8, atol=0.1)


def test_balancing_on_a_table_saved_before_the_seeds_names_the_next_run(tmp_path):
    imb = pd.DataFrame([dict(run=r, layer=0, batch=b, imbalance=1.0) for r in nb00.ARMS for b in range(4)])
    rec = evaluate(_claim("balancing_loss_lowers_imbalance"), tables_folder(tmp_path, {"table4_load_imbalance": imb}))
    assert rec["verdict"] == "inconclusive" and "no seed column" in rec["reason"]


# ---------------------------------------------------------------- top-p on a fixed router: a test that decides
def _active(tmp_path, vary: bool):
    tmp_path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = [dict(rule="top-2", layer=l, token=t, active=2) for l in range(3) for t in range(200)]
    rows += [dict(rule="top-p 0.5", layer=l, token=t, active=int(1 + (vary and rng.random() < 0.4)))
             for l in range(3) for t in range(200)]
    return tables_folder(tmp_path, {"table6_active_experts": pd.DataFrame(rows)},
                         {"config": {"top_p": [0.3, 0.5, 0.7], "top_k": 2}})


def test_top_p_count_is_tested_and_decides(tmp_path):
    """Before engine v4 the row read 'holds by construction' (true of the rule's definition); a near-uniform router
    would give every token the same count, so it is a test: it decides, and it can fail to reproduce."""
    rec = evaluate(_claim("top_p_count_varies"), _active(tmp_path / "vary", True))
    assert rec["verdict"] == "reproduced" and rec["ci_low"] > 0 and rec["n_items"] == 200, rec
    rec = evaluate(_claim("top_p_count_varies"), _active(tmp_path / "flat", False))
    assert rec["verdict"] not in ("reproduced", "holds by construction") and rec["ours"] == 0


# ---------------------------------------------------------------- quotes
PAPERS = {"paper 001": "001_", "paper 002": "002_", "paper 003": "003_"}


def _papers_dir():
    return PAPERS_DIR if PAPERS_DIR.is_dir() else None


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_every_paper_row_quotes_its_paper_verbatim():
    """Each non-extension row has a quote; for the papers in docs/papers every excerpt (" [...] " separates two)
    occurs in the paper's text (whitespace joined). The Switch Transformer is not among them (its row says so)."""
    papers = _papers_dir()
    if papers is None:
        pytest.fail("docs/papers is missing")
    checked = 0
    for c in nb00.CLAIMS:
        if c.extension:
            continue
        assert c.paper_quote.strip(), c.id
        which = [k for k in PAPERS if k in c.paper_ref]
        if not which:
            assert "Switch" in c.paper_ref and "not among docs/papers" in c.paper_ref, c.id
            continue
        text = _norm(next(papers.glob(PAPERS[which[0]] + "*.txt")).read_text())
        for part in c.paper_quote.split(" [...] "):
            assert _norm(part) in text, (c.id, part)
        checked += 1
    assert checked == 4
