"""Tables and figures of notebook ``03_cluster_upcycling`` (poster 002, Chu et al.) from the experiment's saved
results (:mod:`moelab.cluster_upcycling.experiment`): retrieval, suite benchmarks, the analysis panels at
initialisation and at the end, router movement, the held-out entropy trajectory, the cluster-aware init diagnostics
(with the special-token handling), and the vision stand-in. The verdicts are in
:mod:`moelab.cluster_upcycling.claims`.
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .analysis import router_agreement

__all__ = [
    "r1_table", "per_item_r1", "init_damage_table", "benchmark_table", "analysis_table", "router_movement_table",
    "INIT_PROPERTIES", "init_property", "init_end_table", "utilisation_table", "entropy_history",
    "heldout_entropy_table", "init_table", "special_token_ranks_table", "special_token_summary",
    "plot_r1_init_end", "plot_analysis_panels",
    "plot_router_movement", "tuning_summary", "choose_tuned", "per_item_scores", "vision_table", "plot_vision",
    "tuning_tables", "special_token_sentence", "init_rank_summary", "init_sentence", "runs_sentence",
    "r1_summary", "damage_summary", "damage_sentences", "ANALYSIS_CAPTIONS", "analysis_tables",
    "movement_sentences", "VISION_CAPTIONS", "vision_tables", "vision_sentences",
]


# ---------------------------------------------------------------------------------------------------------------
# Text experiment
# ---------------------------------------------------------------------------------------------------------------
def r1_table(results, when: str = "final") -> pd.DataFrame:
    """Per (method, seed): R@1 anchor->positive, positive->anchor and their average, in percent, at the end of
    training (``when="final"``) or on the initialised model before training (``when="init"``; runs without an
    R@1 at init are left out)."""
    if when not in ("final", "init"):
        raise ValueError(f"when must be 'final' or 'init', got {when!r}")
    key = "r1" if when == "final" else "r1_init"
    rows = [{"method": r["method"], "seed": r["seed"], "r1_a2p": 100 * r[key]["a2p"].mean(),
             "r1_p2a": 100 * r[key]["p2a"].mean(), "r1_avg": 50 * (r[key]["a2p"].mean() + r[key]["p2a"].mean())}
            for r in results if r.get(key) is not None]
    return pd.DataFrame(rows, columns=["method", "seed", "r1_a2p", "r1_p2a", "r1_avg"])


def init_damage_table(r1_init: pd.DataFrame, r1_final: pd.DataFrame, reference: str = "dense") -> pd.DataFrame:
    """Initialisation damage and its repair (notebook 03), from :func:`r1_table` at ``init`` and
    at the end: per (method, seed), R@1 (avg of both directions, points) at init and at the end, and their gaps to
    the untrained ``reference`` model (its seed mean): ``gap_init = R@1_init - R@1_dense``, ``gap_final = R@1_end -
    R@1_dense``, ``repair = gap_final - gap_init``. Sparse upcycling starts with gap 0 (function-preserving); a
    negative ``gap_init`` is damage done by the initialisation, a ``gap_final`` >= 0 means training repaired it."""
    if reference not in set(r1_final["method"]):
        raise ValueError(f"the reference model {reference!r} is not in the R@1 table (methods: "
                         f"{sorted(set(r1_final['method']))}); run it too")
    ref = float(r1_final.loc[r1_final["method"] == reference, "r1_avg"].mean())
    m = r1_init[["method", "seed", "r1_avg"]].merge(r1_final[["method", "seed", "r1_avg"]], on=["method", "seed"],
                                                    suffixes=("_init", "_final"))
    m = m[m["method"] != reference].rename(columns={"r1_avg_init": "r1_init", "r1_avg_final": "r1_final"})
    m["r1_reference"] = ref
    m["gap_init"], m["gap_final"] = m["r1_init"] - ref, m["r1_final"] - ref
    m["repair"] = m["gap_final"] - m["gap_init"]
    return m.reset_index(drop=True)


def per_item_r1(results, method: str) -> np.ndarray:
    """[seeds, items] average of both directions' 0/1 hits, seeds in order (per-item evidence for a claim, e.g.
    ``moelab.claims.Seeds`` averages the items within each seed)."""
    rs = sorted((r for r in results if r["method"] == method), key=lambda r: r["seed"])
    if not rs:
        raise ValueError(f"no results for method {method!r}")
    return np.stack([(r["r1"]["a2p"] + r["r1"]["p2a"]) / 2 for r in rs])


def benchmark_table(results) -> pd.DataFrame:
    """Mean suite benchmark score per (method, seed, benchmark[, metric])."""
    frames = []
    for r in results:
        df = r.get("benchmarks")
        if df is None or len(df) == 0:
            continue
        keys = [c for c in ("benchmark", "task", "name", "metric") if c in df.columns]
        g = df.groupby(keys, as_index=False)["score"].mean() if keys else pd.DataFrame({"score": [df["score"].mean()]})
        g.insert(0, "seed", r["seed"])
        g.insert(0, "method", r["method"])
        frames.append(g)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _balance(u) -> tuple[float, float]:
    u = np.asarray(u)
    nz = u[u > 0]
    return float(-(nz * np.log(nz)).sum() / np.log(len(u))), float(u.max())


def analysis_table(results) -> pd.DataFrame:
    """The analysis panels on the fixed held-out token set per (method, seed, when in {init, final}, moe layer):
    relative compactness (panel 1), expert parameter similarity and expert-output similarity (panel 2), routing
    entropy (3), utilisation balance (normalised entropy of the top-k shares; 1 = perfectly balanced) and max share
    (4), and ``router_agreement`` (top-1 at ``when`` vs top-1 at init: a MOVEMENT measure, 1.0 at init by
    definition). Results cached before these columns existed give NaN."""
    rows = []
    for r in results:
        a0, a1 = r["analysis_init"], r["analysis"]
        for when, a in (("init", a0), ("final", a1)):
            for li in range(len(a.get("relative_compactness", []))):
                bal, mx = _balance(a["utilisation"][li])
                agree = np.nan
                if "top1" in a0 and "top1" in a:
                    agree = router_agreement(a0["top1"][li], a["top1"][li])
                osim = a.get("expert_output_similarity")
                rows.append({"method": r["method"], "seed": r["seed"], "when": when, "moe_layer": li,
                             "relative_compactness": a["relative_compactness"][li],
                             "expert_similarity": a["expert_similarity"][li],
                             "expert_output_similarity": osim[li] if osim else np.nan,
                             "routing_entropy": a["routing_entropy"][li],
                             "utilisation_balance": bal, "max_share": mx, "router_agreement": agree})
    return pd.DataFrame(rows)


def router_movement_table(results) -> pd.DataFrame:
    """How far training moved each MoE layer, per (method, seed, moe layer), on the fixed held-out token set:
    ``top1_agreement`` with the init router (:func:`moelab.cluster_upcycling.analysis.router_agreement`; for
    cluster-aware upcycling the init top-1 is the k-means partition), ``top1_moved`` = 1 - agreement, and the routing
    entropy and expert-output similarity at init and at the end with their changes."""
    rows = []
    for r in results:
        a0, a1 = r["analysis_init"], r["analysis"]
        if "top1" not in a0 or "top1" not in a1:
            continue
        for li in range(len(a0["top1"])):
            agree = router_agreement(a0["top1"][li], a1["top1"][li])
            rows.append({"method": r["method"], "seed": r["seed"], "moe_layer": li, "top1_agreement": agree,
                         "top1_moved": 1 - agree, "entropy_init": a0["routing_entropy"][li],
                         "entropy_final": a1["routing_entropy"][li],
                         "entropy_change": a1["routing_entropy"][li] - a0["routing_entropy"][li],
                         "output_similarity_init": a0["expert_output_similarity"][li],
                         "output_similarity_final": a1["expert_output_similarity"][li],
                         "output_similarity_change": (a1["expert_output_similarity"][li]
                                                      - a0["expert_output_similarity"][li])})
    return pd.DataFrame(rows)


CLUSTER_METHODS = ("cluster", "cluster_eesd")
COPY_METHODS = ("sparse", "sparse_eesd")
# metric -> [(methods, what the initialisation does to it by definition)] ("a metric that the
# initialisation optimises by definition is reported as such"); None = every method
INIT_PROPERTIES = {
    "relative_compactness": [(CLUSTER_METHODS, "optimised by the init: the centroid router's top-1 is the spherical "
                                               "k-means assignment, which minimises within-cluster scatter")],
    "expert_similarity": [(COPY_METHODS, "1 at init by construction (copied experts)")],
    "expert_output_similarity": [(COPY_METHODS, "1 at init by construction (identical experts)")],
    "routing_entropy": [(CLUSTER_METHODS, "set by the init: router rows are the unit k-means centroids")],
    "utilisation_balance": [(CLUSTER_METHODS, "set by the init: the k-means cluster sizes")],
    "router_agreement": [(None, "1 at init by definition: a movement measure only")],
}


def init_property(metric: str, method: str) -> str:
    """What the initialisation fixes of ``metric`` for ``method`` by definition (:data:`INIT_PROPERTIES`), or ""."""
    return "; ".join(text for methods, text in INIT_PROPERTIES.get(metric, []) if methods is None or method in methods)


def init_end_table(analysis: pd.DataFrame, metrics=("relative_compactness", "expert_similarity",
                                                    "expert_output_similarity", "routing_entropy",
                                                    "utilisation_balance", "router_agreement")) -> pd.DataFrame:
    """Every analysis at initialisation and at the end, per (method, metric), from :func:`analysis_table`: the mean
    over seeds of the per-seed mean over MoE layers at ``init`` and ``final``, the change (final - init) with its
    s.d. over seeds, the number of seeds, and ``at_init``: what the initialisation fixes of that metric by
    definition (:func:`init_property`; empty when nothing). Metrics the table lacks are skipped."""
    cols = [m for m in metrics if m in analysis]
    per = analysis.groupby(["method", "seed", "when"])[cols].mean().reset_index()  # mean over MoE layers
    rows = []
    for method in dict.fromkeys(analysis["method"]):
        sub = per[per["method"] == method]
        for metric in cols:
            ini = sub[sub["when"] == "init"].set_index("seed")[metric]
            fin = sub[sub["when"] == "final"].set_index("seed")[metric]
            d = (fin - ini).dropna()
            rows.append({"method": method, "metric": metric, "init": float(ini.mean()), "final": float(fin.mean()),
                         "change": float(d.mean()) if len(d) else np.nan,
                         "change_sd": float(d.std(ddof=1)) if len(d) > 1 else np.nan, "seeds": int(len(d)),
                         "at_init": init_property(metric, method)})
    return pd.DataFrame(rows)


def utilisation_table(results) -> pd.DataFrame:
    """Final share of top-k assignments per (method, seed, moe layer, expert)."""
    rows = [{"method": r["method"], "seed": r["seed"], "moe_layer": li, "expert": e, "share": float(s)}
            for r in results for li, u in enumerate(r["analysis"].get("utilisation", [])) for e, s in enumerate(u)]
    return pd.DataFrame(rows)


def entropy_history(results) -> pd.DataFrame:
    """Routing entropy of the TRAINING batches (normalised, mean over MoE layers) per training step, per (method,
    seed), with the router's task-loss gradient norm where the trainer logged it. A diagnostic:
    each step's batch differs, so its wiggles are batch-to-batch noise; the trajectory is
    :func:`heldout_entropy_table`."""
    frames = []
    for r in results:
        h = r.get("history")
        if h is None or "routing_entropy" not in h:
            continue
        frames.append(pd.DataFrame({"method": r["method"], "seed": r["seed"], "step": h["step"],
                                    "routing_entropy": h["routing_entropy"],
                                    "router_grad_norm": h["router_grad_norm"] if "router_grad_norm" in h else np.nan}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def heldout_entropy_table(results) -> pd.DataFrame:
    """The routing-entropy trajectory on the fixed held-out batch at fixed steps (step 0 = initialisation), per
    (method, seed, step, moe layer): normalised entropy (poster panel 3; saved by notebook 03 as
    ``analysis_entropy_heldout``)."""
    rows = [{"method": r["method"], "seed": r["seed"], **row} for r in results for row in r.get("entropy_heldout") or []]
    return pd.DataFrame(rows, columns=["method", "seed", "step", "moe_layer", "routing_entropy"])


def init_table(results) -> pd.DataFrame:
    """Cluster-aware init diagnostics per (method, seed, moe layer, expert): cluster size, rank r_i, energy kept,
    relative error on its own cluster, jitter, and (when logged) the special-token handling with the special
    calibration tokens in the expert's cluster and routed to it at init."""
    rows = []
    for r in results:
        for rec in r.get("init_log") or []:
            for e, size in enumerate(rec["sizes"]):
                row = {"method": r["method"], "seed": r["seed"], "moe_layer": rec["layer"], "expert": e,
                       "cluster_size": size, "rank": rec["ranks"][e] if rec["ranks"] else None,
                       "energy_kept": rec["energy_kept"][e] if rec["energy_kept"] else None,
                       "rel_err_own_cluster": rec["rel_err"][e] if rec["rel_err"] else None,
                       "jitter": rec["jitter"][e] if rec["jitter"] else None}
                if "special_tokens" in rec:
                    row.update(special_tokens=rec["special_tokens"], special_in_cluster=rec["special_in_cluster"][e],
                               special_routed=rec["special_routed"][e])
                rows.append(row)
    return pd.DataFrame(rows)


