"""moelab.core: the MoE machinery every paper module builds on (routing, losses, experts, dispatch, aggregation,
MoELayer, capture, dense->MoE conversion and initialisers). Introduced in notebook ``00_primer``."""
from . import aggregation, capture, convert, dispatch, experts, init, layer, losses, routing
from .aggregation import aggregate
from .capture import capture_moe
from .convert import collect_ffn_inputs, load_moe, moeify, save_moe
from .dispatch import moe_dispatch
from .experts import AdapterExperts, StackedExperts
from .layer import MoELayer, aux_loss, moe_layers
from .losses import load_balancing_loss, router_z_loss
from .routing import (CosineRouter, GroupRouter, LinearRouter, RouteOut, TopAnyGate, group_topk_route, soft_route,
                      top_p_route, topk_route)

__all__ = [
    "aggregation", "capture", "convert", "dispatch", "experts", "init", "layer", "losses", "routing",
    "aggregate", "capture_moe", "collect_ffn_inputs", "load_moe", "moeify", "save_moe", "moe_dispatch",
    "AdapterExperts", "StackedExperts", "MoELayer", "aux_loss", "moe_layers", "load_balancing_loss", "router_z_loss",
    "CosineRouter", "GroupRouter", "LinearRouter", "RouteOut", "TopAnyGate", "group_topk_route", "soft_route",
    "top_p_route", "topk_route",
]
