"""Tables and figures of the MASS experiments (paper 003, Sec. 4.3-4.4; notebook ``notebooks/04_mass.py``), computed
from the runs' saved results: the naive frontier (Fig. 2), routing JSD points (Fig. 3), gradient-norm traces
(App. C) and the GLUE stand-in summary (Fig. 4).  The elbow rule and the JSD live in :mod:`moelab.stats` (shared).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from scipy import stats

from moelab.stats import bootstrap_ci, elbow_max_chord, jensen_shannon

__all__ = ["mass_regime_checks", "cpd_pvalues", "ar1_series", "lag1_autocorr", "cpd_calibration", "MIN_SPREAD_RATIO",
           "MIN_EXPANDED_SHARE", "MIN_ACTIVE", "frontier", "frontier_bands", "frontier_spread", "routing_jsd", "jsd_points", "jsd_table", "pool_trace",
           "max_reachable_pool", "plot_fig2", "plot_fig3", "plot_appc", "plot_expansion_trace", "glue_summary",
           "plot_glue_standin", "regime", "regime_table", "REGIME_MARGIN",
           "frontier_summary", "mass_pool_table", "fig3_points", "reference_lines"]


# ----------------------------------------------------------------------------------------------- analysis
REGIME_MARGIN = 0.1      # nats per target: the best naive model must beat the best n-gram by this (upper 95% bound)
NGRAM_NAMES = ("unigram", "bigram", "trigram", "4-gram")


def regime(grid: pd.DataFrame, refs: pd.DataFrame | None, margin: float = REGIME_MARGIN) -> dict:
    """Is the synthetic stand-in in the paper's regime (notebook 04 section 2)?  The naive configuration with the
    lowest seed-mean target NLL in ``grid`` (num_experts, top_k, seed, test_loss) is compared, seed by seed, with the
    best n-gram of ``refs`` (:func:`moelab.mass.reference_levels`: fitted on the same training draw, add-k chosen on
    validation):  gap_s = NLL_s(best naive) - NLL(best n-gram), nats per target;  the check passes when the upper end
    of the 95% t-interval of the mean gap over seeds is <= -``margin``.  Returns dict(ok (None without ``refs``),
    check, margin, best, best_E, best_k, upper (95% upper bound of the best model's NLL), n_seeds, gap, gap_lo,
    gap_hi, best_ngram, best_ngram_name, trigram, fourgram, within_bayes, bayes, reason)."""
    E, k = grid.groupby(["num_experts", "top_k"]).test_loss.mean().idxmin()
    v = grid[(grid.num_experts == E) & (grid.top_k == k)].sort_values("seed").test_loss.to_numpy(float)
    mean = float(v.mean())
    tq = float(stats.t.ppf(0.975, len(v) - 1)) if len(v) > 1 else np.inf
    half = tq * float(v.std(ddof=1)) / np.sqrt(len(v)) if len(v) > 1 else np.inf
    check = f"best naive minus best n-gram, upper 95% seed bound <= -{margin:g} nats per target"
    out = dict(ok=None, check=check, margin=margin, best=mean, best_E=int(E), best_k=int(k), upper=mean + half,
               n_seeds=len(v), gap=np.nan, gap_lo=np.nan, gap_hi=np.nan, best_ngram=np.nan, best_ngram_name=None,
               trigram=np.nan, fourgram=np.nan, within_bayes=np.nan, bayes=np.nan, reason="no reference levels")
    if refs is None:
        return out
    ng = refs[refs.name.isin(NGRAM_NAMES)]
    best_ng = ng.loc[ng.target_nll.idxmin()]
    level = lambda name: float(refs[refs.name == name].target_nll.min()) if (refs.name == name).any() else np.nan
    gap = v - float(best_ng.target_nll)                                        # [seeds]
    out.update(best_ngram=float(best_ng.target_nll), best_ngram_name=f"{best_ng['name']} ({best_ng.fit_on})",
               trigram=level("trigram"), fourgram=level("4-gram"), within_bayes=level("within-example Bayes"),
               bayes=level("Bayes"), gap=float(gap.mean()), gap_lo=float(gap.mean() - half),
               gap_hi=float(gap.mean() + half))
    out["ok"] = bool(out["gap_hi"] <= -margin)
    out["reason"] = (f"best naive model (E={E}, top-{k}) {mean:.3f} nats per target vs best n-gram "
                     f"{out['best_ngram_name']} {out['best_ngram']:.3f}: gap {out['gap']:+.3f} "
                     f"[{out['gap_lo']:+.3f}, {out['gap_hi']:+.3f}] over {len(v)} seeds "
                     f"({'passes' if out['ok'] else 'fails'}: needs <= -{margin:g}); trigram {out['trigram']:.3f}, "
                     f"4-gram {out['fourgram']:.3f}, within-example Bayes {out['within_bayes']:.3f}, "
                     f"Bayes floor {out['bayes']:.3f}")
    return out


def regime_table(grid: pd.DataFrame, refs: pd.DataFrame, margin: float = REGIME_MARGIN) -> pd.DataFrame:
    """The regime check as one tidy table (notebook 04, ``fig2_regime``): a row per reference level (``row`` =
    "baseline": name, fit_on, k, target_nll), a row per seed of the best naive configuration ("seed": its
    target_nll and gap to the best n-gram) and one "check" row (gap = mean gap, gap_lo/gap_hi = its 95% seed
    interval, passed, margin, reason) -- what the claims' regime gate reads."""
    r = regime(grid, refs, margin)
    base = refs.assign(row="baseline")[["row", "name", "fit_on", "k", "target_nll", "val_target_nll"]
                                       if "val_target_nll" in refs else ["row", "name", "fit_on", "k", "target_nll"]]
    best = grid[(grid.num_experts == r["best_E"]) & (grid.top_k == r["best_k"])].sort_values("seed")
    seeds = pd.DataFrame(dict(row="seed", name=f"naive E={r['best_E']} top-{r['best_k']}", seed=best.seed.to_numpy(),
                              target_nll=best.test_loss.to_numpy(), gap=best.test_loss.to_numpy() - r["best_ngram"]))
    check = pd.DataFrame([dict(row="check", name=r["check"], target_nll=r["best"], gap=r["gap"], gap_lo=r["gap_lo"],
                               gap_hi=r["gap_hi"], passed=r["ok"], margin=margin, n_seeds=r["n_seeds"],
                               best_ngram=r["best_ngram"], best_ngram_name=r["best_ngram_name"],
                               trigram=r["trigram"], fourgram=r["fourgram"], within_bayes=r["within_bayes"],
                               bayes=r["bayes"], best_E=r["best_E"], best_k=r["best_k"], reason=r["reason"])])
    return pd.concat([base, seeds, check], ignore_index=True)


def frontier(df: pd.DataFrame, x: str = "num_experts", y: str = "test_loss") -> pd.DataFrame:
    """Best run (lowest test loss) per expert count: the paper's 'optimal frontier' (MASS Sec. 4.3, Fig. 2; notebook 04)."""
    if df.empty:
        raise ValueError("empty grid table")
    return df.loc[df.groupby(x)[y].idxmin()].sort_values(x).reset_index(drop=True)


def frontier_bands(df: pd.DataFrame, x: str = "num_experts", y: str = "test_loss") -> pd.DataFrame:
    """Seed-level frontier (MASS Sec. 4.3, Fig. 2; notebook 04): per expert count the top-k whose mean ``y`` over
    seeds is lowest, with that mean, its seed s.d. and number of seeds.  Returns DataFrame(num_experts, top_k, mean,
    sd, n) sorted by ``x``: the curve the elbow is read from (the best single run per count, :func:`frontier`,
    picks seed noise as well)."""
    if df.empty:
        raise ValueError("empty grid table")
    g = df.groupby([x, "top_k"])[y].agg(["mean", "std", "count"]).reset_index()
    best = g.loc[g.groupby(x)["mean"].idxmin()].sort_values(x)
    return pd.DataFrame({x: best[x].to_numpy(), "top_k": best.top_k.to_numpy(), "mean": best["mean"].to_numpy(),
                         "sd": best["std"].fillna(0.0).to_numpy(), "n": best["count"].to_numpy()})


def frontier_spread(df: pd.DataFrame, x: str = "num_experts", y: str = "test_loss") -> dict:
    """How much the number of experts matters against seed noise (notebook 04): ``spread`` = max -
    min of the seed-mean frontier (:func:`frontier_bands`), ``seed_sd`` = pooled seed s.d. of the frontier's
    configurations sqrt(mean_E sd_E^2), ``ratio`` = spread / seed_sd (inf when seed_sd is 0)."""
    fb = frontier_bands(df, x, y)
    spread = float(fb["mean"].max() - fb["mean"].min())
    sd = float(np.sqrt(np.mean(fb.sd.to_numpy() ** 2)))
    return dict(spread=spread, seed_sd=sd, ratio=spread / sd if sd > 0 else float("inf"),
                best_E=int(fb[x].iloc[int(fb["mean"].argmin())]), n_counts=len(fb))


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
            out.append(jensen_shannon(np.stack([P[i], P[j]])))          # moelab.stats
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


def pool_trace(events: pd.DataFrame, init: int, steps: int, model: int | None = None) -> np.ndarray:
    """Active experts before each step 0..steps-1 (MASS Alg. 1; notebook 04's expansion trace):
    pool(t) = init + #expansions at steps < t - #removals at steps < t (events of ``model`` when given)."""
    if init < 1 or steps < 1:
        raise ValueError(f"init={init} and steps={steps} must be >= 1")
    ev = events if model is None else events[events.model == model]
    delta = np.zeros(steps + 1)
    for kind, sign in (("expand", 1), ("remove", -1)):
        st = ev.step[ev.kind == kind].to_numpy(int)
        np.add.at(delta, np.clip(st + 1, 0, steps), sign)
    return init + np.cumsum(delta)[:steps].astype(int)


def max_reachable_pool(init: int, max_experts: int, warmup: int, window: int, expand_until: int) -> int:
    """Largest pool the public change-point schedule can reach (MASS Sec. 3.4 as the public code runs it;
    notebook 04): an expert is first tested at step max(warmup, window) - 1; after it is duplicated its warm-up count
    restarts (``warmup`` more steps) and the copy needs a full window, so within the expansion phase (steps <
    ``expand_until``) each expert can be split ``r`` times, counted here by simulating the schedule with every
    testable expert firing at every step it may.  Returns min(max_experts, that pool)."""
    if min(init, max_experts, warmup, window, expand_until) < 1:
        raise ValueError("init, max_experts, warmup, window and expand_until must be >= 1")
    # per expert: steps recorded since reset (count) and norms in its window (len); testable when both allow
    count, seen = [0] * init, [0] * init
    for _ in range(expand_until):
        n_before = len(count)
        for e in range(n_before):
            count[e] += 1
            seen[e] = min(window, seen[e] + 1)
        for e in range(n_before):
            if len(count) >= max_experts:
                return max_experts
            if count[e] >= warmup and seen[e] == window:
                count[e] = 0
                count.append(0)
                seen.append(0)
                break                                           # one expansion per step (public code)
    return min(max_experts, len(count))


JSD_READINGS = {"gate softmax": "probs", "post-top-p/top-k weights": "routing"}


def jsd_table(mass_res: dict, naive_res: dict, states: np.ndarray, n_entities: int, n_properties: int,
              n_chunks: int = 8) -> pd.DataFrame:
    """Fig. 3 points of every MASS run and every naive run (MASS Sec. 4.3; notebook 04): :func:`jsd_points` of each
    run's routing under both readings -- "gate softmax" (p = softmax(W_g u), the paper's routing distribution) and
    "post-top-p/top-k weights".  ``mass_res``: :func:`moelab.mass.run_mass` output (``probs``/``routing`` [R, N, E]);
    ``naive_res``: :func:`moelab.mass.run_naive` output with ``keep_routing=True`` ({cfg index: [N, E]}).  Returns
    DataFrame(chunk, entity_jsd, property_jsd, routing, method, run) (run: index within the method)."""
    if not naive_res.get("probs") or not naive_res.get("routing"):
        raise ValueError("naive_res has no routing: run_naive(..., keep_routing=True)")
    parts = []
    for label, key in JSD_READINGS.items():
        for r in range(len(mass_res[key])):
            parts.append(jsd_points(mass_res[key][r], states, n_entities, n_properties, n_chunks)
                         .assign(routing=label, method="MASS", run=r))
        for i, w in sorted(naive_res[key].items()):
            parts.append(jsd_points(w, states, n_entities, n_properties, n_chunks)
                         .assign(routing=label, method="naive", run=i))
    return pd.concat(parts, ignore_index=True)


# ----------------------------------------------------------------------------------------------- figures
def plot_fig2(grid: pd.DataFrame, bands: pd.DataFrame, elbow: float | None, mass: pd.DataFrame, sweep: pd.DataFrame,
              fixed_experts: int, references: dict):
    """Fig. 2 (MASS Sec. 4.3; notebook 04).  Left: target NLL vs #experts -- naive runs (dots per top-k), the
    seed-mean frontier with a ±1 s.d. band over seeds (:func:`frontier_bands`), its elbow (None: no elbow), MASS runs
    (stars at their final pools); right: target NLL vs top-k at a fixed pool (naive, mean ± s.d. over seeds) with MASS
    at its mean active experts.  ``references``: {label: level} drawn as horizontal lines (Bayes floor, n-grams)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for k, sub in grid.groupby("top_k"):
        a.scatter(sub.num_experts, sub.test_loss, s=10, alpha=0.4, label=f"naive top-{k}")
    x, m, sd = bands.num_experts.to_numpy(float), bands["mean"].to_numpy(), bands.sd.to_numpy()
    a.plot(x, m, "k-", lw=1.5, label="frontier (seed mean, best top-k)")
    a.fill_between(x, m - sd, m + sd, color="k", alpha=0.15, label="±1 s.d. over seeds")
    if elbow is not None:
        a.axvline(elbow, color="gray", ls="--", label=f"elbow = {elbow:g}")
    a.scatter(mass.final_experts, mass.test_loss, marker="*", s=150, c="purple", label="MASS runs", zorder=5)
    a.set(xlabel="# experts", ylabel="test NLL of the targets y (nats)", title="Fig 2 left")
    ms_ = sweep.groupby("top_k").test_loss.agg(["mean", "std"]).reset_index()
    b.errorbar(ms_.top_k, ms_["mean"], yerr=ms_["std"].fillna(0), fmt="o-", color="gray",
               label=f"naive, E={fixed_experts}")
    b.errorbar([mass.mean_active.mean()], [mass.test_loss.mean()], xerr=[mass.mean_active.std()],
               yerr=[mass.test_loss.std()], fmt="*", ms=14, color="purple", label="MASS (top-p), mean active")
    styles = [":", "-.", "--", (0, (1, 3))]
    for i, (lab, lev) in enumerate(references.items()):
        for ax in (a, b):
            ax.axhline(lev, color=f"C{i + 4}", ls=styles[i % len(styles)], lw=1, label=f"{lab} ({lev:.3f})")
    b.set(xlabel="top-k (active experts per token)", ylabel="test NLL of the targets y", title="Fig 2 right")
    a.legend(fontsize=6)
    b.legend(fontsize=6)
    fig.tight_layout()
    return fig


def plot_fig3(points: pd.DataFrame):
    """Fig. 3 (MASS Sec. 4.3; notebook 04): contours of (entity JSD, property JSD) points of MASS vs naive runs
    (points: method, entity_jsd, property_jsd, optional ``routing`` -- one panel per routing reading, e.g. the
    gate's softmax and the post-top-p/top-k weights)."""
    if "routing" not in points:
        points = points.assign(routing="routing")
    kinds = list(dict.fromkeys(points.routing))
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 4.5), squeeze=False)
    colors = {"MASS": "purple", "naive": "gray"}
    for ax, kind in zip(axes[0], kinds):
        for meth, sub in points[points.routing == kind].groupby("method"):
            if len(sub) > 3 and sub[["entity_jsd", "property_jsd"]].std().min() > 0:
                sns.kdeplot(data=sub, x="entity_jsd", y="property_jsd", ax=ax, color=colors.get(meth), levels=5,
                            fill=False)
            ax.scatter(sub.entity_jsd, sub.property_jsd, s=8, color=colors.get(meth), alpha=0.6, label=meth)
        ax.set(xlabel="entity-level JSD (bits)", ylabel="property-level JSD (bits)", title=f"Fig 3: {kind}")
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


