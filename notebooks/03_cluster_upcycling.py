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
# # 03 · Cluster-aware upcycling (Chu et al., poster 002)
#
# **Idea.** Sparse upcycling copies a dense FFN into every expert, so experts start identical and the router has
# nothing to latch onto. Cluster-aware upcycling uses the dense model's own activation geometry instead:
# (1) spherical k-means on each FFN's input activations, one cluster per expert; (2) each expert's input projection
# becomes a data-aware truncated SVD whitened by *its* cluster, $\widetilde W_i = T_{r_i}(W S_i)\,S_i^{-1}$ with
# $S_iS_i^\top = X_iX_i^\top$; (3) router rows are the unit centroids; and during continued training
# (4) expert-ensemble self-distillation (EESD) pulls the sparse top-k output towards the dense ensemble of all experts
# of an EMA copy. Library: `moelab.cluster_upcycling` (method, data, analyses, experiment, report), `moelab.core`
# (conversion, the initialisers, expert similarity).
#
# | | paper (poster) | `smoke` | `default` | `full` | `paper` |
# |---|---|---|---|---|---|
# | dense model | CLIP ViT-B/32, B/16 (4.0B samples) | all-MiniLM-L6-v2 (real, pretrained) | same | same | CLIP ViT-B from a local open_clip file |
# | MoE | every other FFN, 8 experts, top-2 | same | same | same | same |
# | continued training | 1.3B LAION samples | 4 steps × 8 pairs | learning rate, steps and batch chosen on the validation pairs for sparse upcycling (`scripts/tune_03.py`), the same for every method | same | LAION (not here) |
# | evaluation | zero-shot MSCOCO R@1, ImageNet variants, VTAB | R@1 both ways at init and at the end on 10 test pairs | 300 test pairs + suite embedding benchmarks (smoke sizes, every seed) | 300 pairs + benchmarks (default sizes; every seed of sparse and cluster-aware) | — |
# | analyses | 4 panels | at init and at the end on a fixed held-out token set | same (64 held-out sentences) | same | — |
# | methods | dense, dense long, Drop, sparse, CLIP-MoE, DeRS, ours | dense, sparse, Drop, ours | dense, sparse, ours | + dense long, noise, Drop, 2×2 ablation (cluster init × EESD) | — |
# | seeds | 1 | 1 | 3 | 3 | — |
# | **vision** dense model | CLIP ViT-B (image tower) | ViT d=64, 4 layers, pretrained here on Fashion-MNIST (20 steps) | — | ViT d=128, 6 layers, patch 7, pretrained here on Fashion-MNIST (500 steps × 128) | — |
# | **vision** continued training, FT | 1.3B samples; ImageNet-1k 5-/10-shot, full fine-tuning | 3 steps; 3 FT steps | — | 120 steps × 128 Fashion-MNIST images; fine-tuning 40 steps × 64 on 1000 CIFAR-10 (grey 28×28) images, 1000 evaluation images | — |
# | **vision** methods, seeds | dense, Drop, sparse, CLIP-MoE, ours | dense, sparse, ours; 1 | — | dense, sparse, Drop, ours; 3 | — |
#
# Choices the poster leaves open (each stated where it is used): the spectral-energy threshold (0.99 here), which
# projection is truncated (the FFN input projection only), which calibration tokens are clustered (special tokens
# excluded), the EMA decay and EESD weight, and the definition of "relative compactness".

# %% tags=["parameters"]
PROFILE = "default"
SEED = 0
CLIP_PATH = None  # paper profile: a local open_clip checkpoint of CLIP ViT-B/32 or B/16

# %%
import json
import warnings
from pathlib import Path

import pandas as pd
from IPython.display import display

import moelab
from moelab import cluster_upcycling as cu

run = moelab.start_run("03_cluster_upcycling", profile=PROFILE, seed=SEED)
SEEDS3 = [SEED, SEED + 1, SEED + 2]
# Training settings: chosen on the validation pairs for sparse upcycling by scripts/tune_03.py (read back here);
# until that choice exists, the settings this notebook used before issue 21 (stated in the printout below).
TUNING_DIR = Path(moelab.__file__).resolve().parents[2] / "data" / "tuning" / "03_cluster_upcycling"
FALLBACK = {"default": dict(lr=1e-4, steps=6, batch_size=12), "full": dict(lr=1e-4, steps=24, batch_size=12)}
tuned = cu.tuned_settings(TUNING_DIR, FALLBACK["full" if PROFILE == "full" else "default"])
if PROFILE == "smoke":
    tuned = dict(lr=1e-4, steps=4, batch_size=8, candidate=None,
                 source="smoke: fixed tiny settings (the validation choice applies to default and full)")
