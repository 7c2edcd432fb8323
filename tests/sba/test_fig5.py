"""Tests for the Fig. 1 / Fig. 5 measures under unnormalised routing (moelab.sba.geometry; SBA paper
§III-A, §IV-B; notebook 02_sba), against naive loops."""
from __future__ import annotations


import numpy as np
import pandas as pd
import pytest
import torch

from moelab import sba
from moelab.sba.geometry import CONCENTRATION_READING, fig5_table, geometry_frame, norm_ratio_concentration, pair_geometry, summarize_geometry
from moelab.sba.loader import AGGREGATIONS


@pytest.fixture
def sample():
    g = torch.Generator().manual_seed(3)
    eo = torch.randn(60, 2, 12, generator=g) * (0.5 + torch.rand(60, 2, 1, generator=g))
    w = torch.softmax(torch.randn(60, 8, generator=g), -1).topk(2).values  # nomic-style: s < 1
    return eo, w


def test_radius_ratio_matches_naive_loop(sample):
    eo, w = sample
    g = pair_geometry(eo, w)
    for t in range(eo.shape[0]):
        e1, e2 = eo[t, 0].double(), eo[t, 1].double()
        w1, w2 = float(w[t, 0]), float(w[t, 1])
        r1, r2 = float(e1.norm()), float(e2.norm())
        radius = w1 * r1 + w2 * r2  # Σ w_i r_i
        assert g["radius_ratio_linear"][t] == pytest.approx(float((w1 * e1 + w2 * e2).norm()) / radius, rel=1e-5)
        assert g["radius_ratio_sba"][t] == pytest.approx(1.0, rel=1e-5)  # SBA keeps the radius by construction
        assert g["radius_ratio_sba_normfree"][t] == pytest.approx(1.0, rel=1e-5)
        assert g["radius_ratio_sba_unit"][t] == pytest.approx(1.0 / radius, rel=1e-5)
        # the raw reading mostly reflects the kept mass s: ratio = radius_ratio · Σ w_i r_i / r̄
        assert g["ratio_linear"][t] == pytest.approx(g["radius_ratio_linear"][t] * radius / ((r1 + r2) / 2),
                                                     rel=1e-5)
    np.testing.assert_allclose(g["radius_ratio_linear"], g["f_angular"], rtol=1e-5)  # = angular cancellation only


def _geo_table():
    rng = np.random.default_rng(0)
    rows = []
    for layer in ("L1", "L3"):
        for r in np.exp(rng.normal(0, 0.15, 300)):
            rows.append(dict(layer=layer, norm_ratio=r))
    rows += [dict(layer="L1", norm_ratio=1.1), dict(layer="L1", norm_ratio=0.9)]  # on the edges: inside
    return pd.DataFrame(rows)


def test_concentration_matches_naive_loop():
    geo = _geo_table()
    c = norm_ratio_concentration(geo).set_index("layer")
    for layer, d in list(geo.groupby("layer")) + [("pooled", geo)]:
        inside = sum(1 for r in d.norm_ratio if 0.9 - 1e-12 <= r <= 1.1 + 1e-12)
        assert c.loc[layer, "share_within"] == pytest.approx(inside / len(d))
        assert c.loc[layer, "n_tokens"] == len(d)
    assert "±10%" in c.reading.iloc[0] and "|r1/r2 - 1| <= 0.10" in CONCENTRATION_READING
    c5 = norm_ratio_concentration(geo, tol=0.05)
    assert "±5%" in c5.reading.iloc[0] and (c5.share_within.to_numpy() <= c.share_within.to_numpy()).all()
    with pytest.raises(ValueError, match="tol"):
        norm_ratio_concentration(geo, tol=10)
    with pytest.raises(ValueError, match="norm_ratio"):
        norm_ratio_concentration(geo.rename(columns={"norm_ratio": "x"}))
    # summarize_geometry's share is the same reading
    s = summarize_geometry(geo.assign(angle_deg=50.0, weight_sum=0.5, f_weight_sum=0.5, f_angular=1.0,
                                          f_radius_mix=1.0)).set_index("layer")
    assert s.loc["pooled", "share_norm_ratio_within_10pct"] == pytest.approx(c.loc["pooled", "share_within"])


def test_fig5_table_reads_both_references(sample):
    eo, w = sample
    recs = {"L1": {"expert_outputs": eo, "weights": w}, "L3": {"expert_outputs": eo * 2, "weights": w}}
    geo = geometry_frame(recs)
    t = fig5_table(geo).set_index(["layer", "operator", "reference"])
    for layer, d in list(geo.groupby("layer")) + [("pooled", geo)]:
        for op in AGGREGATIONS:
            assert t.loc[(layer, op, "r_bar"), "mean"] == pytest.approx(d[f"ratio_{op}"].mean())
            assert t.loc[(layer, op, "sum_w_r"), "median"] == pytest.approx(d[f"radius_ratio_{op}"].median())
    assert t.loc[("pooled", "sba", "sum_w_r"), "mean"] == pytest.approx(1.0, rel=1e-5)
    assert t.loc[("pooled", "linear", "r_bar"), "mean"] < t.loc[("pooled", "linear", "sum_w_r"), "mean"]
    s = summarize_geometry(geo).set_index("layer")
    assert s.loc["pooled", "radius_ratio_sba_mean"] == pytest.approx(1.0, rel=1e-5)
    with pytest.raises(ValueError, match="radius_ratio_"):
        fig5_table(geo.drop(columns=["radius_ratio_sba"]))