def plot_expansion_trace(trace: pd.DataFrame, events: pd.DataFrame, runs: pd.DataFrame, p_threshold: float,
                         delta: float, expand_until: int, max_runs: int = 8):
    """Expansion trace per MASS run (MASS Sec. 3.4-3.5, Alg. 1; notebook 04), one column per run (the first
    ``max_runs`` rows of ``runs``: seed, init_experts; their index in ``runs`` is the ``model`` id of ``trace`` /
    ``events``), rows: (1) the change-point statistic's input g_t = ||grad W1_e||_F per expert; (2) its p-value
    p = 1 - Phi(sum z / sqrt(W)) per expert (log scale) with the threshold; (3) |cos(W1_e, grad W1_e)| at every
    firing against delta (filled: passed the semantic test); (4) pool size over the steps (:func:`pool_trace`)."""
    runs = runs.reset_index(drop=True).head(max_runs)
    n = max(1, len(runs))
    fig, axes = plt.subplots(4, n, figsize=(3.2 * n, 9), squeeze=False, sharex=True)
    for m, r in runs.iterrows():
        tr, ev = trace[trace.model == m], events[events.model == m]
        a_g, a_p, a_c, a_n = axes[:, m]
        for e, sub in tr.groupby("expert"):
            a_g.plot(sub.step, sub.grad_norm, lw=0.7)
            a_p.plot(sub.step, sub.p.clip(lower=1e-12), lw=0.7)
        a_p.axhline(p_threshold, color="red", ls=":", lw=1)
        a_p.set_yscale("log")
        fires = ev[ev.kind == "fire"]
        ok = fires.cos.abs() < delta
        a_c.scatter(fires.step[ok], fires.cos.abs()[ok], color="purple", s=14, label="|cos| < δ: candidate")
        a_c.scatter(fires.step[~ok], fires.cos.abs()[~ok], facecolors="none", edgecolors="gray", s=14,
                    label="|cos| ≥ δ: no expansion")
        a_c.axhline(delta, color="purple", ls=":", lw=1)
        a_c.set_yscale("symlog", linthresh=delta / 10)
        pool = pool_trace(ev, int(r.init_experts), expand_until)
        a_n.step(np.arange(expand_until), pool, where="post", color="k")
        for kind, c in (("expand", "green"), ("remove", "red")):
            st = ev.step[ev.kind == kind]
            a_n.scatter(st, pool[np.clip(st.to_numpy(int) + 1, 0, expand_until - 1)], color=c, s=12, zorder=5,
                        label=kind)
        a_g.set_title(f"run {m} (seed {r.seed}, start {int(r.init_experts)})", fontsize=8)
        a_n.set_xlabel("step")
        if m == 0:
            a_g.set_ylabel("||grad W1_e||_F")
            a_p.set_ylabel("change-point p")
            a_c.set_ylabel("|cos| at firings")
            a_n.set_ylabel("pool size")
            a_c.legend(fontsize=6)
            a_n.legend(fontsize=6)
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


