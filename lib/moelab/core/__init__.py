"""moelab.core: the MoE machinery every paper module builds on (routing, losses, experts, dispatch, aggregation,
MoELayer, capture, dense->MoE conversion, initialisers including the cluster-aware one, expert similarity).
Introduced in notebook ``00_primer``."""
from . import (aggregation, capture, cluster_init, convert, diagnostics, dispatch, experts, init, layer, losses, routing,
               similarity)
from .aggregation import aggregate
from .capture import capture_moe
from .cluster_init import ClusterAwareInit, data_aware_truncate, spherical_kmeans
from .convert import collect_ffn_inputs, load_moe, moeify, save_moe
from .dispatch import moe_dispatch
from .experts import AdapterExperts, StackedExperts
from .layer import MoELayer, aux_loss, moe_layers
from .losses import load_balancing_loss, router_z_loss
from .routing import (CosineRouter, GroupRouter, LinearRouter, RouteOut, TopAnyGate, group_topk_route, soft_route,
                      top_p_route, topk_route)
from .similarity import expert_similarity

__all__ = [
    "aggregation", "capture", "cluster_init", "convert", "diagnostics", "dispatch", "experts", "init", "layer",
    "losses", "routing", "similarity", "ClusterAwareInit", "data_aware_truncate", "spherical_kmeans",
    "expert_similarity",
    "aggregate", "capture_moe", "collect_ffn_inputs", "load_moe", "moeify", "save_moe", "moe_dispatch",
    "AdapterExperts", "StackedExperts", "MoELayer", "aux_loss", "moe_layers", "load_balancing_loss", "router_z_loss",
    "CosineRouter", "GroupRouter", "LinearRouter", "RouteOut", "TopAnyGate", "group_topk_route", "soft_route",
    "top_p_route", "topk_route",
]
