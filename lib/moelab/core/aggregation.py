"""Aggregation of the chosen experts' outputs: linear (standard MoE) and Spherical Barycentric Aggregation.

SBA: paper 001 ("Spherical Barycentric Aggregation for MoE embedding models"), Sec. III.C-E, Eqs. (4)-(11);
notebook ``02_sba``. Shapes: expert_outputs e [T,k,d], weights w [T,k] (router weights of the kept experts).

Construction used here (the paper writes angles theta_i without defining them for d > 2):
- r_i = ||e_i||, u_i = e_i / r_i                                              (Eq. 4)
- radius r = sum_i w_i r_i                                                    (Eq. 5 / 8), with the *raw* router weights
- angular weights a_i = w_i r_i / sum_j w_j r_j (norm-aware, Eq. 6 / 8) or a_i = w_i / sum_j w_j (norm-free, Eq. 10;
  zero-norm experts, which have no direction, are left out)
- direction = the weighted spherical barycentre of the u_i with weights a_i:
  * k = 2: exact slerp u = sin((1-t)phi)/sin(phi) u_1 + sin(t phi)/sin(phi) u_2 with t = a_2, phi = angle(u_1,u_2):
    the point that splits the geodesic in the ratio of Eq. (6) (in 2-D this is exactly theta = a_1 theta_1 + a_2 theta_2);
  * k > 2: the weighted Karcher (Frechet) mean on S^{d-1}, argmin_u sum_i a_i angle(u, u_i)^2, by Riemannian
    gradient steps u <- Exp_u(sum_i a_i Log_u(u_i)) started from the normalised weighted mean of unit directions
    (``direction="mean"`` stops at that start: a cheap extrinsic mean). For k = 2 the Karcher mean equals the slerp.
- y = r u (Eq. 7); ``sba_unit`` returns u (Eq. 11).

How weights not summing to one are treated: only the radius sees their sum (r = sum w_i r_i, exactly as linear
aggregation scales), the direction uses normalised a_i. Hence SBA == linear whenever the experts are aligned
(u_i equal), for any weights, e.g. nomic's un-renormalised top-2 (sum w < 1). Negative weights raise ValueError.

Degenerate cases: zero-norm experts get a_i = 0; if every kept expert is zero (or every weight is 0) the output is 0.
Antiparallel pair (phi = pi): the geodesic is not unique; we fall back to the normalised weighted mean direction,
i.e. the heavier expert's direction, and 0 on an exact tie. One-hot weights give y = w_j e_j (= linear).
"""
from __future__ import annotations

import torch

__all__ = ["aggregate", "linear", "sba", "sba_normfree", "sba_unit", "slerp", "karcher_mean", "METHODS"]

_EPS = 1e-12