def special_token_ranks_table(logs: dict) -> pd.DataFrame:
    """Per-expert ranks under each special-token handling (notebook 03): ``logs`` maps a mode
    (``exclude`` / ``own_expert`` / ``include``) to a cluster-aware init log
    (:func:`moelab.cluster_upcycling.experiment.special_token_logs`). One row per (special_tokens, moe layer,
    expert): cluster size, ``special_in_cluster`` and ``special_share`` (special tokens among the tokens that whiten
    the expert), ``special_routed`` (special calibration tokens the initial centroid router sends to it first), rank
    r_i and energy kept. Under ``include`` a cluster with ``special_share`` near 1 is the [CLS] cluster."""
    rows = []
    for mode, log in logs.items():
        for rec in log:
            for e, size in enumerate(rec["sizes"]):
                sic = rec.get("special_in_cluster", [0] * len(rec["sizes"]))[e]
                rows.append({"special_tokens": mode, "moe_layer": rec["layer"], "expert": e, "cluster_size": size,
                             "special_in_cluster": sic, "special_share": sic / size if size else np.nan,
                             "special_routed": rec.get("special_routed", [np.nan] * len(rec["sizes"]))[e],
                             "rank": rec["ranks"][e] if rec["ranks"] else None,
                             "energy_kept": rec["energy_kept"][e] if rec["energy_kept"] else None})
    return pd.DataFrame(rows)


