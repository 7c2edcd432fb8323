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
# The poster's setting beside each profile is printed below from `moelab.cluster_upcycling.config` (the table is
# what runs).
#
# Choices the poster leaves open (each stated where it is used): the spectral-energy threshold (0.99 here), which
# projection is truncated (the FFN input projection only), which calibration tokens are clustered (special tokens
# excluded), the EMA decay and EESD weight, and the definition of "relative compactness".

# %% tags=["parameters"]
PROFILE = "default"
SEED = 0
DRY_RUN = False  # paper profile only: every paper-path cell on cut sizes (run --profile paper --dry-run)
CLIP_PATH = None  # paper profile: a local open_clip checkpoint of CLIP ViT-B/32 or B/16 (folder or file)
PAIRS_PATH = None  # paper profile: a folder of image-text pairs (train.tsv/csv/jsonl, test.tsv/csv/jsonl + images)

# %%
import pandas as pd
from IPython.display import display

import moelab
from moelab import cluster_upcycling as cu

# %%
run = moelab.start_run("03_cluster_upcycling", profile=PROFILE, seed=SEED, dry_run=DRY_RUN)
C = cu.config_for(PROFILE, dry_run=DRY_RUN)
tuned = cu.training_settings(C.fallback_training, C.fixed_training, C.fixed_training_source)
cfg = C.settings(SEED, tuned, eesd_decay=cu.eesd_decay_for(tuned["steps"]))
run.save_json({**{k: v for k, v in cfg.items() if k != "vision"}, "vision": cfg["vision"] and
               {k: v for k, v in cfg["vision"].items() if k != "vit"}, "tuned": tuned}, "config")
display(cu.profile_table(PROFILE))

# %%
if DRY_RUN:  # what the paper profile's dry run cuts (sizes only; the model, data and every switch are the paper's)
    cuts = cu.dry_run_table()
    run.save_table(cuts, "dry-run", "cuts", caption="settings the dry run cuts, and the switches it keeps")
    display(cuts)

# %% [markdown]
# ## Paper profile: the poster's experiment on your CLIP and image-text pairs
# With `PROFILE="paper"` the notebook runs the poster's experiment itself: `CLIP_PATH` is an open_clip checkpoint of
# CLIP ViT-B/32 or B/16 (as on the Hub: `open_clip_pytorch_model.bin`, `open_clip_config.json` and the CLIP
# tokenizer's `vocab.json` + `merges.txt`; or open_clip's `epoch_N.pt` with those files beside it), mapped onto
# transformers' `CLIPModel` (the same network, tested against open_clip's forward written out in PyTorch);
# `PAIRS_PATH` is a folder with `train` and `test` files of image-text pairs, in open_clip's CSV format (`.tsv`
# tab-separated or `.csv`, columns `filepath` and `title`) or JSONL (`{"image": ..., "caption": ...}`), image paths
# relative to the folder: LAION-style pairs for continued training and MSCOCO's 5,000 Karpathy test images (one row
# per caption) for zero-shot retrieval. Every other MLP of the **image tower** is upcycled (8 experts, top-2; the
# CLS token is the special token), all of CLIP is trained with open_clip's contrastive loss for 1.3B samples, and
# every section below reads the same tables as the CPU profiles (R@1 is image→text and text→image).
# Both paths are checked here, within seconds, before any work (`MissingAsset` or an `InputFormatError` naming the
# parameter, file, field and fix). Not run: zero-shot ImageNet/VTAB, ImageNet few-shot and fine-tuning.

# %%
if C.clip:
    clip = cu.load_clip(CLIP_PATH)
    pairs = cu.load_image_text_pairs(PAIRS_PATH, cfg)
    print(clip.describe(), pairs.describe(), sep="\n")

# %% [markdown]
# ## Data and the dense model
# The dense model is the real all-MiniLM-L6-v2. Training, validation and test pairs come from the suite's embedding
# pairs (`moelab.suite.embed.pairs`); the test pairs stand in for MSCOCO image–caption pairs, and Recall@1 is
# measured in both directions (anchor→positive as "I→T", positive→anchor as "T→I"). The validation pairs are used
# only to choose the training settings; the analyses use the first test anchors as a fixed held-out token set.

# %%
if not C.clip:  # the paper profile read its model and pairs above
    st = moelab.assets.load_minilm()
    pairs = moelab.suite.embed.pairs(C.pairs_profile)
    benchmarks = moelab.suite.embed.benchmarks(C.benchmarks) if C.benchmarks else None
    print({k: len(v) for k, v in pairs.items()}, "benchmarks:", None if benchmarks is None else sorted(benchmarks),
          f"(sizes of the suite's {C.benchmarks!r} profile)")
else:
    benchmarks = None

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
tuning = cu.tuning_tables(cu.TUNING_DIR / "tuning_summary.json") if C.show_tuning else {}
if len(tuning.get("candidates", [])):
    run.save_table(tuning["candidates"], "tuning", "candidates", caption="sparse upcycling on the validation pairs: "
                   "one row per candidate (seed means), from scripts/tune_03.py")
if tuning.get("choice") is not None:
    run.save_table(tuning["choice"], "tuning", "choice", caption="the chosen candidate")
