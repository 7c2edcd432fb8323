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
# # 00 · A primer on Mixture-of-Experts layers
#
# The five papers of this companion (MoCE, SBA, cluster-aware upcycling, MASS, Free-MoE) all change one piece of the
# same block. A Mixture-of-Experts (MoE) layer replaces a transformer's feed-forward network (FFN) by $E$ expert FFNs
# $E_1,\dots,E_E$ and a router $W_r\in\mathbb R^{E\times d}$. Each token $x\in\mathbb R^d$ gets routing probabilities
# $p(x)=\mathrm{softmax}(W_r x)$, only the $k$ largest are kept, and the output is their weighted sum
#
# $$y(x)=\sum_{i\in\mathrm{TopK}(p(x),k)} w_i(x)\,E_i(x),\qquad w_i=\frac{p_i}{\sum_{j\in\mathrm{TopK}}p_j}\ \text{(renormalised, Mixtral)}.$$
#
# This notebook builds such layers from a real dense model (all-MiniLM-L6-v2) with `moelab.core`, and shows, on real
# tokens: (1) **sparse upcycling** (every expert a copy of the dense FFN) changes nothing at initialisation;
# (2) short training runs through `moelab.train` with and without the **load-balancing loss**
# $L_\mathrm{bal}=E\sum_e f_e P_e$ (Switch Transformer), on several training seeds, and how unevenly tokens spread
# over experts;
# (3) the **routing weights** of a few real tokens; (4) **top-k vs top-p** routing (MASS uses top-p: a token takes as
# many experts as it needs to reach probability mass $p$); (5) **linear vs spherical aggregation** of two expert
# outputs (SBA: the linear mix of two directions collapses inwards); (6) the **dispatch kernel** (tokens sorted by
# expert, one grouped matmul) against a per-token loop.
#
# The profiles (printed below from `moelab.primer.config`, so the table is what runs): the reference setting beside
# `smoke`, `default` (this CPU), `full` and `paper`.
#
# Readings chosen here: the routers are trained together with the experts (the rest of MiniLM frozen); the balancing
# coefficient is 0.05 (larger than Switch's 0.01 because our run is short); load imbalance is the coefficient of variation
# of the per-expert share of token-slots, $\mathrm{std}_e f_e/\mathrm{mean}_e f_e$ (0 = perfectly balanced).

# %% tags=["parameters"]
PROFILE = "default"
SEED = 0
DRY_RUN = False  # paper profile only: every cell at smoke sizes (python -m moelab.runner run --profile paper --dry-run)

# %%
import copy
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import display

import moelab
from moelab import core, primer
from moelab.primer import config

# %%
T0 = time.time()
P = config.profile(PROFILE, dry_run=DRY_RUN)
SEEDS = [SEED + i for i in range(P.seeds)]  # training seeds of section 2 (each draws routers, batches, dropout)
run = moelab.start_run("00_moe_primer", profile=PROFILE, seed=SEED, seeds=SEEDS, dry_run=DRY_RUN)
torch.set_num_threads(1)  # the 2 cores are shared: one thread is several times faster than two here
cfg = P.settings()
run.save_json(cfg, "config")
display(config.profile_table(PROFILE))

# %% [markdown]
# ## 1 · Sparse upcycling: an MoE that equals its dense parent
#
# `moelab.core.moeify` swaps MiniLM's FFNs in layers 1, 3, 5 for `MoELayer`s whose 8 experts are copies of the dense
# FFN and whose router is random ($\mathcal N(0,0.02^2)$). With renormalised top-2 weights ($w_1+w_2=1$) every token
# gets $\sum_i w_i E(x)=E(x)$: the upcycled model should reproduce the dense sentence embeddings up to float rounding.

# %%
pairs = primer.wordnet_gloss_pairs(P.n_train + P.n_eval, seed=SEED)
train_pairs, eval_pairs = pairs[: P.n_train], pairs[P.n_train:]
eval_texts = [g for _, g in eval_pairs]
dense, tok = primer.load_minilm_hf()
upcycled = core.moeify(copy.deepcopy(dense), layers=P.layers, num_experts=P.num_experts, top_k=P.top_k,
                       init="sparse", renormalize=True)
equiv = primer.upcycling_equivalence(dense, upcycled, tok, eval_texts[:64])
run.save_table(equiv, "table1", "upcycling_equivalence", caption="dense vs sparsely upcycled MiniLM embeddings")
print(f"{len(core.moe_layers(upcycled))} MoE layers; max |dense - upcycled| over {len(equiv)} real sentences: "
      f"{equiv.max_abs_diff.max():.2e} (mean {equiv.max_abs_diff.mean():.2e}); min cosine {equiv.cosine.min():.7f}")