def special_token_summary(ranks: pd.DataFrame) -> pd.DataFrame:
    """Per (special-token handling, MoE layer), from :func:`special_token_ranks_table`: the expert
    whose cluster holds the largest share of special calibration tokens (``top_special_expert``, its
    ``top_special_share``, cluster size and rank r_i), the median rank of the other experts, and how many special
    calibration tokens the initial router sends to its most popular expert (``special_routed_max``)."""
    rows = []
    for (mode, layer), g in ranks.groupby(["special_tokens", "moe_layer"], sort=False):
        g = g.reset_index(drop=True)
        top = int(g["special_share"].fillna(-1).idxmax())
        rows.append({"special_tokens": mode, "moe_layer": layer, "top_special_expert": int(g.loc[top, "expert"]),
                     "top_special_share": float(g.loc[top, "special_share"]),
                     "top_cluster_size": int(g.loc[top, "cluster_size"]), "top_rank": g.loc[top, "rank"],
                     "median_rank_others": float(g.drop(index=top)["rank"].median()),
                     "special_routed_max": float(g["special_routed"].max())})
    return pd.DataFrame(rows)


def plot_r1_init_end(r1_final: pd.DataFrame, r1_init: pd.DataFrame, methods=None):
    """R@1 per method (notebook 03): bars = mean over seeds at the end, dots = seeds at the end, open markers =
    seeds at initialisation (before training), dashed line = the untrained dense model when it ran."""
    methods = methods or list(dict.fromkeys(r1_final["method"]))
    fig, ax = plt.subplots(figsize=(1.1 * len(methods) + 2.5, 3.4))
    for i, m in enumerate(methods):
        v = r1_final[r1_final["method"] == m]["r1_avg"]
        v0 = r1_init[r1_init["method"] == m]["r1_avg"] if len(r1_init) else pd.Series(dtype=float)
        ax.bar(i, v.mean(), alpha=0.35)
        ax.scatter([i] * len(v), v, s=16)
        ax.scatter([i + 0.2] * len(v0), v0, s=16, facecolors="none", edgecolors="k", lw=0.6)
    if "dense" in set(r1_final["method"]):
        ax.axhline(r1_final.loc[r1_final["method"] == "dense", "r1_avg"].mean(), color="k", lw=0.8, ls="--")
    ax.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
    ax.set_ylabel("R@1, mean of both directions (%)")
    lo = min(r1_final["r1_avg"].min(), r1_init["r1_avg"].min() if len(r1_init) else np.inf)
    ax.set_ylim(max(0, lo - 5), min(100, r1_final["r1_avg"].max() + 3))
    ax.set_title("end of training (open: at init; dashed: dense)", fontsize=9)
    fig.tight_layout()
    return fig


