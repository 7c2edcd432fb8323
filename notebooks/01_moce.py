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
# # 01 · Mixture-of-Clustered-Experts (MoCE): dual-stage routing for instruction tuning
#
# Eo et al. split MoE routing in two stages. **Stage 1 (sequence level):** an encoder embeds the input sequence,
# a k-means model trained in advance assigns it to a cluster α, and the cluster picks an expert group 𝒢_α with its own
# router ℛ^α (k from the elbow of the SSE curve, App. B). **Stage 2 (token level):** ℛ^α routes each token to the top-k
# of the group's N experts. Experts are PESC adapters on the frozen dense FFN E (Wu et al. 2024):
#
# $$y = \sum_{i=1}^{N} \mathrm{TopK}(\mathcal R^\alpha(x)_i, k)\,\mathcal A_i^{\mathcal G_\alpha}(x)\quad\text{(Eq. 5)},\qquad
#   y \mathrel{+}= \sum_{j=1}^{N} \mathrm{TopK}(\mathcal R^{gen}(x)_j, k)\,\mathcal A_j^{gen}(x)\quad\text{(Eq. 6, variant V)}$$
#
# with $\mathcal A_i(x) = E(x) + s\,W_\mathrm{up}^i\,\sigma(W_\mathrm{down}^i E(x))$. The paper reports that MoCE beats
# an adapter, BTX(A), PESC and domain-specialised PESC models (Table 1: average 37.99 vs PESC 35.62), that general
# experts help, that more experts per group help (Table 3), and that top-2 / soft merging beat top-1 and both
# routing stages are needed (Table 4).
#
# The paper's setting beside each profile is printed below from `moelab.moce.config` (the table is what runs).
#
# Wall times of each profile: the README's timings table. **Readings we had to choose (stated once here).**
# (1) PESC's router (softmax over the k kept logits, so top-k weights sum to 1) for k ≥ 2; for the top-1 ablation the
# softmax over the group's N experts of Eqs. 1-3 (a softmax over one kept logit is 1 and would leave the router without
# a task gradient); (2) in Eq. 6 the shared E(x) is counted once, $y = E(x) + \sum_i w_i\Delta_i + \sum_j w_j\Delta^{gen}_j$
# (summing two full adapter mixtures would double E(x)); (3) the standard Switch/GShard balancing loss (coefficient
# 0.01) per group over the group's tokens, since PESC's own loss gives the router no gradient; (4) the clusterer sees
# the instruction only, never the answer, at training and at evaluation time; (5) the prompt format is
# ``"<instruction>\nAnswer:"``, the suite's lm-eval format, tokenised for training exactly as for scoring
# (`moelab.suite.encoding`: a model's `<bos>` included); (6) "w/o token routing" (Table 4) is Table 3's 4x1: one
# rank-64 expert per group (trained once, reported under both names); (7) the learning rate is 1e-3, not the
# paper's 2e-4 (batch 32 for one epoch of ~1M examples): our runs have tens of steps of batch 8, and early stopping
# on validation picks the checkpoint;
# (8) held-out answer likelihood (bits per byte) is the primary metric: the rebuilt scorecard (docs/scorecard.md) finds
# no multiple-choice task usable for SmolLM2 or Gemma-3, so no accuracy rows are scored.

# %% tags=["parameters"]
PROFILE = "default"
SEED = 0
DRY_RUN = False  # paper profile only: every paper-path cell on cut sizes (run --profile paper --dry-run)
MODEL_PATH = None  # paper profile: local meta-llama/Llama-2-7b-chat-hf folder
ENCODER_PATH = None  # paper profile: local intfloat/e5-large-v2 sentence-transformers folder
DATA_PATHS = None  # paper profile: a dict mapping slimorca, magicoder, metamathqa to local JSON or JSONL files
GEMMA = False  # full profile: also train PESC and MoCE on Gemma-3-270M (one seed; outside full's 2-hour budget)

# %%
import time

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

import moelab
from moelab import moce
from moelab.suite import instruct

