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
# **Idea.** MASS grows the expert pool during the first 10% of training. An expert e is duplicated when its gradient
# norm $g_t=\lVert\nabla W_1^{(e)}\rVert_F$ shows a significant upward shift (change-point test, $p<0.01$) *and* its
# gradient is nearly orthogonal to its weights, $|\cos(W_1^{(e)},\nabla W_1^{(e)})|<\delta$ ("semantic drift"). The
# copy takes the full gradient, the source keeps only the aligned component; a redundancy loss
# $\lambda\sum_{(i,j)}\cos(w_i^{g},w_j^{g})^2$ pushes duplicated gate rows apart; expansion stops at the maximum pool
# or when removing the last-added expert no longer raises the batch NLL `patience` times. Tokens are routed by top-p:
# the smallest set of experts whose gate mass $p=\mathrm{softmax}(W_g u)$ reaches $p_{\rm top}=0.5$.
#
# Change-point statistic (Sec. 3.4, public code): over the last $W$ norms
# $z_t=(g_t-\bar g_W)/s_W$, $S=\sum_{i\in W} z_i/\sqrt W$, $p=1-\Phi(S)$; warm-up $\max(30,0.05T)$, window
# $\max(60,0.09T)$, so an expert is first tested at step $0.09T$ (for $T\ge 667$) and expansion ends at $0.1T$.
#
# **Data (Sec. 4.1).** GINC-style HMMs: hidden state (entity $v$, property $s$), deterministic emission through a
# memory matrix; a concept $\theta$ fixes the property transitions; entities persist with probability 0.9 and switch
# with 0.1 *uniformly* (the paper's text). Training and test sequences are the paper's in-context format
# $[x_1,y_1,o,x_2,y_2,o,\dots,x_n,y_n]$ (input $x$, target $y$, delimiter $o$); the loss that matters is the NLL of
# the targets $y$, compared with the exact Bayes floor and n-gram baselines of the same sequences.
#
# **Model (Sec. 4.1).** One Transformer layer (embedding, sinusoidal positions, causal self-attention) whose FFN is an
# MoE of experts $\mathrm{SiLU}(W_1^{(e)}u+b_1^{(e)})$ with a linear softmax gate and a shared decoder.

# %% tags=["parameters"]
PROFILE = "default"
SEED = 0
MODEL_PATH = None   # paper profile: local bert-large folder (HF format)
GLUE_DIR = None     # paper profile: official GLUE data folder (CoLA/, RTE/, QNLI/, MNLI/, MRPC/)

# %%
import json
from pathlib import Path

import numpy as np
import pandas as pd
from IPython.display import display

import moelab
from moelab import mass as ms
from moelab.cache import memo

run = moelab.start_run("04_mass", profile=PROFILE, seed=SEED)
# Model settings chosen on the validation split only (scripts/tune_04.py; data/tuning/04_mass/): see section 2.
MODEL = dict(d_model=64, n_heads=4, batch_size=32, lr=1e-2, lr_decay="cosine", loss_on="all")
DATA = dict(data_format="incontext", n_examples=4, example_len=5, entity_switch="uniform", max_experts=16)
COUNTS8 = [1, 2, 3, 4, 6, 8, 12, 16]   # the tuning frontier's expert counts (default and full: the CPU budget)
cfg = moelab.profiles.select(
    PROFILE,
    smoke=dict(steps=60, counts=[1, 2, 4], ks=[2], seeds=[0], mass_seeds=[0, 1], starts=[4], n_test=64,
               sweep_seeds=[0], model=dict(MODEL, d_model=16, n_heads=2),
               glue=dict(tasks=["intent_recognition"], methods=["cosine", "dynmoe", "mass"], seeds=[0],
                         cfg=dict(steps=4, eval_every=4, batch_size=8, dyn_interval=2, max_length=32))),
    # default: a stated shorter schedule, T = 1000 (the public windows still test inside the expansion phase: first
    # test at step 89, expansion until 100), start size 8 (the public GLUE script's), 8 expert counts
    default=dict(steps=1000, counts=COUNTS8, ks=[2], seeds=[0, 1, 2], mass_seeds=[0, 1, 2, 3, 4], starts=[8],
                 n_test=512, sweep_seeds=[0, 1, 2], model=MODEL, glue=None),
    # full: T = 3000 (first test at 0.09T = 269, expansion until 300), start sizes 8, 2, 4, the real-data part
    full=dict(steps=3000, counts=COUNTS8, ks=[2], seeds=[0, 1, 2],
              mass_seeds=[0, 1, 2, 3, 4], starts=[8, 2, 4], n_test=512, sweep_seeds=[0, 1, 2], model=MODEL,
              glue=dict(tasks=None, methods=["cosine", "dynmoe", "mass"], seeds=[0, 1, 2],
                        cfg=dict(steps=100, eval_every=50, batch_size=16, dyn_interval=10, max_length=64))),
    paper=dict(steps=3000, counts=list(range(1, 17)), ks=[1, 2, 4], seeds=[0, 1, 2], mass_seeds=[0, 1, 2, 3, 4],
               starts=[8, 2, 4], n_test=512, sweep_seeds=[0, 1, 2], model=MODEL, glue=None),
)
if PROFILE == "paper":   # the paper's language experiment needs local copies of BERT-large and GLUE
    ms.bert_large_path(MODEL_PATH)
    ms.load_glue_task(GLUE_DIR, "rte", "train")