# ----------------------------------------------------------------------------------------------- notebook 04's tables
def frontier_summary(grid: pd.DataFrame) -> dict:
    """Fig. 2 left from the naive grid (MASS Sec. 4.3; notebook 04 section 2): bands (:func:`frontier_bands`), spread
    (:func:`frontier_spread`), elbow (max distance to the chord of the seed-mean frontier; None below 3 counts) and
    seeds: per seed, the frontier point of every expert count (num_experts, top_k, seed, test_loss) -- the per-seed
    rows a seed-level interval of the frontier needs; ``bands`` gains its 95% t-interval (lo, hi)."""
    bands = frontier_bands(grid)
    tq = stats.t.ppf(0.975, np.maximum(bands.n - 1, 1))
    half = np.where(bands.n > 1, tq * bands.sd / np.sqrt(bands.n), np.nan)
    bands = bands.assign(lo=bands["mean"] - half, hi=bands["mean"] + half)
    seeds = grid.merge(bands[["num_experts", "top_k"]], on=["num_experts", "top_k"]).sort_values(["seed", "num_experts"])
    elbow = elbow_max_chord(bands.num_experts, bands["mean"]) if len(bands) >= 3 else None
    return dict(bands=bands, spread=frontier_spread(grid), elbow=elbow, seeds=seeds.reset_index(drop=True),
                best=bands.loc[bands["mean"].idxmin()])


