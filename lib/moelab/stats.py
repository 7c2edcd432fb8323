"""Bootstrap intervals used by every verdict (foundation issue, item 6)."""
from __future__ import annotations

import numpy as np


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
