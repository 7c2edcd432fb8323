"""Claims engine: statistics against naive references, definition errors, the verdict rule, the
schema, rebuild/check/CLI and the scorecard. Calibration and the defect classes: tests/claims/test_calibration.py."""
import importlib
import json
import sys
import types

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from helpers.claims import by_seed
from moelab import stats
from moelab.claims import (ByConstruction, Claim, ClaimEvidenceError, Insufficient, Items, Level, MissingTable,
                           NotInProfile, Options, Precomputed, Regime, Seeds, Tables, Trend, Unobtainable,
                           check_definitions, evaluate, scorecard_markdown, validate_record)
from moelab.claims.__main__ import main as cli
from moelab.claims.verdict_summary import headlines_markdown, short_reason
from moelab.claims.verdict_summary import results_markdown, review_markdown
from moelab.claims.registry import CLAIM_DEFS, claim_defs
from moelab.runner.notebook_run import REPO_ROOT

rb = importlib.import_module("moelab.claims.rebuild")   # the module (moelab.claims.rebuild is also the function)
RNG = np.random.default_rng(0)


class _T:
    """A stand-in for Tables when the evidence needs none."""
    profile, notebook, provenance = "default", "98_demo", {}


OK_REGIME = Regime("none: a unit test", "n/a", True)


def comp(ev, paper_value=None, **kw):
    base = dict(id="a_vs_b", claim="A beats B", paper_ref="Table 1, column X", metric="accuracy", unit="points",
                paper_value={"A": 50.0, "B": 48.0} if paper_value is None else paper_value, compare=("A", "B"),
                evidence=lambda T: ev, determined_by="training", regime=OK_REGIME,
                paper_quote="Table 1, column X: A 50.0, B 48.0")
    if kw.get("proxy"):
        base["proxy_for"] = "the paper's accuracy (test stand-in)"
    base.update(kw)
    return Claim(**base)


# ---------------------------------------------------------------- statistics vs naive references
def test_t_interval_paired_and_welch_match_scipy():
    x, y = RNG.normal(1, 2, 7), RNG.normal(0, 1, 5)
    iv = stats.t_interval(x)
    ref = sps.ttest_1samp(x, 0).confidence_interval(0.95)
    assert iv.estimate == pytest.approx(x.mean()) and (iv.low, iv.high) == pytest.approx((ref.low, ref.high))
    h = sps.t.ppf(0.975, 6) * x.std(ddof=1) / np.sqrt(7)   # the textbook formula
    assert iv.high - iv.estimate == pytest.approx(h)
    w = stats.welch_interval(x, y)
    ref = sps.ttest_ind(x, y, equal_var=False).confidence_interval(0.95)
    assert (w.low, w.high) == pytest.approx((ref.low, ref.high))
    p = stats.paired_t_interval(x[:5], y)
    ref = sps.ttest_rel(x[:5], y).confidence_interval(0.95)
    assert (p.low, p.high) == pytest.approx((ref.low, ref.high)) and p.df == 4
    with pytest.raises(ValueError, match="at least 2"):
        stats.t_interval([1.0])


def test_ols_slope_matches_linregress():
    s = np.arange(8.0)
    v = 0.3 * s + RNG.normal(0, 1, 8)
    iv = stats.ols_slope_interval(s, v)
    lr = sps.linregress(s, v)
    assert iv.estimate == pytest.approx(lr.slope) and iv.se == pytest.approx(lr.stderr) and iv.df == 6
    with pytest.raises(ValueError, match="3 distinct"):
        stats.ols_slope_interval([1, 1, 1], [1, 2, 3])


@pytest.mark.parametrize("df", [2, 5, 199])
def test_mde_has_about_80_percent_power(df):
    """At a true effect of one MDE, a two-sided 5% t-test rejects ~80% of the time (noncentral t, known SE)."""
    se = 0.7
    mde = stats.minimum_detectable_effect(se, df)
    crit = sps.t.ppf(0.975, df)
    power = sps.nct.sf(crit, df, mde / se) + sps.nct.cdf(-crit, df, mde / se)
    assert 0.75 < power < 0.85   # the usual approximation: 0.77 at df=2, 0.80 for large df
    assert stats.minimum_detectable_effect(0.0, df) == 0