common = dict(num_experts=8, top_k=2, energy=0.99, eesd_weight=0.1, aux_coef=0.01, special_tokens="exclude",
              lr=tuned["lr"], steps=tuned["steps"], batch_size=tuned["batch_size"],
              eesd_decay=cu.eesd_decay_for(tuned["steps"]))
# Budget, estimated from timed pieces on the shared 2-core machine (1 thread): a run costs ~25 CPU s (build, R@1 at
# init and end on 300 pairs, analyses) + 1.3 s per step (sparse, Drop, noise, batch 16) or 2.1 s (with EESD);
# default with 120 steps ~ 25 min; full with 120 steps ~ 105 min (text ~ 80, benchmarks ~ 7, vision ~ 20).
# Every (method, seed) run is cached on its own, so an interrupted run resumes run by run.
cfg = moelab.profiles.select(
    PROFILE,
    smoke=dict(methods=["dense", "sparse", "drop", "cluster_eesd"], seeds=[SEED], n_test=48, n_probe=24,
               calib_texts=96, calib_tokens=2048, benchmarks=None, max_len=24, bench_all_seeds=False,
               vision=dict(methods=["dense", "sparse", "cluster_eesd"], seeds=[SEED], data_profile="smoke",
                           vit=dict(cu.VIT_SMALL, hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
                                    intermediate_size=128),
                           pretrain_steps=20, pretrain_batch=64, pretrain_lr=1e-3, calib_images=64,
                           calib_tokens=1088, n_test=200, n_cifar_train=300, n_cifar_test=100, steps=3,
                           batch_size=32, lr=2e-4, shots=(), probe_draws=0, ft_steps=3, ft_batch=32,
                           ft_lr=5e-4, eesd_decay=0.9)),
    default=dict(methods=["dense", "sparse", "cluster_eesd"], seeds=SEEDS3, n_test=300, n_probe=64,
                 calib_texts=256, calib_tokens=6144, benchmarks="smoke", max_len=24, bench_all_seeds=True,
                 vision=None),
    full=dict(methods=["dense", "dense_long", "sparse", "noise", "drop", "cluster", "sparse_eesd", "cluster_eesd"],
              seeds=SEEDS3, n_test=300, n_probe=64, calib_texts=512, calib_tokens=8192, benchmarks="default",
              max_len=24, bench_all_seeds=["sparse", "cluster_eesd"],
              vision=dict(methods=["dense", "sparse", "drop", "cluster_eesd"], seeds=SEEDS3, data_profile="full",
                          vit=cu.VIT_SMALL, pretrain_steps=500, pretrain_batch=128, pretrain_lr=1e-3,
                          calib_images=512, calib_tokens=8192, n_test=2000, n_cifar_train=1000, n_cifar_test=1000,
                          steps=120, batch_size=128, lr=2e-4, shots=(), probe_draws=0, ft_steps=40, ft_batch=64,
                          ft_lr=5e-4, eesd_decay=0.99)),
    paper=dict(methods=[], seeds=[SEED], n_test=0, n_probe=0, calib_texts=0, calib_tokens=0, benchmarks=None,
               max_len=32, bench_all_seeds=False, vision=None),
)
cfg = {**common, **cfg}
run.save_json({**{k: v for k, v in cfg.items() if k != "vision"}, "vision": cfg["vision"] and
               {k: v for k, v in cfg["vision"].items() if k != "vit"}, "tuned": tuned}, "config")
cfg

# %% [markdown]
# ## Paper profile: CLIP ViT-B in open_clip's format
# The paper's backbone is not obtainable here. With `PROFILE="paper"` the notebook reads the MLP weights of a local
# open_clip checkpoint (`visual.transformer.resblocks.{i}.mlp.c_fc/c_proj`) and stops with `MissingAsset` when the
# file is absent; its format handling is unit-tested on a tiny state dict in that layout (`tests/test_cluster_upcycling.py`).
# Running CLIP forward (to collect its activations) needs `open_clip`, which is not installed here.