# %%
T0 = time.time()
run = moelab.start_run("01_moce", profile=PROFILE, seed=SEED, dry_run=DRY_RUN)
torch.set_num_threads(1)  # under a shared, loaded CPU two spinning threads are ~5x slower than one
C = moce.config_for(PROFILE, dry_run=DRY_RUN)
cfg = C.settings(SEED, gemma=GEMMA)
_ = C.paper_data and moce.data.check_paper_inputs(MODEL_PATH, ENCODER_PATH, DATA_PATHS)  # user paths checked first
MOCE_ENCODER = moce.moce_encoder(C.paper_data, ENCODER_PATH)  # MoCE-E5 row of Table 1
display(moce.profile_table(PROFILE))
if DRY_RUN:  # what the dry run cuts: the paper configuration with sizes only cut
    display(moelab.profiles.dry_run_table(moce.config_for("paper"), C, keep=("variants", "rank", "lr", "n_top")))

# %% [markdown]
# ## 1 · The instruction mix and its sequence clusters (§3.2, App. B, App. C, Fig. 2)
#
# The suite's mix has three source domains (maths: BIG-bench elementary_math_qa + GSM-style problems; code:
# "write this stdlib function"; reasoning/knowledge: BIG-bench multiple choice), drawn with **equal counts per
# domain** for training and validation (`suite.instruct.build_balanced`); the held-out test items are drawn with equal
# counts per domain from the evaluation pool. The table gives the pool and what this run uses.

# %%
data = moce.load_instruction_mix(C.suite_profile, DATA_PATHS, paper_data=C.paper_data)
items = moce.split_items(data, n_cluster=C.n_cluster, n_train=C.n_train, n_val=C.n_val,
                         n_test_per_domain=C.n_test_per_domain, seed=SEED)
counts = moce.domain_counts_table(instruct.domain_counts(data), instruct.domain_counts(
    {"train": items["train"], "validation": items["validation"], "test": items["test"]}))
run.save_table(counts, "data", "domain-counts", caption="records per domain: the pool and what this run uses")
display(counts.pivot_table(index=["stage", "split"], columns="domain", values="n", aggfunc="sum", sort=False))
display(Markdown(moce.domain_counts_sentence(counts)))

# %% [markdown]
# We embed the *instruction* of each clustering example with two encoders, run k-means for k = 1..10 and take the
# knee of the SSE curve with an automatic detector (App. B step 3 done by a rule instead of by eye).

# %%
encoders = [MOCE_ENCODER] if C.paper_data else cfg["encoders"]
study = moce.clustering_study(items["cluster"], encoders, cfg["ks"], seed=SEED, projections=cfg["projections"])
run.save_table(study["curves"], "appB", "elbow-sse", caption="within-cluster SSE per k and encoder")
run.save_table(study["metrics"], "appC", "cluster-purity", caption="purity / NMI / ARI of clusters vs source domain")
run.save_table(study["within"], "appC", "within-domain", caption="cluster use within each source domain")
run.savefig(moce.plot_elbow(study["curves"], study["knees"]), "appB", "elbow",
            caption="elbow method: SSE vs k with the automatic knee")
plt.show()

# %%
dc = moce.domain_cluster_counts(study["points"], cfg["projections"][0], MOCE_ENCODER)
run.save_table(dc, "appC", "domain-cluster-counts",
               caption="training instructions per source domain and cluster (elbow k), per encoder")
display(study["metrics"])
display(Markdown(moce.knee_sentence(study["metrics"], items["cluster"])))

# %% [markdown]
# Fig. 2: the instruction embeddings in two dimensions, coloured by cluster and by source domain, and the test of
# dependence between domain and cluster (Cramér's V $=\sqrt{\chi^2/(n(\min(r,c)-1))}$ against shuffled labels).

# %%
pts = study["points"]
for proj in cfg["projections"]:
    run.savefig(moce.plot_projection(pts[pts.projection == proj], proj.upper()), "fig2", f"{proj}-clusters",
                caption=f"{proj} of instruction embeddings, by cluster and by domain")
plt.show()
dom_dep = moce.dependence_table(dc[dc.encoder == MOCE_ENCODER].pivot_table(
    index="domain", columns="cluster", values="count", aggfunc="sum", fill_value=0), "domain x cluster")
