"""Dropless grouped dispatch == naive per-token loop (forward and backward); expert pools and optimiser state."""
import pytest
import torch
from torch import nn

from moelab.core.dispatch import moe_dispatch, naive_dispatch
from moelab.core.experts import AdapterExperts, StackedExperts

torch.set_num_threads(1)


def _route(T, k, E, seed=0, empty_expert=None, pad=False):
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    if empty_expert is not None:                                           # an expert that gets no token
        idx = torch.where(idx == empty_expert, (idx + 1) % E, idx)
        idx = torch.where(idx == empty_expert, (idx + 1) % E, idx)
    w = torch.rand(T, k, generator=g)
    if pad:
        idx[::3, -1] = -1
        w[::3, -1] = 0
    return idx, w


def _grads(fn, params):
    out = fn()
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    gs = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return out.detach(), gs


@pytest.mark.parametrize("act,bias", [("swiglu", False), ("gelu", True), ("geglu_tanh", True)])
@pytest.mark.parametrize("impl", ["grouped_mm", "loop", "fused", "auto"])
def test_dispatch_equals_naive_forward_backward(act, bias, impl):
    torch.manual_seed(0)
    T, k, E, d, f = 11, 2, 5, 8, 12
    ex = StackedExperts(E, d, f, act=act, bias=bias, impl=impl, init_std=0.3)
    if bias:
        with torch.no_grad():
            ex.b_in.normal_()
            ex.b_out.normal_()
    x = torch.randn(T, d, requires_grad=True)
    idx, w0 = _route(T, k, E, empty_expert=3, pad=True)
    w = w0.clone().requires_grad_(True)
    params = [x, w] + [p for p in ex.parameters()]
    y, g = _grads(lambda: moe_dispatch(x, idx, w, ex), params)
    y_ref, g_ref = _grads(lambda: naive_dispatch(x, idx, w, ex), params)
    assert torch.allclose(y, y_ref, atol=1e-5)
    for a, b in zip(g, g_ref):
        assert torch.allclose(a, b, atol=1e-5)
    assert (g[2][3] == 0).all()                                              # expert 3 got no token: zero grad
    eo = moe_dispatch(x, idx, None, ex)                                      # unaggregated [T,k,d]
    assert eo.shape == (T, k, d) and torch.allclose(eo, naive_dispatch(x, idx, None, ex), atol=1e-5)
    assert (eo[::3, -1] == 0).all()                                          # empty slots are zero


def test_grouped_mm_accepts_expanded_gradient():
    ex = StackedExperts(4, 8, 16, impl="grouped_mm")
    x = torch.randn(6, 8, requires_grad=True)
    idx, w = _route(6, 2, 4)
    moe_dispatch(x, idx, w, ex).sum().backward()                             # grad of sum() has stride 0
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_adapter_experts_pesc():
    torch.manual_seed(0)
    d = 8
    dense = nn.Sequential(nn.Linear(d, 16), nn.GELU(), nn.Linear(16, d))
    ad = AdapterExperts(dense, num_experts=4, rank=3, scale=0.5, d_model=d)
    assert all(not p.requires_grad for p in dense.parameters())
    x = torch.randn(7, d)
    idx, w = _route(7, 2, 4)
    w = w / w.sum(-1, keepdim=True)
    assert torch.allclose(moe_dispatch(x, idx, w, ad), dense(x), atol=1e-6)   # W_up = 0: every expert = E(x)
    with torch.no_grad():
        ad.w_up.normal_()
    ref = naive_dispatch(x, idx, w, ad)
    assert torch.allclose(moe_dispatch(x, idx, w, ad), ref, atol=1e-5)
    h = dense(x)                                                             # E(x) + s W_up act(W_down E(x))
    e1 = h[0] + 0.5 * ad.w_up[1] @ torch.nn.functional.gelu(ad.w_down[1] @ h[0])
    assert torch.allclose(ad.forward_expert(1, x[:1])[0], e1, atol=1e-5)


