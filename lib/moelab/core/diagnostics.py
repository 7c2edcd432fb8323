"""Router-gradient diagnostics shared by every trainer ("a router must receive the task gradient").

When a route keeps a single expert and renormalises its weight to exactly 1, the router gets no gradient from the
task loss; only the balancing loss trains it, and nothing in the loss curve shows it. Every trainer therefore logs,
at a few steps, the norm of the gradient of the *task* loss (balancing and other router regularisers excluded) with
respect to each router's parameters, computed here with ``torch.autograd.grad(..., retain_graph=True)`` so that the
training step's own backward pass is unchanged, and a run whose router gradient is zero at every logged step fails
(:func:`check_router_learns`) unless its router is frozen on purpose.

* :func:`find_routers`: the routers of a moelab model (``moelab.core.routing`` router modules: those of every
  :class:`moelab.core.MoELayer`, MoCE's group and general routers, ...), by module name.
* :func:`router_grads` / :func:`router_grad_norms`: gradients / L2 norms of a loss w.r.t. each router's parameters.
* :func:`check_router_learns`: the RuntimeError for a router without task gradient.

Used by ``moelab.train.train`` (notebooks 00-05) and MASS's stacked loop (``moelab.mass.train_stacked``, notebook 04).
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import torch
from torch import nn

from .routing import CosineRouter, GroupRouter, LinearRouter, TopAnyGate

__all__ = ["ROUTER_TYPES", "ZERO_GRAD_TOL", "find_routers", "router_grads", "router_grad_norms", "grad_norm",
           "check_router_learns", "router_grad_summary"]

ROUTER_TYPES = (LinearRouter, GroupRouter, CosineRouter, TopAnyGate)
ZERO_GRAD_TOL = 1e-12  # a router gradient norm below this counts as zero (float noise of an exact-zero gradient)


def find_routers(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """``{module name: its parameters}`` for every moelab router module in ``model`` (module order).

    Frozen parameters (``requires_grad=False``) are included: :func:`router_grads` gives them a zero gradient, so a
    frozen router shows up as a zero gradient rather than disappearing from the log.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return {name or "router": list(m.parameters()) for name, m in model.named_modules() if isinstance(m, ROUTER_TYPES)}


def _as_groups(routers) -> dict[str, list[torch.Tensor]]:
    if isinstance(routers, nn.Module):
        return find_routers(routers)
    if not isinstance(routers, Mapping):
        raise ValueError(f"routers must be a model or a mapping name -> parameters, got {type(routers).__name__}")
    out = {}
    for name, ps in routers.items():
        ps = [ps] if isinstance(ps, torch.Tensor) else list(ps)
        bad = [type(p).__name__ for p in ps if not isinstance(p, torch.Tensor)]
        if bad:
            raise ValueError(f"routers[{name!r}] must hold tensors, got {bad}")
        out[str(name)] = ps
    return out


def router_grads(loss: torch.Tensor, routers, retain_graph: bool = True) -> dict[str, list[torch.Tensor]]:
    """Gradient of ``loss`` w.r.t. each router's parameters, ``{name: [dL/dθ for θ in that router]}``.

    ``routers``: a model (its routers are found with :func:`find_routers`) or a mapping name -> parameters (MASS's
    stacked gate). Parameters that do not require a gradient, or that ``loss`` does not depend on, get zeros.
    ``retain_graph=True`` keeps the graph for the training step's own ``backward``. ``.grad`` is not touched.
    """
    if not (isinstance(loss, torch.Tensor) and loss.ndim == 0):
        raise ValueError(f"loss must be a scalar tensor, got {type(loss).__name__} {tuple(getattr(loss, 'shape', ()))}")
    groups = _as_groups(routers)
    flat = [(name, i, p) for name, ps in groups.items() for i, p in enumerate(ps)]
    live = [p for _, _, p in flat if p.requires_grad]
    got = {}
    if live and loss.requires_grad:
        gs = torch.autograd.grad(loss, live, retain_graph=retain_graph, allow_unused=True)
        got = {id(p): g for p, g in zip(live, gs)}
    out = {name: [] for name in groups}
    for name, _, p in flat:
        g = got.get(id(p))
        out[name].append(torch.zeros_like(p, dtype=torch.float32) if g is None else g.detach().float())
    return out


def grad_norm(grads: Sequence[torch.Tensor]) -> float:
    """L2 norm of a list of gradient tensors taken together: sqrt(Σ ||g||²)."""
    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))


def router_grad_norms(loss: torch.Tensor, routers, retain_graph: bool = True) -> dict[str, float]:
    """``{router name: ||dL/dθ_router||_2}`` for ``loss`` (see :func:`router_grads`)."""
    return {name: grad_norm(gs) for name, gs in router_grads(loss, routers, retain_graph).items()}


def check_router_learns(norms: Mapping[str, Iterable[float]], run: str, router_frozen: bool = False,
                        tol: float = ZERO_GRAD_TOL) -> None:
    """Raise RuntimeError when some router's task-loss gradient norm is below ``tol`` at every logged step.

    ``norms``: ``{router name: its norms at the logged steps}``; ``run`` names the run in the message. A router
    frozen on purpose (``router_frozen=True``, recorded in the run's history) is exempt. NaN entries (steps that
    were not logged) are ignored; a router with no logged step is not judged.
    """
    if router_frozen:
        return
    dead = {}
    for name, vals in norms.items():
        v = [float(x) for x in vals if not math.isnan(float(x))]
        if v and max(v) < tol:
            dead[name] = max(v)
    if dead:
        names = ", ".join(f"{n} (max {m:.1e})" for n, m in dead.items())
        raise RuntimeError(
            f"run {run!r}: the router(s) {names} received no gradient from the task loss at any logged step "
            f"(norm < {tol:g}), so only auxiliary losses train them. Usual cause: a route that keeps a single expert "
            f"and renormalises its weight to exactly 1 (top-1 with renormalize=True or softmax over the kept logits, "
            f"top-p keeping one expert). Fix: keep the raw probability for single-expert routes (the core's default), "
            f"use top_k >= 2, or, if the router is frozen on purpose, pass router_frozen=True")


def router_grad_summary(history, column: str = "router_grad_norm") -> dict[str, float]:
    """What a notebook's training table shows of the router's task-loss gradient: the smallest and
    the last logged norm of ``history[column]`` (a DataFrame or mapping of per-step values; NaN where no router was
    logged). ``{"router_grad_norm_min": nan, "router_grad_norm_last": nan}`` for a run without routers."""
    values = [] if history is None or column not in history else [float(v) for v in history[column]]
    logged = [v for v in values if not math.isnan(v)]
    return {f"{column}_min": min(logged) if logged else math.nan,
            f"{column}_last": logged[-1] if logged else math.nan}
