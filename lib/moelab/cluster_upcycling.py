"""Cluster-aware upcycling (poster 002, Chu et al.; notebook ``03_cluster_upcycling``).

The method, in the poster's three initialisation steps plus its training loss:

1. *Activation clustering* (poster "Step 1"): spherical k-means on the FFN input activations of the dense model,
   one cluster per expert (:func:`spherical_kmeans`).
2. *Cluster-aware expert initialisation* (poster "Step 2", "practical solution"): every expert starts as the dense
   FFN; its input projection is replaced by a data-aware truncated SVD whitened by its own cluster
   (:func:`data_aware_truncate`): ``W~_i = T_{r_i}(W_i S_i) S_i^{-1}`` with ``S_i S_i^T = X_i X_i^T``.
3. *Cluster-aware router initialisation* (poster "Step 3"): router rows are the unit centroids ``W_r = [mu_1^T; ...]``.
4. *Expert-ensemble self-distillation* (poster "EESD"): at every MoE layer the sparse top-k output is pulled towards
   the dense ensemble of all experts of an EMA copy, weighted by the EMA router's probabilities (:class:`EESD`).

All of it plugs into the core's initialiser hook ``init(dense_ffn, layer, calib_x)`` of
:func:`moelab.core.convert.moeify` through :class:`ClusterAwareInit`. Steps 1-3 and :func:`expert_similarity` live in
:mod:`moelab.core.cluster_init` and :mod:`moelab.core.similarity` (shared with notebook 02; issue 21, item 0) and are
re-exported here under their old names.

Experiments of notebook 03: the text experiment (all-MiniLM-L6-v2, :func:`text_experiment`) and, at the end of this
module, the vision experiment (a small ViT pretrained here on Fashion-MNIST standing in for CLIP ViT-B;
:func:`pretrain_vit`, :func:`vision_experiment`; few-shot probes and fine-tuning on CIFAR-10).

Conventions. Activations are stored row-wise, ``X_i`` [T_i, d] (the poster writes them column-wise, [d, T_i]); the
poster's ``X_i X_i^T`` is therefore our ``X_i^T X_i`` [d, d]. Weights follow ``nn.Linear``: ``W`` [d_ff, d_model].
"""
from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from moelab import progress
# Steps 1-3 and expert similarity live in the shared core (issue 21, item 0); re-exported here under the old names.
from moelab.core.cluster_init import (GATED_ACTS, ClusterAwareInit, KMeansResult, TruncResult,
                                      cluster_aware_expert_weights, data_aware_truncate, effective_rank,
                                      spherical_kmeans, whitening_factor)
from moelab.core.init import stacked_experts as _experts_module
from moelab.core.similarity import expert_similarity
from moelab.profiles import paper_input_hint

__all__ = [
    "spherical_kmeans", "KMeansResult", "whitening_factor", "effective_rank", "data_aware_truncate", "TruncResult",
    "cluster_aware_expert_weights", "ClusterAwareInit", "EESD", "dense_ensemble",
    "routing_entropy", "expert_utilisation", "relative_compactness", "expert_similarity",
    "load_openclip_mlps", "upcycle_openclip_mlps", "upcycle",
    "VIT_SMALL", "VISION_METHODS", "pretrain_vit", "vision_experiment", "few_shot_indices", "few_shot_probe",
    "cifar_to_grey28", "per_item_scores", "vision_table", "plot_vision",
]


# ---------------------------------------------------------------------------------------------------------------
# EESD: expert-ensemble self-distillation
# ---------------------------------------------------------------------------------------------------------------
def _router_probs(layer, x2d):
    logits = layer.router.logits(x2d)  # z = W_r x   [T, E]
    return torch.softmax(logits.float(), dim=-1)  # g_i(x) over all E experts   [T, E]


def _expert_out(layer, e, x2d):
    ex = _experts_module(layer)
    if hasattr(ex, "forward_expert"):
        return ex.forward_expert(e, x2d)
    raise ValueError("experts module has no forward_expert(e, x)")


def dense_ensemble(layer, x2d: torch.Tensor) -> torch.Tensor:
    """Teacher ``y_ens(x) = sum_{i=1}^{E} g_i(x) E_i(x)`` over *all* experts (poster EESD)   [T, d]."""
    p = _router_probs(layer, x2d)  # [T, E]
    y = torch.zeros_like(x2d)
    for e in range(p.shape[1]):
        y = y + p[:, e:e + 1].to(x2d.dtype) * _expert_out(layer, e, x2d)  # g_i^ema(x) E_i^ema(x)   [T, d]
    return y


class EESD:
    """Expert-ensemble self-distillation (poster 002, "EESD"; notebook 03).

    ``L_EESD = 1/T sum_x || sg(y_ens(x)) - y_MoE(x) ||_2^2`` at each MoE layer, summed over layers, where
    ``y_MoE`` is the layer's own sparse top-k output (student) and ``y_ens`` the dense ensemble of all experts of an
    EMA copy of that layer, weighted by the EMA router's softmax probabilities (teacher), evaluated on the same input
    ``x``. The teacher is under ``no_grad`` (the stop-gradient); only MoE layers are copied (the teacher needs
    nothing else). ``update()`` does the EMA step ``theta_ema <- decay * theta_ema + (1 - decay) * theta``; call it
    after every optimiser step (trainer hook ``after_step``). Padding tokens are included (the MoE layer sees them too).
    """

    def __init__(self, model: nn.Module, decay: float = 0.99, weight: float = 1.0, layers=None):
        if not (0 <= decay < 1):
            raise ValueError(f"EMA decay must be in [0, 1), got {decay!r}")
        if weight < 0:
            raise ValueError(f"EESD weight must be >= 0, got {weight!r}")
        if layers is None:
            from moelab.core import moe_layers
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


# ---------------------------------------------------------------------------------------------------------------
# Analyses (poster "Analysis" panels 1-4)
# ---------------------------------------------------------------------------------------------------------------
def routing_entropy(router_logits: torch.Tensor, normalise: bool = True) -> float:
    """Mean per-token entropy of ``softmax(router_logits)`` [T, E], divided by ``log E`` when ``normalise`` (panel 3)."""
    p = torch.softmax(router_logits.float(), -1)
    h = -(p * torch.log(p.clamp_min(1e-12))).sum(-1).mean()
    return float(h / math.log(p.shape[-1])) if normalise else float(h)


def expert_utilisation(indices: torch.Tensor, num_experts: int) -> np.ndarray:
    """Fraction of the top-k assignments [T, k] that go to each expert (panel 4): ``[E]``, sums to 1."""
    c = torch.bincount(indices.reshape(-1).long(), minlength=num_experts).double()
    if len(c) > num_experts:
        raise ValueError(f"expert index {len(c) - 1} >= num_experts={num_experts}")
    return (c / c.sum()).numpy()