# %% [markdown]
# ## 2 · Training the router, with and without the balancing loss
#
# We fine-tune the MoE layers (routers at lr 1e-3 since they start from scratch, experts at 3e-5 since they are copies
# of a trained FFN; the rest of MiniLM frozen) on WordNet (lemma, gloss) pairs with
# MiniLM's own objective, in-batch negatives $L=\mathrm{CE}(20\cos(a_i,g_j), i)$, once plain and once with
# $+\,0.05\sum_\text{layers}L_\mathrm{bal}$, where $f_e$ is the share of token-slots routed to expert $e$ and $P_e$
# the mean router probability. `moelab.primer.train_balancing_runs` does this for every training seed of the profile:
# the seed redraws the routers ($\mathcal N(0,0.02^2)$; the experts stay copies, so the model still equals dense
# MiniLM) and fixes the batches, and both arms of a seed share them (a comparison paired by seed). It records
# per-step metrics and how far each router moved from its draw.

# %%
eval_fn = primer.contrastive_eval_fn(tok, eval_pairs[: P.n_eval_loss])
bal = primer.train_balancing_runs(
    upcycled, tok, train_pairs, eval_fn, seeds=SEEDS, aux_coef=P.aux_coef, steps=P.steps, batch=P.batch,
    router_lr=P.router_lr, expert_lr=P.expert_lr, warmup_frac=P.warmup_frac, eval_every=P.eval_every)
run.save_table(bal.history, "table2", "training_history", caption="per-step metrics of the training runs (seed, arm)")
run.save_table(bal.heldout, "table2b", "heldout_loss", caption="held-out contrastive loss during training (per seed)")
run.save_table(bal.router_change, "table2c", "router_change",
               caption="relative change of each router's weights from its draw, ||W - W0|| / ||W0||")

# %% [markdown]
# Expert load $f_e$ on the held-out glosses, per batch, layer and expert, and its imbalance
# $\mathrm{std}_e f_e/\mathrm{mean}_e f_e$, for each seed's model at initialisation and after each run.

# %%
load, imb = primer.load_tables(bal.models(), tok, eval_texts)
run.save_table(load, "table3", "expert_load", caption="expert load on held-out glosses (per seed, batch, layer, expert)")
run.save_table(imb, "table4", "load_imbalance", caption="coefficient of variation of expert load, held-out batches")
fig = primer.plot_balancing(bal.history, bal.heldout, load, ["at initialisation", *primer.ARMS], P.num_experts)
run.savefig(fig, "fig1", "balancing_loss", caption="loss, load imbalance and load by expert rank with/without L_bal")
plt.show()

# %%
per_seed = imb.groupby(["seed", "run"]).imbalance.mean().unstack("run")
final = bal.heldout[bal.heldout.step == bal.heldout.step.max()].groupby("run").heldout_contrastive.mean()
display(per_seed.round(3))
print(f"held-out contrastive loss ({P.n_eval_loss} pairs, mean of {len(SEEDS)} seed(s)): "
      f"{bal.heldout[bal.heldout.step == 0].heldout_contrastive.mean():.3f} at initialisation (= dense MiniLM) -> "
      + "; ".join(f"{k}: {v:.3f}" for k, v in final.items()) + f" after {P.steps} steps; routers moved by "
      f"{bal.router_change.rel_change.min():.2f}-{bal.router_change.rel_change.max():.2f} of their initial norm")

# %% [markdown]
# ## 3 · Routing weights of real tokens
#
# The router probabilities $p(x)=\mathrm{softmax}(W_r x)$ of every token of one held-out gloss at the last MoE layer
# of the balanced model (first seed); the two kept experts of each token are outlined (top-2, renormalised before mixing).

# %%
sentence = eval_texts[0]
balanced = bal.runs[(SEEDS[0], "with balancing loss")]  # sections 3-6 read the first seed's balanced model
rt = primer.routing_table(balanced, tok, sentence, layer=-1)
run.save_table(rt, "table5", "routing_weights", caption=f"router probabilities, last MoE layer: {sentence!r}")
run.savefig(primer.plot_routing_weights(rt), "fig2", "routing_weights",
            caption="router probabilities per token; red = kept top-2")
plt.show()
top = rt[rt.kept].groupby("position").prob.sum()
print(f"{top.size} tokens; the kept top-2 hold {top.mean():.2f} of the probability mass on average "
      f"(min {top.min():.2f}, max {top.max():.2f}); uniform would be {P.top_k / P.num_experts:.2f}")

# %% [markdown]
# ## 4 · Top-k vs top-p routing
#
# Top-k gives every token exactly $k$ experts. Top-p (MASS, following its code) keeps the smallest set of experts whose
# probability reaches $p$, $\min\{|S| : \sum_{i\in S} p_i(x)\ge p\}$: confident tokens take one expert, uncertain
# ones several. Counted on every held-out token with the balanced model's routers (`moelab.core.top_p_route`).

