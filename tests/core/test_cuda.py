"""GPU checks of the core (skipped without CUDA): grouped_mm dispatch on CUDA equals the loop, in fp32 and bf16; the
offsets path (issue 50: what impl="auto" runs on CUDA) makes no host sync in a forward + backward."""
import contextlib

import pytest
import torch

from moelab.core import MoELayer
from moelab.core.dispatch import moe_dispatch, naive_dispatch
from moelab.core.experts import StackedExperts

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_cuda_grouped_mm_dispatch_equals_loop(dtype, tol):
    torch.manual_seed(0)
    ex = StackedExperts(8, 64, 128, impl="grouped_mm").cuda().to(dtype)
    x = torch.randn(256, 64, device="cuda", dtype=dtype, requires_grad=True)
    idx = torch.stack([torch.randperm(7)[:2] for _ in range(256)]).cuda()      # expert 7 gets no token
    w = torch.rand(256, 2, device="cuda", dtype=dtype)
    y = moe_dispatch(x, idx, w, ex)
    y.float().sum().backward()
    gx, gw = x.grad.clone(), ex.w_in.grad.clone()
    x.grad = None
    ex.w_in.grad = None
    ex.impl = "loop"
    y2 = moe_dispatch(x, idx, w, ex)
    y2.float().sum().backward()
    assert torch.allclose(y.float(), y2.float(), atol=tol, rtol=tol)
    assert torch.allclose(gx.float(), x.grad.float(), atol=tol, rtol=tol)
    assert torch.allclose(gw.float(), ex.w_in.grad.float(), atol=tol, rtol=tol)


@pytest.mark.cuda
@cuda
def test_cuda_layer_matches_cpu():
    torch.manual_seed(0)
    m = MoELayer(32, 64, 4, 2, aggregation="sba")
    x = torch.randn(2, 10, 32)
    y_cpu = m(x)
    y_gpu = m.cuda()(x.cuda()).cpu()
    assert torch.allclose(y_cpu, y_gpu, atol=1e-4)
    r = m.last_route
    ref = naive_dispatch(x.reshape(-1, 32).cuda(), r.indices, None, m.experts)
    assert torch.allclose(moe_dispatch(x.reshape(-1, 32).cuda(), r.indices, None, m.experts), ref, atol=1e-4)


# ---------------------------------------------------------------- issue 50: no host sync on the CUDA path
@contextlib.contextmanager
def _sync_is_an_error():
    """Any host sync inside raises RuntimeError (``torch.cuda.set_sync_debug_mode("error")``)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("setting", ["bf16 layer", "fp32 layer under bf16 autocast"])
def test_cuda_layer_forward_backward_makes_no_host_sync(setting):
    """MoELayer (top-k router, linear aggregation, balancing loss), impl="auto" on CUDA: the forward and the backward
    run with any host sync an error. The first call (warm-up) may sync: the all-active flag is read once."""
    torch.manual_seed(0)
    autocast = setting.endswith("autocast")
    m = MoELayer(256, 512, 8, 2, renormalize=True).cuda()
    if not autocast:
        m = m.to(torch.bfloat16)
    x = torch.randn(4, 128, 256, device="cuda", dtype=torch.float32 if autocast else torch.bfloat16)
    g = torch.randn(4, 128, 256, device="cuda")
    ctx = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if autocast else contextlib.nullcontext

    def step():
        with ctx():
            y = m(x)
            loss = (y.float() * g).sum() + m.aux_loss
        loss.backward()
        return y

    with ctx():
        assert m.experts.use_offsets(m.experts.prepare(x.reshape(-1, 256)))   # "auto" takes the offsets path
    step()                                                                   # warm-up (may sync)
    m.zero_grad(set_to_none=True)
    with _sync_is_an_error():
        y = step()
    assert y.dtype == torch.bfloat16 and torch.isfinite(y.float()).all()
    assert m.experts.w_in.grad is not None and torch.isfinite(m.experts.w_in.grad.float()).all()
    assert m.router.weight.grad is not None and m.router.weight.grad.abs().sum() > 0


@pytest.mark.cuda
@cuda
def test_cuda_offsets_path_with_empty_slots_makes_no_host_sync_and_equals_loop():
    """moe_dispatch with empty slots (-1, top-p padding) and an expert without tokens, weighted and unaggregated, bf16:
    no host sync in forward + backward; outputs and gradients equal the per-expert loop within bf16 tolerance."""
    torch.manual_seed(0)
    T, k, E, d, f = 512, 3, 8, 128, 256
    ex = StackedExperts(E, d, f, bias=True, init_std=0.05).cuda().to(torch.bfloat16)
    x = torch.randn(T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    idx = torch.stack([torch.randperm(E - 1)[:k] for _ in range(T)])       # expert E-1 gets no token
    idx[::4, -1] = -1                                                        # empty slots
    idx = idx.cuda()
    w = torch.rand(T, k, device="cuda", requires_grad=True)
    g = torch.randn(T, d, device="cuda", dtype=torch.bfloat16)
    ge = torch.randn(T, k, d, device="cuda", dtype=torch.bfloat16)

    def run():
        y = moe_dispatch(x, idx, w, ex)
        eo = moe_dispatch(x, idx, None, ex)
        ((y * g).float().sum() + (eo * ge).float().sum()).backward()
        return y.detach(), eo.detach()

    params = [x, w, ex.w_in, ex.w_out, ex.b_in, ex.b_out]
    assert ex.use_offsets(x)
    run()                                                                    # warm-up
    for p in params:
        p.grad = None
    with _sync_is_an_error():
        y, eo = run()
    grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    ex.impl = "loop"
    y_ref, eo_ref = run()

    def rel(a, b):
        return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))
    assert (eo[::4, -1] == 0).all()
    assert rel(y, y_ref) < 2e-2 and rel(eo, eo_ref) < 2e-2
    for a, p in zip(grads, params):
        assert rel(a, p.grad) < 3e-2
    assert (grads[2][E - 1] == 0).all() and (grads[1][::4, -1] == 0).all()
