"""Routers: which experts see which token, with which weight.

Shared by every paper module (MoCE / PESC adapters: ``softmax_over="topk"`` and group routing; SBA / nomic:
top-k without renormalisation; MASS: top-p and growing pools; DynMoE baselines: cosine router and top-any gate).
Introduced in notebook ``00_primer`` (MoE primer). Shapes: T tokens, E experts, k top-k, d d_model.

Every router accepts ``active_mask [E] bool``: slots that are ``False`` (free slots of a growing pool) are
never chosen and get zero probability.

Routers must receive the task gradient. A route that keeps a single expert and renormalises its
weight (softmax over the one kept logit, or the kept weight divided by itself) gives that token weight exactly 1, so
the router logits get no gradient from the task loss, only from the balancing loss. No router here builds such a
route unless the caller asks for it through ``allow_gradient_free_routes=True`` (or, for top-p, through the MASS
authors' rule ``renormalize="mass_batch"``); by default a single kept expert keeps its raw probability
(Switch Transformer: y = p_i E_i(x)), and a configuration that would give every token weight 1 raises ``ValueError``.
(A pool with a single *active* expert has no routing decision to learn: its probability is 1 whatever the rule.)
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "RouteOut", "check_logits", "masked_logits", "check_renormalize", "check_route_gradient", "check_top_p_renormalize",
    "RENORMALIZE",
    "topk_route", "top_p_route", "soft_route",
    "group_topk_route", "dense_to_sparse", "LinearRouter", "GroupRouter", "CosineRouter", "TopAnyGate", "TopAnyOut",
]


class RouteOut(NamedTuple):
    """Result of a router: ``weights [T,k]`` (float32), ``indices [T,k]`` long (-1 = no expert), ``probs [T,E]``."""

    weights: torch.Tensor
    indices: torch.Tensor
    probs: torch.Tensor


# ----------------------------------------------------------------------------------------------- validation
def check_logits(logits: torch.Tensor, name: str = "logits") -> torch.Tensor:
    """Validate router logits ``[T,E]``: 2-D floating, no NaN (not checked on CUDA: a host sync). Raises
    ``ValueError`` naming the problem."""
    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"{name} must have shape [T, E], got {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"{name} must be floating point, got dtype {logits.dtype}")
    if logits.shape[1] == 0:
        raise ValueError(f"{name} has E=0 experts (shape {tuple(logits.shape)})")
    if logits.device.type != "cuda":   # on CUDA a host sync per call (issue 50); NaN logits give a NaN loss there,
        nan = torch.isnan(logits)        # which the trainer reports ("non-finite loss")
        if bool(nan.any()):
            where = nan.nonzero()[0].tolist()
            raise ValueError(f"{name} contains NaN ({int(nan.sum())} entries, first at [token, expert]={where})")
    return logits


def _check_active(active_mask: torch.Tensor | None, num_experts: int, device) -> torch.Tensor | None:
    if active_mask is None:
        return None
    if not isinstance(active_mask, torch.Tensor) or active_mask.dtype != torch.bool:
        raise ValueError(f"active_mask must be a bool tensor [E], got {getattr(active_mask, 'dtype', type(active_mask))}")
    if active_mask.shape != (num_experts,):
        raise ValueError(f"active_mask shape {tuple(active_mask.shape)} != (num_experts,)=({num_experts},)")
    if not bool(active_mask.any()):
        raise ValueError("active_mask has no active expert")
    return active_mask.to(device)


def _check_k(k: int, num_experts: int, active: torch.Tensor | None) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"top_k must be a positive int, got {k!r}")
    if k > num_experts:
        raise ValueError(f"top_k={k} > num_experts={num_experts}")
    if active is not None and k > int(active.sum()):
        raise ValueError(f"top_k={k} > number of active experts={int(active.sum())}")
    return k


def masked_logits(logits: torch.Tensor, active_mask: torch.Tensor | None) -> torch.Tensor:
    """Logits with free slots set to -inf (never chosen, zero softmax probability); float32."""
    logits = check_logits(logits).float()
    active = _check_active(active_mask, logits.shape[1], logits.device)
    if active is None:
        return logits
    return logits.masked_fill(~active, float("-inf"))


# ----------------------------------------------------------------------------------------------- task gradient
RENORMALIZE = (False, True, "mass_batch")
_FIXES = "or pass allow_gradient_free_routes=True to keep this on purpose"


def check_renormalize(renormalize) -> bool | str:
    """None -> False; a bool (Python or numpy) -> bool; "mass_batch" -> itself; anything else: ValueError."""
    if renormalize is None:
        return False
    if isinstance(renormalize, str):
        if renormalize == "mass_batch":
            return renormalize
    elif type(renormalize).__name__ in ("bool", "bool_"):
        return bool(renormalize)
    raise ValueError(f"renormalize must be one of {RENORMALIZE}, got {renormalize!r}")


def check_route_gradient(top_k: int, renormalize=False, softmax_over: str = "all",
                         allow_gradient_free_routes: bool = False) -> None:
    """Raise ``ValueError`` for a top-k configuration whose weights carry no task gradient to the router.

    Top-1 with ``renormalize=True`` (w = p_i / p_i = 1) or with ``softmax_over="topk"`` (softmax over one logit = 1)
    gives every token weight 1. ``renormalize="mass_batch"`` is allowed: with one kept expert it keeps the raw
    probability. ``allow_gradient_free_routes=True`` allows the gradient-free route on purpose.
    """
    if allow_gradient_free_routes or top_k != 1:
        return
    if renormalize is True:
        raise ValueError("top-1 with renormalised weights gives every token weight 1, so the router gets no gradient "
                         "from the task loss; use renormalize=False (Switch: raw probability) " + _FIXES)
    if softmax_over == "topk":
        raise ValueError("top-1 with softmax_over='topk' (softmax over the one kept logit) gives every token weight 1, "
                         "so the router gets no gradient from the task loss; use softmax_over='all' "
                         "(Switch: raw probability) " + _FIXES)


def check_top_p_renormalize(renormalize, p: float, allow_gradient_free_routes: bool = False) -> bool | str:
    """Validate top-p's ``renormalize`` (False | True | "mass_batch"); returns it (None -> False). Per-token
    renormalisation (True) with p < 1 gives weight 1 to every token whose top probability reaches p (it keeps one
    expert), so those tokens give the router no task gradient: ``ValueError`` unless
    ``allow_gradient_free_routes=True``."""
    renormalize = check_renormalize(renormalize)
    if renormalize is True and p < 1.0 and not allow_gradient_free_routes:
        raise ValueError(f"top-p (p={p}) with per-token renormalised weights gives weight 1 to every token that keeps a "
                         "single expert, so those tokens give the router no gradient from the task loss; use "
                         "renormalize=False (raw probabilities, Huang et al.), renormalize='mass_batch' (the MASS "
                         "authors' rule) " + _FIXES)
    return renormalize


def _renormalize_kept(weights: torch.Tensor, kept: torch.Tensor, renormalize) -> torch.Tensor:
    """weights [T,k or E] zero outside ``kept`` [T,k or E] bool -> renormalised per ``renormalize``.

    True: w_ti <- w_ti / sum_j w_tj per token.  "mass_batch" (psmiz/MASS ``extract_critical``): the same, but only
    when max_t |S_t| > 1 (some token of the batch keeps more than one expert); otherwise the raw probabilities."""
    if renormalize is False:
        return weights
    if renormalize == "mass_batch" and (kept.shape[0] == 0 or int(kept.sum(-1).max()) <= 1):
        return weights
    return weights / weights.sum(-1, keepdim=True)


# ----------------------------------------------------------------------------------------------- top-k
def topk_route(logits: torch.Tensor, k: int, renormalize: bool | str = False, softmax_over: str = "all",
               active_mask: torch.Tensor | None = None, allow_gradient_free_routes: bool = False) -> RouteOut:
    """Softmax top-k routing.

    ``softmax_over="all"``: p = softmax(z) over all (active) experts, keep the k largest p_i
    (Switch/GShard; Mixtral renormalises, nomic-embed-v2-moe / OLMoE / Qwen2-MoE defaults do not: their kept weights sum to < 1).
    ``softmax_over="topk"``: PESC (camelidae): keep the k largest raw logits and softmax over those k only
    (weights always sum to 1; ``renormalize`` then changes nothing).

    Args: logits [T,E]; k; renormalize: True: w_i <- w_i / sum_{j in topk} w_j; "mass_batch": the same when k > 1,
    raw p_i when k = 1 (the MASS authors' naive top-k gate); allow_gradient_free_routes: allow top-1 with
    ``renormalize=True`` or ``softmax_over="topk"`` (weight 1 for every token: no task gradient to the router);
    without it those raise ``ValueError``.
    Returns RouteOut(weights [T,k] float32, indices [T,k] long, probs [T,E] = softmax over all active experts).
    """
    z = masked_logits(logits, active_mask)                                  # [T,E] fp32
    _check_k(k, z.shape[1], active_mask)
    if softmax_over not in ("all", "topk"):
        raise ValueError(f"softmax_over must be 'all' or 'topk', got {softmax_over!r}")
    renormalize = check_renormalize(renormalize)
    check_route_gradient(k, renormalize, softmax_over, allow_gradient_free_routes)
    probs = torch.softmax(z, dim=-1)                                         # p_i = e^{z_i} / sum_j e^{z_j}   [T,E]
    if softmax_over == "all":
        weights, indices = torch.topk(probs, k, dim=-1)                      # [T,k]
        kept = torch.ones_like(weights, dtype=torch.bool)
        weights = _renormalize_kept(weights, kept, renormalize)              # w_i = p_i / sum_{j in K} p_j
    else:
        top_logits, indices = torch.topk(z, k, dim=-1)                       # PESC: TopK(z) then softmax   [T,k]
        weights = torch.softmax(top_logits, dim=-1)
    return RouteOut(weights, indices, probs)


# ----------------------------------------------------------------------------------------------- top-p
def _check_p(p) -> float:
    try:
        pf = float(p)
    except (TypeError, ValueError):
        raise ValueError(f"p must be a number in (0, 1], got {p!r}") from None
    if not (0.0 < pf <= 1.0) or math.isnan(pf):
        raise ValueError(f"p must be in (0, 1], got {p!r}")
    return pf


def top_p_route(logits: torch.Tensor, p: float, convention: str = "mass", renormalize: bool | str | None = False,
                active_mask: torch.Tensor | None = None, allow_gradient_free_routes: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Top-p routing by cumulative routing mass (MASS paper's gate; Huang et al. 2024 "Harder tasks need more experts").

    Sort p = softmax(z) descending, c_j = cumulative sum.
    ``convention="mass"`` (psmiz/MASS ``tutel/gates/mass.py``): the smallest set whose mass reaches p, i.e. keep j iff
    c_{j-1} < p.  ``convention="huang"`` (ZhenweiAn/Dynamic_MoE): keep up to and including the first expert where
    c_j > p, i.e. keep j iff c_{j-1} <= p. (The two differ only when some c_j == p exactly.) The top-1 expert is
    always kept. S_t = the kept set of token t.

    Weights (a token keeping one expert must not get weight 1 unless asked for):

    - ``renormalize=False`` (default; None means the same): w_ti = p_ti for i in S_t (Huang et al.; Switch for one
      kept expert).
    - ``renormalize="mass_batch"``: the MASS authors' rule (``generalized_fast_dispatch.extract_critical``), over the
      T rows of this call as the batch:

          w_ti = p_ti / \sum_{j in S_t} p_tj   if max_{t'} |S_t'| > 1,   else   w_ti = p_ti      (i in S_t)

      so an all-single-expert batch keeps raw probabilities (the gate gets a gradient) while in a mixed batch the
      single-expert tokens still get weight 1 (no task gradient from those tokens; the MASS notebook states this).
    - ``renormalize=True``: per-token renormalisation, w_ti = p_ti / \sum_{j in S_t} p_tj always; with p < 1 it
      raises ``ValueError`` unless ``allow_gradient_free_routes=True`` (single-expert tokens get weight 1).

    Returns (weights [T,E] dense, zero outside the mask; mask [T,E] bool).
    Use :func:`dense_to_sparse` to get [T,k_max] indices for :func:`moelab.core.dispatch.moe_dispatch`.
    """
    p = _check_p(p)
    if convention not in ("mass", "huang"):
        raise ValueError(f"convention must be 'mass' or 'huang', got {convention!r}")
    renormalize = check_top_p_renormalize(renormalize, p, allow_gradient_free_routes)
    z = masked_logits(logits, active_mask)
    probs = torch.softmax(z, dim=-1)                                         # [T,E]
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p                       # c_{j-1}   [T,E]
    keep_sorted = before < p if convention == "mass" else before <= p
    keep_sorted[:, 0] = True
    keep_sorted &= sorted_p > 0                                              # never keep a free (masked) slot
    mask = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)     # back to expert order [T,E]
    weights = _renormalize_kept(probs * mask, mask, renormalize)             # w_ti for i in S_t   [T,E]
    return weights, mask


