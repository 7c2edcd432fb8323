"""Intervals used by the claims engine: percentile bootstraps and t-based intervals,
Welch, OLS slope and the minimum detectable effect; and the helpers that several paper modules
share: the elbow rule :func:`elbow_max_chord` and the Jensen-Shannon divergence
:func:`jensen_shannon`."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import t as _t_dist

_t_ppf = _t_dist.ppf


def _as_array(values, name="values") -> np.ndarray:
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        raise ValueError(f"{name} is empty: nothing to bootstrap")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains non-finite entries ({int((~np.isfinite(a)).sum())} of {a.size})")
    return a


def bootstrap_ci(values, n_boot: int = 2000, seed: int = 0, stat=np.mean, level: float = 0.95):
    """Percentile bootstrap over the first axis of ``values``: returns ``(estimate, low, high)``."""
    a = _as_array(values)
    rng = np.random.default_rng(seed)
    est = float(stat(a))
    if len(a) == 1:
        return est, est, est
    idx = rng.integers(0, len(a), size=(n_boot, len(a)))
    boots = np.array([stat(a[i]) for i in idx])
    lo, hi = np.quantile(boots, [(1 - level) / 2, 1 - (1 - level) / 2])
    return est, float(lo), float(hi)


def paired_bootstrap(a, b, n_boot: int = 2000, seed: int = 0, level: float = 0.95):
    """CI of mean(a - b) for paired scores.

    ``a`` and ``b``: shape [items] or [seeds, items] (same shape). With seeds, items are resampled, and seeds
    too when there are at least 3 (two-level bootstrap); with fewer seeds the per-item scores are averaged
    over seeds first. Returns ``(estimate, low, high)``.
    """
    a, b = _as_array(a, "a"), _as_array(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"paired scores need equal shapes, got {a.shape} and {b.shape}")
    d = a - b
    if d.ndim == 1:
        return bootstrap_ci(d, n_boot=n_boot, seed=seed, level=level)
    if d.ndim != 2:
        raise ValueError(f"scores must be [items] or [seeds, items], got shape {d.shape}")
    n_seeds, n_items = d.shape
    if n_seeds < 3:
        return bootstrap_ci(d.mean(0), n_boot=n_boot, seed=seed, level=level)
    rng = np.random.default_rng(seed)
    boots = np.empty(n_boot)
    for t in range(n_boot):
        s = rng.integers(0, n_seeds, n_seeds)
        i = rng.integers(0, n_items, n_items)
        boots[t] = d[np.ix_(s, i)].mean()
    lo, hi = np.quantile(boots, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(d.mean()), float(lo), float(hi)


# ---------------------------------------------------------------- t-based intervals
# Claims that compare trained models replicate over seeds: items are averaged within each seed and the interval is a
# t-interval on the seed-level values (df = n_seeds - 1). Models fixed by design replicate over items. Every helper
# returns an ``Interval`` carrying the standard error and degrees of freedom, so the claims engine can compute the
# minimum detectable effect (``mde``) from the same observed variance.


@dataclass(frozen=True)
class Interval:
    """A point estimate with its two-sided ``level`` interval, standard error and degrees of freedom."""
    estimate: float
    low: float
    high: float
    se: float
    df: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def t_quantile(q: float, df: float) -> float:
    """Quantile ``q`` of Student's t with ``df`` degrees of freedom (the normal quantile when df is infinite)."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df!r}")
    return float(_t_ppf(q, df))


def _check_level(level: float):
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")


def _interval(est: float, se: float, df: float, n: int, level: float) -> Interval:
    _check_level(level)
    h = t_quantile(1 - (1 - level) / 2, df) * se
    return Interval(float(est), float(est - h), float(est + h), float(se), float(df), int(n))


def t_interval(values, level: float = 0.95) -> Interval:
    """t-interval of the mean of ``values`` (1-D): mean ± t_{1-α/2, n-1} · s/√n. Needs at least 2 values."""
    a = _as_array(values)
    if a.ndim != 1:
        raise ValueError(f"t_interval needs a 1-D array, got shape {a.shape}")
    if len(a) < 2:
        raise ValueError(f"t_interval needs at least 2 values, got {len(a)}")
    return _interval(a.mean(), a.std(ddof=1) / np.sqrt(len(a)), len(a) - 1, len(a), level)


def paired_t_interval(a, b, level: float = 0.95) -> Interval:
    """t-interval of mean(a - b) for aligned pairs (same seeds, or same items): df = n - 1."""
    a, b = _as_array(a, "a"), _as_array(b, "b")
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired values need equal 1-D shapes, got {a.shape} and {b.shape}")
    return t_interval(a - b, level)


