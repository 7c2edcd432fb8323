"""Tests for moelab.cluster_upcycling (poster 002; notebook 03)."""
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

from moelab import cluster_upcycling as cu


def _blobs(n_per=60, d=16, E=4, noise=0.05, seed=0):
    g = torch.Generator().manual_seed(seed)
    dirs = torch.nn.functional.normalize(torch.randn(E, d, generator=g), dim=1)
    x = torch.cat([dirs[i] * (1 + torch.rand(n_per, 1, generator=g) * 3) + noise * torch.randn(n_per, d, generator=g)
                   for i in range(E)])
    y = torch.arange(E).repeat_interleave(n_per)
    return x, y, dirs


# ---------------------------------------------------------------- spherical k-means
def _naive_objective(x, mu):
    xn = x / x.norm(dim=1, keepdim=True)
    return sum(max(float(m @ xj) for m in mu) for xj in xn)


def test_spherical_kmeans_recovers_directions_and_objective():
    x, y, dirs = _blobs()
    km = cu.spherical_kmeans(x, 4, seed=0)
    from sklearn.metrics import adjusted_rand_score
    assert adjusted_rand_score(y.numpy(), km.labels.numpy()) == pytest.approx(1.0)
    assert torch.allclose(km.centroids.norm(dim=1), torch.ones(4), atol=1e-5)
    assert km.objective == pytest.approx(_naive_objective(x, km.centroids), rel=1e-5)
    # centroid i = normalised mean of its unit points (Lloyd fixed point), checked with a loop
    xn = x / x.norm(dim=1, keepdim=True)
    for i in range(4):
        m = xn[km.labels == i].sum(0)
        assert torch.allclose(km.centroids[i], m / m.norm(), atol=1e-5)


def test_spherical_kmeans_scale_invariant():
    x, _, _ = _blobs()
    a = cu.spherical_kmeans(x, 4, seed=1)
    b = cu.spherical_kmeans(x * torch.rand(len(x), 1) * 10 + 0 * x, 4, seed=1)
    assert torch.equal(a.labels, b.labels)


def test_spherical_kmeans_empty_cluster_reseeded():
    # 3 distinct directions, many duplicates, 5 clusters requested: duplicates force empty clusters to be re-seeded
    base = torch.eye(3)
    x = torch.cat([base.repeat(10, 1), torch.tensor([[1.0, 0.1, 0.0], [0.0, 1.0, 0.1]])])
    km = cu.spherical_kmeans(x, 5, seed=0, n_init=1)
    assert (km.sizes > 0).all() and km.sizes.sum() == len(x)


def test_spherical_kmeans_bad_input():
    with pytest.raises(ValueError, match="num_clusters=5"):
        cu.spherical_kmeans(torch.randn(3, 4), 5)
    x = torch.randn(10, 4)
    x[2, 1] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        cu.spherical_kmeans(x, 2)
    with pytest.raises(ValueError, match="zero vectors"):
        cu.spherical_kmeans(torch.zeros(5, 3), 2)


# ---------------------------------------------------------------- data-aware truncated SVD
def test_truncation_loss_equals_discarded_singular_values():
    g = torch.Generator().manual_seed(0)
    f, d, T = 24, 10, 200
    W = torch.randn(f, d, generator=g, dtype=torch.float64)
    X = torch.randn(T, d, generator=g, dtype=torch.float64) @ torch.randn(d, d, generator=g, dtype=torch.float64)
    for r in (1, 3, 7, 10):
        res = cu.data_aware_truncate(W, X, rank=r)
        assert res.jitter == 0.0 and res.rank == r
        err = ((X @ W.T - X @ res.weight.T) ** 2).sum()  # ||W X - W~ X||_F^2 (poster, column convention)
        assert float(err) == pytest.approx(float((res.sigma[r:] ** 2).sum()), rel=1e-8, abs=1e-8)
        assert res.discarded == pytest.approx(float(err), rel=1e-8, abs=1e-8)
    # S S^T = X^T X and the singular values of W S, against a naive computation
    S, lam = cu.whitening_factor(X.T @ X)
    assert torch.allclose(S @ S.T, X.T @ X, rtol=1e-10, atol=1e-8)
    assert torch.allclose(torch.linalg.svdvals(W @ S), cu.data_aware_truncate(W, X, rank=2).sigma)
    # full rank keeps W exactly
    assert torch.allclose(cu.data_aware_truncate(W, X, rank=d).weight, W, atol=1e-8)