def dense_to_sparse(weights: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense [T,E] routing (top-p, top-any) -> (indices [T,k_max] with -1 padding, weights [T,k_max] zero-padded)."""
    if weights.shape != mask.shape:
        raise ValueError(f"weights shape {tuple(weights.shape)} != mask shape {tuple(mask.shape)}")
    k_max = max(int(mask.sum(-1).max()), 1) if mask.numel() else 1
    # sort kept entries first (by weight), then slice k_max columns
    key = torch.where(mask, weights.float(), torch.full_like(weights.float(), -1.0))
    _, order = torch.topk(key, k_max, dim=-1)
    kept = torch.gather(mask, -1, order)
    idx = torch.where(kept, order, torch.full_like(order, -1))
    w = torch.where(kept, torch.gather(weights, -1, order), torch.zeros((), dtype=weights.dtype, device=weights.device))
    return idx, w


def soft_route(logits: torch.Tensor, active_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Soft merging / dense soft MoE: every expert gets weight p_i = softmax(z)_i. Returns probs [T,E]."""
    return torch.softmax(masked_logits(logits, active_mask), dim=-1)


# ----------------------------------------------------------------------------------------------- groups (MoCE)
def group_topk_route(logits: torch.Tensor, group_ids: torch.Tensor, k: int, num_groups: int,
                     renormalize: bool | str = False, softmax_over: str = "all",
                     active_mask: torch.Tensor | None = None, allow_gradient_free_routes: bool = False) -> RouteOut:
    """Token top-k inside the group chosen per sequence (MoCE Eq. 5: y = sum_i TopK(R^a(x)_i, k) A_i^{G_a}(x)).

    Args: logits [T,N]: the chosen group's router logits for each token; group_ids [T] long in [0, num_groups);
    active_mask [num_groups*N] or [N]; renormalize / softmax_over / allow_gradient_free_routes as :func:`topk_route`
    (top-1 keeps the softmax-over-N probability by default, as MoCE Eqs. 1-3). Returns RouteOut with *global*
    indices g*N + n and probs [T, num_groups*N] (zero outside the token's group), so losses and dispatch see one pool
    of num_groups*N experts.
    """
    z = check_logits(logits)
    T, N = z.shape
    check_route_gradient(k, check_renormalize(renormalize), softmax_over, allow_gradient_free_routes)
    if not isinstance(group_ids, torch.Tensor) or group_ids.shape != (T,):
        raise ValueError(f"group_ids must be a tensor of shape [T]=({T},), got {getattr(group_ids, 'shape', group_ids)}")
    g = group_ids.long().to(z.device)
    if T and (int(g.min()) < 0 or int(g.max()) >= num_groups):
        raise ValueError(f"group_ids must lie in [0, {num_groups}), got range [{int(g.min())}, {int(g.max())}]")
    local_active = None
    if active_mask is not None:
        if active_mask.shape == (num_groups * N,):
            am = active_mask.to(z.device).view(num_groups, N)[g]                 # [T,N]
            z = z.float().masked_fill(~am, float("-inf"))
            if k > int(am.sum(-1).min()):
                raise ValueError(f"top_k={k} > active experts in some group ({int(am.sum(-1).min())})")
        else:
            local_active = active_mask
    r = topk_route(z, k, renormalize=renormalize, softmax_over=softmax_over, active_mask=local_active,
                   allow_gradient_free_routes=allow_gradient_free_routes)
    glob = r.indices + g[:, None] * N                                           # global id = g*N + n
    probs = torch.zeros(T, num_groups, N, dtype=r.probs.dtype, device=z.device)
    probs[torch.arange(T, device=z.device), g] = r.probs
    return RouteOut(r.weights, glob, probs.view(T, num_groups * N))


class LinearRouter(nn.Module):
    """z = x W^T (bias-free linear router, as in Mixtral/nomic/PESC), then top-k. ``weight [E,d]``.

    ``renormalize`` / ``softmax_over`` / ``allow_gradient_free_routes`` as :func:`topk_route`; a top-1 router whose
    weights would always be 1 raises ``ValueError`` here, at construction."""

    def __init__(self, d_model: int, num_experts: int, top_k: int, renormalize: bool | str = False,
                 softmax_over: str = "all", bias: bool = False, init_std: float = 0.02,
                 allow_gradient_free_routes: bool = False):
        super().__init__()
        _check_k(top_k, num_experts, None)
        renormalize = check_renormalize(renormalize)
        check_route_gradient(top_k, renormalize, softmax_over, allow_gradient_free_routes)
        self.num_experts, self.top_k, self.renormalize, self.softmax_over = num_experts, top_k, renormalize, softmax_over
        self.allow_gradient_free_routes = allow_gradient_free_routes
        self.proj = nn.Linear(d_model, num_experts, bias=bias)
        nn.init.normal_(self.proj.weight, std=init_std)
        if bias:
            nn.init.zeros_(self.proj.bias)

    @property
    def weight(self) -> torch.Tensor:
        return self.proj.weight

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)                                                  # z = W x   [T,E]

    def forward(self, x: torch.Tensor, active_mask: torch.Tensor | None = None) -> RouteOut:
        return topk_route(self.logits(x), self.top_k, self.renormalize, self.softmax_over, active_mask,
                          self.allow_gradient_free_routes)