def mass_pool_table(runs: pd.DataFrame, configs: dict) -> pd.DataFrame:
    """Pool sizes MASS reaches per start size (notebook 04 section 3): mean, s.d., min and max of the final pool over
    seeds, the largest pool the public schedule allows from that start (:func:`max_reachable_pool`), active experts
    per token and target NLL.  ``configs``: {start: MassConfig}."""
    reach = {s: max_reachable_pool(s, c.max_experts, c.warmup, c.window, c.expand_until) for s, c in configs.items()}
    t = runs.groupby("init_experts").agg(seeds=("seed", "count"), final_pool_mean=("final_experts", "mean"),
                                         final_pool_sd=("final_experts", "std"), final_pool_min=("final_experts", "min"),
                                         final_pool_max=("final_experts", "max"), mean_active=("mean_active", "mean"),
                                         test_loss=("test_loss", "mean"),
                                         **{c: (c, "mean") for c in ("active_init", "active_expansion_end")
                                            if c in runs}).reset_index()
    return t.assign(max_reachable=t.init_experts.map(reach))


def fig3_points(mass_res: dict, sweep: dict, states: np.ndarray, n_entities: int, n_properties: int,
                n_chunks: int = 8) -> pd.DataFrame:
    """:func:`jsd_table` with each run's identity (notebook 04 section 5): MASS rows gain seed and init_experts, naive
    rows seed, num_experts and top_k, so the JSD can be compared per seed."""
    pts = jsd_table(mass_res, sweep, states, n_entities, n_properties, n_chunks)
    mt, st = mass_res["table"].reset_index(drop=True), sweep["table"].reset_index(drop=True)
    ids = pd.concat([mt[["seed", "init_experts"]].assign(method="MASS", run=np.arange(len(mt))),
                     st[["seed", "num_experts", "top_k"]].assign(method="naive", run=np.arange(len(st)))])
    return pts.merge(ids, on=["method", "run"], how="left")


