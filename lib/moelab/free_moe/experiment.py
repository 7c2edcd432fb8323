"""Free-MoE's runs (paper 004, §3.1 Algorithm 1 and §3.2 inference; notebook ``notebooks/05_free_moe.py``): the band
sweep and θ* selection per subdomain (Eq. 6), DOWP per subdomain (calibrate, rank, sweep, select, build masks),
subdomain assignment (Eq. 2-3), the router's training and routing (Eq. 7-9), routed scoring of test items under
several methods, cached calibration statistics, and the paper profile's local model."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from moelab import cache, progress
from moelab.assets import MissingAsset
from moelab.free_moe.data import calibration_text, tokenize_batches
from moelab.free_moe.method import (WANDA_BAND, InputNorms, MaskSwitcher, MultiLevelRouter, apply_mask, band_label,
                                    band_mask, collect_input_norms, embedding_features, fit_subdomains, patch_ranks,
                                    target_linears)
from moelab.free_moe.scoring import ITEM_METRICS, ScoreFn, item_metrics, score_items
from moelab.profiles import paper_input_hint

__all__ = ["band_sweep", "select_bands", "load_local_model", "assign_subdomains", "subdomain_norms", "routed_scores",
           "DowpResult", "SELECT_BY", "dowp_select", "masks_for", "evaluate_methods", "eq3_keys", "fit_router",
           "route_items"]

# ----------------------------------------------------------------------------------------------------------------
# Eq. 6: band sweep per subdomain and θ* selection; subdomains, calibration statistics, routed scoring
# ----------------------------------------------------------------------------------------------------------------
def band_sweep(model: nn.Module, ranks_by_sub: dict, items_by_sub: dict, score_fn: ScoreFn,
               bands: Sequence[tuple[float, float]], include_base: bool = True, mode: str = "remove",
               counts: str = "exact", columns: Sequence[str] | None = None) -> pd.DataFrame:
    """θ* = argmax_θr acc(Output_{MODEL-θr}) (Eq. 6) evaluated for every subdomain and band: apply the band's mask
    (:func:`~moelab.free_moe.method.band_mask` with ``mode`` and ``counts``), score the subdomain's items, restore.
    Returns per-item scores: columns cluster, band, item, score (band "base" = dense model). With ``columns``,
    ``score_fn`` returns [items, len(columns)] and each becomes a column (one of them must be ``score``, the
    selection score). Run on test items it gives the per-item table of the paper's test-selected protocol
    (``report.table1_selection``). A subdomain with no items -> ValueError."""
    cols = ["score"] if columns is None else list(columns)
    if "score" not in cols:
        raise ValueError(f"band_sweep: columns {cols} need a 'score' column (the selection score)")
    frames = []

    def frame(sub, band, sc):
        sc = np.asarray(sc, dtype=float).reshape(len(sc), -1)
        if sc.shape[1] != len(cols):
            raise ValueError(f"band_sweep: score_fn gave {sc.shape[1]} columns for {cols}")
        df = pd.DataFrame(sc, columns=cols)
        df.insert(0, "item", np.arange(len(sc)))
        df.insert(0, "band", band)
        df.insert(0, "cluster", sub)
        return df

    bar = progress.bar(total=len(ranks_by_sub) * (len(bands) + include_base), desc="band sweep", unit="band")
    for sub, ranks in ranks_by_sub.items():
        items = items_by_sub.get(sub, [])
        if len(items) == 0:
            raise ValueError(f"subdomain {sub!r} has no reference examples")
        if include_base:
            frames.append(frame(sub, "base", score_fn(model, items)))
            bar.update(1)
        for band in bands:
            with apply_mask(model, band_mask(ranks, band, mode, counts)):
                sc = score_fn(model, items)
            frames.append(frame(sub, band_label(band), sc))
            bar.update(1)
    bar.close()
    return pd.concat(frames, ignore_index=True)


def select_bands(sweep: pd.DataFrame, bands: Sequence[tuple[float, float]]) -> dict:
    """θ* per cluster: the band with the highest mean reference score (Eq. 6; ties -> the first band listed)."""
    labels = [band_label(b) for b in bands]
    means = sweep[sweep.band.isin(labels)].groupby(["cluster", "band"]).score.mean()
    best = {}
    for c in sweep.cluster.unique():
        vals = [means.get((c, l), -np.inf) for l in labels]
        best[c] = tuple(bands[int(np.argmax(vals))])
    return best


def load_local_model(path, dtype=torch.float32):
    """Paper profile (LLaMA-2-7b-chat, LLaMA-2-13b-chat, Gemma-7b, Gemma-2-9b): load a Hugging Face folder from a local
    path. ``None`` or a missing folder -> ``moelab.assets.MissingAsset`` naming the path."""
    if path is None or not Path(path).is_dir() or not (Path(path) / "config.json").exists():
        raise MissingAsset("Free-MoE paper model", f"no local Hugging Face folder at {path!r}",
                           paper_input_hint("05", "MODEL_PATH", "a local Hugging Face folder of Llama-2-7b-chat, "
                                            "Llama-2-13b-chat, Gemma-7b or Gemma-2-9b"))
    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    target_linears(model)                                                            # fail early on foreign layouts
    return model, tok


def assign_subdomains(model: nn.Module, tok, reference: dict, test: dict, k: int, seed: int = 0,
                      max_length: int = 256) -> dict:
    """§3.1 per main domain: k-means (Eq. 2) on the embedding-layer features of the reference prompts; every reference
    and test item gets the nearest centroid (Eq. 3). Returns dict(domain -> dict(kmeans, ref_labels, test_labels,
    ref_features, test_features)); subdomain names are ``f"{domain}_{i}"``."""
    out = {}
    for dom, items in reference.items():
        if len(items) == 0:
            raise ValueError(f"main domain {dom!r} has no reference examples")
        fr = embedding_features(model, tok, [it["prompt"] for it in items], max_length)
        ft = embedding_features(model, tok, [it["prompt"] for it in test[dom]], max_length) if test.get(dom) else \
            np.zeros((0, fr.shape[1]), np.float32)
        km = fit_subdomains(fr, min(k, len(items)), seed)
        name = lambda a: np.array([f"{dom}_{i}" for i in a], dtype=object)
        out[dom] = dict(kmeans=km, ref_labels=name(km.labels_), test_labels=name(km.predict(ft)) if len(ft) else
                        np.array([], dtype=object), ref_features=fr, test_features=ft)
    return out


def subdomain_norms(model: nn.Module, tok, texts: Sequence[str], sublayers: str = "both", max_tokens: int = 4096,
                    batch_size: int = 8, max_length: int = 256, cache_config: dict | None = None) -> InputNorms:
    """Calibration statistics for one subdomain's reference texts, cached with ``moelab.cache.memo`` when
    ``cache_config`` (a JSON-able description of model + texts) is given."""
    if len(texts) == 0:
        raise ValueError("subdomain_norms: subdomain with no reference texts")

    def compute():
        return collect_input_norms(model, tokenize_batches(tok, texts, batch_size, max_length), sublayers, max_tokens)
    if cache_config is None:
        return compute()
    cfg = dict(cache_config, sublayers=sublayers, max_tokens=max_tokens, max_length=max_length,
               texts=cache.key({"t": list(texts)}))
    return cache.memo("free_moe_norms", cfg, compute)


def routed_scores(model: nn.Module, tok, items: Sequence[dict], keys: Sequence, masks: dict,
                  batch_size: int = 16, score_fn: ScoreFn | None = None) -> np.ndarray:
    """§3.2 inference: every item is scored with the DSS-Expert of its key (subdomain chosen by Eq. 3 or by the
    router); items are grouped by key so each mask is applied once. ``masks[key] = None`` means the dense model."""
    if len(items) != len(keys):
        raise ValueError(f"{len(items)} items vs {len(keys)} routing keys")
    score_fn = score_fn or (lambda m, it: score_items(m, tok, it, batch_size))
    parts: dict = {}
    sw = MaskSwitcher(model, masks)
    try:
        keys = np.asarray(keys, dtype=object)
        for key in dict.fromkeys(keys.tolist()):
            idx = np.flatnonzero(keys == key)
            sw.set(key)
            parts[key] = (idx, np.asarray(score_fn(model, [items[i] for i in idx])))
    finally:
        sw.close()
    if not parts:
        return np.zeros(0)
    first = next(iter(parts.values()))[1]
    out = np.zeros((len(items),) + first.shape[1:])
    for idx, sc in parts.values():
        out[idx] = sc
    return out


# ----------------------------------------------------------------------------------------------------------------
# the whole per-model pipeline (notebook 05 runs it for SmolLM2, and for Gemma-3 in `full`)
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class DowpResult:
    """Per-subdomain band sweep on reference data (Eq. 6), the selected bands θ* and the DSS-Expert masks; with
    ``test_sweep`` the same sweep on test items (the paper's test-selected protocol, never used for selection)."""
    sweep: pd.DataFrame                    # domain, cluster, band, item, score, acc, loglik, pick, metric (reference)
    selected: dict                           # subdomain -> (θmin, θmax)
    masks: dict                              # subdomain -> {"selected" | "0-5%" | "ratio<r>" | ...: PurificationMask}
    test_sweep: pd.DataFrame | None = None   # the same columns on test items (issue 22 item 5)
    select_by: str = "acc"                   # the selection metric of Eq. 6: "acc" or "loglik"


SELECT_BY = ("acc", "loglik")


def dowp_select(model: nn.Module, tok, ref_by_sub: dict, bands: Sequence[tuple[float, float]], patch: int = 1,
                sublayers: str = "both", scope: str = "row", calib_tokens: int = 4096, ratios: Sequence[float] = (),
                extra_bands: Sequence[tuple[float, float]] = (WANDA_BAND,), batch_size: int = 16,
                cache_config: dict | None = None, domain_of: Callable[[str], str] = lambda s: s.rsplit("_", 1)[0],
                log: Callable[[str], None] | None = None, mode: str = "remove", counts: str = "exact",
                select_by: str = "acc", test_by_sub: dict | None = None) -> DowpResult:
    """DOWP (§3.1, Algorithm 1) for each subdomain D_jk: calibrate on its reference texts (streamed ||X_n||), rank
    the patches (Eq. 4), sweep the bands on its reference items (Eq. 5-6), keep θ* = the best band and build the
    masks: ``selected`` (θ*), each ``extra_bands`` entry (the Wanda-like 0-5% by default; the ``selected`` object
    itself when it is θ*), and ``ratio<r>`` = [θ*min, θ*min + r] for each purification ratio r (Table 2).
    ``mode``/``counts``: the band reading and band sizes of :func:`~moelab.free_moe.method.band_mask` (sweep and
    masks alike). ``select_by``: Eq. 6's score, ``"acc"`` (accuracy; answer likelihood for items without options,
    the paper's rule) or ``"loglik"`` (answer likelihood of every item: issue 22's primary metric when no
    multiple-choice task is usable). Every item gets accuracy, likelihood and the picked option
    (:func:`~moelab.free_moe.scoring.item_metrics`) under every band. ``test_by_sub`` (optional, subdomain -> test
    items) are scored under the same masks in the same passes and returned as ``test_sweep``: the paper's
    test-selected protocol (Table 1's DOWP row), never used for θ*. Ranks are dropped after each subdomain."""
    if select_by not in SELECT_BY:
        raise ValueError(f"select_by={select_by!r}: expected one of {SELECT_BY}")
    test_by_sub = test_by_sub or {}
    unknown = sorted(set(test_by_sub) - set(ref_by_sub))
    if unknown:
        raise ValueError(f"test_by_sub has subdomains {unknown} without reference items")

    def score_fn(m, its):
        im = item_metrics(m, tok, its, batch_size)                                   # acc, loglik, pick
        score = im[:, 1] if select_by == "loglik" else np.where(np.isnan(im[:, 0]), im[:, 1], im[:, 0])
        return np.column_stack([score, im])

    frames, test_frames, selected, masks = [], [], {}, {}
    for sub, items in progress.bar(list(ref_by_sub.items()), desc="DOWP subdomains", unit="subdomain"):
        if len(items) == 0:
            raise ValueError(f"subdomain {sub!r} has no reference examples")
        cc = None if cache_config is None else dict(cache_config, subdomain=sub)
        norms = subdomain_norms(model, tok, [calibration_text(it) for it in items], sublayers, calib_tokens,
                                cache_config=cc)
        ranks = patch_ranks(model, norms, patch, sublayers, scope)
        test = list(test_by_sub.get(sub, []))
        both = list(items) + test                                          # one mask application per band for both
        sw = band_sweep(model, {sub: ranks}, {sub: both}, score_fn, bands, mode=mode, counts=counts,
                        columns=("score", *ITEM_METRICS))
        sw.insert(0, "domain", domain_of(sub))
        sw["metric"] = ["acc" if select_by == "acc" and "choices" in both[j] else "loglik" for j in sw["item"]]
        ref_sw, test_sw = sw[sw["item"] < len(items)], sw[sw["item"] >= len(items)].copy()
        test_sw["item"] -= len(items)
        frames.append(ref_sw)
        if test:
            test_frames.append(test_sw)
        best = select_bands(ref_sw, bands)[sub]                            # θ* from the reference items only
        selected[sub] = best
        masks[sub] = {"selected": band_mask(ranks, best, mode, counts)}
        for b in extra_bands:
            masks[sub][band_label(b)] = masks[sub]["selected"] if tuple(b) == tuple(best) else \
                band_mask(ranks, b, mode, counts)
        for r in ratios:
            masks[sub][f"ratio{r:g}"] = band_mask(ranks, (best[0], min(100.0, best[0] + r)), mode, counts)
        del ranks
        if log:
            log(f"{sub}: {len(items)} reference items, θ* = {band_label(best)}")
    return DowpResult(sweep=pd.concat(frames, ignore_index=True), selected=selected, masks=masks,
                      test_sweep=pd.concat(test_frames, ignore_index=True) if test_frames else None,
                      select_by=select_by)


def masks_for(dowp: DowpResult, which: str) -> dict:
    """{subdomain: mask} for one kind of mask ("selected", "0-5%", "ratio3", ...)."""
    return {s: m[which] for s, m in dowp.masks.items()}


def evaluate_methods(model: nn.Module, tok, items: Sequence[dict], routes: dict, batch_size: int = 16,
                     score_fn: ScoreFn | None = None, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """Score test items under several methods: ``routes[method] = (keys, masks)`` with one routing key per item
    (keys None -> dense model; ``masks[key] = None`` -> dense for that key). Each (item, mask) pair is scored once
    however many methods share it (FREE-MOE's correctly routed items reuse DOWP's scores, every method's dense items
    BASELINE's): the mask objects are compared, so pass the same mask objects to the methods that share them.
    Returns per-item scores: method, task, id, then ``score`` (1-D scores) or one column per score dimension
    (``columns`` names them; default ``score0``, ``score1``, ...)."""
    plans, groups = {}, {}                                   # method -> per-item mask; id(mask) -> (mask, item set)
    for method, (keys, masks) in routes.items():
        keys = [None] * len(items) if keys is None else list(keys)
        if len(keys) != len(items):
            raise ValueError(f"{method}: {len(items)} items vs {len(keys)} routing keys")
        masks = masks or {}
        missing = sorted({str(k) for k in keys if k is not None and k not in masks})
        if missing:
            raise ValueError(f"{method}: no mask for routing keys {missing} (have {sorted(map(str, masks))})")
        plan = [None if k is None else masks[k] for k in keys]
        plans[method] = plan
        for i, m in enumerate(plan):
            groups.setdefault(id(m), (m, set()))[1].add(i)
    score_fn = score_fn or (lambda m, it: score_items(m, tok, it, batch_size))
    done: dict = {}                                          # (id(mask), item) -> score row
    for key, (mask, idx) in progress.bar(list(groups.items()), desc="masks on test items", unit="mask"):
        idx = sorted(idx)
        if mask is None:
            sc = np.asarray(score_fn(model, [items[i] for i in idx]))
        else:
            with apply_mask(model, mask):
                sc = np.asarray(score_fn(model, [items[i] for i in idx]))
        for i, v in zip(idx, sc):
            done[(key, i)] = v
    frames = []
    for method, plan in plans.items():
        sc = np.array([done[(id(m), i)] for i, m in enumerate(plan)], dtype=float)
        df = pd.DataFrame(dict(method=method, task=[it["task"] for it in items], id=[it["id"] for it in items]))
        if sc.ndim == 1:
            df["score"] = sc
        else:
            names = list(columns) if columns is not None else [f"score{j}" for j in range(sc.shape[1])]
            if len(names) != sc.shape[1]:
                raise ValueError(f"evaluate_methods: {sc.shape[1]} score columns but columns={names}")
            for j, name in enumerate(names):
                df[name] = sc[:, j]
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def eq3_keys(model: nn.Module, tok, items: Sequence[dict], subdomains: dict, max_length: int = 256,
             as_domain: str | None = None) -> np.ndarray:
    """Oracle main domain (the item's own) + Eq. 3 nearest centroid: the DOWP setting of Table 1. ``as_domain``
    sends every item to that main domain's nearest subdomain instead (the off-domain probe: a domain's DSS-Experts
    applied to other domains' items)."""
    if as_domain is not None:
        if as_domain not in subdomains:
            raise ValueError(f"eq3_keys: as_domain={as_domain!r} is not one of {sorted(subdomains)}")
        items = [dict(it, domain=as_domain) for it in items]
    keys = np.empty(len(items), dtype=object)
    for dom, sd in subdomains.items():
        idx = [i for i, it in enumerate(items) if it["domain"] == dom]
        if idx:
            f = embedding_features(model, tok, [items[i]["prompt"] for i in idx], max_length)
            keys[idx] = [f"{dom}_{c}" for c in sd["kmeans"].predict(f)]
    if any(k is None for k in keys):
        raise ValueError("eq3_keys: some items belong to no main domain with subdomains")
    return keys


def fit_router(model: nn.Module, tok, train_by_dom: dict, subdomains: dict, seed: int = 0,
               max_length: int = 256) -> MultiLevelRouter:
    """Train the multi-level router (Eq. 7-8) on the training split: main-domain labels are the items' domains,
    subdomain labels their Eq. 3 nearest centroid of that domain's k-means (fit on reference data)."""
    items = [it for d in subdomains for it in train_by_dom.get(d, [])]
    if not items:
        raise ValueError("fit_router: no training items")
    F = embedding_features(model, tok, [it["prompt"] for it in items], max_length)
    dom = np.array([it["domain"] for it in items], dtype=object)
    sub = np.empty(len(items), dtype=object)
    for d, sd in subdomains.items():
        sel = dom == d
        if sel.any():
            sub[sel] = [f"{d}_{c}" for c in sd["kmeans"].predict(F[sel])]
    return MultiLevelRouter(seed=seed).fit(F, dom.astype(str), sub.astype(str))


def route_items(router: MultiLevelRouter, model: nn.Module, tok, items: Sequence[dict], max_length: int = 256):
    """Router predictions (main domain, subdomain) for test items (§3.2 inference, Eq. 9)."""
    F = embedding_features(model, tok, [it["prompt"] for it in items], max_length)
    return router.predict(F)

