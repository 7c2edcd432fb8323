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