setup = ms.SynthSetup(steps=cfg["steps"], n_test=cfg["n_test"], ginc_seed=SEED, **DATA, **cfg["model"])
mcfg = ms.MassConfig.public(setup.steps, delta=ms.slots_delta(setup.d_model), max_experts=setup.max_experts,
                            init_experts=cfg["starts"][0])
print(setup)
print(mcfg)

# %% [markdown]
# ## 1. Data: entity switching, the in-context format, the Bayes floor and n-gram baselines
# Three readings of the entity switch distribution $M$ in $A_{\rm ent}=0.9I+0.1M$ exist: GINC's original generator
# (a mixture of permutations at temperature 0.1), this companion's first version (the same mixture at temperature
# 1.0), and the paper's text ("transitions to a new entity ... according to uniform"). We use **uniform** (the
# paper's text). The table measures how concentrated each reading's switches are (share of switches that go to a
# row's most likely new entity; uniform gives $1/(V-1)$).

# %%
switch = ms.switch_readings(seed=SEED)
run.save_table(switch, "data", "entity_switching", caption="top-switch share of the three readings of entity switching")
display(switch)
sw = switch.set_index("entity_switch").measured_top_share
print(f"Top-switch share (measured): GINC's generator {sw['ginc']:.2f}, temperature 1.0 {sw['t1']:.2f}, uniform "
      f"{sw['uniform']:.2f} (1/(V-1) = {switch.uniform_share[0]:.3f}). This notebook uses '{setup.entity_switch}'.")

# %% [markdown]
# GINC's prompts use example lengths (3, 5, 8, 10) and example counts (0, 1, 2, 4, ..., 256) (`ginc_settings`). The
# paper's extraction lost its own values; we take **example length 5 and 4 examples** per sequence from GINC's grid:
# the shortest sequences (23 tokens) at which the Bayes floor on the targets lies far below every n-gram baseline
# (checked below on this run's test draw), so the targets need in-context inference, not local statistics.

# %%
refs = memo("mass_reference_levels", dict(setup=vars(setup)), lambda: ms.reference_levels(setup))
run.save_table(refs, "data", "reference_levels", caption="Bayes floor and n-gram baselines on the test draw (targets y "
                                                         "and full sequence)")
display(refs)
bayes = float(refs.target_nll[refs.name == "Bayes"].iloc[0])
tri = float(refs[refs.name == "trigram"].target_nll.min())
print(f"Format: {setup.n_examples} examples of {setup.example_len} tokens ({setup.input_len + 1} tokens per "
      f"sequence). Test targets: Bayes floor {bayes:.3f} nats, best trigram {tri:.3f}, best bigram "
      f"{refs[refs.name == 'bigram'].target_nll.min():.3f}, unigram {refs[refs.name == 'unigram'].target_nll.min():.3f}"
      f" (uniform over symbols {np.log(50):.3f}).")