def _safe_norm(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    sq = (x * x).sum(dim, keepdim=keepdim)
    pos = sq > _EPS * _EPS
    return torch.where(pos, torch.sqrt(torch.where(pos, sq, torch.ones_like(sq))), torch.zeros_like(sq))


def _safe_div(a: torch.Tensor, b: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    return torch.where(ok, a / torch.where(ok, b, torch.ones_like(b)), torch.zeros_like(a))


def _check(expert_outputs: torch.Tensor, weights: torch.Tensor):
    if expert_outputs.dim() != 3:
        raise ValueError(f"expert_outputs must be [T,k,d], got shape {tuple(expert_outputs.shape)}")
    if weights.shape != expert_outputs.shape[:2]:
        raise ValueError(f"weights shape {tuple(weights.shape)} != expert_outputs[:2] {tuple(expert_outputs.shape[:2])}")
    if not expert_outputs.is_floating_point() or not weights.is_floating_point():
        raise ValueError(f"expert_outputs/weights must be floating point, got {expert_outputs.dtype}/{weights.dtype}")
    if bool(torch.isnan(weights).any()) or bool(torch.isnan(expert_outputs).any()):
        raise ValueError("expert_outputs or weights contain NaN")


def linear(expert_outputs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Standard MoE aggregation y = sum_i w_i e_i (SBA paper Eq. 1)   [T,d]."""
    _check(expert_outputs, weights)
    return torch.bmm(weights.to(expert_outputs.dtype).unsqueeze(1), expert_outputs).squeeze(1)


def slerp(u1: torch.Tensor, u2: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Spherical interpolation between unit vectors u1, u2 [T,d] at fraction t [T] (t=0 -> u1, t=1 -> u2).

    phi = atan2(|u2 - (u1.u2) u1|, u1.u2); u = sin((1-t)phi)/sin phi u1 + sin(t phi)/sin phi u2. Near phi = 0 the
    limit (1-t) u1 + t u2 is used; near phi = pi (antiparallel) the normalised weighted mean (see module docstring).
    """
    c = (u1 * u2).sum(-1)
    s = _safe_norm(u2 - c[:, None] * u1)                                     # sin(phi)
    phi = torch.atan2(s, c)
    t = t.to(u1.dtype)
    ok = s > 1e-6
    c1 = torch.where(ok, _safe_div(torch.sin((1 - t) * phi), s, ok), 1 - t)
    c2 = torch.where(ok, _safe_div(torch.sin(t * phi), s, ok), t)
    v = c1[:, None] * u1 + c2[:, None] * u2
    n = _safe_norm(v, keepdim=True)
    return _safe_div(v, n, n > 1e-9)                                        # unit (or 0 on an antiparallel tie)


def karcher_mean(units: torch.Tensor, alpha: torch.Tensor, n_iter: int = 20) -> torch.Tensor:
    """Weighted Karcher mean on the sphere of unit vectors ``units [T,k,d]`` with weights ``alpha [T,k]`` (sum 1;
    zero rows/weights ignored). Start: normalised weighted mean; step: u <- Exp_u(sum_i a_i Log_u(u_i))."""
    v = (alpha[..., None] * units).sum(1)
    n = _safe_norm(v, keepdim=True)
    m = _safe_div(v, n, n > 1e-9)                                            # [T,d]
    for _ in range(n_iter):
        c = (units * m[:, None]).sum(-1)                                    # cos(angle_i)   [T,k]
        perp = units - c[..., None] * m[:, None]
        s = _safe_norm(perp)                                                 # sin(angle_i)
        ang = torch.atan2(s, c)
        ok = s > 1e-7
        log = _safe_div(ang, s, ok)[..., None] * perp                        # Log_m(u_i)   [T,k,d]
        step = (alpha[..., None] * log).sum(1)                               # Riemannian gradient step   [T,d]
        ns = _safe_norm(step, keepdim=True)
        okn = ns > 1e-9
        m = torch.cos(ns) * m + torch.where(okn, torch.sin(ns) * _safe_div(step, ns, okn), torch.zeros_like(step))
    return m


def _sba_parts(expert_outputs, weights, norm_aware: bool, direction: str, n_iter: int):
    _check(expert_outputs, weights)
    if bool((weights < 0).any()):
        raise ValueError(f"SBA needs non-negative weights, got min {float(weights.min())}")
    if direction not in ("auto", "slerp", "karcher", "mean"):
        raise ValueError(f"direction must be 'auto', 'slerp', 'karcher' or 'mean', got {direction!r}")
    e = expert_outputs.float()
    w = weights.float()
    r = _safe_norm(e)                                                        # r_i = ||e_i||   (Eq. 4)   [T,k]
    has = r > 0
    u = _safe_div(e, r[..., None], has[..., None])                           # u_i = e_i / r_i   [T,k,d]
    radius = (w * r).sum(-1)                                                 # r = sum_i w_i r_i   (Eq. 5/8/9)   [T]
    a = w * r if norm_aware else w * has                                     # Eq. 6/8 (w_i r_i) or Eq. 10 (w_i)
    A = a.sum(-1, keepdim=True)
    alpha = _safe_div(a, A, A > 0)                                           # a_i / sum_j a_j   [T,k]
    k = e.shape[1]
    if k == 1:
        m = u[:, 0] * (alpha[:, 0:1] > 0)
    elif direction == "mean":
        v = (alpha[..., None] * u).sum(1)
        n = _safe_norm(v, keepdim=True)
        m = _safe_div(v, n, n > 1e-9)
    elif k == 2 and direction in ("auto", "slerp"):
        m = slerp(u[:, 0], u[:, 1], alpha[:, 1])                             # exact geodesic barycentre for 2 experts
        # a zero-norm / zero-weight expert: direction is the other one (slerp with t in {0,1} already does that)
        m = m * (A > 0)
    else:
        if direction == "slerp":
            raise ValueError(f"direction='slerp' needs k=2 experts, got k={k}")
        m = karcher_mean(u, alpha, n_iter) * (A > 0)
    return radius, m


def sba(expert_outputs: torch.Tensor, weights: torch.Tensor, direction: str = "auto", n_iter: int = 20) -> torch.Tensor:
    """Spherical Barycentric Aggregation, y = r u(theta) (SBA paper Eqs. 4-8)   [T,d]. See module docstring."""
    radius, m = _sba_parts(expert_outputs, weights, True, direction, n_iter)
    return (radius[:, None] * m).to(expert_outputs.dtype)                    # y_SBA = r u(theta)   (Eq. 7)


def sba_normfree(expert_outputs: torch.Tensor, weights: torch.Tensor, direction: str = "auto",
                 n_iter: int = 20) -> torch.Tensor:
    """Ablation (SBA paper Sec. III.E.a, Eqs. 9-10): radius as SBA, direction weighted by w_i only."""
    radius, m = _sba_parts(expert_outputs, weights, False, direction, n_iter)
    return (radius[:, None] * m).to(expert_outputs.dtype)


def sba_unit(expert_outputs: torch.Tensor, weights: torch.Tensor, direction: str = "auto",
             n_iter: int = 20) -> torch.Tensor:
    """Ablation (SBA paper Sec. III.E.b, Eq. 11): y = u(theta_SBA), the radius discarded (0 if all experts are 0)."""
    _, m = _sba_parts(expert_outputs, weights, True, direction, n_iter)
    return m.to(expert_outputs.dtype)


METHODS = {"linear": linear, "sba": sba, "sba_normfree": sba_normfree, "sba_unit": sba_unit}


def aggregate(expert_outputs: torch.Tensor, weights: torch.Tensor, method: str = "linear", **kw) -> torch.Tensor:
    """Aggregate expert_outputs [T,k,d] with weights [T,k] by ``method`` in {linear, sba, sba_normfree, sba_unit}."""
    if method not in METHODS:
        raise ValueError(f"aggregation method must be one of {sorted(METHODS)}, got {method!r}")
    return METHODS[method](expert_outputs, weights, **kw)
