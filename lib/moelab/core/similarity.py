"""Similarity of a layer's experts (poster 002 "cluster-aware upcycling", analysis panel 2; notebooks
``03_cluster_upcycling`` and ``02_sba``). Moved here from :mod:`moelab.cluster_upcycling` (issue 21, item 0) so that
notebook 02's :mod:`moelab.sba` no longer imports notebook 03's module; both re-export it."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .init import stacked_experts

__all__ = ["expert_similarity"]


def expert_similarity(layer) -> float:
    """Mean pairwise cosine similarity of the experts' flattened parameters ``[w_in_i; w_out_i]`` (panel 2)."""
    ex = stacked_experts(layer)
    E = ex.w_in.shape[0]
    v = F.normalize(torch.cat([ex.w_in.detach().reshape(E, -1), ex.w_out.detach().reshape(E, -1)], 1).double(), dim=1)
    s = v @ v.T
    iu = torch.triu_indices(E, E, 1)
    return float(s[iu[0], iu[1]].mean())