def plot_analysis_panels(analysis, entropy, utilisation, methods=None,
                         cols=("relative_compactness", "expert_similarity", "expert_output_similarity")):
    """The poster's analysis panels from the tidy tables (notebook 03): one panel per metric in ``cols`` (per seed,
    mean over MoE layers: filled dots and bars at the end, open markers at init; columns the table lacks or holds
    only NaN in are skipped), routing entropy over steps (the held-out trajectory when ``entropy`` is
    :func:`heldout_entropy_table`, else the training batches'), final expert utilisation."""
    fin, ini = analysis[analysis["when"] == "final"], analysis[analysis["when"] == "init"]
    methods = methods or list(dict.fromkeys(fin["method"]))
    cols = [c for c in cols if c in analysis and analysis[c].notna().any()]
    fig, ax = plt.subplots(1, len(cols) + 2, figsize=(3.6 * (len(cols) + 2), 3.6))
    for j, col in enumerate(cols):
        per = fin.groupby(["method", "seed"], as_index=False)[col].mean()
        per0 = ini.groupby(["method", "seed"], as_index=False)[col].mean()
        for i, m in enumerate(methods):
            v = per[per["method"] == m][col]
            ax[j].scatter([i] * len(v), v, s=18)
            ax[j].scatter([i + 0.2] * len((v0 := per0[per0["method"] == m][col])), v0, s=18, facecolors="none",
                          edgecolors="k", lw=0.6)
            ax[j].bar(i, v.mean(), alpha=0.35)
        ax[j].set_xticks(range(len(methods)), methods, rotation=30, ha="right")
        ax[j].set_title(col.replace("_", " ") + "\n(end; open: init)", fontsize=9)
    ae, au = ax[len(cols)], ax[len(cols) + 1]
    heldout = len(entropy) and "moe_layer" in entropy.columns
    if len(entropy):
        for m in methods:
            e = entropy[entropy["method"] == m].groupby("step")["routing_entropy"].mean()
            if len(e):
                ae.plot(e.index, e.values, marker="o" if heldout else None, label=m)
        ae.legend(fontsize=7)
    ae.set_xlabel("step")
    ae.set_title("routing entropy / log E\n(" + ("fixed held-out batch)" if heldout else "training batches)"), fontsize=9)
    u = utilisation.groupby(["method", "expert"])["share"].mean().unstack("expert")
    u = u.reindex([m for m in methods if m in u.index])
    w = 0.8 / max(1, len(u))
    for i, (m, row) in enumerate(u.iterrows()):
        au.bar(np.arange(len(row)) + i * w, row.values, width=w, label=m)
    au.axhline(1 / max(1, u.shape[1]), color="k", lw=0.8, ls="--")
    au.set_xlabel("expert")
    au.set_title("expert utilisation\n(end, mean over layers, seeds)", fontsize=9)
    au.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_router_movement(movement, methods=None):
    """How far training moved the routers (notebook 03, from :func:`router_movement_table`): per method, the share
    of held-out tokens whose top-1 expert changed from init to the end, and the change of the held-out routing
    entropy (per seed, mean over MoE layers: dots; bars: mean over seeds)."""
    methods = methods or list(dict.fromkeys(movement["method"]))
    per = movement.groupby(["method", "seed"], as_index=False)[["top1_moved", "entropy_change"]].mean()
    fig, ax = plt.subplots(1, 2, figsize=(8, 3.3))
    for a, col, title in ((ax[0], "top1_moved", "held-out tokens whose top-1 expert moved"),
                          (ax[1], "entropy_change", "routing entropy change (end - init)")):
        for i, m in enumerate(methods):
            v = per[per["method"] == m][col]
            a.bar(i, v.mean(), alpha=0.35)
            a.scatter([i] * len(v), v, s=16)
        a.axhline(0, color="k", lw=0.6)
        a.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
        a.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------------------------