def test_bootstrap_helpers_still_work():
    est, lo, hi = stats.bootstrap_ci(np.arange(10.0))
    assert lo < est < hi
    est, lo, hi = stats.paired_bootstrap(np.ones(20) * 2, np.ones(20))
    assert est == lo == hi == 1.0


# ---------------------------------------------------------------- definitions
def test_definition_errors_raise_at_definition():
    ev = Insufficient("x")
    with pytest.raises(ValueError, match="best='B' but the paper's numbers make 'A' best"):
        Claim(id="b", claim="B best", paper_ref="T", metric="m", unit="u", paper_value={"A": 2.0, "B": 1.0},
              best="B", evidence=lambda T: ev)
    with pytest.raises(ValueError, match="not in paper_value"):
        comp(ev, compare=("A", "C"))
    with pytest.raises(ValueError, match="expected_sign is derived"):
        comp(ev, expected_sign=1)
    with pytest.raises(ValueError, match="type expected_sign"):
        Claim(id="q", claim="q", paper_ref="T", metric="m", unit="u", compare=("A", "B"), evidence=lambda T: ev)
    with pytest.raises(ValueError, match="tolerance_why"):
        comp(ev, tolerance=0.5)
    with pytest.raises(ValueError, match="zero effect"):
        comp(ev, paper_value={"A": 1.0, "B": 1.0})
    with pytest.raises(ValueError, match="slug"):
        comp(ev, id="Bad Id")
    with pytest.raises(ValueError, match="only one of"):
        comp(ev, best="A")
    with pytest.raises(ValueError, match="used 2 times"):
        check_definitions([comp(ev), comp(ev)])
    with pytest.raises(ValueError, match="not a Claim"):
        check_definitions([comp(ev), {"id": "x"}])
    assert len(check_definitions([comp(ev), comp(ev, id="other")])) == 2
    with pytest.raises(ValueError, match="no paper_quote"):   # a paper claim quotes the paper
        check_definitions([comp(ev, paper_quote="")])
    assert check_definitions([comp(ev, paper_quote="", extension=True)])   # an extension needs none


def test_expected_sign_is_derived_and_flipped():
    ev = Insufficient("x")
    assert comp(ev).expected_sign == 1 and comp(ev).paper_effect == pytest.approx(2.0)
    assert comp(ev, paper_value={"A": 1.0, "B": 3.0}).expected_sign == -1
    # proxy: a lower-is-better metric (bpb) standing in for the paper's accuracy flips the sign
    c = comp(ev, unit="bits per byte", higher_is_better=False, proxy=True, paper_unit="points",
             paper_metric="MMLU accuracy", paper_higher_is_better=True)
    assert c.expected_sign == -1 and c.paper_effect == pytest.approx(2.0)
    # equivalence: the paper's difference within the tolerance
    e = comp(ev, paper_value={"A": 85.64, "B": 85.66}, tolerance=0.5, tolerance_why="half a point")
    assert e.equivalence and e.expected_sign == 0
    assert not comp(ev, tolerance=0.5, tolerance_why="x").equivalence   # 2 points > 0.5: directional
    # a best claim without numbers: the direction of "better"
    b = Claim(id="b", claim="x best", paper_ref="T", metric="m", unit="u", higher_is_better=False, best="x",
              evidence=lambda T: ev)
    assert b.expected_sign == -1


