"""Tables and figures of the MASS experiments (paper 003, Sec. 4.3-4.4; notebook ``notebooks/04_mass.py``), computed
from the runs' saved results: the naive frontier (Fig. 2), routing JSD points (Fig. 3), gradient-norm traces
(App. C) and the GLUE stand-in summary (Fig. 4).  The elbow rule and the JSD live in :mod:`moelab.stats` (shared).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from moelab.stats import bootstrap_ci, jensen_shannon

__all__ = ["frontier", "routing_jsd", "jsd_points", "plot_fig2", "plot_fig3", "plot_appc", "glue_summary",
           "plot_glue_standin"]


# ----------------------------------------------------------------------------------------------- analysis
def frontier(df: pd.DataFrame, x: str = "num_experts", y: str = "test_loss") -> pd.DataFrame:
    """Best run (lowest test loss) per expert count: the paper's 'optimal frontier' (MASS Sec. 4.3, Fig. 2; notebook 04)."""
    if df.empty:
        raise ValueError("empty grid table")
    return df.loc[df.groupby(x)[y].idxmin()].sort_values(x).reset_index(drop=True)


def routing_jsd(weights: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Pairwise JSD (base 2, in [0, 1]) between the average routing distributions of groups (MASS Sec. 4.3):
    P_a = mean_{t in a} w_t;  JSD(P_a||P_b) = 1/2 KL(P_a||M) + 1/2 KL(P_b||M),  M = (P_a+P_b)/2.
    weights [N, E] (rows sum to 1), groups [N] ints -> values for every pair of non-empty groups [n_pairs]."""
    weights, groups = np.asarray(weights, float), np.asarray(groups)
    if weights.ndim != 2 or len(weights) != len(groups):
        raise ValueError(f"weights [N, E] and groups [N] must match, got {weights.shape} and {groups.shape}")
    P = [weights[groups == a].mean(0) for a in range(n_groups) if np.any(groups == a)]
    out = []
    for i in range(len(P)):
        for j in range(i + 1, len(P)):
            out.append(jensen_shannon(np.stack([P[i], P[j]])))          # moelab.stats (issue 18, item 7)
    return np.asarray(out)


def jsd_points(routing: np.ndarray, states: np.ndarray, n_entities: int, n_properties: int,
               n_chunks: int = 8) -> pd.DataFrame:
    """Mean pairwise routing JSD over entities and over properties (MASS Fig. 3), per chunk of test documents.
    routing [n_docs*S, E] (input-token order), states [n_docs, S+1] hidden states -> DataFrame(chunk, entity_jsd,
    property_jsd)."""
    st = np.asarray(states)[:, :-1]
    n_docs, S = st.shape
    w = np.asarray(routing).reshape(n_docs, S, -1)
    rows = []
    for c, docs in enumerate(np.array_split(np.arange(n_docs), n_chunks)):
        ww, ss = w[docs].reshape(-1, w.shape[-1]), st[docs].reshape(-1)
        rows.append(dict(chunk=c, entity_jsd=routing_jsd(ww, ss // n_properties, n_entities).mean(),
                         property_jsd=routing_jsd(ww, ss % n_properties, n_properties).mean()))
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------- figures
def plot_fig2(grid: pd.DataFrame, front: pd.DataFrame, elbow: float, mass: pd.DataFrame, sweep: pd.DataFrame,
              fixed_experts: int, bayes_floor: float):
    """Fig. 2: left test loss vs #experts (naive runs, frontier, elbow, MASS runs); right test loss vs top-k at a
    fixed pool (naive) with MASS at its mean active experts."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for k, sub in grid.groupby("top_k"):
        a.scatter(sub.num_experts, sub.test_loss, s=12, alpha=0.5, label=f"naive top-{k}")
    a.plot(front.num_experts, front.test_loss, "k-", lw=1.5, label="frontier (best per count)")
    a.axvline(elbow, color="gray", ls="--", label=f"elbow = {elbow:g}")
    a.scatter(mass.final_experts, mass.test_loss, marker="*", s=150, c="purple", label="MASS runs", zorder=5)
    a.set(xlabel="# experts", ylabel="test loss (nats/token)", title="Fig 2 left")
    a.legend(fontsize=7)
    m = sweep.groupby("top_k").test_loss.agg(["mean", "std"]).reset_index()
    b.errorbar(m.top_k, m["mean"], yerr=m["std"], fmt="o-", color="gray", label=f"naive, E={fixed_experts}")
    b.errorbar([mass.mean_active.mean()], [mass.test_loss.mean()], xerr=[mass.mean_active.std()],
               yerr=[mass.test_loss.std()], fmt="*", ms=14, color="purple", label="MASS (top-p), mean active")
    for ax in (a, b):
        ax.axhline(bayes_floor, color="green", ls=":", lw=1, label="Bayes-optimal")
    b.set(xlabel="top-k (active experts per token)", ylabel="test loss", title="Fig 2 right")
    b.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_fig3(points: pd.DataFrame):
    """Fig. 3: contours of (entity JSD, property JSD) points of MASS vs naive runs (points: method, entity_jsd,
    property_jsd)."""
    fig, ax = plt.subplots(figsize=(5, 4.5))
    colors = {"MASS": "purple", "naive": "gray"}
    for meth, sub in points.groupby("method"):
        if len(sub) > 3 and sub[["entity_jsd", "property_jsd"]].std().min() > 0:
            sns.kdeplot(data=sub, x="entity_jsd", y="property_jsd", ax=ax, color=colors.get(meth), levels=5, fill=False)
        ax.scatter(sub.entity_jsd, sub.property_jsd, s=8, color=colors.get(meth), alpha=0.6, label=meth)
    ax.set(xlabel="entity-level JSD of mean routing", ylabel="property-level JSD", title="Fig 3")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_appc(trace: pd.DataFrame, events: pd.DataFrame, max_panels: int = 4, span: int = 30):
    """App. C: gradient-norm traces of experts around expansion events, detected change points marked."""
    ev = events[events.kind == "expand"].head(max_panels)
    n = max(1, len(ev))
    fig, axes = plt.subplots(1, n, figsize=(4 * n, 3.2), squeeze=False)
    if ev.empty:
        axes[0, 0].text(0.5, 0.5, "no expansion event", ha="center")
    for ax, (_, e) in zip(axes[0], ev.iterrows()):
        tr = trace[(trace.model == e.model) & (trace.step.between(e.step - span, e.step + span))]
        for ex_id, sub in tr.groupby("expert"):
            if ex_id in (e.expert, e.new):
                ax.plot(sub.step, sub.grad_norm, label=f"expert {ex_id}" + (" (new)" if ex_id == e.new else ""))
        fires = events[(events.model == e.model) & (events.kind == "fire") & (events.expert == e.expert)
                       & events.step.between(e.step - span, e.step + span)]
        src = tr[tr.expert == e.expert].set_index("step").grad_norm
        ax.scatter(fires.step, src.reindex(fires.step).to_numpy(), color="red", zorder=5, label="change point (p<0.01)")
        ax.axvline(e.step, color="purple", ls="--", lw=1)
        ax.set(title=f"run {e.model}: expert {e.expert} -> {e.new} @ {e.step}", xlabel="step", ylabel="||grad W1||_F")
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def glue_summary(runs: pd.DataFrame, items: pd.DataFrame, n_boot: int = 2000) -> pd.DataFrame:
    """Per task and method: accuracy (mean over seeds) with a 95% bootstrap interval over test items of the
    seed-averaged correctness, chance, final pool and active experts per token (mean and sd over seeds)."""
    if runs.empty or items.empty:
        raise ValueError("empty runs or items table")
    out = []
    for (t, m), sub in items.groupby(["task", "method"], sort=False):
        per_item = sub.pivot(index="item", columns="seed", values="correct").mean(1).to_numpy()
        est, lo, hi = bootstrap_ci(per_item, n_boot=n_boot)
        r = runs[(runs.task == t) & (runs.method == m)]
        out.append(dict(task=t, method=m, acc=est, ci_low=lo, ci_high=hi, chance=r.chance.iloc[0], seeds=len(r),
                        final_pool=r.final_pool.mean(), final_pool_sd=r.final_pool.std(ddof=0),
                        mean_active=r.mean_active.mean(), mean_active_sd=r.mean_active.std(ddof=0)))
    return pd.DataFrame(out)


def plot_glue_standin(summary: pd.DataFrame):
    """Fig. 4 stand-in: left accuracy per task and method with 95% intervals and the chance level; right final pool
    size (bars) and mean active experts per token (dots) per task and method."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    tasks, methods = list(dict.fromkeys(summary.task)), list(dict.fromkeys(summary.method))
    w = 0.8 / len(methods)
    for j, m in enumerate(methods):
        s = summary[summary.method == m].set_index("task").reindex(tasks)
        x = np.arange(len(tasks)) + (j - (len(methods) - 1) / 2) * w
        a.bar(x, s.acc, w, yerr=[s.acc - s.ci_low, s.ci_high - s.acc], capsize=3, label=m)
        b.bar(x, s.final_pool, w, alpha=0.5, label=f"{m}: pool")
        b.scatter(x, s.mean_active, color="k", marker="o", s=14, zorder=5)
    for i, t in enumerate(tasks):
        ch = summary[summary.task == t].chance.iloc[0]
        a.hlines(ch, i - 0.45, i + 0.45, colors="red", linestyles=":", label="chance" if i == 0 else None)
    for ax in (a, b):
        ax.set_xticks(range(len(tasks)), tasks)
    a.set(ylabel="test accuracy", title="accuracy (95% bootstrap interval over items)")
    b.set(ylabel="experts", title="final pool (bars), active experts per token (dots)")
    a.legend(fontsize=7)
    b.legend(fontsize=7)
    fig.tight_layout()
    return fig