# %% [markdown]
# ## 2. Naive MoE frontier (Fig. 2 left)
# Width, heads, batch, learning rate (with its schedule), steps and the training loss were chosen on a **validation
# draw only** (`scripts/tune_04.py`, seed data_seed + 2000; the test draw is never read there): one layer, as in the
# paper. Deeper models were tried because one layer does not beat the trigram at T = 3000: a second attention layer
# (an attention-only block before the MoE block, `attn_layers=2`, so two-layer induction circuits are possible) is
# worse at T = 1000 and no better at T = 3000 (rows `..._L2` of the summary), so the paper's single layer stays and
# the schedule is what moves the model: a doubled schedule (T = 6000, `..._T6000_...`, the "best screening run" printed
# below) brings the best model to the trigram's level and no clearly further, while the trigram itself improves with
# the larger training draw. `full` keeps T = 3000 (the public schedule's regime, first change-point test inside the
# expansion phase): T = 6000 for the frontier, the MASS start sweep and the top-k sweep does not fit full's two-hour
# CPU budget. The summary (per candidate: best seed-mean target NLL over E, the E = 1 level,
# the range over E and the pooled seed s.d.) and the choice are printed below with the gaps to the Bayes floor and to
# the trigram of the same validation draws. `default` trains a stated shorter schedule (the CPU budget), `full` the
# longer one; the tuning table shows how much the frontier gains from it. The frontier is the seed mean of the best
# top-k per expert count, with a ±1 s.d. band; its elbow is read only if its range is several seed s.d. (the claims).
#
# **Regime.** The comparisons of sections 3-5 are evidence about MASS only if the naive models learn more than local
# statistics: the best naive model must beat the trigram baseline of the same test sequences clearly (the upper end of
# its 95% seed interval below the trigram, `moelab.mass.regime`). Where it does not, the claims that compare models
# are `not testable` with the measured levels as the reason.

# %%
tuning_file = Path(moelab.__file__).resolve().parents[2] / "data" / "tuning" / "04_mass" / "tuning_summary.json"
tuned = json.loads(tuning_file.read_text()) if tuning_file.exists() else {}
display(pd.DataFrame(tuned.get("summary", [])))
ch = tuned.get("choice")
if ch:
    print(f"Chosen on validation: {ch['candidate']} ({ch['settings']}). Its frontier (E = 1..16 subset, 3 seeds, "
          f"T={ch['settings']['steps']}): best {ch['frontier_best_val_target_nll']:.3f} nats at E={ch['frontier_best_E']}"
          f", Bayes floor {ch['bayes_val_target_nll']:.3f} (gap {ch['gap_to_bayes']:+.3f}), trigram "
          f"{ch['trigram_val_target_nll']:.3f} (gap {ch['gap_to_trigram']:+.3f}); range over E {ch['frontier_spread']:.3f}"
          f" = {ch['spread_over_sd']:.1f} x the seed s.d. {ch['seed_sd']:.4f}. Best screening run overall: "
          f"{ch['best_screen_candidate']}, {ch['best_screen_val_target_nll']:.3f} (gap to Bayes "
          f"{ch['best_screen_gap_to_bayes']:+.3f}, to trigram {ch['best_screen_gap_to_trigram']:+.3f}).")

# %%
configs = [(E, min(k, E), s) for E in cfg["counts"] for k in cfg["ks"] for s in cfg["seeds"]]
configs = list(dict.fromkeys(configs))
grid = ms.run_naive_groups(setup, configs, cache=memo)          # cached per expert count: a stopped run resumes
gt = grid["table"]
bands = ms.frontier_bands(gt)
spread = ms.frontier_spread(gt)
run.save_table(gt, "fig2", "naive_grid", caption="naive MoE grid: test NLL of the targets y per (experts, top-k, seed)")
run.save_table(bands, "fig2", "frontier", caption="seed-mean frontier: best top-k per expert count, mean and s.d. over "
                                                  "seeds")
run.save_table(pd.concat([pd.DataFrame(dict(num_experts=r.num_experts, top_k=r.top_k, seed=r.seed,
                                            item=np.arange(len(l)), loss=np.round(l, 5)))
                          for r, l in zip(gt.itertuples(), grid["item_losses"])], ignore_index=True),
               "fig2", "naive-item-losses", caption="naive MoE grid: per-sequence target NLL per (experts, top-k, seed)")