def relative_compactness(x: torch.Tensor, assign: torch.Tensor, num_experts: int) -> float:
    """Within-expert scatter over total scatter of unit-normalised layer inputs (panel 1; our precise reading).

    ``RC = sum_i sum_{x in C_i} ||x^ - m_i||^2 / sum_x ||x^ - m||^2`` with ``x^ = x/||x||``, ``C_i`` the tokens whose
    top-1 expert is ``i``, ``m_i`` their mean and ``m`` the overall mean. RC is 1 when routing is unrelated to the
    token geometry and falls towards 0 as each expert's tokens occupy a compact region of their own ("more
    disentangled expert subspaces", lower is better). Empty experts contribute nothing.
    """
    xn = F.normalize(x.float().reshape(-1, x.shape[-1]), dim=-1)
    a = assign.reshape(-1).long()
    if len(a) != len(xn):
        raise ValueError(f"assign has {len(a)} entries for {len(xn)} tokens")
    total = ((xn - xn.mean(0)) ** 2).sum()
    sums = torch.zeros(num_experts, xn.shape[1]).index_add_(0, a, xn)
    cnt = torch.bincount(a, minlength=num_experts).clamp_min(1)[:, None].float()
    means = sums / cnt
    within = ((xn - means[a]) ** 2).sum()
    return float(within / total)


# ---------------------------------------------------------------------------------------------------------------
# Paper profile: CLIP ViT-B in open_clip's checkpoint format
# ---------------------------------------------------------------------------------------------------------------
def load_openclip_mlps(path, tower: str = "visual") -> dict:
    """MLP weights of an open_clip checkpoint (paper profile: CLIP ViT-B/32, B/16; notebook 03).

    ``path``: a local ``open_clip_pytorch_model.bin`` / ``.pt`` (torch state dict, optionally under ``state_dict``)
    or ``.safetensors``. Keys read: ``{visual.}transformer.resblocks.{i}.mlp.c_fc.{weight,bias}`` and
    ``...mlp.c_proj.{weight,bias}``. Missing file -> :class:`moelab.assets.MissingAsset`; no MLP keys -> ValueError.
    Returns ``{block index: dict(w_in [f, d], b_in, w_out [d, f], b_out)}``.
    """
    from pathlib import Path
    from moelab.assets import MissingAsset

    if path is None or not Path(path).is_file():
        raise MissingAsset("CLIP ViT-B (open_clip checkpoint)", f"no file at {str(path)!r}",
                           command=paper_input_hint("03", "CLIP_PATH", "open_clip_pytorch_model.bin of CLIP ViT-B-32 or "
                                                    "ViT-B-16"))
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        sd = load_file(str(path))
    else:
        sd = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(sd, dict) and "state_dict" in sd:
            sd = sd["state_dict"]
    sd = {k.removeprefix("module."): v for k, v in sd.items()}
    prefix = "visual.transformer.resblocks." if tower == "visual" else "transformer.resblocks."
    blocks: dict[int, dict] = {}
    for k, v in sd.items():
        if not k.startswith(prefix) or ".mlp." not in k:
            continue
        i = int(k[len(prefix):].split(".")[0])
        leaf = k.split(".mlp.")[1]
        name = {"c_fc.weight": "w_in", "c_fc.bias": "b_in", "c_proj.weight": "w_out", "c_proj.bias": "b_out"}.get(leaf)
        if name:
            blocks.setdefault(i, {})[name] = v
    if not blocks:
        raise ValueError(f"{path}: no '{prefix}<i>.mlp.c_fc/c_proj' keys: not an open_clip CLIP checkpoint")
    for i, b in blocks.items():
        if {"w_in", "w_out"} - set(b):
            raise ValueError(f"{path}: block {i} lacks c_fc or c_proj weights")
    return dict(sorted(blocks.items()))


def upcycle_openclip_mlps(blocks: dict, calib: dict, num_experts: int = 8, layers: str = "every_other",
                          energy: float = 0.95, seed: int = 0) -> dict:
    """Cluster-aware expert and router weights for open_clip MLP blocks (paper profile; notebook 03).

    ``blocks`` from :func:`load_openclip_mlps`; ``calib[i]`` [T, d] the FFN inputs of block ``i`` (``ln_2`` outputs).
    ``layers="every_other"`` converts blocks 1, 3, 5, ... (the poster's "every other FFN"). Returns, per converted
    block, ``dict(w_in [E, f, d], b_in [E, f], w_out [E, d, f], b_out [E, d], router [E, d], ranks)``.
    """
    idx = sorted(blocks)
    chosen = idx[1::2] if layers == "every_other" else list(layers)
    out = {}
    for i in chosen:
        if i not in calib:
            raise ValueError(f"no calibration activations for block {i}")
        b = blocks[i]
        km = spherical_kmeans(calib[i].float(), num_experts, seed=seed)
        W, res = cluster_aware_expert_weights(b["w_in"].float(), calib[i].float(), km.labels, num_experts, energy,
                                              layer_name=f"resblock {i}")
        E = num_experts
        out[i] = dict(w_in=W, w_out=b["w_out"].float().expand(E, -1, -1).clone(),
                      b_in=None if b.get("b_in") is None else b["b_in"].float().expand(E, -1).clone(),
                      b_out=None if b.get("b_out") is None else b["b_out"].float().expand(E, -1).clone(),
                      router=km.centroids, ranks=[r.rank for r in res])
    return out


# ---------------------------------------------------------------------------------------------------------------
# Text experiment: all-MiniLM-L6-v2 upcycled, continued contrastive training (notebook 03, main comparison)
# ---------------------------------------------------------------------------------------------------------------
METHODS = {
    # name: (MoE?, initialiser, EESD?)
    "dense": (False, None, False),  # the pretrained dense model, no further training
    "dense_long": (False, None, False),  # dense, trained as long as the MoE models
    "sparse": (True, "sparse", False),  # sparse upcycling (copies, random router)
    "noise": (True, "noise", False),  # noise-injected copies
    "drop": (True, "drop", False),  # Drop-Upcycling (50% re-initialised)
    "cluster": (True, "cluster", False),  # cluster-aware init only (ablation)
    "sparse_eesd": (True, "sparse", True),  # EESD only (ablation)
    "cluster_eesd": (True, "cluster", True),  # cluster-aware upcycling (init + EESD): the paper's method
}


def _features(st, texts, max_len):
    st.max_seq_length = max_len
    return dict(st.tokenize(list(texts)))


