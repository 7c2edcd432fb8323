"""Issue 47, item 11: the calibration gaps a mutation test of the engine found, and the v4 rules.

- paired intervals are joined on the seed (scipy's paired t-test on per-seed means merged on ``seed``, with a
  shared seed effect and shuffled rows), and a pairing by row position or a shifted seed cannot pass silently;
- the committed claims are pinned: rebuilding every committed folder gives its claims.json exactly, also after
  the rows of every saved table are shuffled (no claim may read a table by row position);
- the edges of the verdict rule, table-driven, on hand-made intervals;
- the new verdict ``smaller than reported`` is calibrated: at a true effect equal to the paper's it fires at most
  ~2.5% of the time (one tail of a 95% interval);
- a by-construction row whose measured value breaks its identity is an error, never a label.
"""
import re
import shutil

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from moelab.claims import (ByConstruction, Claim, ClaimEvidenceError, Precomputed, Regime, Seeds, align_by_seed,
                           evaluate)
from moelab.claims.registry import claim_defs
from moelab.claims.rebuild import check, evaluate_folder, figures_root, output_folders

OK = Regime("none: a unit test", "n/a", True)


class _T:
    profile, notebook, provenance = "default", "98_demo", {}


def claim(ev, **kw):
    base = dict(id="a_vs_b", claim="A beats B", paper_ref="Table 1", metric="score", unit="points",
                paper_value={"A": 50.0, "B": 48.0}, compare=("A", "B"), evidence=lambda T: ev,
                determined_by="training", regime=OK, paper_quote="Table 1: A 50.0, B 48.0")
    if kw.get("proxy"):
        base["proxy_for"] = "the paper's accuracy (test stand-in)"
    base.update(kw)
    return Claim(**base)


# ---------------------------------------------------------------- pairing by seed
def long_table(rng, n_seeds=5, n_items=40, effect=0.3, shared_sd=2.0):
    """A tidy table (seed, arm, item, score) with a seed effect shared by both arms (same init/data order), rows
    shuffled: pairing by row position would pair the wrong seeds."""
    shared = rng.normal(0, shared_sd, n_seeds)
    rows = [(s, arm, i, shared[s] + (effect if arm == "A" else 0.0) + rng.normal(0, 0.5))
            for s in range(n_seeds) for arm in "AB" for i in range(n_items)]
    df = pd.DataFrame(rows, columns=["seed", "arm", "item", "score"])
    return df.sample(frac=1.0, random_state=int(rng.integers(1 << 30))).reset_index(drop=True)


@pytest.mark.parametrize("rep", range(5))
def test_paired_interval_is_scipy_ttest_rel_joined_on_seed(rep):
    df = long_table(np.random.default_rng([47, rep]))
    m = df.groupby(["arm", "seed"]).score.mean()
    r = evaluate(claim(Seeds(m["A"], m["B"].sample(frac=1.0, random_state=rep), paired=True)), _T())
    wide = m.unstack("arm")   # joined on seed by pandas, independently of the engine
    ref = sps.ttest_rel(wide["A"], wide["B"]).confidence_interval(0.95)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((ref.low, ref.high), rel=1e-5)
    assert r["ours"] == pytest.approx((wide["A"] - wide["B"]).mean(), rel=1e-5)
    # the mutation of issue 47: the same arms paired by row position (B in another seed order) give another interval
    pos = sps.ttest_rel(m["A"].to_numpy(), m["B"].sample(frac=1.0, random_state=rep + 1).to_numpy())
    assert pos.confidence_interval(0.95).low != pytest.approx(ref.low, rel=1e-3)


def test_pairing_by_position_or_a_shifted_seed_is_refused():
    df = long_table(np.random.default_rng(3))
    m = df.groupby(["arm", "seed"]).score.mean()
    a, b = m["A"], m["B"]
    with pytest.raises(ValueError, match="indexed by seed"):
        evaluate(claim(Seeds(a.to_numpy(), b.to_numpy(), paired=True)), _T())
    shifted = b.copy()
    shifted.index = shifted.index + 1
    with pytest.raises(ValueError, match="same seeds"):
        evaluate(claim(Seeds(a, shifted, paired=True)), _T())
    dup = pd.concat([b, b.iloc[:1]])
    with pytest.raises(ValueError, match="repeated seeds"):
        align_by_seed(a, dup)


