"""GPU checks of the core (skipped without CUDA): grouped_mm dispatch on CUDA equals the loop, in fp32 and bf16."""
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
