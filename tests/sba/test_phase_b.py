"""Tests for notebook 02's phase-B pieces (SBA paper §III, §V-C, §VI-B): benchmark scoring by
MTEB's protocol against the suite's scorer and naive loops, the short-pair filter, router movement against a naive
loop, phases (a)+(b) as one run, the drop ablation at init, the paper profile's measurement of nomic, and the report
tables (regime check, separation, stage summaries). Models are tiny random BERTs / a tiny random nomic checkpoint."""
from __future__ import annotations

import copy
import warnings

import matplotlib
import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.cluster import MiniBatchKMeans
from sklearn.metrics import v_measure_score

from moelab.sba.data import MTEB_CLUSTERING_BATCH, MTEB_TASKS, STANDIN_COLUMNS, cached_encoder, evaluate_benchmarks, short_pairs, v_measure_mteb
from moelab.sba.experiment import drop_ablation_init, nomic_measure, phase_b_run, swap_aggregation
from moelab.sba.geometry import collect_geometry, router_movement, st_forward_fn
from moelab.sba.report import ablation_table, phase_b_table, plot_fig5, pretrained_phase_b_table, regime_check, scores_wide, separation_table, specialisation_summary, specialisation_table, stage_summaries
from moelab.sba.standin import build_nomic_layout_moe, st_encode_fn
from moelab.core.layer import moe_layers
from moelab.suite import embed as suite_embed

from helpers.nomic import write_checkpoint
from helpers.sba import TEXTS, pairs

matplotlib.use("Agg")
warnings.filterwarnings("ignore", message=".*rank-deficient.*")


# ----------------------------------------------------------------------------------------------------------------------
# data: short pairs, MTEB clustering, the encode cache, the benchmark scorer
# ----------------------------------------------------------------------------------------------------------------------
def test_short_pairs_keeps_pairs_within_the_budget_in_order():
    tok = str.split  # one "token" per word
    pp = [("a b", "c"), ("a b c d", "e"), ("x", "y z w v"), ("q", "r"), ("a", "b", "c d e f")]
    assert short_pairs(pp, tok, 3) == [("a b", "c"), ("q", "r")]
    assert short_pairs(pp, tok, 4) == [("a b", "c"), ("a b c d", "e"), ("x", "y z w v"), ("q", "r"),
                                           ("a", "b", "c d e f")]
    with pytest.raises(ValueError, match="raise max_tokens"):
        short_pairs(pp, lambda t: [0] * 10, 5)
    with pytest.raises(ValueError, match="max_tokens=1"):
        short_pairs(pp, tok, 1)


def test_v_measure_mteb_uses_batch_500():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 8)) * 10
    labels = np.repeat(["a", "b", "c"], 40)
    emb = centres[np.repeat(np.arange(3), 40)] + rng.normal(size=(120, 8)) * 0.1
    assert v_measure_mteb(emb, labels) == pytest.approx(1.0)  # well-separated blobs: perfect clustering
    noisy = rng.normal(size=(120, 8))
    ref = MiniBatchKMeans(n_clusters=3, batch_size=500, n_init="auto", random_state=4).fit_predict(noisy)
    assert MTEB_CLUSTERING_BATCH == 500
    assert v_measure_mteb(noisy, labels, seed=4) == pytest.approx(v_measure_score(labels, ref))
    with pytest.raises(ValueError, match="labels"):
        v_measure_mteb(noisy[:10], labels)


def test_cached_encoder_encodes_each_distinct_text_once():
    calls = []

    def enc(texts):
        calls.append(list(texts))
        return np.array([[len(t), t.count("a")] for t in texts], dtype=float)

    c = cached_encoder(enc)
    out = c(["aa", "b", "aa", "cab"])
    np.testing.assert_array_equal(out, enc(["aa", "b", "aa", "cab"]))
    calls.clear()
    out2 = c(["cab", "dd", "aa"])
    assert calls == [["dd"]]  # only the unseen text
    np.testing.assert_array_equal(out2, [[3, 1], [2, 0], [2, 2]])
    with pytest.raises(ValueError, match="expected"):
        cached_encoder(lambda t: np.zeros(3))(["x"])


