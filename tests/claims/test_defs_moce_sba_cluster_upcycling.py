"""Claim definitions of notebooks 01 (MoCE), 02 (SBA) and 03 (cluster-aware upcycling).

Checks: the definitions load and pass ``check_definitions``; every expected sign equals the sign of the paper numbers
written beside it (recomputed here, and against a second transcription of the papers' tables); the named defects
are fixed (Table II directions, the norm-free equivalence, split "top-2 and soft beat top-1", dependence not
concentration, by-construction geometry); every claim evaluates on the committed default and full folders (copied to a
temporary folder) into a record that validates; the helpers agree with naive references.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from moelab.claims import Claim, Tables, check_definitions, evaluate, validate_record
from moelab.cluster_upcycling import claims as nb03_cluster_upcycling
from moelab.moce import claims as nb01_moce
from moelab.sba import claims as nb02_sba

from helpers import ROOT
from helpers.claims import run_folder

DEFS = {"01_moce": nb01_moce, "02_sba": nb02_sba, "03_cluster_upcycling": nb03_cluster_upcycling}

# A second, independent transcription of the papers' numbers (MoCE Tables 1/3/4; SBA Tables I/II; the cluster-aware
# upcycling poster's zero-shot (ViT-B/16 MSCOCO Avg.), few-shot and ablation tables): a typo in a definition fails here.
TRANSCRIBED = {
    ("01_moce", "moce_vs_pesc_bpb"): {"moce": 37.99, "pesc": 35.62},
    ("01_moce", "moce_vs_pesc_acc"): {"moce": 39.56, "pesc": 37.94},
    ("01_moce", "moce_vs_dense_adapter"): {"moce": 37.99, "dense": 32.26},
    ("01_moce", "general_experts_help"): {"moce_gen": 37.87, "moce": 37.61},
    ("01_moce", "top2_vs_top1"): {"moce": 23.55, "moce_top1": 22.33},
    ("01_moce", "soft_vs_top1"): {"moce_soft": 22.93, "moce_top1": 22.33},
    ("01_moce", "dual_vs_seq_only"): {"moce": 23.55, "seq_only": 20.62},
    ("01_moce", "moce_vs_specialised_code"): {"moce": 37.99, "specialised_code": 34.91},
    ("01_moce", "more_experts_per_group"): {"N=1": 35.55, "N=2": 35.90, "N=4": 36.76},
    ("01_moce", "moce_vs_btx"): {"moce": 37.99, "btx": 32.44},
    ("02_sba", "sba_vs_linear_wordnet_sts"): {"sba": 71.51, "linear": 71.18},
    ("02_sba", "sba_vs_linear_wordnet_clustering"): {"sba": 86.19, "linear": 85.66},
    ("02_sba", "sba_vs_linear_wordnet_pairs"): {"sba": 89.06, "linear": 83.66},
    ("02_sba", "sba_normfree_vs_linear_wordnet_clustering"): {"sba_normfree": 85.64, "linear": 85.66},
    ("02_sba", "sba_normfree_vs_linear_wordnet_pairs"): {"sba_normfree": 89.69, "linear": 83.66},
    ("02_sba", "sba_unit_vs_linear_wordnet_sts"): {"sba_unit": 68.35, "linear": 71.18},
    # the paper's 0.00 (a total collapse) against 85.66, compared as a share (%) of the reference arm's score
    ("02_sba", "sba_unit_vs_linear_bigbench_clustering"): {"sba_unit": 100 * 0.00 / 85.66, "linear": 100 * 85.66 / 85.66},
    ("02_sba", "sba_unit_vs_linear_wordnet_pairs"): {"sba_unit": 88.19, "linear": 83.66},
    ("03_cluster_upcycling", "r1_vs_sparse"): {"cluster_eesd": 43.5, "sparse": 42.9},
    ("03_cluster_upcycling", "r1_vs_drop"): {"cluster_eesd": 43.5, "drop": 42.7},
    ("03_cluster_upcycling", "r1_vs_dense_long"): {"cluster_eesd": 43.5, "dense_long": 42.6},
    ("03_cluster_upcycling", "vit_cifar_5shot_vs_dense"): {"cluster_eesd": 51.5, "dense": 50.4},
    ("03_cluster_upcycling", "vit_cifar_ft_vs_sparse"): {"cluster_eesd": 73.3, "sparse": 73.0},
    ("03_cluster_upcycling", "ablation_cluster_init_vs_sparse"): {"cluster": (35.1 + 51.1) / 2,
                                                                  "sparse": (34.9 + 50.9) / 2},
}


def _by_id(nb: str) -> dict[str, Claim]:
    return {c.id: c for c in DEFS[nb].CLAIMS}


@pytest.mark.parametrize("nb", sorted(DEFS))
def test_definitions_pass_the_engine_checks(nb):
    claims = check_definitions(DEFS[nb].CLAIMS)
    assert len(claims) >= 10 and all(isinstance(c, Claim) for c in claims)


@pytest.mark.parametrize("nb", sorted(DEFS))
def test_expected_sign_is_the_sign_of_the_paper_numbers(nb):
    for c in DEFS[nb].CLAIMS:
        pv = c.paper_value
        flip = 1 if c.paper_higher_is_better == c.higher_is_better else -1
        if c.compare is not None and isinstance(pv, dict):
            effect = pv[c.compare[0]] - pv[c.compare[1]]
            want = 0 if c.tolerance is not None and abs(effect) <= c.tolerance else int(np.sign(effect)) * flip
            assert c.expected_sign == want, (c.id, pv, c.expected_sign)
        elif c.best is not None:
            better = max if c.paper_higher_is_better else min
            assert better(pv, key=pv.get) == c.best, (c.id, pv)
        elif pv is None and c.target is None and c.determined_by != "definition":
            # qualitative: the sign is typed and the sentence quoted somewhere (an identity of the definition, e.g.
            # 01's active_experts_unchanged, is checked by ByConstruction, not decided by a sign)
            assert c.expected_sign in (-1, 1), c.id


@pytest.mark.parametrize("key", sorted(TRANSCRIBED))
def test_paper_numbers_match_a_second_transcription(key):
    nb, cid = key
    c = _by_id(nb)[cid]
    assert set(c.paper_value) == set(TRANSCRIBED[key])
    for k, v in TRANSCRIBED[key].items():
        assert c.paper_value[k] == pytest.approx(v, abs=1e-9), (cid, k)


def test_the_reviewed_defects_are_fixed_in_the_definitions():
    sba = _by_id("02_sba")
    # Table II: unit-output SBA is worse than linear on STS and clustering, better on SprintDuplicate
    assert sba["sba_unit_vs_linear_wordnet_sts"].expected_sign == -1
    assert sba["sba_unit_vs_linear_wordnet_clustering"].expected_sign == -1
    assert sba["sba_unit_vs_linear_wordnet_pairs"].expected_sign == +1
    # norm-free vs linear on clustering (85.64 vs 85.66) is an equivalence claim; on STS (+0.19) it is not
    assert sba["sba_normfree_vs_linear_wordnet_clustering"].equivalence
    assert not sba["sba_normfree_vs_linear_wordnet_sts"].equivalence
    assert all("Table" in c.paper_ref for c in sba.values() if c.id.endswith(("_sts", "_clustering", "_pairs")))
    assert all("no retrieval" in c.paper_ref for c in sba.values() if c.id.endswith("_retrieval"))
    moce = _by_id("01_moce")
    # "top-2 and soft merging beat top-1" is two comparisons against top-1, lower bits per byte is better
    assert moce["top2_vs_top1"].compare == ("moce", "moce_top1")
    assert moce["soft_vs_top1"].compare == ("moce_soft", "moce_top1")
    assert moce["top2_vs_top1"].expected_sign == moce["soft_vs_top1"].expected_sign == -1
    assert moce["moce_vs_pesc_bpb"].proxy and not moce["moce_vs_pesc_acc"].proxy


def _copy(tmp_path: Path, nb: str, profile: str) -> Path:
    src = ROOT / "figures" / nb / ("" if profile == "default" else profile)
    if not (src / "provenance.json").exists():
        pytest.skip(f"no committed {nb} {profile} folder")
    dst = tmp_path / f"{nb}_{profile}"
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("profile", ["default", "full"])
@pytest.mark.parametrize("nb", sorted(DEFS))
def test_every_claim_evaluates_on_the_committed_tables(tmp_path, nb, profile):
    folder = _copy(tmp_path, nb, profile)
    T = Tables(folder)
    records = [validate_record(evaluate(c, T)) for c in DEFS[nb].CLAIMS]
    assert [r["id"] for r in records] == [c.id for c in DEFS[nb].CLAIMS]
    by = {r["id"]: r for r in records}
    for r in records:   # a comparative difference always comes with its interval or a reason why not
        if r["verdict"] in ("reproduced", "contradicted", "underpowered"):
            assert r["ci_low"] is not None and r["ci_low"] <= r["ours"] <= r["ci_high"], r["id"]
        assert r["reason"], r["id"]
    if nb == "01_moce":   # Fig. 5 is a dependence test with the concentration beside it
        assert "concentration" in by["tasks_depend_on_cluster"]["method"]
    if nb == "02_sba":   # the trained geometry is a test, Eq. 5 an identity; unit-output SBA beating linear on STS
        assert by["fig2_angles_above_40"]["verdict"] != "holds by construction"   # can't reproduce
        assert by["fig5_sba_norm"]["verdict"] == "holds by construction"
        assert by["sba_unit_vs_linear_wordnet_sts"]["verdict"] != "reproduced"
    if nb == "03_cluster_upcycling":   # the rest: tests/claims/test_defs_cluster_upcycling.py
        # the weight-similarity gap the initialisation fixed and training did not move: a checked identity (1(b))
        assert by["similarity_vs_sparse"]["verdict"] == "holds by construction"
        # the shape is tested per seed on a fixed held-out batch; the regime check is passable (the stand-in trains
        # and ends no worse than its dense parent)
        trend = by["entropy_explores_then_restabilises"]
        assert "held-out batch" in trend["metric"] and "first third" in trend["method"], trend
        assert "learning rate" in trend["metric"]   # the paper row reads the shape per unit of learning rate
        assert trend["regime"]["passed"] is True
        assert by["r1_vs_sparse"]["unit"] == "points (x100)" and abs(by["r1_vs_sparse"]["ours"]) > 0.05


# ---------------------------------------------------------------------------------------------------- helpers
def test_cramers_v_matches_the_textbook_formula():
    rng = np.random.default_rng(1)
    c = rng.integers(0, 30, size=(4, 5))
    n = c.sum()
    chi2 = sum((c[i, j] - c[i].sum() * c[:, j].sum() / n) ** 2 / (c[i].sum() * c[:, j].sum() / n)
               for i in range(4) for j in range(5))
    assert nb01_moce.cramers_v(c) == pytest.approx(np.sqrt(chi2 / (n * 3)))
    assert nb01_moce.cramers_v(np.diag([10, 10, 10])) == pytest.approx(1.0)


def test_independence_test_separates_dependent_from_independent_tables():
    rng = np.random.default_rng(0)
    indep = np.stack([rng.multinomial(50, [0.25] * 4) for _ in range(5)])
    r = nb01_moce.independence_test(indep, n_shuffles=400)
    assert r["ci_low"] < r["mde"] and r["p"] > 0.01
    dep = np.array([[50, 0, 0, 0], [0, 50, 0, 0], [0, 0, 50, 0], [45, 5, 0, 0], [0, 0, 5, 45]])
    r = nb01_moce.independence_test(dep, n_shuffles=400)
    assert r["ci_low"] > 0 and r["p"] < 0.01
    with pytest.raises(ValueError):
        nb01_moce.independence_test(np.array([1, 2, 3]))


def test_sba_per_seed_scores_give_a_paired_seed_comparison(tmp_path):
    rows = [dict(aggregation=a, seed=s, benchmark="wordnet_sts", metric="cosine_spearman", score=v + 0.001 * s)
            for a, v in (("linear", 0.60), ("sba_unit", 0.70)) for s in range(3)]
    T = run_folder(tmp_path, "02_sba", {"table1_per-seed-scores": pd.DataFrame(rows)})
    c = {x.id: x for x in nb02_sba.CLAIMS}["sba_unit_vs_linear_wordnet_sts"]
    r = evaluate(c, T)
    assert r["ours"] == pytest.approx(10.0) and r["n_seeds"] == 3
    # the paper has unit-output SBA worse than linear on STS; without the regime tables the claim stays undecided
    assert r["verdict"] == "inconclusive" and "regime_change.csv" in r["reason"]


def test_domain_dependence_reads_the_counts_of_the_moce_encoder(tmp_path):
    rows = [dict(encoder=enc, domain=d, cluster=k, count=n, used_by_moce=enc == "e5")
            for enc, table in (("e5", {"code": {0: 40}, "maths": {1: 170, 2: 3}, "reasoning": {2: 80, 1: 5}}),
                               ("minilm", {"code": {0: 14, 1: 14, 2: 14}, "maths": {0: 58, 1: 58, 2: 57},
                                           "reasoning": {0: 28, 1: 28, 2: 29}}))
            for d, counts in table.items() for k, n in counts.items()]
    T = run_folder(tmp_path, "01_moce", {"appC_domain-cluster-counts": pd.DataFrame(rows)})
    r = evaluate({c.id: c for c in nb01_moce.CLAIMS}["clusters_separate_domains"], T)
    # the clustering runs before any training: a fixed object, tested by the permutation test, which decides (#47)
    assert r["verdict"] == "reproduced" and r["n_items"] == 40 + 173 + 85 and "e5" in r["method"]
    assert r["ci_low"] > 0 and r["regime"] is None