# ---------------------------------------------------------------- evidence and the verdict rule
def test_seeds_paired_matches_naive_t_and_verdicts():
    a, b = np.array([51.0, 52.5, 50.2, 51.8]), np.array([48.1, 49.0, 48.4, 49.9])
    r = evaluate(comp(Seeds(*by_seed(a, b), paired=True, n_items=100)), _T())
    d = a - b
    h = sps.t.ppf(0.975, 3) * d.std(ddof=1) / 2
    assert r["ours"] == pytest.approx(d.mean(), rel=1e-5) and r["ci_low"] == pytest.approx(d.mean() - h, rel=1e-5)
    assert r["mde"] == pytest.approx((sps.t.ppf(.975, 3) + sps.t.ppf(.8, 3)) * d.std(ddof=1) / 2, rel=1e-5)
    assert r["verdict"] == "reproduced" and (r["n_seeds"], r["n_items"]) == (4, 100)
    assert evaluate(comp(Seeds(*by_seed(b, a), paired=True)), _T())["verdict"] == "contradicted"
    # [seeds, items] arrays are averaged within each seed; Series are aligned on their seed index
    r2 = evaluate(comp(Seeds(*by_seed(np.repeat(a[:, None], 5, 1), np.repeat(b[:, None], 5, 1)), paired=True)), _T())
    assert r2["ours"] == r["ours"] and r2["n_items"] == 5
    sa, sb = pd.Series(a, index=[0, 1, 2, 3]), pd.Series(b[::-1], index=[3, 2, 1, 0])
    assert evaluate(comp(Seeds(sa, sb, paired=True)), _T())["ours"] == r["ours"]
    w = evaluate(comp(Seeds(a, b[:3], paired=False)), _T())
    ref = sps.ttest_ind(a, b[:3], equal_var=False).confidence_interval(0.95)
    assert w["ci_low"] == pytest.approx(ref.low, rel=1e-5) and "Welch" in w["method"]
    with pytest.raises(ValueError, match="paired arms need the same seeds"):
        evaluate(comp(Seeds(*by_seed(a, b[:3]), paired=True)), _T())


def test_items_matches_naive_paired_t_and_pseudo_pairs():
    a, b = RNG.normal(0.3, 1, 60), RNG.normal(0, 1, 60)
    r = evaluate(comp(Items(a, b)), _T())
    ref = sps.ttest_rel(a, b).confidence_interval(0.95)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((ref.low, ref.high), rel=1e-5)
    assert (r["n_seeds"], r["n_items"]) == (1, 60)
    a01, b01 = (a > 0).astype(float), (b > 0).astype(float)
    r = evaluate(comp(Items(a01, b01, score_range=(0, 1))), _T())
    d = np.concatenate([a01 - b01, [1.0, -1.0]])                 # one pseudo-pair at each extreme
    h = sps.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    assert r["ours"] == pytest.approx((a01 - b01).mean(), rel=1e-5)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((d.mean() - h, d.mean() + h), rel=1e-5)


def test_underpowered_inconclusive_and_proxy():
    a = np.array([50.0, 53.0, 47.0])
    b = np.array([49.0, 46.0, 52.0])   # huge seed spread: interval includes 0, MDE >> the paper's 2 points
    r = evaluate(comp(Seeds(a, b, paired=False)), _T())
    assert r["verdict"] == "underpowered" and r["mde"] > 2
    # the paper's effect above our MDE and outside our interval (which includes 0) -> smaller than reported
    r = evaluate(comp(Seeds(a, b, paired=False), paper_value={"A": 80.0, "B": 40.0}), _T())
    assert r["verdict"] == "smaller than reported" and r["mde"] < 40 and r["ci_high"] < 40 < 80
    assert "excludes the paper's effect +40" in r["reason"]
    # the paper's effect above our MDE but inside our interval -> inconclusive
    r = evaluate(comp(Seeds(a + 5.0, b, paired=False), paper_value={"A": 50.0, "B": 40.0}), _T())
    assert r["verdict"] == "inconclusive" and r["ci_low"] < 0 < r["mde"] < 10 < r["ci_high"]
    # proxy metric: decided on sign only, never 'underpowered'
    p = comp(Seeds(a, b, paired=False), unit="bpb", paper_unit="points", proxy=True, paper_higher_is_better=True)
    r = evaluate(p, _T())
    assert r["verdict"] == "inconclusive" and "proxy" in r["reason"]