def _toy_benchmarks():
    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(60)]
    a = [" ".join(rng.choice(words, 4)) for _ in range(40)]
    b = [" ".join(rng.choice(words, 4)) for _ in range(40)]
    sts = suite_embed.Benchmark("toy_sts", "sts", a, b, rng.uniform(0, 1, 40))
    pc = suite_embed.Benchmark("toy_pairs", "pairclass", a + a[:10], b + b[:10], np.r_[rng.integers(0, 2, 40),
                                                                                         np.ones(10, int)])
    ret = suite_embed.Benchmark("toy_retrieval", "retrieval", a[:20], b[:20])
    subsets = [([f"{c} {w}" for c in "xyz" for w in words[j:j + 10]], [c for c in "xyz" for _ in range(10)])
               for j in (0, 20)]
    clus = suite_embed.Benchmark("toy_clustering", "clustering", subsets=subsets)
    return {x.name: x for x in (sts, pc, clus, ret)}


def test_evaluate_benchmarks_matches_the_suite_and_naive_loops():
    benches = _toy_benchmarks()
    enc = suite_embed.random_encoder(dim=16, seed=3)
    got = evaluate_benchmarks(enc, benches, seed=0, n_boot=200)
    assert list(dict.fromkeys(got.benchmark)) == list(benches)  # in the order given
    ref = suite_embed.evaluate(enc, {k: v for k, v in benches.items() if v.kind != "clustering"}, n_boot=200, seed=0)
    m = got.set_index(["benchmark", "metric"])
    for r in ref.itertuples():
        assert m.loc[(r.benchmark, r.metric), "score"] == pytest.approx(r.score, abs=1e-12)
        assert m.loc[(r.benchmark, r.metric), "n"] == r.n
    # the STS interval: resampling the pairs' cosines = resampling their embeddings (naive loop, same draws)
    sts = benches["toy_sts"]
    ea, eb = enc(sts.texts_a), enc(sts.texts_b)
    rng = np.random.default_rng(0)
    boots = [suite_embed.sts_spearman(ea[i], eb[i], sts.gold[i]) for i in rng.integers(0, 40, size=(200, 40))]
    lo, hi = np.quantile(boots, [0.025, 0.975])
    assert (m.loc[("toy_sts", "cosine_spearman"), "ci_low"], m.loc[("toy_sts", "cosine_spearman"), "ci_high"]) == \
        pytest.approx((lo, hi))
    # clustering: the mean over subsets of MTEB's V-measure (batch 500)
    clus = benches["toy_clustering"]
    want = np.mean([v_measure_mteb(enc(t), lab, 0) for t, lab in clus.subsets])
    assert m.loc[("toy_clustering", "v_measure"), "score"] == pytest.approx(want)
    assert m.loc[("toy_clustering", "v_measure"), "n"] == 2
    assert set(got.column.dropna()) == set() and got.column.isna().all()  # toy names map to no paper column
    with pytest.raises(ValueError, match="no benchmarks"):
        evaluate_benchmarks(enc, {})
    bad = suite_embed.Benchmark("odd", "ranking", ["a"], ["b"])
    with pytest.raises(ValueError, match="unknown benchmark kind"):
        evaluate_benchmarks(enc, {"odd": bad})


def test_standin_columns_map_each_benchmark_to_one_paper_column():
    assert STANDIN_COLUMNS["wordnet_sts"] == "STSBenchmark"
    assert STANDIN_COLUMNS["wordnet_pairs"] == "SprintDuplicateQuestions"
    assert {STANDIN_COLUMNS[k] for k in ("wordnet_clustering", "bigbench_clustering")} == {
        "StackExchangeClustering"}
    assert STANDIN_COLUMNS["code_retrieval"] is None and STANDIN_COLUMNS["wordnet_retrieval"] is None
    assert set(STANDIN_COLUMNS.values()) - {None} == set(MTEB_TASKS)


# ----------------------------------------------------------------------------------------------------------------------
# models: router movement, phases (a)+(b), the drop ablation, nomic in the paper profile
# ----------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def moe(tiny):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_nomic_layout_moe(tiny, init="cluster", calib_texts=TEXTS, seed=0, compensate=True)


def _naive_routes(model, texts):
    """Per MoE layer: the top-2 experts (rank order) of the real tokens, from the router logits seen by a hook."""
    seen = {i: [] for i in range(len(moe_layers(model)))}
    hooks = [layer.register_forward_hook(lambda m, a, o, i=i: seen[i].append(m.last_router_logits.detach()))
             for i, layer in enumerate(moe_layers(model))]
    masks = []
    with torch.no_grad():
        for i in range(0, len(texts), 32):
            f = model.tokenize(texts[i:i + 32])
            model(dict(f))
            masks.append(f["attention_mask"].reshape(-1).bool())
    for h in hooks:
        h.remove()
    mask = torch.cat(masks)
    out = []
    for i in seen:
        z = torch.cat(seen[i])[mask]
        out.append([sorted(range(z.shape[1]), key=lambda e: -float(z[t, e]))[:2] for t in range(len(z))])
    return out


