"""Router auxiliary losses (Switch/GShard load balancing, ST-MoE router z-loss) and the in-batch contrastive loss.

Used by every training notebook (MoCE/PESC fine-tuning, MASS, upcycling); introduced in notebook ``00_primer``.
"""
from __future__ import annotations

import torch

from .routing import check_logits

__all__ = ["load_balancing_loss", "router_z_loss", "in_batch_contrastive"]


def load_balancing_loss(router_logits, num_experts: int, top_k: int, attention_mask: torch.Tensor | None = None
                        ) -> torch.Tensor:
    r"""Switch Transformer load-balancing loss (Fedus et al. 2021, Eqs. 4-6), equal to transformers'
    ``load_balancing_loss_func`` (Mixtral/OLMoE/Qwen2-MoE).

    L = E * sum_e f_e * P_e, where f_e = fraction of (token, slot) assignments to expert e among the top-k of
    softmax(z) (counted over all layers, divided by the number of tokens, so sum_e f_e = k) and P_e = mean over tokens of
    softmax(z)_e. With a tuple of per-layer logits, counts and probability sums are pooled over layers before the
    product (as transformers does). ``attention_mask [B,S]`` (1 = real token) excludes padding; logits rows must be
    ordered as ``B*S`` flattened.

    Like transformers, the statistics are computed **per micro-batch and per process**: with gradient accumulation or
    data parallelism, f and P are never pooled across micro-batches or ranks (the loss of the global batch is not the
    mean of these losses). Unlike transformers, a single tensor is accepted (transformers returns 0 for a non-tuple).
    """
    if isinstance(router_logits, torch.Tensor):
        router_logits = (router_logits,)
    if not isinstance(router_logits, (tuple, list)) or len(router_logits) == 0:
        raise ValueError(f"router_logits must be a tensor [T,E] or a non-empty tuple of them, got {type(router_logits)}")
    if top_k < 1 or top_k > num_experts:
        raise ValueError(f"top_k={top_k} must be in [1, num_experts={num_experts}]")
    device = router_logits[0].device
    for i, z in enumerate(router_logits):
        check_logits(z, f"router_logits[{i}]")
        if z.shape[1] != num_experts:
            raise ValueError(f"router_logits[{i}] has {z.shape[1]} experts, num_experts={num_experts}")
    flat_mask = None
    if attention_mask is not None:
        flat_mask = attention_mask.reshape(-1).to(device=device, dtype=torch.float32)
    counts = torch.zeros(num_experts, dtype=torch.float32, device=device)
    prob_sum = torch.zeros(num_experts, dtype=torch.float32, device=device)
    rows = torch.zeros((), dtype=torch.float32, device=device)
    for i, z in enumerate(router_logits):
        probs = torch.softmax(z.to(device).float(), dim=-1)                 # P(x)   [T,E]
        _, sel = torch.topk(probs, top_k, dim=-1)                           # [T,k]
        if flat_mask is None:
            w = torch.ones(sel.shape[0], dtype=torch.float32, device=device)
        else:
            if flat_mask.numel() != z.shape[0]:
                raise ValueError(f"attention_mask has {flat_mask.numel()} tokens, router_logits[{i}] has {z.shape[0]}")
            w = flat_mask
        w_slots = w[:, None].expand(-1, top_k).reshape(-1)                  # w per (token, slot)   [T*k]
        counts = counts + torch.zeros_like(counts).scatter_add_(0, sel.reshape(-1), w_slots)
        prob_sum = prob_sum + (probs * w[:, None]).sum(0)
        rows = rows + w.sum()
    f = counts / rows                                                        # f_e   [E]
    P = prob_sum / rows                                                      # P_e   [E]
    return num_experts * torch.sum(f * P)                                    # L = E * sum_e f_e P_e


def router_z_loss(logits) -> torch.Tensor:
    """ST-MoE router z-loss (Zoph et al. 2022, Eq. 5): mean over tokens of (log sum_e exp z_e)^2.

    Accepts [T,E] or a tuple of per-layer logits (mean over layers).
    """
    if isinstance(logits, (tuple, list)):
        if not logits:
            raise ValueError("router_z_loss got an empty tuple of logits")
        return torch.stack([router_z_loss(z) for z in logits]).mean()
    z = check_logits(logits).float()
    return torch.logsumexp(z, dim=-1).pow(2).mean()


def in_batch_contrastive(anchors: torch.Tensor, candidates: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """In-batch contrastive loss with cosine similarity (InfoNCE; sentence-transformers' MultipleNegativesRankingLoss;
    SBA paper Eq. 12 with τ = 1/scale):

        L = -1/N Σ_i log( exp(scale·cos(a_i, c_i)) / Σ_j exp(scale·cos(a_i, c_j)) )

    ``anchors`` a [N, d]; ``candidates`` c [M, d], M >= N, whose first N rows are the positives (hard negatives,
    if any, after them). Written out because the notebooks' trainers pass their own (possibly wrapped or MoE) model,
    which sentence-transformers' loss module would not call; tests check it against that module. Notebooks 00, 02, 03.
    """
    if anchors.dim() != 2 or candidates.dim() != 2 or candidates.shape[0] < anchors.shape[0] \
            or candidates.shape[1] != anchors.shape[1]:
        raise ValueError(f"anchors [N, d] and candidates [M >= N, d] expected, got {tuple(anchors.shape)} and "
                         f"{tuple(candidates.shape)}")
    a = torch.nn.functional.normalize(anchors, dim=-1)
    c = torch.nn.functional.normalize(candidates, dim=-1)
    scores = scale * a @ c.T                                                       # [N, M]
    return torch.nn.functional.cross_entropy(scores, torch.arange(len(a), device=scores.device))
