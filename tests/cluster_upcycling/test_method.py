"""Tests for moelab.cluster_upcycling (poster 002; notebook 03)."""
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

from moelab import cluster_upcycling as cu

from helpers.cluster_upcycling import tiny_pairs_and_bench
from helpers.core import blobs, tiny_bert_ffn   # blobs: the same synthetic clusters as the core initialiser tests


# ---------------------------------------------------------------- Steps 1-3 and panel 2 moved to the core
def test_moved_names_are_reexported():
    """Spherical k-means, the whitened truncation, ClusterAwareInit and expert_similarity now live in moelab.core
    (tests in tests/core/test_cluster_init.py); the old names still import from cu.method / cu.analysis, the same objects."""
    from moelab.core import cluster_init, similarity
    for name in ("spherical_kmeans", "KMeansResult", "whitening_factor", "effective_rank", "data_aware_truncate",
                 "TruncResult", "cluster_aware_expert_weights", "ClusterAwareInit", "GATED_ACTS"):
        assert getattr(cu.method, name) is getattr(cluster_init, name), name
    assert cu.analysis.expert_similarity is similarity.expert_similarity


# ---------------------------------------------------------------- analyses
def test_routing_entropy_and_utilisation():
    assert cu.analysis.routing_entropy(torch.zeros(5, 8)) == pytest.approx(1.0)
    logits = torch.tensor([[100.0, 0, 0, 0]])
    assert cu.analysis.routing_entropy(logits) == pytest.approx(0.0, abs=1e-6)
    p = torch.softmax(torch.tensor([[1.0, 2.0, 0.5]]), -1)
    assert cu.analysis.routing_entropy(torch.tensor([[1.0, 2.0, 0.5]]), normalise=False) == pytest.approx(
        float(-(p * p.log()).sum()), rel=1e-6)
    u = cu.analysis.expert_utilisation(torch.tensor([[0, 1], [0, 2]]), 4)
    assert np.allclose(u, [0.5, 0.25, 0.25, 0.0])


def test_relative_compactness():
    x, y, _ = blobs(noise=0.01)
    rc_true = cu.analysis.relative_compactness(x, y, 4)
    rc_rand = cu.analysis.relative_compactness(x, y[torch.randperm(len(y), generator=torch.Generator().manual_seed(0))], 4)
    assert rc_true < 0.05 and 0.9 < rc_rand < 1.05
    # loop reference
    xn = x / x.norm(dim=1, keepdim=True)
    within = sum(((xn[y == i] - xn[y == i].mean(0)) ** 2).sum() for i in range(4))
    assert rc_true == pytest.approx(float(within / ((xn - xn.mean(0)) ** 2).sum()), rel=1e-5)


# ---------------------------------------------------------------- EESD
def _moe(seed=0, E=4):
    from moelab.core.layer import MoELayer
    ffn = tiny_bert_ffn(seed=seed)
    return MoELayer.from_dense(ffn, E, 2, init="drop")


def test_eesd_loss_matches_loop_reference_and_stops_gradient():
    torch.manual_seed(0)
    layer = _moe()
    eesd = cu.method.EESD(None, decay=0.9, weight=0.5, layers=[layer])
    teacher = eesd.teachers[0]
    with torch.no_grad():  # make teacher differ from student
        for p in teacher.parameters():
            p.add_(0.01 * torch.randn_like(p))
    x = torch.randn(3, 5, 16)
    y = layer(x)
    loss = eesd.loss()
    # naive loop: per token, teacher = sum_i softmax(W_r^ema x)_i E_i^ema(x); student = layer output
    ref = 0.0
    x2, y2 = x.reshape(-1, 16), y.reshape(-1, 16)
    for t in range(x2.shape[0]):
        p = torch.softmax(x2[t] @ teacher.router.weight.T, -1)
        ens = sum(p[i] * teacher.experts.forward_expert(i, x2[t:t + 1])[0] for i in range(4))
        ref = ref + ((ens.detach() - y2[t]) ** 2).sum()
    ref = 0.5 * ref / x2.shape[0]
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
    loss.backward()
    assert layer.router.weight.grad is not None and layer.experts.w_in.grad is not None
    assert all(p.grad is None for p in teacher.parameters())


def test_eesd_ema_update_and_errors():
    layer = _moe()
    eesd = cu.method.EESD(None, decay=0.9, layers=[layer])
    before = eesd.teachers[0].experts.w_in.detach().clone()
    with torch.no_grad():
        layer.experts.w_in.add_(1.0)
    eesd.update()
    assert torch.allclose(eesd.teachers[0].experts.w_in, 0.9 * before + 0.1 * (before + 1.0), atol=1e-6)
    with pytest.raises(ValueError, match="before a forward"):
        eesd.loss()
    with pytest.raises(ValueError, match="decay"):
        cu.method.EESD(None, decay=1.0, layers=[layer])
    eesd.remove()


# ---------------------------------------------------------------- text pipeline on a tiny BERT sentence encoder
def test_infonce_equals_mnrl():
    from sentence_transformers.util import cos_sim
    emb = torch.randn(8, 5)
    ref = torch.nn.functional.cross_entropy(20 * cos_sim(emb[:4], emb[4:]), torch.arange(4))
    assert float(cu.experiment.infonce_loss(emb, 4)) == pytest.approx(float(ref), rel=1e-6)