def test_truncation_beats_plain_svd_on_the_data():
    g = torch.Generator().manual_seed(1)
    W = torch.randn(20, 8, generator=g, dtype=torch.float64)
    X = torch.randn(300, 8, generator=g, dtype=torch.float64) * torch.tensor([10, 5, 3, 1, .5, .2, .1, .05])
    res = cu.data_aware_truncate(W, X, rank=3)
    U, s, Vh = torch.linalg.svd(W, full_matrices=False)
    W_plain = (U[:, :3] * s[:3]) @ Vh[:3]
    err = lambda Wt: float(((X @ W.T - X @ Wt.T) ** 2).sum())
    assert err(res.weight) < err(W_plain)


def test_effective_rank_energy():
    s = torch.tensor([3.0, 2.0, 1.0, 0.0])  # energies 9, 4, 1, 0 of 14
    assert cu.effective_rank(s, 9 / 14) == 1
    assert cu.effective_rank(s, 0.7) == 2
    assert cu.effective_rank(s, 13 / 14) == 2
    assert cu.effective_rank(s, 0.99) == 3
    assert cu.effective_rank(s, 1.0) == 3
    with pytest.raises(ValueError, match="energy"):
        cu.effective_rank(s, 0)
    X = torch.randn(100, 6, dtype=torch.float64)
    res = cu.data_aware_truncate(torch.randn(9, 6, dtype=torch.float64), X, energy=0.9)
    e = res.sigma ** 2 / (res.sigma ** 2).sum()
    assert e[:res.rank].sum() >= 0.9 - 1e-12 and (res.rank == 1 or e[:res.rank - 1].sum() < 0.9)


def test_rank_deficient_cluster_gets_jitter_and_warning():
    g = torch.Generator().manual_seed(2)
    W = torch.randn(12, 8, generator=g, dtype=torch.float64)
    X = torch.randn(5, 8, generator=g, dtype=torch.float64)  # 5 points < d = 8
    with pytest.warns(UserWarning, match="5 tokens < d_model=8"):
        res = cu.data_aware_truncate(W, X, energy=1.0)
    assert res.jitter > 0 and torch.isfinite(res.weight).all()
    # on the cluster's own points the map is still (almost) exact: the jitter only touches the null space
    assert float(((X @ W.T - X @ res.weight.T) ** 2).sum() / (X @ W.T).pow(2).sum()) < 1e-6
    # collinear points with T >= d: Cholesky fails -> jitter, no warning needed
    Xc = torch.randn(50, 1, dtype=torch.float64) * torch.randn(1, 8, dtype=torch.float64)
    res = cu.data_aware_truncate(W, Xc, rank=1)
    assert res.jitter > 0 and torch.isfinite(res.weight).all()


def test_requested_rank_and_bad_input_messages():
    W = torch.randn(6, 4, dtype=torch.float64)
    X = torch.randn(40, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="rank=5"):
        cu.data_aware_truncate(W, X, rank=5)
    with pytest.raises(ValueError, match="rank=0"):
        cu.data_aware_truncate(W, X, rank=0)
    Xlow = torch.randn(40, 2, dtype=torch.float64) @ torch.randn(2, 4, dtype=torch.float64)
    with pytest.warns(UserWarning, match="exceeds the numerical rank"):
        cu.data_aware_truncate(W[:, :4] @ torch.diag(torch.tensor([1., 1., 0., 0.], dtype=torch.float64)),
                               Xlow, rank=4)
    with pytest.raises(ValueError, match="empty cluster"):
        cu.data_aware_truncate(W, X[:0])
    Xn = X.clone()
    Xn[3, 0] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        cu.data_aware_truncate(W, Xn)
    with pytest.raises(ValueError, match=r"cluster\(s\) \[1\] are empty"):
        cu.cluster_aware_expert_weights(W, X, torch.zeros(40, dtype=torch.long).index_fill_(0, torch.tensor([0]), 2),
                                        3)


def test_cluster_aware_expert_weights_loop_reference():
    x, y, _ = _blobs(n_per=40, d=8, E=3)
    W = torch.randn(16, 8)
    Ws, res = cu.cluster_aware_expert_weights(W, x, y, 3, energy=0.9)
    for i in range(3):
        ref = cu.data_aware_truncate(W, x[y == i], energy=0.9)
        assert torch.allclose(Ws[i], ref.weight) and res[i].rank == ref.rank