def test_paired_interval_is_calibrated_with_a_shared_seed_effect():
    """Two identical arms with a large shared seed effect: the paired test decides ~5%, as it should."""
    rng = np.random.default_rng(470)
    decided = 0
    for _ in range(600):
        df = long_table(rng, n_seeds=4, n_items=10, effect=0.0, shared_sd=3.0)
        m = df.groupby(["arm", "seed"]).score.mean()
        v = evaluate(claim(Seeds(m["A"], m["B"], paired=True), paper_value={"A": 50.0, "B": 40.0}), _T())["verdict"]
        decided += v in ("reproduced", "contradicted")
    assert 0.025 <= decided / 600 <= 0.075


# ---------------------------------------------------------------- the edges of the verdict rule
EDGES = [
    # (ci, paper_value A-B, proxy, tolerance, expected verdict)
    ((0.0, 2.0), 2.0, False, None, "inconclusive"),            # touches 0: not excluded; paper's 2.0 at the edge
    ((1e-9, 2.0), 2.0, False, None, "reproduced"),             # excludes 0 by a hair, paper's direction
    ((-2.0, -1e-9), 2.0, False, None, "contradicted"),         # excludes 0 the other way
    ((-0.5, 2.0), 2.0, False, None, "inconclusive"),           # exactly at the paper's effect: inside
    ((-0.5, 1.999), 2.0, False, None, "smaller than reported"),   # just below it, 0 inside
    ((-2.5, 0.5), -2.0, False, None, "inconclusive"),          # negative paper effect inside
    ((-1.9, 0.5), -2.0, False, None, "smaller than reported"),   # negative paper effect outside
    ((0.01, 0.02), 2.0, True, None, "reproduced"),             # narrow proxy interval in the paper's direction
    ((-0.01, 0.02), 2.0, True, None, "inconclusive"),          # proxy: sign only, never 'smaller than reported'
    ((-0.5, 0.5), 0.01, False, 0.5, "reproduced"),             # equivalence: inside ±tol (edges included)
    ((0.51, 0.9), 0.01, False, 0.5, "contradicted"),           # entirely outside ±tol
    ((0.4, 0.9), 0.01, False, 0.5, "inconclusive"),            # overlaps the edge (MDE below the tolerance)
]


@pytest.mark.parametrize("ci,effect,proxy,tol,expected", EDGES)
def test_verdict_rule_edges(ci, effect, proxy, tol, expected):
    lo, hi = ci
    ev = Precomputed(ours=(lo + hi) / 2, ci_low=lo, ci_high=hi, n_items=100, n_seeds=1, mde=0.1,
                     method="hand-made interval")
    kw = dict(paper_value={"A": 50.0 + effect, "B": 50.0}, proxy=proxy)
    if proxy:
        kw.update(unit="bpb", paper_unit="points", higher_is_better=True)
    if tol is not None:
        kw.update(tolerance=tol, tolerance_why="test")
    assert evaluate(claim(ev, **kw), _T())["verdict"] == expected


def test_smaller_than_reported_needs_the_papers_frame():
    """A paper metric that runs the other way than ours (same unit) is not compared in magnitude."""
    ev = Precomputed(ours=0.5, ci_low=-0.5, ci_high=1.0, n_items=10, n_seeds=1, mde=0.1, method="hand-made")
    r = evaluate(claim(ev, paper_value={"A": 40.0, "B": 50.0}, paper_higher_is_better=False), _T())
    assert r["verdict"] == "inconclusive"


def test_smaller_than_reported_is_calibrated_at_the_papers_effect():
    """True effect = the paper's effect (2 points), paired seeds: 'smaller than reported' (or any wrong decisive
    verdict) at most one tail of the 95% interval (~2.5%)."""
    rng = np.random.default_rng(4747)
    wrong = 0
    n = 1000
    idx = pd.RangeIndex(4, name="seed")
    for _ in range(n):
        shared = rng.normal(0, 1.0, 4)
        a = pd.Series(shared + 2.0 + rng.normal(0, 1.5, 4), index=idx)
        b = pd.Series(shared + rng.normal(0, 1.5, 4), index=idx)
        v = evaluate(claim(Seeds(a, b, paired=True)), _T())["verdict"]
        wrong += v in ("smaller than reported", "contradicted")
    assert 0.01 <= wrong / n <= 0.045