# %%
if PROFILE == "paper":
    blocks = cu.load_openclip_mlps(CLIP_PATH)  # MissingAsset when CLIP_PATH is absent
    print(f"{len(blocks)} MLP blocks read; every other one ({sorted(blocks)[1::2]}) would become an MoE layer")

# %% [markdown]
# ## Data and the dense model
# The dense model is the real all-MiniLM-L6-v2. Training, validation and test pairs come from the suite's embedding
# pairs (`moelab.suite.embed.pairs`); the test pairs stand in for MSCOCO image–caption pairs, and Recall@1 is
# measured in both directions (anchor→positive as "I→T", positive→anchor as "T→I"). The validation pairs are used
# only to choose the training settings; the analyses use the first test anchors as a fixed held-out token set.

# %%
st = moelab.assets.load_minilm()
pairs = moelab.suite.embed.pairs(PROFILE if PROFILE != "paper" else "full")
benchmarks = moelab.suite.embed.benchmarks(cfg["benchmarks"]) if cfg["benchmarks"] else None
print({k: len(v) for k, v in pairs.items()}, "benchmarks:", None if benchmarks is None else sorted(benchmarks),
      f"(sizes of the suite's {cfg['benchmarks']!r} profile)")

# %% [markdown]
# ## Training settings, chosen on validation for the baseline
# The earlier version of this notebook trained for 6–24 steps at learning rate $10^{-4}$: the routers barely moved,
# so every "after training" analysis measured the initialisation. Here the learning rate, number of steps and batch
# size are chosen by `scripts/tune_03.py` for **sparse upcycling** (the baseline, not the method) on the
# **validation** pairs (R@1, mean of both directions; the test pairs are never read there) and used for every method.
# The table lists every candidate (seed means) with how far its router moved on held-out tokens. The EESD decay is
# not tuned (sparse upcycling has no EESD): its EMA horizon $1/(1-\text{decay})$ is a tenth of the run, at least 5 steps.

# %%
print(f"Training settings: lr {cfg['lr']:g}, {cfg['steps']} steps x {cfg['batch_size']} pairs, EESD decay "
      f"{cfg['eesd_decay']:.3f} -- {tuned['source']}.")
tuning_file = TUNING_DIR / "tuning_summary.json"
if PROFILE in ("default", "full") and tuning_file.exists():
    tuning = json.loads(tuning_file.read_text())
    cand = pd.DataFrame(tuning.get("summary", []))
    if len(cand):
        run.save_table(cand, "tuning", "candidates", caption="sparse upcycling on the validation pairs: one row per "
                       "candidate (seed means), from scripts/tune_03.py")
        display(cand.round(4))
    ch = tuning.get("choice")
    if ch:
        run.save_table(pd.DataFrame([{k: v for k, v in ch.items() if k not in ("settings", "provenance")}
                                     | ch["settings"]]), "tuning", "choice", caption="the chosen candidate")
        fmt = lambda x, spec: "n/a" if x is None else format(x, spec)  # noqa: E731  (one candidate, one seed)
        print(f"Chosen: {ch['candidate']} (validation R@1 {ch['val_r1_mean']:.2f} over {ch['seeds']} seeds; runner-up "
              f"{ch['runner_up']} by {fmt(ch['margin'], '+.2f')} points; pooled seed s.d. "
              f"{fmt(ch['pooled_seed_sd'], '.2f')}); the untrained dense model scores "
              f"{tuning['references']['dense_val_r1']:.2f} on the same pairs.")