elbow = ms.elbow_max_chord(bands.num_experts, bands["mean"]) if len(bands) >= 3 else None
best = bands.loc[bands["mean"].idxmin()]
print(f"{len(gt)} naive runs. Frontier (seed means) from {bands['mean'].iloc[0]:.3f} (E=1) to {best['mean']:.3f} "
      f"(best at E={int(best.num_experts)}); range {spread['spread']:.3f} nats = {spread['ratio']:.1f} x the seed s.d. "
      f"{spread['seed_sd']:.4f}. Best naive vs Bayes floor: +{best['mean'] - bayes:.3f} nats; vs best trigram: "
      f"{best['mean'] - tri:+.3f} nats." + (f" Elbow (max distance to chord) at E={elbow:g}." if elbow else ""))
reg = ms.regime(gt, refs)
run.save_table(pd.DataFrame([reg]), "fig2", "regime", caption="regime check: best naive model vs the trigram baseline")
print(f"Regime: {reg['reason']}. " + ("The comparisons below are evidence about MASS." if reg["ok"] else
      "Outside the paper's regime: the models learn no more than local statistics, so the comparisons below (elbow, "
      "MASS vs best static, JSD) are shown but scored `not testable`."))

# %% [markdown]
# ## 3. MASS runs (the public code's rules)
# Top-p routing with $p=0.5$ (the paper's GLUE value) through the authors' weighting (kept scores renormalised only
# when some token of the batch keeps more than one expert); δ = 0.001 at the public 256×1024 $W_1$ scaled to ours,
# $\delta=0.001\sqrt{262144/d^2}$; patience 3; redundancy weight 0.01; loss-based stop only after more than one
# expansion; a failed test removes the last-added expert and still expands. The public schedule resets an expert's
# warm-up after it is split and gives a copy a fresh window, so within the expansion phase each expert can split at
# most a limited number of times: `max_reachable_pool` simulates the schedule with every test firing (printed below
# for each start size). With the public windows each expert can split only once before the phase ends, so the pool
# can at most double: the start size bounds the final pool, which is why the default starts where the public GLUE
# script does (8 of 16) and `full` sweeps the start.

# %%
mass_seeds = cfg["mass_seeds"]
start = cfg["starts"][0]
mres = memo("mass_runs", dict(setup=vars(setup), mcfg=vars(mcfg), seeds=mass_seeds),
            lambda: ms.run_mass(setup, mcfg, mass_seeds))
mt = mres["table"]
run.save_table(mt, "fig2", "mass_runs", caption=f"MASS runs (start {start}): final pool, active experts per token, "
                                                "target NLL")
run.save_table(pd.concat([pd.DataFrame(dict(seed=s, item=np.arange(len(l)), loss=np.round(l, 5)))
                          for s, l in zip(mt.seed, mres["item_losses"])], ignore_index=True),
               "fig2", "mass-item-losses", caption="MASS runs: per-sequence target NLL per run")
run.save_table(mres["events"], "appC", "mass_events", caption="change-point firings, expansions, removals, stops")
display(mt)
reach = {s: ms.max_reachable_pool(s, mcfg.max_experts, mcfg.warmup, mcfg.window, mcfg.expand_until)
         for s in sorted({2, 4, 8, *cfg["starts"]})}
print("Largest reachable pool per start size: " + ", ".join(f"{s} -> {r}" for s, r in reach.items()))
ev = mres["events"]
print(f"T={mcfg.total_steps}: warm-up {mcfg.warmup}, window {mcfg.window}, first test at step {mcfg.first_test}, "
      f"expansion until step {mcfg.expand_until}; δ={mcfg.delta:.4f}. Largest pool this schedule can reach from "
      f"{start} experts: {reach[start]}. {int((ev.kind == 'fire').sum())} firings, {int((ev.kind == 'expand').sum())} "
      f"expansions, {int((ev.kind == 'remove').sum())} removals in {len(mt)} runs; final pool "
      f"{mt.final_experts.mean():.1f} ± {mt.final_experts.std():.1f}; {mt.mean_active.mean():.2f} active experts per "
      f"token; target NLL {mt.test_loss.mean():.3f} ± {mt.test_loss.std():.3f} vs the best naive configuration "
      f"{best['mean']:.3f}.")

# %% [markdown]
# ### Expansion trace per run
# Per run: the gradient norms $g_t$ the change-point test reads, its p-values, $|\cos|$ against δ at every firing,
# and the pool size over the expansion phase.

