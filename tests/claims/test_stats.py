"""Tests for the helpers several paper modules share, in moelab.stats: the elbow rule
(max distance to the chord; MASS Sec. 4.3, MoCE App. B) and the Jensen-Shannon divergence (MASS Fig. 3, SBA notebook 02).
Each against a naive reference: a Python loop for the elbow, scipy's jensenshannon and the entropy formula for the JSD."""
import math

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon

from moelab.stats import elbow_max_chord, jensen_shannon


# ---------------------------------------------------------------- elbow: max distance to the chord
def _naive_elbow(x, y):
    """Loop reference: scale both axes to [0, 1] by min and range, then the point of largest distance to the straight
    line through the first and last points (first one on ties)."""
    x0, x1, y0, y1 = min(x), max(x), min(y), max(y)
    pts = [((a - x0) / (x1 - x0), (b - y0) / (y1 - y0)) for a, b in zip(x, y)]
    (ax, ay), (bx, by) = pts[0], pts[-1]
    best, best_d = None, -1.0
    for (px, py), xv in zip(pts, x):
        # |cross((b - a), (p - a))| / |b - a|
        d = abs((bx - ax) * (py - ay) - (by - ay) * (px - ax)) / math.hypot(bx - ax, by - ay)
        if d > best_d + 1e-12:
            best, best_d = xv, d
    return best


def test_elbow_matches_loop_on_random_convex_curves():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(3, 17))
        x = np.sort(rng.choice(np.arange(1, 60), n, replace=False)).astype(float)
        y = np.sort(rng.random(n))[::-1] * 10 ** rng.uniform(-2, 3)       # decreasing, arbitrary scale
        assert elbow_max_chord(x, y) == _naive_elbow(list(x), list(y))


def test_elbow_finds_a_known_knee_and_rejects_short_input():
    x = np.arange(1, 17)
    y = np.where(x <= 6, 10 - 1.5 * x, 1.0 - 0.01 * (x - 6))   # piecewise linear: knee at 6
    assert elbow_max_chord(x, y) == 6
    assert elbow_max_chord(x, 5 * y + 3) == 6                   # invariant to the scale of y
    with pytest.raises(ValueError, match=">= 3 points"):
        elbow_max_chord([1, 2], [1, 2])
    with pytest.raises(ValueError, match="equal length"):
        elbow_max_chord([1, 2, 3], [1, 2])


# ---------------------------------------------------------------- Jensen-Shannon divergence
def _entropy_bits(p):
    return -sum(v * math.log2(v) for v in p if v > 0)


def test_jsd_two_rows_matches_scipy():
    rng = np.random.default_rng(1)
    for _ in range(100):
        K = int(rng.integers(2, 10))
        p, q = rng.dirichlet(np.ones(K) * 0.5, size=2)
        p[rng.integers(K)] = 0.0                                 # zeros are allowed (0 log 0 = 0)
        ref = jensenshannon(p / p.sum(), q, base=2) ** 2        # scipy returns the distance, sqrt(JSD)
        assert jensen_shannon(np.stack([p, q])) == pytest.approx(ref, abs=1e-12)
    # unnormalised rows (counts) are normalised first
    assert jensen_shannon([[2, 2], [10, 10]]) == 0.0


def test_jsd_many_rows_matches_entropy_formula():
    rng = np.random.default_rng(2)
    for _ in range(100):
        n, K = int(rng.integers(2, 7)), int(rng.integers(2, 9))
        C = rng.integers(0, 30, (n, K)).astype(float)
        C[:, 0] += 1
        P = [list(r / r.sum()) for r in C]
        M = [sum(col) / n for col in zip(*P)]
        ref = _entropy_bits(M) - sum(_entropy_bits(p) for p in P) / n   # H(M) - mean_i H(P_i)
        assert jensen_shannon(C) == pytest.approx(ref, abs=1e-12)


def test_jsd_bounds_and_bad_input():
    assert jensen_shannon(np.eye(4)) == pytest.approx(2.0)           # disjoint supports: log2(n)
    assert jensen_shannon([[0.3, 0.7], [0.3, 0.7]]) == 0.0            # identical rows: M equals them, exactly 0
    assert jensen_shannon([[0.3, 0.7]] * 3) == pytest.approx(0.0, abs=1e-15)
    with pytest.raises(ValueError, match="n >= 2"):
        jensen_shannon([[0.5, 0.5]])
    with pytest.raises(ValueError, match="non-negative"):
        jensen_shannon([[0.5, -0.5], [0.5, 0.5]])
    with pytest.raises(ValueError, match=r"rows \[1\] of P sum to zero"):
        jensen_shannon([[1.0, 0.0], [0.0, 0.0]])
