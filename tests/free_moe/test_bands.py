"""DOWP bands with equal purification ratios at every patch size (moelab.free_moe.method.band_mask,
``counts="exact"``), the readings ``scope`` (row | matrix) and ``mode`` (remove | keep), and the realised share of
weights purified (``purified_share``, ``report.share_table``), against naive Python loops. Paper 004 §3.1 Eq. 5."""
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
import torch

from moelab import free_moe as fm
from moelab.free_moe.method import _ranks

# SmolLM2-135M's projection shapes [out, in] (q/o 576x576, k/v 192x576, gate/up 1536x576, down 576x1536)
SHAPES = {"q": (576, 576), "k": (192, 576), "up": (1536, 576), "down": (576, 1536)}


def _importance(shape, p, seed):
    g = torch.Generator().manual_seed(seed)
    W, x = torch.randn(shape, generator=g), torch.rand(shape[1], generator=g)
    return fm.method.patch_importance(W, x, p)                                # Eq. 4  [out/p, in/p]


def _ranks_for(p, scope, shapes=SHAPES, seed=0):
    return fm.method.PatchRanks(ranks={k: _ranks(_importance(s, p, seed + i), scope) for i, (k, s) in enumerate(shapes.items())},
                         patch=p, scope=scope, sublayers="both")


def naive_band(imp: torch.Tensor, band, scope, mode="remove", counts="exact") -> np.ndarray:
    """One patch at a time: rank within each group by (importance, position), boundaries from the documented formula
    with exact fractions, then membership."""
    vals = imp.tolist()
    R, C = len(vals), len(vals[0])
    groups = [[(r, c) for c in range(C)] for r in range(R)] if scope == "row" else [[(r, c) for r in range(R)
                                                                                     for c in range(C)]]
    G = len(groups)
    out = np.zeros((R, C), dtype=bool)
    for gi, cells in enumerate(groups):
        n = len(cells)
        order = sorted(range(n), key=lambda j: (vals[cells[j][0]][cells[j][1]], j))     # stable ascending
        rank = {order[k]: k for k in range(n)}

        def B(theta):
            x = Fraction(n) * Fraction(theta) / 100
            return math.floor(x + Fraction(2 * gi + 1, 2 * G)) if counts == "exact" else math.floor(x)
        for j, (r, c) in enumerate(cells):
            inside = B(band[0]) <= rank[j] < B(band[1])
            out[r, c] = (not inside) if mode == "keep" else inside
    return out


@pytest.mark.parametrize("scope", ["row", "matrix"])
@pytest.mark.parametrize("mode", ["remove", "keep"])
@pytest.mark.parametrize("counts", ["exact", "floor"])
@pytest.mark.parametrize("p", [1, 4])
def test_band_mask_matches_naive_loop(scope, mode, counts, p):
    grids = {"a": (6, 10), "b": (4, 14)}                                    # patch grids [out/p, in/p]
    ranks = _ranks_for(p, scope, {k: (g[0] * p, g[1] * p) for k, g in grids.items()})
    for band in [(0.0, 5.0), (50.0, 55.0), (95.0, 100.0), (12.5, 37.5), (0.0, 100.0)]:
        mask = fm.method.band_mask(ranks, band, mode=mode, counts=counts)
        for i, (name, r) in enumerate(ranks.ranks.items()):
            shape = tuple(s * p for s in r.shape)
            imp = _importance(shape, p, i)
            ref = naive_band(imp, band, scope, mode, counts)
            assert np.array_equal(mask.patch_mask(name).numpy(), ref), (name, band)


def test_ties_break_by_position():
    imp = torch.tensor([[1.0, 0.5, 0.5, 0.5, 2.0, 0.5, 0.5, 0.5, 3.0, 0.5]])     # 7 tied lowest patches
    ranks = fm.method.PatchRanks(ranks={"m": _ranks(imp, "row")}, patch=1, scope="row", sublayers="both")
    for band in [(0, 30), (30, 60), (60, 100)]:
        got = fm.method.band_mask(ranks, band).patch_mask("m").numpy()
        assert np.array_equal(got, naive_band(imp, band, "row"))
    assert fm.method.band_mask(ranks, (0, 30)).patch_mask("m").numpy()[0].nonzero()[0].tolist() == [1, 2, 3]


@pytest.mark.parametrize("n,G", [(36, 12), (36, 96), (576, 192), (4, 1), (7, 3), (1, 5)])
def test_boundaries_sum_to_rounded_total(n, G):
    for theta in [0, 2.5, 5, 33.3, 50, 52.5, 95, 99.9, 100]:
        b = fm.method.band_boundaries(n, G, theta)
        assert int(b.min()) >= 0 and int(b.max()) <= n and int(b.max() - b.min()) <= 1
        total = Fraction(n * G) * Fraction(theta).limit_denominator(10_000) / 100
        assert int(b.sum()) == math.floor(total + Fraction(1, 2))            # Hermite: Σ_g B_g = round(N·θ/100)
        assert torch.equal(fm.method.band_boundaries(n, G, theta, "floor"),
                           torch.full((G,), math.floor(Fraction(n) * Fraction(theta).limit_denominator(10_000) / 100)))