# Choosing the training settings on validation (scripts/tune_03.py)
# ---------------------------------------------------------------------------------------------------------------
TUNING_RUN_COLUMNS = ("candidate", "seed", "lr", "steps", "batch_size", "val_r1")


def tuning_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per candidate of ``scripts/tune_03.py`` (one row per sparse-upcycling run scored on the validation pairs):
    its settings, the number of seeds, the mean and s.d. over seeds of the validation R@1 (``val_r1``, points), and
    the seed means of the other columns present (R@1 at init, router movement, entropy, training loss, CPU s),
    sorted by candidate."""
    missing = [c for c in TUNING_RUN_COLUMNS if c not in runs]
    if missing:
        raise ValueError(f"tuning runs lack the columns {missing}; expected at least {list(TUNING_RUN_COLUMNS)}")
    extra = [c for c in ("val_r1_init", "top1_agreement", "routing_entropy_init", "routing_entropy_final",
                         "expert_output_similarity_final", "train_loss_end", "cpu_s") if c in runs]
    rows = []
    for cand, g in runs.groupby("candidate"):
        first = g.iloc[0]
        row = {"candidate": cand, "lr": float(first["lr"]), "steps": int(first["steps"]),
               "batch_size": int(first["batch_size"]), "seeds": int(g["seed"].nunique()),
               "val_r1_mean": float(g["val_r1"].mean()),
               "val_r1_sd": float(g["val_r1"].std(ddof=1)) if len(g) > 1 else np.nan}
        row.update({f"{c}_mean": float(g[c].mean()) for c in extra})
        rows.append(row)
    return pd.DataFrame(rows)


def choose_tuned(runs: pd.DataFrame) -> dict:
    """The choice of ``scripts/tune_03.py``: the candidate with the highest seed-mean validation
    R@1 of sparse upcycling; equal means go to the cheaper run (fewer steps, then the smaller batch). Returns its
    name, settings (``lr``, ``steps``, ``batch_size``), validation R@1 (mean, s.d., seeds), the runner-up and the
    margin, the pooled seed s.d. over candidates, and the rule."""
    sm = tuning_summary(runs)
    if sm.empty:
        raise ValueError("no tuning runs to choose from: run scripts/tune_03.py --stage screen first")
    sm = sm.sort_values(["val_r1_mean", "steps", "batch_size"], ascending=[False, True, True]).reset_index(drop=True)
    best = sm.iloc[0]
    second = sm.iloc[1] if len(sm) > 1 else None
    var = (runs.groupby("candidate")["val_r1"].var(ddof=1)).dropna()
    return dict(candidate=str(best["candidate"]),
                settings=dict(lr=float(best["lr"]), steps=int(best["steps"]), batch_size=int(best["batch_size"])),
                val_r1_mean=float(best["val_r1_mean"]),
                val_r1_sd=None if np.isnan(best["val_r1_sd"]) else float(best["val_r1_sd"]), seeds=int(best["seeds"]),
                runner_up=None if second is None else str(second["candidate"]),
                margin=None if second is None else float(best["val_r1_mean"] - second["val_r1_mean"]),
                pooled_seed_sd=float(np.sqrt(var.mean())) if len(var) else None,
                rule="highest seed-mean validation R@1 (mean of both directions) of sparse upcycling; ties: fewer "
                     "steps, then smaller batch")


# ---------------------------------------------------------------------------------------------------------------
# Vision stand-in
# ---------------------------------------------------------------------------------------------------------------
def per_item_scores(items, method: str, task: str) -> np.ndarray:
    """[seeds, items] scores of one method on one task from ``vision_experiment(...)["items"]``, seeds in order
    (per-item evidence for a claim, e.g. ``moelab.claims.Seeds`` averages the items within each seed)."""
    sub = items[(items["method"] == method) & (items["task"] == task)]
    if sub.empty:
        raise ValueError(f"no scores for method {method!r} on task {task!r}")
    return sub.pivot(index="seed", columns="item", values="score").sort_index().to_numpy()


def vision_table(accuracy) -> pd.DataFrame:
    """Few-shot-table analogue: mean (std) accuracy in % over seeds, one row per method, one column per task."""
    g = accuracy.groupby(["method", "task"], sort=False)["accuracy"]
    mean, std = g.mean().unstack("task"), g.std().unstack("task")
    order = list(dict.fromkeys(accuracy["method"]))
    cols = list(dict.fromkeys(accuracy["task"]))
    out = mean.reindex(index=order, columns=cols).round(2)
    return out.join(std.reindex(index=order, columns=cols).round(2).add_suffix("_std"))


def plot_vision(accuracy, methods=None):
    """Bars (mean over seeds) and dots (seeds) of accuracy per task and method (notebook 03's vision figure)."""
    tasks = list(dict.fromkeys(accuracy["task"]))
    methods = methods or list(dict.fromkeys(accuracy["method"]))
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.6 * len(tasks), 3.4), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        sub = accuracy[accuracy["task"] == t]
        for i, m in enumerate(methods):
            v = sub[sub["method"] == m]["accuracy"]
            ax.bar(i, v.mean(), alpha=0.35)
            ax.scatter([i] * len(v), v, s=14)
        ax.set_xticks(range(len(methods)), methods, rotation=35, ha="right")
        ax.set_title(t)
        lo, hi = sub["accuracy"].min(), sub["accuracy"].max()
        ax.set_ylim(max(0, lo - 3), min(100, hi + 2))
    axes[0][0].set_ylabel("accuracy (%)")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------------------------
