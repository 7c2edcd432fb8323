"""Notebook 05's honesty tables in moelab.free_moe.report, each against a naive computation on
a small hand-made table: the paper's test-selected DOWP row (count-weighted Max, reproduced from its own appendix
tables) beside the reference-selected protocol; which accuracy items flip and what their options look like; accuracy
and answer likelihood side by side with paired intervals and MDEs, never pooled."""
import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import t as t_dist

from moelab import free_moe as fm
from moelab.claims import Claim, Items, evaluate
from moelab.suite import baselines

BANDS = ["50-55%", "55-60%", "60-65%", "65-70%", "70-75%", "75-80%", "80-85%", "85-90%", "90-95%", "95-100%"]
# Paper 004 appendix Table 6 (MMLU, LLaMA-2-7b-chat): samples and the ten band columns per cluster
TABLE6 = [(2047, 57.79, 58.72, 58.96, 59.26, 59.99, 59.94, 60.67, 60.23, 60.77, 60.92),
          (1518, 35.57, 34.72, 34.32, 35.70, 35.38, 35.31, 35.84, 35.44, 36.17, 35.77),
          (895, 23.02, 24.02, 22.57, 23.35, 23.02, 22.01, 22.46, 22.68, 22.79, 22.57),
          (1586, 48.93, 47.92, 49.37, 48.99, 49.87, 49.50, 49.43, 50.44, 50.88, 51.01),
          (212, 27.83, 28.77, 28.30, 25.94, 28.77, 26.89, 27.83, 26.89, 27.36, 26.89),
          (1477, 59.58, 59.04, 60.39, 59.51, 60.12, 60.80, 60.93, 61.61, 61.61, 61.75),
          (322, 35.09, 32.92, 33.85, 34.78, 33.54, 34.78, 33.54, 34.16, 35.09, 35.09),
          (434, 27.65, 25.58, 29.95, 26.96, 26.96, 27.19, 28.11, 29.72, 27.19, 29.49),
          (2016, 55.21, 55.36, 55.46, 55.51, 56.15, 55.56, 56.35, 57.04, 57.19, 57.44),
          (1839, 46.66, 47.53, 46.82, 46.49, 47.36, 47.74, 47.36, 48.02, 48.45, 48.29),
          (1174, 30.92, 30.15, 31.26, 31.09, 30.49, 30.15, 30.83, 32.03, 32.28, 31.86),
          (522, 42.34, 45.21, 44.25, 42.91, 46.74, 45.40, 46.74, 47.32, 46.36, 47.13)]
# Table 7 (GSM8K)
TABLE7 = [(240, 12.92, 15.00, 15.83, 18.75, 13.75, 17.08, 16.67, 17.50, 15.83, 16.67),
          (8, 0.00, 12.50, 12.50, 37.50, 25.00, 12.50, 12.50, 37.50, 0.00, 12.50),
          (225, 17.78, 21.78, 18.22, 24.00, 22.67, 22.67, 22.22, 21.78, 20.44, 24.00),
          (361, 18.28, 16.90, 19.67, 20.50, 19.94, 23.82, 21.05, 23.82, 21.61, 23.82),
          (113, 13.27, 17.70, 9.73, 15.04, 15.93, 19.47, 17.70, 13.27, 17.70, 16.81),
          (193, 12.44, 10.88, 12.95, 13.99, 15.03, 17.62, 20.73, 18.65, 17.10, 19.69),
          (6, 33.33, 16.67, 50.00, 33.33, 33.33, 16.67, 33.33, 33.33, 16.67, 50.00),
          (173, 16.18, 14.45, 17.92, 23.12, 17.34, 19.08, 17.34, 19.65, 18.50, 19.65)]


