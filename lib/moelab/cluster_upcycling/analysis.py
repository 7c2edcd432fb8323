"""The poster's analyses (poster 002 "Analysis" panels 1-4; notebook ``03_cluster_upcycling``), measured on a FIXED
held-out token set at initialisation and at the end of training for every method in a run.

* panel 1, relative compactness (:func:`relative_compactness`); for the cluster router at init it groups tokens by
  the k-means partition itself, so it is an initialisation property there;
* panel 2, specialisation: expert-output similarity on shared held-out inputs
  (:func:`moelab.core.similarity.expert_output_similarity`) beside the parameter similarity
  (:func:`moelab.core.similarity.expert_similarity`, 1 for sparse upcycling by construction);
* panel 3, routing entropy (:func:`routing_entropy`) on the fixed held-out batches, at fixed steps during training
  (:class:`HeldoutEntropy`), not on the training batches (whose batch-to-batch noise mimics "explores then settles");
* panel 4, expert utilisation (:func:`expert_utilisation`);
* router movement (:func:`router_agreement`): the share of held-out tokens whose trained router picks the same
  top-1 expert as the router at initialisation (for cluster-aware upcycling: the k-means partition). It is 1 at init
  by construction, so it only measures how far the router moved, never a quality.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from moelab.core import moe_layers
from moelab.core.similarity import expert_output_similarity, expert_similarity

from .data import heldout_batches

__all__ = ["routing_entropy", "expert_utilisation", "relative_compactness", "expert_similarity",
           "expert_output_similarity", "router_agreement", "heldout_layer_inputs", "heldout_entropy",
           "moe_analyses", "HeldoutEntropy"]


def routing_entropy(router_logits: torch.Tensor, normalise: bool = True) -> float:
    """Mean per-token entropy of ``softmax(router_logits)`` [T, E], divided by ``log E`` when ``normalise``
    (poster panel 3: ``H = -1/T sum_t sum_i g_i(x_t) log g_i(x_t)``; notebook 03)."""
    p = torch.softmax(router_logits.float(), -1)
    h = -(p * torch.log(p.clamp_min(1e-12))).sum(-1).mean()
    return float(h / math.log(p.shape[-1])) if normalise else float(h)


def expert_utilisation(indices: torch.Tensor, num_experts: int) -> np.ndarray:
    """Fraction of the top-k assignments [T, k] that go to each expert (poster panel 4; notebook 03): ``[E]``,
    sums to 1."""
    c = torch.bincount(indices.reshape(-1).long(), minlength=num_experts).double()
    if len(c) > num_experts:
        raise ValueError(f"expert index {len(c) - 1} >= num_experts={num_experts}")
    return (c / c.sum()).numpy()


def relative_compactness(x: torch.Tensor, assign: torch.Tensor, num_experts: int) -> float:
    """Within-expert scatter over total scatter of unit-normalised layer inputs (poster panel 1, our precise
    reading; notebook 03).

    ``RC = sum_i sum_{x in C_i} ||x^ - m_i||^2 / sum_x ||x^ - m||^2`` with ``x^ = x/||x||``, ``C_i`` the tokens whose
    top-1 expert is ``i``, ``m_i`` their mean and ``m`` the overall mean. RC is 1 when routing is unrelated to the
    token geometry and falls towards 0 as each expert's tokens occupy a compact region of their own ("more
    disentangled expert subspaces", lower is better). Empty experts contribute nothing. With the cluster router at
    initialisation the groups ARE the spherical k-means partition, which minimises this kind of scatter by design.
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


def router_agreement(top_init, top_final) -> float:
    """Router MOVEMENT measure (notebook 03): the share of held-out tokens whose top-1 expert after
    training equals their top-1 expert at initialisation, ``1/T sum_t [argmax_i z_i^end(x_t) = argmax_i z_i^0(x_t)]``.
    1 = the router did not move on these tokens. For cluster-aware upcycling the initial top-1 IS the k-means
    partition (centroid router), so agreement there is 1 at init by construction: read it as distance moved only."""
    a, b = np.asarray(top_init).reshape(-1), np.asarray(top_final).reshape(-1)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"top-1 assignments at init and at the end must cover the same held-out tokens, got "
                         f"{a.size} and {b.size}")
    return float((a == b).mean())


def _forward_default(model, batch):
    """``model(batch)`` with the batch's tensors on the model's device (a sentence-transformers model)."""
    dev = next(model.parameters()).device
    return model({k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in batch.items()})