# The notebook's tables and computed sentences (03)
# ---------------------------------------------------------------------------------------------------------------
def _fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)   # one candidate or one seed: no margin, no s.d.


def tuning_tables(path) -> dict:
    """The validation choice of ``scripts/tune_03.py`` read back (``<folder>/tuning_summary.json``): ``candidates``
    (one row per candidate, seed means; empty when absent), ``choice`` (one row, or None) and a sentence naming the
    choice, its margin over the runner-up and the untrained dense model's score on the same pairs. Empty when the
    file does not exist."""
    path = Path(path)
    if not path.exists():
        return {}
    tuning = json.loads(path.read_text())
    ch = tuning.get("choice")
    out = {"candidates": pd.DataFrame(tuning.get("summary", [])), "choice": None, "sentence": ""}
    if ch:
        out["choice"] = pd.DataFrame([{k: v for k, v in ch.items() if k not in ("settings", "provenance")}
                                      | ch["settings"]])
        out["sentence"] = (f"Chosen: {ch['candidate']} (validation R@1 {ch['val_r1_mean']:.2f} over {ch['seeds']} "
                           f"seeds; runner-up {ch['runner_up']} by {_fmt(ch['margin'], '+.2f')} points; pooled seed "
                           f"s.d. {_fmt(ch['pooled_seed_sd'], '.2f')}); the untrained dense model scores "
                           f"{tuning['references']['dense_val_r1']:.2f} on the same pairs.")
    return out


