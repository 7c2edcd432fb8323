# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Geometry-preserving aggregation for MoE embedding models (SBA)
#
# Kachuee & Sharifkhani observe that in `nomic-embed-text-v2-moe` the two experts chosen for a token produce outputs
# of nearly equal norm (r₁/r₂ ≈ 1, Fig. 1) but far apart in angle (mostly > 40°, Fig. 2). A weighted *linear* sum of
# two such vectors falls inside the sphere they lie on (Eqs. 1–3, Fig. 5). **Spherical Barycentric Aggregation**
# combines radius and direction separately instead:
#
# $$r = \sum_i w_i r_i,\qquad \hat u = \mathrm{slerp}\Big(\hat e_1, \hat e_2;\ t=\tfrac{w_2 r_2}{w_1 r_1 + w_2 r_2}\Big),\qquad y_\mathrm{SBA} = r\,\hat u \quad\text{(Eqs. 4–8)}$$
#
# and the paper reports small gains over linear aggregation on STS, clustering and duplicate-question detection
# (Table I) plus two ablations (norm-free direction, unit output; Table II).
#
# | | paper | smoke | default (this CPU) | full | paper profile |
# |---|---|---|---|---|---|
# | model | nomic-embed-text-v2-moe (475M) | MiniLM-L6 → MoE (8 experts, top-2, layers 1/3/5) | same | same (+ cluster-aware init) | nomic from `MODEL_PATH` |
# | geometry prompts | MMLU, 57 subjects | 20 WordNet lexicographer files × 1 definition | 24 files × 6 | 41 files × 12 | 41 files × 24 |
# | training data | all-nli, 30K triplets, 3 epochs | suite pairs, 3 steps × 8 | suite pairs, 24 steps × 16 | same, plus nomic's unnormalised routing | all-nli triplets from `NLI_PATH` |
# | optimisation | AdamW 2e-6, batch 64, warm-up 10%, τ = 0.05 | AdamW, warm-up 10%, τ = 0.05 | same | same | paper's |
# | aggregations × seeds | 4 × 3 | linear, SBA × 1 | linear, SBA × 3 | all 4 × 3 | all 4 × 3 |
# | evaluation | MTEB STSB / StackExchangeClustering / SprintDuplicateQuestions | suite WordNet STS (small set) | suite WordNet STS / clustering / pair classification (small sets) | all six suite benchmarks, default size (validated) | MTEB tasks from `MTEB_PATH` |
#
# **The stand-in model.** No pretrained MoE embedding model can be had offline here, so the default profile builds
# one: all-MiniLM-L6-v2 with every other FFN turned into 8 experts (top-2). With renormalised top-2 weights and
# experts that keep the FFN biases, sparse upcycling reproduces MiniLM exactly (checked below). nomic's own layout
# differs: bias-free experts with one shared bias added after the sum, and top-2 weights taken from a softmax over all
# 8 experts *without* renormalisation (w₁ + w₂ = s < 1). That routing is built too, to split linear aggregation's
# shrinkage into the part due to s < 1 and the part due to angular cancellation. Copied experts are identical
# (0° apart); Drop-Upcycling (50% of each expert's hidden units re-drawn) breaks the symmetry before fine-tuning.

# %% tags=["parameters"]
PROFILE = "default"
SEED = 0
MODEL_PATH = None  # paper profile: local nomic-embed-text-v2-moe folder (or env MOELAB_NOMIC_PATH)
NLI_PATH = None  # paper profile: local sentence-transformers/all-nli (triplet subset)
MTEB_PATH = None  # paper profile: folder with STSBenchmark/, StackExchangeClustering/, SprintDuplicateQuestions/

# %%
import os
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

import moelab
from moelab import cache, sba

