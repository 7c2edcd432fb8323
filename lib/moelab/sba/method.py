"""Spherical Barycentric Aggregation and the operators it is compared with (SBA paper §III-C to §III-E, Eqs. 1, 4-11;
notebook ``02_sba``).

The operators themselves live in the shared core (:mod:`moelab.core.aggregation`, so that every MoE layer can switch
them); this file is the paper's view of them: its symbols, its equations, and the switch that swaps them in a model
without touching routing, experts or weights (paper §V-A). Shapes: expert outputs ``e [T, k, d]`` (the k chosen
experts of each token, router rank order), router weights ``w [T, k]`` as the layer uses them (nomic: top-2 of a
softmax over all experts, *not* renormalised, so ``s = Σ_i w_i < 1``).

- linear (Eq. 1):            ``y = Σ_i w_i e_i``                                                      [T, d]
- SBA (Eqs. 4-8):            ``r_i = ||e_i||``, ``û_i = e_i / r_i``                              (Eq. 4)
                             ``r = Σ_i w_i r_i``                                                      (Eq. 5)
                             ``θ = Σ_i a_i θ_i`` with ``a_i = w_i r_i / Σ_j w_j r_j``                  (Eq. 6)
                             (for d > 2: the point splitting the geodesic û_1 -> û_2 at t = a_2, i.e. the slerp;
                             k > 2: the weighted Karcher mean on the sphere)
                             ``y_SBA = r · û(θ)``                                                     (Eqs. 7-8)
- norm-free SBA (Eqs. 9-10): radius as SBA, direction weights ``a_i = w_i / Σ_j w_j``
- unit-output SBA (Eq. 11):  ``y = û(θ)`` (the radius discarded)

Consequences used by the notebook: SBA keeps the radius ``Σ_i w_i r_i`` exactly (``||y_SBA|| / Σ_i w_i r_i = 1`` by
construction), while ``||y_lin|| / Σ_i w_i r_i = ||Σ ŵ_i e_i|| / Σ ŵ_i r_i ≤ 1`` (``ŵ = w / s``) measures only the
angular cancellation; with aligned experts (copies) SBA equals linear for any weights.
"""
from __future__ import annotations

import torch

from moelab.core.aggregation import METHODS, aggregate, karcher_mean, linear, sba, sba_normfree, sba_unit, slerp
from moelab.core.layer import moe_layers

__all__ = ["AGGREGATIONS", "AGGREGATION_LABELS", "aggregate", "linear", "sba", "sba_normfree", "sba_unit", "slerp",
           "karcher_mean", "check_aggregation", "set_aggregation", "get_aggregation"]

AGGREGATIONS = ("linear", "sba", "sba_normfree", "sba_unit")  # Table I (linear, SBA) and Table II (the ablations)
AGGREGATION_LABELS = {"linear": "linear (Eq. 1)", "sba": "SBA (Eqs. 4-8)",
                      "sba_normfree": "norm-free SBA (Eq. 10)",
                      "sba_unit": "unit-output SBA (Eq. 11)"}
assert set(AGGREGATIONS) <= set(METHODS)


def check_aggregation(method: str) -> str:
    """``method`` if it is one of :data:`AGGREGATIONS`, else a ``ValueError`` naming the choices."""
    if method not in AGGREGATIONS:
        raise ValueError(f"aggregation={method!r}; expected one of {AGGREGATIONS}")
    return method


def set_aggregation(model: torch.nn.Module, method: str) -> torch.nn.Module:
    """Switch every MoE layer of ``model`` to ``method`` (SBA paper §V-A: only the aggregation changes; routing, experts
    and weights stay untouched). Notebook 02_sba. Returns ``model``."""
    check_aggregation(method)
    layers = moe_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no MoE layers")
    for layer in layers:
        layer.aggregation = method
    return model


def get_aggregation(model: torch.nn.Module) -> str:
    """The aggregation of ``model``'s MoE layers ("a,b" when they differ)."""
    methods = sorted({layer.aggregation for layer in moe_layers(model)})
    if not methods:
        raise ValueError(f"{type(model).__name__} has no MoE layers")
    return ",".join(methods)
