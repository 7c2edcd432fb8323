"""The offsets path of the MoE dispatch (issue 50), on the CPU: the pieces the CUDA path runs (device offsets, the
gather-only permutation, [gate | up] in one grouped call, the weight folded into the down projection's output) equal
the per-expert loop, outputs and gradients, in fp32 (tight) and bf16 (bf16 tolerance). The no-host-sync check itself
needs CUDA (tests/core/test_cuda.py); here a stand-in: the device-side pieces run with every host read disabled."""
import contextlib

import pytest
import torch
from torch import nn

from moelab.core import MoELayer
from moelab.core import experts as X
from moelab.core.dispatch import _dispatch_offsets, expert_order, gather_rows, moe_dispatch, naive_dispatch
from moelab.core.experts import AdapterExperts, StackedExperts, offsets_mm, offsets_mm_reference

torch.set_num_threads(1)


def _route(T, k, E, seed=0, empty_expert=None, pad=False):
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    if empty_expert is not None:                                           # an expert that gets no token
        for _ in range(2):
            idx = torch.where(idx == empty_expert, (idx + 1) % E, idx)
    w = torch.rand(T, k, generator=g)
    if pad:                                                                # empty slots (top-p / top-any padding)
        idx[::3, -1] = -1
        w[::3, -1] = 0.7                                                   # a non-zero weight must not leak
    return idx, w


def _offsets_mm_rowwise(xs, w, offs):
    """A third grouped matmul that reads nothing on the host: each row's expert from offs by searchsorted."""
    e = torch.searchsorted(offs.long(), torch.arange(xs.shape[0]), right=True).clamp(max=w.shape[0] - 1)
    return torch.bmm(w[e], xs.unsqueeze(-1)).squeeze(-1)                   # W[e(s)] x_s   [S,out]


@contextlib.contextmanager
def _no_host_reads():
    """Every Python-level way of reading a tensor value on the host raises (what a CUDA host sync needs)."""
    names = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def boom(name):
        def f(*a, **k):
            raise AssertionError(f"host read: Tensor.{name}")
        return f
    try:
        for n in names:
            setattr(torch.Tensor, n, boom(n))
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.Tensor, n, f)


