"""Cluster-aware upcycling initialiser (poster 002, Chu et al., "Cluster-aware upcycling"; notebook
``03_cluster_upcycling``, also used by notebook ``02_sba``). Moved here from :mod:`moelab.cluster_upcycling`
so that no paper module imports another; that module re-exports every name.

The poster's three initialisation steps:

1. *Activation clustering* (poster "Step 1"): spherical k-means on the FFN input activations of the dense model,
   one cluster per expert (:func:`spherical_kmeans`).
2. *Cluster-aware expert initialisation* (poster "Step 2", "practical solution"): every expert starts as the dense
   FFN; its input projection is replaced by a data-aware truncated SVD whitened by its own cluster
   (:func:`data_aware_truncate`): ``W~_i = T_{r_i}(W_i S_i) S_i^{-1}`` with ``S_i S_i^T = X_i X_i^T``.
3. *Cluster-aware router initialisation* (poster "Step 3"): router rows are the unit centroids ``W_r = [mu_1^T; ...]``.

All of it plugs into the core's initialiser hook ``init(dense_ffn, layer, calib_x)`` of
:func:`moelab.core.convert.moeify` through :class:`ClusterAwareInit`.

Conventions. Activations are stored row-wise, ``X_i`` [T_i, d] (the poster writes them column-wise, [d, T_i]); the
poster's ``X_i X_i^T`` is therefore our ``X_i^T X_i`` [d, d]. Weights follow ``nn.Linear``: ``W`` [d_ff, d_model].
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .experts import apply_act
from .init import dense_ffn_spec, sparse_upcycle, stacked_experts

__all__ = ["spherical_kmeans", "KMeansResult", "whitening_factor", "effective_rank", "data_aware_truncate",
           "TruncResult", "cluster_aware_expert_weights", "ClusterAwareInit", "GATED_ACTS"]


def _check_finite(x: torch.Tensor, name: str) -> None:
    if not torch.isfinite(x).all():
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"{name} contains {bad} non-finite entries (of {x.numel()}); "
                         "cluster-aware upcycling needs finite activations (check the dense model / calibration batch)")


# ---------------------------------------------------------------------------------------------------------------
# Step 1: spherical k-means (written by hand: scikit-learn's KMeans is Euclidean and has no spherical variant)
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class KMeansResult:
    centroids: torch.Tensor  # [E, d] unit rows mu_i
    labels: torch.Tensor  # [T] long, cluster of each point
    objective: float  # sum_j max_i mu_i^T x_j / ||x_j||   (poster Step 1, on unit-normalised x)
    sizes: torch.Tensor  # [E] points per cluster
    n_iter: int
    reseeded: int = 0  # number of times an empty cluster was re-seeded


def spherical_kmeans(x: torch.Tensor, num_clusters: int, n_iter: int = 50, n_init: int = 3, seed: int = 0,
                     tol: float = 1e-7) -> KMeansResult:
    """Spherical k-means on cosine similarity (poster 002, Step 1; notebook 03).

    ``{mu_i} = argmax_{||mu_i||=1} sum_j max_i mu_i^T x_j`` over the unit-normalised points ``x_j``. Lloyd iterations
    (assign to the most similar centroid, centroid = normalised sum), k-means++ seeding on cosine distance, ``n_init``
    restarts, the best objective kept. An empty cluster is re-seeded with the point least similar to its own centroid
    (so every returned cluster is non-empty). ``x``: [T, d]; zero rows are rejected.
    """
    if x.ndim != 2:
        raise ValueError(f"spherical_kmeans expects x of shape [T, d], got {tuple(x.shape)}")
    if not isinstance(num_clusters, int) or num_clusters < 1:
        raise ValueError(f"num_clusters must be a positive int, got {num_clusters!r}")
    _check_finite(x, "spherical_kmeans input x")
    T = x.shape[0]
    if T < num_clusters:
        raise ValueError(f"spherical_kmeans: {T} points cannot fill num_clusters={num_clusters} non-empty clusters")
    norms = x.float().norm(dim=1, keepdim=True)
    if (norms == 0).any():
        raise ValueError(f"spherical_kmeans: {int((norms == 0).sum())} zero vectors have no direction")
    xn = x.float() / norms  # [T, d] unit rows
    g = torch.Generator().manual_seed(seed)
    best = None
    for _ in range(n_init):
        # k-means++ seeding with cosine distance 1 - mu^T x
        idx = [int(torch.randint(T, (1,), generator=g))]
        dist = 1 - xn @ xn[idx[0]]
        for _k in range(1, num_clusters):
            p = dist.clamp_min(0)
            p = p / p.sum() if p.sum() > 0 else torch.full_like(p, 1.0 / T)
            idx.append(int(torch.multinomial(p, 1, generator=g)))
            dist = torch.minimum(dist, 1 - xn @ xn[idx[-1]])
        mu = xn[idx].clone()  # [E, d]
        prev, reseeded, it = -math.inf, 0, 0
        for it in range(1, n_iter + 1):
            sim = xn @ mu.T  # [T, E]  mu_i^T x_j
            best_sim, labels = sim.max(1)
            sums = torch.zeros_like(mu).index_add_(0, labels, xn)  # [E, d]
            counts = torch.bincount(labels, minlength=num_clusters)
            for e in torch.nonzero(counts == 0).flatten().tolist():  # empty cluster: re-seed
                j = int(best_sim.argmin())
                labels[j] = e
                best_sim[j] = 1.0  # do not pick it twice
                sums[e] = xn[j]
                reseeded += 1
            counts = torch.bincount(labels, minlength=num_clusters)
            mu = F.normalize(sums, dim=1)
            obj = float((xn @ mu.T).gather(1, labels[:, None]).sum())
            if obj - prev <= tol * T:
                break
            prev = obj
        labels = (xn @ mu.T).argmax(1)
        counts = torch.bincount(labels, minlength=num_clusters)
        obj = float((xn @ mu.T).max(1).values.sum())
        if best is None or obj > best.objective:
            best = KMeansResult(mu, labels, obj, counts, it, reseeded)
    if (best.sizes == 0).any():  # final re-assignment emptied a cluster: give it its least-fitting point
        sim = xn @ best.centroids.T
        best_sim = sim.max(1).values
        for e in torch.nonzero(best.sizes == 0).flatten().tolist():
            j = int(best_sim.argmin())
            best.labels[j] = e
            best_sim[j] = 1.0
            best.centroids[e] = xn[j]
            best.reseeded += 1
        best.sizes = torch.bincount(best.labels, minlength=num_clusters)
    return best


# ---------------------------------------------------------------------------------------------------------------
# Step 2: data-aware truncated SVD (SVD-LLM's whitening, per cluster)
# ---------------------------------------------------------------------------------------------------------------
def whitening_factor(gram: torch.Tensor, jitter_rel: float = 1e-6, force_jitter: bool = False):
    """Lower-triangular ``S`` with ``S S^T = G (+ lambda I)``, ``G = X^T X`` [d, d], in float64 (poster Step 2).

    Follows SVD-LLM: Cholesky in float64; if it fails (singular/indefinite G), add ``(-lambda_min + eps) I`` with
    ``eps = jitter_rel * trace(G) / d`` (relative, so it does not depend on the activations' scale) and retry.
    Returns ``(S, lam)`` with the jitter ``lam`` actually added (0.0 when none was needed).
    """
    G = gram.to(torch.float64)
    if G.ndim != 2 or G.shape[0] != G.shape[1]:
        raise ValueError(f"gram must be square [d, d], got {tuple(G.shape)}")
    _check_finite(G, "gram matrix X^T X")
    d = G.shape[0]
    scale = float(torch.trace(G)) / d
    if scale <= 0:
        raise ValueError(f"gram matrix has trace {scale * d:g}: the cluster's activations are all zero")
    lam = 0.0
    if not force_jitter:
        S, info = torch.linalg.cholesky_ex(G)
        if int(info) == 0 and torch.isfinite(S).all():
            return S, lam
    lam_min = float(torch.linalg.eigvalsh(G)[0])
    lam = max(0.0, -lam_min) + jitter_rel * scale
    for _ in range(8):
        S, info = torch.linalg.cholesky_ex(G + lam * torch.eye(d, dtype=G.dtype))
        if int(info) == 0:
            return S, lam
        lam *= 10
    raise ValueError(f"Cholesky of the gram matrix failed even with jitter {lam:g}")


def effective_rank(sigma: torch.Tensor, energy: float) -> int:
    """Smallest r with ``sum_{j<=r} sigma_j^2 >= energy * sum_j sigma_j^2`` (spectral-energy threshold, poster Step 2).

    Because the discarded energy equals the reconstruction error on the cluster, ``1 - energy`` bounds the relative
    squared error of each expert's pre-activations on its own cluster.
    """
    if not (0 < energy <= 1):
        raise ValueError(f"energy threshold must be in (0, 1], got {energy!r}")
    e = sigma.to(torch.float64) ** 2
    if float(e.sum()) == 0:
        return 1
    cum = torch.cumsum(e, 0) / e.sum()
    return int(min(int(torch.searchsorted(cum, torch.tensor(energy - 1e-12, dtype=cum.dtype))) + 1, len(sigma)))


@dataclass
class TruncResult:
    weight: torch.Tensor  # W~ [f, d] (dtype of the input W)
    rank: int  # r_i kept
    sigma: torch.Tensor  # singular values of W S (float64)
    discarded: float  # sum_{j > r} sigma_j^2
    jitter: float  # lambda added to X^T X
    energy_kept: float  # sum_{j<=r} sigma_j^2 / sum_j sigma_j^2


def data_aware_truncate(W: torch.Tensor, X: torch.Tensor | None = None, *, gram: torch.Tensor | None = None,
                        rank: int | None = None, energy: float = 0.95, jitter_rel: float = 1e-6,
                        name: str = "cluster") -> TruncResult:
    """``W~ = T_r(W S) S^{-1}`` with ``S S^T = X^T X`` (poster 002 Step 2; SVD-LLM's truncation; notebook 03).

    ``W`` [f, d]; ``X`` [T, d] (rows = tokens) or its ``gram`` [d, d]. ``rank`` fixes r, else r is the effective rank
    at spectral ``energy``. Truncation loss on the data (poster): ``||W X^T - W~ X^T||_F^2 = sum_{j>r} sigma_j^2``
    (exact when no jitter was needed; with jitter it holds for ``X^T X + lambda I``).
    Rank-deficient data (T < d, or collinear tokens) gets the SVD-LLM jitter and a warning.
    """
    if W.ndim != 2:
        raise ValueError(f"W must be [d_ff, d_model], got {tuple(W.shape)}")
    _check_finite(W, "weight W")
    f, d = W.shape
    if gram is None:
        if X is None:
            raise ValueError("data_aware_truncate needs X or gram")
        if X.ndim != 2 or X.shape[1] != d:
            raise ValueError(f"X must be [T, {d}] to match W {tuple(W.shape)}, got {tuple(X.shape)}")
        if X.shape[0] == 0:
            raise ValueError(f"{name}: empty cluster (0 tokens): no data to whiten with")
        _check_finite(X, f"{name} activations X")
        X64 = X.to(torch.float64)
        gram = X64.T @ X64  # poster's X_i X_i^T   [d, d]
        n_points = X.shape[0]
    else:
        n_points = None
    if rank is not None:
        if not isinstance(rank, int) or not (1 <= rank <= min(f, d)):
            raise ValueError(f"{name}: requested rank={rank!r} is outside 1..min(d_ff, d_model)={min(f, d)}")
    deficient = n_points is not None and n_points < d
    if deficient:
        warnings.warn(f"{name}: {n_points} tokens < d_model={d}: X^T X is rank-deficient; adding SVD-LLM jitter",
                      stacklevel=2)
    S, lam = whitening_factor(gram, jitter_rel=jitter_rel, force_jitter=deficient)  # S S^T = X^T X (+ lam I)
    W64 = W.to(torch.float64)
    U, sigma, Vh = torch.linalg.svd(W64 @ S, full_matrices=False)  # W S = U diag(sigma) V^T   [f,m][m][m,d]
    r = effective_rank(sigma, energy) if rank is None else rank
    num_rank = int((sigma > sigma[0] * max(f, d) * torch.finfo(torch.float64).eps).sum())
    if rank is not None and rank > num_rank:
        warnings.warn(f"{name}: requested rank {rank} exceeds the numerical rank {num_rank} of W S; "
                      "the extra components carry no energy (the truncation is exact)", stacklevel=2)
    A = (U[:, :r] * sigma[:r]) @ Vh[:r]  # T_r(W S)   [f, d]
    Wt = torch.linalg.solve_triangular(S, A, upper=False, left=False)  # T_r(W S) S^{-1}   [f, d]
    e = sigma ** 2
    return TruncResult(Wt.to(W.dtype), r, sigma, float(e[r:].sum()), lam, float(e[:r].sum() / e.sum()))


def cluster_aware_expert_weights(W: torch.Tensor, x: torch.Tensor, labels: torch.Tensor, num_experts: int,
                                 energy: float = 0.95, rank: int | None = None, jitter_rel: float = 1e-6,
                                 layer_name: str = "layer") -> tuple[torch.Tensor, list[TruncResult]]:
    """Per-expert ``W~_i = T_{r_i}(W S_i) S_i^{-1}`` from cluster ``i``'s tokens (poster Step 2; notebook 03).

    ``W`` [f, d] the dense input projection; ``x`` [T, d]; ``labels`` [T] in 0..E-1. Returns ``([E, f, d], results)``.
    An empty cluster is an error here (``spherical_kmeans`` never returns one).
    """
    sizes = torch.bincount(labels, minlength=num_experts)
    if len(sizes) > num_experts:
        raise ValueError(f"{layer_name}: labels reach {len(sizes) - 1} but num_experts={num_experts}")
    empty = torch.nonzero(sizes == 0).flatten().tolist()
    if empty:
        raise ValueError(f"{layer_name}: cluster(s) {empty} are empty; every expert needs calibration tokens")
    out, res = [], []
    for i in range(num_experts):
        r = data_aware_truncate(W, x[labels == i], rank=rank, energy=energy, jitter_rel=jitter_rel,
                                name=f"{layer_name} expert {i}")
        out.append(r.weight)
        res.append(r)
    return torch.stack(out), res


# ---------------------------------------------------------------------------------------------------------------
# The initialiser hook for moelab.core.convert.moeify
# ---------------------------------------------------------------------------------------------------------------
GATED_ACTS = ("swiglu", "geglu", "geglu_tanh")  # Step 2 is written for ungated FFNs (one input projection W)


def _router_rows(layer) -> torch.Tensor:
    w = layer._router_rows() if hasattr(layer, "_router_rows") else None
    if w is None:
        raise ValueError(f"{type(layer).__name__}: cluster-aware router init needs a linear router (router='topk')")
    return w


class ClusterAwareInit:
    """Initialiser hook ``init(dense_ffn, layer, calib_x)`` for :func:`moelab.core.convert.moeify` (poster 002; nb 03).

    For each converted FFN: spherical k-means of ``calib_x`` [T, d] into ``E`` clusters (Step 1); every expert copies
    the dense FFN, then its input projection becomes ``T_{r_i}(W S_i) S_i^{-1}`` (Step 2; ``project="in"``);
    router rows = unit centroids (Step 3). ``project="both"`` also truncates the output projection, whitened by the
    cluster's hidden activations ``act(W~_i x + b)``; the default is ``"in"`` because the collected activations are
    exactly that layer's inputs, while the hidden ones are d_ff-wide (1536 for MiniLM) and would need far more tokens
    per cluster than d_ff to be full-rank. ``cluster_experts=False`` gives "router from centroids, experts copied"
    and ``cluster_router=False`` the converse (ablations). ``self.log`` keeps per-layer diagnostics.
    """

    def __init__(self, energy: float = 0.95, rank: int | None = None, project: str = "in", n_init: int = 3,
                 n_iter: int = 50, seed: int = 0, jitter_rel: float = 1e-6, cluster_experts: bool = True,
                 cluster_router: bool = True, router_scale: float = 1.0):
        if project not in ("in", "both"):
            raise ValueError(f"project must be 'in' or 'both', got {project!r}")
        if not (0 < energy <= 1):
            raise ValueError(f"energy threshold must be in (0, 1], got {energy!r}")
        self.energy, self.rank, self.project = energy, rank, project
        self.n_init, self.n_iter, self.seed, self.jitter_rel = n_init, n_iter, seed, jitter_rel
        self.cluster_experts, self.cluster_router, self.router_scale = cluster_experts, cluster_router, router_scale
        self.log: list[dict] = []
        self.kmeans: list[KMeansResult] = []

    def __call__(self, dense_ffn: nn.Module, layer: nn.Module, calib_x: torch.Tensor | None) -> None:
        name = f"moe layer {len(self.log)}"
        if calib_x is None:
            raise ValueError("cluster-aware init needs calibration inputs (calib_x is None): pass calib_inputs to moeify")
        calib_x = calib_x.detach().reshape(-1, calib_x.shape[-1]).float()
        _check_finite(calib_x, f"{name} calibration activations")
        ex = stacked_experts(layer)
        E = ex.w_in.shape[0]
        spec = dense_ffn_spec(dense_ffn)
        if calib_x.shape[1] != spec.d_model:
            raise ValueError(f"{name}: calib_x has width {calib_x.shape[1]}, the FFN expects d_model={spec.d_model}")
        km = self.partition(calib_x, E)  # Step 1
        self.kmeans.append(km)
        rec = dict(layer=len(self.log), tokens=calib_x.shape[0], sizes=km.sizes.tolist(), reseeded=km.reseeded,
                   ranks=[], energy_kept=[], jitter=[], rel_err=[])
        with torch.no_grad():
            sparse_upcycle(dense_ffn, layer)  # for all i: W_i <- W (and biases)
            if self.cluster_experts:  # Step 2
                if ex.act in GATED_ACTS:
                    raise ValueError(f"cluster-aware expert init is implemented for ungated FFNs, got act={ex.act!r}")
                W = spec.w_in.detach().float()
                W_new, res = cluster_aware_expert_weights(W, calib_x, km.labels, E, self.energy, self.rank,
                                                          self.jitter_rel, name)
                ex.w_in.copy_(W_new.to(ex.w_in.dtype))  # W~_i = T_{r_i}(W S_i) S_i^{-1}   [E, f, d]
                for i, r in enumerate(res):
                    xi = calib_x[km.labels == i].double()
                    denom = float(((xi @ W.double().T) ** 2).sum())
                    rec["ranks"].append(r.rank)
                    rec["energy_kept"].append(r.energy_kept)
                    rec["jitter"].append(r.jitter)
                    rec["rel_err"].append(r.discarded / denom if denom > 0 else 0.0)  # on X_i, = 1 - energy kept
                if self.project == "both":
                    rec["ranks_out"] = self._truncate_out(ex, spec, calib_x, km.labels, E, name)
            if self.cluster_router:  # Step 3: W_r = [mu_1^T; ...; mu_E^T]
                w = _router_rows(layer)
                if w.shape != km.centroids.shape:
                    raise ValueError(f"router weight {tuple(w.shape)} != centroids {tuple(km.centroids.shape)}")
                w.copy_(self.router_scale * km.centroids.to(w.dtype))
        self.log.append(rec)

    def partition(self, calib_x: torch.Tensor, num_experts: int) -> KMeansResult:
        """Step 1: one cluster (and unit centroid) per expert; spherical k-means here. Subclasses may partition
        differently (e.g. notebook 03's special-token handling gives special tokens an expert of their own)."""
        return spherical_kmeans(calib_x, num_experts, n_iter=self.n_iter, n_init=self.n_init, seed=self.seed)

    def _truncate_out(self, ex, spec, x, labels, E, name):
        ranks = []
        for i in range(E):
            xi = x[labels == i]
            h = F.linear(xi, ex.w_in[i].float(), None if ex.b_in is None else ex.b_in[i].float())  # [T_i, f]
            r = data_aware_truncate(spec.w_out.detach().float(), apply_act(h, ex.act), energy=self.energy,
                                    jitter_rel=self.jitter_rel, name=f"{name} expert {i} (output projection)")
            ex.w_out[i].copy_(r.weight.to(ex.w_out.dtype))
            ranks.append(r.rank)
        return ranks
