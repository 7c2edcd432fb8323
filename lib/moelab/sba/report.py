"""Tables and figures of notebook ``02_sba`` from the runs' saved results (SBA paper Figs. 1, 2, 5, Tables I/II).

Every number here is computed from the run dicts / geometry tables that :mod:`moelab.sba.experiment` returns; the
claims read the tables the notebook saves from these functions.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from moelab.core import diagnostics
from moelab.stats import bootstrap_ci

from .experiment import _flattened
from .geometry import fig5_weight_readings, routing_jsd, summarize_geometry
from .method import AGGREGATIONS
from .regime import READINGS, REGIME_TARGETS, RegimeTargets, change_from_init

__all__ = ["scores_long", "training_table", "phase_b_table", "plot_validation", "plt_subplots", "plot_hist",
           "plot_fig5", "specialisation_table", "table_one", "REGIME_ANGLE", "REGIME_ANGLE_SHARE", "regime_check",
           "stage_summaries", "separation_table", "scores_wide", "ablation_table", "specialisation_summary",
           "pretrained_phase_b_table", "phase_b_runs_table", "regime_change", "regime_sentence", "geometry_by_seed",
           "GEOMETRY_CHANGE", "geometry_change", "geometry_sentence", "fig5_by_seed", "fig5_sentence",
           "plot_fig5_readings", "plot_phase_b", "phase_c_table", "phase_c_sentence", "items_long", "table_sentence",
           "setup_sentence", "damage_table", "damage_sentence", "screen_table", "token_geometry", "drop_ablation_table",
           "closing_lines"]

# The paper's regime: trained experts (phase (b) stopped by its validation rule, not by its step budget)
# whose active pairs are mostly more than 40 degrees apart (Fig. 2: "the majority of angular separations exceed 40°").
REGIME_ANGLE = 40.0
REGIME_ANGLE_SHARE = 0.5

_COLORS = {"linear": "tab:blue", "sba": "tab:orange", "sba_normfree": "tab:green", "sba_unit": "tab:red"}


def plt_subplots(*a, **k):
    """``matplotlib.pyplot.subplots`` (kept as a name of this package for the notebook)."""
    return plt.subplots(*a, **k)


def scores_long(runs: dict) -> pd.DataFrame:
    """{(aggregation, seed): run dict with an ``eval`` table} -> one long table with aggregation and seed columns."""
    frames = [r["eval"].assign(aggregation=a, seed=s) for (a, s), r in runs.items() if r.get("eval") is not None]
    if not frames:
        raise ValueError("no evaluation tables in the runs")
    return pd.concat(frames, ignore_index=True)


def _task_col(df):
    for c in ("benchmark", "task", "name", "dataset"):
        if c in df.columns:
            return c
    raise ValueError(f"evaluation table has no benchmark/task column: {list(df.columns)}")


def _with_key(scores: pd.DataFrame) -> pd.DataFrame:
    """Add ``bench`` = benchmark (+ '/metric' when a benchmark reports several metrics)."""
    tc = _task_col(scores)
    if "metric" not in scores.columns:
        return scores.assign(bench=scores[tc].astype(str))
    multi = scores.groupby(tc)["metric"].transform("nunique") > 1
    return scores.assign(bench=np.where(multi, scores[tc].astype(str) + "/" + scores["metric"].astype(str),
                                        scores[tc].astype(str)))


def training_table(runs: dict) -> pd.DataFrame:
    """Per run: steps, first/last train and validation MNRL, flattened?, wall time, router gradient summary."""
    rows = []
    for (agg, seed), r in runs.items():
        h, v = r["history"], r["val"]
        flat, fall = r["flattened"]
        rows.append(dict(aggregation=agg, seed=seed, steps=int(h.step.max()),
                         train_mnrl_first=float(h.mnrl.iloc[0]), train_mnrl_last=float(h.mnrl.iloc[-1]),
                         val_mnrl_first=float(v.val_mnrl.iloc[0]) if len(v) else np.nan,
                         val_mnrl_last=float(v.val_mnrl.iloc[-1]) if len(v) else np.nan,
                         flattened=bool(flat), val_relative_fall=float(fall),
                         train_flattened=bool(_flattened(h.mnrl.to_numpy())[0]),
                         train_relative_fall=float(_flattened(h.mnrl.to_numpy())[1]), wall_s=float(r["wall_s"]),
                         **diagnostics.router_grad_summary(h)))
    return pd.DataFrame(rows)


def phase_b_table(res: dict) -> pd.DataFrame:
    """One row for the phase-(b) run of :func:`moelab.sba.train_until_plateau`: steps, stopped by the rule?, the
    rule's last relative improvement, first/best/last validation MNRL, the rule's text."""
    v = res["val"]
    return pd.DataFrame([dict(steps=res["steps"], checkpoint_step=res["checkpoint_step"], stopped=res["stopped"],
                              improvement=res["improvement"], n_evals=len(v),
                              val_mnrl_first=float(v.val_mnrl.iloc[0]) if len(v) else np.nan,
                              val_mnrl_best=float(v.val_mnrl.min()) if len(v) else np.nan,
                              val_mnrl_last=float(v.val_mnrl.iloc[-1]) if len(v) else np.nan,
                              wall_s=res["wall_s"], rule=res["rule"])])


def pretrained_phase_b_table(name: str) -> pd.DataFrame:
    """The phase-(b) row of the paper profile: the pretrained MoE (``name``) is the trained model the paper's figures
    describe, so no phase (b) runs (``stopped`` True: its training is its authors')."""
    return pd.DataFrame([dict(steps=0, checkpoint_step=0, stopped=True, improvement=np.nan, n_evals=0,
                              val_mnrl_first=np.nan, val_mnrl_best=np.nan, val_mnrl_last=np.nan, wall_s=0.0,
                              rule=f"none: {name} is pretrained (trained by its authors)")])


def plot_validation(runs: dict):
    fig, ax = plt_subplots(1, 1, figsize=(5, 3.2))
    for (agg, seed), r in runs.items():
        v = r["val"]
        if len(v):
            ax.plot(v.step, v.val_mnrl, label=f"{agg} s{seed}", color=_COLORS.get(agg), alpha=0.5 + 0.15 * (seed % 3))
    ax.set_xlabel("step")
    ax.set_ylabel("validation MNRL")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def plot_hist(geo: pd.DataFrame, col: str, xlabel: str, by: str = "model", bins: int = 60):
    """Overlaid normalised histograms of ``col`` per ``by`` group (Figs. 1 and 2)."""
    fig, ax = plt_subplots(1, 1, figsize=(6, 3.4))
    lo, hi = np.nanpercentile(geo[col], [0.5, 99.5])
    edges = np.linspace(lo, hi, bins)
    for name, d in geo.groupby(by, sort=False):
        ax.hist(d[col].clip(lo, hi), bins=edges, density=True, histtype="step", lw=1.4, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("density")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_fig5(geo: pd.DataFrame, reference: str = "r_bar", operators=None):
    """Fig. 5: ``reference`` "r_bar" plots ||y|| / mean(r1, r2), "sum_w_r" plots ||y|| / Σ_i w_i r_i (see
    :func:`moelab.sba.pair_geometry`), per ``model`` of ``geo``. ``operators``: the operators drawn for every model
    (e.g. linear and SBA on the same phase-(b) outputs); None: init models both, fine-tuned ones their own."""
    if reference not in ("r_bar", "sum_w_r"):
        raise ValueError(f"reference={reference!r}; expected 'r_bar' or 'sum_w_r'")
    prefix = "ratio_" if reference == "r_bar" else "radius_ratio_"
    fig, ax = plt_subplots(1, 1, figsize=(6, 3.4))
    edges = np.linspace(0, 1.3, 66)
    for name, d in geo.groupby("model", sort=False):
        ops = list(operators) if operators else (["linear", "sba"] if d.stage.iloc[0] == "init" else (
            [name.split(" ")[0]] if name.split(" ")[0] in AGGREGATIONS else ["linear"]))
        for op in ops:
            ax.hist(d[f"{prefix}{op}"].clip(0, 1.3), bins=edges, density=True, histtype="step", lw=1.3,
                    ls="-" if op == "linear" else "--", label=f"{name}: {op}")
    ax.axvline(1.0, color="k", lw=0.6)
    ax.set_xlabel("||y|| / mean(r1, r2)" if reference == "r_bar" else "||y|| / Σ w_i r_i")
    ax.set_ylabel("density")
    ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def specialisation_summary(measures: dict) -> pd.DataFrame:
    """Routing JSD across subjects (mean over MoE layers) and mean expert similarity of each ``{model: measure dict}``
    (:func:`moelab.sba.measure_embedder`)."""
    return pd.DataFrame([dict(model=name, **_specialisation(r)) for name, r in measures.items()])


def _specialisation(r: dict) -> dict:
    return dict(routing_jsd_bits=float(routing_jsd(r["counts"]).set_index("layer").loc["mean", "jsd_bits"]),
                expert_similarity=float(r["similarity"].expert_similarity.mean()))


def specialisation_table(inits: dict, runs: dict) -> pd.DataFrame:
    """Routing JSD across subjects (mean over MoE layers) and mean expert similarity, at init and after training."""
    rows = [dict(model=name, stage="init", seed=None, **_specialisation(r)) for name, r in inits.items()]
    rows += [dict(model=f"{agg} (fine-tuned)", stage="fine-tuned", seed=seed, **_specialisation(r))
             for (agg, seed), r in runs.items()]
    return pd.DataFrame(rows)


def table_one(scores: pd.DataFrame) -> pd.DataFrame:
    """Table I/II: per aggregation and benchmark, mean over seeds (x100) with a bootstrap 95% CI over seeds, and the
    mean of the per-run intervals the suite reports (bootstrap over items / subsets)."""
    sc = _with_key(scores)
    rows = []
    for (agg, bench), d in sc.groupby(["aggregation", "bench"], sort=False):
        v = d.groupby("seed").score.mean().to_numpy()
        est, lo, hi = bootstrap_ci(v) if len(v) > 1 else (v[0],) * 3
        row = dict(aggregation=agg, benchmark=bench, mean=100 * est, seeds_ci_low=100 * lo, seeds_ci_high=100 * hi,
                   n_seeds=len(v))
        if "ci_low" in d.columns:
            row.update(run_ci_low=100 * d.ci_low.mean(), run_ci_high=100 * d.ci_high.mean())
        rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------------------------------
# phase (b): the regime reached, the benchmarks' power to separate, the drop ablation
# ----------------------------------------------------------------------------------------------------------------------
def regime_check(phase_b: pd.DataFrame, geometry: pd.DataFrame, stage: str = "phase b") -> dict:
    """Whether phase (b) reached the paper's regime (notebook 02_sba and its claims): the run was
    stopped by its validation-plateau rule (``phase_b``: :func:`phase_b_table`, column ``stopped``) and more than
    :data:`REGIME_ANGLE_SHARE` of the active expert pairs of the trained model are more than :data:`REGIME_ANGLE`
    degrees apart (``geometry``: :func:`stage_summaries`, the pooled row of ``stage``).

    Returns dict(reached, plateau, angles, share_angle_above, reasons: what is missing, in words with the measured
    values)."""
    if len(phase_b) != 1:
        raise ValueError(f"phase_b must be the one-row phase (b) table (phase_b_table), got {len(phase_b)} rows")
    col = f"share_angle_above_{REGIME_ANGLE:g}deg"
    g = geometry[(geometry["stage"] == stage) & (geometry["layer"] == "pooled")]
    if len(g) != 1 or col not in g:
        raise ValueError(f"geometry needs one pooled row of stage {stage!r} with column {col!r} "
                         f"(stages found: {sorted(set(geometry['stage']))})")
    r = phase_b.iloc[0]
    share = float(g[col].iloc[0])
    plateau, angles = bool(r["stopped"]), share > REGIME_ANGLE_SHARE
    reasons = []
    if not plateau:
        reasons.append(f"phase (b) stopped at its step budget ({int(r['steps'])} steps), not by its validation "
                       f"plateau rule (last relative improvement {float(r['improvement']):.3f})")
    if not angles:
        reasons.append(f"only {100 * share:.1f}% of the active expert pairs are more than {REGIME_ANGLE:g} degrees "
                       f"apart after phase (b) (the paper: a majority)")
    return dict(reached=plateau and angles, plateau=plateau, angles=angles, share_angle_above=share,
                reasons=reasons)


def stage_summaries(geos: dict, by=("layer",)) -> pd.DataFrame:
    """:func:`moelab.sba.summarize_geometry` of each ``{stage: geometry table}``, stacked with a ``stage`` column
    (notebook 02_sba: the regime table at init and after phase (b); ``by=("domain",)`` gives the per-subject rows the
    geometry claims replicate over)."""
    if not geos:
        raise ValueError("no geometry tables")
    return pd.concat([summarize_geometry(g, by=by).assign(stage=k) for k, g in geos.items()], ignore_index=True)


def separation_table(scores: pd.DataFrame, model: str, baselines=("bag-of-words (tf-idf)", "random")) -> pd.DataFrame:
    """Whether each benchmark separates ``model`` from the baselines: ``scores`` is a long table
    [encoder, benchmark, metric, score, ci_low, ci_high, ...]; per benchmark and metric, ``above_baselines`` = the
    model's interval lies above every baseline's (its ci_low > the largest baseline ci_high), as
    ``moelab.suite.embed.validate``. Returns ``scores`` with ``baseline_ci_high`` and ``above_baselines``."""
    missing = sorted({model, *baselines} - set(scores["encoder"]))
    if missing:
        raise ValueError(f"scores lack the encoder(s) {missing}; found {sorted(set(scores['encoder']))}")
    key = ["benchmark", "metric"]
    hi = scores[scores.encoder.isin(baselines)].groupby(key).ci_high.max().rename("baseline_ci_high")
    out = scores.join(hi, on=key)
    out["above_baselines"] = (out.encoder == model) & (out.ci_low > out.baseline_ci_high)
    return out


def scores_wide(scores: pd.DataFrame, by: str = "model") -> pd.DataFrame:
    """Long benchmark scores -> one row per ``by`` value, one column per benchmark (metric appended when a benchmark
    has several), x100."""
    sc = _with_key(scores)
    return (100 * sc.pivot_table(index=by, columns="bench", values="score", aggfunc="mean", sort=False)).reset_index()


def ablation_table(at_init: dict, trained: dict) -> pd.DataFrame:
    """The drop ablation's init-vs-trained table ("experts half random"): one row per aggregation and stage
    (``at_init``: {aggregation: measure dict} of :func:`moelab.sba.drop_ablation_init`; ``trained``: {(aggregation,
    seed): run dict}) with the benchmark scores (x100), mean expert similarity and the median angle between the
    active pairs."""
    rows = []
    for stage, items in (("init", {(a, None): r for a, r in at_init.items()}), ("trained", trained)):
        for (agg, seed), r in items.items():
            row = dict(aggregation=agg, stage=stage, seed=seed,
                       expert_similarity=float(r["similarity"].expert_similarity.mean()),
                       angle_median_deg=float(r["geo"].angle_deg.median()) if r.get("geo") is not None else np.nan)
            if r.get("eval") is not None:
                w = scores_wide(r["eval"].assign(model=0)).drop(columns="model").iloc[0].to_dict()
                row.update(w)
            rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------------------------------
# notebook 02's tables per phase-(b) seed: the regime reached, the geometry's change from init, Fig. 5's readings,
# phase (c)'s runs and the per-item scores the claims replicate over
# ----------------------------------------------------------------------------------------------------------------------
def phase_b_runs_table(pbs: dict) -> pd.DataFrame:
    """One row per phase-(b) seed: steps, validation MNRL at init / end, wall time."""
    rows = []
    for seed, r in pbs.items():
        if "trajectory" not in r:
            rows.append(dict(seed=seed, steps=0, val_mnrl_init=np.nan, val_mnrl_end=np.nan, wall_s=0.0))
            continue
        t = r["trajectory"]
        rows.append(dict(seed=seed, steps=int(r["steps"]), val_mnrl_init=float(t.val_mnrl.iloc[0]),
                         val_mnrl_end=float(t.val_mnrl.iloc[-1]), wall_s=float(r["wall_s"])))
    return pd.DataFrame(rows)


def regime_change(pbs: dict, targets: RegimeTargets = REGIME_TARGETS) -> pd.DataFrame:
    """Per phase-(b) seed: expert similarity, routing JSD, router top-1 agreement and validation MNRL at init and end,
    their changes and whether the regime targets are met (:func:`moelab.sba.regime.change_from_init`); for the paper
    profile (nomic has no init) no row, with the same columns."""
    frames = [r["readings"] for r in pbs.values() if "readings" in r]
    if not frames:
        return pd.DataFrame(columns=["seed", *(f"{r}_{s}" for r in READINGS for s in ("init", "end", "change")),
                                     "reached", "reasons"])
    return change_from_init(pd.concat(frames, ignore_index=True), targets)


def regime_sentence(change: pd.DataFrame, targets: RegimeTargets = REGIME_TARGETS) -> str:
    """One sentence on the regime reached per seed."""
    if change.empty:
        return "the paper profile measures nomic-embed-text-v2-moe itself: no initialisation to move from"
    per = "; ".join(f"seed {int(r.seed)}: similarity {r.expert_similarity_init:.4f} -> {r.expert_similarity_end:.4f}, "
                    f"JSD {r.routing_jsd_bits_init:.3f} -> {r.routing_jsd_bits_end:.3f} bits, top-1 agreement "
                    f"{r.top1_agreement_end:.3f}" for r in change.itertuples())
    return (f"targets ({targets.text()}) met by {int(change.reached.sum())} of {len(change)} phase-(b) seeds ({per})")


def geometry_by_seed(pbs: dict, by=("layer",)) -> pd.DataFrame:
    """:func:`stage_summaries` of every phase-(b) seed at init and end, with a ``seed`` column."""
    frames = []
    for seed, r in pbs.items():
        geos = {"end": r["after"]["geo"]} if "init" not in r else {"init": r["init"]["geo"], "end": r["after"]["geo"]}
        frames.append(stage_summaries(geos, by=by).assign(seed=seed))
    return pd.concat(frames, ignore_index=True)


GEOMETRY_CHANGE = {"share_norm_ratio_within_10pct": "fig1", f"share_angle_above_{REGIME_ANGLE:g}deg": "fig2",
                   "angle_median_deg": "fig2", "norm_ratio_median": "fig1"}


def geometry_change(geo: pd.DataFrame) -> pd.DataFrame:
    """Figs. 1 and 2 as what phase (b) did: per seed, the pooled level at init and end and the change (end - init) of
    each column of :data:`GEOMETRY_CHANGE` (``geo``: :func:`geometry_by_seed`). Rows: [seed, figure, quantity, init,
    end, change]."""
    g = geo[geo["layer"] == "pooled"] if "layer" in geo.columns else geo[geo["domain"] == "pooled"]
    rows = []
    for seed, d in g.groupby("seed", sort=True):
        st = d.set_index("stage")
        for col, fig in GEOMETRY_CHANGE.items():
            v0 = float(st.loc["init", col]) if "init" in st.index else np.nan
            v1 = float(st.loc["end", col])
            rows.append(dict(seed=seed, figure=fig, quantity=col, init=v0, end=v1, change=v1 - v0))
    return pd.DataFrame(rows)


def geometry_sentence(change: pd.DataFrame) -> str:
    """One sentence: Figs. 1 and 2's shares at init and end, mean over seeds."""
    m = change.groupby("quantity")[["init", "end", "change"]].mean()
    parts = [f"{q.replace('_', ' ')} {m.loc[q, 'init']:.3f} -> {m.loc[q, 'end']:.3f} ({m.loc[q, 'change']:+.3f})"
             for q in ("share_norm_ratio_within_10pct", f"share_angle_above_{REGIME_ANGLE:g}deg")]
    return f"over phase (b), mean over {change.seed.nunique()} seed(s): " + "; ".join(parts)


def fig5_by_seed(pbs: dict) -> pd.DataFrame:
    """:func:`moelab.sba.geometry.fig5_weight_readings` of every phase-(b) seed at init and end (``seed``,
    ``stage`` columns)."""
    frames = []
    for seed, r in pbs.items():
        for stage, m in (("init", r.get("init")), ("end", r["after"])):
            if m is not None:
                frames.append(fig5_weight_readings(m["geo"]).assign(seed=seed, stage=stage))
    return pd.concat(frames, ignore_index=True)


def fig5_sentence(readings: pd.DataFrame) -> str:
    """One sentence: Fig. 5's pooled means at the end of phase (b), both readings, mean over seeds."""
    d = readings[(readings.stage == "end") & (readings.layer == "pooled")]
    m = d.groupby(["reading", "operator"])["mean"].mean()
    return ("||y||/r̄ after phase (b): unnormalised top-2 weights linear {:.3f}, SBA {:.3f} (arithmetic: the kept "
            "mass); renormalised barycentre linear {:.3f} (the angular cancellation), SBA {:.3f} (radius mixing, by "
            "construction)").format(m[("unnormalised top-2", "linear")], m[("unnormalised top-2", "sba")],
                                    m[("renormalised barycentre", "linear")], m[("renormalised barycentre", "sba")])


def plot_fig5_readings(readings: pd.DataFrame):
    """Fig. 5 under both weight readings: pooled mean ||y||/r̄ per operator, stage and seed."""
    d = readings[readings.layer == "pooled"]
    fig, axes = plt_subplots(1, 2, figsize=(8, 3.2), sharey=True)
    for ax, (reading, g) in zip(axes, d.groupby("reading", sort=False)):
        labels = [f"{r.operator}\n{r.stage} s{r.seed}" for r in g.itertuples()]
        ax.bar(range(len(g)), g["mean"], color=[_COLORS.get(o, "grey") for o in g.operator])
        ax.set_xticks(range(len(g)), labels, fontsize=6, rotation=90)
        ax.axhline(1.0, color="k", lw=0.6)
        ax.set_title(reading, fontsize=9)
    axes[0].set_ylabel("mean ||y|| / r̄")
    fig.tight_layout()
    return fig


def plot_phase_b(pbs: dict):
    """Phase (b) per seed: validation MNRL, expert similarity and router top-1 agreement with the init by step."""
    fig, axes = plt_subplots(1, 3, figsize=(10, 3))
    cols = [("val_mnrl", "validation MNRL"), ("expert_similarity", "expert similarity"),
            ("top1_agreement", "top-1 agreement with init")]
    for seed, r in pbs.items():
        if "trajectory" not in r:
            continue
        for ax, (c, label) in zip(axes, cols):
            ax.plot(r["trajectory"].step, r["trajectory"][c], marker="o", label=f"seed {seed}")
            ax.set_xlabel("step")
            ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def phase_c_table(runs: dict) -> pd.DataFrame:
    """One row per phase-(c) run: steps, checkpoint step, stopped by the plateau rule, validation MNRL before
    fine-tuning (``val_mnrl_init``) and at the kept checkpoint (``val_mnrl_best``), its relative fall, whether it
    fell, wall time. Also ``val_mnrl_first`` / ``_last`` (first and last evaluation) for the claims' phase-(c) gate."""
    rows = []
    for (agg, seed), r in runs.items():
        v = r["val"]
        v0 = float(r.get("val_init", v.val_mnrl.iloc[0]))
        best = float(v.val_mnrl.min())
        rows.append(dict(aggregation=agg, seed=seed, steps=int(r["steps"]), checkpoint_step=int(r.get(
            "checkpoint_step", r["steps"])), stopped=bool(r.get("stopped", False)), val_mnrl_init=v0,
            val_mnrl_best=best, val_relative_fall=(v0 - best) / abs(v0), val_fell=best < v0,
            val_mnrl_first=v0, val_mnrl_last=best, wall_s=float(r["wall_s"])))
    return pd.DataFrame(rows)


def phase_c_sentence(tab: pd.DataFrame) -> str:
    """One sentence on phase (c): how many runs' validation loss fell, the median fall, steps."""
    return (f"{int(tab.val_fell.sum())} of {len(tab)} phase-(c) runs lowered their validation MNRL (median relative "
            f"fall {100 * tab.val_relative_fall.median():.1f}%, {int(tab.stopped.sum())} stopped by the plateau rule, "
            f"steps {int(tab.steps.min())}-{int(tab.steps.max())})")


def items_long(runs: dict) -> pd.DataFrame:
    """{(aggregation, seed): run dict with ``items``} -> one per-item table with aggregation and seed columns."""
    frames = [r["items"].assign(aggregation=a, seed=s) for (a, s), r in runs.items() if r.get("items") is not None]
    if not frames:
        raise ValueError("no per-item scores in the runs")
    return pd.concat(frames, ignore_index=True)


def table_sentence(table: pd.DataFrame, agg: str = "sba") -> str:
    """One sentence: ``agg`` minus linear per benchmark, mean over seeds (points x100)."""
    m = table.set_index(["aggregation", "benchmark"])["mean"]
    benches = [b for b in table.benchmark.unique() if (agg, b) in m.index and ("linear", b) in m.index]
    return f"{agg} - linear (points, mean over seeds): " + ", ".join(
        f"{b} {m[(agg, b)] - m[('linear', b)]:+.2f}" for b in benches)


def setup_sentence(s, separation: pd.DataFrame | None) -> str:
    """One sentence on the data (pairs, subjects) and how many benchmark scores separate MiniLM from the baselines."""
    head = (f"{len(s.train_pairs)} training / {len(s.val_pairs)} validation pairs, {len(s.subjects)} subjects x "
            f"{s.cfg.per_subject} prompts")
    if separation is None:
        return head + "; MTEB tasks from local copies"
    mini = separation[separation.encoder == "all-MiniLM-L6-v2"]
    bad = mini[~mini.above_baselines]
    return (head + f"; MiniLM's interval lies above every baseline on {int(mini.above_baselines.sum())} of "
            f"{len(mini)} benchmark scores" + ("" if bad.empty else " (not on " + ", ".join(
                bad.benchmark + "/" + bad.metric) + ")"))


def damage_table(pbs: dict) -> pd.DataFrame:
    """Phase (a) per seed: the init damage rows (dense, raw, compensated) with a ``seed`` column; empty for nomic."""
    frames = [r["damage"].assign(seed=seed) for seed, r in pbs.items() if "damage" in r]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def damage_sentence(damage: pd.DataFrame) -> str:
    """One sentence: cosine to dense MiniLM without and with compensation, and the kept mass (mean over seeds)."""
    if damage.empty:
        return "paper profile: nomic is the trained MoE (no phase a or b)"
    up = damage[damage.model != "dense"].groupby("compensated")[["cos_mean", "kept_mass_mean"]].mean()
    return (f"kept weight mass at init {up.loc[False, 'kept_mass_mean']:.3f} on held-out text; cosine to dense MiniLM "
            f"{up.loc[False, 'cos_mean']:.3f} without compensation, {up.loc[True, 'cos_mean']:.3f} with it (mean over "
            f"{damage.seed.nunique()} seed(s))")


SCREEN = Path(__file__).resolve().parents[3] / "data" / "tuning" / "02_sba" / "tuning_runs.csv"


def screen_table(path=SCREEN) -> pd.DataFrame:
    """The phase-(b) screen of ``scripts/tune_02.py`` (validation split only): per candidate and evaluation, the
    readings against the regime targets. Empty when the screen has not run."""
    p = Path(path)
    if not p.exists():
        return pd.DataFrame(columns=["candidate", "step"])
    d = pd.read_csv(p)
    cols = ["candidate", "lr", "batch_size", "step", "pairs_seen", "val_mnrl", "expert_similarity", "similarity_fall",
            "routing_jsd_bits", "top1_agreement", "reached", "cpu_s"]
    return d[[c for c in cols if c in d.columns]].round(4)


def token_geometry(pbs: dict) -> pd.DataFrame:
    """The per-token geometry of every phase-(b) seed at init and end, ``model`` = "seed s, stage" (Figs. 1, 2)."""
    frames = []
    for seed, r in pbs.items():
        for stage, m in (("init", r.get("init")), ("end", r["after"])):
            if m is not None:
                frames.append(m["geo"][["norm_ratio", "angle_deg"]].assign(model=f"seed {seed}, {stage}"))
    return pd.concat(frames, ignore_index=True)


def drop_ablation_table(res: dict | None) -> pd.DataFrame | None:
    """:func:`ablation_table` of :func:`moelab.sba.experiment.drop_ablation`'s result (None when not run)."""
    return None if res is None else ablation_table(res["init"], res["runs"])


def closing_lines(claims: pd.DataFrame, change: pd.DataFrame) -> str:
    """The closing note: the regime per seed, then every verdict with its interval, MDE and reason."""
    lines = [regime_sentence(change)]
    for r in claims.itertuples():
        ci = "" if pd.isna(r.ci_low) else f" [{r.ci_low:.3g}, {r.ci_high:.3g}]"
        mde = "" if pd.isna(r.mde) else f", MDE {r.mde:.3g}"
        ours = "" if pd.isna(r.ours) else f"{r.ours:+.4g}{ci}{mde}: "
        lines.append(f"{r.id}: {ours}{r.verdict}")
    return "\n".join(lines)
