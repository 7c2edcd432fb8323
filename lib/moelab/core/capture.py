"""Capture routing decisions and the chosen experts' outputs per MoE layer and token.

Works on :class:`MoELayer` and transformers' Mixtral / Qwen2-MoE / OLMoE sparse blocks (any block with a ``gate``
returning ``(logits, weights, indices)`` and ``experts`` holding stacked ``gate_up_proj [E,2I,H]`` / ``down_proj
[E,H,I]``). transformers' fast paths never materialise per-expert outputs, so for those blocks the hook recomputes
them from the expert weights for the captured tokens only. Used by the SBA notebook (``02_sba``: norms and angles of
the two chosen outputs) and the routing analyses of MoCE / MASS.

Memory: only every ``sample_every``-th token is kept, at most ``max_tokens`` per layer, in ``store_dtype``;
``stats`` (expert counts, weight sums, mean output norm per expert, mean cosine between chosen outputs) stream over
*all* tokens at O(E) memory, so ``keep_outputs=False, max_tokens=0`` captures arbitrarily many tokens.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layer import MoELayer

__all__ = ["capture_moe", "Capture", "is_hf_moe_block", "hf_expert_outputs"]


def is_hf_moe_block(m: nn.Module) -> bool:
    ex = getattr(m, "experts", None)
    return (hasattr(m, "gate") and ex is not None and hasattr(ex, "gate_up_proj") and hasattr(ex, "down_proj")
            and not isinstance(m, MoELayer))


@torch.no_grad()
def hf_expert_outputs(experts: nn.Module, x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Recompute transformers' stacked experts on the chosen (token, slot) pairs: x [T,H], indices [T,k] -> [T,k,H].
    Expert e: down_proj[e] (act(gate) * up), [gate | up] = gate_up_proj[e] x (transformers' eager expert loop)."""
    T, k = indices.shape
    out = x.new_zeros(T, k, x.shape[1])
    b_gu = getattr(experts, "gate_up_proj_bias", None)
    b_dn = getattr(experts, "down_proj_bias", None)
    transposed = getattr(experts, "is_transposed", False)
    for e in torch.unique(indices).tolist():
        if e < 0 or e >= experts.gate_up_proj.shape[0]:
            continue
        t, j = torch.where(indices == e)
        wgu, wdn = experts.gate_up_proj[e], experts.down_proj[e]
        if transposed:
            wgu, wdn = wgu.T, wdn.T
        h = F.linear(x[t], wgu, None if b_gu is None else b_gu[e])
        gate, up = h.chunk(2, dim=-1)
        out[t, j] = F.linear(experts.act_fn(gate) * up, wdn, None if b_dn is None else b_dn[e])
    return out


class _LayerStore:
    def __init__(self, num_experts: int):
        self.indices, self.weights, self.outputs, self.positions = [], [], [], []
        self.num_experts = num_experts
        self.seen = 0          # tokens seen (all)
        self.kept = 0          # tokens stored
        self.counts = torch.zeros(num_experts, dtype=torch.float64)
        self.weight_sum = torch.zeros(num_experts, dtype=torch.float64)
        self.norm_sum = torch.zeros(num_experts, dtype=torch.float64)
        self.norm_n = torch.zeros(num_experts, dtype=torch.float64)
        self.cos_sum, self.cos_n = 0.0, 0