# ---------------------------------------------------------------- analyses
def test_routing_entropy_and_utilisation():
    assert cu.routing_entropy(torch.zeros(5, 8)) == pytest.approx(1.0)
    logits = torch.tensor([[100.0, 0, 0, 0]])
    assert cu.routing_entropy(logits) == pytest.approx(0.0, abs=1e-6)
    p = torch.softmax(torch.tensor([[1.0, 2.0, 0.5]]), -1)
    assert cu.routing_entropy(torch.tensor([[1.0, 2.0, 0.5]]), normalise=False) == pytest.approx(
        float(-(p * p.log()).sum()), rel=1e-6)
    u = cu.expert_utilisation(torch.tensor([[0, 1], [0, 2]]), 4)
    assert np.allclose(u, [0.5, 0.25, 0.25, 0.0])


def test_relative_compactness():
    x, y, _ = _blobs(noise=0.01)
    rc_true = cu.relative_compactness(x, y, 4)
    rc_rand = cu.relative_compactness(x, y[torch.randperm(len(y), generator=torch.Generator().manual_seed(0))], 4)
    assert rc_true < 0.05 and 0.9 < rc_rand < 1.05
    # loop reference
    xn = x / x.norm(dim=1, keepdim=True)
    within = sum(((xn[y == i] - xn[y == i].mean(0)) ** 2).sum() for i in range(4))
    assert rc_true == pytest.approx(float(within / ((xn - xn.mean(0)) ** 2).sum()), rel=1e-5)


# ---------------------------------------------------------------- the initialiser hook on core's MoELayer
def _tiny_bert_ffn(d=16, f=32, seed=0):
    from transformers import BertConfig, BertModel
    from moelab.core.init import BertFFN
    torch.manual_seed(seed)
    m = BertModel(BertConfig(hidden_size=d, intermediate_size=f, num_hidden_layers=1, num_attention_heads=2,
                             vocab_size=50, max_position_embeddings=16))
    return BertFFN(m.encoder.layer[0])


def test_cluster_aware_init_hook_sets_experts_and_router():
    from moelab.core.layer import MoELayer
    ffn = _tiny_bert_ffn()
    x, y, dirs = _blobs(n_per=50, d=16, E=4)
    init = cu.ClusterAwareInit(energy=0.9, seed=0)
    layer = MoELayer.from_dense(ffn, num_experts=4, top_k=2, init=init, calib=x)
    km = init.kmeans[0]
    # router rows = unit centroids
    assert torch.allclose(layer.router.weight, km.centroids, atol=1e-6)
    # experts: w_in_i = truncated SVD whitened by cluster i; w_out and biases copied
    for i in range(4):
        ref = cu.data_aware_truncate(ffn.fc_in.weight.detach(), x[km.labels == i], energy=0.9)
        assert torch.allclose(layer.experts.w_in[i], ref.weight, atol=1e-5)
        assert torch.equal(layer.experts.w_out[i], ffn.fc_out.weight)
        assert torch.equal(layer.experts.b_in[i], ffn.fc_in.bias)
    rec = init.log[0]
    assert rec["sizes"] == km.sizes.tolist() and all(1 <= r <= 16 for r in rec["ranks"])
    assert all(e <= 0.1 + 1e-9 for e in rec["rel_err"])  # energy 0.9 -> at most 10% error on own cluster
    # the layer runs and tokens route to their cluster's expert first
    with torch.no_grad():
        layer(x)
    assert (layer.last_route.indices[:, 0] == km.labels).float().mean() > 0.99


def test_cluster_aware_init_ablation_switches_and_both():
    from moelab.core.layer import MoELayer
    ffn = _tiny_bert_ffn()
    x, _, _ = _blobs(n_per=60, d=16, E=2)
    only_router = MoELayer.from_dense(ffn, 2, 1, init=cu.ClusterAwareInit(cluster_experts=False), calib=x)
    assert torch.equal(only_router.experts.w_in[0], ffn.fc_in.weight)
    only_experts = MoELayer.from_dense(ffn, 2, 1, init=cu.ClusterAwareInit(cluster_router=False), calib=x)
    assert not torch.equal(only_experts.experts.w_in[0], ffn.fc_in.weight)
    both = cu.ClusterAwareInit(project="both", energy=0.99)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lay = MoELayer.from_dense(ffn, 2, 1, init=both, calib=x)
    assert "ranks_out" in both.log[0] and torch.isfinite(lay.experts.w_out).all()