# %%
fig = ms.plot_expansion_trace(mres["trace"], ev, mt, mcfg.p_threshold, mcfg.delta, mcfg.expand_until)
run.savefig(fig, "appC", "expansion_trace", caption=f"expansion trace per MASS run (start {start})")
run.save_table(mres["trace"], "appC", "gradnorm_trace",
               caption="per-expert gradient norms, z-scores and p-values during the expansion phase")

# %% [markdown]
# ### Start-size sweep (`full`)
# The public GLUE script starts at 8 of 16 experts; the notebook's earlier version started at 2. `full` runs 2, 4 and
# 8 (default: the first, stated above).

# %%
if len(cfg["starts"]) > 1:
    sweep_runs = []
    for s0 in cfg["starts"][1:]:
        c0 = ms.MassConfig.public(setup.steps, delta=mcfg.delta, max_experts=setup.max_experts, init_experts=s0)
        r0 = memo("mass_runs", dict(setup=vars(setup), mcfg=vars(c0), seeds=mass_seeds),
                  lambda: ms.run_mass(setup, c0, mass_seeds))
        sweep_runs.append(r0["table"])
        fig = ms.plot_expansion_trace(r0["trace"], r0["events"], r0["table"], c0.p_threshold, c0.delta, c0.expand_until)
        run.savefig(fig, "appC", f"expansion_trace_start{s0}", caption=f"expansion trace per MASS run (start {s0})")
    starts = pd.concat([mt] + sweep_runs, ignore_index=True)
    starts["max_reachable"] = starts.init_experts.map(reach)
    run.save_table(starts, "fig2", "mass_start_sweep", caption="MASS runs per start size")
    display(starts.groupby("init_experts")[["final_experts", "max_reachable", "mean_active", "test_loss"]]
            .agg(["mean", "std"]))
else:
    print(f"One start size in this profile ({start}); the sweep over {{2, 4, 8}} runs in `full`.")

# %% [markdown]
# ## 4. Top-k at a fixed pool (Fig. 2 right) and Fig. 2
# Naive models with E = MASS's mean final pool (rounded), swept over top-k; these runs are also the naive arm of the
# specialisation analysis (matched pool size).

# %%
E_fix = int(np.clip(round(mt.final_experts.mean()), 2, setup.max_experts))
sweep_cfg = [(E_fix, k, s) for k in sorted({1, 2, 4, 8}) if k <= E_fix for s in cfg["sweep_seeds"]]
sweep = ms.run_naive_groups(setup, sweep_cfg, keep_routing=True, cache=memo)
st = sweep["table"]
run.save_table(st, "fig2", "topk_sweep", caption=f"naive MoE with E={E_fix}: target NLL per top-k and seed")
ref_lines = {"Bayes floor": bayes, "trigram": tri, "bigram": float(refs[refs.name == "bigram"].target_nll.min())}
fig = ms.plot_fig2(gt, bands, elbow, mt, st, E_fix, ref_lines)
run.savefig(fig, "fig2", "frontier_topk", caption="target NLL vs #experts (left) and vs top-k at fixed E (right)")
bk = st.groupby("top_k").test_loss.mean()
print(f"At E={E_fix}: best naive top-k = {bk.idxmin()} ({bk.min():.3f}); MASS {mt.test_loss.mean():.3f} with "
      f"{mt.mean_active.mean():.2f} active experts per token.")

# %% [markdown]
# ## 5. Expert specialisation (Fig. 3)
# Per run and per chunk of test sequences: the mean pairwise Jensen–Shannon divergence (bits) between the average
# routing distributions of entities and of properties, $\mathrm{JSD}(P_a\Vert P_b)=\tfrac12 KL(P_a\Vert M)+\tfrac12
# KL(P_b\Vert M)$, $M=\tfrac12(P_a+P_b)$, $P_a=$ mean routing of the tokens whose hidden state has entity (property)
# $a$. Routing = the gate's softmax (the paper's definition); the post-top-p/top-k weights are shown beside it.

# %%
g = setup.ginc()
pts = ms.jsd_table(mres, sweep, setup.data()[2]["states"], g.cfg.n_entities, g.cfg.n_properties)
run.save_table(pts, "fig3", "jsd_points", caption="entity/property routing JSD per run, test chunk and routing reading")
fig = ms.plot_fig3(pts)
run.savefig(fig, "fig3", "jsd_contour", caption="entity vs property routing JSD: MASS vs naive at a matched pool")
jm = pts.groupby(["routing", "method", "run"])[["entity_jsd", "property_jsd"]].mean().groupby(["routing", "method"]) \
    .agg(["mean", "std", "count"])