# %% [markdown]
# ## Steps 1–3: cluster-aware initialisation on the real activations, and the special tokens
# For every converted FFN (layers 1, 3, 5): collect its inputs $X$ over the calibration sentences (streamed,
# cached), spherical k-means $\{\mu_i\} = \arg\max_{\|\mu_i\|=1}\sum_j \max_i \mu_i^\top x_j$ (written by hand:
# scikit-learn has no spherical k-means), whitening $S_i$ from the Cholesky factor of $X_i X_i^\top$ (float64,
# SVD-LLM's jitter when singular), rank $r_i$ = smallest $r$ keeping 99% of the spectral energy of $W S_i$
# (so each expert's pre-activations on its own cluster keep $\ge 99\%$ of their energy:
# $\|WX_i-\widetilde W_iX_i\|_F^2=\sum_{j>r_i}\sigma_{ij}^2$, unit-tested), router $W_r=[\mu_1^\top;\dots]$.
# Only the input projection is truncated: the collected activations are exactly its inputs, while the output
# projection's inputs are 1536-wide and would need far more tokens per cluster than we calibrate with.
# The poster gives no threshold. We use 0.99: on MiniLM one direction (the mean of the LayerNorm outputs) carries
# most of the energy of $WS_i$, so lower thresholds left only a handful of directions per expert.
#
# **Special tokens.** The poster clusters "all FFN inputs". In MiniLM, [CLS] and [SEP] occur once per sentence, in
# directions of their own; clustered with the rest they can form a cluster by themselves (an expert whitened by
# one token type). This notebook **excludes them from the clustering** (`special_tokens="exclude"`: Steps 1–3 on the
# ordinary tokens; at run time the centroid router sends a special token to its nearest centroid like any other).
# The table compares the three handlings on the same calibration set (initialisation only): `include` (the poster's
# literal reading), `own_expert` (the special tokens get expert 8), `exclude`.

# %%
if cfg["methods"]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # rank-deficient clusters (smoke) get jitter, by design
        calib, special = cu.text_calibration(st, pairs, cfg["calib_texts"], cfg["calib_tokens"], cfg["max_len"])
        logs = cu.special_token_logs(st, calib, special, seed=SEED, num_experts=cfg["num_experts"],
                                     top_k=cfg["top_k"], energy=cfg["energy"])
    ranks = cu.special_token_ranks_table(logs)
    run.save_table(ranks, "init", "special_token_ranks", caption="per-expert cluster size, special-token share and "
                   "rank r_i under each special-token handling (initialisation only)")
    sp = cu.special_token_summary(ranks)
    run.save_table(sp, "init", "special_token_summary", caption="per handling and MoE layer: the expert with the "
                   "largest special-token share, its rank, the other experts' median rank")
    display(sp.round(3))
    inc = sp[sp["special_tokens"] == "include"]
    print(f"The calibration set holds {int(special.sum())} special tokens among {len(special)}. Clustered with the "
          f"rest ('include'), the most special-token-heavy cluster per MoE layer holds "
          + ", ".join(f"{s:.0%}" for s in inc["top_special_share"]) + " special tokens, with rank "
          + ", ".join(f"{int(r)}" for r in inc["top_rank"]) + " (other experts' median rank "
          + ", ".join(f"{r:.0f}" for r in inc["median_rank_others"]) + "). This notebook uses "
          f"'{cfg['special_tokens']}'.")

# %% [markdown]
# ## Step 4 and training: EESD and continued contrastive training
# Every model trains its MoE layers (experts and routers; the dense baseline "trained as long" trains the same
# three FFNs) with in-batch InfoNCE (= sentence-transformers' MultipleNegativesRankingLoss, scale 20) through
# `moelab.train`, plus 0.01 × the Switch balancing loss. Cluster-aware upcycling adds
# $\mathcal L_\mathrm{EESD}=\frac1T\sum_x\|\mathrm{sg}(y_\mathrm{ens}(x))-y_\mathrm{MoE}(x)\|_2^2$ summed over the
# three MoE layers, with $y_\mathrm{ens}(x)=\sum_{i=1}^{8} g_i^\mathrm{ema}(x)E_i^\mathrm{ema}(x)$ from an EMA copy
# of each MoE layer (weight 0.1: EESD near a tenth of the InfoNCE loss at the start). Each run is measured before
# training (R@1 and the analyses on the initialised model) and at the end.

