"""Dropless dispatch: sort (token, slot) pairs by expert, run one grouped matmul per projection, scatter back.

Same idea as MegaBlocks' dropless MoE (Gale et al. 2023) and transformers' ``grouped_mm`` experts path; written here
because we need the unaggregated per-slot outputs [T,k,d] (SBA aggregation, capture), which neither exposes.
Introduced in notebook ``00_primer``; tested against a per-token loop.

Two paths (:func:`moe_dispatch` picks one from the experts' ``impl``):

- **counts** (the CPU default, ``impl`` "auto"/"fused"/"loop"): :func:`sort_by_expert` reads the per-expert row
  counts on the host and the experts loop over them (the fused per-expert FFN with a hand-written backward).
- **offsets** (issue 50; ``impl="grouped_mm"``, and "auto" on CUDA): :func:`expert_order` keeps everything on the
  device (group ends ``offs`` by ``searchsorted``, no ``.tolist()``/``.item()``), the experts run one grouped matmul
  per projection over ``offs`` ([gate | up] in one call), and the rows move with :func:`gather_rows`, whose backward
  is a gather too (no scatter-add, no sort in the backward). On CUDA in bf16 a forward and backward makes no host
  sync (``tests/core/test_cuda.py``).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .checks import require
from .experts import check_input_dtype

__all__ = ["moe_dispatch", "naive_dispatch", "sort_by_expert", "expert_order", "ExpertOrder", "gather_rows"]


def _check(x, indices, weights, num_experts):
    """Shapes and dtypes (host-side, free); the index range through :func:`checks.require` (a ``ValueError`` on the
    CPU, a device-side assert on CUDA); NaN weights on the CPU only (on CUDA they reach the loss, which the trainer
    checks). No host sync on CUDA (issue 50)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be [T,d], got shape {tuple(getattr(x, 'shape', ()))}")
    if not x.is_floating_point():
        raise ValueError(f"x must be floating point, got dtype {x.dtype}")
    if indices.dim() != 2 or indices.shape[0] != x.shape[0]:
        raise ValueError(f"indices shape {tuple(indices.shape)} must be [T,k] with T={x.shape[0]}")
    if indices.dtype not in (torch.long, torch.int32, torch.int64):
        raise ValueError(f"indices must be an integer tensor, got dtype {indices.dtype}")
    if indices.numel():
        require((indices.max() < num_experts) & (indices.min() >= -1),
                lambda: f"indices must lie in [-1, {num_experts}) (-1 = no expert), got "
                        f"[{int(indices.min())}, {int(indices.max())}]")
    if weights is not None:
        if weights.shape != indices.shape:
            raise ValueError(f"weights shape {tuple(weights.shape)} != indices shape {tuple(indices.shape)}")
        if not weights.is_floating_point():
            raise ValueError(f"weights must be floating point, got dtype {weights.dtype}")
        if weights.device.type != "cuda" and bool(torch.isnan(weights).any()):   # CUDA: no sync; NaN reaches the loss
            raise ValueError("weights contain NaN")