def special_token_sentence(study: dict, handling: str) -> str:
    """Steps 1-3: how many calibration tokens are special, and under ``include`` the most special-token-heavy cluster
    per MoE layer with its rank beside the other experts' median rank."""
    inc = study["summary"][study["summary"]["special_tokens"] == "include"]
    return (f"The calibration set holds {study['n_special']} special tokens among {study['n_tokens']}. Clustered with "
            "the rest ('include'), the most special-token-heavy cluster per MoE layer holds "
            + ", ".join(f"{s:.0%}" for s in inc["top_special_share"]) + " special tokens, with rank "
            + ", ".join(f"{int(r)}" for r in inc["top_rank"]) + " (other experts' median rank "
            + ", ".join(f"{r:.0f}" for r in inc["median_rank_others"]) + f"). This notebook uses '{handling}'.")


def init_rank_summary(init: pd.DataFrame) -> pd.DataFrame:
    """Per MoE layer: the mean, smallest and largest rank r_i, the smallest cluster and the largest relative error
    on an expert's own cluster."""
    return init.groupby("moe_layer").agg(rank_mean=("rank", "mean"), rank_min=("rank", "min"),
                                         rank_max=("rank", "max"), size_min=("cluster_size", "min"),
                                         err_max=("rel_err_own_cluster", "max"))


def init_sentence(init: pd.DataFrame, d_model: int = 384) -> str:
    """The range of the effective ranks and the largest relative error on an expert's own cluster (threshold 1%)."""
    if not len(init):
        return "No cluster-aware initialisation in this run."
    return (f"Effective ranks r_i range from {int(init['rank'].min())} to {int(init['rank'].max())} of {d_model} "
            f"(mean {init['rank'].mean():.0f}); the largest relative error on an expert's own cluster is "
            f"{100 * init['rel_err_own_cluster'].max():.2f}% (threshold 1%).")


def runs_sentence(runs: pd.DataFrame) -> str:
    """How many text runs and their total run time."""
    return (f"{len(runs)} text runs, {runs.get('wall_s', pd.Series(dtype=float)).sum() / 60:.1f} min of run time in "
            "total (runs served from the cache count the time they took when first run).")


def r1_summary(r1: pd.DataFrame, r1_init: pd.DataFrame) -> pd.DataFrame:
    """Mean and s.d. over seeds of R@1 (both ways averaged) per method, at init and at the end."""
    return pd.concat({"init": r1_init.groupby("method", sort=False)["r1_avg"].agg(["mean", "std"]),
                      "end": r1.groupby("method", sort=False)["r1_avg"].agg(["mean", "std"])}, axis=1).round(2)


def damage_summary(damage: pd.DataFrame) -> pd.DataFrame:
    """Seed means per method of the gap to the dense model at init and at the end, and the repair."""
    if not len(damage):
        return pd.DataFrame()
    return damage.groupby("method", sort=False)[["gap_init", "gap_final", "repair"]].mean().round(2)


def damage_sentences(dm: pd.DataFrame) -> str:
    """One line per method: its gap to the dense model at init and at the end, and whether the damage was
    repaired."""
    lines = []
    for m, row in dm.iterrows():
        state = ("not below the dense model at init" if row["gap_init"] >= 0 else
                 "damage at init repaired" if row["gap_final"] >= 0 else "damage at init not repaired")
        lines.append(f"{m}: gap to the dense model {row['gap_init']:+.2f} points at init, {row['gap_final']:+.2f} at "
                     f"the end ({state}, seed means).")
    return "\n".join(lines)


