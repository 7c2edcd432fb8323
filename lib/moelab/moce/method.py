"""The MoCE layer and its routing equations (Eo et al., §3.1-3.4, Eqs. 1-6; notebook ``notebooks/01_moce.py``).

PESC adapter experts (Wu et al. 2024) on a frozen dense FFN, grouped into M groups of N experts with a group-specific
router each; the sequence's group id (its cluster, :mod:`moelab.moce.clustering`) is set on the layer before the forward
pass (:func:`group_context`); an optional general group with its own router is added for every token (Eq. 6).
Baselines (dense adapter, PESC, sequence-only, soft merging, BTX's merged branches) are settings of the same layer, so
every variant shares one code path and the parameter counts are comparable. No I/O, caching or plotting here.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn

from moelab.core.dispatch import moe_dispatch
from moelab.core.experts import AdapterExperts
from moelab.core.losses import load_balancing_loss
from moelab.core.routing import GroupRouter, LinearRouter

__all__ = ["ROUTINGS", "BTX_DOMAINS", "MoCESpec", "variant_spec", "MoCEFFN", "decoder_layers", "top_layer_ids",
           "install", "uninstall", "moce_layers", "aux_loss", "group_context", "set_group_ids", "trainable_state",
           "count_parameters", "active_adapter_params", "btx_branch_spec", "btx_merge_states"]

ROUTINGS = ("topk", "soft")
BTX_DOMAINS = ("maths", "code", "reasoning")  # the suite's instruction-mix domains (moelab.suite.instruct)


@dataclass(frozen=True)
class MoCESpec:
    """One FFN-adapter configuration; every compared model is one of these (so parameter counts are comparable).

    ``num_groups`` M (= clusters), ``experts_per_group`` N, token ``top_k`` inside the group, adapter ``rank`` (width)
    and ``scale`` s (PESC), ``routing`` "topk" or "soft" (soft merging, §3.3), ``num_general`` general experts with a
    general router (Eq. 6; 0 = plain MoCE), ``balance_coef`` weight of the Switch/GShard balancing loss (§4.1
    "load-balancing loss"; 0 for soft merging, where every expert is used and the loss is constant).

    Token weights (:attr:`softmax_over`): with k >= 2, PESC's router (softmax over the k kept logits, Σ w = 1); with
    k = 1, the softmax-over-N probability of Eqs. 1-3 (``TopK(R(x)_i, 1) = R(x)_i``), so the router of the top-1
    ablation gets a gradient from the task loss (a softmax over one kept logit is exactly 1).

    Named presets: :func:`variant_spec`.
    """

    name: str
    num_groups: int = 1
    experts_per_group: int = 1
    top_k: int = 1
    rank: int = 64
    scale: float = 1.0
    routing: str = "topk"
    num_general: int = 0
    general_top_k: int = 2
    balance_coef: float = 0.01
    uses_clusters: bool = False

    def __post_init__(self):
        for f in ("num_groups", "experts_per_group", "top_k", "rank"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"MoCESpec.{f} must be a positive int, got {v!r}")
        if self.top_k > self.experts_per_group:
            raise ValueError(f"MoCESpec.top_k={self.top_k} exceeds experts_per_group={self.experts_per_group}")
        if self.routing not in ROUTINGS:
            raise ValueError(f"MoCESpec.routing must be one of {ROUTINGS}, got {self.routing!r}")
        if self.num_general < 0 or (self.num_general and self.general_top_k > self.num_general):
            raise ValueError(f"MoCESpec.num_general={self.num_general} / general_top_k={self.general_top_k} invalid")

    @property
    def num_experts(self) -> int:
        return self.num_groups * self.experts_per_group

    @property
    def softmax_over(self) -> str:
        """The core router's ``softmax_over`` for the group routers: "topk" (PESC) for k >= 2, "all" (Eqs. 1-3) for
        k = 1."""
        return "topk" if self.top_k > 1 else "all"

    @property
    def general_softmax_over(self) -> str:
        return "topk" if self.general_top_k > 1 else "all"


def variant_spec(name: str, num_groups: int, experts_per_group: int, rank: int = 64, top_k: int = 2,
                 **kw) -> MoCESpec:
    """The compared models (Table 1, Table 3, Table 4), all with M*N adapter experts of width ``rank`` per layer
    unless stated:

    - ``dense``: LLaMA (A): one adapter of width M*N*rank (same trainable adapter parameters as M*N experts).
    - ``pesc``: PESC: one pool of M*N experts, token top-k (no clustering) = Table 4 "w/o clustering".
    - ``moce``: M groups of N experts, group = cluster, top-k inside the group (Eq. 5).
    - ``moce_gen``: MoCE (V): plus N general experts and a general router over all tokens (Eq. 6).
    - ``moce_top1``: Table 4 "w/ Top-1": top-1 inside the group, weight = the softmax-over-N probability (Eqs. 1-3),
      so the router learns from the task loss.
    - ``moce_soft``: Table 4 "w/ Soft Merging": all N experts of the group, softmax weights.
    - ``seq_only``: Table 4 "w/o token routing" = Table 3's "4x1": M groups of ONE expert each, of width ``rank``
      (the paper's rank 64; every token of the sequence goes to its cluster's expert, weight 1, no router).
    - ``domain``: one PESC pool (M*N experts) trained on one domain only (the Specialized-* rows).
    - ``btx``: BTX (A) (Sukhbaatar et al. 2024, as MoCE §4.1 "Baselines" uses it): one expert per source domain
      (:data:`BTX_DOMAINS`), each a dense adapter of width M*N*rank // |D| (same adapter budget, rounded down),
      token top-k over them with a new router; trained by :func:`moelab.moce.train_btx`.
    """
    M, N = num_groups, experts_per_group
    n_dom = len(BTX_DOMAINS)
    presets = {
        "dense": dict(num_groups=1, experts_per_group=1, top_k=1, rank=M * N * rank, balance_coef=0.0),
        "pesc": dict(num_groups=1, experts_per_group=M * N, top_k=top_k),
        "domain": dict(num_groups=1, experts_per_group=M * N, top_k=top_k),
        "moce": dict(num_groups=M, experts_per_group=N, top_k=top_k, uses_clusters=True),
        "moce_gen": dict(num_groups=M, experts_per_group=N, top_k=top_k, num_general=N, general_top_k=top_k,
                         uses_clusters=True),
        "moce_top1": dict(num_groups=M, experts_per_group=N, top_k=1, uses_clusters=True),
        "moce_soft": dict(num_groups=M, experts_per_group=N, top_k=N, routing="soft", balance_coef=0.0,
                          uses_clusters=True),
        "seq_only": dict(num_groups=M, experts_per_group=1, top_k=1, rank=rank, balance_coef=0.0,
                         uses_clusters=True),
        "btx": dict(num_groups=1, experts_per_group=n_dom, top_k=min(top_k, n_dom), rank=max(1, M * N * rank // n_dom)),
    }
    if name not in presets:
        raise ValueError(f"unknown variant {name!r}; known: {sorted(presets)}")
    args = {"rank": rank, **presets[name], **kw}
    return MoCESpec(name=name, **args)


class MoCEFFN(nn.Module):
    """An FFN sub-layer with PESC adapter experts in M groups (MoCE §3.2-3.4; notebook ``01_moce``).

    h = E(x) is the frozen dense FFN, run once per token. Each expert is a PESC adapter A_i(h) = h + s·W_up^i act(W_down^i h)
    (``moelab.core.experts.AdapterExperts`` with an identity inner FFN, because h is shared). With Δ_i = A_i(h) - h:

        y = h + Σ_{i∈TopK(R^α(x), k)} w_i Δ_i^{G_α}(h) [+ Σ_{j∈TopK(R^gen(x), k)} w_j Δ_j^{gen}(h)]     (Eq. 5 / Eq. 6)

    With PESC's router (softmax over the k kept logits, Σ w = 1) the first sum equals Σ_i w_i A_i^{G_α} exactly as in
    Eq. 5; for Eq. 6 we count the shared h once (reading stated in the notebook: summing two full adapter mixtures would
    double E(x) and break the dense initialisation). α is the sequence's cluster: set it with :func:`group_context`
    before the forward pass; every token of sequence b uses group ``group_ids[b]``.
    After forward: ``aux_loss`` (balancing loss, token-weighted over groups), ``last_group_logits [T,N]``,
    ``last_indices [T,k]`` (global expert ids g*N+n).
    """

    def __init__(self, dense_ffn: nn.Module, d_model: int, spec: MoCESpec, act: str = "gelu"):
        super().__init__()
        self.spec, self.d_model = spec, d_model
        self.dense = dense_ffn
        for p in self.dense.parameters():
            p.requires_grad_(False)
        # adapters of all M*N group experts; global id g*N + n   (w_down [M*N, r, d], w_up [M*N, d, r])
        self.experts = AdapterExperts(nn.Identity(), spec.num_experts, rank=spec.rank, scale=spec.scale, act=act,
                                      d_model=d_model)
        # R^α(x) = softmax(W^α x) (Eq. 1) per group; k >= 2: PESC's softmax over the kept logits; k = 1: Eqs. 1-3
        self.router = GroupRouter(d_model, spec.num_groups, spec.experts_per_group, spec.top_k,
                                  softmax_over=spec.softmax_over) if spec.experts_per_group > 1 else None
        if spec.num_general:
            self.general = AdapterExperts(nn.Identity(), spec.num_general, rank=spec.rank, scale=spec.scale, act=act,
                                          d_model=d_model)
            self.general_router = LinearRouter(d_model, spec.num_general, spec.general_top_k,
                                               softmax_over=spec.general_softmax_over)
        else:
            self.general, self.general_router = None, None
        self.group_ids: torch.Tensor | None = None   # [B] set by group_context
        self.token_mask: torch.Tensor | None = None  # [B,S] (1 = real token) for the balancing loss, optional
        self.aux_loss = torch.zeros(())
        self.last_group_logits = None
        self.last_indices = None

    def _token_groups(self, B: int, S: int, device) -> torch.Tensor:
        M = self.spec.num_groups
        if M == 1:
            return torch.zeros(B * S, dtype=torch.long, device=device)
        g = self.group_ids
        if g is None:
            raise ValueError(f"this MoCE layer has M={M} expert groups: set the sequences' cluster ids with "
                             "moelab.moce.group_context(model, group_ids) before the forward pass")
        g = torch.as_tensor(g, device=device).long().view(-1)
        if g.shape[0] != B:
            raise ValueError(f"group_ids has {g.shape[0]} entries but the batch has B={B} sequences")
        if B and (int(g.min()) < 0 or int(g.max()) >= M):
            raise ValueError(f"group_ids must lie in [0, {M}), got [{int(g.min())}, {int(g.max())}]")
        return g.repeat_interleave(S)  # the sequence's group for each of its tokens   [T]

    @staticmethod
    def _mix(h, indices, weights, bank):
        """Σ_j w_j Δ_{i_j}(h) with Δ = A(h) - h, via the core's dropless dispatch   [T,d]."""
        outs = moe_dispatch(h, indices, None, bank)                    # A_{i_j}(h)   [T,k,d]
        deltas = outs - h[:, None, :]                                  # Δ_{i_j}(h)  [T,k,d]
        return torch.bmm(weights.to(h.dtype).unsqueeze(1), deltas).squeeze(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        if x.dim() == 2:
            x = x.unsqueeze(0)
        B, S, d = x.shape
        sp = self.spec
        h = self.dense(x).reshape(B * S, d)                             # E(x)   [T,d]
        xf = x.reshape(B * S, d)
        g = self._token_groups(B, S, x.device)                          # α per token   [T]
        N = sp.experts_per_group
        mask = None if self.token_mask is None else self.token_mask.reshape(-1).to(x.device).float()
        aux = h.new_zeros((), dtype=torch.float32)
        if self.router is None:                                         # one expert per group: sequence-only routing
            indices = g[:, None]                                        # [T,1]
            weights = torch.ones(B * S, 1, dtype=h.dtype, device=x.device)
        elif sp.routing == "soft":                                      # soft merging: all N experts of G_α
            z = self.router.logits(xf, g)                               # R^α logits   [T,N]
            self.last_group_logits = z
            weights = torch.softmax(z.float(), -1)                      # w_i = softmax(z)_i   [T,N]
            indices = g[:, None] * N + torch.arange(N, device=x.device)[None]
        else:                                                           # token top-k inside the group (Eqs. 3, 5)
            r = self.router(xf, g)                                      # weights [T,k], global indices [T,k]
            self.last_group_logits = self.router.last_logits
            weights, indices = r.weights, r.indices
            if sp.balance_coef:
                aux = aux + self._group_balance(self.router.last_logits, g, mask)
        self.last_indices = indices
        y = h + self._mix(h, indices, weights, self.experts)            # h + Σ_i w_i Δ_i^{G_α}(h)   (Eq. 5)
        if self.general is not None:                                    # + Σ_j w_j Δ_j^{gen}(h)     (Eq. 6)
            rg = self.general_router(xf)
            y = y + self._mix(h, rg.indices, rg.weights, self.general)
            if sp.balance_coef:
                z = self.general_router.logits(xf)
                aux = aux + load_balancing_loss(z, sp.num_general, sp.general_top_k,
                                                None if mask is None else mask.view(1, -1))
        self.aux_loss = aux
        return y.reshape(shape)

    def _group_balance(self, z, g, mask):
        """Balancing loss per group over that group's tokens, averaged with token weights   (scalar)."""
        total = z.new_zeros((), dtype=torch.float32)
        n_all = float(mask.sum()) if mask is not None else float(z.shape[0])
        for a in torch.unique(g).tolist():
            sel = g == a
            m = None if mask is None else mask[sel]
            n_a = float(m.sum()) if m is not None else float(sel.sum())
            if n_a == 0:
                continue
            total = total + (n_a / max(n_all, 1.0)) * load_balancing_loss(
                z[sel], self.spec.experts_per_group, self.spec.top_k, None if m is None else m.view(1, -1))
        return total


def decoder_layers(model) -> nn.ModuleList:
    """The decoder blocks of a Llama-format causal LM (``model.model.layers``)."""
    try:
        return model.model.layers
    except AttributeError:
        raise ValueError(f"{type(model).__name__} is not a Llama-format causal LM (no model.model.layers)") from None


def top_layer_ids(model, n_top: int | str) -> list[int]:
    """Indices of the adapted layers: the top ``n_top`` blocks, or all with ``n_top="all"`` (paper profile)."""
    L = len(decoder_layers(model))
    if n_top == "all":
        return list(range(L))
    if isinstance(n_top, bool) or not isinstance(n_top, int) or not 1 <= n_top <= L:
        raise ValueError(f"n_top must be 'all' or an int in [1, {L}], got {n_top!r}")
    return list(range(L - n_top, L))


def install(model, spec: MoCESpec, layers: Sequence[int], seed: int = 0) -> list[MoCEFFN]:
    """Replace the FFN (``mlp``) of the given decoder blocks by :class:`MoCEFFN` (frozen dense FFN inside) and freeze
    every other parameter. Reinstalling replaces an earlier MoCE layer (its dense FFN is reused). Returns the layers."""
    blocks = decoder_layers(model)
    d = model.config.hidden_size
    for p in model.parameters():
        p.requires_grad_(False)
    torch.manual_seed(seed)
    out = []
    for i in layers:
        dense = blocks[i].mlp.dense if isinstance(blocks[i].mlp, MoCEFFN) else blocks[i].mlp
        # on the frozen FFN's device: a model already on the GPU (trained, or placed by moelab.device) gets its
        # adapters there too (they were left on the CPU, so scoring after training failed on a device mismatch)
        blocks[i].mlp = MoCEFFN(dense, d, spec).to(next(dense.parameters()).device)
        out.append(blocks[i].mlp)
    return out


def uninstall(model) -> None:
    """Put the dense FFNs back (removes every MoCE layer)."""
    for b in decoder_layers(model):
        if isinstance(b.mlp, MoCEFFN):
            b.mlp = b.mlp.dense


def moce_layers(model) -> list[MoCEFFN]:
    return [m for m in model.modules() if isinstance(m, MoCEFFN)]


def aux_loss(model) -> torch.Tensor:
    """Σ over MoCE layers of their balancing loss (not yet multiplied by ``spec.balance_coef``)."""
    layers = moce_layers(model)
    if not layers:
        return torch.zeros(())
    return sum(m.aux_loss for m in layers)


def _group_tensor(group_ids) -> torch.Tensor | None:
    """Cluster ids as a long tensor [B]. A tensor keeps its device: a training batch's ``group_ids`` that Accelerate
    moved to the GPU is never copied to the host (``np.asarray`` on it raised "can't convert cuda:0 device type tensor
    to numpy"); lists and arrays become CPU tensors (the layer moves them to the tokens' device)."""
    if group_ids is None:
        return None
    if isinstance(group_ids, torch.Tensor):
        return group_ids.detach().long().view(-1)
    return torch.as_tensor(np.asarray(group_ids)).long().view(-1)


@contextlib.contextmanager
def group_context(model, group_ids, token_mask=None):
    """Set the sequences' cluster ids (stage 1 of MoCE's routing, §3.3) on every MoCE layer for the enclosed forward
    passes: ``group_ids [B]`` int, one per sequence of the batch; ``token_mask [B,S]`` optional (balancing loss)."""
    layers = moce_layers(model)
    gid = _group_tensor(group_ids)
    old = [(m.group_ids, m.token_mask) for m in layers]
    for m in layers:
        m.group_ids, m.token_mask = gid, token_mask
    try:
        yield
    finally:
        for m, (a, b) in zip(layers, old):
            m.group_ids, m.token_mask = a, b


def set_group_ids(model, group_ids) -> None:
    """Set the sequence cluster ids on every MoCE layer until changed (a plain per-request hook uses this)."""
    gid = _group_tensor(group_ids)
    for m in moce_layers(model):
        m.group_ids, m.token_mask = gid, None


def trainable_state(model) -> dict:
    """The trained parameters (adapters and routers) as a CPU state dict."""
    return {k: v.detach().cpu().clone() for k, v in model.named_parameters() if v.requires_grad}


def count_parameters(model) -> dict:
    """Trainable parameters split into adapters and routers, and the total (for the comparable-parameters table)."""
    adapters = routers = 0
    for k, v in model.named_parameters():
        if not v.requires_grad:
            continue
        if "router" in k:
            routers += v.numel()
        else:
            adapters += v.numel()
    return {"adapter_params": adapters, "router_params": routers, "trainable_params": adapters + routers}


def active_adapter_params(spec: MoCESpec, d_model: int, n_layers: int) -> int:
    """Adapter parameters used per token: (k group experts + k general experts) x 2·d·r per layer."""
    per = 2 * d_model * spec.rank
    k = spec.top_k + (spec.general_top_k if spec.num_general else 0)
    return n_layers * k * per


# ---------------------------------------------------------------------------------------------------------------------
# BTX (A): the branches' adapters become the experts of one layer (MoCE §4.1 "Baselines"; Sukhbaatar et al. 2024, §2)
# ---------------------------------------------------------------------------------------------------------------------
def btx_branch_spec(spec: MoCESpec) -> MoCESpec:
    """The *branch* model of BTX (A): one dense adapter of the merged experts' width (LLaMA (A) on one domain)."""
    return MoCESpec(name=f"{spec.name}_branch", num_groups=1, experts_per_group=1, top_k=1, rank=spec.rank,
                    scale=spec.scale, balance_coef=0.0)


def btx_merge_states(branch_states: Sequence[dict]) -> dict:
    """Branch (dense-adapter) states -> the merged layer's expert weights: expert d of each layer = branch d's adapter.

    Each branch state holds ``...mlp.experts.w_down [1, r, d]`` / ``w_up [1, d, r]`` per adapted layer; the merged
    state stacks them on the expert axis, ``[|D|, r, d]`` / ``[|D|, d, r]`` (BTX §2 "MiX": the branches' FFNs become
    the experts; the router is new and is not in the returned dict).
    """
    if len(branch_states) < 2:
        raise ValueError(f"btx_merge_states needs >= 2 branch states, got {len(branch_states)}")
    keys = sorted(branch_states[0])
    for i, st in enumerate(branch_states):
        if sorted(st) != keys:
            raise ValueError(f"branch {i} has parameters {sorted(st)[:3]}..., branch 0 has {keys[:3]}...")
        bad = [k for k in keys if not k.endswith(("experts.w_down", "experts.w_up")) or st[k].shape[0] != 1]
        if bad:
            raise ValueError(f"branch {i} is not a single dense adapter per layer: {bad[:3]}")
    return {k: torch.cat([st[k] for st in branch_states], 0) for k in keys}   # [|D|, ...] expert axis outer
