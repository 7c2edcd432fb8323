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
# # 04 · MASS: how many experts are enough? (paper 003)
#
# **Idea.** MASS grows the expert pool during the first 10% of training. An expert is duplicated when its gradient
# norm shows a statistically significant upward shift (a CUSUM-style change-point test, p < 0.01) *and* its gradient
# is nearly orthogonal to its weights (|cos(W1, ∇W1)| < δ, "semantic drift"). The copy takes the full gradient, the
# source keeps only the aligned component; a redundancy loss pushes the duplicated gate rows apart; expansion stops at
# a maximum pool size or after the last-added expert failed to lower the NLL `patience` times. Tokens are routed by
# top-p (smallest set of experts whose routing mass reaches p).
#
# Change-point statistic (Sec. 3.4; public code): $z_t=(g_t-\bar g_W)/s_W$ over the last $W$ norms,
# $S=\sum_{i\in W} z_i/\sqrt{W}$, $p=1-\Phi(S)$.
#
# | | paper | smoke | default | full | paper profile |
# |---|---|---|---|---|---|
# | data | GINC-style HMM mixture (5 of 10 concepts) | same generator | same | same | + GLUE (local) |
# | model | 1-layer Transformer, MoE of Linear+SiLU experts | d=32, S=16 | d=32, S=16 | d=32, S=16 | BERT-large (local) |
# | naive grid | E up to ~16, several k, 3 runs | E∈{1,2,4,8}, k∈{1,2}, 1 run | E=1..16, k∈{1,2,4}, 3 runs | E=1..16, k∈{1,2,4,8}, 3 runs, 512 test docs | as full, 1500 steps |
# | MASS runs | 5 | 2 | 5 | 5 | 5 |
# | steps | not stated | 60 | 600 | 600 | 1500 |
# | real data (GLUE stand-in, §7) | GLUE (5 tasks) on BERT-large, 3 seeds; DomainBed on ViT-S | 1 task, 3 methods, 1 seed, 4 steps, 16 test items | - (disabled) | MiniLM, 1 MoE layer, 2 BIG-bench text tasks, 3 methods, 3 seeds, 100 steps | needs local copies |

# %% tags=["parameters"]
PROFILE = "default"
SEED = 0
MODEL_PATH = None   # paper profile: local bert-large folder (HF format)
GLUE_DIR = None     # paper profile: official GLUE data folder (CoLA/, RTE/, QNLI/, MNLI/, MRPC/)

# %%
import matplotlib
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

import moelab
from moelab import mass as ms
from moelab.cache import memo
from moelab.mass.data import GINCConfig, bayes_nll, build_ginc, sample_documents
from moelab.train import flattened

run = moelab.start_run("04_mass", profile=PROFILE, seed=SEED)
cfg = moelab.profiles.select(
    PROFILE,
    smoke=dict(steps=60, counts=[1, 2, 4, 8], ks=[1, 2], seeds=[0], mass_runs=2, n_test=64, max_experts=8, sweep_seeds=[0],
               glue=dict(tasks=["intent_recognition"], methods=["cosine", "dynmoe", "mass"], seeds=[0],
                         cfg=dict(steps=4, eval_every=4, batch_size=8, dyn_interval=2, max_length=32))),
    default=dict(steps=600, counts=list(range(1, 17)), ks=[1, 2, 4], seeds=[0, 1, 2], mass_runs=5, n_test=256,
                 max_experts=16, sweep_seeds=[0, 1, 2], glue=None),
    # full: the larger grid (k = 8 added) at default's step count (its training curves flattened), the real-data part
    full=dict(steps=600, counts=list(range(1, 17)), ks=[1, 2, 4, 8], seeds=[0, 1, 2], mass_runs=5, n_test=512,
              max_experts=16, sweep_seeds=[0, 1, 2],
              glue=dict(tasks=None, methods=["cosine", "dynmoe", "mass"], seeds=[0, 1, 2],
                        cfg=dict(steps=100, eval_every=50, batch_size=16, dyn_interval=10, max_length=64))),
    paper=dict(steps=1500, counts=list(range(1, 17)), ks=[1, 2, 4, 8], seeds=[0, 1, 2], mass_runs=5, n_test=512,
               max_experts=16, sweep_seeds=[0, 1, 2], glue=None),
)
if PROFILE == "paper":   # the paper's language experiment needs local copies of BERT-large and GLUE
    ms.bert_large_path(MODEL_PATH)
    ms.load_glue_task(GLUE_DIR, "rte", "train")