class PairBatches(torch.utils.data.Dataset):
    """Index dataset over (anchor, positive) pairs; :meth:`collate` tokenises anchors and positives together
    (one forward of 2B sentences per step, so routing statistics and aux losses cover both)."""

    def __init__(self, st, pairs, max_len: int = 32):
        if not pairs:
            raise ValueError("no training pairs")
        self.st, self.pairs, self.max_len = st, list(pairs), max_len

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, i):
        return self.pairs[i]

    def collate(self, items):
        a, p = zip(*items)
        feats = _features(self.st, list(a) + list(p), self.max_len)
        feats["n_pairs"] = len(a)
        return feats


def infonce_loss(emb: torch.Tensor, n: int, scale: float = 20.0) -> torch.Tensor:
    """In-batch InfoNCE = sentence-transformers' MultipleNegativesRankingLoss (cosine, scale 20, anchor -> positive):
    ``L = CE(scale * cos(a_i, p_j), j=i)``. ``emb`` [2n, h] = anchors then positives. Written out because the batch
    carries anchors and positives in one forward (MNRL encodes them in two)."""
    a = F.normalize(emb[:n], dim=-1)
    p = F.normalize(emb[n:], dim=-1)
    scores = scale * a @ p.T  # [n, n]
    return F.cross_entropy(scores, torch.arange(n, device=emb.device))


def _moe_entropy(model, mask) -> float | None:
    from moelab.core import moe_layers

    hs = []
    for layer in moe_layers(model):
        z = layer.last_router_logits
        if z is None:
            continue
        m = mask.reshape(-1).bool() if mask is not None and mask.numel() == z.shape[0] else None
        hs.append(routing_entropy(z[m] if m is not None else z))
    return float(np.mean(hs)) if hs else None


def _moe_terms(model, loss, metrics: dict, aux_coef: float, eesd: "EESD | None", mask=None):
    """Add ``aux_coef`` * balancing loss (+ EESD) to ``loss`` and their values to ``metrics`` (text and vision).
    ``metrics["task_loss"]`` keeps the task loss alone, whose router gradient the trainer logs (issue 15, item 1)."""
    from moelab.core import aux_loss, moe_layers

    metrics["task_loss"] = loss
    if moe_layers(model):
        bal = aux_loss(model)
        loss = loss + aux_coef * bal
        metrics["balance"] = bal.detach()
        metrics["routing_entropy"] = _moe_entropy(model, mask)
    if eesd is not None:
        le = eesd.loss()
        loss = loss + le
        metrics["eesd"] = le.detach()
    return loss, metrics


def make_loss_fn(aux_coef: float = 0.01, eesd: EESD | None = None):
    """``loss_fn(model, batch)`` for :func:`moelab.train.train`: InfoNCE + aux_coef * balancing loss (+ EESD)."""

    def loss_fn(model, batch):
        batch = dict(batch)
        n = batch.pop("n_pairs")
        out = model(batch)
        loss = infonce_loss(out["sentence_embedding"], n)
        return _moe_terms(model, loss, {"infonce": loss.detach()}, aux_coef, eesd, batch.get("attention_mask"))

    return loss_fn


def calibration_inputs(st, texts, layers="every_other", max_tokens: int = 8192, max_len: int = 32, batch: int = 64):
    """FFN inputs x [T, d] of the dense MiniLM at the layers to be converted (padding dropped), via the core's
    streamed :func:`moelab.core.collect_ffn_inputs` (poster Step 1's "collect FFN input activations X")."""
    from moelab.core import collect_ffn_inputs

    bert = st[0].auto_model
    batches = (_features(st, texts[i:i + batch], max_len) for i in range(0, len(texts), batch))
    return collect_ffn_inputs(bert, batches, layers=layers, max_tokens=max_tokens)


def upcycle(backbone: nn.Module, method: str, calib: dict | None, seed: int, num_experts: int = 8, top_k: int = 2,
            energy: float = 0.95, project: str = "in"):
    """Convert every other FFN of the transformers model ``backbone`` in place per ``method`` (see :data:`METHODS`;
    renormalised top-k); returns the :class:`ClusterAwareInit` (for its log) or None. Text and vision (notebook 03)."""
    from moelab.core import moeify
    from moelab.core.init import drop_init, noise_init

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {list(METHODS)}")
    is_moe, init, _ = METHODS[method]
    if not is_moe:
        return None
    ci = ClusterAwareInit(energy=energy, project=project, seed=seed) if init == "cluster" else None
    hook = ci or {"sparse": "sparse", "noise": noise_init(seed=seed), "drop": drop_init(seed=seed)}[init]
    moeify(backbone, "every_other", num_experts, top_k, init=hook, calib_inputs=calib if ci else None,
           renormalize=top_k > 1)                          # top-1: Switch's raw probability (issue 15)
    return ci