@pytest.mark.parametrize("rows,table1", [(TABLE6, 47.79), (TABLE7, 22.21)])
def test_count_weighted_max_reproduces_the_papers_dowp_row(rows, table1):
    t = pd.DataFrame(rows, columns=["samples", *BANDS])
    assert round(fm.report.count_weighted_max(t), 2) == table1                 # Table 1's DOWP cell (MMLU 47.79, GSM8K 22.21)
    naive = sum(r[0] * max(r[1:]) for r in rows) / sum(r[0] for r in rows)
    assert abs(fm.report.count_weighted_max(t) - naive) < 1e-12
    with pytest.raises(ValueError, match="band columns"):
        fm.report.count_weighted_max(t[["samples"]])


def _test_sweep():
    """Per-item test scores: 2 domains, 3 clusters of 4/2/3 items, bands base / A / B / C (0/1 accuracy)."""
    rng = np.random.default_rng(3)
    rows = []
    for dom, cl, n in [("general", "general_0", 4), ("general", "general_1", 2), ("maths", "maths_0", 3)]:
        for band in ["base", "0-5%", "50-55%", "95-100%"]:
            for i in range(n):
                rows.append(dict(domain=dom, cluster=cl, band=band, item=i, score=float(rng.integers(0, 2))))
    return pd.DataFrame(rows)


def test_table1_selection_matches_naive():
    sw = _test_sweep()
    selected = {"general_0": (50.0, 55.0), "general_1": (95.0, 100.0), "maths_0": "95-100%"}
    got = fm.report.table1_selection(sw, selected).set_index(["domain", "protocol"])
    bands = ["50-55%", "95-100%"]                                         # the paper's grid: never Wanda's 0-5%
    for dom in ["general", "maths"]:
        d = sw[sw.domain == dom]
        tot_ref, tot_test, n = 0.0, 0.0, 0
        for cl in d.cluster.unique():
            c = d[d.cluster == cl]
            lab = selected[cl] if isinstance(selected[cl], str) else fm.band_label(selected[cl])
            means = {b: c[c.band == b].score.mean() for b in bands}
            best = max(means.values())                                    # selection on the test items
            k = len(c[c.band == "base"])
            tot_ref += k * means[lab]
            tot_test += k * best
            n += k
        assert got.loc[(dom, "reference-selected, test-reported"), "score"] == pytest.approx(100 * tot_ref / n)
        assert got.loc[(dom, "test-selected (optimistic)"), "score"] == pytest.approx(100 * tot_test / n)
        assert got.loc[(dom, "BASELINE"), "score"] == pytest.approx(100 * d[d.band == "base"].score.mean())
        assert got.loc[(dom, "test-selected (optimistic)"), "score"] >= \
            got.loc[(dom, "reference-selected, test-reported"), "score"]
        assert got.loc[(dom, "BASELINE"), "n_items"] == n
    with pytest.raises(ValueError, match="no reference-selected band"):
        fm.report.table1_selection(sw, {"general_0": (0, 5)})


# ---------------------------------------------------------------- flips
ITEMS = [dict(id="d0", task="moelab_bb_date_understanding", label=0,
              choices=[" 05/01/2020", " 05/02/2020", " 06/01/2020", " 05/01/2021", " 12/31/1999"]),
         dict(id="d1", task="moelab_bb_date_understanding", label=2,
              choices=[" 01/01/2000", " 01/01/2001", " 01/11/2001", " 11/01/2001", " 01/10/2002"]),
         dict(id="h0", task="moelab_bb_hyperbaton", label=1, choices=[" Yes", " No"]),
         dict(id="h1", task="moelab_bb_hyperbaton", label=0, choices=[" a big old red car", " old a car big red"]),
         dict(id="d2", task="moelab_bb_date_understanding", label=4,
              choices=[" 03/03/2003", " 03/04/2003", " 04/03/2003", " 03/03/2004", " 03/13/2003"])]
BASE = [0, 1, 0, 1, 0]
DOWP = [1, 0, 0, 1, 1]