def test_router_movement_matches_naive_loop(moe):
    moved = copy.deepcopy(moe)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for layer in moe_layers(moved):
            w = layer.router.weight
            w.add_(torch.randn(w.shape, generator=g) * w.norm() / w.numel() ** 0.5)
    got = router_movement(moe, moved, TEXTS).set_index("layer")
    ra, rb = _naive_routes(moe, TEXTS), _naive_routes(moved, TEXTS)
    for i, (a, b) in enumerate(zip(ra, rb)):
        assert got.loc[i, "n_tokens"] == len(a)
        assert got.loc[i, "top1_agreement"] == pytest.approx(np.mean([x[0] == y[0] for x, y in zip(a, b)]))
        assert got.loc[i, "topk_set_agreement"] == pytest.approx(np.mean([set(x) == set(y) for x, y in zip(a, b)]))
        wa, wb = (moe_layers(x)[i].router.weight.detach().double() for x in (moe, moved))
        assert got.loc[i, "router_weight_change"] == pytest.approx(float(((wb - wa) ** 2).sum().sqrt() / wa.norm()))
    assert got.loc[0, "top1_agreement"] < 1  # the perturbation moved some tokens
    assert got.loc["mean", "top1_agreement"] == pytest.approx(got.drop("mean").top1_agreement.mean())
    same = router_movement(moe, copy.deepcopy(moe), TEXTS).set_index("layer")
    assert (same.top1_agreement == 1).all() and (same.router_weight_change == 0).all()
    with pytest.raises(ValueError, match="MoE layers"):
        router_movement(moe, moe[0].auto_model.embeddings, TEXTS)


def _toy_evaluate(encode):
    e = encode(TEXTS[:6])
    return pd.DataFrame([dict(benchmark="toy", metric="mean_cos", score=float((e[0] * e[1:]).sum(1).mean()))])


def test_phase_b_run_measures_init_and_checkpoint(tiny):
    calls = []

    def evaluate(encode):
        calls.append(1)
        return _toy_evaluate(encode)

    base_scores = _toy_evaluate(st_encode_fn(tiny))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = phase_b_run(tiny, calib_texts=TEXTS, heldout_texts=TEXTS[:8], train_pairs=pairs(24),
                            val_pairs=pairs(8), subjects={"a": TEXTS[:4], "b": TEXTS[4:8]}, evaluate=evaluate,
                            base_scores=base_scores, max_tokens=50, seed=0, max_steps=40, eval_every=2, window=1,
                            min_rel_improvement=0.99, batch_size=4, lr=1e-3, val_batches=2, keep="best",
                            device="cpu")
    assert len(calls) == 3  # raw and compensated init, the checkpoint; the dense model's scores were given
    assert list(r["damage_scores"].model) == ["dense", "cluster (nomic layout)", "cluster (nomic layout, compensated)"]
    assert r["damage_scores"].score.iloc[0] == base_scores.score.iloc[0]
    assert r["stopped"] and r["steps"] == 4  # the rule fires at the 2nd evaluation, as in test_sba_phases
    assert r["checkpoint_step"] == int(r["val"].loc[r["val"].val_mnrl.idxmin(), "step"])  # keep="best"
    assert {"geo", "counts", "similarity"} <= set(r["init"]) and r["init"]["eval"] is None
    assert r["after"]["eval"] is not None and len(r["after"]["geo"]) > 0
    assert list(r["movement"].layer) == [0, 1, "mean"] and (r["movement"].router_weight_change.iloc[:2] > 0).all()
    t = phase_b_table(r)
    assert t.steps.iloc[0] == 4 and bool(t.stopped.iloc[0])
    # the measured model is the (best) checkpoint: loading it onto a template gives the same geometry
    template = build_nomic_layout_moe(tiny, init="sparse", seed=0)
    m = swap_aggregation(template, r["checkpoint"], "linear")
    geo, _ = collect_geometry(m, st_forward_fn(m), {"a": TEXTS[:4], "b": TEXTS[4:8]}, 50)
    np.testing.assert_allclose(geo.angle_deg, r["after"]["geo"].angle_deg, rtol=1e-4, atol=1e-3)