def build_model(st_dense, method: str, calib: dict | None, seed: int, num_experts: int = 8, top_k: int = 2,
                energy: float = 0.95, project: str = "in"):
    """A fresh copy of the dense sentence encoder, converted per ``method`` (see :data:`METHODS`); returns
    ``(model, cluster_init or None)``. Every other FFN -> MoE (layers 1, 3, 5), renormalised top-k."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {list(METHODS)}")
    torch.manual_seed(seed)
    model = copy.deepcopy(st_dense)
    return model, upcycle(model[0].auto_model, method, calib, seed, num_experts, top_k, energy, project)


def trainable_ffn_params(model) -> list:
    """Only the converted FFN sites train (MoE experts + routers; for dense models the same layers' FFN), for
    a fair and CPU-affordable comparison; everything else stays frozen."""
    from moelab.core.convert import ffn_sites

    sites = ffn_sites(model[0].auto_model)
    keep = set()
    for s in sites[1::2]:
        mods = [s.layer.output.dense] + ([] if isinstance(s.layer.intermediate, nn.Identity) or
                                         not hasattr(s.layer.intermediate, "dense") else [s.layer.intermediate.dense])
        for m in mods:
            keep.update(id(p) for p in m.parameters())
    params = []
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)
        if id(p) in keep:
            params.append(p)
    return params


@torch.no_grad()
def encode(model, texts, batch_size: int = 128, max_len: int = 32) -> torch.Tensor:
    """L2-normalised sentence embeddings [N, h] (mean pooling + Normalize, as all-MiniLM-L6-v2)."""
    model.eval()
    model.max_seq_length = max_len
    return model.encode(list(texts), batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=True,
                        show_progress_bar=False).float().cpu()


def retrieval_r1(model, pairs, max_len: int = 32) -> dict:
    """Recall@1 both ways on held-out pairs (the MSCOCO I->T / T->I analogue): per-item 0/1 arrays."""
    a = encode(model, [x for x, _ in pairs], max_len=max_len)
    p = encode(model, [y for _, y in pairs], max_len=max_len)
    s = a @ p.T  # cosine similarities [N, N]
    idx = torch.arange(len(pairs))
    return {"a2p": (s.argmax(1) == idx).float().numpy(), "p2a": (s.argmax(0) == idx).float().numpy()}


@torch.no_grad()
def moe_analyses(model, texts, max_len: int = 32) -> dict:
    """The poster's analysis panels on held-out sentences, per MoE layer: relative compactness (panel 1), expert
    parameter similarity (2), routing entropy (3), expert utilisation (4). Padding tokens excluded."""
    from moelab.core import moe_layers

    layers = moe_layers(model)
    if not layers:
        return {}
    store = {i: [] for i in range(len(layers))}
    hooks = [l.register_forward_hook(lambda m, a, o, i=i: store[i].append(a[0].reshape(-1, a[0].shape[-1])))
             for i, l in enumerate(layers)]
    xs, logits, mask = {i: [] for i in store}, {i: [] for i in store}, []
    model.eval()
    try:
        for j in range(0, len(texts), 64):
            feats = _features(model, texts[j:j + 64], max_len)
            model(feats)
            m = feats["attention_mask"].reshape(-1).bool()
            for i, l in enumerate(layers):
                xs[i].append(store[i].pop()[m])
                logits[i].append(l.last_router_logits[m])
    finally:
        for h in hooks:
            h.remove()
    out = {"relative_compactness": [], "expert_similarity": [], "routing_entropy": [], "utilisation": []}
    for i, l in enumerate(layers):
        x, z = torch.cat(xs[i]), torch.cat(logits[i])
        E = z.shape[1]
        top = z.topk(l.top_k, dim=-1).indices
        out["relative_compactness"].append(relative_compactness(x, top[:, 0], E))
        out["expert_similarity"].append(expert_similarity(l))
        out["routing_entropy"].append(routing_entropy(z))
        out["utilisation"].append(expert_utilisation(top, E))
    return out


def run_text_condition(st_dense, method: str, seed: int, train_pairs, test_pairs, probe_texts, calib, *,
                       steps: int, batch_size: int = 16, lr: float = 1e-4, max_len: int = 32, energy: float = 0.95,
                       eesd_decay: float = 0.95, eesd_weight: float = 0.1, aux_coef: float = 0.01,
                       benchmarks=None, num_experts: int = 8, top_k: int = 2) -> dict:
    """One cell of the zero-shot table analogue (notebook 03): build, (train), evaluate, analyse.

    Returns plain data: per-item R@1 both ways, suite benchmark scores, training history (with routing entropy per
    step), analyses at initialisation and after training, the cluster-aware init log.
    """
    from moelab.train import TrainConfig, train
    from moelab.seed import seed_everything

    seed_everything(seed)
    model, ci = build_model(st_dense, method, calib, seed, num_experts, top_k, energy)
    res = {"method": method, "seed": seed, "init_log": ci.log if ci else None}
    res["analysis_init"] = moe_analyses(model, probe_texts, max_len)
    hist = None
    if method != "dense":
        params = trainable_ffn_params(model)
        eesd = EESD(model, decay=eesd_decay, weight=eesd_weight) if METHODS[method][2] else None
        ds = PairBatches(model, train_pairs, max_len)
        g = torch.Generator().manual_seed(seed)
        loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, drop_last=True,
                                             collate_fn=ds.collate, generator=g)
        cfg = TrainConfig(lr=lr, steps=steps, warmup_frac=0.1, decay="linear", seed=seed, log_every=5,
                          max_grad_norm=1.0, desc=f"{method} s{seed}")
        hooks = {"after_step": (lambda step, m: eesd.update())} if eesd else None
        out = train(model, loader, loss_fn=make_loss_fn(aux_coef, eesd), cfg=cfg, hooks=hooks,
                    param_groups=[{"params": params, "weight_decay": 0.0}])
        model, hist = out.model, out.history
        if eesd:
            eesd.remove()
    res["history"] = hist
    res["analysis"] = moe_analyses(model, probe_texts, max_len)
    res["r1"] = retrieval_r1(model, test_pairs, max_len)
    if benchmarks is not None:
        from moelab.suite import embed
        res["benchmarks"] = embed.evaluate(lambda t: encode(model, t, max_len=max_len).numpy(), benchmarks)
    return res


def cached_calibration(st, texts, max_tokens: int, max_len: int = 32) -> dict:
    """:func:`calibration_inputs` through ``moelab.cache.memo`` (keyed by the texts, token budget and length)."""
    from moelab import cache

    cfg = {"model": "all-MiniLM-L6-v2", "texts": cache.key(list(texts)), "n": len(texts), "max_tokens": max_tokens,
           "max_len": max_len, "layers": "every_other"}
    return cache.memo("03_minilm_ffn_inputs", cfg, lambda: calibration_inputs(st, texts, max_tokens=max_tokens,
                                                                              max_len=max_len))


def text_experiment(st, pairs: dict, methods, seeds, *, calib_texts: int, calib_tokens: int, n_test: int,
                    n_probe: int, benchmarks=None, bench_all_seeds: bool = True, use_cache: bool = True,
                    **kw) -> list[dict]:
    """Every (method, seed) cell of notebook 03's text experiment, each cached by its configuration.

    ``pairs``: ``moelab.suite.embed.pairs(profile)`` (train / test splits). Calibration sentences are the first
    ``calib_texts`` training anchors and positives; evaluation uses the first ``n_test`` test pairs and the analyses
    ``n_probe`` test anchors (never trained on). The untrained ``"dense"`` model runs once (first seed); suite
    benchmarks run for every seed or, with ``bench_all_seeds=False``, the first only. ``kw`` go to
    :func:`run_text_condition`.
    """
    from moelab import cache

    train_pairs, test_pairs = list(pairs["train"]), list(pairs["test"])[:n_test]
    if len(test_pairs) < 2:
        raise ValueError(f"need at least 2 test pairs, got {len(test_pairs)}")
    texts = [t for ab in train_pairs[:calib_texts] for t in ab]
    calib = cached_calibration(st, texts, calib_tokens, kw.get("max_len", 32))
    probe = [a for a, _ in test_pairs[:n_probe]]
    data_key = cache.key([train_pairs, test_pairs])
    out = []
    cells = [(m, s) for m in methods for s in (seeds[:1] if m == "dense" else seeds)]  # untrained dense: no seed
    for method, seed in progress.bar(cells, desc="03 text cells", unit="cell"):
        bench = benchmarks if (benchmarks is not None and (bench_all_seeds or seed == seeds[0])) else None
        cfg = {"method": method, "seed": seed, "data": data_key, "calib_texts": calib_texts,
               "calib_tokens": calib_tokens, "n_probe": n_probe,
               "benchmarks": None if bench is None else sorted(bench), **kw}

        def compute(method=method, seed=seed, bench=bench):
            return run_text_condition(st, method, seed, train_pairs, test_pairs, probe, calib,
                                      benchmarks=bench, **kw)

        out.append(cache.memo("03_text_condition", cfg, compute) if use_cache else compute())
    return out


# ---------------------------------------------------------------------------------------------------------------
# Tidy tables from the experiment's results (notebook 03)
# ---------------------------------------------------------------------------------------------------------------
def r1_table(results) -> "pd.DataFrame":
    """Per (method, seed): R@1 anchor->positive, positive->anchor and their average, in percent."""
    import pandas as pd

    rows = [{"method": r["method"], "seed": r["seed"], "r1_a2p": 100 * r["r1"]["a2p"].mean(),
             "r1_p2a": 100 * r["r1"]["p2a"].mean(), "r1_avg": 50 * (r["r1"]["a2p"].mean() + r["r1"]["p2a"].mean())}
            for r in results]
    return pd.DataFrame(rows)


def per_item_r1(results, method: str) -> np.ndarray:
    """[seeds, items] average of both directions' 0/1 hits (for ``run.claims.effect``), seeds in order."""
    rs = sorted((r for r in results if r["method"] == method), key=lambda r: r["seed"])
    if not rs:
        raise ValueError(f"no results for method {method!r}")
    return np.stack([(r["r1"]["a2p"] + r["r1"]["p2a"]) / 2 for r in rs])


def benchmark_table(results) -> "pd.DataFrame":
    """Mean suite benchmark score per (method, seed, benchmark[, metric])."""
    import pandas as pd

    frames = []
    for r in results:
        df = r.get("benchmarks")
        if df is None or len(df) == 0:
            continue
        keys = [c for c in ("benchmark", "task", "name", "metric") if c in df.columns]
        g = df.groupby(keys, as_index=False)["score"].mean() if keys else pd.DataFrame({"score": [df["score"].mean()]})
        g.insert(0, "seed", r["seed"])
        g.insert(0, "method", r["method"])
        frames.append(g)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def analysis_table(results) -> "pd.DataFrame":
    """Panels 1, 2 and final routing entropy per (method, seed, when, moe layer), plus utilisation balance
    (normalised entropy of the utilisation distribution; 1 = perfectly balanced) and max share."""
    import pandas as pd

    rows = []
    for r in results:
        for when in ("init", "final"):
            a = r["analysis_init"] if when == "init" else r["analysis"]
            for li in range(len(a.get("relative_compactness", []))):
                u = np.asarray(a["utilisation"][li])
                nz = u[u > 0]
                rows.append({"method": r["method"], "seed": r["seed"], "when": when, "moe_layer": li,
                             "relative_compactness": a["relative_compactness"][li],
                             "expert_similarity": a["expert_similarity"][li],
                             "routing_entropy": a["routing_entropy"][li],
                             "utilisation_balance": float(-(nz * np.log(nz)).sum() / np.log(len(u))),
                             "max_share": float(u.max())})
    return pd.DataFrame(rows)


def utilisation_table(results) -> "pd.DataFrame":
    """Final share of top-k assignments per (method, seed, moe layer, expert)."""
    import pandas as pd

    rows = [{"method": r["method"], "seed": r["seed"], "moe_layer": li, "expert": e, "share": float(s)}
            for r in results for li, u in enumerate(r["analysis"].get("utilisation", [])) for e, s in enumerate(u)]
    return pd.DataFrame(rows)


def entropy_history(results) -> "pd.DataFrame":
    """Routing entropy (normalised, mean over MoE layers) per training step, per (method, seed), with the router's
    task-loss gradient norm at the steps where the trainer logged it (issue 15, item 1)."""
    import pandas as pd

    frames = []
    for r in results:
        h = r.get("history")
        if h is None or "routing_entropy" not in h:
            continue
        frames.append(pd.DataFrame({"method": r["method"], "seed": r["seed"], "step": h["step"],
                                    "routing_entropy": h["routing_entropy"],
                                    "router_grad_norm": h["router_grad_norm"] if "router_grad_norm" in h else np.nan}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def init_table(results) -> "pd.DataFrame":
    """Cluster-aware init diagnostics per (seed, moe layer, expert): cluster size, rank r_i, energy kept, jitter."""
    import pandas as pd

    rows = []
    for r in results:
        for rec in r.get("init_log") or []:
            for e, size in enumerate(rec["sizes"]):
                rows.append({"method": r["method"], "seed": r["seed"], "moe_layer": rec["layer"], "expert": e,
                             "cluster_size": size, "rank": rec["ranks"][e] if rec["ranks"] else None,
                             "energy_kept": rec["energy_kept"][e] if rec["energy_kept"] else None,
                             "rel_err_own_cluster": rec["rel_err"][e] if rec["rel_err"] else None,
                             "jitter": rec["jitter"][e] if rec["jitter"] else None})
    return pd.DataFrame(rows)


def plot_analysis_panels(analysis, entropy, utilisation, methods=None):
    """The poster's four analysis panels from the tidy tables (notebook 03): relative compactness, expert
    similarity (final, mean over layers, one dot per seed), routing entropy over steps, final expert utilisation."""
    import matplotlib.pyplot as plt

    fin = analysis[analysis["when"] == "final"]
    methods = methods or list(dict.fromkeys(fin["method"]))
    fig, ax = plt.subplots(1, 4, figsize=(17, 3.6))
    for j, col in enumerate(("relative_compactness", "expert_similarity")):
        per = fin.groupby(["method", "seed"], as_index=False)[col].mean()
        for i, m in enumerate(methods):
            v = per[per["method"] == m][col]
            ax[j].scatter([i] * len(v), v, s=18)
            ax[j].bar(i, v.mean(), alpha=0.35)
        ax[j].set_xticks(range(len(methods)), methods, rotation=30, ha="right")
        ax[j].set_title(col.replace("_", " ") + " (lower = more specialised)")
    if len(entropy):
        for m in methods:
            e = entropy[entropy["method"] == m].groupby("step")["routing_entropy"].mean()
            if len(e):
                ax[2].plot(e.index, e.values, label=m)
        ax[2].legend(fontsize=7)
    ax[2].set(title="routing entropy / log E (train batches)", xlabel="step")
    u = utilisation.groupby(["method", "expert"])["share"].mean().unstack("expert")
    u = u.reindex([m for m in methods if m in u.index])
    w = 0.8 / max(1, len(u))
    for i, (m, row) in enumerate(u.iterrows()):
        ax[3].bar(np.arange(len(row)) + i * w, row.values, width=w, label=m)
    ax[3].axhline(1 / max(1, u.shape[1]), color="k", lw=0.8, ls="--")
    ax[3].set(title="expert utilisation (final, mean over layers, seeds)", xlabel="expert")
    ax[3].legend(fontsize=7)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------------------------
# Vision experiment (poster "Implementation Details" and "Few-shot and Full Fine-tuning" on CLIP ViT; notebook 03)
# A small ViT pretrained here on real Fashion-MNIST stands in for the dense CLIP ViT-B (no CLIP weights here).
# ---------------------------------------------------------------------------------------------------------------
VIT_SMALL = dict(image_size=28, patch_size=7, num_channels=1, hidden_size=128, num_hidden_layers=6,
                 num_attention_heads=4, intermediate_size=512, num_labels=10)
VISION_METHODS = ("dense", "dense_long", "sparse", "noise", "drop", "cluster_eesd")
VISION_COLUMNS = {"items": ["method", "seed", "task", "item", "score"],
                  "accuracy": ["method", "seed", "task", "accuracy"]}


def to_pixels(x) -> torch.Tensor:
    """uint8 grey images [N, 28, 28] -> ``pixel_values`` [N, 1, 28, 28] in [-1, 1] (``(x/255 - 0.5)/0.5``, the
    mean/std that transformers' ``ViTImageProcessor`` uses by default)."""
    x = torch.as_tensor(np.asarray(x))
    if x.ndim != 3 or x.dtype != torch.uint8:
        raise ValueError(f"expected uint8 images [N, H, W], got {x.dtype} {tuple(x.shape)}")
    return (x.float()[:, None] / 255.0 - 0.5) / 0.5


def cifar_to_grey28(x_rgb) -> np.ndarray:
    """CIFAR-10 uint8 [N, 32, 32, 3] -> uint8 [N, 28, 28]: Pillow's ``convert("L")`` (ITU-R 601-2 luma) then a
    bilinear resize to 28x28, so the Fashion-MNIST ViT can read them (notebook 03's few-shot probes)."""
    from PIL import Image

    x_rgb = np.asarray(x_rgb)
    if x_rgb.ndim != 4 or x_rgb.shape[-1] != 3 or x_rgb.dtype != np.uint8:
        raise ValueError(f"expected uint8 RGB images [N, H, W, 3], got {x_rgb.dtype} {x_rgb.shape}")
    return np.stack([np.asarray(Image.fromarray(im).convert("L").resize((28, 28), Image.BILINEAR)) for im in x_rgb])


def make_vit(vit: dict, seed: int):
    """A randomly initialised ``transformers.ViTForImageClassification`` from the settings ``vit`` (e.g.
    :data:`VIT_SMALL`); it is then pretrained here on real Fashion-MNIST (:func:`pretrain_vit`)."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    return ViTForImageClassification(ViTConfig(**vit)).eval()


def image_loader(x, y, batch_size: int, seed: int):
    """Shuffled, seeded ``DataLoader`` of ``dict(pixel_values [B,1,28,28], labels [B])`` over uint8 images."""
    if len(x) < batch_size:
        raise ValueError(f"batch_size={batch_size} exceeds the {len(x)} training images")
    ds = torch.utils.data.TensorDataset(torch.as_tensor(np.asarray(x)), torch.as_tensor(np.asarray(y)))
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, drop_last=True,
                                       generator=torch.Generator().manual_seed(seed),
                                       collate_fn=lambda b: {"pixel_values": to_pixels(torch.stack([i[0] for i in b])),
                                                             "labels": torch.stack([i[1] for i in b])})


def make_cls_loss_fn(aux_coef: float = 0.01, eesd: EESD | None = None):
    """``loss_fn(model, batch)``: cross-entropy of the ViT's logits + aux_coef * balancing loss (+ EESD)."""

    def loss_fn(model, batch):
        logits = model(pixel_values=batch["pixel_values"]).logits
        loss = F.cross_entropy(logits, batch["labels"])
        return _moe_terms(model, loss, {"ce": loss.detach()}, aux_coef, eesd)

    return loss_fn


def train_classifier(model, x, y, *, steps: int, batch_size: int, lr: float, seed: int, aux_coef: float = 0.01,
                     eesd: EESD | None = None, weight_decay: float = 0.0, desc: str = "vit"):
    """All parameters of the ViT trained with cross-entropy through :func:`moelab.train.train` (AdamW, 10% warmup,
    cosine decay, clip 1.0); EESD's EMA teachers are updated after every step. Returns the ``TrainResult``."""
    from moelab.train import TrainConfig, train

    cfg = TrainConfig(lr=lr, steps=steps, warmup_frac=0.1, decay="cosine", seed=seed, log_every=10,
                      max_grad_norm=1.0, weight_decay=weight_decay, desc=desc)
    hooks = {"after_step": (lambda step, m: eesd.update())} if eesd else None
    return train(model, image_loader(x, y, batch_size, seed), loss_fn=make_cls_loss_fn(aux_coef, eesd), cfg=cfg,
                 hooks=hooks)


@torch.no_grad()
def vit_outputs(model, x, batch_size: int = 500) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits [N, C], features [N, d])``; features = the final-LayerNorm CLS token, i.e. the pooled
    representation the classifier head reads (what the linear probes use)."""
    model.eval()
    dev = next(model.parameters()).device
    logits, feats = [], []
    for i in range(0, len(x), batch_size):
        h = model.vit(pixel_values=to_pixels(x[i:i + batch_size]).to(dev)).last_hidden_state[:, 0]  # [B, d]
        feats.append(h.cpu())
        logits.append(model.classifier(h).cpu())
    return torch.cat(logits), torch.cat(feats)


def pretrain_vit(cfg: dict, seed: int):
    """The dense model: :func:`make_vit` trained on the Fashion-MNIST training images of ``cfg["data_profile"]``
    (``cfg["pretrain_steps"]`` steps of ``cfg["pretrain_batch"]``, lr ``cfg["pretrain_lr"]``, weight decay 0.05),
    cached with ``moelab.cache.artifact`` (keyed by these settings). Returns ``(model, info)``; ``info``: steps,
    images seen, epochs, seconds per step, Fashion-MNIST test accuracy, final training loss (notebook 03)."""
    import json
    from moelab import cache
    from moelab.suite import images
    from transformers import ViTForImageClassification

    key = {k: cfg[k] for k in ("vit", "data_profile", "pretrain_steps", "pretrain_batch", "pretrain_lr")}

    def build(tmp):
        data = images.fashion_mnist(cfg["data_profile"])
        model = make_vit(cfg["vit"], seed)
        out = train_classifier(model, data["train_x"], data["train_y"], steps=cfg["pretrain_steps"],
                               batch_size=cfg["pretrain_batch"], lr=cfg["pretrain_lr"], seed=seed,
                               weight_decay=0.05, desc="pretrain ViT")
        logits, _ = vit_outputs(out.model, data["test_x"])
        seen = cfg["pretrain_steps"] * cfg["pretrain_batch"]
        info = dict(steps=cfg["pretrain_steps"], images_seen=seen, epochs=seen / len(data["train_y"]),
                    s_per_step=out.wall_s / cfg["pretrain_steps"], final_loss=float(out.history["loss"].iloc[-5:].mean()),
                    test_accuracy=100 * float((logits.argmax(1).numpy() == data["test_y"]).mean()))
        out.model.save_pretrained(tmp)
        (tmp / "pretrain_info.json").write_text(json.dumps(info))

    path = cache.artifact("03_vit_fashion_mnist", {**key, "seed": seed}, build)
    model = ViTForImageClassification.from_pretrained(path).eval()
    return model, json.loads((path / "pretrain_info.json").read_text())


def vit_calibration(model, x, cfg: dict, model_key: str) -> dict:
    """FFN inputs ``{layer: [T, d]}`` of the dense ViT (every other layer; CLS and patch tokens) over the first
    ``cfg["calib_images"]`` training images, at most ``cfg["calib_tokens"]`` per layer, cached by ``moelab.cache.memo``
    (poster Step 1's "collect FFN input activations X")."""
    import hashlib
    from moelab import cache
    from moelab.core import collect_ffn_inputs

    n, bs = cfg["calib_images"], 128
    batches = ({"pixel_values": to_pixels(x[i:i + bs])} for i in range(0, n, bs))
    key = {"model": model_key, "images": hashlib.sha256(np.ascontiguousarray(x[:n]).tobytes()).hexdigest()[:16], "n": n,
           "max_tokens": cfg["calib_tokens"], "layers": "every_other"}
    return cache.memo("03_vit_ffn_inputs", key, lambda: collect_ffn_inputs(model, batches, layers="every_other",
                                                                            max_tokens=cfg["calib_tokens"]))


def few_shot_indices(y, k: int, seed) -> np.ndarray:
    """Exactly ``k`` indices per class of ``y`` drawn without replacement, deterministic per ``seed`` (an int or a
    sequence for ``numpy.random.default_rng``); ``ValueError`` naming a class with fewer than ``k`` examples."""
    y = np.asarray(y)
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    rng = np.random.default_rng(seed)
    out = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        if len(idx) < k:
            raise ValueError(f"class {c} has {len(idx)} examples, fewer than k={k} shots")
        out.append(rng.choice(idx, size=k, replace=False))
    return np.concatenate(out)


def few_shot_probe(train_feats, train_y, test_feats, test_y, k: int, draws: int, seed: int) -> np.ndarray:
    """Linear probe (scikit-learn ``StandardScaler`` + ``LogisticRegression``, default C=1) on ``k`` shots per class
    of frozen features, ``draws`` independent shot draws (seeded by ``(seed, k, draw)``, the same for every method so
    the comparison is paired). Returns per-test-item accuracy averaged over draws ``[N_test]`` in [0, 1]."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    train_feats, test_feats = np.asarray(train_feats, np.float64), np.asarray(test_feats, np.float64)
    hits = np.zeros(len(test_y))
    for d in range(draws):
        idx = few_shot_indices(train_y, k, [seed, k, d])
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(train_feats[idx], train_y[idx])
        hits += clf.predict(test_feats) == np.asarray(test_y)
    return hits / draws


def finetune_accuracy(model, data: dict, cfg: dict, seed: int) -> np.ndarray:
    """"Full fine-tuning" analogue: a copy of ``model`` with a fresh 10-way head (seeded) is trained end to end on
    the CIFAR training pool (``cfg["ft_steps"]`` x ``cfg["ft_batch"]``, lr ``cfg["ft_lr"]``, balancing loss, no EESD)
    and scored on the evaluation pool. Returns per-item 0/1 correctness."""
    m = copy.deepcopy(model)
    torch.manual_seed(seed)
    m.classifier = nn.Linear(m.classifier.in_features, int(data["cifar_train_y"].max()) + 1)
    out = train_classifier(m, data["cifar_train_x"], data["cifar_train_y"], steps=cfg["ft_steps"],
                           batch_size=cfg["ft_batch"], lr=cfg["ft_lr"], seed=seed, aux_coef=cfg["aux_coef"],
                           desc="fine-tune")
    logits, _ = vit_outputs(out.model, data["cifar_test_x"])
    return (logits.argmax(1).numpy() == data["cifar_test_y"]).astype(float)


def run_vision_condition(vit_dense, method: str, seed: int, data: dict, calib: dict, cfg: dict) -> dict:
    """One (method, seed) cell of notebook 03's vision experiment: upcycle every other FFN of the pretrained ViT
    (``cfg["num_experts"]`` experts, top-``cfg["top_k"]``), continue training on Fashion-MNIST (all parameters;
    EESD when the method has it; ``"dense"`` skips training), then score: Fashion-MNIST test correctness, k-shot
    probes on CIFAR-10 features, and CIFAR-10 fine-tuning. Returns plain data (per-item arrays, history, timings)."""
    import time
    from moelab.seed import seed_everything

    seed_everything(seed)
    model = copy.deepcopy(vit_dense)
    ci = upcycle(model, method, calib, seed, cfg["num_experts"], cfg["top_k"], cfg["energy"])
    res = {"method": method, "seed": seed, "init_log": ci.log if ci else None, "history": None, "timing": []}
    if method != "dense":
        eesd = EESD(model, decay=cfg["eesd_decay"], weight=cfg["eesd_weight"]) if METHODS[method][2] else None
        out = train_classifier(model, data["train_x"], data["train_y"], steps=cfg["steps"],
                               batch_size=cfg["batch_size"], lr=cfg["lr"], seed=seed, aux_coef=cfg["aux_coef"],
                               eesd=eesd, desc=f"{method} s{seed}")
        model, res["history"] = out.model, out.history
        res["timing"].append(("continued_training", cfg["steps"], out.wall_s))
        if eesd:
            eesd.remove()
    t0 = time.perf_counter()
    logits, _ = vit_outputs(model, data["test_x"])
    res["fmnist_test"] = (logits.argmax(1).numpy() == data["test_y"]).astype(float)
    _, f_tr = vit_outputs(model, data["cifar_train_x"])
    _, f_te = vit_outputs(model, data["cifar_test_x"])
    for k in cfg["shots"]:
        res[f"cifar_{k}shot"] = few_shot_probe(f_tr.numpy(), data["cifar_train_y"], f_te.numpy(),
                                               data["cifar_test_y"], k, cfg["probe_draws"], seed)
    res["timing"].append(("evaluation_and_probes", 0, time.perf_counter() - t0))
    if cfg["ft_steps"]:
        t0 = time.perf_counter()
        res["cifar_ft"] = finetune_accuracy(model, data, cfg, seed)
        res["timing"].append(("fine_tuning", cfg["ft_steps"], time.perf_counter() - t0))
    return res


def vision_data(cfg: dict) -> dict:
    """Fashion-MNIST (continued training, test) and CIFAR-10 test images converted to 28x28 grey
    (:func:`cifar_to_grey28`; ``cifar10_test`` splits them into a training pool and an evaluation pool) for
    ``cfg["data_profile"]``'s sizes; ``cfg["n_test"]``, ``cfg["n_cifar_train"]`` and ``cfg["n_cifar_test"]`` (None =
    all) cap the Fashion-MNIST test set and the two CIFAR pools (seeded, class-stratified)."""
    from moelab.suite import images

    fm, cf = images.fashion_mnist(cfg["data_profile"]), images.cifar10_test(cfg["data_profile"])
    te = images.stratified_subset(fm["test_y"], cfg.get("n_test"), 3)
    ctr = images.stratified_subset(cf["train_y"], cfg.get("n_cifar_train"), 4)
    cte = images.stratified_subset(cf["test_y"], cfg.get("n_cifar_test"), 5)
    return dict(train_x=fm["train_x"], train_y=fm["train_y"], test_x=fm["test_x"][te], test_y=fm["test_y"][te],
                cifar_train_x=cifar_to_grey28(cf["train_x"][ctr]), cifar_train_y=cf["train_y"][ctr],
                cifar_test_x=cifar_to_grey28(cf["test_x"][cte]), cifar_test_y=cf["test_y"][cte])


def vision_experiment(methods, seeds, cfg: dict, use_cache: bool = True) -> dict:
    """Notebook 03's vision experiment: the ViT is pretrained once (first seed, cached), its FFN inputs collected once
    (cached), then every (method, seed) cell runs :func:`run_vision_condition` (each cached by its settings; the
    untrained ``"dense"`` model runs with the first seed only).

    ``cfg`` keys: ``vit``, ``data_profile``, ``pretrain_steps``, ``pretrain_batch``, ``pretrain_lr``,
    ``calib_images``, ``calib_tokens``, ``n_test``, ``n_cifar_train``, ``n_cifar_test``, ``steps``, ``batch_size``,
    ``lr``, ``shots``, ``probe_draws``, ``ft_steps``, ``ft_batch``, ``ft_lr``, ``num_experts``, ``top_k``, ``energy``, ``eesd_decay``, ``eesd_weight``,
    ``aux_coef``. Returns tidy DataFrames: ``items`` (method, seed, task, item, score: per-item 0/1, probe scores
    averaged over shot draws), ``accuracy`` (method, seed, task, accuracy in %), ``history`` (per training step),
    ``timing`` (method, seed, phase, steps, wall_s), ``pretrain`` (one row), and the raw ``results`` (init logs for
    :func:`init_table`). Tasks: ``fmnist_test``, ``cifar_{k}shot`` for k in ``shots``, ``cifar_ft``.
    """
    import pandas as pd
    from moelab import cache

    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"unknown vision method(s) {bad}; expected names from {list(METHODS)}")
    if not seeds:
        raise ValueError("vision_experiment needs at least one seed")
    vit, info = pretrain_vit(cfg, seeds[0])
    model_key = cache.key({k: cfg[k] for k in ("vit", "data_profile", "pretrain_steps", "pretrain_batch",
                                                 "pretrain_lr")} | {"seed": seeds[0]})
    data = vision_data(cfg)
    calib = vit_calibration(vit, data["train_x"], cfg, model_key)
    results = []
    cells = [(m, s) for m in methods for s in (seeds[:1] if m == "dense" else seeds)]
    for method, seed in progress.bar(cells, desc="03 vision cells", unit="cell"):
        key = {"model": model_key, "method": method, "seed": seed,
               **{k: v for k, v in cfg.items() if k not in ("vit", "methods", "seeds")}}

        def compute(method=method, seed=seed):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # small clusters get SVD-LLM jitter, by design
                return run_vision_condition(vit, method, seed, data, calib, cfg)

        results.append(cache.memo("03_vit_condition", key, compute) if use_cache else compute())
    tasks = ["fmnist_test"] + [f"cifar_{k}shot" for k in cfg["shots"]] + (["cifar_ft"] if cfg["ft_steps"] else [])
    items = pd.DataFrame([{"method": r["method"], "seed": r["seed"], "task": t, "item": i, "score": float(v)}
                          for r in results for t in tasks for i, v in enumerate(r[t])], columns=VISION_COLUMNS["items"])
    acc = (items.groupby(["method", "seed", "task"], sort=False)["score"].mean() * 100).rename("accuracy").reset_index()
    hist = [r["history"].assign(method=r["method"], seed=r["seed"]) for r in results if r["history"] is not None]
    timing = pd.DataFrame([{"method": r["method"], "seed": r["seed"], "phase": p, "steps": n, "wall_s": w}
                           for r in results for p, n, w in r["timing"]])
    return dict(items=items, accuracy=acc, history=pd.concat(hist, ignore_index=True) if hist else pd.DataFrame(),
                timing=timing, pretrain=pd.DataFrame([info]), results=results)


def per_item_scores(items, method: str, task: str) -> np.ndarray:
    """[seeds, items] scores of one method on one task from ``vision_experiment(...)["items"]`` (for
    ``run.claims.effect``), seeds in order."""
    sub = items[(items["method"] == method) & (items["task"] == task)]
    if sub.empty:
        raise ValueError(f"no scores for method {method!r} on task {task!r}")
    return sub.pivot(index="seed", columns="item", values="score").sort_index().to_numpy()


def vision_table(accuracy) -> "pd.DataFrame":
    """Few-shot-table analogue: mean (std) accuracy in % over seeds, one row per method, one column per task."""
    g = accuracy.groupby(["method", "task"], sort=False)["accuracy"]
    mean, std = g.mean().unstack("task"), g.std().unstack("task")
    order = list(dict.fromkeys(accuracy["method"]))
    cols = list(dict.fromkeys(accuracy["task"]))
    out = mean.reindex(index=order, columns=cols).round(2)
    return out.join(std.reindex(index=order, columns=cols).round(2).add_suffix("_std"))


def plot_vision(accuracy, methods=None):
    """Bars (mean over seeds) and dots (seeds) of accuracy per task and method (notebook 03's vision figure)."""
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(accuracy["task"]))
    methods = methods or list(dict.fromkeys(accuracy["method"]))
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.6 * len(tasks), 3.4), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        sub = accuracy[accuracy["task"] == t]
        for i, m in enumerate(methods):
            v = sub[sub["method"] == m]["accuracy"]
            ax.bar(i, v.mean(), alpha=0.35)
            ax.scatter([i] * len(v), v, s=14)
        ax.set_xticks(range(len(methods)), methods, rotation=35, ha="right")
        ax.set_title(t)
        lo, hi = sub["accuracy"].min(), sub["accuracy"].max()
        ax.set_ylim(max(0, lo - 3), min(100, hi + 2))
    axes[0][0].set_ylabel("accuracy (%)")
    fig.tight_layout()
    return fig