# ---------------------------------------------------------------- identities
def test_broken_identity_is_an_error_not_a_label():
    ok = ByConstruction("definition", "norm of a mix of unit vectors is cos(theta/2)", ours=1e-9, holds=True)
    r = evaluate(claim(ok, determined_by="definition"), _T())
    assert r["verdict"] == "holds by construction" and r["ci_low"] is None
    bad = ByConstruction("definition", "norm of a mix of unit vectors is cos(theta/2)", ours=0.3, holds=False)
    with pytest.raises(ClaimEvidenceError, match="failed check"):
        evaluate(claim(bad, determined_by="definition"), _T())
    with pytest.raises(ValueError, match="needs holds="):
        evaluate(claim(ByConstruction("definition", "x", ours=1.0), determined_by="definition"), _T())


def test_a_fixed_object_is_tested_not_labelled():
    """determined_by='initialisation' with real evidence decides (issue 47, item 1)."""
    idx = pd.RangeIndex(4, name="seed")
    a, b = pd.Series([3.0, 3.2, 3.1, 2.9], index=idx), pd.Series([1.0, 1.1, 0.9, 1.0], index=idx)
    r = evaluate(claim(Seeds(a, b, paired=True), determined_by="initialisation", regime=None), _T())
    assert r["verdict"] == "reproduced" and r["determined_by"] == "initialisation"


def test_circular_rows_cannot_decide():
    idx = pd.RangeIndex(4, name="seed")
    a, b = pd.Series([3.0, 3.2, 3.1, 2.9], index=idx), pd.Series([1.0, 1.1, 0.9, 1.0], index=idx)
    r = evaluate(claim(Seeds(a, b, paired=True), circular="the schedule was chosen until A beat B"), _T())
    assert r["verdict"] == "inconclusive" and r["reason"].startswith("circular") and "reproduced" in r["reason"]


# ---------------------------------------------------------------- the committed claims are pinned
def test_committed_claims_equal_a_rebuild():
    """`python -m moelab.claims check`: every committed claims.json validates and a rebuild from its tables gives it
    byte for byte (a change to a definition, a column or the engine fails here)."""
    assert check(figures_root(), defs=claim_defs) == []


def test_committed_claims_do_not_depend_on_row_order(tmp_path):
    """Shuffle the rows of every saved table of every committed folder: every claim record is unchanged (no
    definition reads a table by row position, e.g. pairs seeds by position)."""
    root = figures_root()
    rng = np.random.default_rng(47)
    for folder in output_folders(root):
        copy = tmp_path / folder.relative_to(root)
        copy.mkdir(parents=True)
        for f in folder.iterdir():   # the folder's own tables (a profile subfolder is another output folder)
            if f.is_file() and f.suffix in (".csv", ".json"):
                shutil.copy2(f, copy / f.name)
        for f in copy.glob("*.csv"):
            df = pd.read_csv(f)
            if len(df) > 1:
                df.sample(frac=1.0, random_state=int(rng.integers(1 << 30))).to_csv(f, index=False)
        _, original = evaluate_folder(folder, claim_defs)
        _, shuffled = evaluate_folder(copy, claim_defs)
        assert [_order_free(r) for r in original] == [_order_free(r) for r in shuffled], folder


def _order_free(rec: dict) -> dict:
    """A record with its texts as sorted words: a reason may list seeds or clusters in table order (cosmetic), but
    every number, label and word must survive a shuffle."""
    words = lambda t: sorted(w for w in re.split(r"[\s,;()\[\]]+", str(t)) if w)
    out = {k: v for k, v in rec.items() if k not in ("sources", "reason", "regime")}
    out["reason"] = words(rec["reason"])
    out["regime"] = None if rec["regime"] is None else {k: words(v) for k, v in rec["regime"].items()}
    return out
