"""MoCE's tables and figures, from the experiment's saved results (Eo et al. Table 1, Table 3, Table 4, Fig. 2,
Fig. 4, Fig. 5, App. B; notebook ``notebooks/01_moce.py``). The claims are computed from these tables by
``moelab.moce.claims``.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from scipy import stats as sps

from moelab.core import diagnostics
from moelab.moce.method import active_adapter_params
from moelab.stats import bootstrap_ci

__all__ = ["plot_elbow", "plot_projection", "plot_cluster_distribution", "curves_table", "criterion_table",
           "plot_curves", "plot_table1", "k_sweep_labels", "k_sweep_table", "plot_k_sweep", "paired_scores",
           "summarize_scores", "seed_means_table", "cramers_v", "independence_test", "concentration",
           "dependence_table", "domain_counts_table", "domain_counts_sentence", "domain_cluster_counts",
           "knee_sentence", "within_domain_sentence", "fig5_sentence", "training_sentence", "pooled_sentence",
           "ablation_table", "k_sweep_sentence", "aa_sentence", "ABLATION_ROWS"]

Z975, Z80 = 1.959964, 0.841621  # standard normal quantiles for the MDE of the independence test (5% two-sided, 80%)


def plot_elbow(curves, knees: dict):
    """App. B figure: SSE vs k per encoder with the detected knee marked. ``curves``: DataFrame(encoder, k, sse)."""
    encs = list(dict.fromkeys(curves["encoder"]))
    fig, axes = plt.subplots(1, len(encs), figsize=(4.2 * len(encs), 3.4), squeeze=False)
    for ax, enc in zip(axes[0], encs):
        c = curves[curves.encoder == enc]
        ax.plot(c.k, c.sse, "o-", color="C0")
        kn = knees[enc]["k"]
        ax.axvline(kn, color="C3", ls="--", label=f"knee k={kn}")
        ax.set(title=f"{enc}", xlabel="number of clusters k", ylabel="within-cluster SSE")
        ax.legend()
    fig.tight_layout()
    return fig


def plot_projection(points, method_label: str = "t-SNE"):
    """Fig. 2: 2-D projection coloured by cluster (left) and by source domain (right), one row per encoder.

    ``points``: DataFrame(encoder, x, y, cluster, domain).
    """
    encs = list(dict.fromkeys(points["encoder"]))
    fig, axes = plt.subplots(len(encs), 2, figsize=(9, 4 * len(encs)), squeeze=False)
    for row, enc in zip(axes, encs):
        p = points[points.encoder == enc]
        for ax, col in zip(row, ("cluster", "domain")):
            for j, (val, g) in enumerate(p.groupby(col, sort=True)):
                ax.scatter(g.x, g.y, s=6, alpha=0.7, color=f"C{j % 10}", label=str(val))
            ax.set(title=f"{enc}: {method_label} coloured by {col}", xticks=[], yticks=[])
            ax.legend(markerscale=2, fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def plot_cluster_distribution(dist):
    """Fig. 5: stacked bars of cluster shares per evaluation task."""
    piv = dist.pivot(index="task", columns="cluster", values="share")
    fig, ax = plt.subplots(figsize=(1.2 * len(piv) + 2.5, 3.4))
    bottom = np.zeros(len(piv))
    for j in piv.columns:
        ax.bar(piv.index, piv[j].values, bottom=bottom, label=f"cluster {j}", color=f"C{j % 10}")
        bottom += piv[j].values
    ax.set(ylabel="share of prompts", ylim=(0, 1))
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    return fig


def curves_table(results: Sequence):
    """Tidy training/validation curves: variant, seed, step, kind (train_ce | val_loss), value."""
    rows = []
    for r in results:
        for _, row in r.history.iterrows():
            rows.append({"variant": r.spec.name, "seed": r.seed, "step": int(row["step"]), "kind": "train_ce",
                         "value": float(row.get("ce", row["loss"]))})
        for _, row in r.eval_history.iterrows():
            rows.append({"variant": r.spec.name, "seed": r.seed, "step": int(row["step"]), "kind": "val_loss",
                         "value": float(row["val_loss"])})
    return pd.DataFrame(rows)


def criterion_table(results: Sequence, n_layers: int, d_model: int):
    """Per variant and seed: steps trained, the best evaluation (``best_step``, ``val_loss_best``: the checkpoint
    evaluated when ``restored_best``), why training stopped (``stop_reason``: flattened / rising / patience / budget,
    ``converged`` unless budget), the suite's flattened criterion on the whole validation curve, wall time and
    parameter counts (BTX: ``branch_steps`` = the branch stage's steps summed over domains; ``wall_s`` includes
    them)."""
    return pd.DataFrame([{"variant": r.spec.name, "seed": r.seed, "steps": r.steps,
                          "best_step": getattr(r, "best_step", 0),
                          "stop_reason": getattr(r, "stop_reason", "") or "",
                          "converged": bool(getattr(r, "converged", False)),
                          "restored_best": bool(getattr(r, "restored_best", False)),
                          "branch_steps": sum(b["steps"] for b in (getattr(r, "branches", None) or {}).values()),
                          "wall_s": round(r.wall_s, 1),
                          "val_loss_first": float(r.eval_history.val_loss.iloc[0]),
                          "val_loss_best": float(getattr(r, "best_val_loss", r.eval_history.val_loss.min())),
                          "val_loss_last": float(r.eval_history.val_loss.iloc[-1]),
                          "rel_fall_last20pct": r.rel_fall, "flattened": r.flat,
                          "val_trend": getattr(r, "trend", "") or "",
                          **diagnostics.router_grad_summary(r.history),
                          "groups_M": r.spec.num_groups, "experts_per_group_N": r.spec.experts_per_group,
                          "general_experts": r.spec.num_general, "top_k": r.spec.top_k, "adapter_rank": r.spec.rank,
                          **r.params, "active_adapter_params": active_adapter_params(r.spec, d_model, n_layers)}
                         for r in results])


def plot_curves(curves):
    """Validation loss (solid) and smoothed training CE (faint) per variant; one line per seed."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for j, (v, g) in enumerate(curves.groupby("variant", sort=False)):
        for s, gs in g.groupby("seed"):
            tr = gs[gs.kind == "train_ce"]
            va = gs[gs.kind == "val_loss"]
            axes[0].plot(tr.step, tr.value.rolling(5, min_periods=1).mean(), color=f"C{j}", alpha=0.7,
                         label=v if s == g.seed.min() else None)
            axes[1].plot(va.step, va.value, "o-", ms=3, color=f"C{j}", label=v if s == g.seed.min() else None)
    axes[0].set(title="training CE (5-step mean)", xlabel="step", ylabel="nats/token")
    axes[1].set(title="validation loss", xlabel="step", ylabel="nats/token")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_table1(summary, metric_label: str = "score"):
    """Table 1 as a figure: mean with 95% CI per (task, variant). ``summary``: task, variant, mean, ci_low, ci_high."""
    tasks = list(dict.fromkeys(summary.task))
    variants = list(dict.fromkeys(summary.variant))
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.2 * len(tasks) + 1, 3.6), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        s = summary[summary.task == t].set_index("variant").reindex(variants)
        x = np.arange(len(variants))
        ax.errorbar(x, s["mean"], yerr=[s["mean"] - s["ci_low"], s["ci_high"] - s["mean"]], fmt="o", capsize=3)
        ax.set_xticks(x, variants, rotation=45, ha="right")
        ax.set_title(t, fontsize=9)
    axes[0][0].set_ylabel(metric_label)
    fig.tight_layout()
    return fig