def test_run_text_condition_tiny(tiny_st):
    words = "cat dog river music bank money tree house car road rain sun".split()
    g = np.random.default_rng(0)
    sent = lambda: " ".join(g.choice(words, 6))
    pairs = [(s, s + " " + words[i % 12]) for i, s in enumerate(sent() for _ in range(48))]
    texts = [t for ab in pairs[:32] for t in ab]
    calib = cu.data.calibration_inputs(tiny_st, texts, max_tokens=400, max_len=16)
    assert list(calib) == [1] and calib[1].shape == (400, 32)
    special = cu.data.calibration_special_mask(tiny_st, texts, max_tokens=400, max_len=16)
    assert special.shape == (400,) and 0 < int(special.sum()) < 400
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in ("dense", "dense_long", "sparse", "cluster_eesd"):
            out[m] = cu.experiment.run_text_condition(tiny_st, m, 0, pairs[:32], pairs[32:], [a for a, _ in pairs[32:]], calib,
                                           steps=2, batch_size=8, max_len=16, num_experts=4, special_mask=special)
    res = list(out.values())
    assert out["cluster_eesd"]["history"]["eesd"].notna().all()
    assert out["dense"]["history"] is None and out["dense"]["analysis"] == {}
    r1 = cu.r1_table(res)
    assert len(r1) == 4 and r1["r1_avg"].between(0, 100).all()
    assert cu.report.per_item_r1(res, "sparse").shape == (1, 16)
    ana = cu.report.analysis_table(res)
    assert set(ana["method"]) == {"sparse", "cluster_eesd"} and ana["utilisation_balance"].between(0, 1).all()
    # sparse upcycling: identical experts at init; cluster-aware: more confident routing at init
    init = ana[ana["when"] == "init"].set_index("method")
    assert init.loc["sparse", "expert_similarity"] == pytest.approx(1.0, abs=1e-9)
    assert init.loc["cluster_eesd", "routing_entropy"] < init.loc["sparse", "routing_entropy"]
    assert len(cu.report.entropy_history(res)) == 4 and len(cu.init_table(res)) == 4
    # special tokens excluded by default: the clusters hold only ordinary calibration tokens
    it = cu.init_table(res)
    assert (it["special_tokens"] == "exclude").all() and (it["special_in_cluster"] == 0).all()
    assert it["cluster_size"].sum() == 400 - int(special.sum())
    assert it["special_routed"].sum() == int(special.sum())
    # held-out analyses for every MoE method: router agreement is 1 at init by definition, sparse experts identical
    assert (init["router_agreement"] == 1.0).all()
    assert init.loc["sparse", "expert_output_similarity"] == pytest.approx(1.0, abs=1e-9)
    assert ana[ana["when"] == "final"]["router_agreement"].between(0, 1).all()
    mv = cu.report.router_movement_table(res)
    assert set(mv["method"]) == {"sparse", "cluster_eesd"} and np.allclose(mv["top1_moved"], 1 - mv["top1_agreement"])
    traj = cu.report.heldout_entropy_table(res)
    assert sorted(set(traj["step"])) == cu.experiment.trajectory_steps(2) == [0, 1, 2]
    assert set(traj["method"]) == {"sparse", "cluster_eesd"} and traj["routing_entropy"].between(0, 1).all()
    # the trajectory's step 0 and last step are the analyses' init and final entropies (same held-out tokens)
    for m in ("sparse", "cluster_eesd"):
        t = traj[traj["method"] == m].set_index("step")["routing_entropy"]
        a = ana[ana["method"] == m].set_index("when")["routing_entropy"]
        assert t.loc[0] == pytest.approx(a.loc["init"], abs=1e-6) and t.loc[2] == pytest.approx(a.loc["final"], abs=1e-6)
    assert cu.report.utilisation_table(res)["share"].groupby([cu.report.utilisation_table(res)["method"]]).sum().round(6).eq(1).all()
    # the dense model is untouched by building MoE copies
    assert not any("experts" in n for n, _ in tiny_st.named_parameters())


def test_text_experiment_seeds_cache_and_benchmarks(tiny_st, tmp_path, monkeypatch):
    monkeypatch.setenv("MOELAB_CACHE", str(tmp_path))
    pairs, bench = tiny_pairs_and_bench(40)
    kw = dict(calib_texts=20, calib_tokens=200, n_test=8, n_probe=8, benchmarks=bench, bench_all_seeds=False,
              steps=1, batch_size=4, max_len=16, num_experts=2, top_k=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = cu.text_experiment(tiny_st, pairs, ["dense", "sparse"], [0, 1], **kw)
        again = cu.text_experiment(tiny_st, pairs, ["sparse"], [0], **kw)  # served from the cache
    assert [(r["method"], r["seed"]) for r in res] == [("dense", 0), ("sparse", 0), ("sparse", 1)]
    assert [r.get("benchmarks") is not None for r in res] == [True, True, False]
    assert np.array_equal(again[0]["r1"]["a2p"], res[1]["r1"]["a2p"])
    bt = cu.benchmark_table(res)
    assert set(bt["method"]) == {"dense", "sparse"} and bt["score"].between(-1, 1).all()
    with pytest.raises(ValueError, match="unknown method"):
        cu.experiment.build_model(tiny_st, "magic", None, 0)