@pytest.mark.parametrize("scope", ["row", "matrix"])
def test_equal_share_at_every_patch_size(scope):
    """The realised share of weights purified is within one patch of the band's width for p = 1, 2, 4, 16, so 16x16
    and 1x1 purify the same share within one 16x16 patch per matrix; Wanda's per-row floor does not."""
    ranks = {p: _ranks_for(p, scope) for p in fm.method.PATCH_SIZES}
    floor_dev = 0.0
    for band in [fm.method.WANDA_BAND, *fm.method.APPENDIX_BANDS, (0.0, 3.0), (47.5, 52.5)]:
        width = band[1] - band[0]
        shares = {}
        for p, rk in ranks.items():
            for mode, nominal in (("remove", width), ("keep", 100 - width)):
                per = fm.method.purified_share(fm.method.band_mask(rk, band, mode=mode))
                dev = (per.purified - per.weights * nominal / 100).abs() / p ** 2     # in patches
                assert (dev < 1).all(), (p, band, mode, dev.max())
                if mode == "remove":
                    shares[p] = per.set_index("matrix").share
            if scope == "row":                                                 # rows differ by at most one patch
                per = fm.method.purified_share(fm.method.band_mask(rk, band))
                row_patches = {k: v.shape[1] for k, v in rk.ranks.items()}
                spread = (per.row_share_max - per.row_share_min) * per.matrix.map(row_patches)
                assert (spread <= 1 + 1e-9).all()
            fl = fm.method.purified_share(fm.method.band_mask(rk, band, counts="floor"))
            floor_dev = max(floor_dev, float(((fl.purified - fl.weights * width / 100).abs() / p ** 2).max()))
        numel = pd.Series({k: s[0] * s[1] for k, s in SHAPES.items()})
        for p in fm.method.PATCH_SIZES:
            assert ((shares[p] - shares[1]).abs() * numel <= p ** 2 + 1).all(), (p, band)
    if scope == "row":
        assert floor_dev > 1                 # the old rule: 16x16 rows of 36 patches purify 1 or 2 for a 5% band


def test_keep_is_the_complement_and_bands_tile_in_rows():
    rk = _ranks_for(16, "row")
    tot = {n: torch.zeros(r.shape, dtype=torch.int32) for n, r in rk.ranks.items()}
    for lo in range(0, 100, 5):
        rm, kp = fm.method.band_mask(rk, (lo, lo + 5)), fm.method.band_mask(rk, (lo, lo + 5), mode="keep")
        for n in tot:
            assert torch.equal(kp.patch_mask(n), ~rm.patch_mask(n))
            tot[n] += rm.patch_mask(n).int()
    assert all(bool((t == 1).all()) for t in tot.values())       # every patch in exactly one 5% band
    assert rm.meta == dict(scope="row", sublayers="both", mode="remove", counts="exact")


def test_purified_share_and_share_table_match_counts():
    masks = {f"{p}x{p} {m}": fm.method.band_mask(_ranks_for(p, "row"), (95, 100), mode=m)
             for p in (1, 16) for m in ("remove", "keep")}
    for label, mask in masks.items():
        per = fm.method.purified_share(mask)
        for r in per.itertuples():
            em = mask.element_mask(r.matrix)
            assert r.purified == int(em.sum()) and r.weights == em.numel()
            rows = em.double().mean(1)
            assert abs(r.row_share_min - float(rows.min())) < 1e-12 and abs(r.row_share_max - float(rows.max())) < 1e-12
        assert per.purified.sum() == mask.n_purified() and per.weights.sum() == mask.n_weights()
    t = fm.share_table(masks).set_index("config")
    assert t.loc["16x16 remove", "nominal_pct"] == 5 and t.loc["1x1 keep", "nominal_pct"] == 95
    assert (t.max_dev_patches < 1).all()
    assert abs(t.loc["16x16 remove", "realised_pct"] - t.loc["1x1 remove", "realised_pct"]) < 0.2


def test_band_value_errors():
    rk = _ranks_for(1, "row", {"a": (8, 8)})
    with pytest.raises(ValueError, match="mode="):
        fm.method.band_mask(rk, (0, 5), mode="zap")
    with pytest.raises(ValueError, match="counts="):
        fm.method.band_mask(rk, (0, 5), counts="ceil")
    with pytest.raises(ValueError, match="scope="):
        _ranks(torch.rand(4, 4), "column")