# %%
if cfg["methods"]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        results = cu.text_experiment(st, pairs, cfg["methods"], cfg["seeds"], calib_texts=cfg["calib_texts"],
                                     calib_tokens=cfg["calib_tokens"], n_test=cfg["n_test"], n_probe=cfg["n_probe"],
                                     benchmarks=benchmarks, bench_all_seeds=cfg["bench_all_seeds"],
                                     special_tokens=cfg["special_tokens"], steps=cfg["steps"],
                                     batch_size=cfg["batch_size"], lr=cfg["lr"], max_len=cfg["max_len"],
                                     energy=cfg["energy"], eesd_decay=cfg["eesd_decay"],
                                     eesd_weight=cfg["eesd_weight"], aux_coef=cfg["aux_coef"],
                                     num_experts=cfg["num_experts"], top_k=cfg["top_k"])
    runs = cu.run_summary(results)
    run.save_table(runs, "table1", "runs", caption="one row per (method, seed): R@1 at init and end, training loss, "
                   "router movement and analyses (mean over MoE layers), wall seconds")
    init = cu.init_table(results)
    run.save_table(init, "init", "cluster_ranks", caption="cluster sizes and effective ranks r_i per expert")
    if len(init):
        display(init.groupby("moe_layer").agg(rank_mean=("rank", "mean"), rank_min=("rank", "min"),
                                              rank_max=("rank", "max"), size_min=("cluster_size", "min"),
                                              err_max=("rel_err_own_cluster", "max")))
        print(f"Effective ranks r_i range from {int(init['rank'].min())} to {int(init['rank'].max())} of 384 "
              f"(mean {init['rank'].mean():.0f}); the largest relative error on an expert's own cluster is "
              f"{100 * init['rel_err_own_cluster'].max():.2f}% (threshold 1%).")
    print(f"{len(runs)} text runs, {runs.get('wall_s', pd.Series(dtype=float)).sum() / 60:.1f} min of run time in "
          "total (runs served from the cache count the time they took when first run).")

# %% [markdown]
# ## Retrieval at initialisation and at the end
# R@1 (%) on the held-out test pairs. The poster compares models after 1.3B samples; ours are short runs, so each
# method is read at both ends. Sparse upcycling starts exactly at the dense model (function-preserving); a method
# that starts *below* it was damaged by its initialisation, and the end shows whether training repaired it. The
# poster's Drop-Upcycling row ends 1.9 points above its dense starting point (42.7 vs 40.8, ViT-B/16): the damage
# was repaired there.

# %%
if cfg["methods"]:
    r1, r1_init = cu.r1_table(results), cu.r1_table(results, "init")
    run.save_table(r1, "table1", "zero_shot_r1", caption="Recall@1 (%) both ways on held-out suite pairs, end of "
                   "training")
    run.save_table(r1_init, "table1", "r1_init", caption="Recall@1 (%) of the initialised models, before training")
    summary = pd.concat({"init": r1_init.groupby("method", sort=False)["r1_avg"].agg(["mean", "std"]),
                         "end": r1.groupby("method", sort=False)["r1_avg"].agg(["mean", "std"])}, axis=1).round(2)
    display(summary)
    run.savefig(cu.plot_r1_init_end(r1, r1_init), "table1", "r1_bars",
                caption="R@1 per method at the end (bars: mean over seeds; dots: seeds), open markers at init")
    damage = cu.init_damage_table(r1_init, r1) if "dense" in set(r1["method"]) else pd.DataFrame()
    if len(damage):
        run.save_table(damage, "table1", "init_damage", caption="R@1 gap to the untrained dense model at init and "
                       "at the end, per method and seed (points)")
        dm = damage.groupby("method", sort=False)[["gap_init", "gap_final", "repair"]].mean().round(2)
        display(dm)
        for m, row in dm.iterrows():
            state = ("not below the dense model at init" if row["gap_init"] >= 0 else
                     "damage at init repaired" if row["gap_final"] >= 0 else "damage at init not repaired")
            print(f"{m}: gap to the dense model {row['gap_init']:+.2f} points at init, {row['gap_final']:+.2f} at the "
                  f"end ({state}, seed means).")

# %%
if cfg["methods"] and benchmarks is not None:
    bench = cu.benchmark_table(results)
    run.save_table(bench, "table1", "suite_benchmarks", caption="suite embedding benchmarks per method and seed")
    keys = [c for c in bench.columns if c not in ("method", "seed", "score")]
    display(bench.pivot_table(index=keys, columns="method", values="score", aggfunc="mean").round(4))

