"""Similarity of a layer's experts (poster 002 "cluster-aware upcycling", analysis panel 2; notebooks
``03_cluster_upcycling`` and ``02_sba``). Moved here from :mod:`moelab.cluster_upcycling` so that
notebook 02's :mod:`moelab.sba` no longer imports notebook 03's module; both re-export it."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .init import stacked_experts

__all__ = ["expert_similarity", "expert_output_similarity"]


def expert_similarity(layer) -> float:
    """Mean pairwise cosine similarity of the experts' flattened parameters ``[w_in_i; w_out_i]`` (panel 2)."""
    ex = stacked_experts(layer)
    E = ex.w_in.shape[0]
    v = F.normalize(torch.cat([ex.w_in.detach().reshape(E, -1), ex.w_out.detach().reshape(E, -1)], 1).double(), dim=1)
    s = v @ v.T
    iu = torch.triu_indices(E, E, 1)
    return float(s[iu[0], iu[1]].mean())


@torch.no_grad()
def expert_output_similarity(layer, x: torch.Tensor) -> float:
    """Specialisation measured on data (notebook 03): mean pairwise cosine of the experts' outputs
    on the SAME inputs, ``1/T sum_t 2/(E(E-1)) sum_{i<j} cos(E_i(x_t), E_j(x_t))``, ``x`` [T, d] held-out layer
    inputs. 1 = the experts compute the same function on these tokens (sparse upcycling at init); lower = the experts
    answer the same token differently. Unlike :func:`expert_similarity` it ignores directions the data never uses."""
    ex = stacked_experts(layer)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"x must be [T, d] with T >= 1 held-out layer inputs, got {tuple(x.shape)}")
    E = ex.w_in.shape[0]
    if E < 2:
        raise ValueError(f"expert_output_similarity needs >= 2 experts, the layer has {E}")
    x = x.to(ex.w_in.dtype)
    y = F.normalize(torch.stack([ex.forward_expert(e, x) for e in range(E)], 1).double(), dim=-1)  # [T, E, d]
    s = y @ y.transpose(1, 2)  # cos(E_i(x_t), E_j(x_t))   [T, E, E]
    iu = torch.triu_indices(E, E, 1)
    return float(s[:, iu[0], iu[1]].mean())