def test_cluster_aware_init_bad_input():
    from moelab.core.layer import MoELayer
    ffn = _tiny_bert_ffn()
    with pytest.raises(ValueError, match="calib_x is None"):
        MoELayer.from_dense(ffn, 2, 1, init=cu.ClusterAwareInit(), calib=None)
    x = torch.randn(40, 16)
    x[0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        MoELayer.from_dense(ffn, 2, 1, init=cu.ClusterAwareInit(), calib=x)
    with pytest.raises(ValueError, match="d_model=16"):
        MoELayer.from_dense(ffn, 2, 1, init=cu.ClusterAwareInit(), calib=torch.randn(40, 8))
    with pytest.raises(ValueError, match="project"):
        cu.ClusterAwareInit(project="out")
    # fewer points per cluster than the dimension: defined (jitter + warning), finite experts
    with pytest.warns(UserWarning, match="rank-deficient"):
        lay = MoELayer.from_dense(ffn, 4, 2, init=cu.ClusterAwareInit(), calib=torch.randn(20, 16))
    assert torch.isfinite(lay.experts.w_in).all()


# ---------------------------------------------------------------- EESD
def _moe(seed=0, E=4):
    from moelab.core.layer import MoELayer
    ffn = _tiny_bert_ffn(seed=seed)
    return MoELayer.from_dense(ffn, E, 2, init="drop")


def test_eesd_loss_matches_loop_reference_and_stops_gradient():
    torch.manual_seed(0)
    layer = _moe()
    eesd = cu.EESD(None, decay=0.9, weight=0.5, layers=[layer])
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
    eesd = cu.EESD(None, decay=0.9, layers=[layer])
    before = eesd.teachers[0].experts.w_in.detach().clone()
    with torch.no_grad():
        layer.experts.w_in.add_(1.0)
    eesd.update()
    assert torch.allclose(eesd.teachers[0].experts.w_in, 0.9 * before + 0.1 * (before + 1.0), atol=1e-6)
    with pytest.raises(ValueError, match="before a forward"):
        eesd.loss()
    with pytest.raises(ValueError, match="decay"):
        cu.EESD(None, decay=1.0, layers=[layer])
    eesd.remove()


def test_expert_similarity():
    from moelab.core.layer import MoELayer
    ffn = _tiny_bert_ffn()
    sparse = MoELayer.from_dense(ffn, 4, 2, init="sparse")
    assert cu.expert_similarity(sparse) == pytest.approx(1.0, abs=1e-6)
    drop = MoELayer.from_dense(ffn, 4, 2, init="drop")
    assert cu.expert_similarity(drop) < 0.999


# ---------------------------------------------------------------- paper profile: open_clip checkpoint format
def test_openclip_format_tiny(tmp_path):
    from moelab.assets import MissingAsset
    with pytest.raises(MissingAsset, match="open_clip"):
        cu.load_openclip_mlps(tmp_path / "absent.bin")
    d, f = 12, 24
    sd = {"logit_scale": torch.tensor(1.0), "visual.conv1.weight": torch.randn(d, 3, 4, 4)}
    for i in range(4):
        pre = f"visual.transformer.resblocks.{i}.mlp."
        sd.update({pre + "c_fc.weight": torch.randn(f, d), pre + "c_fc.bias": torch.randn(f),
                   pre + "c_proj.weight": torch.randn(d, f), pre + "c_proj.bias": torch.randn(d)})
        sd[f"transformer.resblocks.{i}.mlp.c_fc.weight"] = torch.randn(f, d)  # text tower, not read
    torch.save({"state_dict": {"module." + k: v for k, v in sd.items()}}, tmp_path / "open_clip_pytorch_model.bin")
    from safetensors.torch import save_file
    save_file(sd, str(tmp_path / "open_clip_model.safetensors"))
    for name in ("open_clip_pytorch_model.bin", "open_clip_model.safetensors"):
        blocks = cu.load_openclip_mlps(tmp_path / name)
        assert sorted(blocks) == [0, 1, 2, 3] and torch.equal(blocks[1]["w_in"], sd[
            "visual.transformer.resblocks.1.mlp.c_fc.weight"])
    calib = {i: torch.randn(80, d) for i in range(4)}
    up = cu.upcycle_openclip_mlps(blocks, calib, num_experts=3, energy=0.9)
    assert sorted(up) == [1, 3]  # every other block
    assert up[1]["w_in"].shape == (3, f, d) and up[1]["router"].shape == (3, d)
    torch.save({"x": 1}, tmp_path / "bad.bin")
    with pytest.raises(ValueError, match="not an open_clip"):
        cu.load_openclip_mlps(tmp_path / "bad.bin")


# ---------------------------------------------------------------- text pipeline on a tiny BERT sentence encoder
@pytest.fixture(scope="module")
def tiny_st(tmp_path_factory):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import AutoTokenizer, BertConfig, BertModel
    import moelab
    try:
        tok_dir = moelab.assets.minilm_path()
    except moelab.assets.MissingAsset:
        pytest.skip("MiniLM tokenizer not installed")
    d = tmp_path_factory.mktemp("tinybert")
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=64)).save_pretrained(d)
    tok.save_pretrained(d)
    tr = Transformer(str(d), max_seq_length=16)
    return SentenceTransformer(modules=[tr, Pooling(32, "mean"), Normalize()], device="cpu")


