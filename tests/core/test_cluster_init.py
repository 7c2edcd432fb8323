"""Tests for the cluster-aware upcycling initialiser and expert similarity in the shared core
(moelab.core.cluster_init, moelab.core.similarity; poster 002 Steps 1-3 and panel 2; notebooks 02 and 03).
Moved here with the code from the cluster-upcycling tests (now tests/cluster_upcycling/)."""
import warnings

import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from moelab.core import cluster_init as ci
from moelab.core.init import stacked_experts
from moelab.core.layer import MoELayer
from moelab.core.similarity import expert_similarity

from helpers.core import blobs, tiny_bert_ffn


# ---------------------------------------------------------------- spherical k-means
def _naive_objective(x, mu):
    xn = x / x.norm(dim=1, keepdim=True)
    return sum(max(float(m @ xj) for m in mu) for xj in xn)


def test_spherical_kmeans_recovers_directions_and_objective():
    x, y, dirs = blobs()
    km = ci.spherical_kmeans(x, 4, seed=0)
    assert adjusted_rand_score(y.numpy(), km.labels.numpy()) == pytest.approx(1.0)
    assert torch.allclose(km.centroids.norm(dim=1), torch.ones(4), atol=1e-5)
    assert km.objective == pytest.approx(_naive_objective(x, km.centroids), rel=1e-5)
    # centroid i = normalised mean of its unit points (Lloyd fixed point), checked with a loop
    xn = x / x.norm(dim=1, keepdim=True)
    for i in range(4):
        m = xn[km.labels == i].sum(0)
        assert torch.allclose(km.centroids[i], m / m.norm(), atol=1e-5)


def test_spherical_kmeans_scale_invariant():
    x, _, _ = blobs()
    a = ci.spherical_kmeans(x, 4, seed=1)
    b = ci.spherical_kmeans(x * torch.rand(len(x), 1) * 10 + 0 * x, 4, seed=1)
    assert torch.equal(a.labels, b.labels)


def test_spherical_kmeans_empty_cluster_reseeded():
    # 3 distinct directions, many duplicates, 5 clusters requested: duplicates force empty clusters to be re-seeded
    base = torch.eye(3)
    x = torch.cat([base.repeat(10, 1), torch.tensor([[1.0, 0.1, 0.0], [0.0, 1.0, 0.1]])])
    km = ci.spherical_kmeans(x, 5, seed=0, n_init=1)
    assert (km.sizes > 0).all() and km.sizes.sum() == len(x)


def test_spherical_kmeans_bad_input():
    with pytest.raises(ValueError, match="num_clusters=5"):
        ci.spherical_kmeans(torch.randn(3, 4), 5)
    x = torch.randn(10, 4)
    x[2, 1] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        ci.spherical_kmeans(x, 2)
    with pytest.raises(ValueError, match="zero vectors"):
        ci.spherical_kmeans(torch.zeros(5, 3), 2)


# ---------------------------------------------------------------- data-aware truncated SVD
def test_truncation_loss_equals_discarded_singular_values():
    g = torch.Generator().manual_seed(0)
    f, d, T = 24, 10, 200
    W = torch.randn(f, d, generator=g, dtype=torch.float64)
    X = torch.randn(T, d, generator=g, dtype=torch.float64) @ torch.randn(d, d, generator=g, dtype=torch.float64)
    for r in (1, 3, 7, 10):
        res = ci.data_aware_truncate(W, X, rank=r)
        assert res.jitter == 0.0 and res.rank == r
        err = ((X @ W.T - X @ res.weight.T) ** 2).sum()  # ||W X - W~ X||_F^2 (poster, column convention)
        assert float(err) == pytest.approx(float((res.sigma[r:] ** 2).sum()), rel=1e-8, abs=1e-8)
        assert res.discarded == pytest.approx(float(err), rel=1e-8, abs=1e-8)
    # S S^T = X^T X and the singular values of W S, against a naive computation
    S, lam = ci.whitening_factor(X.T @ X)
    assert torch.allclose(S @ S.T, X.T @ X, rtol=1e-10, atol=1e-8)
    assert torch.allclose(torch.linalg.svdvals(W @ S), ci.data_aware_truncate(W, X, rank=2).sigma)
    # full rank keeps W exactly
    assert torch.allclose(ci.data_aware_truncate(W, X, rank=d).weight, W, atol=1e-8)