warnings.filterwarnings("ignore", message=".*tokenize.*deprecated.*")
run = moelab.start_run("02_sba", profile=PROFILE, seed=SEED)
cfg = moelab.profiles.select(
    PROFILE,
    smoke=dict(aggregations=["linear", "sba"], seeds=[0], steps=3, batch_size=8, lr=5e-5, eval_every=1,
               val_batches=1, n_subjects=20, per_subject=1, max_tokens=20, inits=["drop"], unnorm_run=False,
               n_exact=8, bench_profile="smoke", benchmarks=["wordnet_sts"]),
    # default: the suite's small (smoke-size) benchmark sets -- encoding is the bottleneck on the shared 2-core CPU
    default=dict(aggregations=["linear", "sba"], seeds=[0, 1, 2], steps=24, batch_size=16, lr=5e-5, eval_every=4,
                 val_batches=2, n_subjects=24, per_subject=6, max_tokens=100, inits=["sparse", "drop"],
                 unnorm_run=False, n_exact=32, bench_profile="smoke",
                 benchmarks=["wordnet_sts", "wordnet_clustering", "wordnet_pairs"]),
    # full: every table and ablation on CPU (about 45 minutes here): Table II's two ablations, the cluster-aware
    # initialiser, nomic's unnormalised routing fine-tuned, 41 x 12 prompts, the validated default-size benchmarks
    full=dict(aggregations=["linear", "sba", "sba_normfree", "sba_unit"], seeds=[0, 1, 2], steps=24, batch_size=16,
              lr=5e-5, eval_every=4, val_batches=2, n_subjects=41, per_subject=12, max_tokens=100,
              inits=["sparse", "drop", "cluster"], unnorm_run=True, n_exact=128, bench_profile="default",
              benchmarks=None),
    paper=dict(aggregations=["linear", "sba", "sba_normfree", "sba_unit"], seeds=[0, 1, 2], steps=1400,
               batch_size=16, grad_accum=4, lr=2e-6, eval_every=100, val_batches=4, n_subjects=41, per_subject=24,
               max_tokens=400, n_triplets=30000, inits=[], unnorm_run=False, n_exact=0, bench_profile=None,
               benchmarks=None),
)
cfg["drop_ratio"] = 0.5
subjects = cache.memo("wordnet_subjects", dict(n=cfg["n_subjects"], per=cfg["per_subject"], seed=SEED),
                      lambda: sba.wordnet_subject_texts(cfg["n_subjects"], cfg["per_subject"], seed=SEED))
print(f"profile {PROFILE}: {len(subjects)} subjects x {cfg['per_subject']} texts; "
      f"aggregations {cfg['aggregations']}, seeds {cfg['seeds']}, {cfg['steps']} steps")

# %% [markdown]
# ## Data and evaluation
# Training pairs and the STS / clustering / pair-classification benchmarks come from the shared suite
# (`moelab.suite.embed`); the paper profile reads all-nli triplets and the three MTEB tasks from local copies.

# %%
if PROFILE == "paper":
    MODEL_PATH = MODEL_PATH or os.environ.get("MOELAB_NOMIC_PATH")
    triplets = sba.load_allnli_triplets(NLI_PATH, "train", limit=cfg["n_triplets"])
    val_pairs = sba.load_allnli_triplets(NLI_PATH, "dev", limit=256)
    mteb_tasks = sba.load_mteb_local(MTEB_PATH)
    train_pairs, evaluate = triplets, None
    print(f"{len(triplets)} all-nli triplets; MTEB tasks {list(mteb_tasks)}")
else:
    from moelab.suite import embed as suite_embed

    pairs = suite_embed.pairs(PROFILE)
    train_pairs, val_pairs = pairs["train"], pairs["validation"]
    benches = suite_embed.benchmarks(cfg["bench_profile"])
    if cfg["benchmarks"]:  # the paper's three kinds: STS, clustering, pair classification
        benches = {k: benches[k] for k in cfg["benchmarks"]}

    def evaluate(encode_fn):
        return suite_embed.evaluate(encode_fn, benches)

    print(f"{len(train_pairs)} training pairs, {len(val_pairs)} validation pairs; benchmarks {list(benches)}")

# %% [markdown]
# ## 1 · Sparse upcycling reproduces MiniLM exactly (renormalised top-2, experts with biases)
# With $\sum_i w_i = 1$ and identical experts $E_i = \mathrm{FFN}$: $\sum_i w_i E_i(x) = \mathrm{FFN}(x)$. With nomic's
# unnormalised top-2 the same copies give $s\cdot\mathrm{FFN}(x)$, $s = w_1 + w_2 < 1$.

