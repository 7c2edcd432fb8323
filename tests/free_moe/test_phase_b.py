"""Phase B: the pieces notebook 05 added, each against a naive reference on a tiny Llama or a hand-made
table: accuracy beside the choice-normalised gold probability from one scorer call (``item_metrics``),
each (item, mask) pair scored once across methods (``evaluate_methods``), bands selected on the paper's grid with a
gate and the test items swept in the same passes but never used for selection (``select_with_gate``,
``dowp_select(test_by_sub=)``), the off-domain probe's routing
(``eq3_keys(as_domain=)``), the primary-metric rule, the baselines beside the models, and what one domain's masks do
to the other domains (``cross_domain_summary``)."""
import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import t as t_dist

from moelab import free_moe as fm
from moelab.free_moe import data as fm_data
from moelab.suite import baselines

from helpers.free_moe import TEXTS, batches, tiny_llama


def _mc_items():
    return [dict(id=f"m{i}", task="mc", prompt=t[:9], choices=[t[9:], " yes", " no and maybe"], label=i % 3)
            for i, t in enumerate(TEXTS[:5])]


def _free_items():
    return [dict(id=f"f{i}", task="free", prompt=t[:10], answer=t[10:]) for i, t in enumerate(TEXTS[3:])]


# ---------------------------------------------------------------- accuracy and choice-normalised score from one call
def test_item_metrics_match_naive(model, tok):
    items = _mc_items() + _free_items()
    got = fm.scoring.item_metrics(model, tok, items, batch_size=3)
    assert fm.scoring.ITEM_METRICS == ("score", "acc", "acc_norm", "p_gold", "p_gold_norm", "loglik", "pick")
    assert got.shape == (len(items), len(fm.scoring.ITEM_METRICS))
    col = {c: j for j, c in enumerate(fm.scoring.ITEM_METRICS)}
    for k, it in enumerate(items):
        if "choices" in it:
            lp, _ = fm.scoring.continuation_logprobs(model, tok, [it["prompt"]] * 3, it["choices"])
            pick, gold = int(np.argmax(lp)), it["label"]
            p = np.exp(lp - lp.max()) / np.exp(lp - lp.max()).sum()                     # naive softmax over options
            ln = np.array([len(c.removeprefix(" ")) for c in it["choices"]], float)
            z = lp / ln
            pn = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
            assert got[k, col["pick"]] == pick and got[k, col["acc"]] == float(pick == gold)
            assert got[k, col["acc_norm"]] == float(int(np.argmax(z)) == gold)
            assert got[k, col["p_gold"]] == pytest.approx(p[gold], abs=1e-4) == got[k, col["score"]]
            assert got[k, col["p_gold_norm"]] == pytest.approx(pn[gold], abs=1e-4)
            assert np.isnan(got[k, col["loglik"]])                          # raw gold likelihood: reported nowhere
        else:
            assert np.isnan(got[k, [col["acc"], col["p_gold"], col["pick"]]]).all()
            assert got[k, col["loglik"]] == pytest.approx(fm.scoring.answer_logprob(model, tok, [it])[0], abs=1e-4)
            assert got[k, col["score"]] == got[k, col["loglik"]]
    np.testing.assert_allclose(fm.scoring.score_items(model, tok, items), got[:, 0], atol=1e-5)
    with pytest.raises(ValueError, match="neither 'choices' nor 'answer'"):
        fm.scoring.item_metrics(model, tok, [dict(id="x", prompt="p")])