# ----------------------------------------------------------------------------------------------- pieces
@pytest.mark.parametrize("k,pad", [(1, False), (2, False), (2, True), (3, True)])
def test_expert_order_offsets_equal_cumsum_of_bincount(k, pad):
    E, T = 5, 17
    idx, _ = _route(T, k, E, empty_expert=2, pad=pad)
    r = expert_order(idx, E)
    S = T * k
    flat = idx.reshape(-1)
    counts = torch.bincount(flat[flat >= 0], minlength=E)                  # the host-side reference
    ref = counts.cumsum(0)
    assert r.offs.dtype == torch.int32 and r.offs.shape == (E,)
    assert torch.equal(r.offs[:-1].long(), ref[:-1]) and int(r.offs[-1]) == S   # empty slots ride in the last group
    assert torch.equal(r.order[r.inv], torch.arange(S)) and torch.equal(r.inv[r.order], torch.arange(S))
    assert torch.equal(r.tok, r.order // k)
    assert torch.equal(r.valid, flat[r.order] >= 0) and int(r.valid.sum()) == int((flat >= 0).sum())
    assert torch.equal(r.expert[r.valid], flat[r.order][r.valid])           # real rows: their own expert
    assert (r.expert[~r.valid] == E - 1).all() and not r.valid[int(r.valid.sum()):].any()   # empty slots last
    starts = torch.cat([torch.zeros(1, dtype=torch.long), r.offs[:-1].long()])
    for e in range(E):                                                     # rows offs[e-1]:offs[e] are expert e's
        assert (r.expert[starts[e]:r.offs[e]] == e).all()
    with _no_host_reads():
        expert_order(idx, E)                                               # reads nothing on the host


def test_gather_rows_backward_equals_indexing():
    """gather_rows' gather-only backward = autograd's scatter-add of x[idx] (double precision gradcheck too)."""
    T, k, E, d = 7, 3, 4, 5
    idx, _ = _route(T, k, E, pad=True)
    r = expert_order(idx, E)
    x = torch.randn(T, d, dtype=torch.double, requires_grad=True)
    g = torch.randn(T * k, d, dtype=torch.double)
    (gather_rows(x, r.tok, r.inv, k) * g).sum().backward()
    gx = x.grad.clone()
    x.grad = None
    (x[r.tok] * g).sum().backward()
    assert torch.allclose(gx, x.grad, atol=1e-12)
    torch.autograd.gradcheck(lambda a: gather_rows(a, r.tok, r.inv, k), (x,))
    o = torch.randn(T * k, d, dtype=torch.double, requires_grad=True)
    torch.autograd.gradcheck(lambda a: gather_rows(a, r.inv, r.order), (o,))          # un-permute
    w = torch.rand(T * k, dtype=torch.double, requires_grad=True)
    torch.autograd.gradcheck(lambda a: gather_rows(a, r.order, r.inv), (w,))          # 1-D weights


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_offsets_mm_equals_reference_and_fused_gate_up_equals_two_calls(dtype, tol):
    """One grouped call over [W_g; W_u] = the gate and up calls apart = the per-expert loop (an empty group too)."""
    torch.manual_seed(0)
    E, S, d, f = 4, 23, 16, 8
    xs = torch.randn(S, d).to(dtype)
    w_in = (torch.randn(E, 2 * f, d) * 0.3).to(dtype)                      # [W_g; W_u] per expert
    offs = torch.tensor([5, 5, 14, S], dtype=torch.int32)                  # expert 1 has no row
    h = offsets_mm(xs, w_in, offs)                                         # [S, 2f] in one call
    ref = offsets_mm_reference(xs, w_in, offs)
    loop = torch.cat([xs[0:5] @ w_in[0].t(), xs[5:14] @ w_in[2].t(), xs[14:] @ w_in[3].t()])
    two = torch.cat([offsets_mm(xs, w_in[:, :f], offs), offsets_mm(xs, w_in[:, f:], offs)], dim=1)
    for other in (ref, loop, two, _offsets_mm_rowwise(xs.float(), w_in.float(), offs).to(dtype)):
        torch.testing.assert_close(h.float(), other.float(), atol=tol, rtol=tol)


# ----------------------------------------------------------------------------------------------- the whole path
def _grads(fn, params):
    out = fn()
    (out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    gs = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return out.detach(), gs


MMS = {"torch_grouped_mm": offsets_mm, "reference": offsets_mm_reference, "rowwise": _offsets_mm_rowwise}


@pytest.mark.parametrize("mm", sorted(MMS))
@pytest.mark.parametrize("act,bias", [("swiglu", False), ("gelu", True)])
@pytest.mark.parametrize("weighted", ["weights", "none", "both"])
def test_offsets_path_equals_loop_fp32(mm, act, bias, weighted, monkeypatch):
    """impl="grouped_mm" (the offsets path; what "auto" runs on CUDA) = the loop and the fused CPU default: y or
    e [T,k,d], and the gradients of x, the routing weights and every expert parameter, to fp32 rounding."""
    monkeypatch.setattr(X, "offsets_mm", MMS[mm])
    torch.manual_seed(0)
    T, k, E, d, f = 13, 2, 5, 8, 12
    ex = StackedExperts(E, d, f, act=act, bias=bias, impl="grouped_mm", init_std=0.3)
    if bias:
        with torch.no_grad():
            ex.b_in.normal_()
            ex.b_out.normal_()
    x = torch.randn(T, d, requires_grad=True)
    idx, w0 = _route(T, k, E, empty_expert=3, pad=True)
    w = w0.clone().requires_grad_(True)
    params = [x, w] + list(ex.parameters())
    if weighted == "none":
        params[1] = x                                                      # no weights: no weight gradient

    def run(impl):
        ex.impl = impl
        assert ex.use_offsets(x) == (impl == "grouped_mm")                 # which path runs
        if weighted == "weights":
            return moe_dispatch(x, idx, w, ex)
        if weighted == "none":
            return moe_dispatch(x, idx, None, ex)
        y, eo = moe_dispatch(x, idx, w, ex, return_expert_outputs=True)
        return torch.cat([y[:, None], eo], dim=1)

    y, g = _grads(lambda: run("grouped_mm"), params)
    for ref_impl in ("loop", "fused"):
        y_ref, g_ref = _grads(lambda: run(ref_impl), params)
        torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
        for a, b in zip(g, g_ref):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    if weighted != "weights":                                              # empty slots: zero outputs
        assert (y[::3, -1] == 0).all()
    assert (g[2][3] == 0).all() and (g[3][3] == 0).all()                    # expert 3 got no token: zero grads
    if weighted != "none":                                                 # the padded slots' weights get no grad
        assert (g[1][::3, -1] == 0).all()


def test_offsets_path_bf16_within_bf16_tolerance():
    """bf16 experts, the offsets path vs the bf16 loop and vs the fp32 loop: equal to bf16 rounding."""
    torch.manual_seed(0)
    T, k, E, d, f = 32, 2, 4, 16, 32
    ex32 = StackedExperts(E, d, f, impl="loop", init_std=0.3)
    ex = StackedExperts(E, d, f, impl="grouped_mm")
    ex.load_state_dict(ex32.state_dict())
    ex.to(torch.bfloat16)
    x32 = torch.randn(T, d, requires_grad=True)
    x = x32.detach().to(torch.bfloat16).requires_grad_(True)
    idx, w = _route(T, k, E, empty_expert=1, pad=True)
    y, g = _grads(lambda: moe_dispatch(x, idx, w, ex), [x, ex.w_in, ex.w_out])
    assert y.dtype == torch.bfloat16
    ex.impl = "loop"
    y16, g16 = _grads(lambda: moe_dispatch(x, idx, w, ex), [x, ex.w_in, ex.w_out])
    y32, g32 = _grads(lambda: moe_dispatch(x32, idx, w, ex32), [x32, ex32.w_in, ex32.w_out])

    def rel(a, b):
        return float((a.float() - b.float()).norm() / b.float().norm())
    assert rel(y, y16) < 1e-2 and rel(y, y32) < 2e-2
    for a, b, c in zip(g, g16, g32):
        assert rel(a, b) < 2e-2 and rel(a, c) < 3e-2


def test_offsets_path_under_autocast_casts_tokens_once():
    """fp32 experts under bf16 autocast: prepare casts x [T,d] (not the gathered [S,d]); outputs are bf16 and equal
    the bf16 loop; fp32 parameters get fp32 gradients."""
    torch.manual_seed(0)
    T, k, E, d, f = 13, 2, 4, 16, 32
    ex = StackedExperts(E, d, f, act="swiglu", bias=True, impl="grouped_mm", init_std=0.3)
    ref_ex = StackedExperts(E, d, f, act="swiglu", bias=True, impl="loop")
    ref_ex.load_state_dict(ex.state_dict())
    ref_ex.to(torch.bfloat16)
    x = torch.randn(T, d)
    idx, w = _route(T, k, E, pad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ex.prepare(x).dtype == torch.bfloat16 and ex.use_offsets(ex.prepare(x))
        y = moe_dispatch(x, idx, w, ex)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), naive_dispatch(x.to(torch.bfloat16), idx, w, ref_ex).float(),
                               atol=3e-2, rtol=3e-2)
    y.float().sum().backward()
    assert ex.w_in.grad.dtype == torch.float32 and torch.isfinite(ex.w_in.grad).all()


def test_offsets_path_adapter_experts():
    torch.manual_seed(0)
    d = 16
    dense = nn.Sequential(nn.Linear(d, 32), nn.GELU(), nn.Linear(32, d))
    ad = AdapterExperts(dense, num_experts=4, rank=8, scale=0.5, d_model=d, impl="grouped_mm")
    with torch.no_grad():
        ad.w_up.normal_()
    x = torch.randn(9, d, requires_grad=True)
    idx, w = _route(9, 2, 4, pad=True)
    assert ad.use_offsets(ad.prepare(x))
    y, g = _grads(lambda: moe_dispatch(x, idx, w, ad), [x, ad.w_down, ad.w_up])
    ad.impl = "fused"
    y_ref, g_ref = _grads(lambda: moe_dispatch(x, idx, w, ad), [x, ad.w_down, ad.w_up])
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("weighted", [True, False])
def test_offsets_path_reads_nothing_on_the_host(weighted, monkeypatch):
    """The CPU stand-in for the CUDA no-sync test: with a grouped matmul that reads nothing on the host, the whole
    offsets path (sort, offsets, permutation, experts, un-permute), forward and backward, runs with every Python-level
    host read disabled."""
    monkeypatch.setattr(X, "offsets_mm", _offsets_mm_rowwise)
    torch.manual_seed(0)
    ex = StackedExperts(4, 8, 16, bias=True, impl="grouped_mm")
    x = torch.randn(10, 8, requires_grad=True)
    idx, w = _route(10, 2, 4, pad=True)
    w.requires_grad_(True)
    with _no_host_reads():
        y = _dispatch_offsets(ex.prepare(x), idx, w if weighted else None, ex, False)
        y.backward(torch.ones_like(y))
    assert x.grad is not None and ex.w_in.grad is not None


def test_auto_keeps_the_fused_loop_on_the_cpu():
    """CPU unchanged: "auto" takes the counts path (the fused per-expert loop) on the CPU."""
    ex = StackedExperts(4, 8, 16)
    assert ex.impl == "auto" and not ex.use_offsets(torch.randn(3, 8))


def test_layer_all_active_flag_follows_the_mask():
    """MoELayer reads "all slots active" once per change of active_mask (no host sync per forward on CUDA): a write
    to the mask, a grow and a restore all change what the router sees."""
    torch.manual_seed(0)
    m = MoELayer(8, 12, 4, 2)
    x = torch.randn(20, 8)
    m(x)
    assert m._active() is None
    m.active_mask[1] = False                                               # MASS-style masking in place
    m(x)
    assert m._active() is not None and not (m.last_route.indices == 1).any()
    m.active_mask.copy_(torch.ones(4, dtype=torch.bool))
    assert m._active() is None
    m.grow(2)
    m.active_mask[5] = False
    m(x)
    assert not (m.last_route.indices == 5).any()
