"""Tables and figures of notebook ``03_cluster_upcycling`` (poster 002, Chu et al.) from the experiment's saved
results (:mod:`moelab.cluster_upcycling.experiment`): retrieval, suite benchmarks, the analysis panels at
initialisation and at the end, router movement, the held-out entropy trajectory, the cluster-aware init diagnostics
(with the special-token handling), and the vision stand-in. The verdicts are in
:mod:`moelab.claims.defs.nb03_cluster_upcycling`.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .analysis import router_agreement

__all__ = [
    "r1_table", "per_item_r1", "benchmark_table", "analysis_table", "router_movement_table", "utilisation_table",
    "entropy_history", "heldout_entropy_table", "init_table", "special_token_ranks_table", "plot_analysis_panels",
    "per_item_scores", "vision_table", "plot_vision",
]


# ---------------------------------------------------------------------------------------------------------------
# Text experiment
# ---------------------------------------------------------------------------------------------------------------
def r1_table(results) -> pd.DataFrame:
    """Per (method, seed): R@1 anchor->positive, positive->anchor and their average, in percent."""
    rows = [{"method": r["method"], "seed": r["seed"], "r1_a2p": 100 * r["r1"]["a2p"].mean(),
             "r1_p2a": 100 * r["r1"]["p2a"].mean(), "r1_avg": 50 * (r["r1"]["a2p"].mean() + r["r1"]["p2a"].mean())}
            for r in results]
    return pd.DataFrame(rows)


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
    entropy and expert-output similarity at init and at the end with their changes (issue 21, items 1-2)."""
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


def utilisation_table(results) -> pd.DataFrame:
    """Final share of top-k assignments per (method, seed, moe layer, expert)."""
    rows = [{"method": r["method"], "seed": r["seed"], "moe_layer": li, "expert": e, "share": float(s)}
            for r in results for li, u in enumerate(r["analysis"].get("utilisation", [])) for e, s in enumerate(u)]
    return pd.DataFrame(rows)


def entropy_history(results) -> pd.DataFrame:
    """Routing entropy of the TRAINING batches (normalised, mean over MoE layers) per training step, per (method,
    seed), with the router's task-loss gradient norm where the trainer logged it (issue 15, item 1). A diagnostic:
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
    (method, seed, step, moe layer): normalised entropy (poster panel 3; issue 21 item 1; saved by notebook 03 as
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
    """Per-expert ranks under each special-token handling (issue 21 item 4; notebook 03): ``logs`` maps a mode
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


def plot_analysis_panels(analysis, entropy, utilisation, methods=None):
    """The poster's four analysis panels from the tidy tables (notebook 03): relative compactness, expert
    similarity (final, mean over layers, one dot per seed; open markers at init), routing entropy over steps (the
    held-out trajectory when ``entropy`` is :func:`heldout_entropy_table`, else the training batches'), final expert
    utilisation."""
    fin, ini = analysis[analysis["when"] == "final"], analysis[analysis["when"] == "init"]
    methods = methods or list(dict.fromkeys(fin["method"]))
    fig, ax = plt.subplots(1, 4, figsize=(17, 3.6))
    for j, col in enumerate(("relative_compactness", "expert_similarity")):
        per = fin.groupby(["method", "seed"], as_index=False)[col].mean()
        per0 = ini.groupby(["method", "seed"], as_index=False)[col].mean()
        for i, m in enumerate(methods):
            v = per[per["method"] == m][col]
            ax[j].scatter([i] * len(v), v, s=18)
            ax[j].scatter([i + 0.2] * len((v0 := per0[per0["method"] == m][col])), v0, s=18, facecolors="none",
                          edgecolors="k", lw=0.6)
            ax[j].bar(i, v.mean(), alpha=0.35)
        ax[j].set_xticks(range(len(methods)), methods, rotation=30, ha="right")
        ax[j].set_title(col.replace("_", " ") + " (end; open: init)")
    heldout = len(entropy) and "moe_layer" in entropy.columns
    if len(entropy):
        for m in methods:
            e = entropy[entropy["method"] == m].groupby("step")["routing_entropy"].mean()
            if len(e):
                ax[2].plot(e.index, e.values, marker="o" if heldout else None, label=m)
        ax[2].legend(fontsize=7)
    ax[2].set(title="routing entropy / log E (" + ("fixed held-out batch)" if heldout else "training batches)"),
              xlabel="step")
    u = utilisation.groupby(["method", "expert"])["share"].mean().unstack("expert")
    u = u.reindex([m for m in methods if m in u.index])
    w = 0.8 / max(1, len(u))
    for i, (m, row) in enumerate(u.iterrows()):
        ax[3].bar(np.arange(len(row)) + i * w, row.values, width=w, label=m)
    ax[3].axhline(1 / max(1, u.shape[1]), color="k", lw=0.8, ls="--")
    ax[3].set(title="expert utilisation (final, mean over layers, seeds)", xlabel="expert")
    ax[3].legend(fontsize=7)
    fig.tight_layout()
    return fig


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