# %%
if PROFILE != "paper":
    exact = cache.memo("sba_exactness", dict(v=1, n=cfg["n_exact"], seed=SEED), lambda: sba.upcycling_exactness(
        [t for v in subjects.values() for t in v][:cfg["n_exact"]]))
    run.save_table(exact, "check", "upcycling-exactness", caption="max |embedding difference| to MiniLM")
    display(exact)
    ex = exact.set_index("construction").max_abs_diff
    print(f"renormalised top-2 + expert biases: max |Δ| = {ex['renormalised top-2']:.1e}; "
          f"nomic's unnormalised top-2: max |Δ| = {ex['unnormalised top-2 (nomic)']:.3f}")

# %% [markdown]
# ## 2 · Geometry at initialisation
# For every MoE layer and real token: the two chosen experts' norms $r_1, r_2$ (router rank order), the angle between
# them, and $\|y\|/\bar r$ with $\bar r = (r_1+r_2)/2$ for each aggregation operator applied to the same outputs.

# %%
def _init_geo(init, renorm):
    conf = dict(v=1, init=init, renorm=renorm, seed=SEED, drop=cfg["drop_ratio"], n=cfg["n_subjects"],
                per=cfg["per_subject"], max_tokens=cfg["max_tokens"])
    calib = [t for v in subjects.values() for t in v] if init == "cluster" else None
    return cache.memo("sba_init_geometry", conf, lambda: sba.init_geometry(
        subjects=subjects, renormalize=renorm, init=init, seed=SEED, drop_ratio=cfg["drop_ratio"],
        max_tokens=cfg["max_tokens"], calib_texts=calib))


inits = {}
if PROFILE == "paper":
    from moelab.nomic import load_nomic

    nomic_model = load_nomic(MODEL_PATH)
    g, c = sba.collect_geometry(nomic_model, sba.nomic_forward_fn(nomic_model), subjects, cfg["max_tokens"])
    inits["nomic (pretrained)"] = dict(geo=g, counts=c, similarity=sba.moe_specialisation(nomic_model))
else:
    for init in cfg["inits"]:
        inits[f"{init} / renormalised"] = _init_geo(init, True)
    inits["drop / unnormalised (nomic routing)"] = _init_geo("drop", False)
geo_init = pd.concat([r["geo"].assign(model=k, stage="init") for k, r in inits.items()], ignore_index=True)
summ_init = pd.concat([sba.summarize_geometry(r["geo"]).assign(model=k, stage="init") for k, r in inits.items()],
                      ignore_index=True)
run.save_table(summ_init, "fig1-2", "geometry-init", caption="expert-output geometry per layer at initialisation")
display(summ_init[summ_init.layer == "pooled"].set_index("model").iloc[:, :9].round(3))

# %% [markdown]
# ## 3 · Fine-tuning: linear vs SBA (and the ablations), identical settings
# MNRL with in-batch negatives, cosine similarity, τ = 0.05 (scale 20); AdamW, linear warm-up over 10% then linear
# decay; plus 0.01 × the Switch balancing loss (the routers are new). Every run starts from the same Drop-Upcycled
# model for its seed; only the aggregation operator differs. The validation loss decides whether training has
# flattened (`moelab.train.flattened`: < 2% fall over the last 20% of evaluations).