class Capture:
    """Context manager returned by :func:`capture_moe`. ``records[name]`` -> dict(indices [N,k], weights [N,k],
    expert_outputs [N,k,d] (if kept), positions [N] (token position in the stream)); ``stats[name]`` -> dict of
    streaming statistics over all tokens."""

    def __init__(self, model, max_tokens=None, keep_outputs=True, sample_every=1, layers=None,
                 store_dtype=torch.float32, stats=True):
        if sample_every < 1:
            raise ValueError(f"sample_every must be >= 1, got {sample_every}")
        if max_tokens is not None and max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0 or None, got {max_tokens}")
        self.model, self.max_tokens, self.keep_outputs = model, max_tokens, keep_outputs
        self.sample_every, self.store_dtype, self.do_stats = sample_every, store_dtype, stats
        blocks = [(n, m) for n, m in model.named_modules() if isinstance(m, MoELayer) or is_hf_moe_block(m)]
        if layers is not None:
            blocks = [(n, m) for n, m in blocks if n in set(layers)]
        if not blocks:
            raise ValueError(f"no MoE layer found in {type(model).__name__}")
        self.blocks = blocks
        self._stores: dict[str, _LayerStore] = {}
        self._handles = []

    # -------------------------------------------------------------------------------------------- recording
    def _record(self, name, x, indices, weights, outputs_fn, num_experts):
        st = self._stores.setdefault(name, _LayerStore(num_experts))
        T = indices.shape[0]
        pos = torch.arange(st.seen, st.seen + T)
        st.seen += T
        sel = (pos % self.sample_every) == 0
        if self.max_tokens is not None:
            room = max(0, self.max_tokens - st.kept)
            sel &= torch.cumsum(sel, 0) <= room
        need_out = self.keep_outputs and bool(sel.any())
        idx_c, w_c = indices.detach().cpu(), weights.detach().float().cpu()
        if self.do_stats:
            valid = idx_c >= 0
            st.counts += torch.bincount(idx_c[valid], minlength=num_experts)[:num_experts].double()
            st.weight_sum.index_add_(0, idx_c[valid], w_c[valid].double())
        eo = None
        if need_out or self.do_stats:
            eo = outputs_fn(None if (self.do_stats or not need_out) else sel)
        if self.do_stats and eo is not None:
            eo_all = eo.detach().float()
            nrm = eo_all.norm(dim=-1).cpu()                                   # ||e_{t,j}||   [T,k]
            valid = idx_c >= 0
            st.norm_sum.index_add_(0, idx_c[valid], nrm[valid].double())
            st.norm_n.index_add_(0, idx_c[valid], torch.ones(int(valid.sum()), dtype=torch.float64))
            if eo_all.shape[1] >= 2:
                u = F.normalize(eo_all, dim=-1)
                cos = (u[:, 0] * u[:, 1]).sum(-1).cpu()                      # cos(e_1, e_2) of the top-2   [T]
                ok = valid[:, 0] & valid[:, 1] & (nrm[:, 0] > 0) & (nrm[:, 1] > 0)
                st.cos_sum += float(cos[ok].sum())
                st.cos_n += int(ok.sum())
            if need_out:
                eo = eo[sel.to(eo.device)]
        if bool(sel.any()):
            st.indices.append(idx_c[sel])
            st.weights.append(w_c[sel])
            st.positions.append(pos[sel])
            if need_out:
                st.outputs.append(eo.detach().to("cpu", self.store_dtype))
            st.kept += int(sel.sum())

    def _moelayer_fn(self, name):
        def fn(layer, x2, route, eo):
            self._record(name, x2, route.indices, route.weights,
                         lambda sel: eo if sel is None else eo[sel.to(eo.device)], layer.num_experts)
        return fn

    def _hf_hook(self, name):
        def hook(mod, args, output):
            x = args[0]
            x2 = x.reshape(-1, x.shape[-1]).detach()
            with torch.no_grad():
                _, w, idx = mod.gate(x2)                                     # (logits, top-k weights, indices)

                def outputs_fn(sel):
                    if sel is None:
                        return hf_expert_outputs(mod.experts, x2, idx)
                    s = sel.to(x2.device)
                    return hf_expert_outputs(mod.experts, x2[s], idx[s])
                self._record(name, x2, idx, w, outputs_fn, mod.experts.gate_up_proj.shape[0])
        return hook

    def __enter__(self):
        for name, m in self.blocks:
            if isinstance(m, MoELayer):
                fn = self._moelayer_fn(name)
                m._capture_fns.append(fn)
                self._handles.append(("fn", m, fn))
            else:
                self._handles.append(("hook", m, m.register_forward_hook(self._hf_hook(name))))
        return self

    def __exit__(self, *exc):
        for kind, m, h in self._handles:
            if kind == "fn":
                m._capture_fns.remove(h)
            else:
                h.remove()
        self._handles = []
        return False

    # -------------------------------------------------------------------------------------------- results
    @staticmethod
    def _consolidate(parts: list):
        """Concatenate the stored chunks once and keep only the result (later accesses cost nothing; the one-time
        concatenation briefly holds the data twice)."""
        if len(parts) > 1:
            whole = torch.cat(parts)
            parts.clear()
            parts.append(whole)

    @property
    def records(self) -> dict:
        out = {}
        for name, st in self._stores.items():
            for parts in (st.indices, st.weights, st.positions, st.outputs):
                self._consolidate(parts)
            r = {"indices": torch.cat(st.indices) if st.indices else torch.zeros(0, 0, dtype=torch.long),
                 "weights": torch.cat(st.weights) if st.weights else torch.zeros(0, 0),
                 "positions": torch.cat(st.positions) if st.positions else torch.zeros(0, dtype=torch.long),
                 "num_experts": st.counts.shape[0]}
            if self.keep_outputs:
                r["expert_outputs"] = torch.cat(st.outputs) if st.outputs else torch.zeros(0, 0, 0)
            out[name] = r
        return out

    @property
    def stats(self) -> dict:
        out = {}
        for name, st in self._stores.items():
            n = max(st.seen, 1)
            out[name] = {"tokens": st.seen, "load": (st.counts / n).float(), "mean_weight": (st.weight_sum / n).float(),
                         "mean_output_norm": (st.norm_sum / st.norm_n.clamp_min(1)).float(),
                         "mean_top2_cos": st.cos_sum / st.cos_n if st.cos_n else float("nan")}
        return out


def capture_moe(model: nn.Module, max_tokens: int | None = None, keep_outputs: bool = True, sample_every: int = 1,
                layers=None, store_dtype: torch.dtype = torch.float32, stats: bool = True) -> Capture:
    """``with capture_moe(model) as cap: model(...)``; then ``cap.records[layer_name]`` holds ``indices [T,k]``,
    ``weights [T,k]``, ``expert_outputs [T,k,d]`` (every ``sample_every``-th token, at most ``max_tokens`` per layer)
    and ``cap.stats[layer_name]`` streaming statistics over all tokens. ``stats=True`` computes the chosen experts'
    outputs for every token (for norms/cosines); set ``stats=False`` to compute them only for the kept tokens."""
    return Capture(model, max_tokens, keep_outputs, sample_every, layers, store_dtype, stats)