display(study["within"], dom_dep)
display(Markdown(moce.within_domain_sentence(study["within"], dom_dep, MOCE_ENCODER)))

# %% [markdown]
# ## 2 · Where evaluation prompts land (Fig. 5)
#
# Up to `n_fig5` prompts of each evaluation task (the suite's held-out pools: BIG-bench tasks, held-out GSM templates,
# held-out stdlib modules) are assigned to clusters of the encoder used for MoCE. The paper finds distinct
# preferences (MBPP → cluster 0, ARC → cluster 3) and a spread for broad knowledge (MMLU); its own figure has tasks
# sharing clusters (mathematics in clusters 2 and 3), so the claim is tested as **dependence between task and
# cluster** (Cramér's V against a shuffled-label null), with the concentration (each task's share in its top
# cluster) beside it, not as distinct top clusters.

# %%
cm = study["clusters"][MOCE_ENCODER]
dist = moce.fig5_distribution(data["test"], cm, MOCE_ENCODER, n_per_task=cfg["n_fig5"], seed=SEED,
                              min_items=max(2, cfg["n_fig5"] // 5), tasks=cfg["fig5_tasks"])
run.save_table(dist, "fig5", "cluster-distribution", caption=f"cluster predictions per evaluation task ({MOCE_ENCODER})")
run.savefig(moce.plot_cluster_distribution(dist), "fig5", "cluster-distribution",
            caption="share of each task's prompts in each cluster")
plt.show()

# %%
dep = moce.dependence_table(dist.pivot_table(index="task", columns="cluster", values="count", aggfunc="sum",
                                             fill_value=0), "task x cluster")
run.save_table(dep, "fig5", "task-cluster-dependence", caption="task x cluster independence test and concentration")
display(dep, Markdown(moce.fig5_sentence(dep, dist, cm.k)))

# %% [markdown]
# ## 3 · MoCE on SmolLM2 and comparable baselines (§3.3-3.4, §4.1)
#
# The backbone is frozen. The adapted top blocks get M = k (the knee of the MoCE encoder) groups of N experts
# (adapter width 64, s = 1, top-2 inside the group). Baselines use the same adapter budget: **dense** = one adapter
# of width M·N·64 per block (LLaMA (A)); **pesc** = one pool of M·N experts with token top-2 and no clustering;
# **moce_gen** adds N general experts and a general router (more parameters: stated in the table); **btx** = BTX (A)
# (Branch-Train-miX with adapters): one dense adapter of width M·N·64/3 per domain (maths, code, reasoning) trained on
# that domain alone, then merged as the three experts of an adapter-MoE layer with a new top-2 token router and
# balancing loss, router and experts trained on the whole mix; **specialised_*** = PESC trained on one domain;
# **pesc_aa** = PESC trained again on three other seeds (the A/A arm: its difference from `pesc` is seed noise only).
# The frozen lower blocks' outputs are computed once and cached, so training runs only the adapted blocks.
#
# **Early stopping.** Each run trains in rounds of `steps` optimiser steps (one AdamW optimiser carried across rounds),
# evaluating the validation loss every `eval_every` steps, and stops after a round when the validation loss has
# flattened (the suite's criterion: < 2 % fall of the smoothed loss over the last 20 % of at least
# `moelab.moce.experiment.FLAT_MIN_EVALS` evaluations) or brought no new minimum for `patience` evaluations (so a rise stops it once it
# has lasted that long); otherwise after `max_rounds` rounds (`budget`: still improving). The checkpoint with the
# lowest validation loss is restored and evaluated. A domain-specialised model (and each BTX branch) is trained and
# early-stopped on its own domain.

# %%
model, tok, model_name = moce.load_backbone(C.paper_data, MODEL_PATH)
ccfg = {"model": model_name, "profile": PROFILE}
if C.paper_data:  # the cache knows which model and data produced its states (issue 51)
    ccfg.update(moce.data.paper_cache_identity(MODEL_PATH, DATA_PATHS), dry_run=DRY_RUN)
layers, train_ex, val_ex = moce.cache_trunk(model, tok, items["train"], items["validation"], n_top=cfg["n_top"],
                                            max_len=cfg["max_len"], cache_config=ccfg)
print(f"adapted blocks {layers}; cached {len(train_ex)} train / {len(val_ex)} validation sequences "
      f"({moce.data.trunk_state_bytes(train_ex + val_ex) / 2**30:.2f} GiB of frozen-trunk states); "
      f"{sum(e['truncated'] for e in train_ex)} train prompts truncated to the {cfg['max_len']}-token context")

# %% [markdown]
# Stage 1 for every run: the k-means model per cluster count the runs need (the elbow's M = k, and k ± 1 for Fig. 4)
# assigns each sequence its group α; then every run is trained (or read from the artifact cache).

# %%
K = int(study["knees"][MOCE_ENCODER]["k"])
runs = moce.plan_runs(cfg, K)
groups = moce.cluster_groups(study, MOCE_ENCODER, K, runs, items, seed=SEED)
results = moce.train_runs(model, runs, train_ex, val_ex, groups["train_val"], layers=layers, cfg=cfg,
                          cache_config=ccfg)

# %%
crit = moce.criterion_table(results, len(layers), model.config.hidden_size)
run.save_table(crit, "table1", "training-criterion",
               caption="steps, best step, stop reason, flattened criterion and parameter counts per run")
curves = moce.curves_table(results)
run.save_table(curves, "table1", "training-curves", caption="training CE and validation loss per step")
run.savefig(moce.plot_curves(curves), "table1", "training-curves",
            caption="training and validation loss per variant and seed")
plt.show()
run.note(steps_per_run={f"{r.spec.name}/s{r.seed}": r.steps for r in results}, clusters_k=K, adapted_blocks=layers)

# %%
display(crit[["variant", "seed", "steps", "best_step", "stop_reason", "val_loss_first", "val_loss_best",
              "val_trend", "wall_s", "trainable_params", "active_adapter_params"]])
display(Markdown(moce.training_sentence(crit, K)))

# %% [markdown]
# ## 4 · Evaluation (Table 1 main rows)
#
# Per-domain likelihood of the reference answers of held-out evaluation items (`suite.lmeval.domain_nll`, bits per
# byte, lower is better), each scored with its sequence's cluster set on the model (the clusterer sees the instruction
# only). The seed is the unit of replication: items are averaged within each seed, and every claim compares per-seed
# means with a t-interval over seeds and states its minimum detectable effect (§7). The suite's lm-eval tasks are
# scored only where the scorecard finds one usable for SmolLM2 (`moce.lm_tasks_for`); the paper profile scores every
# multiple-choice task and computes the scorecard of the user's model in the run (`moce.in_run_scorecard`, the same
# usability rule on the untrained model's items), whose usable tasks the accuracy claims read. The frozen lower
# blocks are memoised across models, so each extra model costs only its top blocks.

# %%
lm_tasks, usable_note = moce.lm_tasks_for(model_name, cfg["lm_tasks_max"], in_run=C.paper_data)
scores = moce.evaluate_runs(model, tok, [None] + results, items["test"], groups["test"], lm_tasks, cfg["lm_limit"],
                            groups["predictors"], layers, cache_config=ccfg)
run.save_table(scores, "table1", "per-item-scores", caption="per-item scores of every model (bpb)")
if C.paper_data:  # which tasks the user's model is usable on, from its own untrained items (issue 51)
    card = moce.in_run_scorecard(scores, lm_tasks, MODEL_PATH)
    run.save_table(card, "table1", "scorecard", caption="scorecard of this run's model: usable lm-eval tasks")
    display(card[["task", "n", "acc", "chance", "position_acc", "blind_acc", "status", "reason"]])
print(f"lm tasks: {lm_tasks or 'none'} ({usable_note})")

# %%
summary = moce.summarize_scores(scores)
run.save_table(summary, "table1", "main", caption="Table 1 main rows: mean and 95% bootstrap CI per task")
run.savefig(moce.plot_table1(summary[summary.metric == "bpb"], "bits per byte (lower is better)"), "table1",
            "main-bpb", caption="Table 1 rows: held-out answer bits per byte with 95% CI")
plt.show()
per_seed = moce.seed_means_table(scores)
run.save_table(per_seed, "table1", "seed-means", caption="mean bits per byte per variant, seed and domain")
display(per_seed.pivot_table(index="variant", columns="domain", values="mean", aggfunc=["mean", "std"],
                             sort=False).round(4))
display(Markdown(moce.pooled_sentence(per_seed)))

# %% [markdown]
# ## 5 · Ablations (Tables 3 and 4) and the number of clusters (Fig. 4)
#
# Table 3 varies the experts per group (N = 1, 2, 4 at the same M); Table 4 replaces top-2 by top-1 or soft merging,
# removes token routing (one expert per group: N = 1) or clustering (PESC). Fig. 4 trains MoCE with k = elbow − 1 and
# elbow + 1 clusters beside the elbow. Each row below is the per-seed mean bits per byte (pooled, and code for the
# MBPP column of Table 4), mean and s.d. over seeds; the claims in §7 test each comparison the paper makes.

# %%
display(moce.ablation_table(per_seed).round(4))
k_labels = moce.k_sweep_labels(runs, cfg["experts_per_group"])
ksweep = moce.k_sweep_table(scores, k_labels, K, cfg["seeds"]) if len(k_labels) > 1 else None
if ksweep is not None:
    run.save_table(ksweep, "fig4", "k-sweep", caption="held-out answer bits per byte vs number of clusters k")
    run.savefig(moce.plot_k_sweep(ksweep), "fig4", "k-sweep",
                caption="bits per byte vs number of clusters (= expert groups), elbow marked")
display(Markdown(moce.k_sweep_sentence(ksweep, K)))

# %% [markdown]
# ## 6 · A second family: Gemma-3-270M (`full` with `GEMMA=True`)
#
# PESC and MoCE on Gemma-3-270M (base model, 18 blocks, sliding-window and global attention), with the same clusters,
# training data, early stopping and adapter sizes; the top 2 blocks are adapted and the lower 16 cached as for SmolLM2.
# Gemma's 262k-token head makes every trained and scored position several times SmolLM2's, which puts even one seed
# outside full's 2-hour budget on this CPU: it runs only when asked (`-p GEMMA=True`), with `gemma_seeds` (one seed:
# its claim is `inconclusive` by the engine's 3-seed rule, labelled so) on `gemma_test_per_domain` held-out answers
# per domain.

# %%
gemma = None
if cfg["gemma_variants"]:
    gemma = moce.gemma_experiment(runs, items, groups, MOCE_ENCODER, cfg, {"model": "gemma-3-270m", "profile": PROFILE})
    run.save_table(gemma["criterion"], "table1", "training-criterion-gemma3",
                   caption="Gemma-3-270M: steps, best step and stop reason per run")
    run.save_table(gemma["scores"], "table1", "per-item-scores-gemma3", caption="Gemma-3-270M per-item scores (bpb)")
    run.save_table(gemma["summary"], "table1", "main-gemma3", caption="Gemma-3-270M: mean and 95% bootstrap CI per task")
print(f"Gemma-3-270M: adapted blocks {gemma['layers']}, {gemma['n_test']} held-out answers, lm tasks "
      f"{gemma['lm_tasks'] or 'none'}" if gemma else "Gemma-3-270M runs only with GEMMA=True in the full profile")

# %% [markdown]
# ## 7 · Claims
#
# The verdicts are computed from the tables saved above, without rerunning anything, by the claim definitions in
# `moelab.moce.claims` (one per claim, with the paper's Table 1 / 3 / 4 numbers beside it; the verdict rule
# is in docs/CLAIMS.md). Trained comparisons use per-seed means and a paired t-interval over seeds (fewer than 3 seeds
# cannot decide), each with its minimum detectable effect (MDE); bits per byte stands in for the paper's accuracies,
# so those claims are decided on sign only; Fig. 2 and Fig. 5 are tested as dependence between domain or task and
# cluster. The last claim is the A/A check: two PESC arms that differ only by seed, whose interval is the noise every
# other comparison carries.

# %%
claims = run.finish()
display(claims, Markdown(moce.aa_sentence(claims)))
print(f"wall time {time.time() - T0:.0f} s")
