"""MoELayer: router + experts + dropless dispatch + aggregation (+ shared bias / shared experts).

The one MoE block every paper module builds on (notebook ``00_primer``): nomic-style top-2 without renormalisation
and a shared bias (SBA, paper 001), PESC/MoCE adapters with top-k softmax and cluster routers (paper 000),
upcycled FFNs (paper 002), growing pools with top-p routing (MASS, paper 003).
"""
from __future__ import annotations

import torch
from torch import nn

from . import routing as R
from .aggregation import METHODS, aggregate
from .dispatch import moe_dispatch
from .experts import StackedExperts, check_input_dtype, optimizer_copy_rows, optimizer_replace_param
from .init import dense_ffn_spec, resolve_init
from .losses import load_balancing_loss

__all__ = ["MoELayer", "moe_layers", "aux_loss", "ROUTERS"]

ROUTERS = ("topk", "top_p", "soft", "group", "cosine", "topany")


class MoELayer(nn.Module):
    """Sparse MoE FFN block. ``forward(x [B,S,d] or [T,d]) -> y`` (same shape).

    Args:
      d_model, d_ff, num_experts (for ``router="group"``: experts *per group*; the pool has num_groups*num_experts),
      top_k, act ("swiglu", "gelu", ...), bias (per-expert biases),
      router: "topk" (softmax top-k; ``softmax_over="topk"`` for PESC), "top_p" (``top_p``, ``top_p_convention``),
        "soft" (all experts, softmax weights), "group" (MoCE; pass ``group_ids`` to forward), "cosine" (GMoE),
        "topany" (DynMoE),
      renormalize: divide kept weights by their sum (Mixtral: True; nomic/OLMoE/Qwen2-MoE: False); None (default):
        True for top_k > 1 (Mixtral) and False for top-1 (Switch: raw probability) with the top-k routers, False for
        top-p; "mass_batch" for top-p = the MASS authors' rule (see :func:`routing.top_p_route`),
      allow_gradient_free_routes: allow routes whose weights are always 1 (top-1 renormalised or PESC's softmax over
        one kept logit; per-token renormalised top-p), which give the router no task gradient; without it such a
        configuration raises ``ValueError``,
      aggregation: "linear" | "sba" | "sba_normfree" | "sba_unit",
      shared_bias: one bias [d] added once after aggregation (nomic-embed-v2-moe),
      num_shared_experts (+ ``shared_expert_gate``: Qwen2-MoE's sigmoid gate), d_ff_shared,
      num_active: only the first num_active slots are active (free slots for growing pools, MASS),
      experts: a prebuilt expert pool (e.g. :class:`AdapterExperts`) replacing the StackedExperts,
      impl: expert matmul implementation ("auto" | "fused" | "grouped_mm" | "loop"; see StackedExperts).

    ``forward(x, group_ids=None, attention_mask=None)``: ``attention_mask`` [B,S] (1 = real token; for x [T,d] any
    shape with T entries) excludes padding from the balancing loss; without it the layer uses ``token_mask`` (set by
    :func:`moelab.core.convert.moeify`'s model hook for the duration of a forward pass). A mask whose size does not
    match the tokens raises ``ValueError``.

    After forward: ``last_router_logits [T,E]``, ``last_route`` (RouteOut; indices -1 = empty slot),
    ``aux_loss``: the Switch balancing loss of this forward over the *active* slots only (free slots of a growing
    pool are left out; equal to transformers' ``load_balancing_loss_func`` on the active logits with the mask;
    see :func:`losses.load_balancing_loss`).
    """

    def __init__(self, d_model: int, d_ff: int, num_experts: int, top_k: int, act: str = "swiglu",
                 router: str = "topk", renormalize: bool | str | None = None, aggregation: str = "linear",
                 shared_bias: bool = False, num_shared_experts: int = 0, *, bias: bool = False,
                 softmax_over: str = "all", top_p: float = 0.5, top_p_convention: str = "mass",
                 num_groups: int = 1, shared_expert_gate: bool = False, d_ff_shared: int | None = None,
                 num_active: int | None = None, experts: nn.Module | None = None, router_init_std: float = 0.02,
                 impl: str = "auto", sba_kwargs: dict | None = None, allow_gradient_free_routes: bool = False):
        super().__init__()
        if router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
        if aggregation not in METHODS:
            raise ValueError(f"aggregation must be one of {sorted(METHODS)}, got {aggregation!r}")
        pool = num_experts * (num_groups if router == "group" else 1)
        if not isinstance(top_k, int) or top_k < 1 or top_k > num_experts:
            raise ValueError(f"top_k={top_k} must be an int in [1, num_experts={num_experts}]")
        if router == "top_p":
            R._check_p(top_p)
        renormalize = _resolve_renormalize(router, renormalize, top_k, top_p, softmax_over, allow_gradient_free_routes)
        self.allow_gradient_free_routes = allow_gradient_free_routes
        self.d_model, self.d_ff, self.num_experts, self.top_k = d_model, d_ff, pool, top_k
        self.router_type, self.renormalize, self.aggregation = router, renormalize, aggregation
        self.softmax_over, self.top_p, self.top_p_convention = softmax_over, top_p, top_p_convention
        self.num_groups, self.sba_kwargs = num_groups, dict(sba_kwargs or {})
        if router == "topk":
            self.router = R.LinearRouter(d_model, pool, top_k, renormalize, softmax_over, init_std=router_init_std,
                                         allow_gradient_free_routes=allow_gradient_free_routes)
        elif router in ("top_p", "soft"):                                     # the layer only uses its logits
            self.router = R.LinearRouter(d_model, pool, 1, False, "all", init_std=router_init_std)
        elif router == "group":
            self.router = R.GroupRouter(d_model, num_groups, num_experts, top_k, renormalize, softmax_over,
                                        init_std=router_init_std, allow_gradient_free_routes=allow_gradient_free_routes)
        elif router == "cosine":
            self.router = R.CosineRouter(d_model, pool, top_k, renormalize=renormalize,
                                         allow_gradient_free_routes=allow_gradient_free_routes)
        else:
            self.router = R.TopAnyGate(d_model, pool)
        if experts is None:
            experts = StackedExperts(pool, d_model, d_ff, act, bias=bias, impl=impl)
        elif experts.num_experts != pool:
            raise ValueError(f"experts has {experts.num_experts} experts, layer expects {pool}")
        self.experts = experts
        self.act = getattr(experts, "act", act)
        self.shared_bias = nn.Parameter(torch.zeros(d_model)) if shared_bias else None
        self.shared_experts = (StackedExperts(num_shared_experts, d_model, d_ff_shared or d_ff, act, bias=bias, impl=impl)
                               if num_shared_experts else None)
        self.shared_expert_gate = nn.Linear(d_model, 1, bias=False) if (num_shared_experts and shared_expert_gate) else None
        active = torch.zeros(pool, dtype=torch.bool)
        active[: pool if num_active is None else num_active] = True
        self.register_buffer("active_mask", active)
        self._all_active_cache = None                                         # see _all_active
        self.last_router_logits = self.last_route = None
        self.token_mask: torch.Tensor | None = None                           # [B,S], set by moeify's model hook
        self.aux_loss = torch.zeros(())
        self._capture_fns = []                                                # set by capture.capture_moe

    # ------------------------------------------------------------------------------------------ routing
    def _all_active(self) -> bool:
        """Whether every slot is active, read on the host once per change of ``active_mask`` rather than once per
        forward (a host sync on CUDA, issue 50): the answer is kept with the mask object and its version counter,
        which every in-place write bumps (``active_mask[e] = False``, ``copy_``, ``load_state_dict``); ``grow`` and
        ``.to()`` replace the object. (A write through ``active_mask.data`` bumps no counter: write the mask itself.)"""
        m = self.active_mask
        try:
            version = m._version
        except RuntimeError:                                                  # inference-mode tensor: no counter
            return bool(m.all())
        cache = getattr(self, "_all_active_cache", None)
        if cache is None or cache[0] is not m or cache[1] != version:
            cache = self._all_active_cache = (m, version, bool(m.all()))
        return cache[2]

    def _active(self):
        return None if self._all_active() else self.active_mask

    def route(self, x: torch.Tensor, group_ids: torch.Tensor | None = None):
        """x [T,d] -> (logits [T,E or N], RouteOut(weights [T,k'], indices [T,k'], probs))."""
        act = self._active()
        rt = self.router_type
        if rt == "group":
            z = self.router.logits(x, group_ids)
            return z, R.group_topk_route(z, group_ids, self.top_k, self.num_groups, self.renormalize,
                                         self.softmax_over, act, self.allow_gradient_free_routes)
        z = self.router.logits(x)
        if rt in ("topk", "cosine"):
            return z, R.topk_route(z, self.top_k, self.renormalize, self.softmax_over if rt == "topk" else "all", act,
                                   self.allow_gradient_free_routes)
        if rt == "top_p":
            wd, mask = R.top_p_route(z, self.top_p, self.top_p_convention, self.renormalize, act,
                                     self.allow_gradient_free_routes)
            idx, w = R.dense_to_sparse(wd, mask)
            return z, R.RouteOut(w, idx, torch.softmax(R.masked_logits(z, act), -1))
        if rt == "soft":
            probs = R.soft_route(z, act)
            idx = torch.arange(self.num_experts, device=x.device).expand(x.shape[0], -1)
            if act is not None:
                idx = torch.where(act, idx, torch.full_like(idx, -1))
            return z, R.RouteOut(probs, idx, probs)
        out = self.router(x, act)                                             # top-any
        idx, w = R.dense_to_sparse(out.weights, out.mask)
        return z, R.RouteOut(w, idx, out.scores)

    # ------------------------------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor, group_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3) or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be [B,S,{self.d_model}] or [T,{self.d_model}], got {tuple(getattr(x, 'shape', ()))}")
        check_input_dtype(x, self.router.weight.dtype)                         # any dtype under autocast
        shape = x.shape
        x2 = x.reshape(-1, self.d_model)                                      # [T,d]
        mask = self._check_mask(attention_mask if attention_mask is not None else self.token_mask, shape)
        if group_ids is not None and x.dim() == 3 and group_ids.shape == shape[:1]:
            group_ids = group_ids.to(x.device).repeat_interleave(shape[1])   # sequence-level id -> per token
        z, route = self.route(x2, group_ids)
        self.last_router_logits, self.last_route = z, route
        capturing = bool(self._capture_fns)
        if self.aggregation == "linear" and not capturing:
            y = moe_dispatch(x2, route.indices, route.weights, self.experts)  # y = sum_j w_j E_{i_j}(x)   [T,d]
        else:
            eo = moe_dispatch(x2, route.indices, None, self.experts)          # e_{t,j}   [T,k,d]
            for fn in self._capture_fns:
                fn(self, x2, route, eo)
            y = aggregate(eo, route.weights, self.aggregation,
                          **(self.sba_kwargs if self.aggregation != "linear" else {}))
        if self.shared_bias is not None:
            y = y + self.shared_bias                                          # one shared bias, added once (nomic)
        if self.shared_experts is not None:
            s = sum(self.shared_experts.forward_expert(i, x2) for i in range(self.shared_experts.num_experts))
            if self.shared_expert_gate is not None:
                s = torch.sigmoid(self.shared_expert_gate(x2)) * s            # Qwen2-MoE gated shared expert
            y = y + s
        self.aux_loss = self._balancing_loss(z, mask)
        return y.reshape(shape)

    def _check_mask(self, mask, shape) -> torch.Tensor | None:
        """The padding mask for x of ``shape``: [B,S] for x [B,S,d], T entries for x [T,d]; else ValueError."""
        if mask is None:
            return None
        if not isinstance(mask, torch.Tensor):
            raise ValueError(f"attention_mask must be a tensor [B,S] (1 = real token), got {type(mask).__name__}")
        tokens = shape[:-1]
        ok = tuple(mask.shape) == tuple(tokens) if len(shape) == 3 else mask.numel() == tokens[0]
        if not ok:
            raise ValueError(f"attention_mask shape {tuple(mask.shape)} does not match the tokens of x "
                             f"{tuple(shape)} (expected {tuple(tokens)}); pass the mask of this batch "
                             "(1 = real token) or None")
        return mask

    def _active_columns(self, num_logits: int) -> torch.Tensor | None:
        """Bool [num_logits] of the active slots seen by the router logits (None = all active)."""
        if self._all_active():
            return None
        if self.router_type != "group":
            return self.active_mask
        per_group = self.active_mask.view(self.num_groups, num_logits)       # [M,N]
        if not bool((per_group == per_group[:1]).all()):
            raise ValueError("the balancing loss of a group router needs the same active experts in every group, "
                             f"got active_mask {self.active_mask.int().tolist()}")
        return per_group[0]

    def _balancing_loss(self, z: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Switch loss L = E_a * sum_{e active} f_e P_e over the E_a active slots only:
        softmax and top-k over the active logits z[:, active], padding excluded by ``mask`` (transformers'
        ``load_balancing_loss_func`` on the active logits)."""
        if z.shape[0] == 0:
            return z.new_zeros((), dtype=torch.float32)
        cols = self._active_columns(z.shape[1])
        za = z if cols is None else z[:, cols.to(z.device)]                   # [T,E_a]
        n_active = za.shape[1]
        k_loss = self.top_k if self.router_type in ("topk", "group", "cosine") else 1
        return load_balancing_loss(za.float(), n_active, min(k_loss, n_active), mask)

    # ------------------------------------------------------------------------------------------ growing pools
    @torch.no_grad()
    def copy_expert(self, src: int, dst: int, optimizer=None, state: str = "copy", activate: bool = True) -> None:
        """Copy expert ``src`` and its router row into slot ``dst`` (MASS duplication), activate ``dst``."""
        self.experts.copy_expert(src, dst, optimizer, state)
        w = self._router_rows()
        if w is not None:
            w[dst] = w[src]
            optimizer_copy_rows(optimizer, w, src, dst, state)
        if activate:
            self.active_mask[dst] = True

    def _router_rows(self):
        if isinstance(self.router, R.LinearRouter):
            return self.router.proj.weight
        if isinstance(self.router, (R.CosineRouter, R.TopAnyGate)):
            return self.router.weight
        return None

    def grow(self, n: int, copy_from: list[int] | None = None, optimizer=None) -> list[int]:
        """Append n expert slots (copies of ``copy_from`` or fresh), with router rows; keeps optimiser state in step."""
        if self.router_type == "group":
            raise ValueError("grow is not supported for router='group'")
        new_ids = self.experts.grow(n, copy_from, optimizer)
        src = list(range(self.num_experts)) + (list(copy_from) if copy_from is not None else [-1] * n)
        old = self._router_rows()
        extra = torch.randn(n, old.shape[1], dtype=old.dtype, device=old.device) * 0.02
        for i, s in enumerate(src[self.num_experts:]):
            if s >= 0:
                extra[i] = old.detach()[s]
        new = nn.Parameter(torch.cat([old.detach(), extra]))
        if isinstance(self.router, R.LinearRouter):
            self.router.proj.weight = new
            self.router.proj.out_features += n
        else:
            self.router.weight = new
            if isinstance(self.router, R.TopAnyGate):
                th = self.router.threshold
                nt = nn.Parameter(torch.cat([th.detach(), torch.zeros(n, dtype=th.dtype, device=th.device)]))
                self.router.threshold = nt
                optimizer_replace_param(optimizer, th, nt, list(range(len(th))) + [-1] * n)
        self.router.num_experts += n
        optimizer_replace_param(optimizer, old, new, src)
        self.active_mask = torch.cat([self.active_mask, torch.ones(n, dtype=torch.bool, device=self.active_mask.device)])
        self.num_experts += n
        return new_ids

    # ------------------------------------------------------------------------------------------ conversion
    @classmethod
    def from_dense(cls, ffn: nn.Module, num_experts: int, top_k: int, init="sparse", calib: torch.Tensor | None = None,
                   **kw) -> "MoELayer":
        """MoE layer whose experts are initialised from a dense FFN (``init``: "sparse" | "noise" | "drop" |
        callable ``init(dense_ffn, layer, calib_x)``; see :mod:`moelab.core.init`). Paper 002 / upcycling notebooks."""
        spec = dense_ffn_spec(ffn)
        kw.setdefault("act", spec.act)
        kw.setdefault("bias", spec.b_in is not None)
        layer = cls(spec.d_model, spec.d_ff, num_experts, top_k, **kw)
        layer.to(dtype=spec.w_in.dtype, device=spec.w_in.device)
        if init is not None:
            resolve_init(init)(ffn, layer, calib)
        return layer

    def extra_repr(self) -> str:
        return (f"router={self.router_type!r}, top_k={self.top_k}, renormalize={self.renormalize}, "
                f"aggregation={self.aggregation!r}, active={int(self.active_mask.sum())}/{self.num_experts}")


def _resolve_renormalize(router: str, renormalize, top_k: int, top_p: float, softmax_over: str,
                         allow_gradient_free_routes: bool):
    """MoELayer's ``renormalize`` (None = default) -> the value its router uses; ValueError for a route whose
    weights carry no task gradient unless ``allow_gradient_free_routes``."""
    if router == "top_p":
        return R.check_top_p_renormalize(renormalize, R._check_p(top_p), allow_gradient_free_routes)
    if router in ("topk", "group", "cosine"):
        renormalize = R.check_renormalize(top_k > 1 if renormalize is None else renormalize)
        R.check_route_gradient(top_k, renormalize, softmax_over if router != "cosine" else "all",
                               allow_gradient_free_routes)
        return renormalize
    return R.check_renormalize(renormalize)                                 # soft / topany: not used


def moe_layers(model: nn.Module) -> list[MoELayer]:
    """All MoELayer modules of ``model`` in module order."""
    return [m for m in model.modules() if isinstance(m, MoELayer)]


def aux_loss(model: nn.Module) -> torch.Tensor:
    """Sum of the balancing losses of the model's MoE layers from their last forward (0 if none)."""
    losses = [m.aux_loss for m in moe_layers(model) if m.aux_loss is not None]
    if not losses:
        return torch.zeros(())
    return torch.stack([l.to(losses[0].device) for l in losses]).sum()