setup = ms.SynthSetup(steps=cfg["steps"], n_test=cfg["n_test"], max_experts=cfg["max_experts"], ginc_seed=SEED)
print(setup)

# %% [markdown]
# ## 1. The GINC-style generator
# Hidden state = (entity, property); memory matrix → symbol (property 0 → delimiter); property transitions per
# concept are a tempered (0.1) mixture of permutations; entities persist with probability ≥ 0.9. The Bayes-optimal
# predictor (forward algorithm over the mixture of the 5 in-distribution concepts) gives the floor of the test loss.

# %%
g, train_docs, test = setup.data()
ent = g.entity_of(test["states"])
gen = pd.DataFrame([dict(hidden_states=g.n_states, symbols=g.cfg.n_symbols, concepts=g.cfg.n_concepts,
                         train_concepts=g.cfg.n_train_concepts, entity_persistence=float((ent[:, 1:] == ent[:, :-1]).mean()),
                         bayes_test_nll=float(bayes_nll(g, test["tokens"]).mean()), train_docs=len(train_docs),
                         seq_len=setup.seq_len)])
run.save_table(gen, "data", "ginc_stats", caption="GINC-style generator: measured statistics of the test set")
bayes_floor = gen.bayes_test_nll[0]
display(gen)
print(f"Entity persistence in the test documents: {gen.entity_persistence[0]:.3f}; Bayes-optimal test NLL "
      f"{bayes_floor:.3f} nats/token (uniform over symbols would be {np.log(g.cfg.n_symbols):.3f}).")

# %% [markdown]
# ## 2. Naive MoE grid (fixes width, length and steps before MASS runs)
# All naive models of a slot bucket are trained at once as stacked parameters (one Adam over [models, ...] tensors).
# Width d=32 (2 heads), sequence length 16, batch 16, Adam lr 1e-2 (5% warm-up) and 600 steps were fixed from naive
# pilot runs alone (d=32 / lr 1e-2 gave the lowest naive test loss of the pilots, before any MASS run); the
# criterion is that the training loss of the naive runs has flattened (`moelab.train.flattened`).

# %%
configs = [(E, k, s) for E in cfg["counts"] for k in cfg["ks"] if k <= E for s in cfg["seeds"]]
grid = memo("mass_naive_grid", dict(setup=vars(setup), configs=configs),
            lambda: ms.run_naive(setup, configs))
gt = grid["table"]
front = ms.frontier(gt)
elbow = ms.elbow_max_chord(front.num_experts, front.test_loss)
curves = grid["history"].groupby(["num_experts", "top_k", "seed"]).loss.apply(lambda l: flattened(l.to_numpy())[0])
run.save_table(gt, "fig2", "naive_grid", caption="naive MoE grid: test loss per (experts, top-k, seed)")
run.save_table(front, "fig2", "frontier", caption="frontier: best naive run per expert count")
run.save_table(pd.concat([pd.DataFrame(dict(num_experts=r.num_experts, top_k=r.top_k, seed=r.seed,
                                            item=np.arange(len(l)), loss=np.round(l, 5)))
                          for r, l in zip(gt.itertuples(), grid["item_losses"])], ignore_index=True),
               "fig2", "naive-item-losses", caption="naive MoE grid: per-document test loss per (experts, top-k, seed)")
print(f"{len(gt)} naive runs; {curves.mean():.0%} of training curves flattened (smoothed fall < 2% over the last "
      f"20% of steps). Frontier from {front.test_loss.iloc[0]:.3f} (E=1) to {front.test_loss.min():.3f} "
      f"(best at E={front.num_experts[front.test_loss.idxmin()]}); elbow (max distance to chord) at E={elbow:g}.")

# %% [markdown]
# ## 3. MASS runs
# Settings (stated): start with 2 experts, maximum pool = the grid's largest count, top-p with p = 0.5 (GLUE value),
# δ scaled to our expert size (GLUE's 0.001 for 512x1024 expert matrices ↦ 0.001·√(524288/d²)), patience 3,
# redundancy weight 0.01, expansion in the first 10% of steps. Warm-up max(3, .005T) and window max(6, .01T): the
# public max(30, .05T) / max(60, .09T) cannot produce a test before 0.14T, after expansion has ended.

# %%
warmup, window = ms.mass_settings(setup.steps)
mcfg = ms.MassConfig(total_steps=setup.steps, warmup=warmup, window=window, delta=ms.slots_delta(setup.d_model),
                     max_experts=setup.max_experts)