def test_flip_table_and_summary_match_naive():
    ft = fm.report.flip_table(ITEMS, BASE, DOWP, dowp_pick=[0, 0, 0, 0, 4])
    assert ft.flip.tolist() == ["up", "down", "both wrong", "both right", "up"]
    assert ft.gold_pos.tolist() == [0, 2, 1, 0, 4] and ft.n_options.tolist() == [5, 5, 2, 2, 5]
    for r, it in zip(ft.itertuples(), ITEMS):
        opts = [c.strip() for c in it["choices"]]
        sim = baselines.option_similarity(opts)
        assert r.most_similar_pos == int(np.argmax(sim))
        assert r.gold_is_most_similar == bool(sim[it["label"]] >= sim.max() - 1e-12)
        assert r.gold_is_longest == (len(opts[it["label"]]) == max(map(len, opts)))
        assert r.gold_is_shortest == (len(opts[it["label"]]) == min(map(len, opts)))
        for h in baselines.HEURISTICS:
            assert getattr(r, f"blind_{h}") == baselines.heuristic_correct([dict(choices=opts, gold=it["label"])], h)[0]
    assert bool(ft.loc[0, "gold_is_most_similar"])                       # the "centre" date is the gold one
    s = fm.report.flip_summary(ft, by=("task", "gold_is_most_similar")).set_index(["feature", "value"])
    for task in {it["task"] for it in ITEMS}:
        sub = ft[ft.task == task]
        row = s.loc[("task", task)]
        assert row.up == (sub.flip == "up").sum() and row.down == (sub.flip == "down").sum()
        assert row.net == row.up - row.down and row.n == len(sub)
        assert row.dowp_acc == pytest.approx(np.mean([DOWP[i] for i, it in enumerate(ITEMS) if it["task"] == task]))
    assert s.n.groupby(level="feature").sum().tolist() == [5, 5]
    cv = fm.report.flip_table(ITEMS * 2, BASE * 2, DOWP * 2, n_folds=2)           # option-only classifier, cross-validated
    assert len(cv) == 10 and cv.blind_cv_logreg.between(0, 1).all()
    with pytest.raises(ValueError, match="0/1 accuracy"):
        fm.report.flip_table(ITEMS, [0.5] * 5, DOWP)
    with pytest.raises(ValueError, match="no choices"):
        fm.report.flip_table([dict(id="x", prompt="p", answer="a")], [0], [1])


# ---------------------------------------------------------------- accuracy beside likelihood
def _scores():
    rng = np.random.default_rng(7)
    rows = []
    spec = [("general", "moelab_bb_hyperbaton", 12, "acc"), ("general", "moelab_bb_navigate", 9, "acc"),
            ("maths", "moelab_math_mc", 10, "acc"), ("maths", "moelab_nll_maths", 8, "ll"),
            ("code", "moelab_nll_code", 6, "ll")]
    for dom, task, n, kind in spec:
        for i in range(n):
            for m in ("BASELINE", "DOWP", "FREE-MOE"):
                v = float(rng.integers(0, 2)) if kind == "acc" else float(-1.5 + rng.normal(0, 0.3))
                rows.append(dict(method=m, task=task, id=f"{task}-{i}", score=v, domain=dom))
    return pd.DataFrame(rows)


def _naive(x, y, target=None, span=None):
    """Paired t over items; bounded scores (``span`` = high - low) get one pseudo-pair at +span and one at -span."""
    d = np.asarray(x, float) - np.asarray(y, float)
    raw_mean, n_items = d.mean(), len(d)
    if span is not None:
        d = np.append(d, [span, -span])
    n = len(d)
    se = d.std(ddof=1) / math.sqrt(n)
    h = t_dist.ppf(0.975, n - 1) * se
    mde = (t_dist.ppf(0.975, n - 1) + t_dist.ppf(0.8, n - 1)) * se
    need = math.ceil(n_items * (mde / target) ** 2) if target else None
    return raw_mean, d.mean() - h, d.mean() + h, mde, need