def test_drop_ablation_init_scores_each_aggregation_on_one_model(tiny):
    out = drop_ablation_init(aggregations=["linear", "sba_unit"], seed=0, evaluate=_toy_evaluate,
                                 subjects={"a": TEXTS[:4]}, max_tokens=50, base=tiny)
    assert list(out) == ["linear", "sba_unit"]
    lin, unit = out["linear"], out["sba_unit"]
    assert lin["eval"].score.iloc[0] != unit["eval"].score.iloc[0]
    pd.testing.assert_frame_equal(lin["similarity"], unit["similarity"])  # one model, only the operator differs
    assert (lin["similarity"].expert_similarity < 0.99).all()  # half of every expert re-drawn
    tab = ablation_table(out, {})
    assert list(tab.stage) == ["init", "init"] and "toy" in tab.columns
    assert tab.toy.tolist() == pytest.approx([100 * lin["eval"].score.iloc[0], 100 * unit["eval"].score.iloc[0]])
    with pytest.raises(ValueError, match="at least one aggregation"):
        drop_ablation_init(aggregations=[], base=tiny)


def test_nomic_measure_on_a_tiny_checkpoint(tmp_path):
    ckpt = write_checkpoint(tmp_path / "nomic")  # the tiny upstream-format checkpoint of the loader's tests
    sts = pd.DataFrame(dict(sentence1=["the cat", "a dog", "rain falls", "tea is hot"],
                            sentence2=["a cat", "the dog", "sun shines", "tea is cold"], score=[4.5, 4.0, 1.0, 2.5]))
    lin = nomic_measure(ckpt, subjects={"a": ["the cat sat", "a dog ran"], "b": ["rain", "tea time"]},
                            max_tokens=50, mteb_tasks={"STSBenchmark": sts})
    sb = nomic_measure(ckpt, aggregation="sba", subjects={"a": ["the cat sat", "a dog ran"]}, max_tokens=50)
    assert list(lin["eval"].benchmark) == ["STSBenchmark"] and np.isfinite(lin["eval"].score).all()
    assert len(lin["items"]) == len(sts)  # jackknife pseudo-values, one per pair
    assert sb["eval"] is None and sb["items"] is None and len(lin["geo"]) > 0 and {"radius_ratio_sba"} <= set(sb["geo"].columns)
    np.testing.assert_allclose(lin["geo"][lin["geo"].domain == "a"].angle_deg.iloc[:2],
                               sb["geo"].angle_deg.iloc[:2], rtol=1e-4)  # first MoE layer: same inputs and routes