def test_equivalence_verdicts():
    def eq(vals):
        return comp(Seeds(*by_seed(vals + 1.0, np.ones(len(vals))), paired=True), paper_value={"A": 85.64, "B": 85.66},
                    tolerance=0.5, tolerance_why="test")
    assert evaluate(eq(np.array([0.01, -0.02, 0.0, 0.02])), _T())["verdict"] == "reproduced"
    assert evaluate(eq(np.array([2.01, 1.98, 2.0, 2.02])), _T())["verdict"] == "contradicted"
    assert evaluate(eq(np.array([0.3, -0.9, 1.5, 0.1])), _T())["verdict"] == "underpowered"


def test_options_gap_to_best_other_and_winner():
    sc = {"k4": np.array([1.0, 1.1, 0.9]) + 10, "k2": np.array([0.5, 0.6, 0.4]) + 10,
          "k7": np.array([0.0, 0.1, -0.1]) + 10}

    def k4_best(scores):
        return Claim(id="k4_best", claim="k=4 is best", paper_ref="Fig. 4", metric="acc", unit="points",
                     paper_value={"k4": 36.8, "k2": 35.9, "k7": 35.5}, best="k4", evidence=lambda T: Options(dict(zip(scores, by_seed(*scores.values())))),
                     paper_quote="Fig. 4: k=4 36.8")
    r = evaluate(k4_best(sc), _T())
    assert r["ours"] == pytest.approx(0.5) and r["kind"] == "best" and r["ours_is"].startswith("difference k4 - k2")
    assert r["verdict"] == "reproduced" and r["paper_effect"] == pytest.approx(0.9)
    r = evaluate(k4_best(dict(sc, k2=sc["k2"] + 1.0)), _T())   # k2 now our best
    assert r["verdict"] == "contradicted" and "our best: k2 (not k4)" in r["reason"]
    # over items (fixed models)
    it = {"k4": RNG.normal(1, 1, 300), "k2": RNG.normal(0, 1, 300)}
    c3 = Claim(id="k4_best_items", claim="k=4 is best", paper_ref="Fig. 4", metric="acc", unit="points",
               paper_value={"k4": 36.8, "k2": 35.9}, best="k4",
               evidence=lambda T: Options(it, unit_of_replication="items"))
    assert evaluate(c3, _T())["n_items"] == 300


def test_level_trend_precomputed_and_fixed_verdicts():
    lvl = Claim(id="ratio_near_1", claim="ratio near 1", paper_ref="Fig. 5", metric="ratio", unit="ratio",
                paper_value=1.0, target=1.0, tolerance=0.05, tolerance_why="test",
                evidence=lambda T: Level(np.array([0.99, 1.01, 1.0, 1.005]), "items"))
    r = evaluate(lvl, _T())
    assert r["verdict"] == "reproduced" and r["kind"] == "absolute" and r["ours"] == pytest.approx(1.00125)
    below = Claim(id="below_1", claim="below 1", paper_ref="Fig. 5", metric="ratio", unit="ratio", target=1.0,
                  expected_sign=-1, evidence=lambda T: Level(np.array([0.7, 0.72, 0.69]), "seeds"))
    assert evaluate(below, _T())["verdict"] == "reproduced"
    steps = np.arange(6.0)
    tr = Claim(id="falls", claim="loss falls", paper_ref="Fig. 1", metric="loss", unit="nats", expected_sign=-1,
               evidence=lambda T: Trend(steps, 3 - 0.5 * steps + np.array([0, .1, -.1, 0, .1, -.1]), null="flat"))
    r = evaluate(tr, _T())
    assert r["verdict"] == "reproduced" and r["kind"] == "trend" and r["ours"] == pytest.approx(-0.5, abs=0.05)
    with pytest.raises(ValueError, match="null stated"):
        evaluate(Claim(id="f", claim="f", paper_ref="F", metric="m", unit="u", expected_sign=1,
                       evidence=lambda T: Trend(steps, steps, null="")), _T())
    pc = comp(Precomputed(ours=1.5, ci_low=0.5, ci_high=2.5, n_items=10, n_seeds=3, mde=1.0, method="permutation"))
    assert evaluate(pc, _T())["verdict"] == "reproduced"
    assert evaluate(comp(Unobtainable("no weights")), _T())["verdict"] == "unobtainable"
    assert evaluate(comp(Insufficient("one seed")), _T())["verdict"] == "inconclusive"
    with pytest.raises(ValueError, match="does not fit"):
        evaluate(comp(Level([1.0, 2.0, 3.0])), _T())


