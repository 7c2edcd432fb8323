"""Expert pools: stacked-weight FFN experts and PESC adapter experts, with growing pools.

``StackedExperts`` stores all experts in 3-D tensors (expert axis outer, like transformers' Mixtral and MegaBlocks),
so dispatch can run one grouped matmul. ``AdapterExperts`` wraps a frozen dense FFN E(x) (PESC, Wu et al. 2024, Eq. 3;
MoCE uses the same experts per cluster). Growing pools (MASS) add/copy experts; :func:`optimizer_replace_param` and
:func:`optimizer_copy_rows` keep torch optimiser state consistent when they do. Introduced in notebook ``00_primer``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["StackedExperts", "AdapterExperts", "grouped_linear", "offsets_mm", "offsets_mm_reference", "ACTIVATIONS",
           "GATED", "optimizer_replace_param", "optimizer_copy_rows", "autocast_dtype", "check_input_dtype"]

# act name -> elementwise function; gated acts take [.., 2f] = [gate | up] (Mixtral's gate_up_proj order)
ACTIVATIONS = {
    "swiglu": F.silu, "geglu": F.gelu, "geglu_tanh": lambda h: F.gelu(h, approximate="tanh"),
    "gelu": F.gelu, "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"), "relu": F.relu,
    "silu": F.silu, "silu_linear": F.silu,
}
GATED = {"swiglu", "geglu", "geglu_tanh"}


def _check_act(act: str) -> str:
    if act not in ACTIVATIONS:
        raise ValueError(f"act must be one of {sorted(ACTIVATIONS)}, got {act!r}")
    return act


def apply_act(h: torch.Tensor, act: str) -> torch.Tensor:
    """a(h): gated acts compute f(gate) * up with h = [gate | up]."""
    if act in GATED:
        gate, up = h.chunk(2, dim=-1)
        return ACTIVATIONS[act](gate) * up                                  # SwiGLU: silu(x W_g) * (x W_u)
    return ACTIVATIONS[act](h)


def autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The autocast dtype in force for ``x``'s device (the trainer's bf16 on CUDA, ``moelab.train``), else None."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None


def check_input_dtype(x: torch.Tensor, param_dtype: torch.dtype, what: str = "x") -> None:
    """``x`` must have the parameters' dtype, except under autocast, where the expert matmuls run in the autocast
    dtype whatever the input's (bf16 hidden states of an autocast FFN meeting fp32 adapters)."""
    if x.dtype != param_dtype and autocast_dtype(x) is None:
        raise ValueError(f"{what} dtype {x.dtype} != expert parameter dtype {param_dtype}; cast the input or the "
                         "module (.to(dtype)), or run under torch.autocast")


def _autocast(*ts):
    """Under autocast, the tensors in the autocast dtype (as ``F.linear`` casts its inputs): grouped_mm and the fused
    per-expert FFN are not on autocast's list of ops, so they are cast here; without autocast, unchanged."""
    dt = autocast_dtype(next(t for t in ts if t is not None))
    return ts if dt is None else tuple(None if t is None else t.to(dt) for t in ts)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous (grouped_mm's backward rejects expanded grads,
    e.g. the stride-0 gradient of ``y.sum()``)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g.contiguous()


