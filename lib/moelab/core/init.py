"""Initialisers that turn a dense FFN into MoE experts (upcycling; paper 002 "cluster-aware upcycling" notebook
``03_upcycling`` and the Drop-Upcycling baseline).

Hook signature (used by :func:`moelab.core.convert.moeify` and :meth:`MoELayer.from_dense`):
``init(dense_ffn: nn.Module, layer: MoELayer, calib_x: Tensor[T,d] | None) -> None`` sets the experts (and may set the
router weights; otherwise the router keeps its N(0, 0.02^2) init).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

__all__ = ["FFNSpec", "dense_ffn_spec", "sparse_upcycle", "noise_upcycle", "drop_upcycle", "noise_init", "drop_init",
           "resolve_init", "BertFFN", "stacked_experts"]


@dataclass
class FFNSpec:
    """Dense FFN y = W_out a(W_in x + b_in) + b_out. ``w_in [f' , d]`` (gated: [gate; up], f' = 2f), ``w_out [d, f]``."""

    w_in: torch.Tensor
    w_out: torch.Tensor
    b_in: torch.Tensor | None
    b_out: torch.Tensor | None
    act: str

    @property
    def d_model(self) -> int:
        return self.w_out.shape[0]

    @property
    def d_ff(self) -> int:
        return self.w_out.shape[1]


class BertFFN(nn.Module):
    """BERT's FFN path as one module: ``output.dense(act(intermediate.dense(x)))`` (without the output LayerNorm and
    residual, which stay in ``BertOutput``). Wraps the original Linear modules (no copy)."""

    def __init__(self, bert_layer: nn.Module):
        super().__init__()
        self.fc_in = bert_layer.intermediate.dense
        self.act_fn = bert_layer.intermediate.intermediate_act_fn
        self.fc_out = bert_layer.output.dense

    def forward(self, x):
        return self.fc_out(self.act_fn(self.fc_in(x)))


def _act_name(mod, gated: bool) -> str:
    n = type(mod).__name__ if not isinstance(mod, str) else mod
    n_l = n.lower()
    if "tanh" in n_l or "gelu_new" in n_l or "newgelu" in n_l:
        base = "gelu_tanh"
    elif "gelu" in n_l:
        base = "gelu"
    elif "silu" in n_l or "swish" in n_l:
        base = "silu"
    elif "relu" in n_l:
        base = "relu"
    else:
        raise ValueError(f"unsupported FFN activation {n!r}")
    if gated:
        return {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu_tanh"}.get(base) or _bad(base)
    return base


def _bad(base):
    raise ValueError(f"unsupported gated activation {base!r}")


def dense_ffn_spec(ffn: nn.Module) -> FFNSpec:
    """Read the weights of a dense FFN: LlamaMLP-style (``gate_proj``/``up_proj``/``down_proj``, SwiGLU; also Qwen2,
    Gemma with GeGLU-tanh), a BERT layer / :class:`BertFFN` (``intermediate.dense`` + ``output.dense``, GELU, biases),
    ``fc1``/``fc2`` MLPs (GELU), or ``nn.Sequential(Linear, act, Linear)``."""
    if all(hasattr(ffn, n) for n in ("gate_proj", "up_proj", "down_proj")):
        g, u, dn = ffn.gate_proj, ffn.up_proj, ffn.down_proj
        b_in = None if g.bias is None else torch.cat([g.bias, u.bias])
        return FFNSpec(torch.cat([g.weight, u.weight]), dn.weight, b_in, dn.bias, _act_name(ffn.act_fn, True))
    if hasattr(ffn, "intermediate") and hasattr(ffn, "output") and hasattr(ffn.output, "dense"):
        ffn = BertFFN(ffn)
    if isinstance(ffn, BertFFN):
        return FFNSpec(ffn.fc_in.weight, ffn.fc_out.weight, ffn.fc_in.bias, ffn.fc_out.bias, _act_name(ffn.act_fn, False))
    if hasattr(ffn, "fc1") and hasattr(ffn, "fc2"):
        act = getattr(ffn, "activation_fn", None) or getattr(ffn, "act", None) or "gelu"
        return FFNSpec(ffn.fc1.weight, ffn.fc2.weight, ffn.fc1.bias, ffn.fc2.bias, _act_name(act, False))
    if isinstance(ffn, nn.Sequential) and len(ffn) == 3 and isinstance(ffn[0], nn.Linear) and isinstance(ffn[2], nn.Linear):
        return FFNSpec(ffn[0].weight, ffn[2].weight, ffn[0].bias, ffn[2].bias, _act_name(ffn[1], False))
    raise ValueError(f"unsupported dense FFN type {type(ffn).__name__} (expected LlamaMLP-like, BERT layer, fc1/fc2 "
                     f"or Sequential(Linear, act, Linear))")


def stacked_experts(layer):
    """The layer's :class:`moelab.core.experts.StackedExperts` (``w_in``/``w_out`` stacked over experts), or a
    ValueError naming the layer type. Used by the cluster-aware initialiser and :func:`expert_similarity` (moved from
    ``moelab.cluster_upcycling._experts_module``)."""
    ex = getattr(layer, "experts", None)
    if ex is None or not hasattr(ex, "w_in"):
        raise ValueError(f"{type(layer).__name__} has no stacked experts with w_in/w_out (moelab.core.experts)")
    return ex


@torch.no_grad()
def _copy_into(layer, spec: FFNSpec) -> None:
    ex = layer.experts
    if not hasattr(ex, "w_in"):
        raise ValueError(f"initialisers need StackedExperts, got {type(ex).__name__}")
    if ex.w_in.shape[1:] != spec.w_in.shape or ex.w_out.shape[1:] != spec.w_out.shape:
        raise ValueError(f"expert shapes {tuple(ex.w_in.shape[1:])}/{tuple(ex.w_out.shape[1:])} != dense FFN "
                         f"{tuple(spec.w_in.shape)}/{tuple(spec.w_out.shape)}")
    if ex.act != spec.act:
        raise ValueError(f"expert act {ex.act!r} != dense FFN act {spec.act!r}")
    ex.w_in.copy_(spec.w_in.expand_as(ex.w_in))                              # W_in^e = W_in for every expert e
    ex.w_out.copy_(spec.w_out.expand_as(ex.w_out))
    if spec.b_in is not None:
        if ex.b_in is None:
            raise ValueError("dense FFN has biases; build the MoE layer with bias=True")
        ex.b_in.copy_(spec.b_in.expand_as(ex.b_in))
    if spec.b_out is not None:
        if layer.shared_bias is not None:                                    # move b_out to the shared bias (added once)
            layer.shared_bias.copy_(spec.b_out)
            if ex.b_out is not None:
                ex.b_out.zero_()
        elif ex.b_out is not None:
            ex.b_out.copy_(spec.b_out.expand_as(ex.b_out))
        else:
            raise ValueError("dense FFN has an output bias; use bias=True or shared_bias=True")


def sparse_upcycle(dense_ffn: nn.Module, layer, calib_x: torch.Tensor | None = None) -> None:
    """Sparse upcycling (Komatsuzaki et al. 2023): every expert is a copy of the dense FFN; router random
    (N(0, 0.02^2), left as built). With renormalised top-k the MoE equals the dense FFN at init; without
    renormalisation its output is the dense output times the kept routing mass sum_{j in topk} p_j."""
    _copy_into(layer, dense_ffn_spec(dense_ffn))


def noise_init(scale: float = 0.01, seed: int = 0) -> Callable:
    """Noise-injected copies: W^e = W + eps, eps ~ N(0, (scale * std(W))^2) per matrix, independent per expert."""

    @torch.no_grad()
    def init(dense_ffn, layer, calib_x=None):
        _copy_into(layer, dense_ffn_spec(dense_ffn))
        gen = torch.Generator().manual_seed(seed)
        for p in (layer.experts.w_in, layer.experts.w_out):
            std = float(p[0].std())
            p.add_((torch.randn(p.shape, generator=gen) * scale * std).to(p))
    return init


def drop_init(ratio: float = 0.5, router_std: float = 0.02, seed: int = 0) -> Callable:
    """Drop-Upcycling (Nakamura et al. 2025; Taishi-N324/Drop-Upcycling ``drop_upcycling.py``): copy the FFN, then per
    expert re-draw a random ``ratio`` of the intermediate dimension -- rows of the gate/up (W_in) and columns of W_out --
    from N(mean, std) of the dropped slice (statistics per matrix); router ~ N(0, router_std^2). Biases stay copied."""
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"ratio must be in [0, 1], got {ratio!r}")

    @torch.no_grad()
    def init(dense_ffn, layer, calib_x=None):
        spec = dense_ffn_spec(dense_ffn)
        _copy_into(layer, spec)
        ex = layer.experts
        gen = torch.Generator().manual_seed(seed)
        f = spec.d_ff
        n_drop = int(round(ratio * f))
        gated = ex.w_in.shape[1] == 2 * f
        for e in range(ex.num_experts):
            idx = torch.randperm(f, generator=gen)[:n_drop]
            row_sets = [idx, idx + f] if gated else [idx]                     # gate rows and up rows
            for rows in row_sets:
                sl = ex.w_in[e, rows]
                ex.w_in[e, rows] = (torch.randn(sl.shape, generator=gen) * sl.std() + sl.mean()).to(sl)
            sl = ex.w_out[e][:, idx]
            ex.w_out[e][:, idx] = (torch.randn(sl.shape, generator=gen) * sl.std() + sl.mean()).to(sl)
        w = layer._router_rows()
        if w is not None:
            w.copy_(torch.randn(w.shape, generator=gen) * router_std)
    return init


noise_upcycle = noise_init()
drop_upcycle = drop_init()


def resolve_init(init) -> Callable:
    """"sparse" | "noise" | "drop" | callable(dense_ffn, layer, calib_x) -> the initialiser."""
    if callable(init):
        return init
    table = {"sparse": sparse_upcycle, "noise": noise_upcycle, "drop": drop_upcycle}
    if init not in table:
        raise ValueError(f"init must be 'sparse', 'noise', 'drop' or a callable, got {init!r}")
    return table[init]