# %%
def _run(agg, seed, renorm=True):
    if PROFILE == "paper":
        conf = dict(v=1, agg=agg, seed=seed, path=str(MODEL_PATH), **{k: cfg[k] for k in (
            "steps", "batch_size", "lr", "grad_accum", "eval_every", "n_subjects", "per_subject", "max_tokens")})
        return cache.memo("sba_nomic_run", conf, lambda: sba.nomic_finetune_and_measure(
            model_path=MODEL_PATH, aggregation=agg, seed=seed, train_triplets=train_pairs, val_triplets=val_pairs,
            subjects=subjects, steps=cfg["steps"], batch_size=cfg["batch_size"], lr=cfg["lr"],
            grad_accum=cfg["grad_accum"], eval_every=cfg["eval_every"], max_tokens=cfg["max_tokens"],
            mteb_tasks=mteb_tasks, device="auto"))
    conf = dict(v=1, profile=PROFILE, agg=agg, seed=seed, renorm=renorm, drop=cfg["drop_ratio"], **{k: cfg[k] for k in (
        "steps", "batch_size", "lr", "eval_every", "val_batches", "n_subjects", "per_subject", "max_tokens",
        "bench_profile", "benchmarks")})
    return cache.memo("sba_minilm_run", conf, lambda: sba.finetune_and_measure(
        aggregation=agg, seed=seed, train_pairs=train_pairs, val_pairs=val_pairs, subjects=subjects,
        steps=cfg["steps"], batch_size=cfg["batch_size"], lr=cfg["lr"], eval_every=cfg["eval_every"],
        renormalize=renorm, drop_ratio=cfg["drop_ratio"], max_tokens=cfg["max_tokens"],
        evaluate=evaluate if renorm else None, val_batches=cfg["val_batches"]))


runs = {(agg, seed): _run(agg, seed) for agg in cfg["aggregations"] for seed in cfg["seeds"]}
if cfg["unnorm_run"]:
    runs_unnorm = {("linear", cfg["seeds"][0]): _run("linear", cfg["seeds"][0], renorm=False)}
else:
    runs_unnorm = {}
train_tab = sba.training_table(runs)
run.save_table(train_tab, "train", "runs", caption="per run: final train/validation MNRL, flattened?, wall time")
display(train_tab.round(4))
fig = sba.plot_validation(runs)
run.savefig(fig, "train", "validation-loss", caption="validation MNRL during fine-tuning")
print(f"{int(train_tab.flattened.sum())} of {len(train_tab)} runs have a flattened validation loss (median relative "
      f"fall over the last 20% of evaluations: {train_tab.val_relative_fall.median():.3f}); "
      f"{int(train_tab.train_flattened.sum())} a flattened training loss "
      f"(median fall {train_tab.train_relative_fall.median():.3f})")

# %% [markdown]
# ## 4 · Figures 1, 2, 5: geometry before and after fine-tuning
# The fine-tuned models' expert outputs are captured on the same prompts. For Fig. 5 each model's own operator is
# shown (linear model: $\|y_\mathrm{lin}\|/\bar r$, SBA model: $\|y_\mathrm{SBA}\|/\bar r$).

# %%
geo_ft = pd.concat([r["geo"].assign(model=f"{a} (fine-tuned)", seed=s, stage="fine-tuned")
                    for (a, s), r in runs.items()] +
                   [r["geo"].assign(model=f"{a} unnormalised (fine-tuned)", seed=s, stage="fine-tuned")
                    for (a, s), r in runs_unnorm.items()], ignore_index=True)
summ_ft = pd.concat([sba.summarize_geometry(g).assign(model=m) for m, g in geo_ft.groupby("model", sort=False)],
                    ignore_index=True)
run.save_table(summ_ft, "fig1-2", "geometry-finetuned", caption="expert-output geometry per layer after fine-tuning")
geo_all = pd.concat([geo_init, geo_ft], ignore_index=True)
for fig_id, slug, col, xlabel in [("fig1", "norm-ratio", "norm_ratio", "r1 / r2"),
                                  ("fig2", "angle", "angle_deg", "angle between the two experts (deg)")]:
    fig = sba.plot_hist(geo_all, col, xlabel, by="model")
    run.savefig(fig, fig_id, slug, caption=f"distribution of {xlabel} over all MoE layers and subjects")
fig = sba.plot_fig5(geo_all)
run.savefig(fig, "fig5", "output-norm-ratio", caption="||y|| / mean(r1, r2): linear vs SBA")
pooled = pd.concat([summ_init, summ_ft.assign(stage="fine-tuned")])
pooled = pooled[pooled.layer == "pooled"].set_index("model")
display(pooled[["norm_ratio_median", "share_norm_ratio_within_10pct", "angle_median_deg",
                "share_angle_above_40deg", "weight_sum_mean", "ratio_linear_mean", "ratio_sba_mean"]].round(3))
