"""Helpers of the primer notebook (moelab.primer) against naive references; no model load except where marked."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from moelab import primer

torch.set_num_threads(1)  # shared 2-core machine (conftest may do the same)


def test_load_imbalance_is_coefficient_of_variation():
    f = np.array([0.5, 0.25, 0.125, 0.125])
    assert primer.load_imbalance(f) == pytest.approx(np.std(f) / np.mean(f))
    assert primer.load_imbalance(np.full(8, 1 / 8)) == pytest.approx(0.0)
    assert primer.load_imbalance(np.stack([f, f])).shape == (2,)


def test_two_vector_aggregation_inward_collapse():
    df = primer.two_vector_aggregation([0, 60, 90, 150])
    assert np.allclose(df.linear_norm, np.cos(np.deg2rad(df.angle_deg) / 2), atol=1e-12)
    assert np.allclose(df.sba_norm, 1.0, atol=1e-12)
    # the SBA point for equal weights is the arc midpoint: angle θ/2
    ang = np.rad2deg(np.arctan2(df.sba_y, df.sba_x))
    assert np.allclose(ang, df.angle_deg / 2, atol=1e-9)


def test_active_expert_counts_matches_loop():
    g = torch.Generator().manual_seed(0)
    z = [torch.randn(50, 8, generator=g) * 2]
    df = primer.active_expert_counts(z, top_k=2, top_ps=[0.5])
    assert (df[df.rule == "top-2"].active == 2).all()
    probs = torch.softmax(z[0], -1)
    ref = []
    for p in probs:  # smallest set whose cumulative mass reaches 0.5 (MASS convention)
        s = torch.sort(p, descending=True).values
        ref.append(int((torch.cumsum(s, 0) < 0.5).sum()) + 1)
    assert df[df.rule == "top-p 0.5"].active.tolist() == ref


def test_wordnet_gloss_pairs():
    try:
        pairs = primer.wordnet_gloss_pairs(20, seed=1)
    except RuntimeError as e:  # MissingAsset
        pytest.skip(str(e))
    assert len(pairs) == 20 and all(isinstance(a, str) and len(b.split()) >= 3 for a, b in pairs)
    assert pairs == primer.wordnet_gloss_pairs(20, seed=1) and pairs != primer.wordnet_gloss_pairs(20, seed=2)
    assert all("_" not in a for a, _ in pairs)
    with pytest.raises(ValueError, match="n must be"):
        primer.wordnet_gloss_pairs(0)


def _tiny_moe():
    from torch import nn

    from moelab.core.layer import MoELayer
    torch.manual_seed(0)
    return nn.Sequential(MoELayer(16, 32, num_experts=4, top_k=2), MoELayer(16, 32, num_experts=4, top_k=2))


def test_redraw_routers_draws_each_seeds_routers_and_leaves_the_rest():
    """A training seed draws the routers (N(0, 0.02^2), from the seed alone); experts and the input model stay."""
    from moelab.core import moe_layers
    model = _tiny_moe()
    before = [lay.router.weight.clone() for lay in moe_layers(model)]
    a, a2, b = primer.redraw_routers(model, 1), primer.redraw_routers(model, 1), primer.redraw_routers(model, 2)
    for i, lay in enumerate(moe_layers(model)):
        assert torch.equal(lay.router.weight, before[i])                                  # input untouched
        wa, wb = moe_layers(a)[i].router.weight, moe_layers(b)[i].router.weight
        assert torch.equal(wa, moe_layers(a2)[i].router.weight) and not torch.equal(wa, wb)
        assert not torch.equal(wa, before[i])
    assert 0.01 < float(torch.cat([lay.router.weight.detach().ravel() for lay in moe_layers(a)]).std()) < 0.03
    for pa, pm in zip(moe_layers(a)[0].experts.parameters(), moe_layers(model)[0].experts.parameters()):
        assert torch.equal(pa, pm)


def test_router_change_is_the_relative_frobenius_distance():
    from moelab.core import moe_layers
    model = _tiny_moe()
    moved = primer.redraw_routers(model, 0)
    assert primer.router_change(model, model) == [0.0, 0.0]
    got = primer.router_change(model, moved)
    want = [float((m.router.weight - b.router.weight).norm() / b.router.weight.norm())
            for b, m in zip(moe_layers(model), moe_layers(moved))]
    assert np.allclose(got, want) and all(g > 0.5 for g in got)