def reference_lines(refs: pd.DataFrame) -> dict:
    """{label: target NLL} of the levels Fig. 2 draws (notebook 04): Bayes floor, within-example Bayes, the best
    4-gram and the best trigram of :func:`moelab.mass.reference_levels`."""
    lev = lambda name: float(refs[refs.name == name].target_nll.min())
    return {"Bayes floor": lev("Bayes"), "within-example Bayes": lev("within-example Bayes"), "4-gram": lev("4-gram"),
            "trigram": lev("trigram")}


# ----------------------------------------------------------------------------------------------- issue 48's checks
MIN_SPREAD_RATIO = 3.0      # the frontier's range over E must be >= 3 seed s.d. (else the expert count barely matters)
MIN_EXPANDED_SHARE = 0.5    # MASS must expand in at least half of its runs (else MASS's mechanism is not tested)
MIN_ACTIVE = 1.0            # the router must keep on average more than one expert per token (else top-p is top-1)


def mass_regime_checks(grid: pd.DataFrame, runs: pd.DataFrame, min_ratio: float = MIN_SPREAD_RATIO,
                       min_share: float = MIN_EXPANDED_SHARE, min_active: float = MIN_ACTIVE) -> pd.DataFrame:
    """The checks a referee needs before notebook 04's synthetic claims can decide (issue 48; table
    ``fig2_mass_regime``), one row each (check, value, threshold, passed, reason naming the numbers):

    - ``frontier_range``: range of the seed-mean naive frontier / pooled seed s.d. (:func:`frontier_spread`) >=
      ``min_ratio``;
    - ``mass_expanded``: share of MASS runs (``runs``: init_experts, final_experts) whose final pool exceeds their
      start >= ``min_share``;
    - ``router_active``: mean over MASS runs of the active experts per test token at the end (``mean_active``) >
      ``min_active``."""
    sp = frontier_spread(grid)
    grew = runs.final_experts > runs.init_experts
    share = float(grew.mean()) if len(runs) else 0.0
    pools = ", ".join(f"{int(a)}->{int(b)}" for a, b in zip(runs.init_experts, runs.final_experts))
    act = float(runs.mean_active.mean()) if len(runs) else float("nan")
    per = ", ".join(f"{v:.2f}" for v in runs.mean_active)
    rows = [dict(check="frontier_range", value=sp["ratio"], threshold=min_ratio, passed=bool(sp["ratio"] >= min_ratio),
                 reason=f"naive frontier range {sp['spread']:.4f} nats = {sp['ratio']:.1f} seed s.d. "
                        f"({sp['seed_sd']:.4f}) over E = {', '.join(map(str, sorted(grid.num_experts.unique())))} "
                        f"(needs >= {min_ratio:g})"),
            dict(check="mass_expanded", value=share, threshold=min_share, passed=bool(share >= min_share),
                 reason=f"MASS expanded in {int(grew.sum())} of {len(runs)} runs (start->final pools: {pools}; "
                        f"needs >= {min_share:.0%} of the runs)"),
            dict(check="router_active", value=act, threshold=min_active, passed=bool(act > min_active),
                 reason=f"MASS runs keep {act:.3f} experts per test token on average (per run: {per}; needs > "
                        f"{min_active:g})")]
    return pd.DataFrame(rows)