# %% [markdown]
# ## Analyses at initialisation and at the end (the poster's four panels)
# On a fixed held-out token set (the first test anchors, the same tokens for every method and both times), per MoE
# layer, for **every** MoE method of the run:
# 1. **Relative compactness** (our reading of "more disentangled expert subspaces"): within-expert scatter over total
#    scatter of the unit-normalised layer inputs, tokens grouped by their top-1 expert,
#    $\mathrm{RC}=\sum_i\sum_{x\in C_i}\|\hat x-m_i\|^2/\sum_x\|\hat x-m\|^2$ (1 = routing unrelated to geometry).
#    For the cluster router at init the groups *are* the k-means partition, which minimises this scatter by design.
# 2. **Expert similarity**: the poster's parameter similarity (mean pairwise cosine of the experts' flattened
#    weights; 1 for copied experts by construction) and, as the specialisation measure, the **expert-output
#    similarity**: mean pairwise cosine of the experts' outputs on the same held-out layer inputs.
# 3. **Routing entropy** $H(\mathrm{softmax}(W_rx))/\log E$ on the fixed held-out batch at fixed steps (step 0 =
#    initialisation): the training batches' entropies differ batch to batch, and that noise alone mimics
#    "explores then restabilises".
# 4. **Expert utilisation**: share of top-2 assignments per expert.
#
# **Router movement**: the share of held-out tokens whose top-1 expert changed between init and the end. For
# cluster-aware upcycling the top-1 at init is the k-means partition, so agreement with it is 1 at init by
# definition: it says only how far the router moved, never how good it is. The `at_init` column of the table below
# names what the initialisation fixes of a metric by definition.

# %%
if cfg["methods"]:
    moe_methods = [m for m in cfg["methods"] if cu.METHODS[m][0]]
    res_moe = [r for r in results if r["method"] in moe_methods]
    ana, ent, util = cu.analysis_table(res_moe), cu.entropy_history(res_moe), cu.utilisation_table(res_moe)
    ent_heldout, movement = cu.heldout_entropy_table(res_moe), cu.router_movement_table(res_moe)
    run.save_table(ana, "analysis", "panels", caption="relative compactness, expert parameter and output similarity, "
                   "routing entropy, utilisation balance, router agreement with init per method, seed, MoE layer, "
                   "at init and after training, on the fixed held-out token set")
    run.save_table(ent, "analysis", "entropy_steps", caption="routing entropy of the training batches per step "
                   "(batch-to-batch noise; the trajectory is entropy_heldout)")
    run.save_table(ent_heldout, "analysis", "entropy_heldout", caption="routing entropy on a fixed held-out batch "
                   "at fixed steps (step 0 = initialisation)")
    run.save_table(movement, "analysis", "router_movement", caption="router movement: top-1 agreement with the "
                   "init router, entropy and expert-output similarity at init and at the end")
    run.save_table(util, "analysis", "utilisation", caption="final expert utilisation")
    ie = cu.init_end_table(ana)
    run.save_table(ie, "analysis", "init_vs_end", caption="every analysis at init and at the end per method (mean "
                   "over MoE layers and seeds), its change, and what the initialisation fixes by definition")
    display(ie.round(4))
    run.savefig(cu.plot_analysis_panels(ana, ent_heldout, util, moe_methods), "analysis", "four_panels",
                caption="poster analysis panels 1-4 at the end (open markers: init), held-out entropy trajectory")
    run.savefig(cu.plot_router_movement(movement, moe_methods), "analysis", "router_movement",
                caption="share of held-out tokens whose top-1 expert moved, and the entropy change, per method")
    mv = movement.groupby("method", sort=False)[["top1_moved", "entropy_init", "entropy_final",
                                                 "output_similarity_init", "output_similarity_final"]].mean()
    for m, row in mv.iterrows():
        print(f"{m}: {row['top1_moved']:.1%} of held-out tokens changed their top-1 expert; routing entropy "
              f"{row['entropy_init']:.3f} -> {row['entropy_final']:.3f}; expert-output similarity "
              f"{row['output_similarity_init']:.4f} -> {row['output_similarity_final']:.4f} (seed means).")
    still = [m for m, row in mv.iterrows() if row["top1_moved"] < 0.05]
    if still:
        print(f"The routers of {', '.join(still)} kept the top-1 expert of more than 95% of held-out tokens: with "
              f"{cfg['steps']} steps at lr {cfg['lr']:g} their analyses after training still describe the "
              "initialisation, and the claims below say so.")