def test_domain_summary_interval_is_the_claims_engines():
    """A task where no item flips reads 0 [-w, +w] with the engine's MDE, never a zero-width interval."""
    sc = _scores()
    acc = sc[sc.task.map(fm.report.metric_of_task) == "acc"].copy()
    base = acc[acc.method == "BASELINE"].set_index("id").score
    acc.loc[acc.method == "DOWP", "score"] = acc.loc[acc.method == "DOWP", "id"].map(base).to_numpy()   # no flips
    out = fm.report.domain_summary(acc)
    for r in out.itertuples():
        w = acc[acc.task == r.task] if r.level == "task" else acc[acc.domain == r.domain]
        w = 100.0 * w.pivot_table(index=["task", "id"], columns="method", values="score")
        ev = Items(a=w.DOWP.to_numpy(), b=w.BASELINE.to_numpy(), score_range=(0.0, 100.0))
        rec = evaluate(Claim(id="x", claim="t", paper_ref="t", metric="accuracy", unit="points",
                             paper_value={"DOWP": 50.0, "BASELINE": 48.0}, compare=("DOWP", "BASELINE"),
                             evidence=lambda T, ev=ev: ev), None)
        assert r.diff == 0 and r.lo < 0 < r.hi
        assert (r.lo, r.hi) == pytest.approx((rec["ci_low"], rec["ci_high"]), rel=1e-5)   # records keep 6 digits
        assert r.mde == pytest.approx(rec["mde"], rel=1e-5)


def test_domain_summary_matches_naive_and_never_pools():
    sc = _scores()
    out = fm.report.domain_summary(sc, target={"acc": 2.0, "loglik": 0.05})
    assert set(out.columns) >= {"level", "domain", "task", "metric", "unit", "n", "DOWP", "BASELINE", "diff", "lo",
                                "hi", "se", "df", "mde", "target", "n_needed", "powered"}
    for r in out.itertuples():
        if r.level == "task":
            sub = sc[sc.task == r.task]
        else:                                                          # a domain's tasks of this one metric only
            sub = sc[(sc.domain == r.domain) & (sc.task.map(fm.report.metric_of_task) == r.metric)]
        assert sub.task.map(fm.report.metric_of_task).nunique() == 1            # never pooled across metrics
        w = sub.pivot_table(index=["task", "id"], columns="method", values="score")
        k = 100.0 if r.metric == "acc" else 1.0
        diff, lo, hi, mde, need = _naive(k * w.DOWP, k * w.BASELINE, {"acc": 2.0, "loglik": 0.05}[r.metric],
                                         span=100.0 if r.metric == "acc" else None)
        assert r.n == len(w) and r.diff == pytest.approx(diff) and r.mde == pytest.approx(mde)
        assert r.lo == pytest.approx(lo) and r.hi == pytest.approx(hi) and r.n_needed == need
        assert r.powered == (mde <= {"acc": 2.0, "loglik": 0.05}[r.metric])
        assert r.unit == ("points" if r.metric == "acc" else "nats/token")
    dom = out[out.level == "domain"]
    assert sorted(zip(dom.domain, dom.metric)) == [("code", "loglik"), ("general", "acc"), ("maths", "acc"),
                                                   ("maths", "loglik")]
    wide = fm.report.side_by_side(out)
    assert list(wide.columns[:6]) == ["domain", "acc_diff", "acc_lo", "acc_hi", "acc_mde", "acc_n"]
    m = wide.set_index("domain")
    assert m.loc["maths", "acc_n"] == 10 and m.loc["maths", "loglik_n"] == 8 and np.isnan(m.loc["code", "acc_diff"])
    fr = fm.report.domain_summary(sc.drop(columns="domain"), a="FREE-MOE",
                           domain_of={t: d for t, d in zip(sc.task, sc.domain)})
    assert "FREE-MOE" in fr.columns and len(fr) == len(out)
    with pytest.raises(ValueError, match="method 'WANDA'"):
        fm.report.domain_summary(sc, a="WANDA")
    with pytest.raises(ValueError, match="domain"):
        fm.report.domain_summary(sc.drop(columns="domain"))