# ---------------------------------------------------------------- schema
def _good_record():
    return evaluate(comp(Seeds(*by_seed([51.0, 52.0, 50.0], [48.0, 49.0, 48.5]), paired=True)), _T())


def test_validate_record_rejects_missing_and_ill_typed():
    rec = _good_record()
    assert validate_record(dict(rec)) == rec
    for k in ("mde", "paper_ref", "unit", "verdict"):
        bad = dict(rec)
        del bad[k]
        with pytest.raises(ValueError, match=f"missing fields \\['{k}'\\]"):
            validate_record(bad)
    with pytest.raises(ValueError, match="n_seeds must be"):
        validate_record({**rec, "n_seeds": "3"})
    with pytest.raises(ValueError, match="verdict 'maybe'"):
        validate_record({**rec, "verdict": "maybe"})
    with pytest.raises(ValueError, match="must be a difference"):
        validate_record({**rec, "ours_is": "level of A"})
    with pytest.raises(ValueError, match="reversed"):
        validate_record({**rec, "ci_low": 5.0, "ci_high": 1.0})
    with pytest.raises(ValueError, match="unknown fields"):
        validate_record({**rec, "paper": "old"})


# ---------------------------------------------------------------- rebuild, change log, check, CLI, scorecard
@pytest.fixture
def demo(tmp_path, monkeypatch):
    """A figures root with one output folder of notebook 98_demo and its claim definitions (a module injected as
    ``demo_claims_98``, registered for 98_demo in the run layer's table ``moelab.runner.notebook_run.CLAIM_DEFS``)."""
    root = tmp_path / "figures"
    folder = root / "98_demo"
    folder.mkdir(parents=True)
    (folder / "provenance.json").write_text(json.dumps({"notebook": "98_demo", "profile": "default", "seed": 0}))
    rng = np.random.default_rng(1)
    rows = [dict(seed=s, arm=a, score=50 + (2 if a == "A" else 0) + rng.normal(0, 0.3)) for s in range(4)
            for a in "AB"]
    pd.DataFrame(rows).to_csv(folder / "table1_runs.csv", index=False)

    def runs(T):
        d = T.csv("table1_runs").pivot(index="seed", columns="arm", values="score")
        return Seeds(d["A"], d["B"], paired=True, n_items=200)

    mod = types.ModuleType("demo_claims_98")
    mod.CLAIMS = [comp(None, evidence=runs, legacy="A beats B (old text)"),
                  comp(None, id="missing", evidence=lambda T: Seeds(T.csv("table9_absent").x, [], paired=False)),
                  comp(None, id="by_def", determined_by="initialisation",
                       evidence=lambda T: ByConstruction("initialisation", "equal at init", 0.0, holds=True))]
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(CLAIM_DEFS, "98_demo", mod.__name__)
    monkeypatch.setenv("MOELAB_FIGURES", str(root))
    return root, folder, mod