mass_seeds = list(range(cfg["mass_runs"]))
mres = memo("mass_runs", dict(setup=vars(setup), mcfg=vars(mcfg), seeds=mass_seeds),
            lambda: ms.run_mass(setup, mcfg, mass_seeds))
mt = mres["table"]
run.save_table(mt, "fig2", "mass_runs", caption="MASS runs: final pool, mean active experts per token, test loss")
run.save_table(pd.concat([pd.DataFrame(dict(seed=s, item=np.arange(len(l)), loss=np.round(l, 5)))
                          for s, l in zip(mt.seed, mres["item_losses"])], ignore_index=True),
               "fig2", "mass-item-losses", caption="MASS runs: per-document test loss per run")
run.save_table(mres["events"], "appC", "mass_events", caption="change-point firings, expansions, removals, stops")
display(mt)
n_exp = int((mres["events"].kind == "expand").sum())
print(f"warm-up {warmup}, window {window}, δ={mcfg.delta:.4f}; {n_exp} expansions in {len(mt)} runs; final pool "
      f"{mt.final_experts.mean():.1f} ± {mt.final_experts.std():.1f} experts; {mt.mean_active.mean():.2f} active "
      f"per token; test loss {mt.test_loss.mean():.3f} vs best naive {gt.test_loss.min():.3f}.")

# %% [markdown]
# ## 4. Top-k at a fixed pool size (Fig. 2 right) and Fig. 2
# Naive models with E = MASS's mean final pool (rounded), swept over top-k, 3 runs each; their routing is kept for
# the specialization analysis.

# %%
E_fix = int(np.clip(round(mt.final_experts.mean()), 2, setup.max_experts))
sweep_cfg = [(E_fix, k, s) for k in sorted({1, 2, 3, 4, 6, 8, E_fix}) if k <= E_fix for s in cfg["sweep_seeds"]]
sweep = memo("mass_topk_sweep", dict(setup=vars(setup), configs=sweep_cfg),
             lambda: ms.run_naive(setup, sweep_cfg, keep_routing=True))
st = sweep["table"]
run.save_table(st, "fig2", "topk_sweep", caption=f"naive MoE with E={E_fix}: test loss per top-k and seed")
fig = ms.plot_fig2(gt, front, elbow, mt, st, E_fix, bayes_floor)
run.savefig(fig, "fig2", "frontier_topk", caption="test loss vs #experts (left) and vs top-k at fixed E (right)")
best_k = st.groupby("top_k").test_loss.mean()
print(f"At E={E_fix}: best naive top-k = {best_k.idxmin()} ({best_k.min():.3f}); MASS {mt.test_loss.mean():.3f} with "
      f"{mt.mean_active.mean():.2f} active experts per token.")

# %% [markdown]
# ## 5. Expert specialization (Fig. 3)
# Per run and per chunk of test documents: the mean pairwise Jensen–Shannon divergence (base 2) between the average
# routing distributions of entities (x) and of properties (y). Routing = the weights actually used (after top-k/top-p).

# %%
pts = pd.concat(
    [ms.jsd_points(mres["routing"][r], test["states"], g.cfg.n_entities, g.cfg.n_properties).assign(method="MASS", run=r)
     for r in range(len(mt))]
    + [ms.jsd_points(w, test["states"], g.cfg.n_entities, g.cfg.n_properties).assign(method="naive", run=i)
       for i, w in sweep["routing"].items()], ignore_index=True)
run.save_table(pts, "fig3", "jsd_points", caption="entity/property routing JSD per run and test chunk")
fig = ms.plot_fig3(pts)
run.savefig(fig, "fig3", "jsd_contour", caption="entity vs property routing JSD: MASS vs naive")
jm = pts.groupby("method")[["entity_jsd", "property_jsd"]].mean()
display(jm)
print(f"Mean entity JSD: MASS {jm.loc['MASS', 'entity_jsd']:.4f} vs naive {jm.loc['naive', 'entity_jsd']:.4f}; "
      f"property JSD: MASS {jm.loc['MASS', 'property_jsd']:.4f} vs naive {jm.loc['naive', 'property_jsd']:.4f}.")

# %% [markdown]
# ## 6. Gradient-norm traces around expansions (App. C)

# %%
fig = ms.plot_appc(mres["trace"], mres["events"])
run.savefig(fig, "appC", "gradnorm_traces", caption="||∇W1|| of source and new expert around expansion events; red = p<0.01")
run.save_table(mres["trace"][mres["trace"].step < mcfg.expand_until], "appC", "gradnorm_trace",
               caption="per-expert gradient norms, z-scores and p-values during the expansion phase")