def test_table1_selection_never_takes_wandas_baseline_band_as_the_test_selected_maximum():
    """Issue 47 item 8: the test-selected (paper's) row is a maximum over the paper's 50-100% grid; Wanda's 0-5% is a
    baseline row (``role == "baseline"``), never a maximum. A cluster whose 0-5% scores best on the test items must
    contribute its best paper-grid band's score, and the named band must be the one whose score is counted."""
    rows = []
    # cluster c0: 0-5% scores 1.0, the grid bands 0.5 / 0.25; cluster c1: 0-5% 0.0, grid bands 0.75 / 1.0
    spec = {"c0": {"base": 0.0, "50-55%": 0.5, "95-100%": 0.25, "0-5%": 1.0},
            "c1": {"base": 0.0, "50-55%": 0.75, "95-100%": 1.0, "0-5%": 0.0}}
    for c, bands in spec.items():
        for band, v in bands.items():
            role = "dense" if band == "base" else "baseline" if band == "0-5%" else "band"
            rows += [dict(domain="g", cluster=c, band=band, role=role, item=i, score=v) for i in range(4)]
    sw = pd.DataFrame(rows)
    got = fm.report.table1_selection(sw, {"c0": "50-55%", "c1": "95-100%"}).set_index("protocol")
    assert got.loc["test-selected (optimistic)", "score"] == pytest.approx(100 * (0.5 + 1.0) / 2)
    assert got.loc["test-selected (optimistic)", "bands"] == "c0:50-55%, c1:95-100%"
    # without a role column the baseline band is still recognised by its label (Wanda's 0-5%)
    got2 = fm.report.table1_selection(sw.drop(columns="role"), {"c0": "50-55%", "c1": "95-100%"})
    assert got2.set_index("protocol").loc["test-selected (optimistic)", "score"] == pytest.approx(75.0)


def test_table1_selection_algorithm1_protocol_is_at_most_the_test_selected_row():
    """The paper's Algorithm 1 (each cluster's reference arg-max band, no fallback to the dense model) on the test
    items: one grid band per cluster, so the test-selected maximum is at least it (an identity), while the gated
    protocol (dense where a cluster's gain interval was not above 0) need not be."""
    sw = _test_sweep()
    sw = sw.assign(role=np.where(sw.band == "base", "dense", np.where(sw.band == "0-5%", "baseline", "band")))
    alg1 = {"general_0": (50.0, 55.0), "general_1": "95-100%", "maths_0": "50-55%"}
    got = fm.report.table1_selection(sw, {"general_0": "base", "general_1": "base", "maths_0": "base"},
                                     algorithm1=alg1).set_index(["domain", "protocol"])
    for dom in ["general", "maths"]:
        d = sw[sw.domain == dom]
        parts = [d[(d.cluster == c) & (d.band == (v if isinstance(v, str) else fm.band_label(v)))].score
                 for c, v in alg1.items() if c in set(d.cluster)]
        want = 100 * pd.concat(parts).mean()
        assert got.loc[(dom, "reference-selected (Algorithm 1), test-reported"), "score"] == pytest.approx(want)
        assert got.loc[(dom, "test-selected (optimistic)"), "score"] >= want - 1e-9
        assert got.loc[(dom, "reference-selected, test-reported"), "score"] == \
            pytest.approx(got.loc[(dom, "BASELINE"), "score"])                  # gated everywhere -> dense
    with pytest.raises(ValueError, match="not a grid band"):
        fm.report.table1_selection(sw, {c: "base" for c in alg1}, algorithm1={**alg1, "maths_0": "0-5%"})