def test_rebuild_deterministic_changelog_and_check(demo, tmp_path):
    root, folder, mod = demo
    old = {"provenance": {}, "claims": [{"claim": "A beats B (old text)", "verdict": "inconclusive"},
                                        {"claim": "dropped claim", "verdict": "reproduced"}]}
    (folder / "claims.json").write_text(json.dumps(old))
    log = tmp_path / "changes.md"
    recs = rb.rebuild(folder, defs=claim_defs, changelog=log)
    first = (folder / "claims.json").read_bytes()
    v = {r["id"]: r["verdict"] for r in recs}
    assert v == {"a_vs_b": "reproduced", "missing": "inconclusive", "by_def": "holds by construction"}
    assert "needs table table9_absent.csv, produced by the next run" in recs[1]["reason"]
    text = log.read_text()
    assert "| A beats B | inconclusive | reproduced |" in text and "| dropped claim | reproduced | (removed) |" in text
    rb.rebuild(folder, defs=claim_defs, changelog=log)
    assert (folder / "claims.json").read_bytes() == first          # identical bytes
    assert log.read_text() == text                                  # nothing changed: nothing appended
    data = json.loads(first)
    assert set(data) == {"provenance", "engine", "claims"} and data["provenance"]["notebook"] == "98_demo"
    assert rb.check(root, defs=claim_defs) == [] and cli(["check", "--root", str(root)]) == 0
    data["claims"][0]["verdict"] = "contradicted"
    (folder / "claims.json").write_text(json.dumps(data))
    problems = rb.check(root, defs=claim_defs)
    assert len(problems) == 1 and "claims ['a_vs_b']" in problems[0]
    assert cli(["check", "--root", str(root)]) == 1
    assert cli(["rebuild", "--all", "--no-changelog"]) == 0 and rb.check(root, defs=claim_defs) == []


def test_tables_accessor(demo):
    root, folder, mod = demo
    (folder / "extra.json").write_text('{"k": 1}')
    T = Tables(folder)
    assert (T.notebook, T.profile) == ("98_demo", "default") and T.has("table1_runs") and not T.has("nope")
    assert list(T.csv("table1_runs.csv").columns) == ["seed", "arm", "score"] and T.json("extra") == {"k": 1}
    with pytest.raises(MissingTable, match="nope.csv, produced by the next run"):
        T.csv("nope")


def test_rebuild_errors_name_the_claim_and_missing_defs(demo):
    root, folder, mod = demo
    mod.CLAIMS.append(comp(None, id="buggy", evidence=lambda T: Seeds(T.csv("table1_runs").nope, [], paired=False)))
    with pytest.raises(ClaimEvidenceError, match="claim 'buggy': AttributeError"):
        rb.rebuild(folder, defs=claim_defs, write=False)
    (folder / "provenance.json").write_text(json.dumps({"notebook": "97_nodefs", "profile": "default"}))
    with pytest.raises(ValueError, match="no claim definitions for notebook '97_nodefs'.*CLAIM_DEFS"):
        rb.rebuild(folder, defs=claim_defs)
    with pytest.raises(ValueError, match="no claim definitions given: pass defs="):
        rb.rebuild(folder, defs=None)
    with pytest.raises(ValueError, match="demo_claims_98 defines no CLAIMS list"):
        rb.rebuild(folder, defs=types.ModuleType("demo_claims_98"))
    with pytest.raises(TypeError, match="defs"):
        rb.rebuild(folder)                  # the engine never guesses where a notebook's definitions live


def test_rebuild_takes_a_definitions_module_directly(demo):
    """``defs`` may be the module itself (a caller that knows its notebook), not only a resolver."""
    root, folder, mod = demo
    assert ([r["id"] for r in rb.rebuild(folder, defs=mod, write=False)]
            == [r["id"] for r in rb.rebuild(folder, defs=claim_defs, write=False)] == ["a_vs_b", "missing", "by_def"])