def sort_by_expert(indices: torch.Tensor, num_experts: int):
    """Flatten [T,k] assignments and sort them by expert id (the counts path: reads the counts on the host).

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


# --------------------------------------------------------------------------------------------- offsets path (#50)
class ExpertOrder(NamedTuple):
    """The S = T*k (token, slot) pairs sorted by expert, all on the device (:func:`expert_order`; issue 50).

    Flat slot f = t*k + j (token t, slot j); "row s" = the s-th pair in expert order.

    - ``order [S]`` long: row s holds flat slot ``order[s]`` (expert id ascending, stable; empty slots last)
    - ``inv [S]`` long: flat slot f sits at row ``inv[f]`` (``order[inv] = inv[order] = arange(S)``)
    - ``tok [S]`` long: token of row s, ``order[s] // k``
    - ``expert [S]`` long: expert that runs row s (empty slots: E-1, see ``offs``)
    - ``valid [S]`` bool: row s is a real assignment (False: an empty slot, index -1)
    - ``offs [E]`` int32: group ends, expert e runs rows ``offs[e-1]:offs[e]``; ``offs[E-1] = S``

    Empty slots sort last and ride in the last expert's group, so ``offs[-1] = S`` and every row is computed:
    torch's grouped_mm leaves rows past ``offs[-1]`` uninitialised (its output and, in the backward, dx), which would
    need a mask before and after. Their weight is zeroed instead (:func:`moe_dispatch`), so they add exactly 0 and give
    0 gradient; they cost compute only for routes with empty slots (top-p / top-any padding), never for top-k.
    """

    order: torch.Tensor
    inv: torch.Tensor
    tok: torch.Tensor
    expert: torch.Tensor
    valid: torch.Tensor
    offs: torch.Tensor


def expert_order(indices: torch.Tensor, num_experts: int) -> ExpertOrder:
    """Sort the [T,k] assignments by expert without a host sync (no ``.tolist()``, ``.item()``, ``bincount``).

    The group ends are the cumulative per-expert counts, ``offs[e] = sum_{e' <= e} count(e')``, read off the sorted
    expert ids by ``searchsorted`` (the first row with id > e) rather than as ``cumsum(bincount)``: torch's CUDA
    ``bincount`` copies the ids' min and max to the host to size its output. Same values (tests/core/test_dispatch_offsets.py).
    """
    T, k = indices.shape
    S, E, dev = T * k, num_experts, indices.device
    flat = indices.reshape(-1).long()                                        # flat slot f = t*k + j   [S]
    key = torch.where(flat < 0, E, flat)                                     # empty slot (-1) -> E: sorts last
    key_sorted, order = torch.sort(key, stable=True)                         # [S], [S]
    inv = torch.empty_like(order).scatter_(0, order, torch.arange(S, device=dev))   # inv[order[s]] = s
    expert = key_sorted.clamp(max=E - 1)                                     # empty slots ride in the last group
    offs = torch.searchsorted(expert, torch.arange(E, device=dev), right=True, out_int32=True)   # [E], offs[-1] = S
    return ExpertOrder(order, inv, order // k, expert, key_sorted < E, offs)


class _GatherRows(torch.autograd.Function):
    """out = src[idx] (rows), with the backward as a gather as well: g_src[r] = sum_{j<k} g[back[r*k + j]].

    Valid when every row r of src is read by exactly k rows of out, and ``back[r*k : (r+1)*k]`` lists them. Then the
    backward is one ``index_select`` (plus a sum over k) instead of autograd's scatter-add of an indexing op
    (``index_put_`` with accumulate: a sort on CUDA, or atomics for ``index_select``). Deterministic; the sum over
    k accumulates in fp32 whatever the dtype (like transformers' "reshape + sum" un-permute)."""

    @staticmethod
    def forward(ctx, src, idx, back, k):
        ctx.save_for_backward(back)
        ctx.k = k
        return src.index_select(0, idx)

    @staticmethod
    def backward(ctx, g):
        back, = ctx.saved_tensors
        gs = g.index_select(0, back)                                         # row r*k+j: the j-th reader of src[r]
        if ctx.k > 1:
            gs = gs.view(-1, ctx.k, *g.shape[1:]).sum(1)
        return gs, None, None, None


def gather_rows(src: torch.Tensor, idx: torch.Tensor, back: torch.Tensor, k: int = 1) -> torch.Tensor:
    """``src[idx]`` whose backward gathers through ``back`` (see :class:`_GatherRows`). With an
    :class:`ExpertOrder` ``r``: ``gather_rows(x, r.tok, r.inv, k)`` puts the tokens in expert order [T,d] -> [S,d];
    ``gather_rows(o, r.inv, r.order)`` puts rows back in slot order [S,d] -> [S,d]."""
    return _GatherRows.apply(src, idx, back, k)


def _dispatch_offsets(xin, indices, weights, experts, return_expert_outputs):
    """The offsets path of :func:`moe_dispatch` (issue 50); xin = experts.prepare(x) [T,d]. No host sync."""
    T, k = indices.shape
    r = expert_order(indices, experts.num_experts)
    xs = gather_rows(xin, r.tok, r.inv, k)                                   # x_{tok(s)}, expert order   [S,d]
    o = experts.offsets_forward(xs, r.offs, r.expert)                       # o_s = E_{e(s)}(x_{tok(s)})   [S,d]
    d = o.shape[1]
    if weights is None or return_expert_outputs:
        # e_{t,j} = o_{inv[t*k+j]}, zero in empty slots (valid = 0: exact, the ridden rows are finite)   [T,k,d]
        eo = gather_rows(o * r.valid.to(o.dtype)[:, None], r.inv, r.order).view(T, k, d)
        if weights is None:
            return eo
        y = torch.bmm(weights.to(eo.dtype).unsqueeze(1), eo).squeeze(1)    # y_t = sum_j w_{t,j} e_{t,j}   [T,d]
        return y, eo
    # routing weight folded into the down projection's output, in expert order: w_s o_s   [S,d]
    ws = gather_rows(weights.reshape(-1), r.order, r.inv)                    # w of row s   [S]
    ws = torch.where(r.valid, ws, 0).to(o.dtype)                             # empty slots: weight 0
    yw = gather_rows(o * ws[:, None], r.inv, r.order)                        # back to slot order   [S,d]
    return yw.view(T, k, d).sum(1)                                           # y_t = sum_j w_{t,j} e_{t,j}   [T,d]


def moe_dispatch(x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor | None, experts,
                 return_expert_outputs: bool = False):
    """Dropless sparse MoE: y_t = sum_j w_{t,j} E_{i_{t,j}}(x_t)   [T,d].

    Args: x [T,d]; indices [T,k] long (-1 = empty slot, e.g. padding of top-p / top-any routes); weights [T,k] or
    None; experts: a :class:`StackedExperts`/:class:`AdapterExperts` (anything with ``prepare``, ``grouped_forward``,
    ``num_experts``; with ``use_offsets`` and ``offsets_forward`` also the offsets path). Tokens are sorted by expert,
    each projection is one grouped matmul (``experts.impl``), outputs go back to [T,k,d] (zeros in empty slots).
    Forward and backward equal the per-token loop (:func:`naive_dispatch`).

    Path (module docstring): offsets (no host sync; issue 50) when ``experts.use_offsets(x)`` (``impl="grouped_mm"``,
    or "auto" on CUDA with grouped_mm's alignment), else counts (the fused per-expert loop: the CPU default).

    Returns: ``weights is None`` -> expert outputs [T,k,d]; else y [T,d] (weighted sum in the input dtype) and,
    with ``return_expert_outputs``, ``(y, expert_outputs [T,k,d])``.
    """
    E = experts.num_experts
    _check(x, indices, weights, E)
    check_input_dtype(x, next((p.dtype for p in experts.parameters() if p.is_floating_point()), x.dtype))
    T, k = indices.shape
    xin = experts.prepare(x)                                                 # x (FFN experts) or E(x) (adapters)
    if indices.numel() and getattr(experts, "use_offsets", None) is not None and experts.use_offsets(xin):
        return _dispatch_offsets(xin, indices, weights, experts, return_expert_outputs)
    order, counts, n, offs, eid = sort_by_expert(indices, E)
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
