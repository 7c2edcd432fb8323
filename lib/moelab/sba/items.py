"""Per-item benchmark scores, so that notebook 02's linear-vs-SBA claims replicate over seeds x items (SBA paper
Table I; notebook ``02_sba``).

A benchmark score of the stand-in suite is one number per model (Spearman over pairs, average precision over rows,
V-measure per fixed subset). Its per-item scores:

- STS (Spearman) and pair classification (average precision): the jackknife pseudo-values
  ``p_i = n·θ - (n-1)·θ_(-i)`` (``θ_(-i)``: the score without pair ``i``), whose mean is the jackknife estimate of the
  score and whose spread is the item-level spread of that score;
- clustering: the V-measure of each fixed subset (MTEB's protocol, :func:`moelab.sba.data.v_measure_mteb`).

Retrieval (an extension with no paper column) is not itemised.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .data import _average_precision, _row_cosines, _spearman, cached_encoder, evaluate_benchmarks, v_measure_mteb

__all__ = ["jackknife_pseudo_values", "benchmark_items", "evaluate_with_items", "ITEMISED"]

ITEMISED = ("sts", "pairclass", "clustering")


def jackknife_pseudo_values(x, y, stat) -> np.ndarray:
    """``n·stat(x, y) - (n-1)·stat(x_(-i), y_(-i))`` for every item ``i`` of the aligned arrays ``x``, ``y``."""
    x, y = np.asarray(x), np.asarray(y)
    n = len(x)
    if n < 3 or len(y) != n:
        raise ValueError(f"jackknife needs >= 3 aligned items, got {n} and {len(y)}")
    full = stat(x, y)
    keep = ~np.eye(n, dtype=bool)
    loo = np.array([stat(x[keep[i]], y[keep[i]]) for i in range(n)])
    return n * full - (n - 1) * loo


def benchmark_items(encode_fn, benches: dict, seed: int = 0) -> pd.DataFrame:
    """Per-item scores of the itemised benchmarks (:data:`ITEMISED`) in ``benches``: [benchmark, kind, metric, item,
    score]; ``encode_fn(texts) -> [n, d]`` (wrap it in :func:`moelab.sba.data.cached_encoder` to share encodings)."""
    rows = []
    for name, b in benches.items():
        if b.kind == "clustering":
            for i, (t, lab) in enumerate(b.subsets):
                rows.append(dict(benchmark=name, kind=b.kind, metric="v_measure", item=i,
                                 score=v_measure_mteb(encode_fn(t), lab, seed)))
        elif b.kind in ("sts", "pairclass"):
            fn, metric = (_spearman, "cosine_spearman") if b.kind == "sts" else (_average_precision, "cosine_ap")
            cos = _row_cosines(encode_fn(b.texts_a), encode_fn(b.texts_b))
            pv = jackknife_pseudo_values(cos, np.asarray(b.gold), fn)
            rows += [dict(benchmark=name, kind=b.kind, metric=metric, item=i, score=float(v)) for i, v in enumerate(pv)]
    return pd.DataFrame(rows, columns=["benchmark", "kind", "metric", "item", "score"])


def evaluate_with_items(encode_fn, benches: dict, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(:func:`moelab.sba.data.evaluate_benchmarks`'s table, :func:`benchmark_items`'s table) from one encoding of
    every distinct text."""
    enc = cached_encoder(encode_fn)
    return evaluate_benchmarks(enc, benches, seed=seed), benchmark_items(enc, benches, seed=seed)