def test_truncation_beats_plain_svd_on_the_data():
    g = torch.Generator().manual_seed(1)
    W = torch.randn(20, 8, generator=g, dtype=torch.float64)
    X = torch.randn(300, 8, generator=g, dtype=torch.float64) * torch.tensor([10, 5, 3, 1, .5, .2, .1, .05])
    res = ci.data_aware_truncate(W, X, rank=3)
    U, s, Vh = torch.linalg.svd(W, full_matrices=False)
    W_plain = (U[:, :3] * s[:3]) @ Vh[:3]
    err = lambda Wt: float(((X @ W.T - X @ Wt.T) ** 2).sum())
    assert err(res.weight) < err(W_plain)


def test_effective_rank_energy():
    s = torch.tensor([3.0, 2.0, 1.0, 0.0])  # energies 9, 4, 1, 0 of 14
    assert ci.effective_rank(s, 9 / 14) == 1
    assert ci.effective_rank(s, 0.7) == 2
    assert ci.effective_rank(s, 13 / 14) == 2
    assert ci.effective_rank(s, 0.99) == 3
    assert ci.effective_rank(s, 1.0) == 3
    with pytest.raises(ValueError, match="energy"):
        ci.effective_rank(s, 0)
    X = torch.randn(100, 6, dtype=torch.float64)
    res = ci.data_aware_truncate(torch.randn(9, 6, dtype=torch.float64), X, energy=0.9)
    e = res.sigma ** 2 / (res.sigma ** 2).sum()
    assert e[:res.rank].sum() >= 0.9 - 1e-12 and (res.rank == 1 or e[:res.rank - 1].sum() < 0.9)


def test_rank_deficient_cluster_gets_jitter_and_warning():
    g = torch.Generator().manual_seed(2)
    W = torch.randn(12, 8, generator=g, dtype=torch.float64)
    X = torch.randn(5, 8, generator=g, dtype=torch.float64)  # 5 points < d = 8
    with pytest.warns(UserWarning, match="5 tokens < d_model=8"):
        res = ci.data_aware_truncate(W, X, energy=1.0)
    assert res.jitter > 0 and torch.isfinite(res.weight).all()
    # on the cluster's own points the map is still (almost) exact: the jitter only touches the null space
    assert float(((X @ W.T - X @ res.weight.T) ** 2).sum() / (X @ W.T).pow(2).sum()) < 1e-6
    # collinear points with T >= d: Cholesky fails -> jitter, no warning needed
    Xc = torch.randn(50, 1, dtype=torch.float64) * torch.randn(1, 8, dtype=torch.float64)
    res = ci.data_aware_truncate(W, Xc, rank=1)
    assert res.jitter > 0 and torch.isfinite(res.weight).all()


def test_requested_rank_and_bad_input_messages():
    W = torch.randn(6, 4, dtype=torch.float64)
    X = torch.randn(40, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="rank=5"):
        ci.data_aware_truncate(W, X, rank=5)
    with pytest.raises(ValueError, match="rank=0"):
        ci.data_aware_truncate(W, X, rank=0)
    Xlow = torch.randn(40, 2, dtype=torch.float64) @ torch.randn(2, 4, dtype=torch.float64)
    with pytest.warns(UserWarning, match="exceeds the numerical rank"):
        ci.data_aware_truncate(W[:, :4] @ torch.diag(torch.tensor([1., 1., 0., 0.], dtype=torch.float64)),
                               Xlow, rank=4)
    with pytest.raises(ValueError, match="empty cluster"):
        ci.data_aware_truncate(W, X[:0])
    Xn = X.clone()
    Xn[3, 0] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        ci.data_aware_truncate(W, Xn)
    with pytest.raises(ValueError, match=r"cluster\(s\) \[1\] are empty"):
        ci.cluster_aware_expert_weights(W, X, torch.zeros(40, dtype=torch.long).index_fill_(0, torch.tensor([0]), 2),
                                        3)


