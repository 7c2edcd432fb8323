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


# ------------------------------------------------------------------------- balance the active slots
def _padded_mask():
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 2:] = 0                                                            # padding
    return mask


@pytest.mark.parametrize("kw,k_loss", [(dict(router="topk", top_k=2), 2), (dict(router="top_p", top_k=1), 1),
                                       (dict(router="cosine", top_k=2), 2), (dict(router="topany", top_k=1), 1)])
def test_aux_loss_over_active_slots_equals_transformers(kw, k_loss):
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    torch.manual_seed(0)
    m = MoELayer(8, 12, 6, num_active=3, **kw)
    x = torch.randn(2, 5, 8)
    mask = _padded_mask()
    m(x, attention_mask=mask)
    z = m.last_router_logits.detach()
    ref = load_balancing_loss_func((z[:, :3],), 3, k_loss, attention_mask=mask)     # active logits, padding masked
    torch.testing.assert_close(m.aux_loss, ref)
    all_slots = load_balancing_loss_func((z,), 6, k_loss, attention_mask=mask)      # the old loss, over all 6 slots
    assert not torch.allclose(m.aux_loss, all_slots, atol=1e-4)
    m(x)                                                                           # no mask: every token counts
    torch.testing.assert_close(m.aux_loss, load_balancing_loss_func((z[:, :3],), 3, k_loss))
    m.router.weight.grad = None
    m.aux_loss.backward()
    assert m.router.weight.grad[3:].abs().sum() == 0                               # free slots get no push
    assert m.router.weight.grad[:3].abs().sum() > 0


def test_aux_loss_group_router_with_free_slots():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    torch.manual_seed(0)
    m = MoELayer(8, 12, 4, 2, router="group", num_groups=2)
    m.active_mask[:] = torch.tensor([True, True, True, False] * 2)               # same free slot in both groups
    x = torch.randn(2, 5, 8)
    m(x, group_ids=torch.tensor([0, 1]), attention_mask=_padded_mask())
    z = m.last_router_logits.detach()
    torch.testing.assert_close(m.aux_loss, load_balancing_loss_func((z[:, :3],), 3, 2, attention_mask=_padded_mask()))
    m.active_mask[:] = torch.tensor([True, True, True, False, True, True, True, True])
    with pytest.raises(ValueError, match="same active experts in every group"):
        m(x, group_ids=torch.tensor([0, 1]))


def test_attention_mask_must_match_the_tokens():
    m = MoELayer(8, 12, 4, 2)
    x = torch.randn(2, 5, 8)
    for bad in (torch.ones(2, 4), torch.ones(10), torch.ones(1, 10)):
        with pytest.raises(ValueError, match="does not match the tokens"):
            m(x, attention_mask=bad)
    m.token_mask = torch.ones(3, 5)                                                # e.g. a stale mask of another batch
    with pytest.raises(ValueError, match="does not match the tokens"):
        m(x)
    m.token_mask = None
    m(x.reshape(10, 8), attention_mask=_padded_mask())                             # [T,d] with a [B,S] mask: T entries
    with pytest.raises(ValueError, match="does not match the tokens"):
        m(x.reshape(10, 8), attention_mask=torch.ones(9))


# ------------------------------------------------------------------------- defaults and the ValueError
def test_layer_renormalize_defaults_and_gradient_free_configs():
    assert MoELayer(8, 12, 4, 2).renormalize is True                               # Mixtral for k > 1
    assert MoELayer(8, 12, 4, 1).renormalize is False                              # Switch for top-1
    assert MoELayer(8, 12, 4, 1, router="top_p").renormalize is False              # raw top-p probabilities
    assert MoELayer(8, 12, 4, 1, router="top_p", renormalize="mass_batch").renormalize == "mass_batch"
    for kw in (dict(router="topk", renormalize=True), dict(router="topk", softmax_over="topk"),
               dict(router="cosine", renormalize=True), dict(router="group", num_groups=2, renormalize=True),
               dict(router="top_p", renormalize=True)):
        with pytest.raises(ValueError, match="no gradient from the task loss"):
            MoELayer(8, 12, 4, 1, **kw)
        MoELayer(8, 12, 4, 1, allow_gradient_free_routes=True, **kw)              # explicit opt-in
    with pytest.raises(ValueError, match="renormalize must be one of"):
        MoELayer(8, 12, 4, 2, renormalize="sometimes")