display(jm)
g0 = jm.loc["gate softmax"]
print(f"Gate softmax, run-level means: entity JSD MASS {g0.loc['MASS', ('entity_jsd', 'mean')]:.4f} "
      f"({int(g0.loc['MASS', ('entity_jsd', 'count')])} runs) vs naive {g0.loc['naive', ('entity_jsd', 'mean')]:.4f} "
      f"({int(g0.loc['naive', ('entity_jsd', 'count')])} runs); property JSD MASS "
      f"{g0.loc['MASS', ('property_jsd', 'mean')]:.4f} vs naive {g0.loc['naive', ('property_jsd', 'mean')]:.4f}.")

# %% [markdown]
# ## 6. Real-data part (GLUE stand-in, `full`)
# The paper (Sec. 4.4, Fig. 4) fine-tunes BERT-large with MoE FFNs on five GLUE tasks and compares a fixed-size MoE
# with cosine routers (GMoE), DynMoE and MASS over three seeds. Neither BERT-large nor GLUE is available offline, so we
# run the same comparison on all-MiniLM-L6-v2 with the FFN of its last layer sparse-upcycled into an MoE, mean pooling
# and a linear head, fine-tuned on the suite's usable BIG-bench text classification tasks (`moelab.suite.textcls`),
# with early selection on the validation split. Methods: **cosine** (4 experts, cosine router, top-2), **dynmoe**
# (top-any gate, 4 of 9 slots at start), **mass** (top-p 0.5, 4 of 9 slots at start, change-point + semantic test in
# the first 10% of steps). Every method adds the Switch/GShard balancing loss $\alpha E\sum_e f_e P_e$ (α = 0.01)
# from the shared core. `wall_s` in the runs table records each run's cost.

# %%
if cfg["glue"] is None:
    glue = None
    print(f"The real-data part runs in the full profile only (this run: {PROFILE}).")
else:
    from moelab.mass.resume import run_glue_standin_cached
    from moelab.suite import textcls
    gcfg = ms.GlueStandinConfig(**cfg["glue"]["cfg"])
    gtasks = textcls.tasks("smoke" if PROFILE == "smoke" else "full", cfg["glue"]["tasks"])
    glue_runs, glue_items = run_glue_standin_cached(gtasks, cfg["glue"]["methods"], cfg["glue"]["seeds"], gcfg,
                                                    cache=memo)    # cached per task, method and seed: resumes run by run
    glue = ms.glue_summary(glue_runs, glue_items)
    run.save_table(glue_runs, "fig4", "glue_standin_runs", caption="GLUE stand-in: one row per task, method, seed")
    run.save_table(glue_items, "fig4", "glue_standin_items", caption="GLUE stand-in: per-item test correctness")
    run.save_table(glue, "fig4", "glue_standin_summary",
                   caption="GLUE stand-in: accuracy with 95% item-bootstrap interval, chance, pool, active experts")
    fig = ms.plot_glue_standin(glue)
    run.savefig(fig, "fig4", "glue_standin", caption="MiniLM MoE on text classification: accuracy, pool, active experts")
    display(glue)
    avg = glue.groupby("method")[["acc", "final_pool", "mean_active"]].mean()
    print("Average over tasks: " + "; ".join(f"{m}: accuracy {r.acc:.3f}, final pool {r.final_pool:.1f}, "
                                             f"{r.mean_active:.2f} active experts per token" for m, r in avg.iterrows())
          + f". Chance: {', '.join(f'{t} {c:.2f}' for t, c in glue.groupby('task').chance.first().items())}.")

# %% [markdown]
# ## Claims
#
# Verdicts are computed from the tables saved above by `moelab.claims.defs.nb04_mass`, where the paper's numbers are
# written beside each claim with the table or figure they come from; the verdict rule (interval, MDE, unit of
# replication) is in docs/CLAIMS.md, and `python -m moelab.claims rebuild` recomputes the same file from the saved
# tables. Every comparison is run-level (one number per MASS or naive run; JSD averaged over the test chunks of each
# run). The elbow claim is `not testable` when the frontier's range is below 3 seed s.d. or its per-seed elbows
# disagree by more than 2 experts.

# %%
claims = run.finish()
claims