@torch.no_grad()
def heldout_layer_inputs(model, batches, forward=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per MoE layer of ``model``: ``(x [T, d], router_logits [T, E])`` on the fixed held-out ``batches`` (padding
    dropped by each batch's ``attention_mask``), in eval mode, restoring the previous mode. ``forward(model, batch)``
    runs one batch (default: ``model(batch)`` with the batch moved to the model's device, a sentence-transformers
    model)."""
    layers = moe_layers(model)
    if not layers:
        return []
    forward = forward or _forward_default
    seen: dict[int, list] = {i: [] for i in range(len(layers))}
    hooks = [l.register_forward_hook(lambda m, a, o, i=i: seen[i].append(a[0].reshape(-1, a[0].shape[-1])))
             for i, l in enumerate(layers)]
    xs = {i: [] for i in seen}
    zs = {i: [] for i in seen}
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            forward(model, batch)
            am = batch.get("attention_mask") if isinstance(batch, dict) else None
            for i, l in enumerate(layers):
                x, z = seen[i].pop(), l.last_router_logits
                if am is not None and am.numel() == x.shape[0]:
                    keep = am.reshape(-1).bool().to(x.device)
                    x, z = x[keep], z[keep]
                xs[i].append(x.float().cpu())
                zs[i].append(z.float().cpu())
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return [(torch.cat(xs[i]), torch.cat(zs[i])) for i in range(len(layers))]


def heldout_entropy(model, batches, forward=None) -> list[float]:
    """Normalised routing entropy per MoE layer on the fixed held-out ``batches`` (poster panel 3; notebook 03)."""
    return [routing_entropy(z) for _, z in heldout_layer_inputs(model, batches, forward)]


class HeldoutEntropy:
    """Routing-entropy trajectory on a FIXED held-out batch at FIXED steps (poster panel 3;
    notebook 03). Use as the trainer's ``after_step`` hook (``hook(step, model)``); call ``hook(0, model)`` before
    training for the initial point. At each step in ``steps`` it evaluates (eval mode, no gradients, no random
    numbers drawn, training mode restored) and appends one row per MoE layer to ``rows``:
    ``dict(step, moe_layer, routing_entropy)``. Other steps cost nothing.

    The held-out forward pass of a step in ``keep`` is kept in ``layer_inputs[step]`` (:func:`heldout_layer_inputs`'s
    list), so :func:`moe_analyses` of the same model at that step reuses it instead of running it again;
    :meth:`record` adds a step from such a list computed elsewhere (the analyses at initialisation)."""

    def __init__(self, batches, steps, forward=None, keep=()):
        self.batches, self.forward = list(batches), forward
        self.steps = sorted({int(s) for s in steps})
        if not self.batches or not self.steps or self.steps[0] < 0:
            raise ValueError(f"HeldoutEntropy needs held-out batches and steps >= 0, got {len(self.batches)} "
                             f"batches and steps {self.steps}")
        self.rows: list[dict] = []
        self.keep = {int(s) for s in keep}
        self.layer_inputs: dict[int, list] = {}

    def __call__(self, step: int, model) -> None:
        if step not in self.steps:
            return
        self.record(step, heldout_layer_inputs(model, self.batches, self.forward))

    def record(self, step: int, layer_inputs) -> None:
        """Append ``step``'s rows from :func:`heldout_layer_inputs` of the model at that step on these batches."""
        if step not in self.steps:
            raise ValueError(f"step {step} is not one of the trajectory's steps {self.steps}")
        if step in self.keep:
            self.layer_inputs[int(step)] = layer_inputs
        for li, (_, z) in enumerate(layer_inputs):
            self.rows.append({"step": int(step), "moe_layer": li, "routing_entropy": routing_entropy(z)})


def moe_analyses(model, batches, max_len: int = 32, forward=None, layer_inputs=None) -> dict:
    """The poster's analysis panels on the fixed held-out ``batches``, per MoE layer (notebook 03; a list of
    sentences is tokenised by :func:`moelab.cluster_upcycling.data.heldout_batches` with ``max_len``): relative
    compactness (panel 1), expert parameter similarity and expert-output similarity on the held-out layer inputs
    (panel 2), routing entropy (3), expert utilisation (4), and the held-out tokens' top-1 expert (``top1``, for
    :func:`router_agreement`). Padding tokens excluded. ``{}`` for a model without MoE layers. ``layer_inputs``:
    :func:`heldout_layer_inputs` of this model on these batches when already run (e.g. by :class:`HeldoutEntropy`
    at the same step), so the held-out forward pass is not run twice."""
    if len(batches) and isinstance(batches[0], str):
        batches = heldout_batches(model, list(batches), max_len)
    per_layer = heldout_layer_inputs(model, batches, forward) if layer_inputs is None else layer_inputs
    if not per_layer:
        return {}
    layers = moe_layers(model)
    out = {"relative_compactness": [], "expert_similarity": [], "expert_output_similarity": [], "routing_entropy": [],
           "utilisation": [], "top1": []}
    for l, (x, z) in zip(layers, per_layer):
        E = z.shape[1]
        top = z.topk(l.top_k, dim=-1).indices
        out["relative_compactness"].append(relative_compactness(x, top[:, 0], E))
        out["expert_similarity"].append(expert_similarity(l))
        out["expert_output_similarity"].append(expert_output_similarity(l, x.to(next(l.parameters()).device)))
        out["routing_entropy"].append(routing_entropy(z))
        out["utilisation"].append(expert_utilisation(top, E))
        out["top1"].append(top[:, 0].numpy().astype(np.int16))
    return out