# ----------------------------------------------------------------------------------------------------------------------
# report tables
# ----------------------------------------------------------------------------------------------------------------------
def _geo(share_above, n=40, seed=0):
    """A geometry table with ``share_above`` of the angles above 40 degrees (two layers, two subjects)."""
    rng = np.random.default_rng(seed)
    k = int(round(share_above * n))
    ang = np.r_[rng.uniform(41, 90, k), rng.uniform(5, 39, n - k)]
    return pd.DataFrame(dict(domain=np.tile(["s1", "s2"], n // 2), layer=np.repeat(["L1", "L3"], n // 2),
                             norm_ratio=np.exp(rng.normal(0, 0.1, n)), angle_deg=ang, weight_sum=0.8,
                             f_weight_sum=0.8, f_angular=0.9, f_radius_mix=1.0, ratio_linear=0.72, ratio_sba=0.8,
                             radius_ratio_linear=0.9, radius_ratio_sba=1.0))


def test_stage_summaries_and_regime_check():
    geos = {"init": _geo(0.3), "phase b": _geo(0.7)}
    s = stage_summaries(geos)
    assert list(dict.fromkeys(s.stage)) == ["init", "phase b"] and (s.layer == "pooled").sum() == 2
    by_subject = stage_summaries(geos, by=("domain",))
    assert set(by_subject.domain) == {"s1", "s2", "pooled"}
    pooled = s[s.layer == "pooled"].set_index("stage")
    assert pooled.loc["phase b", "share_angle_above_40deg"] == pytest.approx(0.7)

    def pb(stopped, steps=50):
        return pd.DataFrame([dict(steps=steps, stopped=stopped, improvement=0.004 if stopped else 0.03)])

    ok = regime_check(pb(True), s)
    assert ok["reached"] and ok["reasons"] == [] and ok["share_angle_above"] == pytest.approx(0.7)
    budget = regime_check(pb(False, 120), s)
    assert not budget["reached"] and "step budget (120 steps)" in budget["reasons"][0] and budget["angles"]
    narrow = regime_check(pb(True), stage_summaries({"init": _geo(0.7), "phase b": _geo(0.3)}))
    assert not narrow["reached"] and "30.0% of the active expert pairs" in narrow["reasons"][0]
    assert regime_check(pretrained_phase_b_table("nomic"), stage_summaries({"phase b": _geo(0.6)}))[
        "reached"]
    with pytest.raises(ValueError, match="one-row"):
        regime_check(pd.concat([pb(True), pb(True)]), s)
    with pytest.raises(ValueError, match="stages found"):
        regime_check(pb(True), s, stage="phase c")


def test_separation_table_matches_naive_rule():
    rows = []
    for enc, base in (("mini", 0.6), ("bag-of-words (tf-idf)", 0.4), ("random", 0.0)):
        for bench, shift in (("sts", 0.0), ("pairs", -0.18)):
            sc = base + (shift if enc == "mini" else 0)
            rows.append(dict(encoder=enc, benchmark=bench, metric="m", score=sc, ci_low=sc - 0.05, ci_high=sc + 0.05))
    t = separation_table(pd.DataFrame(rows), "mini").set_index(["encoder", "benchmark"])
    # naive: the model's ci_low above the largest baseline ci_high
    assert bool(t.loc[("mini", "sts"), "above_baselines"]) is (0.55 > 0.45)
    assert bool(t.loc[("mini", "pairs"), "above_baselines"]) is (0.37 > 0.45)
    assert not t.loc[("random", "sts"), "above_baselines"]
    assert t.loc[("mini", "sts"), "baseline_ci_high"] == pytest.approx(0.45)
    with pytest.raises(ValueError, match="lack the encoder"):
        separation_table(pd.DataFrame(rows), "other")


def test_scores_wide_specialisation_summary_and_plot_fig5():
    sc = pd.DataFrame([dict(model=m, benchmark=b, metric="s", score=v)
                       for m, b, v in (("x", "sts", 0.5), ("x", "pairs", 0.7), ("y", "sts", 0.25))])
    w = scores_wide(sc).set_index("model")
    assert w.loc["x", "sts"] == pytest.approx(50) and w.loc["x", "pairs"] == pytest.approx(70)
    assert np.isnan(w.loc["y", "pairs"])
    counts = pd.DataFrame([dict(domain=d, layer="L1", expert=e, count=c) for d, cs in (("a", [5, 0]), ("b", [0, 5]))
                           for e, c in enumerate(cs)])
    meas = {"m": dict(counts=counts, similarity=pd.DataFrame(dict(layer=[0], expert_similarity=[0.3])))}
    s = specialisation_summary(meas).iloc[0]
    assert s.routing_jsd_bits == pytest.approx(1.0) and s.expert_similarity == pytest.approx(0.3)
    old = specialisation_table(meas, {}).iloc[0]
    assert old.routing_jsd_bits == s.routing_jsd_bits
    geo = pd.concat([_geo(0.5).assign(model=k, stage=k) for k in ("init", "phase b")])
    fig = plot_fig5(geo, reference="sum_w_r", operators=("linear", "sba"))
    assert len(fig.axes[0].patches) == 4  # two operators for each of the two models
    with pytest.raises(ValueError, match="reference="):
        plot_fig5(geo, reference="mean")


@pytest.mark.cuda
def test_phase_b_run_on_cuda(tiny_standin):
    """The CUDA path: phase (b) trains on the GPU, the start stays on the CPU for the router movement, the checkpoint
    comes back on the CPU, and the benchmark scorer reads embeddings from the GPU model. The tiny BERT has a stand-in
    tokenizer (conftest ``tiny_standin``): this checks device behaviour and needs no asset cache."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = phase_b_run(tiny_standin, calib_texts=TEXTS, heldout_texts=TEXTS[:8], train_pairs=pairs(24),
                            val_pairs=pairs(8), subjects={"a": TEXTS[:4], "b": TEXTS[4:8]}, evaluate=_toy_evaluate,
                            max_tokens=50, seed=0, max_steps=8, eval_every=2, window=1, min_rel_improvement=0.99,
                            batch_size=4, lr=1e-3, val_batches=2, device="cuda")
    assert all(v.device.type == "cpu" for v in r["checkpoint"].values())
    assert np.isfinite(r["after"]["geo"].radius_ratio_linear).all() and r["after"]["eval"] is not None
    assert (r["movement"].top1_agreement.between(0, 1)).all()