def cpd_pvalues(g: np.ndarray, warmup: int, window: int) -> np.ndarray:
    """Change-point p-values of :class:`moelab.mass.MassPool` for series that never reset, vectorised over series:
    g [n, T] gradient norms -> p [n, T] (nan where the expert is not yet tested).  Step t (0-based) stores
    z_t = (g_t - mean W_t) / sd W_t over the last ``window`` norms once t + 1 >= ``warmup``; it is tested once a full
    window of norms is stored (t + 1 >= ``window``) with S = sum of the last <= ``window`` stored z / sqrt(window),
    p = 1 - Phi(S)."""
    g = np.atleast_2d(np.asarray(g, float))
    n, T = g.shape
    z = np.full((n, T), np.nan)
    p = np.full((n, T), np.nan)
    for t in range(warmup - 1, T):
        w = g[:, max(0, t - window + 1): t + 1]
        sd = w.std(axis=1, ddof=1) if w.shape[1] > 1 else np.zeros(n)
        z[:, t] = np.where(sd > 0, (g[:, t] - w.mean(1)) / np.where(sd > 0, sd, 1.0), 0.0)
        if t + 1 >= window and t + 1 >= warmup:
            zs = z[:, max(warmup - 1, t - window + 1): t + 1]
            p[:, t] = stats.norm.sf(zs.sum(1) / np.sqrt(window))
    return p