# --------------------------------------------------------------------------------------------- grouped mm over offsets
def offsets_mm(xs: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """out_s = W[e(s)] x_s for rows ``xs [S,in]`` grouped by expert (expert e: rows ``offs[e-1]:offs[e]``),
    ``w [E,out,in]``, ``offs [E]`` int32 on xs's device   -> [S,out].

    One ``torch.nn.functional.grouped_mm`` call (the offsets path, issue 50): no host sync on CUDA in bf16 (sm90+;
    torch's fallback for other dtypes copies ``offs`` to the host). ``w.transpose`` is a view: the kernel takes the
    column-major operand as it is. :func:`offsets_mm_reference` is the loop it must equal (tests)."""
    return F.grouped_mm(xs, w.transpose(-2, -1), offs=offs)


def offsets_mm_reference(xs: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """The reference of :func:`offsets_mm`: one ``x W[e]^T`` per group, read from ``offs`` on the host (CPU tests;
    rows past ``offs[-1]``, which the offsets path never has, are zero)."""
    out = xs.new_zeros(xs.shape[0], w.shape[1])
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = xs[start:end] @ w[e].t()
        start = end
    return out


def _offsets_ok(x: torch.Tensor, *ws: torch.Tensor) -> bool:
    """Whether the offsets path can run grouped_mm on ``x [T,in]`` (prepared: the autocast dtype under autocast) and
    weights ``ws`` (each [E,out,in]): grouped_mm exists, the dtypes agree once autocast has cast the weights, the
    device is sm80+ on CUDA, and every row stride is a multiple of 16 bytes (the kernel's rule; the gathered rows and
    the activations are fresh, aligned tensors)."""
    if not hasattr(F, "grouped_mm"):
        return False
    dt = autocast_dtype(x)
    if any((dt or w.dtype) != x.dtype for w in ws):
        return False
    if x.device.type == "cuda" and torch.cuda.get_device_capability(x.device) < (8, 0):
        return False
    es = x.element_size()
    return all((n * es) % 16 == 0 for w in ws for n in w.shape[1:]) and (x.shape[-1] * es) % 16 == 0


def _grouped_mm_ok(xs: torch.Tensor, w: torch.Tensor) -> bool:
    if not hasattr(F, "grouped_mm") or xs.dtype != w.dtype:
        return False
    if xs.device.type == "cuda" and torch.cuda.get_device_capability(xs.device) < (8, 0):
        return False
    es = xs.element_size()
    # 16-byte aligned base pointers and row strides (the kernel's requirement)
    return (xs.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0 and (xs.shape[-1] * es) % 16 == 0
            and (w.shape[-2] * es) % 16 == 0 and (w.shape[-1] * es) % 16 == 0)


IMPLS = ("auto", "grouped_mm", "loop", "fused")


def _resolve_impl(impl: str, xs: torch.Tensor, w: torch.Tensor) -> str:
    """"auto": grouped_mm on CUDA when its alignment rules allow, else the fused per-expert loop (faster than
    torch's CPU grouped_mm, which is itself a loop of mm with a concatenating backward; see benchmarks/README.md)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "grouped_mm" if (xs.device.type == "cuda" and _grouped_mm_ok(xs, w)) else "fused"
    return impl


def grouped_linear(xs: torch.Tensor, w: torch.Tensor, counts: list[int], offs: torch.Tensor | None,
                   bias: torch.Tensor | None = None, impl: str = "auto", expert_ids: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """Rows of ``xs [S,in]`` sorted by expert (``counts[e]`` rows for expert e) times ``w[e]^T`` (``w [E,out,in]``).

    impl: ``"grouped_mm"`` (``torch.nn.functional.grouped_mm``, one kernel; needs 16-byte aligned strides),
    ``"loop"`` (one ``F.linear`` per non-empty expert), ``"auto"``/``"fused"`` (grouped_mm when allowed, else loop).
    (Whole-FFN ``"fused"`` and ``"auto"`` choices are made in :meth:`StackedExperts.grouped_forward`.)
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    use_gm = impl == "grouped_mm" or (impl in ("auto", "fused") and _grouped_mm_ok(xs, w))
    if use_gm and xs.shape[0] > 0:
        if offs is None:
            offs = torch.tensor(counts, device=xs.device).cumsum(0).to(torch.int32)
        xs = xs.contiguous()
        out = _ContiguousGrad.apply(F.grouped_mm(xs, w.transpose(-2, -1), offs=offs))   # [S,out]
        if bias is not None:
            if expert_ids is None:
                expert_ids = torch.repeat_interleave(torch.arange(len(counts), device=xs.device),
                                                     torch.tensor(counts, device=xs.device))
            out = out + bias[expert_ids]
        return out
    outs = []
    ws = w.unbind(0)                           # one unbind: its backward stacks once (w[e] would zero-fill [E,..] per e)
    bs = bias.unbind(0) if bias is not None else [None] * len(ws)
    for e, chunk in enumerate(xs.split(counts)):
        if chunk.shape[0]:
            outs.append(F.linear(chunk, ws[e], bs[e]))
    if not outs:
        return xs.new_zeros(0, w.shape[1])
    return torch.cat(outs)


class _FusedExpertFFN(torch.autograd.Function):
    """Per-expert FFN y_e = W_out[e] a(W_in[e] x_e + b_in[e]) + b_out[e] over expert-sorted rows, with a hand-written
    backward that writes each expert's weight gradients straight into one [E, ...] buffer.

    Why by hand: autograd over a per-expert loop (or torch's CPU grouped_mm, itself a loop of mm) pays a select/cat
    backward per expert (zero-filled [E, ...] buffers, concatenations); this does one mm per expert and projection.
    """

    @staticmethod
    def forward(ctx, xs, w_in, w_out, b_in, b_out, counts, act):
        S = xs.shape[0]
        out = xs.new_empty(S, w_out.shape[1])
        hs = xs.new_empty(S, w_in.shape[1])
        start = 0
        for e, n in enumerate(counts):
            if n:
                sl = slice(start, start + n)
                torch.mm(xs[sl], w_in[e].t(), out=hs[sl])                                  # h = W_in x   [n, f']
                if b_in is not None:
                    hs[sl] += b_in[e]
                torch.mm(apply_act(hs[sl], act), w_out[e].t(), out=out[sl])                # y = W_out a(h)   [n, d]
                if b_out is not None:
                    out[sl] += b_out[e]
                start += n
        ctx.save_for_backward(xs, w_in, w_out, hs)
        ctx.counts, ctx.act, ctx.has_b = counts, act, (b_in is not None, b_out is not None)
        return out

    @staticmethod
    def backward(ctx, g):
        xs, w_in, w_out, hs = ctx.saved_tensors
        g = g.contiguous()
        need_x, need_wi, need_wo, need_bi, need_bo = ctx.needs_input_grad[:5]
        # every row of xs belongs to one expert, so gx is fully written; weight grads are zeroed only for experts
        # without tokens (saves a full zero-fill of the [E, ...] buffers)
        gx = torch.empty_like(xs) if need_x else None
        gwi = torch.empty_like(w_in) if need_wi else None
        gwo = torch.empty_like(w_out) if need_wo else None
        for e, n in enumerate(ctx.counts):
            if not n:
                for buf in (gwi, gwo):
                    if buf is not None:
                        buf[e].zero_()
        gbi = w_in.new_zeros(w_in.shape[:2]) if (need_bi and ctx.has_b[0]) else None
        gbo = w_out.new_zeros(w_out.shape[:2]) if (need_bo and ctx.has_b[1]) else None
        start = 0
        for e, n in enumerate(ctx.counts):
            if not n:
                continue
            sl = slice(start, start + n)
            start += n
            with torch.enable_grad():
                h = hs[sl].detach().requires_grad_(True)
                a = apply_act(h, ctx.act)                                                   # recompute a(h)
            ge = g[sl]
            if gwo is not None:
                torch.mm(ge.t(), a.detach(), out=gwo[e])                                    # dW_out = g^T a
            if gbo is not None:
                gbo[e] = ge.sum(0)
            da = ge @ w_out[e]                                                              # da = g W_out   [n, f]
            dh, = torch.autograd.grad(a, h, da)                                             # dh = a'(h) * da
            if gwi is not None:
                torch.mm(dh.t(), xs[sl], out=gwi[e])                                        # dW_in = dh^T x
            if gbi is not None:
                gbi[e] = dh.sum(0)
            if gx is not None:
                torch.mm(dh, w_in[e], out=gx[sl])                                           # dx = dh W_in
        return gx, gwi, gwo, gbi, gbo, None, None


def fused_expert_ffn(xs, w_in, w_out, b_in, b_out, counts: list[int], act: str) -> torch.Tensor:
    """Expert-sorted rows xs [S,d] through their experts' FFNs (see :class:`_FusedExpertFFN`)   [S, d_out]."""
    counts = [int(c) for c in counts]
    if sum(counts) != xs.shape[0] or len(counts) != w_in.shape[0]:
        raise ValueError(f"counts (sum {sum(counts)}, {len(counts)} experts) do not match xs rows {xs.shape[0]} / "
                         f"{w_in.shape[0]} experts")
    return _FusedExpertFFN.apply(xs.contiguous(), w_in, w_out, b_in, b_out, counts, act)


# --------------------------------------------------------------------------------------------- optimiser state


def optimizer_replace_param(optimizer: torch.optim.Optimizer | None, old: nn.Parameter, new: nn.Parameter,
                            src_rows) -> None:
    """Swap ``old`` for ``new`` (grown along dim 0) in ``optimizer``, carrying its state.

    ``src_rows[i]`` = row of ``old`` whose state new row i inherits, or -1 for fresh zero state. Scalar states
    (Adam's ``step``) are kept. Used by :meth:`StackedExperts.grow` (MASS expansion).
    """
    if optimizer is None:
        return
    src = torch.as_tensor(src_rows, dtype=torch.long)
    if src.shape[0] != new.shape[0]:
        raise ValueError(f"src_rows has {src.shape[0]} entries, new parameter has {new.shape[0]} rows")
    for group in optimizer.param_groups:
        for i, p in enumerate(group["params"]):
            if p is old:
                group["params"][i] = new
    if old in optimizer.state:
        st = optimizer.state.pop(old)
        new_st = {}
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and v.shape == old.shape:
                nv = torch.zeros(new.shape, dtype=v.dtype, device=v.device)
                keep = src >= 0
                nv[keep.to(v.device)] = v[src[keep].to(v.device)]
                new_st[k] = nv
            else:
                new_st[k] = v
        optimizer.state[new] = new_st


def optimizer_copy_rows(optimizer: torch.optim.Optimizer | None, param: nn.Parameter, src: int, dst: int,
                        mode: str = "copy") -> None:
    """After copying expert ``src`` into slot ``dst`` in place: copy (``mode="copy"``) or zero (``"zero"``) the
    optimiser's per-row state of ``dst``."""
    if optimizer is None or param not in optimizer.state:
        return
    if mode not in ("copy", "zero"):
        raise ValueError(f"mode must be 'copy' or 'zero', got {mode!r}")
    for v in optimizer.state[param].values():
        if isinstance(v, torch.Tensor) and v.shape == param.shape:
            if mode == "copy":
                v[dst] = v[src]
            else:
                v[dst] = 0


# --------------------------------------------------------------------------------------------- experts
class StackedExperts(nn.Module):
    """E FFN experts in stacked tensors: ``w_in [E, f (2f for gated acts), d]``, ``w_out [E, d, f]``,
    optional ``b_in [E, f']``, ``b_out [E, d]``.

    Expert e: y = W_out[e] a(W_in[e] x + b_in[e]) + b_out[e], a = SwiGLU / GELU / ... (``act``).
    ``impl``: "auto" (the offsets path on CUDA when grouped_mm's alignment allows, else "fused"), "fused" (per-expert
    mm with a hand-written backward, :class:`_FusedExpertFFN`: the CPU default), "grouped_mm" (the offsets path on
    any device: :meth:`offsets_forward`, one ``torch.nn.functional.grouped_mm`` per projection over device offsets;
    issue 50), "loop" (autograd over per-expert ``F.linear``). All equal the naive loop to float tolerance (tests).
    """

    def __init__(self, num_experts: int, d_model: int, d_ff: int, act: str = "swiglu", bias: bool = False,
                 init_std: float = 0.02, impl: str = "auto"):
        super().__init__()
        if num_experts < 1 or d_model < 1 or d_ff < 1:
            raise ValueError(f"num_experts, d_model, d_ff must be >= 1, got {num_experts}, {d_model}, {d_ff}")
        self.act = _check_act(act)
        self.d_model, self.d_ff, self.impl = d_model, d_ff, impl
        f_in = 2 * d_ff if act in GATED else d_ff
        self.w_in = nn.Parameter(torch.randn(num_experts, f_in, d_model) * init_std)
        self.w_out = nn.Parameter(torch.randn(num_experts, d_model, d_ff) * init_std)
        if bias:
            self.b_in = nn.Parameter(torch.zeros(num_experts, f_in))
            self.b_out = nn.Parameter(torch.zeros(num_experts, d_model))
        else:
            self.b_in = self.b_out = None

    @property
    def num_experts(self) -> int:
        return self.w_in.shape[0]

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, d_model={self.d_model}, d_ff={self.d_ff}, act={self.act!r}, bias={self.b_in is not None}"

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """x [T,d] as the experts read it: in the autocast dtype under autocast, cast here once per token rather than
        once per (token, slot) after the gather."""
        return _autocast(x)[0]

    def use_offsets(self, x: torch.Tensor) -> bool:
        """Whether :func:`moe_dispatch` takes the offsets path (issue 50) for the prepared input x: ``impl`` is
        "grouped_mm", or "auto" on CUDA where grouped_mm's alignment rules allow (:func:`_offsets_ok`)."""
        if self.impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {self.impl!r}")
        return self.impl == "grouped_mm" or (self.impl == "auto" and x.device.type == "cuda"
                                             and _offsets_ok(x, self.w_in, self.w_out))

    def offsets_forward(self, xs: torch.Tensor, offs: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        """The offsets path (issue 50): rows xs [S,d] in expert order, group ends ``offs [E]`` int32 and the expert
        of each row ``expert_ids [S]``, all on the device   -> expert outputs [S,d] (autocast dtype under autocast).

        Two grouped matmuls, no host sync, no copy of xs:
          h = x W_in[e]^T + b_in[e] = [x W_g^T | x W_u^T]   [S, 2f]   (gate and up in one call: w_in = [W_g; W_u])
          a = silu(h_g) * h_u (SwiGLU; a(h) for the others)  [S, f]
          o = a W_out[e]^T + b_out[e]                         [S, d]
        """
        xs, w_in, w_out, b_in, b_out = _autocast(xs, self.w_in, self.w_out, self.b_in, self.b_out)
        h = offsets_mm(xs, w_in, offs)                                       # [S, f']
        if b_in is not None:
            h = h + b_in[expert_ids]
        o = offsets_mm(apply_act(h, self.act), w_out, offs)                  # [S, d]
        if b_out is not None:
            o = o + b_out[expert_ids]
        return o

    def forward_expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e on x [..., d] (the naive reference path)."""
        h = F.linear(x, self.w_in[e], None if self.b_in is None else self.b_in[e])
        return F.linear(apply_act(h, self.act), self.w_out[e], None if self.b_out is None else self.b_out[e])

    def grouped_forward(self, xs: torch.Tensor, counts: list[int], offs: torch.Tensor | None = None,
                        expert_ids: torch.Tensor | None = None) -> torch.Tensor:
        """xs [S,d] sorted by expert (counts[e] rows each) -> expert outputs [S,d] (in the autocast dtype under
        autocast)."""
        xs, w_in, w_out, b_in, b_out = _autocast(xs, self.w_in, self.w_out, self.b_in, self.b_out)
        if _resolve_impl(self.impl, xs, w_in) == "fused":
            return fused_expert_ffn(xs, w_in, w_out, b_in, b_out, counts, self.act)
        h = grouped_linear(xs, w_in, counts, offs, b_in, self.impl, expert_ids)                  # [S, f']
        return grouped_linear(apply_act(h, self.act), w_out, counts, offs, b_out, self.impl, expert_ids)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """All experts on all tokens: x [T,d] -> [T,E,d] (soft merging / small pools)."""
        return torch.stack([self.forward_expert(e, x) for e in range(self.num_experts)], dim=1)

    def _params(self):
        return [n for n in ("w_in", "w_out", "b_in", "b_out") if getattr(self, n) is not None]

    @torch.no_grad()
    def copy_expert(self, src: int, dst: int, optimizer: torch.optim.Optimizer | None = None,
                    state: str = "copy") -> None:
        """Copy expert ``src`` into slot ``dst`` (all its weights); optimiser rows copied or zeroed (``state``)."""
        for e, nm in ((src, "src"), (dst, "dst")):
            if not 0 <= e < self.num_experts:
                raise ValueError(f"{nm}={e} out of range [0, {self.num_experts})")
        for n in self._params():
            p = getattr(self, n)
            p[dst] = p[src]
            optimizer_copy_rows(optimizer, p, src, dst, state)

    def grow(self, n: int, copy_from: list[int] | None = None, optimizer: torch.optim.Optimizer | None = None
             ) -> list[int]:
        """Append n experts (copies of ``copy_from[i]``, or freshly initialised when None / -1). Parameters are
        replaced by larger ones; pass ``optimizer`` to move its state along. Returns the new expert ids."""
        if n < 1:
            raise ValueError(f"grow needs n >= 1, got {n}")
        if copy_from is not None and len(copy_from) != n:
            raise ValueError(f"copy_from has {len(copy_from)} entries for n={n} new experts")
        E = self.num_experts
        src = list(range(E)) + (list(copy_from) if copy_from is not None else [-1] * n)
        for name in self._params():
            old = getattr(self, name)
            extra = torch.zeros((n,) + old.shape[1:], dtype=old.dtype, device=old.device)
            if name.startswith("w_"):
                extra.normal_(0, float(old.detach().std()) if old.numel() > 1 else 0.02)
            for i, s in enumerate(src[E:]):
                if s is not None and s >= 0:
                    extra[i] = old.detach()[s]
            new = nn.Parameter(torch.cat([old.detach(), extra]), requires_grad=old.requires_grad)
            setattr(self, name, new)
            optimizer_replace_param(optimizer, old, new, [s if s is not None else -1 for s in src])
        return list(range(E, E + n))


class AdapterExperts(nn.Module):
    """PESC adapter experts around a frozen dense FFN E (Wu et al. 2024, "Parameter-efficient sparsity crafting",
    Sec. 3.2; notebook ``01_moce``): A_i(x) = E(x) + s * W_up^i act(W_down^i E(x)), W_up zero-initialised so every
    expert equals the dense FFN at init. ``w_down [N, r, d]``, ``w_up [N, d, r]``; the dense FFN runs once per token
    (``prepare``), the adapters run grouped on its output.
    """

    def __init__(self, dense_ffn: nn.Module, num_experts: int, rank: int = 64, scale: float = 1.0, act: str = "gelu",
                 d_model: int | None = None, dropout: float = 0.0, impl: str = "auto"):
        super().__init__()
        if act in GATED:
            raise ValueError(f"adapter act must be non-gated, got {act!r}")
        self.act = _check_act(act)
        if d_model is None:
            d_model = _infer_d_model(dense_ffn)
        self.dense = dense_ffn
        for p in self.dense.parameters():
            p.requires_grad_(False)
        self.d_model, self.rank, self.scale, self.impl = d_model, rank, scale, impl
        self.dropout = nn.Dropout(dropout)
        self.w_down = nn.Parameter(torch.empty(num_experts, rank, d_model))
        nn.init.kaiming_uniform_(self.w_down.view(-1, d_model), a=math.sqrt(5))   # nn.Linear's default init
        self.w_up = nn.Parameter(torch.zeros(num_experts, d_model, rank))      # W_up = 0 at init

    @property
    def num_experts(self) -> int:
        return self.w_down.shape[0]

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(x)                                                 # E(x), computed once per token [T,d]

    def adapter(self, e: int, h: torch.Tensor) -> torch.Tensor:
        return h + self.scale * F.linear(apply_act(F.linear(self.dropout(h), self.w_down[e]), self.act), self.w_up[e])

    def forward_expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """A_e(x) = E(x) + s W_up^e act(W_down^e E(x))   (PESC Eq. 3)."""
        return self.adapter(e, self.dense(x))

    def use_offsets(self, hs: torch.Tensor) -> bool:
        """Whether :func:`moe_dispatch` takes the offsets path for the prepared input hs = E(x) (see
        :meth:`StackedExperts.use_offsets`)."""
        if self.impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {self.impl!r}")
        return self.impl == "grouped_mm" or (self.impl == "auto" and hs.device.type == "cuda"
                                             and _offsets_ok(hs, self.w_down, self.w_up))

    def offsets_forward(self, hs: torch.Tensor, offs: torch.Tensor, expert_ids: torch.Tensor | None = None
                        ) -> torch.Tensor:
        """The offsets path (issue 50): hs = E(x) [S,d] in expert order, group ends offs [E]   -> A_e(x) [S,d]:
        hs + s W_up[e] act(W_down[e] hs), two grouped matmuls over device offsets."""
        xs, w_down, w_up = _autocast(self.dropout(hs), self.w_down, self.w_up)
        a = apply_act(offsets_mm(xs, w_down, offs), self.act)                # [S, r]
        return hs + self.scale * offsets_mm(a, w_up, offs)                   # [S, d]

    def grouped_forward(self, hs: torch.Tensor, counts: list[int], offs: torch.Tensor | None = None,
                        expert_ids: torch.Tensor | None = None) -> torch.Tensor:
        xs, w_down, w_up = _autocast(self.dropout(hs), self.w_down, self.w_up)   # autocast dtype under autocast
        if _resolve_impl(self.impl, xs, w_down) == "fused":
            return hs + self.scale * fused_expert_ffn(xs, w_down, w_up, None, None, counts, self.act)
        a = apply_act(grouped_linear(xs, w_down, counts, offs, None, self.impl), self.act)
        return hs + self.scale * grouped_linear(a, w_up, counts, offs, None, self.impl)

    @torch.no_grad()
    def copy_expert(self, src: int, dst: int, optimizer=None, state: str = "copy") -> None:
        for p in (self.w_down, self.w_up):
            p[dst] = p[src]
            optimizer_copy_rows(optimizer, p, src, dst, state)

    def grow(self, n: int, copy_from: list[int] | None = None, optimizer=None) -> list[int]:
        E = self.num_experts
        src = list(range(E)) + (list(copy_from) if copy_from is not None else [-1] * n)
        for name in ("w_down", "w_up"):
            old = getattr(self, name)
            extra = torch.zeros((n,) + old.shape[1:], dtype=old.dtype, device=old.device)
            if name == "w_down":
                nn.init.kaiming_uniform_(extra.view(-1, self.d_model), a=math.sqrt(5))
            for i, s in enumerate(src[E:]):
                if s >= 0:
                    extra[i] = old.detach()[s]
            new = nn.Parameter(torch.cat([old.detach(), extra]))
            setattr(self, name, new)
            optimizer_replace_param(optimizer, old, new, src)
        return list(range(E, E + n))


def _infer_d_model(ffn: nn.Module) -> int:
    for name in ("down_proj", "fc2", "dense_out"):
        m = getattr(ffn, name, None)
        if isinstance(m, nn.Linear):
            return m.out_features
    lins = [m for m in ffn.modules() if isinstance(m, nn.Linear)]
    if not lins:
        raise ValueError(f"cannot infer d_model of {type(ffn).__name__}; pass d_model=")
    return lins[-1].out_features