def test_cluster_aware_expert_weights_loop_reference():
    x, y, _ = blobs(n_per=40, d=8, E=3)
    W = torch.randn(16, 8)
    Ws, res = ci.cluster_aware_expert_weights(W, x, y, 3, energy=0.9)
    for i in range(3):
        ref = ci.data_aware_truncate(W, x[y == i], energy=0.9)
        assert torch.allclose(Ws[i], ref.weight) and res[i].rank == ref.rank


# ---------------------------------------------------------------- the initialiser hook on core's MoELayer
def test_cluster_aware_init_hook_sets_experts_and_router():
    ffn = tiny_bert_ffn()
    x, y, dirs = blobs(n_per=50, d=16, E=4)
    init = ci.ClusterAwareInit(energy=0.9, seed=0)
    layer = MoELayer.from_dense(ffn, num_experts=4, top_k=2, init=init, calib=x)
    km = init.kmeans[0]
    # router rows = unit centroids
    assert torch.allclose(layer.router.weight, km.centroids, atol=1e-6)
    # experts: w_in_i = truncated SVD whitened by cluster i; w_out and biases copied
    for i in range(4):
        ref = ci.data_aware_truncate(ffn.fc_in.weight.detach(), x[km.labels == i], energy=0.9)
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
    ffn = tiny_bert_ffn()
    x, _, _ = blobs(n_per=60, d=16, E=2)
    only_router = MoELayer.from_dense(ffn, 2, 1, init=ci.ClusterAwareInit(cluster_experts=False), calib=x)
    assert torch.equal(only_router.experts.w_in[0], ffn.fc_in.weight)
    only_experts = MoELayer.from_dense(ffn, 2, 1, init=ci.ClusterAwareInit(cluster_router=False), calib=x)
    assert not torch.equal(only_experts.experts.w_in[0], ffn.fc_in.weight)
    both = ci.ClusterAwareInit(project="both", energy=0.99)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lay = MoELayer.from_dense(ffn, 2, 1, init=both, calib=x)
    assert "ranks_out" in both.log[0] and torch.isfinite(lay.experts.w_out).all()


def test_cluster_aware_init_bad_input():
    ffn = tiny_bert_ffn()
    with pytest.raises(ValueError, match="calib_x is None"):
        MoELayer.from_dense(ffn, 2, 1, init=ci.ClusterAwareInit(), calib=None)
    x = torch.randn(40, 16)
    x[0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        MoELayer.from_dense(ffn, 2, 1, init=ci.ClusterAwareInit(), calib=x)
    with pytest.raises(ValueError, match="d_model=16"):
        MoELayer.from_dense(ffn, 2, 1, init=ci.ClusterAwareInit(), calib=torch.randn(40, 8))
    with pytest.raises(ValueError, match="project"):
        ci.ClusterAwareInit(project="out")
    # fewer points per cluster than the dimension: defined (jitter + warning), finite experts
    with pytest.warns(UserWarning, match="rank-deficient"):
        lay = MoELayer.from_dense(ffn, 4, 2, init=ci.ClusterAwareInit(), calib=torch.randn(20, 16))
    assert torch.isfinite(lay.experts.w_in).all()


# ---------------------------------------------------------------- expert similarity (analysis panel 2)
def test_expert_similarity():
    ffn = tiny_bert_ffn()
    sparse = MoELayer.from_dense(ffn, 4, 2, init="sparse")
    assert expert_similarity(sparse) == pytest.approx(1.0, abs=1e-6)
    drop = MoELayer.from_dense(ffn, 4, 2, init="drop")
    assert expert_similarity(drop) < 0.999


def test_stacked_experts_names_the_layer():
    class NoExperts(torch.nn.Module):
        pass
    with pytest.raises(ValueError, match="NoExperts has no stacked experts"):
        stacked_experts(NoExperts())
    with pytest.raises(ValueError, match="NoExperts has no stacked experts"):
        expert_similarity(NoExperts())