def test_grow_and_copy_keep_optimizer_state():
    torch.manual_seed(0)
    ex = StackedExperts(3, 4, 6)
    opt = torch.optim.Adam(ex.parameters(), lr=1e-2)
    x = torch.randn(5, 4)
    idx, w = _route(5, 2, 3)
    moe_dispatch(x, idx, w, ex).pow(2).sum().backward()
    opt.step()
    old_state = {n: {k: v.clone() for k, v in opt.state[p].items()} for n, p in ex.named_parameters()}
    new_ids = ex.grow(2, copy_from=[1, -1], optimizer=opt)
    assert new_ids == [3, 4] and ex.num_experts == 5
    assert torch.equal(ex.w_in[3], ex.w_in[1])
    for n, p in ex.named_parameters():
        st = opt.state[p]
        assert any(q is p for q in opt.param_groups[0]["params"])
        assert torch.equal(st["exp_avg"][:3], old_state[n]["exp_avg"])
        assert torch.equal(st["exp_avg"][3], old_state[n]["exp_avg"][1])
        assert (st["exp_avg"][4] == 0).all()
    ex.copy_expert(0, 4, optimizer=opt, state="zero")
    assert torch.equal(ex.w_out[4], ex.w_out[0]) and (opt.state[ex.w_out]["exp_avg_sq"][4] == 0).all()
    idx5, w5 = _route(5, 2, 5)
    opt.zero_grad()
    moe_dispatch(x, idx5, w5, ex).pow(2).sum().backward()
    opt.step()                                                               # works with the grown parameters


def test_dispatch_bad_input():
    ex = StackedExperts(4, 8, 16)
    x = torch.randn(5, 8)
    idx, w = _route(5, 2, 4)
    with pytest.raises(ValueError, match="indices"):
        moe_dispatch(x, idx + 4, w, ex)
    with pytest.raises(ValueError, match="weights shape"):
        moe_dispatch(x, idx, w[:, :1], ex)
    with pytest.raises(ValueError, match="T=5"):
        moe_dispatch(x, idx[:3], None, ex)
    with pytest.raises(ValueError, match="floating"):
        moe_dispatch(x.long(), idx, w, ex)
    with pytest.raises(ValueError, match="dtype"):
        moe_dispatch(x.double(), idx, w, ex)
    with pytest.raises(ValueError, match="act"):
        StackedExperts(2, 4, 4, act="tanh")


# ---------------------------------------------------------------- autocast (the trainer's bf16 on CUDA)
# CPU autocast stands in for CUDA's: the same dispatch decisions, bf16 arithmetic on the CPU.
@pytest.mark.parametrize("impl", ["grouped_mm", "loop", "fused", "auto"])
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16])
def test_dispatch_under_bf16_autocast_equals_the_bf16_loop(impl, in_dtype):
    """fp32 experts under bf16 autocast run their matmuls in bf16 whatever the input dtype (an autocast FFN hands bf16
    hidden states to fp32 adapters; an earlier version raised "x dtype ... != expert parameter dtype"); outputs equal
    the loop over bf16 copies of the experts, and the fp32 parameters get fp32 gradients."""
    torch.manual_seed(0)
    T, k, E, d, f = 13, 2, 4, 16, 32
    ex = StackedExperts(E, d, f, act="swiglu", bias=True, impl=impl, init_std=0.3)
    ref_ex = StackedExperts(E, d, f, act="swiglu", bias=True, impl="loop")
    ref_ex.load_state_dict(ex.state_dict())
    ref_ex.to(torch.bfloat16)
    x = torch.randn(T, d).to(in_dtype)
    idx, w = _route(T, k, E, empty_expert=1, pad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = moe_dispatch(x, idx, w, ex)
    ref = naive_dispatch(x.to(torch.bfloat16), idx, w, ref_ex)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), ref.float(), atol=3e-2, rtol=3e-2)
    y.float().sum().backward()
    assert ex.w_in.grad.dtype == torch.float32 and torch.isfinite(ex.w_in.grad).all()
    assert (ex.w_in.grad[1] == 0).all() and ex.w_in.grad.abs().sum() > 0    # expert 1 got no token


def test_adapter_experts_under_bf16_autocast():
    """PESC adapters (fp32) on the bf16 output of an autocast dense FFN: the MoCE layer's case under the trainer."""
    torch.manual_seed(0)
    d = 16
    dense = nn.Sequential(nn.Linear(d, 32), nn.GELU(), nn.Linear(32, d))
    ad = AdapterExperts(dense, num_experts=4, rank=8, scale=0.5, d_model=d)
    with torch.no_grad():
        ad.w_up.normal_()
    x = torch.randn(9, d)
    idx, w = _route(9, 2, 4)
    ref = naive_dispatch(x, idx, w, ad)                                      # fp32 reference
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = ad.prepare(x)
        assert h.dtype == torch.bfloat16                                     # the autocast FFN's output
        y = moe_dispatch(x, idx, w, ad)
    torch.testing.assert_close(y.float(), ref, atol=5e-2, rtol=5e-2)
    y.float().sum().backward()
    assert ad.w_down.grad.dtype == torch.float32 and ad.w_down.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="autocast"):                        # outside autocast the dtype must match
        moe_dispatch(x.to(torch.bfloat16), idx, w, ad)