ANALYSIS_CAPTIONS = {
    "panels": "relative compactness, expert parameter and output similarity, routing entropy, utilisation balance, "
              "router agreement with init per method, seed, MoE layer, at init and after training, on the fixed "
              "held-out token set",
    "entropy_steps": "routing entropy of the training batches per step (batch-to-batch noise; the trajectory is "
                     "entropy_heldout)",
    "entropy_heldout": "routing entropy on a fixed held-out batch at fixed steps (step 0 = initialisation)",
    "router_movement": "router movement: top-1 agreement with the init router, entropy and expert-output similarity "
                       "at init and at the end",
    "utilisation": "final expert utilisation",
    "init_vs_end": "every analysis at init and at the end per method (mean over MoE layers and seeds), its change, "
                   "and what the initialisation fixes by definition",
}


def analysis_tables(results, moe_methods) -> dict:
    """The poster's four panels and router movement of every run of ``moe_methods``, keyed by the saved table names
    (:data:`ANALYSIS_CAPTIONS`): panels, entropy_steps, entropy_heldout, router_movement, utilisation, init_vs_end."""
    res = [r for r in results if r["method"] in moe_methods]
    ana = analysis_table(res)
    return {"panels": ana, "entropy_steps": entropy_history(res), "entropy_heldout": heldout_entropy_table(res),
            "router_movement": router_movement_table(res), "utilisation": utilisation_table(res),
            "init_vs_end": init_end_table(ana)}


def movement_sentences(movement: pd.DataFrame, steps: int, lr: float) -> str:
    """Per method: the share of held-out tokens whose top-1 expert moved, the entropy and expert-output similarity
    at init and at the end; and which routers kept more than 95% of their top-1 choices."""
    mv = movement.groupby("method", sort=False)[["top1_moved", "entropy_init", "entropy_final",
                                                 "output_similarity_init", "output_similarity_final"]].mean()
    lines = [f"{m}: {row['top1_moved']:.1%} of held-out tokens changed their top-1 expert; routing entropy "
             f"{row['entropy_init']:.3f} -> {row['entropy_final']:.3f}; expert-output similarity "
             f"{row['output_similarity_init']:.4f} -> {row['output_similarity_final']:.4f} (seed means)."
             for m, row in mv.iterrows()]
    still = [m for m, row in mv.iterrows() if row["top1_moved"] < 0.05]
    if still:
        lines.append(f"The routers of {', '.join(still)} kept the top-1 expert of more than 95% of held-out tokens: "
                     f"with {steps} steps at lr {lr:g} their analyses after training still describe the "
                     "initialisation, and the claims below say so.")
    return "\n".join(lines)


VISION_CAPTIONS = {
    ("table2", "vit_pretraining"): "dense ViT pretrained on Fashion-MNIST",
    ("table2", "vit_fewshot_ft"): "accuracy (%) per method, seed and task: Fashion-MNIST test, CIFAR-10 (grey 28x28) "
                                  "fine-tuning",
    ("table2", "vit_timing"): "wall seconds per phase",
    ("table2", "vit_training"): "continued training per step",
    ("init", "vit_cluster_ranks"): "ViT: cluster sizes and ranks r_i per expert",
}


def vision_tables(vres: dict) -> dict:
    """The vision stand-in's saved tables keyed by (section, name) of :data:`VISION_CAPTIONS`; the training history
    and the ViT's cluster ranks only where the run has them."""
    out = {("table2", "vit_pretraining"): vres["pretrain"], ("table2", "vit_fewshot_ft"): vres["accuracy"],
           ("table2", "vit_timing"): vres["timing"]}
    if len(vres["history"]):
        out[("table2", "vit_training")] = vres["history"]
    vinit = init_table(vres["results"])
    if len(vinit):
        out[("init", "vit_cluster_ranks")] = vinit
    return out


def vision_sentences(pretrain: pd.DataFrame, vtab: pd.DataFrame) -> str:
    """The dense ViT's pretraining and test accuracy, then per task every method's mean ± s.d. over seeds."""
    pre = pretrain.iloc[0]
    lines = [f"The dense ViT saw {int(pre['images_seen'])} Fashion-MNIST images ({pre['epochs']:.2f} epochs) and "
             f"reaches {pre['test_accuracy']:.1f}% test accuracy."]
    lines += [f"{t}: " + ", ".join(f"{m} {vtab.loc[m, t]:.2f} ± {vtab.loc[m, t + '_std']:.2f}%" for m in vtab.index)
              + " (mean ± s.d. over seeds)" for t in vtab.columns if not t.endswith("_std")]
    return "\n".join(lines)