# %%
logits = primer.router_logits(balanced, tok, eval_texts)
active = primer.active_expert_counts(logits, top_k=P.top_k, top_ps=P.top_p).assign(seed=SEEDS[0])
run.save_table(active, "table6", "active_experts", caption="number of active experts per token, top-k vs top-p")
run.savefig(primer.plot_active_experts(active, P.num_experts), "fig3", "topk_vs_topp",
            caption="active experts per real token")
plt.show()

# %%
summ = active.groupby("rule", sort=False).active.agg(["mean", "min", "max"])
display(summ)
p_mid = f"top-p {P.top_p[1]}"
print(f"{p_mid}: {summ.loc[p_mid, 'mean']:.2f} experts per token on average "
      f"(from {summ.loc[p_mid, 'min']} to {summ.loc[p_mid, 'max']}); top-{P.top_k}: always {P.top_k}")

# %% [markdown]
# ## 5 · Linear vs spherical aggregation: the inward collapse
#
# Two unit expert outputs at angle θ mixed with weights ½, ½: the linear sum lies on the chord, with norm
# $\cos(\theta/2)<1$; spherical barycentric aggregation (SBA, `moelab.core.aggregation.sba`) moves along the arc and keeps
# the norm. Then the same ratio $\lVert\sum_i w_i e_i\rVert/\sum_i w_i\lVert e_i\rVert$ on real expert outputs of the
# trained model (`moelab.core.capture_moe`).

# %%
agg = primer.two_vector_aggregation(np.arange(0, 180, 15))  # 180° (antiparallel) has no unique arc
run.save_table(agg, "table7", "aggregation_two_vectors", caption="norms of linear vs SBA mix of two unit vectors")
real_ratio = primer.real_norm_ratio(balanced, tok, eval_texts[:64])
run.save_table(real_ratio, "table8", "aggregation_real", caption="norm ratio of linear vs SBA mix, real expert outputs")
run.savefig(primer.plot_aggregation(agg), "fig4", "linear_vs_sba",
            caption="linear aggregation shrinks the mix; SBA keeps the norm")
plt.show()

# %%
at = agg.set_index("angle_deg")
print(f"two unit vectors at 120°: linear norm {at.linear_norm[120]:.3f}, SBA norm {at.sba_norm[120]:.3f}. Real top-2 "
      f"expert outputs: linear keeps {real_ratio.linear_ratio.mean():.3f} of the weighted mean norm (min "
      f"{real_ratio.linear_ratio.min():.3f}), SBA {real_ratio.sba_ratio.mean():.3f}")

# %% [markdown]
# ## 6 · The dispatch kernel
#
# `moelab.core.moe_dispatch` sorts (token, slot) pairs by expert and runs one grouped matmul per projection,
# $y_t=\sum_{i\in\mathrm{TopK}(t)} w_{ti}E_i(x_t)$ computed expert by expert; the reference loops over tokens and calls
# each chosen expert. A small timing on real FFN inputs of layer 5, routed by its own router (the full benchmark is
# in `benchmarks/`).

# %%
layer = core.moe_layers(balanced)[-1]
x_real = primer.ffn_inputs(balanced, tok, eval_texts, layer=-1, max_tokens=max(P.timing_tokens))
timing = primer.time_dispatch(layer, x_real, list(P.timing_tokens), repeats=P.timing_repeats)
run.save_table(timing, "table9", "dispatch_timing", caption="grouped dispatch vs per-token loop, seconds")
tm = primer.dispatch_medians(timing)
run.savefig(primer.plot_dispatch(tm), "fig5", "dispatch_speed", caption="median wall time per call")
plt.show()
print(f"grouped dispatch is {(tm['naive_loop'] / tm['grouped']).iloc[-1]:.0f}x faster than the loop at "
      f"{tm.index[-1]} tokens (max abs difference {timing.max_abs_diff.max():.1e})")

# %% [markdown]
# ## Claims
#
# Verdicts are computed from the tables saved above by the claim definitions of notebook 00 (`moelab.primer.claims`,
# found through `moelab.claims.registry.CLAIM_DEFS`), each beside the sentence of the source it tests; the verdict
# rule (interval, MDE, unit of replication) is in docs/CLAIMS.md, and `python -m moelab.claims rebuild` recomputes the
# same file from the committed tables. Three of the facts are identities (upcycling at initialisation, the two
# aggregation norms): *holds by construction* with the measured deviation, and a deviation beyond rounding stops the
# rebuild. The balancing loss is compared over the training seeds, paired by seed, once the runs trained (held-out
# loss not above dense MiniLM's, routers moved); top-p's varying count is tested over the tokens of one trained router.

# %%
claims = run.finish()
moelab.runner.notebook_run.claims_for_reader(claims)   # all 25 fields per claim: figures/00_moe_primer/claims.json
