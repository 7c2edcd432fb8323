"""Free-MoE's tables and summaries (paper 004, Table 1, Tables 2-10, Fig. 5; notebook ``notebooks/05_free_moe.py``),
computed from the per-item tables the experiment saves: the appendix sweep layout, Table 1's improvement layout,
reference vs test gains, the 4-bit grid diagnostics, and issue 22's honesty tables: realised purification share per
configuration (:func:`share_table`), the paper's test-selected DOWP row beside the held-out protocol
(:func:`count_weighted_max`, :func:`table1_selection`), which items flip (:func:`flip_table`, :func:`flip_summary`),
and accuracy beside likelihood with paired intervals and MDEs (:func:`domain_summary`, :func:`side_by_side`)."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from moelab.free_moe.experiment import DowpResult
from moelab.free_moe.method import band_label, purified_share, target_linears
from moelab.claims import with_range_pseudo_pairs
from moelab.stats import minimum_detectable_effect, paired_t_interval, t_interval
from moelab.suite.baselines import (HEURISTICS, N_FOLDS, best_position, chance, heuristic_correct, option_similarity,
                                    question_blind_cv)

__all__ = ["sweep_table", "quantisation_grid_stats", "improvement_table", "reference_gains", "pd_frame",
           "share_table", "count_weighted_max", "table1_selection", "FLIPS", "flip_table", "flip_summary",
           "METRIC_SCALE", "METRIC_RANGE", "METRIC_UNIT", "metric_of_task", "domain_summary", "side_by_side", "cross_domain_summary",
           "baseline_table"]

def sweep_table(sweep: pd.DataFrame, scale: float = 100.0) -> pd.DataFrame:
    """Appendix Tables 6-10 layout: cluster, samples, one column per band (mean score x scale), max, share (%)."""
    t = sweep.groupby(["cluster", "band"], sort=False).score.mean().unstack("band") * scale
    cols = [c for c in sweep.band.drop_duplicates().tolist()]
    t = t[cols]
    samples = sweep[sweep.band == cols[0]].groupby("cluster", sort=False).size()
    band_cols = [c for c in cols if c != "base"]
    t.insert(0, "samples", samples.reindex(t.index).values)
    t["max"] = t[band_cols].max(axis=1)
    t["best_band"] = t[band_cols].idxmax(axis=1)
    t["share"] = 100.0 * t["samples"] / t["samples"].sum()
    return t.reset_index()


def quantisation_grid_stats(model: nn.Module, block: int = 32, sublayers: str = "both",
                            max_blocks: int | None = 512) -> pd.DataFrame:
    """How the 4-bit GGUF origin shows in the dequantised weights: per target matrix, the mean number of distinct
    values per block of ``block`` consecutive weights (Q4 blocks hold at most 16), the share of exact zeros, and the
    share of weights whose |w| is below half the block's grid step (these all rank as "small" only up to the grid).
    ``max_blocks``: statistics on the first that many blocks of each matrix (None = all)."""
    rows = []
    for name, lin in target_linears(model, sublayers).items():
        w = lin.weight.detach().float().reshape(-1, block)[:max_blocks]              # [blocks, 32]
        s = torch.sort(w, dim=1).values
        distinct = 1 + (s[:, 1:] != s[:, :-1]).sum(1).float()                        # distinct values per block
        d = (s[:, 1:] - s[:, :-1])
        step = torch.where(d > 0, d, torch.full_like(d, float("inf"))).min(1).values  # smallest grid step per block
        small = (w.abs() < step[:, None] / 2).float().mean()
        rows.append(dict(matrix=name, distinct_per_block=float(distinct.mean()), max_distinct=int(distinct.max()),
                         zero_share=float((w == 0).float().mean()), below_half_step=float(small)))
    return pd.DataFrame(rows)


def improvement_table(scores: pd.DataFrame, methods: Sequence[str], base: str = "BASELINE",
                      scale: dict | None = None) -> pd.DataFrame:
    """Table 1 layout from per-item scores (columns model, method, task, item, score): per model the rows
    BASELINE, then each method and its improvement over BASELINE (mean x scale[task], default 100)."""
    scale = scale or {}
    m = scores.groupby(["model", "method", "task"], sort=False).score.mean().unstack("task")
    for t in m.columns:
        m[t] = m[t] * scale.get(t, 100.0)
    rows = []
    for model in scores.model.drop_duplicates():
        b = m.loc[(model, base)]
        rows.append(dict(model=model, row=base, **b.to_dict()))
        for meth in methods:
            v = m.loc[(model, meth)]
            rows.append(dict(model=model, row=meth, **v.to_dict()))
            rows.append(dict(model=model, row="Improvement", **(v - b).to_dict()))
    return pd.DataFrame(rows)


def reference_gains(dowp: DowpResult) -> pd.DataFrame:
    """Per reference item: score of the dense model and of the selected band θ* (chosen on these same items, hence
    optimistic). Columns domain, cluster, item, metric ("acc" | "loglik"), base, selected."""
    sw = dowp.sweep
    rows = []
    for sub, band in dowp.selected.items():
        s = sw[sw.cluster == sub]
        b = s[s.band == "base"].set_index("item").score
        v = s[s.band == band_label(band)].set_index("item").score
        met = s[s.band == "base"].set_index("item").metric
        rows.append(pd_frame(domain=s.domain.iloc[0], cluster=sub, item=b.index.values, metric=met.values,
                             base=b.values, selected=v.reindex(b.index).values))
    return pd.concat(rows, ignore_index=True)


def pd_frame(**cols):
    return pd.DataFrame(cols)



# ----------------------------------------------------------------------------------------------------------------
# issue 22 item 3: realised purification share per configuration
# ----------------------------------------------------------------------------------------------------------------
def share_table(masks: dict) -> pd.DataFrame:
    """Realised share of weights purified per configuration (``masks[label] = PurificationMask``): nominal share
    (the band's width for ``mode="remove"``, 100 minus it for ``"keep"``), realised share over all matrices, the
    smallest and largest per-matrix share, and the largest per-matrix deviation from nominal in patches. Under
    ``counts="exact"`` that deviation stays below one patch at every patch size, so 16x16 and 1x1 purify the same
    share (issue 22 item 3); under ``counts="floor"`` (Wanda's rule) it does not."""
    rows = []
    for label, mask in masks.items():
        per = purified_share(mask)
        lo, hi = mask.band
        nominal = (hi - lo) if mask.meta.get("mode", "remove") == "remove" else 100.0 - (hi - lo)
        dev = (per.purified - per.weights * nominal / 100.0).abs() / mask.patch ** 2          # in patches
        rows.append(dict(config=label, patch=mask.patch, scope=mask.meta.get("scope"), mode=mask.meta.get("mode"),
                         counts=mask.meta.get("counts"), band=band_label(mask.band), nominal_pct=nominal,
                         realised_pct=100.0 * per.purified.sum() / per.weights.sum(),
                         matrix_min_pct=100.0 * per.share.min(), matrix_max_pct=100.0 * per.share.max(),
                         max_dev_patches=float(dev.max())))
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------------------------
# issue 22 item 5: the paper's Table 1 DOWP row (test-selected) beside the held-out protocol
# ----------------------------------------------------------------------------------------------------------------
def count_weighted_max(table: pd.DataFrame, band_cols: Sequence[str] | None = None,
                       samples: str = "samples") -> float:
    """The paper's DOWP row from its appendix layout (Tables 6-10): Σ_c n_c · max_θ s_cθ / Σ_c n_c, the per-cluster
    best band's score weighted by the cluster's test count. ``band_cols``: the band columns (default: every column
    whose name ends in "%"). Reproduces Table 1's DOWP cells from Tables 6-10 (e.g. MMLU 47.79)."""
    cols = list(band_cols) if band_cols is not None else [c for c in table.columns if str(c).endswith("%")]
    if not cols:
        raise ValueError(f"count_weighted_max: no band columns among {list(table.columns)}; pass band_cols")
    n = table[samples].to_numpy(float)
    if (n < 0).any() or n.sum() <= 0:
        raise ValueError(f"count_weighted_max: sample counts must be >= 0 with a positive total, got {n.tolist()}")
    return float((n * table[cols].max(axis=1).to_numpy(float)).sum() / n.sum())


def table1_selection(test_sweep: pd.DataFrame, selected: dict, scale: float = 100.0) -> pd.DataFrame:
    """Two protocols for Table 1's DOWP row from one per-item table of test scores under every band
    (``test_sweep``: columns cluster, band, item, score, optional domain; band "base" = dense model, as
    ``experiment.band_sweep`` returns it on test items):

    - ``reference-selected, test-reported`` (ours): each cluster's θ* was chosen on reference items (``selected``:
      cluster -> band tuple or label); the score is the mean over all test items of the score under their cluster's
      θ* (= Σ_c n_c · s_c,θ* / Σ_c n_c);
    - ``test-selected (optimistic)`` (the paper's, issue 22): each cluster's band is the one with the best mean score
      on these same test items (ties -> the band listed first), then count-weighted: :func:`count_weighted_max` of
      :func:`sweep_table`. Selection on the reported items, so biased upwards.

    Plus ``BASELINE`` (band "base") when present. One row per domain ("all" without a domain column) and protocol:
    domain, protocol, score (x scale), n_items, n_clusters, bands ("cluster:band, ...")."""
    need = {"cluster", "band", "item", "score"}
    if not need <= set(test_sweep.columns):
        raise ValueError(f"table1_selection: test_sweep needs columns {sorted(need)}, has {list(test_sweep.columns)}")
    sw = test_sweep if "domain" in test_sweep.columns else test_sweep.assign(domain="all")
    rows = []
    for dom, d in sw.groupby("domain", sort=False):
        clusters = d.cluster.drop_duplicates().tolist()
        missing = [c for c in clusters if c not in selected]
        if missing:
            raise ValueError(f"table1_selection: no reference-selected band for clusters {missing}; pass selected")
        n_items = int(d[["cluster", "item"]].drop_duplicates().shape[0])
        if (d.band == "base").any():
            rows.append(dict(domain=dom, protocol="BASELINE", score=scale * d[d.band == "base"].score.mean(),
                             n_items=n_items, n_clusters=len(clusters), bands="base"))
        ref_parts, ref_bands = [], []
        for c in clusters:
            lab = selected[c] if isinstance(selected[c], str) else band_label(selected[c])
            s = d[(d.cluster == c) & (d.band == lab)].score
            if s.empty:
                raise ValueError(f"table1_selection: cluster {c!r} has no test scores under its selected band {lab}")
            ref_parts.append(s.to_numpy(float))
            ref_bands.append(f"{c}:{lab}")
        rows.append(dict(domain=dom, protocol="reference-selected, test-reported",
                         score=scale * float(np.concatenate(ref_parts).mean()), n_items=n_items,
                         n_clusters=len(clusters), bands=", ".join(ref_bands)))
        t = sweep_table(d[d.band != "base"], scale=scale)
        rows.append(dict(domain=dom, protocol="test-selected (optimistic)",
                         score=count_weighted_max(t, [c for c in t.columns if c not in
                                                      ("cluster", "samples", "max", "best_band", "share")]),
                         n_items=n_items, n_clusters=len(clusters),
                         bands=", ".join(f"{r.cluster}:{r.best_band}" for r in t.itertuples())))
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------------------------
# issue 22 item 4: which accuracy items flip between BASELINE and DOWP, and what their options look like
# ----------------------------------------------------------------------------------------------------------------
FLIPS = ("up", "down", "both right", "both wrong")


def flip_table(items: Sequence[dict], base, dowp, base_pick=None, dowp_pick=None,
               n_folds: int | None = None) -> pd.DataFrame:
    """Per multiple-choice item (``dict(id, task, choices, label | gold)``, e.g. ``data.load_domains`` test items):
    BASELINE and DOWP correctness (0/1), the flip (``up``: wrong -> right, ``down``: right -> wrong, ``both right``,
    ``both wrong``), the gold position and option count, option features (the option most similar to the others
    by ``suite.baselines.option_similarity``; whether the gold is that option, the longest, the shortest) and every
    question-blind heuristic's per-item correctness (``suite.baselines.HEURISTICS``), plus the cross-validated
    option-only classifier ``cv_logreg`` when ``n_folds`` is given. ``base_pick`` / ``dowp_pick`` (optional, the
    option each model chose) add ``*_pick`` and whether DOWP's pick is the most-similar option."""
    items = list(items)
    base, dowp = np.asarray(base, float), np.asarray(dowp, float)
    if not (len(items) == len(base) == len(dowp)):
        raise ValueError(f"flip_table: {len(items)} items, {len(base)} BASELINE and {len(dowp)} DOWP scores")
    for name, v in (("BASELINE", base), ("DOWP", dowp)):
        if not np.isin(v, (0.0, 1.0)).all():
            raise ValueError(f"flip_table: {name} scores must be 0/1 accuracy per item (got {sorted(set(v))[:5]})")
    mc = []
    for k, it in enumerate(items):
        if not it.get("choices"):
            raise ValueError(f"flip_table: item {it.get('id', k)!r} has no choices (accuracy items only)")
        gold = it["gold"] if "gold" in it else it.get("label")
        if not isinstance(gold, (int, np.integer)) or not 0 <= gold < len(it["choices"]):
            raise ValueError(f"flip_table: item {it.get('id', k)!r} needs a gold index ('label' or 'gold') within "
                             f"its {len(it['choices'])} choices, got {gold!r}")
        mc.append(dict(id=it.get("id", k), choices=[str(c).strip() for c in it["choices"]], gold=gold))
    flip = np.where(base < dowp, "up", np.where(base > dowp, "down", np.where(base == 1, "both right", "both wrong")))
    df = pd.DataFrame(dict(id=[m["id"] for m in mc], task=[it.get("task") for it in items],
                           n_options=[len(m["choices"]) for m in mc], gold_pos=[m["gold"] for m in mc],
                           base=base, dowp=dowp, flip=flip))
    sims = [option_similarity(m["choices"]) for m in mc]
    lens = [np.array([len(c) for c in m["choices"]]) for m in mc]
    df["most_similar_pos"] = [int(np.argmax(s)) for s in sims]
    df["gold_is_most_similar"] = [bool(np.isclose(s[m["gold"]], s.max())) for s, m in zip(sims, mc)]
    df["gold_is_longest"] = [bool(n[m["gold"]] == n.max()) for n, m in zip(lens, mc)]
    df["gold_is_shortest"] = [bool(n[m["gold"]] == n.min()) for n, m in zip(lens, mc)]
    for h in HEURISTICS:
        df[f"blind_{h}"] = heuristic_correct(mc, h)
    if n_folds is not None:
        df["blind_cv_logreg"] = question_blind_cv(mc, n_folds=n_folds)
    for name, pick in (("base_pick", base_pick), ("dowp_pick", dowp_pick)):
        if pick is not None:
            pick = np.asarray(pick, int)
            if len(pick) != len(items):
                raise ValueError(f"flip_table: {name} has {len(pick)} entries for {len(items)} items")
            df[name] = pick
    if dowp_pick is not None:
        df["dowp_pick_is_most_similar"] = [bool(np.isclose(s[p], s.max())) for s, p in zip(sims, df.dowp_pick)]
    return df


def flip_summary(flips: pd.DataFrame, by: Sequence[str] = ("task", "gold_pos", "gold_is_most_similar")) -> pd.DataFrame:
    """Flips grouped by one feature at a time (``by``): feature, value, n, up, down, net (= up - down, the gain in
    items), BASELINE and DOWP accuracy, and the accuracy of the most-similar-option heuristic in that group."""
    rows = []
    for feat in by:
        if feat not in flips.columns:
            raise ValueError(f"flip_summary: no column {feat!r} in the flip table ({list(flips.columns)})")
        for val, g in flips.groupby(feat, sort=True):
            up, down = int((g.flip == "up").sum()), int((g.flip == "down").sum())
            rows.append(dict(feature=feat, value=val, n=len(g), up=up, down=down, net=up - down,
                             base_acc=float(g.base.mean()), dowp_acc=float(g.dowp.mean()),
                             blind_most_similar_acc=float(g.blind_most_similar.mean())))
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------------------------
# issue 22 item 1: accuracy and answer likelihood side by side, per task and per domain, with paired intervals and MDEs
# ----------------------------------------------------------------------------------------------------------------
METRIC_SCALE = {"acc": 100.0, "pass@1": 100.0, "pass@10": 100.0, "loglik": 1.0}
METRIC_RANGE = {"acc": (0.0, 1.0), "pass@1": (0.0, 1.0), "pass@10": (0.0, 1.0)}   # bounded metrics, before scale
METRIC_UNIT = {"acc": "points", "pass@1": "points", "pass@10": "points", "loglik": "nats/token"}


def metric_of_task(task: str) -> str:
    """The metric a notebook-05 test task reports: ``loglik`` (mean log-likelihood per token of the reference
    answer: ``moelab_nll_*``, ``stdlib_code``), ``pass@k`` (``humaneval_pass@k``), else ``acc``."""
    if task.startswith("moelab_nll") or task == "stdlib_code":
        return "loglik"
    if task.startswith("humaneval_pass@"):
        return task.removeprefix("humaneval_")
    return "acc"


def _pair_row(d: pd.DataFrame, a: str, b: str, scale: float, target: float | None, level: float,
              score_range: tuple | None = None) -> dict:
    """Paired comparison of methods a and b over the rows (items) of ``d`` (columns a, b). For bounded scores
    (``score_range``, already scaled) the interval gets the claims engine's two pseudo-pairs, so a task where no item
    flips reads ``0 [-w, +w]`` here exactly as in the claims file, not a zero-width interval."""
    x, y = scale * d[a].to_numpy(float), scale * d[b].to_numpy(float)
    row = dict(n=len(d), a_mean=float(x.mean()), b_mean=float(y.mean()), diff=float((x - y).mean()))
    if len(d) < 2:
        return dict(row, lo=np.nan, hi=np.nan, se=np.nan, df=np.nan, mde=np.nan, target=target, n_needed=np.nan,
                    powered=False)
    dd = with_range_pseudo_pairs(x - y, score_range)
    iv = t_interval(dd, level)                               # mean(d) ± t_{1-α/2, n-1} · s_d/√n over the (augmented) d
    mde = minimum_detectable_effect(iv.se, iv.df, alpha=1 - level)
    n_needed = np.nan
    if target is not None and iv.se > 0:
        n_needed = float(math.ceil(len(d) * (mde / abs(target)) ** 2))      # MDE ∝ 1/√n at the observed spread
    return dict(row, lo=iv.low, hi=iv.high, se=iv.se, df=iv.df, mde=mde, target=target, n_needed=n_needed,
                powered=bool(target is not None and iv.se > 0 and mde <= abs(target)))   # no spread: cannot size


def _scaled_range(metric: str, scale: dict) -> tuple | None:
    r = METRIC_RANGE.get(metric)
    return None if r is None else (scale[metric] * r[0], scale[metric] * r[1])


def domain_summary(scores: pd.DataFrame, a: str = "DOWP", b: str = "BASELINE", domain_of=None,
                   metric_of: Callable[[str], str] = metric_of_task, scale: dict | None = None,
                   target: dict | None = None, level: float = 0.95) -> pd.DataFrame:
    """Method ``a`` vs ``b`` on the same test items, per task and per domain, one metric at a time (accuracy,
    pass@k and answer log-likelihood are never pooled; issue 22 item 1). ``scores``: per-item table with columns
    method, task, id, score, and ``domain`` (or ``domain_of``: dict or callable task -> domain); a ``metric`` column
    (a long table: a multiple-choice item has an ``acc`` and a ``loglik`` row) replaces ``metric_of``. Items are paired
    by (task, id); items not scored by both methods are dropped. Per row: n, both means and the difference
    (x ``scale[metric]``, default :data:`METRIC_SCALE`: points for accuracy, nats/token for log-likelihood), the
    paired t-interval as in the claims engine (for bounded metrics, :data:`METRIC_RANGE`, with its one pseudo-pair at
    each end of the range: ``moelab.claims.with_range_pseudo_pairs``), its SE and df, the MDE at 80%
    power (``moelab.stats.minimum_detectable_effect``) and, for ``target[metric]`` (e.g. the paper's +2 points),
    the items needed for an MDE of that size (n · (MDE/target)², the observed spread held fixed) and ``powered``
    (MDE <= target; never when every item difference is equal, which leaves no spread to size an effect from).
    Rows: ``level="task"`` per (domain, task), ``level="domain"`` per (domain, metric) over that metric's tasks."""
    need = {"method", "task", "id", "score"}
    if not need <= set(scores.columns):
        raise ValueError(f"domain_summary: scores need columns {sorted(need)}, have {list(scores.columns)}")
    for m in (a, b):
        if m not in set(scores.method):
            raise ValueError(f"domain_summary: method {m!r} not in scores (have {sorted(set(scores.method))})")
    s = scores[scores.method.isin([a, b])].copy()
    if domain_of is not None:
        s["domain"] = s.task.map(domain_of)                  # dict or callable
    if "domain" not in s.columns or s.domain.isna().any():
        raise ValueError("domain_summary: every task needs a domain (a `domain` column or domain_of)")
    if "metric" not in s.columns:                            # a long table (one row per item and metric) has its own
        s["metric"] = s.task.map(metric_of)
    scale = dict(METRIC_SCALE, **(scale or {}))
    target = target or {}
    unknown = set(s.metric) - set(scale)
    if unknown:
        raise ValueError(f"domain_summary: no scale for metrics {sorted(unknown)}; pass scale={{metric: factor}}")
    wide = s.pivot_table(index=["domain", "metric", "task", "id"], columns="method", values="score").dropna()
    wide = wide.reset_index()
    rows = []
    for (dom, met), g in wide.groupby(["domain", "metric"], sort=False):
        for task, gt in g.groupby("task", sort=False):
            rows.append(dict(level="task", domain=dom, task=task, metric=met, unit=METRIC_UNIT.get(met, ""),
                             **_pair_row(gt, a, b, scale[met], target.get(met), level, _scaled_range(met, scale))))
        rows.append(dict(level="domain", domain=dom, task=f"all {met} tasks", metric=met,
                         unit=METRIC_UNIT.get(met, ""), **_pair_row(g, a, b, scale[met], target.get(met), level, _scaled_range(met, scale))))
    out = pd.DataFrame(rows)
    return out.rename(columns={"a_mean": a, "b_mean": b})


def side_by_side(summary: pd.DataFrame, level: str = "domain") -> pd.DataFrame:
    """One row per domain (or per domain and task), each metric's difference, interval and MDE in its own columns
    (``acc_diff``, ``acc_lo``, ``acc_hi``, ``acc_mde``, ``acc_n``, ``loglik_diff``, ...): accuracy and likelihood
    next to each other, never combined."""
    s = summary[summary.level == level]
    keys = ["domain"] if level == "domain" else ["domain", "task"]
    w = s.pivot_table(index=keys, columns="metric", values=["diff", "lo", "hi", "mde", "n"], aggfunc="first")
    w.columns = [f"{m}_{stat}" for stat, m in w.columns]
    metrics = [m for m in METRIC_SCALE if m in set(s.metric)] + sorted(set(s.metric) - set(METRIC_SCALE))
    order = [f"{m}_{st}" for m in metrics for st in ("diff", "lo", "hi", "mde", "n")]
    return w[[c for c in order if c in w.columns]].reset_index()


def cross_domain_summary(scores: pd.DataFrame, a: str = "purified", b: str = "BASELINE",
                         level: float = 0.95) -> pd.DataFrame:
    """What one domain's DSS-Experts do to the other domains (issue 22 item 1, "purification keeps general ability"):
    ``scores`` holds per-item scores with columns mask_domain (whose masks were applied), domain (the item's),
    task, id, metric, method (``a`` = purified, ``b`` = dense) and score. Per mask domain: :func:`domain_summary`
    rows (per task and per item domain, ``target`` = the item domain is the mask's own), plus one ``off-domain``
    row per metric pooling every item of the other domains (the claim's evidence). Paired t-intervals and MDEs as
    in :func:`domain_summary`."""
    need = {"mask_domain", "domain", "task", "id", "metric", "method", "score"}
    if not need <= set(scores.columns):
        raise ValueError(f"cross_domain_summary: scores need columns {sorted(need)}, have {list(scores.columns)}")
    out = []
    for d, g in scores.groupby("mask_domain", sort=False):
        s = domain_summary(g.drop(columns="mask_domain"), a=a, b=b, level=level)
        s.insert(0, "mask_domain", d)
        s["target"] = s.domain == d
        out.append(s)
        off = g[g.domain != d]
        if len(off):
            o = domain_summary(off.drop(columns="mask_domain").assign(domain="off-domain"), a=a, b=b, level=level)
            o = o[o.level == "domain"].assign(level="off-domain")
            o.insert(0, "mask_domain", d)
            o["target"] = False
            out.append(o)
    return pd.concat(out, ignore_index=True)


def _mc_views(items: Sequence[dict]) -> list[dict]:
    """``suite.baselines``' view of multiple-choice items: options stripped of the scoring space, ``gold``."""
    out = []
    for k, it in enumerate(items):
        if not it.get("choices"):
            raise ValueError(f"item {it.get('id', k)!r} has no choices (accuracy items only)")
        gold = it["gold"] if "gold" in it else it.get("label")
        out.append(dict(id=it.get("id", k), task=it.get("task"), choices=[str(c).strip() for c in it["choices"]],
                        gold=gold))
    return out


def baseline_table(items: Sequence[dict], method_acc: dict, compare: str = "DOWP", n_folds: int = N_FOLDS,
                   level: float = 0.95) -> pd.DataFrame:
    """Issue 22 item 4: the position and question-blind baselines beside the models on every accuracy task.
    ``items``: multiple-choice test items (``dict(id, task, choices, label | gold)``); ``method_acc[method]``: the
    per-item 0/1 accuracy of each method on the same items, in order. Per task, one row per scorer: each method
    (kind ``model``), ``chance`` (1/#options), the best fixed position (kind ``position``, chosen on these items:
    optimistic), every question-blind heuristic of ``suite.baselines`` and the cross-validated option-only
    classifier ``cv_logreg`` (kind ``question-blind``; ``min(n_folds, n)`` folds, absent below 2 items). Columns
    task, scorer, kind, n, acc (points) and ``compare``'s paired difference to the row (points) with its t-interval
    (``moelab.stats.paired_t_interval``), NaN below 2 items."""
    mc = _mc_views(items)
    accs = {m: np.asarray(v, float) for m, v in method_acc.items()}
    for m, v in accs.items():
        if len(v) != len(mc):
            raise ValueError(f"baseline_table: method {m!r} has {len(v)} scores for {len(mc)} items")
    if compare not in accs:
        raise ValueError(f"baseline_table: compare={compare!r} is not among the methods {sorted(accs)}")
    rows = []
    tasks = list(dict.fromkeys(it["task"] for it in mc))
    for task in tasks:
        idx = [i for i, it in enumerate(mc) if it["task"] == task]
        its = [mc[i] for i in idx]
        scorers = [(m, "model", v[idx]) for m, v in accs.items()]
        scorers.append(("chance", "chance", chance(its)))
        p, pos = best_position(its)
        scorers.append((f"position {p} (best here)", "position", pos))
        scorers += [(h, "question-blind", heuristic_correct(its, h)) for h in HEURISTICS]
        if len(its) >= 2:
            scorers.append(("cv_logreg", "question-blind", question_blind_cv(its, n_folds=min(n_folds, len(its)))))
        ref = accs[compare][idx]
        for name, kind, v in scorers:
            row = dict(task=task, scorer=name, kind=kind, n=len(idx), acc=100.0 * float(np.mean(v)),
                       compare=compare, diff=100.0 * float(np.mean(ref - v)), lo=np.nan, hi=np.nan)
            if len(idx) >= 2:
                iv = paired_t_interval(100.0 * ref, 100.0 * np.asarray(v, float), level)
                row.update(lo=iv.low, hi=iv.high)
            rows.append(row)
    return pd.DataFrame(rows)
