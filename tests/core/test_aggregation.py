"""SBA (paper 001 Sec. III.C-E) against the paper's 2-D angle formulas and degenerate cases."""

import pytest
import torch

from moelab.core.aggregation import aggregate, karcher_mean, linear, sba, sba_normfree, sba_unit, slerp

torch.set_num_threads(1)


def _polar(r, theta):
    return torch.stack([r * torch.cos(theta), r * torch.sin(theta)], -1)


def test_linear_is_weighted_sum():
    e = torch.randn(4, 3, 5)
    w = torch.rand(4, 3)
    assert torch.allclose(linear(e, w), (w[..., None] * e).sum(1), atol=1e-6)


@pytest.mark.parametrize("k", [2, 3])
def test_sba_equals_paper_formula_in_2d(k):
    """In 2-D the angular coordinate is the polar angle: theta = sum w_i r_i theta_i / sum w_i r_i (Eq. 6/8),
    r = sum w_i r_i (Eq. 5/8); experts within a half circle."""
    g = torch.Generator().manual_seed(k)
    T = 20
    theta = torch.rand(T, k, generator=g) * 2.5                                   # spread < pi
    r = torch.rand(T, k, generator=g) + 0.2
    w = torch.rand(T, k, generator=g)                                             # not summing to one
    e = _polar(r, theta).double()
    w = w.double()
    r_agg = (w * r.double()).sum(-1)
    th = (w * r.double() * theta.double()).sum(-1) / (w * r.double()).sum(-1)
    assert torch.allclose(sba(e, w, n_iter=60), _polar(r_agg, th), atol=1e-6)
    th_nf = (w * theta.double()).sum(-1) / w.sum(-1)                             # Eq. 10
    assert torch.allclose(sba_normfree(e, w, n_iter=60), _polar(r_agg, th_nf), atol=1e-6)
    assert torch.allclose(sba_unit(e, w, n_iter=60), _polar(torch.ones_like(r_agg), th), atol=1e-6)   # Eq. 11


def test_karcher_equals_slerp_for_two_experts_high_dim():
    g = torch.Generator().manual_seed(0)
    u = torch.nn.functional.normalize(torch.randn(10, 2, 16, generator=g, dtype=torch.float64), dim=-1)
    t = torch.rand(10, generator=g, dtype=torch.float64)
    alpha = torch.stack([1 - t, t], -1)
    assert torch.allclose(karcher_mean(u, alpha, n_iter=50), slerp(u[:, 0], u[:, 1], t), atol=1e-8)
    e = u * torch.rand(10, 2, 1, generator=g, dtype=torch.float64)
    w = torch.rand(10, 2, generator=g, dtype=torch.float64)
    assert torch.allclose(sba(e, w, direction="karcher", n_iter=50), sba(e, w), atol=1e-8)
    # norm of SBA output = sum w_i r_i (no inward collapse), linear is shorter
    assert torch.allclose(sba(e, w).norm(dim=-1), (w * e.norm(dim=-1)).sum(-1), atol=1e-10)
    assert (linear(e, w).norm(dim=-1) <= sba(e, w).norm(dim=-1) + 1e-12).all()


@pytest.mark.parametrize("method", ["sba", "sba_normfree"])
@pytest.mark.parametrize("k", [2, 3])
def test_aligned_experts_and_one_hot_equal_linear(method, k):
    g = torch.Generator().manual_seed(1)
    u = torch.nn.functional.normalize(torch.randn(6, 1, 8, generator=g), dim=-1)
    e = u * (torch.rand(6, k, 1, generator=g) + 0.1)                             # same direction, different norms
    w = torch.rand(6, k, generator=g) * 0.6                                      # sum != 1
    assert torch.allclose(aggregate(e, w, method), linear(e, w), atol=1e-5)
    e2 = torch.randn(6, k, 8, generator=g)
    oh = torch.zeros(6, k)
    oh[:, 1] = 0.7
    assert torch.allclose(aggregate(e2, oh, method), linear(e2, oh), atol=1e-5)


def _finite_grad(fn, e, w):
    e = e.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    y = fn(e, w)
    y.sum().backward()
    return y.detach(), torch.isfinite(e.grad).all() and torch.isfinite(w.grad).all()


@pytest.mark.parametrize("fn", [sba, sba_normfree, sba_unit])
def test_degenerate_cases_safe(fn):
    d = 4
    a = torch.tensor([1.0, 2.0, 0.0, 0.0])
    b = torch.tensor([0.0, 1.0, 3.0, 0.0])
    w = torch.tensor([[0.3, 0.5]])
    # one zero-norm expert: result follows the other one
    y, ok = _finite_grad(fn, torch.stack([a, torch.zeros(d)])[None], w)
    assert ok and torch.isfinite(y).all()
    if fn is not sba_unit:
        assert torch.allclose(y[0], 0.3 * a, atol=1e-6)
    # all zero
    y, ok = _finite_grad(fn, torch.zeros(1, 2, d), w)
    assert ok and (y == 0).all()
    # parallel (identical) experts
    y, ok = _finite_grad(fn, torch.stack([a, 2 * a])[None], w)
    assert ok and torch.allclose(y[0], (a / a.norm()) * (1.0 if fn is sba_unit else 0.3 * a.norm() + 0.5 * 2 * a.norm()), atol=1e-5)
    # antiparallel: no NaN; heavier direction wins, exact tie -> 0
    y, ok = _finite_grad(fn, torch.stack([a, -a])[None], w)
    assert ok and torch.isfinite(y).all()
    assert (y[0] @ (-a)) > 0
    y, ok = _finite_grad(fn, torch.stack([a, -a])[None], torch.tensor([[0.5, 0.5]]))
    assert ok and torch.allclose(y, torch.zeros_like(y), atol=1e-6)
    # zero weights
    y, ok = _finite_grad(fn, torch.stack([a, b])[None], torch.zeros(1, 2))
    assert ok and (y == 0).all()
    # k = 3 with a zero expert and an antiparallel pair
    y, ok = _finite_grad(fn, torch.stack([a, -a, b])[None], torch.tensor([[0.2, 0.3, 0.4]]))
    assert ok and torch.isfinite(y).all()


def test_bad_input():
    e = torch.randn(3, 2, 4)
    with pytest.raises(ValueError, match="method"):
        aggregate(e, torch.rand(3, 2), "mean")
    with pytest.raises(ValueError, match="weights shape"):
        sba(e, torch.rand(3, 3))
    with pytest.raises(ValueError, match="non-negative"):
        sba(e, -torch.rand(3, 2))
    with pytest.raises(ValueError, match="NaN"):
        sba(e, torch.full((3, 2), float("nan")))
    with pytest.raises(ValueError, match="slerp"):
        sba(torch.randn(3, 3, 4), torch.rand(3, 3), direction="slerp")