class GroupRouter(nn.Module):
    """MoCE cluster routers: M groups, each with its own linear router over its N experts (global id g*N+n).

    ``forward(x [T,d], group_ids [T]) -> RouteOut``; the group id is sequence-level (broadcast it to tokens).
    After forward, ``last_logits [T,N]`` holds the chosen group's logits.
    """

    def __init__(self, d_model: int, num_groups: int, num_experts: int, top_k: int, renormalize: bool | str = False,
                 softmax_over: str = "all", init_std: float = 0.02, allow_gradient_free_routes: bool = False):
        super().__init__()
        _check_k(top_k, num_experts, None)
        renormalize = check_renormalize(renormalize)
        check_route_gradient(top_k, renormalize, softmax_over, allow_gradient_free_routes)
        self.num_groups, self.num_experts, self.top_k = num_groups, num_experts, top_k
        self.renormalize, self.softmax_over = renormalize, softmax_over
        self.allow_gradient_free_routes = allow_gradient_free_routes
        self.weight = nn.Parameter(torch.randn(num_groups, num_experts, d_model) * init_std)   # [M,N,d]
        self.last_logits = None

    def logits(self, x: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        if group_ids is None:
            raise ValueError("GroupRouter needs group_ids [T] (sequence-level cluster id per token), got None")
        if group_ids.shape != x.shape[:1]:
            raise ValueError(f"group_ids shape {tuple(group_ids.shape)} != (T,)=({x.shape[0]},)")
        g = group_ids.long()
        if x.shape[0] and (int(g.min()) < 0 or int(g.max()) >= self.num_groups):
            raise ValueError(f"group_ids must lie in [0, {self.num_groups}), got [{int(g.min())}, {int(g.max())}]")
        # z_t = W_{g_t} x_t : compute all groups then gather (M is small)   [T,M,N] -> [T,N]
        allz = torch.einsum("td,mnd->tmn", x, self.weight)
        return allz[torch.arange(x.shape[0], device=x.device), g]

    def forward(self, x: torch.Tensor, group_ids: torch.Tensor, active_mask: torch.Tensor | None = None) -> RouteOut:
        z = self.logits(x, group_ids)
        self.last_logits = z
        return group_topk_route(z, group_ids, self.top_k, self.num_groups, self.renormalize, self.softmax_over,
                                active_mask, self.allow_gradient_free_routes)


class CosineRouter(nn.Module):
    """Cosine router (GMoE, Li et al. 2023; DynMoE uses cos(x, w_e) directly).

    z_e = cos(P x, w_e) / tau with an optional projection P [proj_dim, d] (GMoE) or P = I (``proj_dim=None``, DynMoE),
    then softmax top-k. tau is learnable when ``learn_temperature`` (clamped at >= 0.01).
    """

    def __init__(self, d_model: int, num_experts: int, top_k: int = 2, proj_dim: int | None = None,
                 temperature: float = 0.07, learn_temperature: bool = False, renormalize: bool | str = False,
                 allow_gradient_free_routes: bool = False):
        super().__init__()
        _check_k(top_k, num_experts, None)
        renormalize = check_renormalize(renormalize)
        check_route_gradient(top_k, renormalize, "all", allow_gradient_free_routes)
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.allow_gradient_free_routes = allow_gradient_free_routes
        self.proj = nn.Linear(d_model, proj_dim, bias=False) if proj_dim else None
        self.weight = nn.Parameter(torch.randn(num_experts, proj_dim or d_model) * 0.02)
        t = torch.tensor(float(temperature))
        self.log_temperature = nn.Parameter(t.log(), requires_grad=learn_temperature)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x) if self.proj is not None else x
        cos = F.normalize(h, dim=-1) @ F.normalize(self.weight, dim=-1).T    # cos(Px, w_e)   [T,E]
        return cos / self.log_temperature.exp().clamp_min(0.01)

    def forward(self, x: torch.Tensor, active_mask: torch.Tensor | None = None) -> RouteOut:
        return topk_route(self.logits(x), self.top_k, self.renormalize, "all", active_mask,
                          self.allow_gradient_free_routes)