# %% [markdown]
# ## Vision: a small ViT stands in for CLIP ViT-B (`full` only)
# The poster upcycles the image tower of CLIP ViT-B/32 and B/16 and reports ImageNet-1k 5-shot, 10-shot and
# **full fine-tuning** accuracy (dense 72.8, sparse upcycling 73.0, Drop-Upcycling 73.1, cluster-aware 73.3 for FT).
# No CLIP weights or ImageNet are available here, so the same protocol runs on a dense model we pretrain ourselves:
# a `transformers` ViT (7×7 patches on 28×28 images: 16 patch tokens + CLS) trained on the real Fashion-MNIST
# training images (cached, with its test accuracy), upcycled with the same initialisers (CLS excluded from the
# clustering, as [CLS] in the text model), continued on Fashion-MNIST with all parameters trainable, then
# **fine-tuned** end to end with a fresh 10-way head on CIFAR-10 images converted to 28×28 grey, with 3 seeds (the
# dense model is fine-tuned with each seed too). The poster's gaps are 0.1–0.5 points; the claims report the MDE of
# our seed-level comparison, and `underpowered` is the expected honest verdict. The **few-shot linear probes are not
# run**: on this ViT they carry no signal (an earlier run scored them below a raw-pixel probe), so they could not
# test the poster's few-shot gains. Nothing else transferable (image data or ViT weights) ships in the packages.

# %%
vision = cfg["vision"]
if vision:
    vcfg = {**{k: cfg[k] for k in ("num_experts", "top_k", "energy", "eesd_weight", "aux_coef", "special_tokens")},
            **vision}
    vres = cu.vision_experiment(vision["methods"], vision["seeds"], vcfg)
    pre = vres["pretrain"].iloc[0]
    run.save_table(vres["pretrain"], "table2", "vit_pretraining", caption="dense ViT pretrained on Fashion-MNIST")
    run.save_table(vres["accuracy"], "table2", "vit_fewshot_ft", caption="accuracy (%) per method, seed and task: "
                   "Fashion-MNIST test, CIFAR-10 (grey 28x28) fine-tuning")
    run.save_table(vres["timing"], "table2", "vit_timing", caption="wall seconds per phase")
    if len(vres["history"]):
        run.save_table(vres["history"], "table2", "vit_training", caption="continued training per step")
    vinit = cu.init_table(vres["results"])
    if len(vinit):
        run.save_table(vinit, "init", "vit_cluster_ranks", caption="ViT: cluster sizes and ranks r_i per expert")
    vtab = cu.vision_table(vres["accuracy"])
    display(vtab)
    run.savefig(cu.plot_vision(vres["accuracy"], vision["methods"]), "table2", "vit_bars",
                caption="ViT: accuracy per task and method (bars: mean over seeds; dots: seeds)")
    print(f"The dense ViT saw {int(pre['images_seen'])} Fashion-MNIST images ({pre['epochs']:.2f} epochs) and reaches "
          f"{pre['test_accuracy']:.1f}% test accuracy.")
    for t in [c for c in vtab.columns if not c.endswith("_std")]:
        print(f"{t}: " + ", ".join(f"{m} {vtab.loc[m, t]:.2f} ± {vtab.loc[m, t + '_std']:.2f}%"
                                   for m in vtab.index) + " (mean ± s.d. over seeds)")

# %% [markdown]
# ## Claims
#
# The verdicts are computed from the tables saved above, without rerunning anything, by the claim definitions in
# `moelab.claims.defs.nb03_cluster_upcycling` (one per claim, with the poster's numbers in points beside it; the
# verdict rule is in docs/CLAIMS.md). Trained comparisons use per-seed values and a t-interval over seeds, with the
# minimum detectable effect (MDE) of that comparison; the poster's gaps are 0.2–0.9 points after 1.3B samples, so
# `underpowered` is the honest verdict wherever our MDE is larger. An analysis whose value after training equals its
# value at initialisation holds *by the initialisation* (`holds by construction`), as do the poster's statements
# about the initialisation itself (confident routing at init, Drop-Upcycling's disruption); the entropy trajectory
# is one slope test on the fixed held-out batch, with its noise null stated. Drop-Upcycling is compared with
# cluster-aware upcycling only once its initialisation damage is repaired.

# %%
claims = run.finish()
claims