# ---------------------------------------------------------------- one scoring per (item, mask)
def test_evaluate_methods_shares_item_mask_pairs(model, tok):
    ranks = fm.method.patch_ranks(model, fm.method.collect_input_norms(model, batches(tok)))
    masks = {"a": fm.method.band_mask(ranks, (0, 30)), "b": fm.method.band_mask(ranks, (70, 100))}
    items = _free_items() + _mc_items()
    n = len(items)
    dowp_keys = ["a", "b"] * (n // 2) + ["a"] * (n % 2)
    free_keys = list(dowp_keys)
    free_keys[1], free_keys[2] = "a", "b"                          # two items "misrouted"
    routes = {"BASELINE": (None, None), "DOWP": (dowp_keys, masks), "FREE-MOE": (free_keys, masks)}
    calls = []

    def score_fn(m, its):
        calls.append(len(its))
        return fm.scoring.item_metrics(m, tok, its, batch_size=2)
    got = fm.experiment.evaluate_methods(model, tok, items, routes, score_fn=score_fn, columns=fm.scoring.ITEM_METRICS)
    assert sum(calls) == n + n + 2                                  # dense once, DOWP once, only the misrouted twice
    assert list(got.columns) == ["method", "task", "id", *fm.scoring.ITEM_METRICS] and len(got) == 3 * n
    for method, (keys, ms) in routes.items():                       # naive: every method on its own
        ref = fm.experiment.routed_scores(model, tok, items, keys or [None] * n, ms or {}, batch_size=2,
                               score_fn=lambda m, its: fm.scoring.item_metrics(m, tok, its))
        g = got[got.method == method]
        np.testing.assert_allclose(g[list(fm.scoring.ITEM_METRICS)].to_numpy(), ref, atol=1e-4)
    long = fm.experiment.to_long(got)
    assert set(long.metric) == {"acc", "acc_norm", "p_gold", "p_gold_norm", "loglik"}
    assert (long[long.metric == "loglik"].task == "free").all()     # multiple choice has no raw-likelihood row
    one = fm.experiment.evaluate_methods(model, tok, _free_items(), {"BASELINE": (None, None)})
    assert list(one.columns) == ["method", "task", "id", "score"]
    with pytest.raises(ValueError, match="no mask for routing keys"):
        fm.experiment.evaluate_methods(model, tok, items, {"X": (["c"] * n, masks)})
    with pytest.raises(ValueError, match="routing keys"):
        fm.experiment.evaluate_methods(model, tok, items, {"X": (["a"], masks)})


# ---------------------------------------------------------------- selection: paper grid, Wanda a baseline row, gate
def test_select_with_gate_matches_naive():
    rng = np.random.default_rng(5)
    rows = []
    for c, shift in (("g-mc_0", 0.08), ("g-mc_1", 0.0)):            # one cluster with a real gain, one without
        base = rng.uniform(0.2, 0.6, 40)
        for band, d in (("base", 0.0), ("50-55%", shift), ("95-100%", -0.05), ("0-5%", 0.5)):
            v = base + d + (rng.normal(0, 0.02, 40) if band != "base" else 0)
            rows += [dict(domain="g", group="g-mc", cluster=c, band=band, item=i, score=x) for i, x in enumerate(v)]
    sw = pd.DataFrame(rows)
    bands = [(50.0, 55.0), (95.0, 100.0)]
    sel, table = fm.experiment.select_with_gate(sw, bands)
    t = table.set_index("cluster")
    for c in ("g-mc_0", "g-mc_1"):
        w = sw[sw.cluster == c].pivot_table(index="item", columns="band", values="score")
        best = max(["50-55%", "95-100%"], key=lambda b: w[b].mean())          # never the 0-5% baseline row
        d = (w[best] - w["base"]).to_numpy()
        h = t_dist.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
        assert t.loc[c, "best_band"] == best and t.loc[c, "n_ref"] == 40
        assert t.loc[c, "gain"] == pytest.approx(d.mean()) and t.loc[c, "lo"] == pytest.approx(d.mean() - h)
        assert t.loc[c, "selected"] == (d.mean() - h > 0)
        assert sel[c] == ((50.0, 55.0) if t.loc[c, "selected"] else None)
    assert sel["g-mc_0"] == (50.0, 55.0) and sel["g-mc_1"] is None and t.loc["g-mc_1", "band"] == "base"
    assert fm.experiment.select_with_gate(sw, bands, gate=False)[0]["g-mc_1"] is not None


def test_dowp_select_gate_and_test_sweep(model, tok):
    mc, free = _mc_items(), _free_items()
    ref = {"general-mc_0": mc[:3], "code-gen_0": free[:3]}
    test = {"general-mc_0": mc[3:], "code-gen_0": free[3:]}
    bands = [(50, 55), (95, 100)]
    kw = dict(calib_tokens=256, batch_size=4, ratios=(1.0,))
    with_test = fm.dowp_select(model, tok, ref, bands, test_by_sub=test, **kw)
    alone = fm.dowp_select(model, tok, ref, bands, **kw)
    assert with_test.selected == alone.selected and alone.test_sweep is None      # test items never select
    pd.testing.assert_frame_equal(with_test.sweep, alone.sweep)
    sw = with_test.sweep
    assert set(sw.band) == {"base", "50-55%", "95-100%", "0-5%"}
    assert set(sw[sw.band == "0-5%"].role) == {"baseline"} and set(sw[sw.band == "base"].role) == {"dense"}
    assert set(sw[sw.cluster == "general-mc_0"].kind) == {"mc"} and set(sw.group) == {"general-mc", "code-gen"}
    mcs = sw[sw.cluster == "general-mc_0"]
    np.testing.assert_array_equal(mcs.score, mcs.p_gold)                           # MC selects on p(gold)/Σp
    fr = sw[sw.cluster == "code-gen_0"]
    np.testing.assert_array_equal(fr.score, fr.loglik)
    sel, table = fm.experiment.select_with_gate(sw, bands)
    assert sel == with_test.selected
    pd.testing.assert_frame_equal(table, with_test.selection)
    for c, b in with_test.selected.items():               # gated -> dense; Table 2's ratio masks ablate Algorithm 1
        m = with_test.masks[c]
        assert (m["selected"] is None) == (b is None) and "ratio1" in m
        assert m["best"] is not None and m["0-5%"] is not None
        best = table.set_index("cluster").loc[c, "best_band"]                 # the arg-max band, gate or no gate
        assert m["ratio1"].band == (float(best.split("-")[0]), float(best.split("-")[0]) + 1.0)
    texts = [fm.data.calibration_text(it) for it in ref["code-gen_0"]]
    norms = fm.method.collect_input_norms(model, fm.data.tokenize_batches(tok, texts, 8, 256), max_tokens=256)
    ranks = fm.method.patch_ranks(model, norms)
    ts = with_test.test_sweep
    for band in [*bands, (0, 5)]:                                    # naive: apply the band, score the test items
        with fm.method.apply_mask(model, fm.method.band_mask(ranks, band)):
            naive = fm.scoring.item_metrics(model, tok, test["code-gen_0"])[:, 0]
        got = ts[(ts.cluster == "code-gen_0") & (ts.band == fm.band_label(band))].sort_values("item").score
        np.testing.assert_allclose(got.to_numpy(), naive, atol=1e-4)
    with pytest.raises(ValueError, match="without reference items"):
        fm.dowp_select(model, tok, ref, bands, test_by_sub={"maths-gen_0": free})
    with pytest.raises(ValueError, match="both selectable and a baseline"):
        fm.dowp_select(model, tok, ref, [(0, 5)])
    with pytest.raises(ValueError, match="mixes multiple-choice and generative"):
        fm.dowp_select(model, tok, {"x-mc_0": mc[:2] + free[:2]}, bands)


def test_band_sweep_columns_need_a_score(model, tok):
    ranks = fm.method.patch_ranks(model, fm.method.collect_input_norms(model, batches(tok)))
    items = _free_items()[:2]
    fn = lambda m, its: np.column_stack([fm.scoring.item_metrics(m, tok, its)[:, 1]] * 2)
    sw = fm.experiment.band_sweep(model, {"c": ranks}, {"c": items}, fn, [(0, 5)], columns=("score", "loglik"))
    assert list(sw.columns) == ["cluster", "band", "item", "score", "loglik"] and len(sw) == 4
    with pytest.raises(ValueError, match="'score' column"):
        fm.experiment.band_sweep(model, {"c": ranks}, {"c": items}, fn, [(0, 5)], columns=("a", "b"))
    with pytest.raises(ValueError, match="gave 2 columns"):
        fm.experiment.band_sweep(model, {"c": ranks}, {"c": items}, fn, [(0, 5)], columns=("score",))


def test_eq3_keys_as_domain(model, tok):
    ref = {"code": [dict(prompt=t) for t in TEXTS[:4]], "maths": [dict(prompt=t) for t in TEXTS[4:]]}
    sd = fm.experiment.assign_subdomains(model, tok, ref, {"code": [], "maths": []}, k=2)
    items = [dict(prompt=t, domain="maths") for t in TEXTS]
    keys = fm.experiment.eq3_keys(model, tok, items, sd, as_domain="code")
    F = fm.method.embedding_features(model, tok, TEXTS)
    mu = sd["code"]["kmeans"].cluster_centers_
    naive = [f"code_{c}" for c in np.argmin(((F[:, None] - mu[None]) ** 2).sum(-1), 1)]
    assert list(keys) == naive and items[0]["domain"] == "maths"             # the items themselves are unchanged
    with pytest.raises(ValueError, match="as_domain"):
        fm.experiment.eq3_keys(model, tok, items, sd, as_domain="general")


# ---------------------------------------------------------------- the primary-metric rule
def test_primary_metric(monkeypatch, tmp_path):
    csv = tmp_path / "scorecard.csv"
    monkeypatch.setattr(fm_data.scorecard, "CSV", csv)
    assert fm.data.primary_metric("m", ["moelab_a"])[0] == "acc"                  # no scorecard: the paper's accuracy
    csv.write_text("model,task,status\nm,moelab_a,usable\nm,moelab_nll_code,usable\nm,moelab_b,not usable\n")
    fm_data._usable_tasks.cache_clear()                                    # one scorecard lookup per model
    assert fm.data.primary_metric("m", ["moelab_a"])[0] == "acc"
    assert fm.data.task_usability("m", ["moelab_a", "moelab_b"]) == {"moelab_a": "usable", "moelab_b": "not usable"}
    metric, note = fm.data.primary_metric("m", ["moelab_a", "moelab_b"])
    assert metric == "loglik" and "moelab_b" in note
    assert fm.data.primary_metric("llama", ["moelab_b"])[0] == "acc"               # a paper model: not in the scorecard
    fm_data._usable_tasks.cache_clear()


# ---------------------------------------------------------------- baselines beside the models
def test_baseline_table_matches_naive():
    items = [dict(id="a", task="t1", label=0, choices=[" 01/02/2003", " 01/02/2004", " 01/03/2003"]),
             dict(id="b", task="t1", label=2, choices=[" x", " yy", " zzz"]),
             dict(id="c", task="t1", label=1, choices=[" no", " yes"]),
             dict(id="d", task="t2", label=1, choices=[" cat", " dog"]),
             dict(id="e", task="t2", label=0, choices=[" left", " right"]),
             dict(id="f", task="t2", label=0, choices=[" up", " down"])]
    acc = {"BASELINE": [1, 0, 0, 1, 0, 1], "DOWP": [1, 1, 0, 0, 1, 1]}
    t = fm.report.baseline_table(items, acc, n_folds=2)
    for task, idx in (("t1", [0, 1, 2]), ("t2", [3, 4, 5])):
        r = t[t.task == task].set_index("scorer")
        views = [dict(choices=[c.strip() for c in items[i]["choices"]], gold=items[i]["label"]) for i in idx]
        dowp = np.array([acc["DOWP"][i] for i in idx], float)
        gold = np.array([v["gold"] for v in views])
        pos = [(gold == p).mean() for p in range(3)]
        best = int(np.argmax(pos))
        naive = {"BASELINE": np.array([acc["BASELINE"][i] for i in idx], float), "DOWP": dowp,
                 "chance": np.array([1 / len(v["choices"]) for v in views]),
                 f"position {best} (best here)": (gold == best).astype(float)}
        for h in baselines.HEURISTICS:                       # ties: a uniform pick among the tied options
            hits = []
            for v in views:
                s = baselines.heuristic_scores(v["choices"], h)
                top = np.flatnonzero(np.isclose(s, s.max()))
                hits.append(float(v["gold"] in top) / len(top))
            naive[h] = np.array(hits)
        for name, v in naive.items():
            assert r.loc[name, "acc"] == pytest.approx(100 * v.mean())
            d = 100 * (dowp - v)
            assert r.loc[name, "diff"] == pytest.approx(d.mean())
            h = t_dist.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
            assert r.loc[name, "lo"] == pytest.approx(d.mean() - h) and r.loc[name, "hi"] == pytest.approx(d.mean() + h)
        assert r.loc["cv_logreg", "kind"] == "question-blind" and r.loc["DOWP", "kind"] == "model"
        assert (r.n == 3).all()
    with pytest.raises(ValueError, match="compare"):
        fm.report.baseline_table(items, acc, compare="FREE-MOE")
    with pytest.raises(ValueError, match="has 2 scores"):
        fm.report.baseline_table(items, {"DOWP": [1, 0]})
    with pytest.raises(ValueError, match="no choices"):
        fm.report.baseline_table([dict(id="x", task="t", prompt="p", answer="a")], {"DOWP": [1]})


# ---------------------------------------------------------------- what one domain's masks do to the others
def _keep_scores():
    rng = np.random.default_rng(11)
    rows = []
    for md in ("maths", "code"):
        for dom, task, n in (("general", "moelab_bb_x", 7), ("maths", "moelab_nll_maths", 6),
                             ("code", "moelab_nll_code", 5)):
            for i in range(n):
                base = -1.5 + rng.normal(0, 0.3)
                for method, v in (("BASELINE", base), ("purified", base + rng.normal(-0.1, 0.1))):
                    rows.append(dict(mask_domain=md, domain=dom, task=task, id=i, metric="loglik", method=method,
                                     score=v))
    return pd.DataFrame(rows)


def test_cross_domain_summary_matches_naive():
    sc = _keep_scores()
    out = fm.cross_domain_summary(sc)
    for md in ("maths", "code"):
        o = out[out.mask_domain == md]
        off = o[o.level == "off-domain"]
        assert len(off) == 1 and not off.target.iloc[0]
        sub = sc[(sc.mask_domain == md) & (sc.domain != md)]
        w = sub.pivot_table(index=["domain", "id"], columns="method", values="score")
        d = (w.purified - w.BASELINE).to_numpy()
        h = t_dist.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
        r = off.iloc[0]
        assert r.n == len(d) == {"maths": 12, "code": 13}[md] and r["diff"] == pytest.approx(d.mean())
        assert r.lo == pytest.approx(d.mean() - h) and r.hi == pytest.approx(d.mean() + h)
        own = o[(o.level == "domain") & (o.domain == md)]
        assert len(own) == 1 and bool(own.target.iloc[0])
        assert set(o[o.level == "domain"].domain) == {"general", "maths", "code"}
    with pytest.raises(ValueError, match="mask_domain"):
        fm.cross_domain_summary(sc.drop(columns="mask_domain"))


def test_domain_summary_long_table_keeps_metrics_apart():
    rng = np.random.default_rng(2)
    rows = []
    for i in range(9):                                    # one multiple-choice task: an acc and a loglik row per item
        for m in ("BASELINE", "DOWP"):
            rows.append(dict(method=m, domain="general", task="moelab_bb_x", id=i, metric="acc",
                             score=float(rng.integers(0, 2))))
            rows.append(dict(method=m, domain="general", task="moelab_bb_x", id=i, metric="loglik",
                             score=-2 + rng.normal(0, 0.2)))
    sc = pd.DataFrame(rows)
    out = fm.report.domain_summary(sc)
    dom = out[out.level == "domain"].set_index("metric")
    assert sorted(dom.index) == ["acc", "loglik"] and (dom.n == 9).all()
    for met, k in (("acc", 100.0), ("loglik", 1.0)):
        w = sc[sc.metric == met].pivot_table(index="id", columns="method", values="score")
        assert dom.loc[met, "diff"] == pytest.approx(k * (w.DOWP - w.BASELINE).mean())


@pytest.mark.cuda
def test_item_metrics_and_shared_scoring_on_cuda(tok):
    m_cpu = tiny_llama(seed=4)
    m_gpu = tiny_llama(seed=4).cuda()
    items = _mc_items() + _free_items()
    np.testing.assert_allclose(fm.scoring.item_metrics(m_gpu, tok, items), fm.scoring.item_metrics(m_cpu, tok, items), atol=1e-3)
    ranks = fm.method.patch_ranks(m_cpu, fm.method.collect_input_norms(m_cpu, batches(tok)))
    masks = {"a": fm.method.band_mask(ranks, (0, 30))}
    routes = {"BASELINE": (None, None), "DOWP": (["a"] * len(items), masks)}
    fn = lambda m, its: fm.scoring.item_metrics(m, tok, its)
    g = fm.experiment.evaluate_methods(m_gpu, tok, items, routes, score_fn=fn, columns=fm.scoring.ITEM_METRICS)
    c = fm.experiment.evaluate_methods(m_cpu, tok, items, routes, score_fn=fn, columns=fm.scoring.ITEM_METRICS)
    np.testing.assert_allclose(g[list(fm.scoring.ITEM_METRICS)].to_numpy(), c[list(fm.scoring.ITEM_METRICS)].to_numpy(), atol=1e-3)
    assert torch.equal(m_gpu.model.layers[0].mlp.up_proj.weight.cpu(), m_cpu.model.layers[0].mlp.up_proj.weight)


def test_table1_scores_by_the_papers_rule_and_by_the_gate(model, tok):
    """Table 1 two ways (issue 47 item 3): ``which="best"`` purifies every cluster's arg-max reference band (the
    paper's Algorithm 1, no fallback), ``which="selected"`` keeps the dense model where the gate failed; ``methods``
    picks the scored methods (the Algorithm 1 table reuses the main table's BASELINE)."""
    mc, free = _mc_items(), _free_items()
    ref = {"general-mc_0": mc[:3], "code-gen_0": free[:3]}
    dw = fm.dowp_select(model, tok, ref, [(50, 55), (95, 100)], calib_tokens=256, batch_size=4)
    # force a gated cluster: the tiny random model's gate decides by chance, so set it here
    dw.selected["code-gen_0"], dw.masks["code-gen_0"]["selected"] = None, None
    items = [dict(it, domain="general") for it in mc[3:]] + [dict(it, domain="code") for it in free[3:]]
    keys = ["general-mc_0"] * len(mc[3:]) + ["code-gen_0"] * len(free[3:])
    routing = pd.DataFrame(dict(eq3_sub=keys, pred_sub=keys[::-1]))
    gated = fm.experiment.table1_scores(model, tok, items, [], routing, dw, batch_size=4)
    alg1 = fm.experiment.table1_scores(model, tok, items, [], routing, dw, batch_size=4, which="best",
                                       methods=("DOWP", "FREE-MOE"))
    assert set(gated.method) == {"BASELINE", "DOWP", "FREE-MOE"} and set(alg1.method) == {"DOWP", "FREE-MOE"}
    key = ["method", "task", "id", "metric"]
    g, a = gated.set_index(key).score, alg1.set_index(key).score
    code = [("DOWP", "free", it["id"], "loglik") for it in free[3:]]
    base = [("BASELINE", "free", it["id"], "loglik") for it in free[3:]]
    np.testing.assert_allclose(g.loc[code].to_numpy(), g.loc[base].to_numpy())     # gated: dense
    with fm.method.apply_mask(model, dw.masks["code-gen_0"]["best"]):               # Algorithm 1: the arg-max band
        naive = fm.scoring.item_metrics(model, tok, free[3:])[:, list(fm.scoring.ITEM_METRICS).index("loglik")]
    np.testing.assert_allclose(a.loc[code].to_numpy(), naive, atol=1e-4)
    assert not np.allclose(a.loc[code].to_numpy(), g.loc[base].to_numpy())
    with pytest.raises(ValueError, match="which must be"):
        fm.experiment.table1_scores(model, tok, items, [], routing, dw, which="gated")
    with pytest.raises(ValueError, match="methods must be"):
        fm.experiment.table1_scores(model, tok, items, [], routing, dw, methods=("DENSE",))