def test_rebuild_changelog_auto_only_for_committed_figures(demo, monkeypatch, tmp_path):
    root, folder, mod = demo
    log = tmp_path / "auto.md"
    monkeypatch.setattr(rb, "CHANGELOG", log)
    (folder / "claims.json").write_text(json.dumps({"claims": [{"id": "a_vs_b", "verdict": "contradicted",
                                                                 "claim": "x"}]}))
    rb.rebuild(folder, defs=claim_defs)     # a tmp folder is not under the repository's figures/: no log
    assert not log.exists()
    assert rb._display(folder.parent / ".98_demo.staging-123") == str((root / "98_demo").resolve())


def test_scorecard_markdown(demo):
    """README block: counts by label (extensions apart); docs/RESULTS.md: per-claim rows linking their tables."""
    root, folder, mod = demo
    rb.rebuild(folder, defs=claim_defs, changelog=None)
    md = scorecard_markdown(root)
    assert ("| notebook | profile | reproduced | contradicted | smaller than reported | underpowered | inconclusive |"
            in md)
    assert "| 98_demo | default | 1 | 0 | 0 | 0 | 1 | 1 | 0 | 0 | 0 | 3 | 0 |" in md and "docs/RESULTS.md" in md
    full = results_markdown(root)
    assert "| paper (value, unit) | ours (difference, unit) | 95% CI | MDE | seeds x items | label |" in full
    row = next(line for line in full.splitlines() if "A beats B" in line)
    assert "A 50 vs B 48: +2 points" in row and "| 4 x 200 | reproduced |" in row and "(Table 1, column X)" in row
    assert "[table1_runs.csv](../figures/98_demo/table1_runs.csv)" in row


def test_labels_gates_and_checklist(demo):
    """The undecided labels, the gates that never look at the answer, the checklist fields, review."""
    root, folder, mod = demo
    runs = mod.CLAIMS[0].evidence
    fail = Regime("the stand-in beats its baseline", "2.24 vs 2.22", False)
    mod.CLAIMS[:] = [
        comp(None, id="elsewhere", evidence=lambda T: NotInProfile("full", "arm b runs only in full")),
        comp(None, id="weights", evidence=lambda T: Unobtainable("needs Llama-2-7b")),
        comp(None, id="gated", evidence=runs, regime=fail),
        comp(None, id="init_set", evidence=runs, determined_by="initialisation"),
        comp(None, id="ext", evidence=runs, extension=True),
        comp(None, id="decided", evidence=runs, legacy="A beats B (old text)"),
    ]
    recs = {r["id"]: r for r in rb.rebuild(folder, defs=claim_defs, changelog=None)}
    v = {k: r["verdict"] for k, r in recs.items()}
    assert v == {"elsewhere": "not in this profile", "weights": "unobtainable", "gated": "outside the regime",
                 "init_set": "reproduced", "ext": "extension", "decided": "reproduced"}
    assert recs["elsewhere"]["scored_in"] == "full" and "2.24 vs 2.22" in recs["gated"]["reason"]
    # a quantity set at initialisation is a fixed object: tested like any other (issue 47), never labelled
    assert recs["init_set"]["determined_by"] == "initialisation" and recs["init_set"]["ci_low"] is not None
    d = recs["decided"]
    assert d["determined_by"] == "training" and d["regime"] == {"check": "none: a unit test", "value": "n/a",
                                                                "passed": True}
    assert d["replication"].startswith("4 seed(s) x 200 item(s): seeds are the unit") and d["proxy_for"]
    assert d["sources"] == ["table1_runs.csv"]
    assert cli(["review", "--root", str(root)]) == 0
    text = review_markdown(root)
    assert "| decided | reproduced |" in text and "none: a unit test: n/a (passed)" in text
    # a decisive row without its regime is an error at rebuild time
    mod.CLAIMS[:] = [comp(None, id="decided", evidence=runs, regime=None)]
    with pytest.raises(ValueError, match="empty checklist field"):
        rb.rebuild(folder, defs=claim_defs, changelog=None)
    # the same counts go to the other profile's pointer in RESULTS.md
    assert "→ full" in results_markdown(root)


