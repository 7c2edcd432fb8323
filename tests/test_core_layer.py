"""MoELayer: composition of router, dispatch, aggregation; shared bias/experts; aux loss; growth; bad input."""
import pytest
import torch

from moelab.core import MoELayer, aux_loss, moe_layers
from moelab.core.aggregation import sba
from moelab.core.dispatch import naive_dispatch
from moelab.core.losses import load_balancing_loss
from moelab.core.routing import topk_route

torch.set_num_threads(1)


def test_layer_equals_manual_composition():
    torch.manual_seed(0)
    m = MoELayer(8, 12, 4, 2, act="gelu", renormalize=False, shared_bias=True)
    with torch.no_grad():
        m.shared_bias.normal_()
    x = torch.randn(2, 5, 8)
    y = m(x)
    x2 = x.reshape(-1, 8)
    z = x2 @ m.router.weight.T
    r = topk_route(z, 2, renormalize=False)
    ref = naive_dispatch(x2, r.indices, r.weights, m.experts) + m.shared_bias     # bias added once
    assert torch.allclose(y.reshape(-1, 8), ref, atol=1e-5)
    assert torch.allclose(m.last_router_logits, z, atol=1e-6)
    assert torch.allclose(m.aux_loss, load_balancing_loss(z, 4, 2))
    m.aggregation = "sba"
    eo = naive_dispatch(x2, r.indices, None, m.experts)
    assert torch.allclose(m(x).reshape(-1, 8), sba(eo, r.weights) + m.shared_bias, atol=1e-5)


def test_shared_experts_and_gate():
    torch.manual_seed(0)
    m = MoELayer(8, 12, 4, 1, num_shared_experts=2, shared_expert_gate=True, d_ff_shared=6)
    x = torch.randn(5, 8)
    y = m(x)
    r = m.last_route
    s = m.shared_experts.forward_expert(0, x) + m.shared_experts.forward_expert(1, x)
    ref = naive_dispatch(x, r.indices, r.weights, m.experts) + torch.sigmoid(m.shared_expert_gate(x)) * s
    assert torch.allclose(y, ref, atol=1e-5)


def test_routers_in_layer_and_backward():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8)
    for kw in (dict(router="top_p", top_p=0.6), dict(router="soft"), dict(router="cosine"),
               dict(router="topany"), dict(router="group", num_groups=3), dict(router="topk", softmax_over="topk")):
        m = MoELayer(8, 12, 4, 2, **kw)
        y = m(x, group_ids=torch.tensor([0, 2])) if kw["router"] == "group" else m(x)
        (y.sum() + m.aux_loss).backward()
        assert y.shape == x.shape and torch.isfinite(y).all()
        r = m.last_route
        ref = naive_dispatch(x.reshape(-1, 8), r.indices, r.weights.detach(), m.experts)
        assert torch.allclose(y.reshape(-1, 8), ref, atol=1e-5), kw
    g = MoELayer(8, 12, 4, 2, router="group", num_groups=3)
    g(x, group_ids=torch.tensor([0, 2]))
    idx = g.last_route.indices.view(2, 4, 2)
    assert (idx[0] < 4).all() and (idx[1] >= 8).all()                          # sequence-level group


def test_free_slots_and_grow_with_optimizer():
    torch.manual_seed(0)
    m = MoELayer(8, 12, 6, 2, num_active=3)
    x = torch.randn(20, 8)
    m(x)
    assert (m.last_route.indices < 3).all()
    m.copy_expert(1, 4)
    assert m.active_mask[4] and torch.equal(m.router.weight[4], m.router.weight[1])
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    m(x).sum().backward()
    opt.step()
    m.grow(2, copy_from=[0, -1], optimizer=opt)
    assert m.num_experts == 8 and m.router.weight.shape[0] == 8 and m.active_mask.shape == (8,)
    assert opt.state[m.router.proj.weight]["exp_avg"].shape == (8, 8)
    opt.zero_grad()
    m(x).sum().backward()
    opt.step()


def test_moe_layers_and_aux_loss_sum():
    net = torch.nn.Sequential(MoELayer(8, 12, 4, 2), torch.nn.GELU(), MoELayer(8, 12, 4, 2))
    net(torch.randn(6, 8))
    ls = moe_layers(net)
    assert len(ls) == 2 and torch.allclose(aux_loss(net), ls[0].aux_loss + ls[1].aux_loss)


def test_empty_input():
    m = MoELayer(8, 12, 4, 2)
    y = m(torch.zeros(0, 8))
    assert y.shape == (0, 8) and float(m.aux_loss) == 0.0


def test_layer_bad_input():
    m = MoELayer(8, 12, 4, 2)
    with pytest.raises(ValueError, match="top_k=5"):
        MoELayer(8, 12, 4, 5)
    with pytest.raises(ValueError, match="x must be"):
        m(torch.randn(3, 7))
    with pytest.raises(ValueError, match="dtype"):
        m(torch.randn(3, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="p must be in"):
        MoELayer(8, 12, 4, 2, router="top_p", top_p=1.2)
    with pytest.raises(ValueError, match="router"):
        MoELayer(8, 12, 4, 2, router="hash")
    with pytest.raises(ValueError, match="group_ids"):
        MoELayer(8, 12, 4, 2, router="group", num_groups=2)(torch.randn(3, 8))