class TopAnyOut(NamedTuple):
    """Top-any gate output: ``weights [T,E]`` (1/K_t on the K_t selected experts), ``mask [T,E]``, ``scores [T,E]``,
    ``unrouted [T]`` (tokens with no expert above threshold; in training they get no expert)."""

    weights: torch.Tensor
    mask: torch.Tensor
    scores: torch.Tensor
    unrouted: torch.Tensor


class TopAnyGate(nn.Module):
    """DynMoE "top-any" gate (Guo et al. 2024, LINs-lab/DynMoE ``sharded_moe.py``).

    s_e = sigmoid(scale * cos(x, w_e)); expert e is selected iff s_e > sigmoid(theta_e) (trainable per-expert
    threshold theta); selected experts get equal weight 1/K_t. In eval, a token with no selected expert falls back to
    the argmax expert; in training it is left unrouted (``unrouted`` flags it: DynMoE adds an expert for those).
    Thresholds get gradients through a straight-through estimator on the selection.
    """

    def __init__(self, d_model: int, num_experts: int, scale: float = 10.0):
        super().__init__()
        self.num_experts, self.scale = num_experts, scale
        self.weight = nn.Parameter(torch.randn(num_experts, d_model) * 0.02)
        self.threshold = nn.Parameter(torch.zeros(num_experts))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * (F.normalize(x, dim=-1) @ F.normalize(self.weight, dim=-1).T)   # [T,E]

    def forward(self, x: torch.Tensor, active_mask: torch.Tensor | None = None) -> TopAnyOut:
        z = check_logits(self.logits(x)).float()
        active = _check_active(active_mask, self.num_experts, z.device)
        scores = torch.sigmoid(z)                                            # s_e = sigma(scale cos(x, w_e))
        margin = scores - torch.sigmoid(self.threshold)                      # > 0 => selected
        hard = margin > 0
        if active is not None:
            hard = hard & active
            z = z.masked_fill(~active, float("-inf"))
        unrouted = ~hard.any(-1)
        if not self.training:
            fallback = F.one_hot(z.argmax(-1), self.num_experts).bool()
            hard = torch.where(unrouted[:, None], fallback, hard)
        soft = torch.sigmoid(margin * 10.0)
        sel = hard.float() + soft - soft.detach()                            # straight-through: forward = hard
        count = hard.sum(-1, keepdim=True).clamp_min(1)
        weights = sel * hard / count                                         # w_e = 1/K_t on selected experts
        return TopAnyOut(weights, hard, scores, unrouted if self.training else torch.zeros_like(unrouted))
