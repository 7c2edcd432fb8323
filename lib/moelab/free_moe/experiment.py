"""Free-MoE's runs (paper 004, §3.1 Algorithm 1 and §3.2 inference; notebook ``notebooks/05_free_moe.py``): the band
sweep and θ* selection per subdomain (Eq. 6), DOWP per subdomain (calibrate, rank, sweep, select, build masks),
subdomain assignment (Eq. 2-3), the router's training and routing (Eq. 7-9), routed scoring of test items under
several methods, cached calibration statistics, and the paper profile's local model."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from moelab import assets, cache, inputs, progress
from moelab.device import load_for_inference
from moelab.free_moe.data import calibration_text, tokenize_batches
from moelab.free_moe.method import (SUBLAYERS, WANDA_BAND, InputNorms, MaskSwitcher, MultiLevelRouter, apply_mask,
                                    band_label, band_mask, collect_input_norms, embedding_features, fit_subdomains,
                                    patch_ranks, restrict_mask, target_linears)
from moelab.free_moe.scoring import ITEM_METRICS, ScoreFn, humaneval_score_fn, item_metrics, score_items
from moelab.stats import paired_t_interval
from moelab.suite import lmeval

__all__ = ["load_model", "check_model_path", "cache_config", "MODEL_TYPES", "Clusters", "reference_clusters", "cluster_keys", "route_test", "LONG_METRICS", "to_long",
           "table1_scores", "keep_probe", "purified_pct", "ablation_items", "ratio_ablation", "sublayer_ablation",
           "reselect_ablation", "hook_check", "model_rows", "test_sweep_items", "ABLATION_SLUGS", "run_ablations",
           "band_sweep", "select_bands", "load_local_model", "assign_subdomains", "subdomain_norms", "routed_scores",
           "DowpResult", "select_with_gate", "dowp_select", "masks_for", "evaluate_methods", "eq3_keys", "fit_router",
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


PAPER_MODEL = "a local Hugging Face folder of Llama-2-7b-chat, Llama-2-13b-chat, Gemma-7b or Gemma-2-9b"
MODEL_TYPES = ("llama", "gemma", "gemma2")     # config.json model_type of the paper's models (Llama/Gemma projections)


def check_model_path(path) -> dict:
    """The paper profile's ``MODEL_PATH`` checked in the notebook's first seconds, before anything is loaded or
    scored (``moelab.inputs.require_hf_model``): a folder with ``config.json`` whose ``model_type`` is one of
    ``MODEL_TYPES``, weights and a tokenizer. ``None`` or a missing path -> ``MissingAsset``; a wrong layout ->
    ``InputFormatError`` naming the parameter, the file, the field and the fix. Returns the parsed config."""
    return inputs.require_hf_model("05", "MODEL_PATH", path, PAPER_MODEL, model_types=MODEL_TYPES)


def load_local_model(path, dtype=torch.float32):
    """Paper profile (LLaMA-2-7b-chat, LLaMA-2-13b-chat, Gemma-7b, Gemma-2-9b): load a Hugging Face folder from a local
    path, checked first by :func:`check_model_path` (``None`` or a missing folder -> ``moelab.assets.MissingAsset``
    naming the path and the parameter; another layout -> ``moelab.inputs.InputFormatError``)."""
    check_model_path(path)
    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    target_linears(model)                                                            # fail early on foreign layouts
    return model, tok


def load_model(profile: str, model_path=None, device: str = "cpu"):
    """The model a profile runs: SmolLM2-135M-Instruct from ``moelab.assets`` (smoke, default, full), or the paper
    profile's local folder (:func:`load_local_model`). ``device="cpu"`` loads it in fp32 on the CPU; ``"auto"`` places
    it by :func:`moelab.device.load_for_inference` (CUDA in bf16 when present, and says so; scoring, calibration and
    masks follow the weights' device). Returns (model, tok, name, scorecard name)."""
    if profile == "paper":                               # load_local_model checks MODEL_PATH before it loads
        loader, args, name = load_local_model, (model_path,), str(model_path)
        scorecard_name = name
    else:
        loader, args = assets.load_smollm2, ()
        name, scorecard_name = "SmolLM2-135M-Instruct", "smollm2-135m-instruct"
    model, tok = loader(*args) if device == "cpu" else load_for_inference(loader, *args, device=device)
    return model, tok, name, scorecard_name


def cache_config(profile: str, model_name: str, seed: int, cfg, model_path=None) -> dict:
    """The configuration every cached step of notebook 05 is keyed by (calibration statistics, band sweeps, Table 1
    scores, the ablations' re-selections, the scorecard of the paper profile's model). The paper profile adds
    ``model_id`` = :func:`moelab.cache.path_identity` of ``MODEL_PATH`` (resolved path and a digest of its files), so
    another model in the same folder, or the same name at another path, never reuses an entry."""
    out = dict(model=model_name, profile=profile, seed=seed, n_ref=cfg.n_ref_cluster, K=cfg.K)
    if profile == "paper":
        out["model_id"] = cache.path_identity(model_path)
    return out


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
    """Per-cluster band sweep on reference data (Eq. 6), the selection with its gate, and the DSS-Expert masks; with
    ``test_sweep`` the same sweep on test items (the paper's test-selected protocol, never used for selection)."""
    sweep: pd.DataFrame                      # domain, group, cluster, band, role, item, ITEM_METRICS (reference)
    selected: dict                           # cluster -> (θmin, θmax), or None: no band improved it (dense kept)
    masks: dict                              # cluster -> {"selected" (None if dense) | "0-5%" | "ratio<r>" | ...}
    selection: pd.DataFrame | None = None    # per cluster: best band, reference gain and interval, selected
    test_sweep: pd.DataFrame | None = None   # the same columns on test items
    scored: dict = field(default_factory=dict, repr=False)   # evaluate_methods' memo: (mask, item list) -> scores


def select_with_gate(sweep: pd.DataFrame, bands: Sequence[tuple[float, float]], level: float = 0.95,
                     gate: bool = True) -> tuple[dict, pd.DataFrame]:
    """θ* = argmax_θr mean reference score (Eq. 6) over the selectable ``bands`` only (the paper's 50-100% grid;
    baseline rows such as Wanda's 0-5% never win), then the selection gate: θ* is kept only when its paired
    t-interval of (θ* - dense) over the cluster's reference items lies above 0; otherwise the cluster keeps the dense
    model (selected None). The interval is computed on the items θ* was chosen on, so it is optimistic; held-out
    test items give the unbiased number. Returns (selected, table) with one row per cluster: group, cluster,
    n_ref, best_band, base, best, gain, lo, hi, selected (bool), band (θ* label or "base")."""
    labels = [band_label(b) for b in bands]
    rows, selected = [], {}
    for c, s in sweep.groupby("cluster", sort=False):
        wide = s.pivot_table(index="item", columns="band", values="score")
        means = wide[labels].mean()
        best = labels[int(np.argmax(means.to_numpy()))]                               # ties -> first band listed
        iv = paired_t_interval(wide[best].to_numpy(), wide["base"].to_numpy(), level)
        keep = bool(iv.low > 0) or not gate
        selected[c] = tuple(bands[labels.index(best)]) if keep else None
        rows.append(dict(domain=s.domain.iloc[0], group=s.group.iloc[0], cluster=c, n_ref=len(wide),
                         best_band=best, base=float(wide["base"].mean()), best=float(means[best]),
                         gain=iv.estimate, lo=iv.low, hi=iv.high, selected=keep, band=best if keep else "base"))
    return selected, pd.DataFrame(rows)


def dowp_select(model: nn.Module, tok, ref_by_sub: dict, bands: Sequence[tuple[float, float]], patch: int = 1,
                sublayers: str = "both", scope: str = "row", calib_tokens: int = 4096, ratios: Sequence[float] = (),
                baseline_bands: Sequence[tuple[float, float]] = (WANDA_BAND,), batch_size: int = 16,
                cache_config: dict | None = None, group_of: Callable[[str], str] = lambda s: s.rsplit("_", 1)[0],
                log: Callable[[str], None] | None = None, mode: str = "remove", counts: str = "exact",
                test_by_sub: dict | None = None, gate: bool = True, level: float = 0.95) -> DowpResult:
    """DOWP (§3.1, Algorithm 1) for each cluster D_jk: calibrate on its reference texts (streamed ||X_n||), rank the
    patches (Eq. 4), sweep ``bands`` (selectable) and ``baseline_bands`` (Wanda's 0-5%: a baseline row, never
    selected) on its reference items (Eq. 5-6), select θ* with :func:`select_with_gate` on the accuracy-aligned
    score (``item_metrics``' ``score``: p(gold)/Σp(options) for multiple choice, answer log-likelihood per token
    for generative items; a cluster holds one task type) and build the masks: ``best`` (the arg-max band with no
    gate: the paper's Algorithm 1), ``selected`` (θ* where it passed the gate, or None = dense: our departure), each
    baseline band, and ``ratio<r>`` = [θmin, θmin + r] of the arg-max band (Table 2, an ablation of Algorithm 1: every
    cluster, no gate).
    ``mode``/``counts``: the band reading of :func:`~moelab.free_moe.method.band_mask`. ``test_by_sub`` (optional)
    are scored under the same masks in the same passes and returned as ``test_sweep`` (the paper's test-selected
    protocol), never used for θ*. With ``cache_config`` each (cluster, band) result is cached on its own, so an
    interrupted sweep resumes band by band."""
    test_by_sub = test_by_sub or {}
    unknown = sorted(set(test_by_sub) - set(ref_by_sub))
    if unknown:
        raise ValueError(f"test_by_sub has subdomains {unknown} without reference items")
    for b in baseline_bands:
        if tuple(map(float, b)) in {tuple(map(float, x)) for x in bands}:
            raise ValueError(f"band {band_label(b)} is both selectable and a baseline row")
    frames, test_frames, masks = [], [], {}
    for sub, items in progress.bar(list(ref_by_sub.items()), desc="DOWP clusters", unit="cluster"):
        if len(items) == 0:
            raise ValueError(f"subdomain {sub!r} has no reference examples")
        kinds = {"mc" if it.get("choices") else "gen" for it in items}
        if len(kinds) > 1:
            raise ValueError(f"cluster {sub!r} mixes multiple-choice and generative reference items: select each "
                             "task type on its own items")
        cc = None if cache_config is None else dict(cache_config, subdomain=sub)
        norms = subdomain_norms(model, tok, [calibration_text(it) for it in items], sublayers, calib_tokens,
                                cache_config=cc)
        ranks = patch_ranks(model, norms, patch, sublayers, scope)
        both = list(items) + list(test_by_sub.get(sub, []))          # one mask application per band for both
        ids = cache.key({"ids": [(it.get("task"), str(it.get("id")), it["prompt"][:64]) for it in both]})
        parts = []
        for band in [None, *bands, *baseline_bands]:
            label = "base" if band is None else band_label(band)

            def compute(band=band):
                if band is None:
                    return item_metrics(model, tok, both, batch_size)
                with apply_mask(model, band_mask(ranks, band, mode, counts)):
                    return item_metrics(model, tok, both, batch_size)
            sc = compute() if cc is None else cache.memo(
                "free_moe_band", dict(cc, band=label, items=ids, patch=patch, scope=scope, mode=mode, counts=counts,
                                      sublayers=sublayers, calib_tokens=calib_tokens), compute)
            df = pd.DataFrame(np.asarray(sc), columns=list(ITEM_METRICS))
            df.insert(0, "item", np.arange(len(both)))
            df.insert(0, "role", "baseline" if band in baseline_bands else ("dense" if band is None else "band"))
            df.insert(0, "band", label)
            parts.append(df)
        sw = pd.concat(parts, ignore_index=True)
        sw.insert(0, "cluster", sub)
        sw.insert(0, "group", group_of(sub))
        sw.insert(0, "domain", group_of(sub).split("-")[0])
        sw["kind"] = kinds.pop()
        frames.append(sw[sw["item"] < len(items)])
        if len(both) > len(items):
            t = sw[sw["item"] >= len(items)].copy()
            t["item"] -= len(items)
            test_frames.append(t)
        chosen, _ = select_with_gate(frames[-1], bands, level, gate)
        best = chosen[sub]
        top = select_with_gate(frames[-1], bands, level, gate=False)[0][sub]          # best band, ungated
        masks[sub] = {"best": band_mask(ranks, top, mode, counts)}
        masks[sub]["selected"] = None if best is None else masks[sub]["best"]
        for b in baseline_bands:
            masks[sub][band_label(b)] = band_mask(ranks, b, mode, counts)
        for r in ratios:                                          # Table 2 ablates Algorithm 1's band: no gate
            masks[sub][f"ratio{r:g}"] = band_mask(ranks, (top[0], min(100.0, top[0] + r)), mode, counts)
        del ranks
        if log:
            log(f"{sub}: {len(items)} reference items, θ* = {'dense' if best is None else band_label(best)}")
    sweep = pd.concat(frames, ignore_index=True)
    selected, table = select_with_gate(sweep, bands, level, gate)
    return DowpResult(sweep=sweep, selected=selected, masks=masks, selection=table,
                      test_sweep=pd.concat(test_frames, ignore_index=True) if test_frames else None)


def masks_for(dowp: DowpResult, which: str) -> dict:
    """{subdomain: mask} for one kind of mask ("selected", "best", "0-5%", "ratio3", ...); None (the dense model)
    where a cluster has no such mask ("selected": no band passed the gate)."""
    return {s: m.get(which) for s, m in dowp.masks.items()}


def _item_key(it: dict) -> tuple:
    """What an item is, for :func:`evaluate_methods`' memo: task, id, prompt, options or answer, gold label."""
    return (it.get("task"), str(it.get("id")), it.get("prompt"), tuple(it.get("choices") or ()), it.get("answer"),
            it.get("label"))


def evaluate_methods(model: nn.Module, tok, items: Sequence[dict], routes: dict, batch_size: int = 16,
                     score_fn: ScoreFn | None = None, columns: Sequence[str] | None = None,
                     memo: dict | None = None, memo_key=None) -> pd.DataFrame:
    """Score test items under several methods: ``routes[method] = (keys, masks)`` with one routing key per item
    (keys None -> dense model; ``masks[key] = None`` -> dense for that key). Each (item, mask) pair is scored once
    however many methods share it (FREE-MOE's correctly routed items reuse DOWP's scores, every method's dense items
    BASELINE's): the mask objects are compared, so pass the same mask objects to the methods that share them.
    ``memo`` (a dict kept across calls, e.g. :attr:`DowpResult.scored`) with ``memo_key`` (hashable, naming
    ``score_fn`` and its settings): a mask's item list that an earlier call already scored with the same score
    function is taken from ``memo`` instead of being run again (notebook 05: Algorithm 1's table repeats the main
    table's selected clusters, Table 2's 5% row repeats Algorithm 1's general clusters). Only the same item list in
    the same order is reused: the scorer batches a list by length, and a float sum depends on its batch, so only
    then are the numbers those of a fresh call bit for bit.
    Returns per-item scores: method, task, id, then ``score`` (1-D scores) or one column per score dimension
    (``columns`` names them; default ``score0``, ``score1``, ...)."""
    if memo is not None and memo_key is None:
        raise ValueError("evaluate_methods: memo needs memo_key, naming the score function and its settings")
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
        mk = None if memo is None else (key, memo_key, tuple(_item_key(items[i]) for i in idx))
        hit = None if mk is None else memo.get(mk)
        if hit is not None and hit[0] is mask:               # the stored mask pins its id: no reuse by another
            sc = hit[1]
        elif mask is None:
            sc = np.asarray(score_fn(model, [items[i] for i in idx]))
        else:
            with apply_mask(model, mask):
                sc = np.asarray(score_fn(model, [items[i] for i in idx]))
        if mk is not None:
            memo[mk] = (mask, sc)
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



# ----------------------------------------------------------------------------------------------------------------
# clusters per selection group with enough reference items, type-aware routing, the held-out comparison
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class Clusters:
    """k-means subdomains per selection group (main domain x task type; Eq. 2-3) and each cluster's reference items."""
    kmeans: dict                  # group -> fitted KMeans
    ref: dict                     # cluster name f"{group}_{i}" -> reference items
    table: pd.DataFrame           # per cluster: domain, group, kind, cluster, K_requested, K_used, pool, reference


def reference_clusters(model: nn.Module, tok, pools: dict, K: dict, n_per_cluster: int, min_ref: int,
                       seed: int = 0, max_length: int = 256) -> Clusters:
    """Eq. 2 per selection group: k-means on the embedding features of the group's held-out reference pool, with
    the requested K where every cluster holds at least ``min_ref`` pool items, else the largest K that does (fewer
    clusters; the table records both). Each cluster selects on its first ``n_per_cluster`` pool
    items (pool order: validation first)."""
    kms, ref, rows = {}, {}, []
    for g, pool in pools.items():
        F = embedding_features(model, tok, [it["prompt"] for it in pool], max_length)
        k_req = int(K.get(g, 1))
        for k in range(min(k_req, len(pool)), 0, -1):
            km = fit_subdomains(F, k, seed)
            counts = np.bincount(km.labels_, minlength=k)
            if counts.min() >= min_ref:
                break
        if counts.min() < min_ref:
            raise ValueError(f"group {g!r}: its pool holds {len(pool)} items, fewer than min_ref={min_ref}: "
                             "raise pool_per_task")
        kms[g] = km
        for c in range(k):
            name = f"{g}_{c}"
            ref[name] = [pool[i] for i in np.flatnonzero(km.labels_ == c)[:n_per_cluster]]
            rows.append(dict(domain=g.split("-")[0], group=g, kind=g.split("-")[1], cluster=name, K_requested=k_req,
                             K_used=k, pool=int(counts[c]), reference=len(ref[name]),
                             why="" if k == k_req else
                             f"K={k_req} left a cluster under {min_ref} items: fewer clusters"))
    return Clusters(kmeans=kms, ref=ref, table=pd.DataFrame(rows))


def cluster_keys(model: nn.Module, tok, items: Sequence[dict], clusters: Clusters, as_domain: str | None = None,
                 max_length: int = 256) -> np.ndarray:
    """Eq. 3 with the oracle main domain (Table 1's DOWP): each item's nearest cluster of its own group (main domain
    x task type); ``as_domain`` uses that domain's group of the item's type instead (the off-domain probe), or None
    (dense) where that domain has no expert of the item's type."""
    keys = np.full(len(items), None, dtype=object)
    groups = [f"{as_domain or it['domain']}-{it['kind']}" for it in items]
    for g in dict.fromkeys(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        if g in clusters.kmeans:
            f = embedding_features(model, tok, [items[i]["prompt"] for i in idx], max_length)
            keys[idx] = [f"{g}_{c}" for c in clusters.kmeans[g].predict(f)]
        elif as_domain is None:
            raise ValueError(f"cluster_keys: no clusters for group {g!r} (have {sorted(clusters.kmeans)})")
    return keys


def route_test(model: nn.Module, tok, train_by_dom: dict, clusters: Clusters, items: Sequence[dict], seed: int = 0,
               max_length: int = 256) -> tuple[MultiLevelRouter, pd.DataFrame]:
    """§3.2 (Eq. 7-9): the multi-level router trained on the training split (main label = selection group, sub label =
    Eq. 3 cluster), then each test item routed among the groups of its own task type (a multiple-choice request goes
    to a multiple-choice expert). Returns (router, per-item table: task, id, domain, kind, pred_domain, eq3_sub,
    pred_sub, main_ok, sub_ok)."""
    tr = [it for d in train_by_dom for it in train_by_dom[d] if it["group"] in clusters.kmeans]
    if not tr:
        raise ValueError("route_test: no training items in the clusters' groups")
    F = embedding_features(model, tok, [it["prompt"] for it in tr], max_length)
    grp = np.array([it["group"] for it in tr], dtype=object)
    sub = np.empty(len(tr), dtype=object)
    for g, km in clusters.kmeans.items():
        sel = grp == g
        if sel.any():
            sub[sel] = [f"{g}_{c}" for c in km.predict(F[sel])]
    router = MultiLevelRouter(seed=seed).fit(F, grp.astype(str), sub.astype(str))
    Ft = embedding_features(model, tok, [it["prompt"] for it in items], max_length)
    allowed = [[g for g in clusters.kmeans if g.endswith("-" + it["kind"])] for it in items]
    pred_grp, pred_sub = router.predict(Ft, allowed)
    eq3 = cluster_keys(model, tok, items, clusters, max_length=max_length)
    routing = pd.DataFrame(dict(task=[it["task"] for it in items], id=[str(it["id"]) for it in items],
                                domain=[it["domain"] for it in items], kind=[it["kind"] for it in items],
                                pred_domain=[g.split("-")[0] for g in pred_grp], eq3_sub=eq3, pred_sub=pred_sub))
    routing["main_ok"] = routing.domain == routing.pred_domain
    routing["sub_ok"] = routing.eq3_sub == routing.pred_sub
    return router, routing


LONG_METRICS = ("acc", "acc_norm", "p_gold", "p_gold_norm", "loglik")     # item_metrics columns reported per item


def to_long(wide: pd.DataFrame, metrics: Sequence[str] = LONG_METRICS, keep: Sequence[str] = ()) -> pd.DataFrame:
    """evaluate_methods' wide per-item table -> one row per item and metric (NaN rows dropped: a multiple-choice
    item has acc/acc_norm/p_gold/p_gold_norm rows, a generative one a loglik row)."""
    have = [m for m in metrics if m in wide.columns]
    ids = ["method", "task", "id", *keep]
    long = wide[ids + have].melt(id_vars=ids, value_vars=have, var_name="metric", value_name="score")
    return long.dropna(subset=["score"])


def table1_scores(model: nn.Module, tok, items: Sequence[dict], he_items: Sequence[dict], routing: pd.DataFrame,
                  dowp: DowpResult, he_n: int = 1, he_tokens: int = 96, batch_size: int = 16, seed: int = 0,
                  cache_config: dict | None = None, which: str = "selected",
                  methods: Sequence[str] = ("BASELINE", "DOWP", "FREE-MOE")) -> pd.DataFrame:
    """Table 1 on held-out test items: BASELINE (dense), DOWP (oracle main domain + Eq. 3 cluster's DSS-Expert) and
    FREE-MOE (the router's cluster), each of ``methods``. ``which`` names the masks: ``"selected"`` (our gated
    selection: dense where the cluster's reference gain interval was not above 0) or ``"best"`` (the paper's
    Algorithm 1: every cluster's arg-max band, no fallback). ``routing`` rows follow ``items + he_items``. Per item
    and metric (acc, acc_norm, p_gold, p_gold_norm for multiple choice; loglik for generative; pass@1 (and pass@10
    when ``he_n >= 10``) for HumanEval problems). Each (item, mask) pair is scored once, and a mask's item list an
    earlier table already scored comes from ``dowp.scored`` (:func:`evaluate_methods`' memo: Algorithm 1 repeats the
    gated table's selected clusters); with ``cache_config`` the whole table is cached by its routing, masks and
    methods."""
    unknown = sorted(set(methods) - {"BASELINE", "DOWP", "FREE-MOE"})
    if unknown or not methods:
        raise ValueError(f"table1_scores: methods must be among BASELINE, DOWP, FREE-MOE, got {list(methods)}")
    if which not in ("selected", "best"):
        raise ValueError(f"table1_scores: which must be 'selected' (gated) or 'best' (Algorithm 1), got {which!r}")
    sel = masks_for(dowp, which)
    n_t = len(items)
    eq3, pred = routing.eq3_sub.tolist(), routing.pred_sub.tolist()
    ks = (1, 10) if he_n >= 10 else (1,)

    def compute():
        routes = {m: r for m, r in {"BASELINE": (None, None), "DOWP": (eq3[:n_t], sel),
                                     "FREE-MOE": (pred[:n_t], sel)}.items() if m in methods}
        wide = evaluate_methods(model, tok, items, routes, columns=ITEM_METRICS,
                                score_fn=lambda m, its: item_metrics(m, tok, its, batch_size),
                                memo=dowp.scored, memo_key=("item_metrics", id(model), batch_size))
        parts = [to_long(wide)]
        if he_items:
            he_fn = humaneval_score_fn(tok, n=he_n, ks=ks, max_new_tokens=he_tokens, seed=seed)
            he_routes = {m: r for m, r in {"BASELINE": (None, None), "DOWP": (eq3[n_t:], sel),
                                            "FREE-MOE": (pred[n_t:], sel)}.items() if m in methods}
            he = evaluate_methods(model, tok, he_items, he_routes, score_fn=he_fn, columns=[f"pass@{k}" for k in ks])
            parts.append(he.melt(id_vars=["method", "task", "id"], var_name="metric", value_name="score"))
        return pd.concat(parts, ignore_index=True)
    if cache_config is None:
        out = compute()
    else:
        cfg = dict(cache_config, step="table1", eq3=[str(k) for k in eq3], pred=[str(k) for k in pred],
                   selected={c: None if b is None else band_label(b) for c, b in dowp.selected.items()},
                   **({} if which == "selected" and tuple(methods) == ("BASELINE", "DOWP", "FREE-MOE") else
                      dict(which=which, methods=list(methods),
                           best=dict(zip(dowp.selection.cluster, dowp.selection.best_band)))),
                   items=cache.key({"i": [(it["task"], str(it["id"])) for it in [*items, *he_items]]}),
                   he=(he_n, he_tokens, seed))
        out = cache.memo("free_moe_table1", cfg, compute)
    dom = {it["task"]: it["domain"] for it in [*items, *he_items]}
    out.insert(2, "domain", out.task.map(dom))
    return out


def keep_probe(model: nn.Module, tok, items: Sequence[dict], clusters: Clusters, dowp: DowpResult, n_probe: int,
               which: str = "selected", batch_size: int = 16) -> pd.DataFrame:
    """Extension (not a claim of the paper): each main domain's DSS-Experts on the other domains'
    items. The first ``n_probe`` test items per task, each sent to the mask domain's nearest cluster of the item's
    own type (dense where that domain has no expert of the type, and on its own items). Per item: the
    accuracy-aligned score (p_gold for multiple choice, loglik for generative), dense (BASELINE) and purified."""
    seen, probe = {}, []
    for it in items:
        seen[it["task"]] = seen.get(it["task"], 0) + 1
        if seen[it["task"]] <= n_probe:
            probe.append(it)
    doms = list(dict.fromkeys(g.split("-")[0] for g in clusters.kmeans))
    masks = masks_for(dowp, which)
    routes = {"BASELINE": (None, None)}
    for d in doms:
        k = cluster_keys(model, tok, probe, clusters, as_domain=d)
        routes[d] = ([None if it["domain"] == d else key for it, key in zip(probe, k)], masks)
    w = evaluate_methods(model, tok, probe, routes, score_fn=lambda m, its: item_metrics(m, tok, its, batch_size),
                         columns=ITEM_METRICS)
    w["metric"] = ["p_gold" if it.get("choices") else "loglik" for it in probe] * len(routes)
    w["domain"] = [it["domain"] for it in probe] * len(routes)
    parts = []
    for d in doms:
        for method, label in (("BASELINE", "BASELINE"), (d, "purified")):
            g = w[(w.method == method) & (w.domain != d)]
            parts.append(g.assign(method=label, mask_domain=d)[["method", "mask_domain", "domain", "task", "id",
                                                                  "metric", "score"]])
    return pd.concat(parts, ignore_index=True)


# ----------------------------------------------------------------------------------------------------------------
# ablations (Tables 2-5, band readings) with the purified share beside every score
# ----------------------------------------------------------------------------------------------------------------
def purified_pct(mask, total_weights: int) -> float:
    """Share of all DOWP target weights (every attention and MLP projection) a mask purifies, in percent (0 for the
    dense model)."""
    return 0.0 if mask is None else 100.0 * mask.n_purified() / total_weights


def ablation_items(model: nn.Module, tok, items: Sequence[dict], routes: dict, batch_size: int = 16,
                   memo: dict | None = None) -> pd.DataFrame:
    """Per item, option and metric under ``routes`` (:func:`evaluate_methods`, with its ``memo``), with
    ``purified_pct``: the share of all target weights the mask that scored the item purifies."""
    total = sum(lin.weight.numel() for lin in target_linears(model).values())
    w = evaluate_methods(model, tok, items, routes, score_fn=lambda m, its: item_metrics(m, tok, its, batch_size),
                         columns=ITEM_METRICS, memo=memo, memo_key=("item_metrics", id(model), batch_size))
    pct, share = [], {}                        # id(mask) -> its share, counted once per mask (routes hold the masks)
    for method, (keys, masks) in routes.items():
        keys = [None] * len(items) if keys is None else list(keys)
        for k in keys:
            m = None if k is None else (masks or {}).get(k)
            if id(m) not in share:
                share[id(m)] = purified_pct(m, total)
            pct.append(share[id(m)])
    w["purified_pct"] = pct
    return to_long(w, keep=("purified_pct",))


def ratio_ablation(model: nn.Module, tok, items: Sequence[dict], clusters: Clusters, dowp: DowpResult,
                   ratios: Sequence[float], batch_size: int = 16) -> pd.DataFrame:
    """Table 2 (an ablation of the paper's Algorithm 1): purification ratio r = width of the purified band placed at
    θmin of each cluster's arg-max reference band (5% = that band itself; every cluster, no gate), on the same items
    (routed by Eq. 3), with the purified share. The 5% row's (mask, items) lists that Algorithm 1's Table 1 already
    scored come from ``dowp.scored`` (:func:`evaluate_methods`' memo)."""
    keys = cluster_keys(model, tok, items, clusters)
    routes = {"base": (None, None), "5%": (keys, masks_for(dowp, "best"))}
    routes.update({f"{r:g}%": (keys, masks_for(dowp, f"ratio{r:g}")) for r in ratios})
    return ablation_items(model, tok, items, routes, batch_size, memo=dowp.scored)


def sublayer_ablation(model: nn.Module, tok, items: Sequence[dict], keys: Sequence, dowp: DowpResult,
                      batch_size: int = 16) -> pd.DataFrame:
    """Table 3: each cluster's best reference band (ungated, so every option purifies something) restricted to the MLP,
    the attention or both sublayers; the purified share differs by option and is reported beside every score."""
    best = masks_for(dowp, "best")
    routes = {"base": (None, None)}
    routes.update({s: (keys, {k: None if m is None else restrict_mask(m, s) for k, m in best.items()})
                   for s in SUBLAYERS})
    return ablation_items(model, tok, items, routes, batch_size)


def reselect_ablation(model: nn.Module, tok, items: Sequence[dict], options: dict, batch_size: int = 16,
                      which: str = "best") -> pd.DataFrame:
    """Tables 4-5 and the band readings: ``options[label] = (keys, DowpResult)``, each re-selected on its own
    reference items; every option's ``which`` masks scored on the same items beside the dense model, with shares."""
    routes = {"base": (None, None)}
    routes.update({lab: (k, masks_for(d, which)) for lab, (k, d) in options.items()})
    return ablation_items(model, tok, items, routes, batch_size)


def hook_check(model: nn.Module, tok, router: MultiLevelRouter, clusters: Clusters, dowp: DowpResult,
               scores: pd.DataFrame, task: str, n: int, max_length: int = 256) -> dict:
    """FREE-MOE through lm-eval (``moelab.suite.lmeval.evaluate(..., request_hook=)``): the hook routes each
    multiple-choice request's context among the multiple-choice groups and switches the selected mask in place;
    the per-item accuracy must equal the batched scorer's FREE-MOE rows of ``scores`` (the Table 1 long table)."""
    allowed = [[g for g in clusters.kmeans if g.endswith("-mc")]]
    switch = MaskSwitcher(model, masks_for(dowp, "selected"))

    def hook(ctx):
        switch.set(router.predict(embedding_features(model, tok, [ctx], max_length), allowed)[1][0])
    try:
        via = lmeval.evaluate(model, tok, [task], limit=n, request_hook=hook)
    finally:
        switch.close()
    ours = scores[(scores.method == "FREE-MOE") & (scores.task == task) & (scores.metric == "acc")]
    ours = ours.assign(id=ours.id.astype(str)).set_index("id").score
    vh = via[via.metric == "acc"].assign(item_id=lambda d: d.item_id.astype(str)).set_index("item_id").score
    agree = float((vh.to_numpy() == ours.reindex(vh.index).to_numpy()).mean())
    return dict(task=task, n=len(vh), agreement=agree, hook_acc=float(vh.mean()), switches=switch.n_switches)


def model_rows(model: nn.Module, tok, data: dict, K: dict, bands: Sequence, n_per_cluster: int, min_ref: int,
               n_items: int, calib_tokens: int, patch: int = 1, batch_size: int = 16, seed: int = 0,
               cache_config: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The whole pipeline for a second model (Gemma-3-270M in ``full``): clusters on the same reference pools (its
    own embedding layer), DOWP with the gate, the router, and BASELINE / DOWP / FREE-MOE on the first ``n_items``
    test items per task. Returns (per-item long scores with our gated selection, selection table, per-item DOWP /
    FREE-MOE scores under the paper's Algorithm 1: arg-max band, no gate)."""
    cl = reference_clusters(model, tok, data["pools"], K, n_per_cluster, min_ref, seed)
    dw = dowp_select(model, tok, cl.ref, bands, patch=patch, calib_tokens=calib_tokens, batch_size=batch_size,
                     cache_config=cache_config)
    seen, items = {}, []
    for it in [x for d in data["test"].values() for x in d]:
        seen[it["task"]] = seen.get(it["task"], 0) + 1
        if seen[it["task"]] <= n_items:
            items.append(it)
    _, routing = route_test(model, tok, data["train"], cl, items, seed)
    alg1 = table1_scores(model, tok, items, [], routing, dw, batch_size=batch_size, which="best",
                         methods=("DOWP", "FREE-MOE"))
    return table1_scores(model, tok, items, [], routing, dw, batch_size=batch_size), dw.selection, alg1


def test_sweep_items(model: nn.Module, tok, test: dict, clusters: Clusters, n_sweep: int) -> dict | None:
    """The first ``n_sweep`` test items per task, by Eq. 3 cluster: swept under every band beside the reference items
    (the paper's test-selected protocol, never used for selection). None when ``n_sweep`` is 0."""
    if n_sweep <= 0:
        return None
    seen, items = {}, []
    for it in [x for d in test.values() for x in d]:
        seen[it["task"]] = seen.get(it["task"], 0) + 1
        if seen[it["task"]] <= n_sweep:
            items.append(it)
    out: dict = {}
    for it, k in zip(items, cluster_keys(model, tok, items, clusters)):
        out.setdefault(k, []).append(it)
    return out


ABLATION_SLUGS = {"table3": "sublayers", "table4": "patch", "table5": "kmeans", "readings": "band-readings"}


def run_ablations(model: nn.Module, tok, data: dict, clusters: Clusters, dowp: DowpResult, cfg,
                  cache_config: dict | None = None, seed: int = 0) -> dict:
    """Tables 3-5 and the band readings where ``cfg`` (a ``FreeMoeConfig``) enables them, each on its domain's test
    items beside the dense model with the purified share of every option:

    - ``table3`` (maths, paper GSM8K/MathQA): each maths cluster's best band restricted to MLP / attention / both;
    - ``table4`` (code, paper MBPP/HumanEval): re-selected at each patch size of ``ablate_patch`` (and ``patch``)
      on ``ablate_bands`` (equal shares: exact counts);
    - ``table5`` (general, paper MMLU): re-clustered with each K of ``ablate_K`` and re-selected;
    - ``readings`` (general): ranks within the whole matrix, or keep only the band, re-selected.

    Options use each cluster's best band (ungated), so every option purifies something and its share is known.
    Returns {table id: per-item long table with purified_pct}."""
    out = {}
    bands = cfg.grid_bands("ablate_bands")
    kw = dict(calib_tokens=cfg.calib_tokens, batch_size=cfg.batch, baseline_bands=())
    by_dom = lambda d: (data["test"][d], cluster_keys(model, tok, data["test"][d], clusters))
    if cfg.ablate_sublayers:
        items, keys = by_dom("maths")
        out["table3"] = sublayer_ablation(model, tok, items, keys, dowp, cfg.batch)
    if cfg.ablate_patch:
        items, keys = by_dom("code")
        ref = {c: v for c, v in clusters.ref.items() if c.startswith("code-")}
        opts = {f"{p}x{p}": (keys, dowp_select(model, tok, ref, bands, patch=p, cache_config=cache_config, **kw))
                for p in dict.fromkeys([cfg.patch, *cfg.ablate_patch])}
        out["table4"] = reselect_ablation(model, tok, items, opts, cfg.batch)
    if cfg.ablate_K:
        items = data["test"]["general"]
        opts = {}
        for K in cfg.ablate_K:
            cl = reference_clusters(model, tok, {"general-mc": data["pools"]["general-mc"]}, {"general-mc": K},
                                    cfg.n_ref_cluster, cfg.min_ref, seed)
            cc = None if cache_config is None else dict(cache_config, K={"general-mc": K})
            opts[f"K={K}"] = (cluster_keys(model, tok, items, cl),
                              dowp_select(model, tok, cl.ref, bands, cache_config=cc, **kw))
        out["table5"] = reselect_ablation(model, tok, items, opts, cfg.batch)
    if cfg.readings:
        items, keys = by_dom("general")
        ref = {c: v for c, v in clusters.ref.items() if c.startswith("general-")}
        opts = {f"scope={s}, {m}": (keys, dowp_select(model, tok, ref, bands, scope=s, mode=m,
                                                      cache_config=cache_config, **kw)) for s, m in cfg.readings}
        out["readings"] = reselect_ablation(model, tok, items, opts, cfg.batch)
    return out