def test_proxy_rows_are_never_underpowered():
    """A proxy equivalence row whose tolerance is below our MDE is inconclusive, not underpowered."""
    rng = np.random.default_rng(426)   # its own generator: the module RNG's draws depend on test order (xdist)
    ev = Items(rng.normal(0, 1, 30), rng.normal(0, 1, 30))
    rec = evaluate(comp(ev, paper_value={"A": 50.0, "B": 50.0}, tolerance=0.01, tolerance_why="test",
                        paper_tolerance=0.5, unit="nats", paper_unit="points", proxy=True), _T())
    assert rec["verdict"] == "inconclusive" and validate_record(rec)


def test_degenerate_interval_names_the_test_that_decided():
    rec = evaluate(Claim(id="dep", claim="dependent", paper_ref="F", metric="V", unit="V", expected_sign=1,
                         determined_by="training", regime=OK_REGIME,
                         evidence=lambda T: Precomputed(0.8, 0.8, 0.8, 100, 1, 0.1, "permutation p = 0.0005")), _T())
    assert rec["verdict"] == "reproduced" and "degenerate interval" in rec["reason"]
    assert "permutation p = 0.0005" in rec["reason"]


def test_every_claim_definition_file_checks():
    """Each notebook's definitions (the run layer's table) import, build their Claims (signs derived from the paper
    numbers beside them) and have unique ids; every notebook has an entry and every ``<paper>/claims.py`` is in it."""
    notebooks = {p.stem for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.py")}
    assert notebooks <= set(CLAIM_DEFS), sorted(notebooks - set(CLAIM_DEFS))
    files = {f"moelab.{p.parent.name}.claims" for p in (REPO_ROOT / "lib" / "moelab").glob("*/claims.py")}
    assert files <= set(CLAIM_DEFS.values()), sorted(files - set(CLAIM_DEFS.values()))
    for name in sorted(CLAIM_DEFS):
        mod = claim_defs(name)
        assert mod.__name__ == CLAIM_DEFS[name]
        claims = check_definitions(mod.CLAIMS)
        for c in claims:
            if c.paper_effect is not None and not c.equivalence:
                flip = 1 if c.paper_higher_is_better == c.higher_is_better else -1
                assert c.expected_sign == np.sign(c.paper_effect) * flip, (name, c.id)


def test_short_reason_shows_what_failed_the_regime_check():
    c = {"reason": 'regime check failed ("every seed met the targets"): seed 0 missed by 0.004; measured anyway: x'}
    assert short_reason(c) == "seed 0 missed by 0.004"
    assert short_reason({"reason": 'regime check failed ("best model beats the 4-gram"); stand-in'}) == \
        "best model beats the 4-gram"
    assert short_reason({"reason": "scored by the full profile: not run"}) == "scored by the full profile: not run"


def test_headlines_name_the_decisive_verdicts_of_the_largest_profile():
    def rec(i, verdict, claim="A beats B (paper: better): on task X", ours=1.5, lo=0.5, hi=2.5):
        return dict(id=i, verdict=verdict, claim=claim, ours=ours, ci_low=lo, ci_high=hi, unit="points")

    files = [("01_x", "default", [rec("a", "contradicted")]),
             ("01_x", "full", [rec("a", "reproduced"), rec("b", "reproduced"), rec("c", "reproduced"),
                               rec("d", "extension")]),
             ("02_y", "default", [rec("a", "outside the regime"), rec("b", "outside the regime"),
                                  rec("c", "underpowered")])]
    lines = headlines_markdown(files).splitlines()
    assert lines[0] == ("- **01_x** (full): reproduced 3: A beats B (paper: better) (+1.5 [0.5, 2.5] points); "
                        "A beats B (paper: better) (+1.5 [0.5, 2.5] points); and 1 more")
    assert lines[1] == "- **02_y** (default): no decisive verdict (2 outside the regime, 1 underpowered)"