print(tuning.get("sentence", ""))

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
    special = (cu.clip_special_token_study(clip, pairs, cfg, seed=SEED) if C.clip else
               cu.special_token_study(st, pairs, cfg, seed=SEED))
    run.save_table(special["ranks"], "init", "special_token_ranks", caption="per-expert cluster size, special-token "
                   "share and rank r_i under each special-token handling (initialisation only)")
    run.save_table(special["summary"], "init", "special_token_summary", caption="per handling and MoE layer: the "
                   "expert with the largest special-token share, its rank, the other experts' median rank")
    display(special["summary"].round(3))
    print(cu.special_token_sentence(special, cfg["special_tokens"]))

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
results = ((cu.clip_runs(clip, pairs, cfg) if C.clip else cu.text_runs(st, pairs, cfg, benchmarks))
           if cfg["methods"] else [])
if results:
    run.save_table(cu.run_summary(results), "table1", "runs", caption="one row per (method, seed): R@1 at init and "
                   "end, training loss, router movement and analyses (mean over MoE layers), wall seconds")
    init = cu.init_table(results)
    run.save_table(init, "init", "cluster_ranks", caption="cluster sizes and effective ranks r_i per expert")
    if len(init):
        display(cu.init_rank_summary(init))
    print(cu.init_sentence(init), cu.runs_sentence(cu.run_summary(results)), sep="\n")

# %% [markdown]
# ## Retrieval at initialisation and at the end
# R@1 (%) on the held-out test pairs. The poster compares models after 1.3B samples; ours are short runs, so each
# method is read at both ends. Sparse upcycling starts exactly at the dense model (function-preserving); a method
# that starts *below* it was damaged by its initialisation, and the end shows whether training repaired it. The
# poster's Drop-Upcycling row ends 1.9 points above its dense starting point (42.7 vs 40.8, ViT-B/16): the damage
# was repaired there.

# %%
if results:
    r1, r1_init = cu.r1_table(results), cu.r1_table(results, "init")
    run.save_table(r1, "table1", "zero_shot_r1", caption="Recall@1 (%) both ways on held-out suite pairs, end of "
                   "training")
    run.save_table(r1_init, "table1", "r1_init", caption="Recall@1 (%) of the initialised models, before training")
    display(cu.r1_summary(r1, r1_init))
    run.savefig(cu.plot_r1_init_end(r1, r1_init), "table1", "r1_bars",
                caption="R@1 per method at the end (bars: mean over seeds; dots: seeds), open markers at init")

# %% [markdown]
# The gap to the untrained dense model, $\Delta = \mathrm{R@1}_\text{method} - \mathrm{R@1}_\text{dense}$, at init
# and at the end: a method damaged by its initialisation ($\Delta_\text{init}<0$) is repaired when
# $\Delta_\text{end}\ge 0$.

# %%
damage = cu.init_damage_table(r1_init, r1) if results and "dense" in set(r1["method"]) else pd.DataFrame()
if len(damage):
    run.save_table(damage, "table1", "init_damage", caption="R@1 gap to the untrained dense model at init and "
                   "at the end, per method and seed (points)")
    display(cu.damage_summary(damage))
    print(cu.damage_sentences(cu.damage_summary(damage)))

# %%
if results and benchmarks is not None:
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
if results:
    moe_methods = [m for m in cfg["methods"] if cu.METHODS[m][0]]
    tabs = cu.analysis_tables(results, moe_methods)
    for name, table in tabs.items():
        run.save_table(table, "analysis", name, caption=cu.ANALYSIS_CAPTIONS[name])
    display(tabs["init_vs_end"].round(4))

# %%
if results:
    run.savefig(cu.plot_analysis_panels(tabs["panels"], tabs["entropy_heldout"], tabs["utilisation"], moe_methods),
                "analysis", "four_panels", caption="poster analysis panels 1-4 at the end (open markers: init), "
                "held-out entropy trajectory")
    run.savefig(cu.plot_router_movement(tabs["router_movement"], moe_methods), "analysis", "router_movement",
                caption="share of held-out tokens whose top-1 expert moved, and the entropy change, per method")
    print(cu.movement_sentences(tabs["router_movement"], cfg["steps"], cfg["lr"]))

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
vres = cu.vision_experiment(vision["methods"], vision["seeds"], cu.vision_settings(cfg)) if vision else None
if vision:
    for (section, name), table in cu.vision_tables(vres).items():
        run.save_table(table, section, name, caption=cu.VISION_CAPTIONS[(section, name)])
    vtab = cu.vision_table(vres["accuracy"])
    display(vtab)
    run.savefig(cu.plot_vision(vres["accuracy"], vision["methods"]), "table2", "vit_bars",
                caption="ViT: accuracy per task and method (bars: mean over seeds; dots: seeds)")
    print(cu.vision_sentences(vres["pretrain"], vtab))

# %% [markdown]
# ## Claims
#
# The verdicts are computed from the tables saved above, without rerunning anything, by the claim definitions in
# `moelab.cluster_upcycling.claims` (one per claim, with the poster's numbers in points beside it; the
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