print(f"{(mres['events'].kind == 'fire').sum()} change points fired; "
      f"{(mres['events'].kind == 'expand').sum()} passed the semantic test and were not vetoed; "
      f"{(mres['events'].kind == 'remove').sum()} removals by the NLL test.")

# %% [markdown]
# ## 7. Real-data part (GLUE stand-in, `full`)
# The paper (Sec. 4.4, Fig. 4) fine-tunes BERT-large with MoE FFNs (MoEfication setup) on five GLUE tasks and compares
# a fixed-size MoE with cosine routers (GMoE), DynMoE and MASS over three seeds: MASS has the highest average accuracy,
# grows task-dependent pools and activates 2.6–3.2 experts per token, DynMoE 6.5–8.0 of 9. Neither BERT-large nor
# GLUE is available offline, so we run the same comparison on all-MiniLM-L6-v2 with the FFN of its last layer
# sparse-upcycled into an MoE (every expert a copy of the FFN), mean pooling and a linear head, fine-tuned on the
# suite's usable BIG-bench text classification tasks (`moelab.suite.textcls`; accuracy above chance measured for the
# dense model), with early selection on the validation split. Methods: **cosine** (4 experts, cosine router, top-2),
# **dynmoe** (top-any gate, 4 of 9 slots at start; every 10 steps experts that got no token are removed and one is
# added for unrouted tokens, gate row = their mean), **mass** (top-p with p = 0.5, 4 of 9 slots at start; change-point
# + semantic test in the first 10% of steps, warm-up/window from `mass_settings`, δ scaled to the 1536×384 W1,
# gradient decomposition in the trainer's `after_backward` hook, NLL veto with patience 3). The `full` size (2 tasks ×
# 3 methods × 3 seeds × 100 steps, batch 16, ≤64 tokens) is the largest that fits this CPU; `wall_s` in the runs
# table records each run's cost (printed below).

# %%
if cfg["glue"] is None:
    glue = None
    print(f"The real-data part runs in the full profile only (this run: {PROFILE}).")
else:
    from moelab.suite import textcls
    gcfg = ms.GlueStandinConfig(**cfg["glue"]["cfg"])
    gtasks = textcls.tasks("smoke" if PROFILE == "smoke" else "full", cfg["glue"]["tasks"])
    glue_runs, glue_items = memo("mass_glue_standin", dict(cfg=cfg["glue"], profile=PROFILE),
                                 lambda: ms.run_glue_standin(gtasks, cfg["glue"]["methods"], cfg["glue"]["seeds"], gcfg))
    glue = ms.glue_summary(glue_runs, glue_items)
    run.save_table(glue_runs, "fig4", "glue_standin_runs", caption="GLUE stand-in: one row per task, method, seed")
    run.save_table(glue_items, "fig4", "glue_standin_items", caption="GLUE stand-in: per-item test correctness")
    run.save_table(glue, "fig4", "glue_standin_summary",
                   caption="GLUE stand-in: accuracy with 95% item-bootstrap interval, chance, pool, active experts")
    fig = ms.plot_glue_standin(glue)
    run.savefig(fig, "fig4", "glue_standin", caption="MiniLM MoE on text classification: accuracy, pool, active experts")
    display(glue)
    avg = glue.groupby("method")[["acc", "final_pool", "mean_active"]].mean()
    print(f"{len(glue_runs)} fine-tuning runs, {glue_runs.wall_s.sum() / 60:.0f} min of training and evaluation in all "
          f"(when they were computed; a rerun reads them from the cache).")
    print("Average over tasks: " + "; ".join(f"{m}: accuracy {r.acc:.3f}, final pool {r.final_pool:.1f}, "
                                             f"{r.mean_active:.2f} active experts per token" for m, r in avg.iterrows())
          + f". Chance: {', '.join(f'{t} {c:.2f}' for t, c in glue.groupby('task').chance.first().items())}.")

# %% [markdown]
# ## Claims
#
# Verdicts are computed from the tables saved above by `moelab.claims.defs.nb04_mass`, where the paper's numbers are
# written beside each claim with the table or figure they come from; the verdict rule (interval, MDE, unit of
# replication) is in docs/CLAIMS.md, and `python -m moelab.claims rebuild` recomputes the same file from the committed
# tables. Every comparison is run-level (one number per MASS or naive run; JSD averaged over the test chunks of each
# run).

# %%
claims = run.finish()
claims