def test_infonce_equals_mnrl():
    from sentence_transformers.util import cos_sim
    emb = torch.randn(8, 5)
    ref = torch.nn.functional.cross_entropy(20 * cos_sim(emb[:4], emb[4:]), torch.arange(4))
    assert float(cu.infonce_loss(emb, 4)) == pytest.approx(float(ref), rel=1e-6)


def test_run_text_condition_tiny(tiny_st):
    words = "cat dog river music bank money tree house car road rain sun".split()
    g = np.random.default_rng(0)
    sent = lambda: " ".join(g.choice(words, 6))
    pairs = [(s, s + " " + words[i % 12]) for i, s in enumerate(sent() for _ in range(48))]
    calib = cu.calibration_inputs(tiny_st, [t for ab in pairs[:32] for t in ab], max_tokens=400, max_len=16)
    assert list(calib) == [1] and calib[1].shape == (400, 32)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in ("dense", "dense_long", "sparse", "cluster_eesd"):
            out[m] = cu.run_text_condition(tiny_st, m, 0, pairs[:32], pairs[32:], [a for a, _ in pairs[32:]], calib,
                                           steps=2, batch_size=8, max_len=16, num_experts=4)
    res = list(out.values())
    assert out["cluster_eesd"]["history"]["eesd"].notna().all()
    assert out["dense"]["history"] is None and out["dense"]["analysis"] == {}
    r1 = cu.r1_table(res)
    assert len(r1) == 4 and r1["r1_avg"].between(0, 100).all()
    assert cu.per_item_r1(res, "sparse").shape == (1, 16)
    ana = cu.analysis_table(res)
    assert set(ana["method"]) == {"sparse", "cluster_eesd"} and ana["utilisation_balance"].between(0, 1).all()
    # sparse upcycling: identical experts at init; cluster-aware: more confident routing at init
    init = ana[ana["when"] == "init"].set_index("method")
    assert init.loc["sparse", "expert_similarity"] == pytest.approx(1.0, abs=1e-9)
    assert init.loc["cluster_eesd", "routing_entropy"] < init.loc["sparse", "routing_entropy"]
    assert len(cu.entropy_history(res)) == 4 and len(cu.init_table(res)) == 4
    assert cu.utilisation_table(res)["share"].groupby([cu.utilisation_table(res)["method"]]).sum().round(6).eq(1).all()
    # the dense model is untouched by building MoE copies
    assert not any("experts" in n for n, _ in tiny_st.named_parameters())


def test_text_experiment_seeds_cache_and_benchmarks(tiny_st, tmp_path, monkeypatch):
    from moelab.suite.embed import Benchmark
    monkeypatch.setenv("MOELAB_CACHE", str(tmp_path))
    words = "cat dog river music bank money tree house car road rain sun".split()
    pairs = {"train": [(f"{a} {b}", f"{b} {a}") for a in words for b in words][:40],
             "test": [(f"{a} and {b}", f"{b} or {a}") for a, b in zip(words, words[1:])]}
    bench = {"tiny_sts": Benchmark("tiny_sts", "sts", [p[0] for p in pairs["test"]], [p[1] for p in pairs["test"]],
                                   gold=np.linspace(0, 1, len(pairs["test"])))}
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
        cu.build_model(tiny_st, "magic", None, 0)
