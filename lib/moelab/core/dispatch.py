"""Dropless dispatch: sort (token, slot) pairs by expert, run one grouped matmul per projection, scatter back.

Same idea as MegaBlocks' dropless MoE (Gale et al. 2023) and transformers' ``grouped_mm`` experts path; written here
because we need the unaggregated per-slot outputs [T,k,d] (SBA aggregation, capture), which neither exposes.
Introduced in notebook ``00_primer``; tested against a per-token loop.
"""
from __future__ import annotations

import torch

from .experts import check_input_dtype

__all__ = ["moe_dispatch", "naive_dispatch", "sort_by_expert"]


def _check(x, indices, weights, num_experts):
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be [T,d], got shape {tuple(getattr(x, 'shape', ()))}")
    if not x.is_floating_point():
        raise ValueError(f"x must be floating point, got dtype {x.dtype}")
    if indices.dim() != 2 or indices.shape[0] != x.shape[0]:
        raise ValueError(f"indices shape {tuple(indices.shape)} must be [T,k] with T={x.shape[0]}")
    if indices.dtype not in (torch.long, torch.int32, torch.int64):
        raise ValueError(f"indices must be an integer tensor, got dtype {indices.dtype}")
    if indices.numel() and (int(indices.max()) >= num_experts or int(indices.min()) < -1):
        raise ValueError(f"indices must lie in [-1, {num_experts}) (-1 = no expert), got "
                         f"[{int(indices.min())}, {int(indices.max())}]")
    if weights is not None:
        if weights.shape != indices.shape:
            raise ValueError(f"weights shape {tuple(weights.shape)} != indices shape {tuple(indices.shape)}")
        if not weights.is_floating_point():
            raise ValueError(f"weights must be floating point, got dtype {weights.dtype}")
        if bool(torch.isnan(weights).any()):
            raise ValueError("weights contain NaN")


def sort_by_expert(indices: torch.Tensor, num_experts: int):
    """Flatten [T,k] assignments and sort them by expert id.

    Returns (order [S] positions into the flattened [T*k] assignments, expert id first, -1 slots last;
    counts list[int] per expert; n_valid; offs int32 [E] cumulative counts; expert_ids_sorted [n_valid]).
    """
    flat = indices.reshape(-1).long()
    key = torch.where(flat < 0, torch.full_like(flat, num_experts), flat)  # sentinel for "no expert" at the tail
    key_sorted, order = torch.sort(key, stable=True)
    counts_t = torch.bincount(key_sorted, minlength=num_experts + 1)[:num_experts]
    counts = counts_t.tolist()
    n_valid = sum(counts)
    offs = counts_t.cumsum(0).to(torch.int32)
    return order, counts, n_valid, offs, key_sorted[:n_valid]


def moe_dispatch(x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor | None, experts,
                 return_expert_outputs: bool = False):
    """Dropless sparse MoE: y_t = sum_j w_{t,j} E_{i_{t,j}}(x_t)   [T,d].

    Args: x [T,d]; indices [T,k] long (-1 = empty slot, e.g. padding of top-p / top-any routes); weights [T,k] or
    None; experts: a :class:`StackedExperts`/:class:`AdapterExperts` (anything with ``prepare``, ``grouped_forward``,
    ``num_experts``). Tokens are sorted by expert, each projection is one grouped matmul (``experts.impl``), outputs go
    back to [T,k,d] (zeros in empty slots). Forward and backward equal the per-token loop (:func:`naive_dispatch`).

    Returns: ``weights is None`` -> expert outputs [T,k,d]; else y [T,d] (weighted sum in the input dtype) and,
    with ``return_expert_outputs``, ``(y, expert_outputs [T,k,d])``.
    """
    E = experts.num_experts
    _check(x, indices, weights, E)
    check_input_dtype(x, next((p.dtype for p in experts.parameters() if p.is_floating_point()), x.dtype))
    T, k = indices.shape
    d = x.shape[1]
    order, counts, n, offs, eid = sort_by_expert(indices, E)
    xin = experts.prepare(x)                                                 # x (FFN experts) or E(x) (adapters)
    tok = order[:n] // k                                                     # token of each sorted assignment
    out_sorted = experts.grouped_forward(xin[tok], counts, offs, eid)        # [n,d]
    if n < T * k:                                                            # empty slots -> zero rows
        out_sorted = torch.cat([out_sorted, out_sorted.new_zeros(T * k - n, out_sorted.shape[1])])
    inv = torch.empty_like(order)
    inv[order] = torch.arange(T * k, device=order.device)
    expert_outputs = out_sorted[inv].view(T, k, out_sorted.shape[1])                       # e_{t,j} = E_{i_{t,j}}(x_t)   [T,k,d]
    if weights is None:
        return expert_outputs
    w = weights.to(expert_outputs.dtype)
    y = torch.bmm(w.unsqueeze(1), expert_outputs).squeeze(1)                 # y_t = sum_j w_{t,j} e_{t,j}   [T,d]
    if return_expert_outputs:
        return y, expert_outputs
    return y


def naive_dispatch(x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor | None, experts) -> torch.Tensor:
    """Reference: loop over tokens and slots calling ``experts.forward_expert``. Slow; for tests only."""
    T, k = indices.shape
    rows = []
    for t in range(T):
        slots = []
        for j in range(k):
            e = int(indices[t, j])
            slots.append(experts.forward_expert(e, x[t:t + 1])[0] if e >= 0 else x.new_zeros(x.shape[1]))
        rows.append(torch.stack(slots))
    out = torch.stack(rows)                                                  # [T,k,d]
    if weights is None:
        return out
    return (weights.to(out.dtype).unsqueeze(-1) * out).sum(1)