def ar1_series(n: int, T: int, rho: float, seed: int = 0, level: float = 1.0, scale: float = 0.1) -> np.ndarray:
    """Stationary AR(1) series [n, T]: x_t = level + scale e_t, e_t = rho e_{t-1} + sqrt(1 - rho^2) eta_t, e_0 ~ N(0, 1)
    (a gradient-norm series with no change point and lag-1 autocorrelation ``rho``)."""
    if not -1 < rho < 1:
        raise ValueError(f"rho={rho} must lie in (-1, 1)")
    rng = np.random.default_rng(seed)
    eta = rng.standard_normal((n, T))
    e = np.empty((n, T))
    e[:, 0] = eta[:, 0]
    for t in range(1, T):
        e[:, t] = rho * e[:, t - 1] + np.sqrt(1 - rho ** 2) * eta[:, t]
    return level + scale * e


def lag1_autocorr(trace: pd.DataFrame, until: int | None = None) -> pd.Series:
    """Lag-1 autocorrelation of each expert's gradient-norm series in a MASS trace (step, model, expert, grad_norm;
    ``until``: only steps < until), one value per (init_experts if present, model, expert) with >= 10 norms."""
    t = trace if until is None else trace[trace.step < until]
    keys = [k for k in ("init_experts", "model", "expert") if k in t]
    out = {}
    for key, g in t.sort_values("step").groupby(keys):
        x = g.grad_norm.to_numpy(float)
        if len(x) >= 10 and x.std() > 0:
            out[key] = float(np.corrcoef(x[:-1], x[1:])[0, 1])
    return pd.Series(out, dtype=float)


def cpd_calibration(rhos, steps: int, warmup: int, window: int, p_threshold: float = 0.01, n_series: int = 500,
                    seed: int = 0, measured: float | None = None) -> pd.DataFrame:
    """How often the change-point test fires on noise (notebook 04, table ``appC_cpd_calibration``): per lag-1
    autocorrelation rho in ``rhos``, ``n_series`` stationary AR(1) series of ``steps`` norms (the expansion phase)
    through :func:`cpd_pvalues`.  One row per series: rho, series, tests (tested steps), fires (p < p_threshold),
    fire_rate = fires / tests, fired (at least one firing), measured (rho == ``measured``, the runs' value)."""
    rows = []
    rhos = sorted({float(r) for r in rhos} | ({float(measured)} if measured is not None else set()))
    for i, rho in enumerate(rhos):
        p = cpd_pvalues(ar1_series(n_series, steps, float(rho), seed=seed + i), warmup, window)
        tested = np.isfinite(p)
        fires = (np.where(tested, p, 1.0) < p_threshold).sum(1)
        n_t = tested.sum(1)
        rows.append(pd.DataFrame(dict(rho=float(rho), series=np.arange(n_series), tests=n_t, fires=fires,
                                      fire_rate=fires / np.maximum(n_t, 1), fired=fires > 0,
                                      measured=measured is not None and float(rho) == float(measured))))
    return pd.concat(rows, ignore_index=True)
