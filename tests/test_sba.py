"""Tests for moelab.sba (geometry of expert outputs; SBA paper §III, §IV-B, §VI-B; notebook 02_sba)."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from moelab import sba


def _naive_geometry(eo, w):
    """Per-token loop with the paper's formulas (Eqs. 1-3, r̄ = (r1 + r2)/2)."""
    rows = []
    for t in range(eo.shape[0]):
        e1, e2 = eo[t, 0].double(), eo[t, 1].double()
        w1, w2 = float(w[t, 0]), float(w[t, 1])
        r1, r2 = float(e1.norm()), float(e2.norm())
        cos = float(e1 @ e2) / (r1 * r2)
        y = w1 * e1 + w2 * e2
        rows.append(dict(r1=r1, r2=r2, norm_ratio=r1 / r2, angle_deg=math.degrees(math.acos(max(-1, min(1, cos)))),
                         ratio_linear=float(y.norm()) / ((r1 + r2) / 2), weight_sum=w1 + w2))
    return pd.DataFrame(rows)


@pytest.fixture
def sample():
    g = torch.Generator().manual_seed(0)
    eo = torch.randn(50, 2, 16, generator=g) * (1 + torch.rand(50, 2, 1, generator=g))
    w = torch.softmax(torch.randn(50, 8, generator=g), -1).topk(2).values  # nomic-style: sum < 1
    return eo, w


def test_pair_geometry_matches_naive_loop(sample):
    eo, w = sample
    g = sba.pair_geometry(eo, w)
    ref = _naive_geometry(eo, w)
    for c in ref.columns:
        np.testing.assert_allclose(g[c], ref[c].to_numpy(), rtol=1e-5, atol=1e-6, err_msg=c)
    assert g["n_zero_norm"] == 0 and g["n_tokens"] == 50


def test_shrinkage_decomposition_is_exact(sample):
    eo, w = sample
    g = sba.pair_geometry(eo, w)
    np.testing.assert_allclose(g["f_weight_sum"] * g["f_angular"] * g["f_radius_mix"], g["ratio_linear"], rtol=1e-6)
    assert (g["f_angular"] <= 1 + 1e-9).all()
    # core SBA: radius Σ w_i r_i with the raw weights, direction on the sphere -> no angular cancellation:
    # ||y_sba|| / r̄ = s · Σ ŵ_i r_i / r̄ exactly
    np.testing.assert_allclose(g["ratio_sba"], g["f_weight_sum"] * g["f_radius_mix"], rtol=1e-5)
    np.testing.assert_allclose(g["ratio_sba_normfree"], g["ratio_sba"], rtol=1e-5)
    np.testing.assert_allclose(g["ratio_sba_unit"] * ((g["r1"] + g["r2"]) / 2), 1.0, rtol=1e-5)


def test_orthogonal_equal_norms_textbook_case():
    eo = torch.tensor([[[2.0, 0.0], [0.0, 2.0]]])
    w = torch.tensor([[0.5, 0.5]])
    g = sba.pair_geometry(eo, w)
    assert g["angle_deg"][0] == pytest.approx(90.0)
    assert g["norm_ratio"][0] == pytest.approx(1.0)
    assert g["ratio_linear"][0] == pytest.approx(math.sqrt(0.5))  # inward collapse (Eq. 3)
    assert g["ratio_sba"][0] == pytest.approx(1.0)  # stays on the sphere
    g2 = sba.pair_geometry(eo, torch.tensor([[0.3, 0.2]]))  # unnormalised weights: both shrink by s = 0.5
    assert g2["ratio_linear"][0] == pytest.approx(math.hypot(0.3 * 2, 0.2 * 2) / 2, rel=1e-6)
    assert g2["ratio_sba"][0] == pytest.approx(0.5)


def test_zero_norm_expert_outputs_are_dropped_and_counted(sample):
    eo, w = sample
    eo = eo.clone()
    eo[3, 1] = 0.0
    eo[7, 0] = 0.0
    with pytest.warns(UserWarning, match="2 of 50 token"):
        g = sba.pair_geometry(eo, w)
    assert g["n_zero_norm"] == 2 and g["n_tokens"] == 48 and len(g["angle_deg"]) == 48
    assert all(np.isfinite(v).all() for k, v in g.items() if isinstance(v, np.ndarray))


def test_bad_shapes():
    with pytest.raises(ValueError, match="top-2"):
        sba.pair_geometry(torch.randn(4, 3, 8), torch.rand(4, 3))
    with pytest.raises(ValueError, match="weights shape"):
        sba.pair_geometry(torch.randn(4, 2, 8), torch.rand(4, 3))


def test_geometry_frame_and_summary(sample):
    eo, w = sample
    recs = {"layer1": {"expert_outputs": eo, "weights": w, "indices": torch.zeros(50, 2, dtype=torch.long)},
            "layer3": {"expert_outputs": eo * 2, "weights": w, "indices": torch.zeros(50, 2, dtype=torch.long)}}
    df = sba.geometry_frame(recs, domain="x")
    assert len(df) == 100 and set(df.layer) == {"layer1", "layer3"}
    s = sba.summarize_geometry(df)
    assert list(s.layer) == ["layer1", "layer3", "pooled"]
    assert s.set_index("layer").loc["pooled", "n_tokens"] == 100
    share = s.set_index("layer").loc["pooled", "share_angle_above_40deg"]
    assert share == pytest.approx((df.angle_deg > 40).mean())
    with pytest.raises(ValueError, match="empty"):
        sba.summarize_geometry(df.iloc[:0])
    with pytest.raises(ValueError, match="no captured tokens"):
        sba.geometry_frame({})


def test_routing_jsd():
    rows = []
    for dom, usage in {"a": [5, 5, 0, 0], "b": [0, 0, 5, 5]}.items():
        rows += [dict(domain=dom, layer="L", expert=e, count=c) for e, c in enumerate(usage)]
    for dom in ("a", "b"):
        rows += [dict(domain=dom, layer="M", expert=e, count=3) for e in range(4)]
    j = sba.routing_jsd(pd.DataFrame(rows)).set_index("layer").jsd_bits
    assert j["L"] == pytest.approx(1.0)  # disjoint usage over 2 domains: log2(2) bits
    assert j["M"] == pytest.approx(0.0)  # identical usage
    assert j["mean"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="empty"):
        sba.routing_jsd(pd.DataFrame(columns=["domain", "layer", "expert", "count"]))


def test_expert_similarity():
    from moelab.core.experts import StackedExperts

    ex = StackedExperts(4, 8, 16, act="gelu")
    with torch.no_grad():
        for e in range(1, 4):
            ex.copy_expert(0, e)

    class L(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = ex

    assert sba.expert_similarity(L()) == pytest.approx(1.0)
    with torch.no_grad():
        ex.w_in.normal_()
        ex.w_out.normal_()
    assert abs(sba.expert_similarity(L())) < 0.2