lin_m, sba_m = f"{cfg['aggregations'][0]} (fine-tuned)", "sba (fine-tuned)"
print(f"fine-tuned linear model: median r1/r2 = {pooled.loc[lin_m, 'norm_ratio_median']:.3f}, "
      f"{100 * pooled.loc[lin_m, 'share_angle_above_40deg']:.1f}% of angles above 40 deg "
      f"(median {pooled.loc[lin_m, 'angle_median_deg']:.1f} deg); ||y_lin||/r̄ = {pooled.loc[lin_m, 'ratio_linear_mean']:.3f} "
      f"vs ||y_SBA||/r̄ = {pooled.loc[sba_m, 'ratio_sba_mean']:.3f} in the SBA model")

# %% [markdown]
# ### What the geometry owes to training, and the shrinkage decomposition
# $\|y_\mathrm{lin}\|/\bar r = s\cdot\frac{\|\sum_i \hat w_i e_i\|}{\sum_i \hat w_i r_i}\cdot\frac{\sum_i \hat w_i r_i}{\bar r}$
# (weights not summing to one × angular cancellation × radius mixing, $\hat w = w/s$). SBA takes its radius
# $r = \sum_i w_i r_i$ with the *raw* weights (Eq. 5), so it removes only the angular factor:
# $\|y_\mathrm{SBA}\|/\bar r = s\cdot\sum_i\hat w_i r_i/\bar r$; under nomic's unnormalised top-2 it shrinks by $s$ too.

# %%
decomp = pd.concat([sba.shrinkage_decomposition(g).assign(model=m) for m, g in geo_all.groupby("model", sort=False)],
                   ignore_index=True)
run.save_table(decomp, "fig5", "shrinkage-decomposition", caption="mean log-factors of linear aggregation's shrinkage")
dp = decomp[decomp.layer == "pooled"].set_index("model")
display(dp.round(4))
for m in dp.index:
    print(f"{m}: log(||y_lin||/r̄) = {dp.loc[m, 'log_total']:+.3f} = weights {dp.loc[m, 'log_weight_sum']:+.3f} "
          f"+ angle {dp.loc[m, 'log_angular']:+.3f} + radius mix {dp.loc[m, 'log_radius_mix']:+.3f}; "
          f"SBA {dp.loc[m, 'log_sba']:+.3f}")

# %% [markdown]
# ## 5 · Specialisation before and after fine-tuning
# Routing Jensen–Shannon divergence of expert usage across the subjects (0 = routing ignores the subject) and mean
# pairwise cosine similarity of the experts' weights (1 = still copies).

# %%
spec = sba.specialisation_table(inits, runs)
run.save_table(spec, "spec", "specialisation", caption="routing JSD across subjects and expert similarity")
display(spec.round(4))

# %% [markdown]
# ## 6 · Table I / II: downstream scores, mean and 95% interval over seeds

# %%
scores = sba.scores_long(runs)
table = sba.table_one(scores)
run.save_table(table, "table1", "benchmarks", caption="benchmark scores per aggregation, mean over seeds [95% CI]")
run.save_table(scores, "table1", "per-seed-scores", caption="benchmark scores per aggregation, seed and benchmark")
display(table)

# %% [markdown]
# ## Conclusion
#
# The verdicts are computed from the tables saved above, without rerunning anything, by the claim definitions in
# `moelab.claims.defs.nb02_sba` (one per claim, with the paper's Table I / II numbers beside it; the verdict rule is in
# docs/CLAIMS.md). Each stand-in benchmark maps to one paper column and takes its direction from the table (unit-output
# SBA is worse than linear on STS and clustering in Table II); retrieval has no paper column and is an extension; the
# geometry of Figs. 1, 2 and 5 is judged against what the initialisation and the operators' definitions already give.

# %%
claims = run.finish()
display(claims)