def welch_interval(a, b, level: float = 0.95) -> Interval:
    """Welch interval of mean(a) - mean(b) for independent groups (unequal variances); Welch-Satterthwaite df."""
    a, b = _as_array(a, "a"), _as_array(b, "b")
    if a.ndim != 1 or b.ndim != 1 or len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch needs two 1-D groups of at least 2 values, got shapes {a.shape} and {b.shape}")
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = np.sqrt(va + vb)
    if se == 0:
        df = float(len(a) + len(b) - 2)
    else:
        df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return _interval(a.mean() - b.mean(), se, df, min(len(a), len(b)), level)


def ols_slope_interval(x, y, level: float = 0.95) -> Interval:
    """Least-squares slope of ``y`` on ``x`` with its t-interval (df = n - 2): the trend test of a trajectory."""
    x, y = _as_array(x, "steps"), _as_array(y, "values")
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"steps and values need equal 1-D shapes, got {x.shape} and {y.shape}")
    if len(x) < 3 or np.ptp(x) == 0:
        raise ValueError(f"a slope interval needs at least 3 distinct steps, got {np.unique(x).size}")
    xc = x - x.mean()
    slope = float((xc * (y - y.mean())).sum() / (xc ** 2).sum())
    resid = y - y.mean() - slope * xc
    se = np.sqrt((resid ** 2).sum() / (len(x) - 2) / (xc ** 2).sum())
    return _interval(slope, se, len(x) - 2, len(x), level)


def minimum_detectable_effect(se: float, df: float, alpha: float = 0.05, power: float = 0.80) -> float:
    """Smallest true effect a two-sided level-``alpha`` test detects with probability ``power``:
    (t_{1-α/2, df} + t_{power, df}) · SE."""
    if not se >= 0:
        raise ValueError(f"standard error must be >= 0, got {se!r}")
    return float((t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * se)


# ---------------------------------------------------------------- helpers shared by the paper modules
# One implementation each, used by 01 (MoCE's choice of k), 02 (SBA's routing JSD across domains) and 04 (MASS's
# frontier elbow and routing JSD); the paper modules re-export them under their old names.


def elbow_max_chord(x, y) -> float:
    """Knee of a decreasing convex curve: the point farthest from the chord joining its ends, after scaling both
    axes to [0, 1] (the Kneedle difference-curve rule; hand-written because kneed is not installed).

    Used for MASS's frontier elbow (MASS Sec. 4.3, notebook 04) and MoCE's number of clusters (MoCE App. B step 3,
    notebook 01). ``x``, ``y``: equal-length sequences of at least 3 points. Returns the ``x`` of the knee (the first
    one on ties)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or len(x) != len(y):
        raise ValueError(f"need >= 3 points of equal length, got {len(x)} and {len(y)}")
    xs = (x - x.min()) / max(np.ptp(x), 1e-12)
    ys = (y - y.min()) / max(np.ptp(y), 1e-12)
    # distance to the chord from (xs0, ys0) to (xs-1, ys-1)
    dx, dy = xs[-1] - xs[0], ys[-1] - ys[0]
    dist = np.abs(dy * (xs - xs[0]) - dx * (ys - ys[0])) / max(math.hypot(dx, dy), 1e-12)
    return float(x[int(np.argmax(dist))])


def _kl_bits(p: np.ndarray, q: np.ndarray) -> float:
    """KL(p || q) in bits, with 0 log 0 = 0 (q > 0 wherever p > 0 is the caller's guarantee)."""
    return float(np.sum(np.where(p > 0, p * np.log2(np.where(p > 0, p, 1) / np.where(q > 0, q, 1)), 0)))


def jensen_shannon(P) -> float:
    """Jensen-Shannon divergence in bits of the rows of ``P`` [n, K] with equal weights 1/n (each row is first
    normalised to sum to one): ``JSD = 1/n sum_i KL(P_i || M)``, ``M = 1/n sum_i P_i``.

    For two rows this is ``1/2 KL(P_1||M) + 1/2 KL(P_2||M)`` in [0, 1] (MASS Sec. 4.3, routing JSD between groups;
    notebook 04); for n rows it lies in [0, log2 n] and equals ``H(M) - mean_i H(P_i)`` (SBA notebook 02: JSD of
    expert usage across domains). Rows must be non-negative, finite and not all zero."""
    P = np.asarray(P, dtype=float)
    if P.ndim != 2 or P.shape[0] < 2 or P.shape[1] < 1:
        raise ValueError(f"jensen_shannon needs P of shape [n >= 2 distributions, K >= 1 outcomes], got {P.shape}")
    if not np.all(np.isfinite(P)) or (P < 0).any():
        raise ValueError("jensen_shannon needs finite, non-negative entries (probabilities or counts)")
    sums = P.sum(axis=1, keepdims=True)
    if (sums == 0).any():
        raise ValueError(f"rows {np.flatnonzero(sums[:, 0] == 0).tolist()} of P sum to zero: no distribution to compare")
    P = P / sums
    M = P.mean(axis=0)
    w = 1 / P.shape[0]
    return sum(w * _kl_bits(p, M) for p in P)