def k_sweep_labels(runs: list[dict], N: int) -> dict[int, str]:
    """Fig. 4's runs: ``{k clusters: run label}`` for the MoCE runs that differ only in k (N experts per group,
    top-2): the main ``moce`` run at the elbow and the ``moce_k{k}`` extras (``k_offset``)."""
    out = {}
    for r in runs:
        if r["variant"] == "moce" and r["N"] == N and r["top_k"] == 2 and not r.get("domain"):
            out.setdefault(int(r["k_clusters"]), r["label"])
    return dict(sorted(out.items()))


def k_sweep_table(scores, k_labels: dict[int, str], elbow_k: int, seeds: Sequence[int] | None = None):
    """Fig. 4 as a table: per cluster count k, mean answer bits per byte over the held-out items (seeds averaged per
    item) with a 95% bootstrap CI; ``elbow`` marks the elbow k. Columns: k, label, elbow, n_items, mean, ci_low, ci_high."""
    if elbow_k not in k_labels:
        raise ValueError(f"elbow k={elbow_k} is not among the swept cluster counts {sorted(k_labels)}")
    rows = []
    for k, lab in sorted(k_labels.items()):
        per_item = paired_scores(scores, lab, "nll_", "bpb", seeds).mean(0)   # [items]
        est, lo, hi = bootstrap_ci(per_item, n_boot=1000, seed=0)
        rows.append({"k": k, "label": lab, "elbow": k == elbow_k, "n_items": len(per_item), "mean": est,
                     "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows)


def plot_k_sweep(table):
    """Fig. 4: held-out answer bits per byte vs the number of clusters (= expert groups), elbow k marked."""
    fig, ax = plt.subplots(figsize=(4.6, 3.4))
    ax.errorbar(table.k, table["mean"], yerr=[table["mean"] - table.ci_low, table.ci_high - table["mean"]], fmt="o-",
                capsize=3, color="C0")
    kn = int(table.k[table.elbow].iloc[0])
    ax.axvline(kn, color="C3", ls="--", label=f"elbow k={kn}")
    ax.set(xlabel="number of clusters k (= expert groups)", ylabel="answer bits per byte (lower is better)",
           xticks=list(table.k))
    ax.legend()
    fig.tight_layout()
    return fig


def paired_scores(scores, variant: str, task_prefix: str | None = None, metric: str | None = None,
                  seeds: Sequence[int] | None = None) -> np.ndarray:
    """Per-item scores of one variant as [seeds, items] (items aligned by task and item id), for ``claims.effect``."""
    s = scores[scores.variant == variant]
    if task_prefix is not None:
        s = s[s.task.str.startswith(task_prefix)]
    if metric is not None:
        s = s[s.metric == metric]
    if s.empty:
        raise ValueError(f"no scores for variant {variant!r} (task prefix {task_prefix!r}, metric {metric!r})")
    piv = s.pivot_table(index="seed", columns=["task", "item_id"], values="score", aggfunc="mean")
    if seeds is not None:
        piv = piv.reindex(list(seeds))
    return piv.sort_index(axis=1).to_numpy()


def summarize_scores(scores):
    """Table 1 rows: mean and bootstrap 95% CI per (variant, task, metric), items (and seeds averaged) resampled."""
    rows = []
    for (v, t, m), g in scores.groupby(["variant", "task", "metric"], sort=False):
        per_item = g.groupby("item_id").score.mean().to_numpy()
        est, lo, hi = bootstrap_ci(per_item, n_boot=1000, seed=0)
        rows.append({"variant": v, "task": t, "metric": m, "n_items": len(per_item),
                     "n_seeds": g.seed.nunique(), "mean": est, "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows)


def seed_means_table(scores, metric: str = "bpb", task_prefix: str = "nll_"):
    """Per variant and seed: the mean score over the held-out items of each domain and over all of them (``pooled``),
    items averaged within the seed (the seed is the unit of replication of a trained model).
    Columns: variant, seed, domain (``code``, ``maths``, ``reasoning``, ``pooled``), n_items, mean."""
    s = scores[(scores.metric == metric) & scores.task.astype(str).str.startswith(task_prefix)]
    if s.empty:
        raise ValueError(f"no {metric!r} scores of tasks starting with {task_prefix!r}")
    s = s.assign(domain=s.task.str[len(task_prefix):])
    per = s.groupby(["variant", "seed", "domain"], sort=False).score.agg(["size", "mean"]).reset_index()
    pooled = s.groupby(["variant", "seed"], sort=False).score.agg(["size", "mean"]).reset_index().assign(
        domain="pooled")
    out = pd.concat([per, pooled], ignore_index=True).rename(columns={"size": "n_items"})
    return out[["variant", "seed", "domain", "n_items", "mean"]].sort_values(
        ["variant", "seed", "domain"], kind="stable").reset_index(drop=True)


# ---------------------------------------------------------------------------------------------------------------------
# Dependence between a label (evaluation task, source domain) and the cluster (Fig. 2 / App. C, Fig. 5)
# ---------------------------------------------------------------------------------------------------------------------
def cramers_v(counts: np.ndarray) -> float:
    """Cramér's V of a contingency table, all-zero rows and columns dropped: sqrt(chi2 / (n (min(r, c) - 1)))."""
    c = np.asarray(counts, float)
    c = c[c.sum(1) > 0][:, c.sum(0) > 0]
    n = c.sum()
    if n == 0 or min(c.shape) < 2:
        return 0.0
    expected = np.outer(c.sum(1), c.sum(0)) / n
    chi2 = float(((c - expected) ** 2 / expected).sum())
    return float(np.sqrt(chi2 / (n * (min(c.shape) - 1))))


def independence_test(counts: np.ndarray, n_shuffles: int = 2000, seed: int = 0) -> dict:
    """Row (task or domain) x cluster dependence against a shuffled-label null.

    ``ours`` = Cramér's V minus its mean under shuffled cluster labels (0 = no dependence); the 95% interval is
    ``ours`` ± t_0.975 (df = n_shuffles - 1) x the shuffled-label s.d. (test inversion under a shift of the null;
    decides ~4% of independent tables, tests/claims/test_calibration.py; a bootstrap of items is biased upward and
    has zero width for a perfectly separated table); ``mde`` = (z_0.975 + z_0.80) x the null's s.d.; ``p`` = (k + 1) /
    (n_shuffles + 1) with k the shuffles whose V reaches the observed V (never 0: the observed labelling is one of the
    labellings). The claims record (``moelab.moce.claims``) and the notebook's table print these same numbers.
    Deterministic for a given ``seed`` so that a rebuild reproduces the file."""
    c = np.asarray(counts, dtype=int)
    if c.ndim != 2 or (c < 0).any():
        raise ValueError(f"counts must be a non-negative 2-D table, got shape {c.shape}; pass rows x columns counts")
    if n_shuffles < 2:
        raise ValueError(f"n_shuffles must be at least 2 (the null's s.d. needs two draws), got {n_shuffles}")
    rows = np.repeat(np.arange(c.shape[0]), c.sum(1))
    cols = np.concatenate([np.repeat(np.arange(c.shape[1]), r) for r in c])
    rng = np.random.default_rng(seed)
    v_obs = cramers_v(c)
    null = np.empty(n_shuffles)
    for i in range(n_shuffles):
        perm = rng.permutation(cols)
        null[i] = cramers_v(np.bincount(rows * c.shape[1] + perm, minlength=c.size).reshape(c.shape))
    mu, sd = float(null.mean()), float(null.std(ddof=1))
    half = float(sps.t.ppf(0.975, n_shuffles - 1)) * sd
    k = int((null >= v_obs - 1e-12).sum())
    return dict(ours=v_obs - mu, ci_low=v_obs - mu - half, ci_high=v_obs - mu + half, mde=(Z975 + Z80) * sd,
                v=v_obs, null_mean=mu, null_sd=sd, p=(k + 1) / (n_shuffles + 1), n_exceed=k, n_shuffles=n_shuffles,
                n=int(c.sum()))


def concentration(counts: pd.DataFrame) -> str:
    """Median share of a row's items in its most frequent column and how many distinct top columns the rows have."""
    share = counts.max(axis=1) / counts.sum(axis=1)
    tops = counts.idxmax(axis=1)
    return (f"median top-cluster share {share.median():.2f}; {tops.nunique()} distinct top clusters for "
            f"{len(tops)} rows ({', '.join(f'{r}->{t}' for r, t in tops.items())})")


def dependence_table(counts: pd.DataFrame, what: str, n_shuffles: int = 2000) -> pd.DataFrame:
    """One row: the :func:`independence_test` of a rows x clusters count table (Cramér's V, its shuffled-label
    mean, V minus that mean with the claims record's interval (± t_0.975 shuffled-label s.d.), MDE, permutation p =
    (k + 1) / (n + 1)) with the concentration beside it (each row's share in its top cluster: median, and the number
    of distinct top clusters)."""
    r = independence_test(counts.to_numpy(), n_shuffles=n_shuffles)
    share = counts.max(axis=1) / counts.sum(axis=1)
    return pd.DataFrame([{"table": what, "rows": len(counts), "clusters": counts.shape[1], "n": r["n"],
                          "cramers_v": r["v"], "null_mean_v": r["null_mean"], "v_minus_null": r["ours"],
                          "ci_low": r["ci_low"], "ci_high": r["ci_high"], "mde": r["mde"], "p_permutation": r["p"],
                          "n_shuffles": r["n_shuffles"],
                          "median_top_share": float(share.median()), "distinct_top_clusters": int(
                              counts.idxmax(axis=1).nunique())}])


# ---------------------------------------------------------------------------------------------------------------------
# The notebook's tables and computed sentences (01 sections 1-7)
# ---------------------------------------------------------------------------------------------------------------------
DOMAINS = ("maths", "code", "reasoning")
# Table 3 / Table 4 rows in the paper's order (those of the run are shown)
ABLATION_ROWS = ("moce", "pesc", "moce_N1", "moce_N2", "moce_top1", "moce_soft", "seq_only", "moce_gen", "dense",
                 "btx", "specialised_maths", "specialised_code", "specialised_reasoning")


def domain_counts_table(pool: pd.DataFrame, used: pd.DataFrame) -> pd.DataFrame:
    """§1: records per domain and split, the pool (``stage`` "pool") and what the run uses ("used"), from two
    ``moelab.suite.instruct.domain_counts`` tables."""
    return pd.concat([pool.assign(stage="pool"), used.assign(stage="used")], ignore_index=True)


def domain_counts_sentence(counts: pd.DataFrame) -> str:
    """§1: the used counts per domain and split, and the smallest domain's share of the largest."""
    used = counts[counts.stage == "used"]
    per = "; ".join(f"{s} " + " / ".join(str(int(g.set_index("domain").n[d])) for d in DOMAINS)
                    for s, g in used.groupby("split", sort=False))
    return (f"Used per domain (maths / code / reasoning): {per}; the smallest domain of each split holds "
            f"{used.ratio_to_max.min():.2f} of the largest.")


def domain_cluster_counts(points: pd.DataFrame, projection: str, moce_encoder: str) -> pd.DataFrame:
    """§1 (Fig. 2, App. C): training instructions per (encoder, source domain, elbow cluster), counted on one
    projection's points, with ``used_by_moce`` marking the encoder MoCE clusters with."""
    pts = points[points.projection == projection]
    dc = pts.groupby(["encoder", "domain", "cluster"]).size().rename("count").reset_index()
    return dc.assign(used_by_moce=dc.encoder == moce_encoder)


def knee_sentence(metrics: pd.DataFrame, items: Sequence[dict]) -> str:
    """§1 (App. B, App. C): each encoder's knee and its purity / NMI against the source domains, beside the purity of
    a single cluster."""
    single = pd.Series([i["domain"] for i in items]).value_counts(normalize=True).max()
    return ("Knees: " + "; ".join(f"**{r.encoder}**: k = {r.k} ({r.knee_method})" for r in metrics.itertuples())
            + ". Against the three source domains: "
            + "; ".join(f"{r.encoder} purity {r.purity:.2f}, NMI {r.nmi:.2f}" for r in metrics.itertuples())
            + f" (a single cluster would have purity {single:.2f}).")


def within_domain_sentence(within: pd.DataFrame, dep: pd.DataFrame, moce_encoder: str) -> str:
    """§1 (App. C): each domain's share in its majority cluster, and the domain x cluster dependence test."""
    return ("Within each domain, the share of its instructions that fall in its majority cluster: "
            + "; ".join(f"{r.encoder}/{r.domain} {r.majority_share:.2f} over {r.clusters_used} clusters"
                        for r in within.itertuples())
            + f". Domain and {moce_encoder} cluster are dependent by Cramér's V {dep.cramers_v.iloc[0]:.2f} against "
            f"{dep.null_mean_v.iloc[0]:.3f} under shuffled labels (permutation p = {dep.p_permutation.iloc[0]:.4f}).")


def fig5_sentence(dep: pd.DataFrame, dist: pd.DataFrame, k: int) -> str:
    """§2 (Fig. 5): the task x cluster dependence with its interval and MDE, and the concentration."""
    top = dist.sort_values("share", ascending=False).groupby("task").head(1)
    d = dep.iloc[0]
    return (f"Task and cluster: Cramér's V **{d.cramers_v:.2f}** against {d.null_mean_v:.3f} under shuffled labels "
            f"(V minus null {d.v_minus_null:+.3f}, 95% interval [{d.ci_low:+.3f}, {d.ci_high:+.3f}], MDE {d.mde:.3f}, "
            f"permutation p = {d.p_permutation:.4f}, {int(d.n)} prompts). Concentration: median share of a task's "
            f"prompts in its top cluster **{d.median_top_share:.2f}** (uniform would be {1 / k:.2f}); "
            f"{int(d.distinct_top_clusters)} distinct top clusters for {int(d.rows)} tasks; most concentrated: "
            f"{top.iloc[0].task} ({top.iloc[0].share:.2f} in cluster {int(top.iloc[0].cluster)}).")


def training_sentence(crit: pd.DataFrame, k: int) -> str:
    """§3: why the runs stopped, the validation loss first -> best per variant, the trainable parameters."""
    stops = crit.stop_reason.value_counts()
    by = crit.groupby("variant", sort=False)
    return (f"M = {k} groups. {int(crit.converged.sum())} of {len(crit)} runs stopped because the validation loss "
            "stopped improving (" + ", ".join(f"{n} {why}" for why, n in stops.items()) + "); the best checkpoint "
            f"was restored in {int(crit.restored_best.sum())}. Validation loss first → best, per variant (mean over "
            "seeds): " + ", ".join(f"{v} {g.val_loss_first.mean():.3f} → {g.val_loss_best.mean():.3f} at step "
                                    f"{g.best_step.mean():.0f} of {g.steps.mean():.0f}" for v, g in by)
            + ". Trainable parameters: " + ", ".join(f"{v} {int(p):,}" for v, p in by.trainable_params.first().items())
            + ".")


def pooled_sentence(per_seed: pd.DataFrame) -> str:
    """§4 (Table 1): pooled bits per byte per variant, mean and s.d. over seeds, and the items per model."""
    pooled = per_seed[per_seed.domain == "pooled"].set_index(["variant", "seed"])["mean"]
    return ("Pooled bits per byte, mean over seeds (s.d. between seeds): "
            + ", ".join(f"{v} {g.mean():.4f} (" + (f"s.d. {g.std(ddof=1):.4f}, {len(g)} seeds" if len(g) > 1
                                                  else "1 seed") + ")"
                        for v, g in pooled.groupby(level=0, sort=False))
            + f"; {int(per_seed.n_items[per_seed.domain == 'pooled'].iloc[0])} held-out items per model.")


def ablation_table(per_seed: pd.DataFrame) -> pd.DataFrame:
    """§5 (Tables 3 and 4): per variant of the run (paper's row order), the per-seed mean bits per byte pooled and on
    code (Table 4's MBPP column): mean, s.d. and number of seeds."""
    rows = [v for v in ABLATION_ROWS if v in set(per_seed.variant)]
    sub = per_seed[per_seed.variant.isin(rows) & per_seed.domain.isin(["pooled", "code"])]
    return sub.pivot_table(index="variant", columns="domain", values="mean",
                           aggfunc=["mean", "std", "size"]).reindex(rows)


def k_sweep_sentence(ksweep: pd.DataFrame | None, k: int) -> str:
    """§5 (Fig. 4): bits per byte at the elbow and at the best k, every k with its interval; or that the sweep is
    not in this run."""
    if ksweep is None:
        return "cluster-count sweep not in this profile"
    best = ksweep.loc[ksweep["mean"].idxmin()]
    return (f"Elbow k = {k}: {ksweep[ksweep.elbow]['mean'].iloc[0]:.4f} bits per byte; lowest at k = {int(best.k)} "
            f"({best['mean']:.4f}); " + ", ".join(f"k={r.k} {r.mean:.4f} [{r.ci_low:.4f}, {r.ci_high:.4f}]"
                                                  for r in ksweep.itertuples())
            + " (items resampled, seeds averaged; the claims use seeds).")


def aa_sentence(claims: pd.DataFrame, claim_id: str = "aa_pesc_seed_noise") -> str:
    """§7: the A/A arm's difference with its interval and MDE (the seed noise every comparison carries)."""
    aa = claims[claims.id == claim_id]
    if not len(aa) or not aa.ci_low.notna().iloc[0]:
        return "A/A (PESC vs PESC on other seeds): not decided in this run (no interval)."
    a = aa.iloc[0]
    return (f"A/A (PESC vs PESC on other seeds): {a.ours:+.4f} bits per byte [{a.ci_low:+.4f}, {a.ci_high:+.4f}], "
            f"MDE {a.mde:.4f}: {a.verdict}.")
