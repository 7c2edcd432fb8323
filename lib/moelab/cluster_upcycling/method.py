"""Cluster-aware upcycling itself (poster 002, Chu et al.; notebook ``03_cluster_upcycling``): no I/O, no training.

The poster's three initialisation steps plus its training loss:

1. *Activation clustering* (poster "Step 1"): spherical k-means on the FFN input activations of the dense model,
   one cluster per expert (:func:`spherical_kmeans`). Which tokens enter the clustering is explicit here:
   ``special_tokens="exclude"`` (the default), ``"own_expert"`` or ``"include"``
   (:class:`SpecialTokenClusterInit`).
2. *Cluster-aware expert initialisation* (poster "Step 2", "practical solution"): every expert starts as the dense
   FFN; its input projection is replaced by a data-aware truncated SVD whitened by its own cluster
   (:func:`data_aware_truncate`): ``W~_i = T_{r_i}(W_i S_i) S_i^{-1}`` with ``S_i S_i^T = X_i X_i^T``.
3. *Cluster-aware router initialisation* (poster "Step 3"): router rows are the unit centroids ``W_r = [mu_1^T; ...]``.
4. *Expert-ensemble self-distillation* (poster "EESD"): at every MoE layer the sparse top-k output is pulled towards
   the dense ensemble of all experts of an EMA copy, weighted by the EMA router's probabilities (:class:`EESD`).

Steps 1-3 live in :mod:`moelab.core.cluster_init` (shared with notebook 02) and are re-exported
here; this file adds the special-token handling of the calibration set and EESD (the paper profile applies the same
Steps 1-3 to CLIP's image tower: :mod:`moelab.cluster_upcycling.clip`).

Conventions. Activations are stored row-wise, ``X_i`` [T_i, d] (the poster writes them column-wise, [d, T_i]); the
poster's ``X_i X_i^T`` is therefore our ``X_i^T X_i`` [d, d]. Weights follow ``nn.Linear``: ``W`` [d_ff, d_model].
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from moelab.core import moe_layers
from moelab.core.cluster_init import (GATED_ACTS, ClusterAwareInit, KMeansResult, TruncResult,
                                      cluster_aware_expert_weights, data_aware_truncate, effective_rank,
                                      spherical_kmeans, whitening_factor)
from moelab.core.init import stacked_experts

__all__ = [
    "spherical_kmeans", "KMeansResult", "whitening_factor", "effective_rank", "data_aware_truncate", "TruncResult",
    "cluster_aware_expert_weights", "ClusterAwareInit", "GATED_ACTS",
    "SPECIAL_TOKENS", "DEFAULT_SPECIAL_TOKENS", "special_token_partition", "SpecialTokenClusterInit",
    "EESD", "dense_ensemble",
]


# ---------------------------------------------------------------------------------------------------------------
# Step 1 with the special tokens handled explicitly
# ---------------------------------------------------------------------------------------------------------------
SPECIAL_TOKENS = ("exclude", "own_expert", "include")
# Default: special tokens ([CLS], [SEP]; a ViT's CLS) are left out of the clustering and of every expert's
# whitening. Kept in ("include", the poster's literal "all FFN inputs"), [CLS] - one token per sentence in a direction
# of its own - formed a cluster by itself in MoE layers 0 and 1 of MiniLM, and that expert got rank 1 in every seed.
DEFAULT_SPECIAL_TOKENS = "exclude"


def _check_mode(special_tokens: str) -> None:
    if special_tokens not in SPECIAL_TOKENS:
        raise ValueError(f"special_tokens must be one of {SPECIAL_TOKENS}, got {special_tokens!r}")


def special_token_partition(x: torch.Tensor, special_mask: torch.Tensor, num_experts: int, n_iter: int = 50,
                            n_init: int = 3, seed: int = 0) -> KMeansResult:
    """Step 1 with ``special_tokens="own_expert"`` (poster 002 Step 1; notebook 03).

    The ordinary tokens ``x[~special_mask]`` are clustered by spherical k-means into ``E - 1`` clusters (experts
    ``0..E-2``); the special tokens form cluster ``E - 1``, whose unit centroid is the normalised sum of their unit
    rows, ``mu_{E} = sum_{x in S} x^ / ||sum_{x in S} x^||`` (the spherical k-means centroid of that one cluster).
    ``x`` [T, d]; ``special_mask`` [T] bool. Returns a :class:`KMeansResult` over all T tokens."""
    m = torch.as_tensor(special_mask, dtype=torch.bool).reshape(-1)
    if x.ndim != 2 or len(m) != x.shape[0]:
        raise ValueError(f"special_mask has {len(m)} entries for x of shape {tuple(x.shape)}; it must mark each "
                         "calibration token (one entry per row of x)")
    n_special = int(m.sum())
    if num_experts < 2:
        raise ValueError(f"special_tokens='own_expert' needs num_experts >= 2, got {num_experts}")
    if n_special == 0:
        raise ValueError("special_tokens='own_expert' but the calibration set holds no special token; use "
                         "special_tokens='exclude' or 'include'")
    km = spherical_kmeans(x[~m], num_experts - 1, n_iter=n_iter, n_init=n_init, seed=seed)  # experts 0..E-2
    xn = F.normalize(x.float(), dim=1)  # x^ = x / ||x||   [T, d]
    mu_special = F.normalize(xn[m].sum(0), dim=0)  # mu_E   [d]
    centroids = torch.cat([km.centroids, mu_special[None]])  # [E, d]
    labels = torch.full((x.shape[0],), num_experts - 1, dtype=torch.long)
    labels[~m] = km.labels
    objective = float((xn * centroids[labels]).sum())  # sum_j mu_{c(j)}^T x^_j over all tokens
    return KMeansResult(centroids, labels, objective, torch.bincount(labels, minlength=num_experts), km.n_iter,
                        km.reseeded)


class SpecialTokenClusterInit(ClusterAwareInit):
    """:class:`ClusterAwareInit` with the calibration set's special tokens handled explicitly (poster 002
    Steps 1-3; notebook 03).

    ``special_mask`` [T] marks the special tokens of the calibration set (every converted layer sees the same tokens
    in the same order, so one mask serves all layers; :func:`moelab.cluster_upcycling.data.calibration_special_mask`).

    * ``"exclude"`` (default, :data:`DEFAULT_SPECIAL_TOKENS`): Steps 1-3 on the ordinary tokens only; at run time
      the centroid router sends a special token to its nearest centroid like any other token.
    * ``"own_expert"``: expert ``E - 1`` is the special tokens' (:func:`special_token_partition`): its whitening
      uses them alone and its router row is their unit centroid; the other ``E - 1`` experts cluster the rest.
    * ``"include"``: the poster's literal reading, all tokens clustered together (no mask needed).

    Each ``self.log`` record gains ``special_tokens`` (the mode), ``special_total``, ``special_in_cluster`` (per
    expert: special calibration tokens among the tokens that whiten it) and ``special_routed`` (per expert: special
    calibration tokens whose top-1 expert under the initial centroid router is it, ``argmax_i mu_i^T x``).
    """

    def __init__(self, special_mask=None, special_tokens: str = DEFAULT_SPECIAL_TOKENS, **kwargs):
        _check_mode(special_tokens)
        if special_mask is None and special_tokens != "include":
            raise ValueError(f"special_tokens={special_tokens!r} needs special_mask (which calibration tokens are "
                             "special: moelab.cluster_upcycling.calibration_special_mask / vit_special_mask); "
                             "pass special_tokens='include' to cluster every token")
        super().__init__(**kwargs)
        self.special_tokens = special_tokens
        self.special_mask = None if special_mask is None else torch.as_tensor(special_mask, dtype=torch.bool).reshape(-1)
        self._mask_now = None

    def __call__(self, dense_ffn: nn.Module, layer: nn.Module, calib_x: torch.Tensor | None) -> None:
        if calib_x is None:
            raise ValueError("cluster-aware init needs calibration inputs (calib_x is None): pass calib_inputs to moeify")
        x = calib_x.detach().reshape(-1, calib_x.shape[-1]).float()
        m = self.special_mask
        if m is None:
            m = torch.zeros(len(x), dtype=torch.bool)
        elif len(m) != len(x):
            raise ValueError(f"special_mask has {len(m)} entries but moe layer {len(self.log)} has {len(x)} "
                             "calibration tokens: build the mask from the same texts, batch size, max_len and "
                             "max_tokens as the calibration inputs")
        if self.special_tokens == "exclude":
            super().__call__(dense_ffn, layer, x[~m])  # Steps 1-3 on the ordinary tokens only
        else:
            self._mask_now = m
            try:
                super().__call__(dense_ffn, layer, x)
            finally:
                self._mask_now = None
        km, rec = self.kmeans[-1], self.log[-1]
        E = km.centroids.shape[0]
        routed = (x[m] @ km.centroids.T).argmax(1) if int(m.sum()) else torch.zeros(0, dtype=torch.long)
        in_cluster = (km.labels[m] if self.special_tokens != "exclude" else torch.zeros(0, dtype=torch.long))
        rec.update(special_tokens=self.special_tokens, special_total=int(m.sum()),
                   special_in_cluster=torch.bincount(in_cluster, minlength=E).tolist(),
                   special_routed=torch.bincount(routed, minlength=E).tolist())

    def partition(self, calib_x: torch.Tensor, num_experts: int) -> KMeansResult:
        if self.special_tokens == "own_expert" and self._mask_now is not None:
            return special_token_partition(calib_x, self._mask_now, num_experts, self.n_iter, self.n_init, self.seed)
        return super().partition(calib_x, num_experts)


# ---------------------------------------------------------------------------------------------------------------
# Step 4: expert-ensemble self-distillation (EESD)
# ---------------------------------------------------------------------------------------------------------------
def _router_probs(layer, x2d):
    logits = layer.router.logits(x2d)  # z = W_r x   [T, E]
    return torch.softmax(logits.float(), dim=-1)  # g_i(x) over all E experts   [T, E]


def dense_ensemble(layer, x2d: torch.Tensor) -> torch.Tensor:
    """Teacher ``y_ens(x) = sum_{i=1}^{E} g_i(x) E_i(x)`` over *all* experts (poster 002 "EESD"; notebook 03)
    [T, d]."""
    ex = stacked_experts(layer)
    p = _router_probs(layer, x2d)  # [T, E]
    y = torch.zeros_like(x2d)
    for e in range(p.shape[1]):
        y = y + p[:, e:e + 1].to(x2d.dtype) * ex.forward_expert(e, x2d)  # g_i^ema(x) E_i^ema(x)   [T, d]
    return y


class EESD:
    """Expert-ensemble self-distillation (poster 002, "EESD"; notebook 03).

    ``L_EESD = 1/T sum_x || sg(y_ens(x)) - y_MoE(x) ||_2^2`` at each MoE layer, summed over layers, where
    ``y_MoE`` is the layer's own sparse top-k output (student) and ``y_ens`` the dense ensemble of all experts of an
    EMA copy of that layer, weighted by the EMA router's softmax probabilities (teacher), evaluated on the same input
    ``x``. The teacher is under ``no_grad`` (the stop-gradient); only MoE layers are copied (the teacher needs
    nothing else). ``update()`` does the EMA step ``theta_ema <- decay * theta_ema + (1 - decay) * theta``; call it
    after every optimiser step (trainer hook ``after_step``). Padding tokens are included (the MoE layer sees them too).
    Forwards under ``no_grad`` (evaluation, held-out analyses) are not recorded.
    """

    def __init__(self, model: nn.Module, decay: float = 0.99, weight: float = 1.0, layers=None):
        if not (0 <= decay < 1):
            raise ValueError(f"EMA decay must be in [0, 1), got {decay!r}")
        if weight < 0:
            raise ValueError(f"EESD weight must be >= 0, got {weight!r}")
        if layers is None:
            layers = moe_layers(model)
        if not layers:
            raise ValueError("EESD needs at least one MoE layer in the model")
        self.decay, self.weight, self.layers = decay, weight, list(layers)
        self.teachers = [copy.deepcopy(l).requires_grad_(False).eval() for l in self.layers]
        self._io: dict[int, list] = {}
        self._hooks = [l.register_forward_hook(self._hook(i)) for i, l in enumerate(self.layers)]

    def _hook(self, i):
        def fn(mod, args, out):
            if torch.is_grad_enabled():  # training forwards only (evaluation runs under no_grad)
                self._io.setdefault(i, []).append((args[0], out[0] if isinstance(out, tuple) else out))
        return fn

    def loss(self) -> torch.Tensor:
        """Sum over MoE layers of the per-token squared error, averaged over tokens, times ``weight``."""
        if not self._io:
            raise ValueError("EESD.loss() called before a forward pass through the MoE layers")
        total = 0.0
        for i, ios in self._io.items():  # every forward since the last loss() (e.g. anchors and positives)
            x2d = torch.cat([x.reshape(-1, x.shape[-1]) for x, _ in ios])
            y2d = torch.cat([y.reshape(-1, y.shape[-1]) for _, y in ios])
            with torch.no_grad():
                target = dense_ensemble(self.teachers[i], x2d.detach())  # sg(y_ens(x))   [T, d]
            total = total + ((target - y2d) ** 2).sum(-1).mean()  # 1/T sum_x ||.||_2^2
        self._io.clear()
        return self.weight * total

    @torch.no_grad()
    def update(self) -> None:
        for t, s in zip(self.teachers, self.layers):
            for pt, ps in zip(t.parameters(), s.parameters()):
                pt.mul_(self.decay).add_(ps.detach(), alpha=1 - self.decay)

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._io.clear()
