"""Per-item benchmark scores, so that notebook 02's linear-vs-SBA claims replicate over seeds x items (SBA paper
Table I; notebook ``02_sba``).

A benchmark score of the stand-in suite is one number per model (Spearman over pairs, average precision over rows,
V-measure per fixed subset). Its per-item scores:

- STS (Spearman) and pair classification (average precision): the jackknife pseudo-values
  ``p_i = n·θ - (n-1)·θ_(-i)`` (``θ_(-i)``: the score without pair ``i``), whose mean is the jackknife estimate of the
  score and whose spread is the item-level spread of that score;
- clustering: the V-measure of each fixed subset (MTEB's protocol, :func:`moelab.sba.data.v_measure_mteb`).

Retrieval (an extension with no paper column) is not itemised. The paper profile's MTEB tasks from local copies
(:func:`evaluate_mteb_with_items`) are itemised the same way; a set of more than :data:`MAX_JACKKNIFE_ITEMS` pairs
(SprintDuplicateQuestions' test set has about 101,000) by the delete-a-group jackknife over
:data:`MAX_JACKKNIFE_ITEMS` fixed contiguous groups, ``p_g = G·θ - (G-1)·θ_(-g)`` (the leave-one-out jackknife over
10^5 pairs would cost 10^5 scorings of 10^5 pairs).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .data import _average_precision, _row_cosines, _spearman, cached_encoder, evaluate_benchmarks, v_measure_mteb

__all__ = ["jackknife_pseudo_values", "grouped_pseudo_values", "benchmark_items", "evaluate_with_items",
           "evaluate_mteb_with_items", "ITEMISED", "MAX_JACKKNIFE_ITEMS"]

ITEMISED = ("sts", "pairclass", "clustering")
MAX_JACKKNIFE_ITEMS = 2000


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


def grouped_pseudo_values(x, y, stat, max_items: int = MAX_JACKKNIFE_ITEMS) -> np.ndarray:
    """:func:`jackknife_pseudo_values` for at most ``max_items`` items; above, the delete-a-group jackknife over ``G =
    max_items`` contiguous groups of the aligned items (group ``g`` = items ``i`` with ``i·G // n = g``, the same
    items in every model scored on the set): ``p_g = G·stat(x, y) - (G-1)·stat(x_(-g), y_(-g))``."""
    x, y = np.asarray(x), np.asarray(y)
    n = len(x)
    if n <= max_items:
        return jackknife_pseudo_values(x, y, stat)
    if len(y) != n:
        raise ValueError(f"{n} scores for {len(y)} gold values")
    g = np.arange(n) * max_items // n
    full = stat(x, y)
    loo = np.array([stat(x[g != j], y[g != j]) for j in range(max_items)])
    return max_items * full - (max_items - 1) * loo


MTEB_KIND = {"STSBenchmark": ("sts", "cosine_spearman"), "StackExchangeClustering": ("clustering", "v_measure"),
             "SprintDuplicateQuestions": ("pairclass", "cosine_ap")}


def evaluate_mteb_with_items(encode_fn, tasks: dict, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The paper's MTEB tasks from local copies (:func:`moelab.sba.data.load_mteb_local`; notebook 02, paper profile):
    (scores [benchmark, kind, metric, score, n, column], per-item scores [benchmark, kind, metric, item, score]) with
    ``benchmark`` the task's name. Scores as MTEB's main scores: STS Spearman of the cosine with the gold over the
    set, clustering the mean V-measure over the sets (:func:`moelab.sba.data.v_measure_mteb`), pair classification the
    average precision of the cosine (mean over sets). Items: each clustering set; the pairs of STS and pair
    classification by :func:`grouped_pseudo_values` (per set, numbered across sets)."""
    enc = cached_encoder(encode_fn)
    unknown = sorted(set(tasks) - set(MTEB_KIND))
    if unknown or not tasks:
        raise ValueError(f"unknown MTEB task(s) {unknown or '(none given)'}; expected {sorted(MTEB_KIND)}")
    scores, items = [], []
    for task, df in tasks.items():
        kind, metric = MTEB_KIND[task]
        if kind == "clustering":
            vals = [v_measure_mteb(enc(list(r.sentences)), list(r.labels), seed) for r in df.itertuples(index=False)]
            per = [np.asarray(vals)]
        else:
            sets = ([(list(df.sentence1), list(df.sentence2), df.score.to_numpy(float))] if kind == "sts" else
                    [(list(r.sentence1), list(r.sentence2), np.asarray(list(r.labels))) for r in
                     df.itertuples(index=False)])
            fn = _spearman if kind == "sts" else _average_precision
            vals, per = [], []
            for a, b, gold in sets:
                cos = _row_cosines(enc(a), enc(b))
                vals.append(fn(cos, gold))
                per.append(grouped_pseudo_values(cos, gold, fn))
        pv = np.concatenate(per)
        scores.append(dict(benchmark=task, kind=kind, metric=metric, score=float(np.mean(vals)), n=len(pv),
                           column=task))
        items += [dict(benchmark=task, kind=kind, metric=metric, item=i, score=float(v)) for i, v in enumerate(pv)]
    return pd.DataFrame(scores), pd.DataFrame(items, columns=["benchmark", "kind", "metric", "item", "score"])
