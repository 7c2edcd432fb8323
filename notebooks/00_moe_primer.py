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
# (2) a short training run through `moelab.train` with and without the **load-balancing loss**
# $L_\mathrm{bal}=E\sum_e f_e P_e$ (Switch Transformer), and how unevenly tokens spread over experts;
# (3) the **routing weights** of a few real tokens; (4) **top-k vs top-p** routing (MASS uses top-p: a token takes as
# many experts as it needs to reach probability mass $p$); (5) **linear vs spherical aggregation** of two expert
# outputs (SBA: the linear mix of two directions collapses inwards); (6) the **dispatch kernel** (tokens sorted by
# expert, one grouped matmul) against a per-token loop.
#
# | | reference setting | smoke | default (this CPU) | full |
# |---|---|---|---|---|
# | model | all-MiniLM-L6-v2 (6 BERT layers, d=384, FFN 1536) | same | same | same |
# | MoE layers | nomic-embed-v2-moe: every other layer, 8 experts, top-2 | layers 1, 3, 5; 8 experts, top-2 | same | same |
# | data | sentence pairs (MiniLM's own objective) | WordNet noun (lemma, gloss) pairs, 64 | 1,280 | 6,400 |
# | training | Switch: balancing coefficient 0.01 | 4 steps of 8 pairs x 2 runs | 40 steps of 16 pairs x 2 runs (coef 0.05) | 200 steps of 32 pairs x 2 runs |
# | seeds | - | 1 | 1 | 1 |
#
# Readings chosen here: the routers are trained together with the experts (the rest of MiniLM frozen); the balancing
# coefficient is 0.05 (larger than Switch's 0.01 because our run is short); load imbalance is the coefficient of variation
# of the per-expert share of token-slots, $\mathrm{std}_e f_e/\mathrm{mean}_e f_e$ (0 = perfectly balanced).

# %% tags=["parameters"]
PROFILE = "default"
SEED = 0

# %%
import copy
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown, display

import moelab
from moelab import core, primer
from moelab.train import TrainConfig, train

T0 = time.time()
run = moelab.start_run("00_moe_primer", profile=PROFILE, seed=SEED)
torch.set_num_threads(1)  # the 2 cores are shared: one thread is several times faster than two here
base = dict(num_experts=8, top_k=2, layers="every_other", router_lr=1e-3, expert_lr=3e-5, batch=16, aux_coef=0.05,
            warmup_frac=0.1, top_p=[0.3, 0.5, 0.7], n_eval=256, n_eval_loss=64, eval_every=20,
            timing_tokens=[64, 256], timing_repeats=3)
cfg = moelab.profiles.select(
    PROFILE,
    smoke={**base, "n_train": 64, "steps": 4, "batch": 8, "n_eval": 64, "n_eval_loss": 32, "eval_every": 2,
           "timing_tokens": [32, 64], "timing_repeats": 1},
    default={**base, "n_train": 1280, "steps": 40},
    full={**base, "n_train": 6400, "steps": 200, "batch": 32, "eval_every": 25, "timing_tokens": [64, 256, 1024]},
    paper={**base, "n_train": 6400, "steps": 200, "batch": 32, "eval_every": 25, "timing_tokens": [64, 256, 1024]},
)
run.save_json(cfg, "config")
cfg

# %% [markdown]
# ## 1 · Sparse upcycling: an MoE that equals its dense parent
#
# `moelab.core.moeify` swaps MiniLM's FFNs in layers 1, 3, 5 for `MoELayer`s whose 8 experts are copies of the dense
# FFN and whose router is random ($\mathcal N(0,0.02^2)$). With renormalised top-2 weights ($w_1+w_2=1$) every token
# gets $\sum_i w_i E(x)=E(x)$: the upcycled model should reproduce the dense sentence embeddings up to float rounding.

# %%
pairs = primer.wordnet_gloss_pairs(cfg["n_train"] + cfg["n_eval"], seed=SEED)
train_pairs, eval_pairs = pairs[: cfg["n_train"]], pairs[cfg["n_train"]:]
eval_texts = [g for _, g in eval_pairs]
dense, tok = primer.load_minilm_hf()
upcycled = core.moeify(copy.deepcopy(dense), layers=cfg["layers"], num_experts=cfg["num_experts"],
                       top_k=cfg["top_k"], init="sparse", renormalize=True)
with torch.no_grad():
    e_dense, _ = primer.embed(dense.eval(), tok, eval_texts[:64])
    e_moe, _ = primer.embed(upcycled.eval(), tok, eval_texts[:64])
equiv = pd.DataFrame({"text": eval_texts[:64], "max_abs_diff": (e_dense - e_moe).abs().amax(-1).numpy(),
                      "cosine": (e_dense * e_moe).sum(-1).numpy()})
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
# the mean router probability. `moelab.train.train` runs both (same seed, same batches) and records per-step metrics.

# %%
eval_fn = primer.contrastive_eval_fn(tok, eval_pairs[: cfg["n_eval_loss"]])
init_loss = eval_fn(upcycled.eval())["heldout_contrastive"]
runs, histories, evals = {}, [], [pd.DataFrame({"step": [0], "heldout_contrastive": [init_loss], "run": ["both"]})]
for name, coef in (("no balancing loss", 0.0), ("with balancing loss", cfg["aux_coef"])):
    model = copy.deepcopy(upcycled)
    primer.train_only_moe(model)
    loader = torch.utils.data.DataLoader(train_pairs, batch_size=cfg["batch"], shuffle=True, collate_fn=list)
    res = train(model, loader, loss_fn=primer.contrastive_loss_fn(tok, aux_coef=coef),
                cfg=TrainConfig(lr=cfg["router_lr"], steps=cfg["steps"], warmup_frac=cfg["warmup_frac"], seed=SEED,
                                eval_every=cfg["eval_every"], desc=name), eval_fn=eval_fn,
                param_groups=primer.moe_param_groups(model, cfg["router_lr"], cfg["expert_lr"]))
    runs[name] = res.model
    histories.append(res.history.assign(run=name))
    evals.append(res.eval_history.assign(run=name))
history = pd.concat(histories, ignore_index=True)
heldout = pd.concat(evals, ignore_index=True)
run.save_table(history, "table2", "training_history", caption="per-step metrics of the two training runs")
run.save_table(heldout, "table2b", "heldout_loss", caption="held-out contrastive loss during training")

models = {"at initialisation": upcycled, **runs}
load = pd.concat([primer.expert_load(m, tok, eval_texts).assign(run=name) for name, m in models.items()])
run.save_table(load, "table3", "expert_load", caption="expert load on held-out glosses (per batch, layer, expert)")
imb = (load.groupby(["run", "layer", "batch"]).load.apply(lambda s: float(primer.load_imbalance(s.to_numpy())))
       .rename("imbalance").reset_index())
run.save_table(imb, "table4", "load_imbalance", caption="coefficient of variation of expert load, held-out batches")

fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
imb_cols = [c for c in history.columns if c.startswith("imbalance_L")]
for name, h in history.groupby("run"):
    axes[0].plot(h.step, h.contrastive, alpha=0.35, lw=1)
    e = heldout[heldout.run.isin([name, "both"])]
    axes[0].plot(e.step, e.heldout_contrastive, "o-", color=axes[0].lines[-1].get_color(), label=f"{name} (held-out)")
    axes[1].plot(h.step, h[imb_cols].mean(axis=1), label=name)
axes[0].set(xlabel="step", ylabel="contrastive loss", title="loss: training batches (faint), held-out (dots)")
axes[1].set(xlabel="step", ylabel="mean CV of expert load", title="load imbalance while training")
last = load[load.layer == load.layer.max()]  # expert ids are per layer: show the last MoE layer
last.groupby(["run", "expert"]).load.mean().unstack(0)[list(models)].plot.bar(ax=axes[2], rot=0)
axes[2].axhline(1 / cfg["num_experts"], color="k", lw=0.8, ls="--")  # uniform share 1/E
axes[2].set(ylabel="share of token-slots", title="held-out load per expert, last MoE layer")
axes[0].legend()
fig.tight_layout()
run.savefig(fig, "fig1", "balancing_loss", caption="loss, load imbalance and per-expert load with/without L_bal")
plt.show()
s = imb.groupby("run").imbalance.mean()
final = heldout[heldout.step == heldout.step.max()].set_index("run").heldout_contrastive
print(f"held-out contrastive loss ({cfg['n_eval_loss']} pairs): {init_loss:.3f} at initialisation (= dense MiniLM) -> "
      + "; ".join(f"{k}: {v:.3f}" for k, v in final.items()) + f" after {cfg['steps']} steps")
print(f"held-out load imbalance (CV, mean over {imb.layer.nunique()} layers x {imb.batch.nunique()} batches): "
      f"{s['at initialisation']:.3f} at initialisation (random router), {s['no balancing loss']:.3f} after training "
      f"without and {s['with balancing loss']:.3f} with the balancing loss")

# %% [markdown]
# ## 3 · Routing weights of real tokens
#
# The router probabilities $p(x)$ of every token of one held-out gloss at the last MoE layer of the balanced model;
# the two kept experts of each token are outlined (top-2, renormalised before mixing).

# %%
sentence = eval_texts[0]
rt = primer.routing_table(runs["with balancing loss"], tok, sentence, layer=-1)
run.save_table(rt, "table5", "routing_weights", caption=f"router probabilities, last MoE layer: {sentence!r}")
grid = rt.pivot(index="position", columns="expert", values="prob")
kept = rt.pivot(index="position", columns="expert", values="kept")
fig, ax = plt.subplots(figsize=(6, 0.32 * len(grid) + 1.2))
im = ax.imshow(grid.to_numpy(), cmap="viridis", aspect="auto")
for (i, j) in zip(*np.nonzero(kept.to_numpy())):
    ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="red", lw=1.5))
ax.set_yticks(range(len(grid)), rt.drop_duplicates("position").token)
ax.set_xlabel("expert")
fig.colorbar(im, label="router probability")
run.savefig(fig, "fig2", "routing_weights", caption="router probabilities per token; red = kept top-2")
plt.show()
top = rt[rt.kept].groupby("position").prob.sum()
print(f"{len(grid)} tokens; the kept top-2 hold {top.mean():.2f} of the probability mass on average "
      f"(min {top.min():.2f}, max {top.max():.2f}); uniform would be {cfg['top_k'] / cfg['num_experts']:.2f}")

# %% [markdown]
# ## 4 · Top-k vs top-p routing
#
# Top-k gives every token exactly $k$ experts. Top-p (MASS, following its code) keeps the smallest set of experts whose
# probability reaches $p$: confident tokens take one expert, uncertain ones several. Counted on every held-out token
# with the balanced model's routers (`moelab.core.top_p_route`).

# %%
logits = primer.router_logits(runs["with balancing loss"], tok, eval_texts)
active = primer.active_expert_counts(logits, top_k=cfg["top_k"], top_ps=cfg["top_p"])
run.save_table(active, "table6", "active_experts", caption="number of active experts per token, top-k vs top-p")
fig, ax = plt.subplots(figsize=(7, 3.4))
bins = np.arange(0.5, cfg["num_experts"] + 1.5)
for rule, a in active.groupby("rule", sort=False):
    ax.hist(a.active, bins=bins, histtype="step", lw=2, density=True, label=rule)
ax.set(xlabel="active experts per token", ylabel="share of tokens", title="top-k vs top-p")
ax.legend()
run.savefig(fig, "fig3", "topk_vs_topp", caption="active experts per real token")
plt.show()
summ = active.groupby("rule", sort=False).active.agg(["mean", "min", "max"])
display(summ)
p_mid = f"top-p {cfg['top_p'][1]}"
print(f"{p_mid}: {summ.loc[p_mid, 'mean']:.2f} experts per token on average "
      f"(from {summ.loc[p_mid, 'min']} to {summ.loc[p_mid, 'max']}); top-{cfg['top_k']}: always {cfg['top_k']}")

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
real_ratio = primer.real_norm_ratio(runs["with balancing loss"], tok, eval_texts[:64])
run.save_table(real_ratio, "table8", "aggregation_real", caption="norm ratio of linear vs SBA mix, real expert outputs")
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
t = np.linspace(0, np.pi, 200)
axes[0].plot(np.cos(t), np.sin(t), color="0.7", lw=1)
for a in (60, 120, 165):
    r = agg[agg.angle_deg == a].iloc[0]
    th = np.deg2rad(a)
    axes[0].plot([1, np.cos(th)], [0, np.sin(th)], "k:", lw=0.8)
    axes[0].annotate("", (np.cos(th), np.sin(th)), (0, 0), arrowprops=dict(arrowstyle="->", color="0.4"))
    axes[0].plot(r.linear_x, r.linear_y, "o", color="C0", label="linear" if a == 60 else None)
    axes[0].plot(r.sba_x, r.sba_y, "s", color="C1", label="SBA" if a == 60 else None)
axes[0].annotate("", (1, 0), (0, 0), arrowprops=dict(arrowstyle="->", color="0.4"))
axes[0].set(aspect="equal", title="mixing two unit vectors (w = ½, ½)")
axes[0].legend()
axes[1].plot(agg.angle_deg, agg.linear_norm, "o-", label="linear")
axes[1].plot(agg.angle_deg, agg.sba_norm, "s-", label="SBA")
axes[1].plot(agg.angle_deg, agg.cos_half_angle, "k--", lw=0.8, label="cos(θ/2)")
axes[1].set(xlabel="angle between experts θ (degrees)", ylabel="norm of the mix", title="inward collapse")
axes[1].legend()
fig.tight_layout()
run.savefig(fig, "fig4", "linear_vs_sba", caption="linear aggregation shrinks the mix; SBA keeps the norm")
plt.show()
print(f"two unit vectors at 120°: linear norm {agg.set_index('angle_deg').linear_norm[120]:.3f}, "
      f"SBA norm {agg.set_index('angle_deg').sba_norm[120]:.3f}. Real top-2 expert outputs: linear keeps "
      f"{real_ratio.linear_ratio.mean():.3f} of the weighted mean norm (min {real_ratio.linear_ratio.min():.3f}), "
      f"SBA {real_ratio.sba_ratio.mean():.3f}")

# %% [markdown]
# ## 6 · The dispatch kernel
#
# `moelab.core.moe_dispatch` sorts (token, slot) pairs by expert and runs one grouped matmul per projection; the
# reference loops over tokens and calls each chosen expert. A small timing on real FFN inputs of layer 5, routed by its
# own router (the full benchmark is in `benchmarks/`).

# %%
layer = core.moe_layers(runs["with balancing loss"])[-1]
x_real = primer.ffn_inputs(runs["with balancing loss"], tok, eval_texts, layer=-1, max_tokens=max(cfg["timing_tokens"]))
timing = primer.time_dispatch(layer, x_real, cfg["timing_tokens"], repeats=cfg["timing_repeats"])
run.save_table(timing, "table9", "dispatch_timing", caption="grouped dispatch vs per-token loop, seconds")
tm = timing.groupby(["tokens", "impl"]).seconds.median().unstack()
fig, ax = plt.subplots(figsize=(6, 3.4))
tm.plot.bar(ax=ax, rot=0, logy=True)
ax.set(ylabel="seconds (median)", title="dispatch: grouped vs per-token loop")
run.savefig(fig, "fig5", "dispatch_speed", caption="median wall time per call")
plt.show()
speedup = (tm["naive_loop"] / tm["grouped"])
print(f"grouped dispatch is {speedup.iloc[-1]:.0f}x faster than the loop at {tm.index[-1]} tokens "
      f"(max abs difference {timing.max_abs_diff.max():.1e})")

# %% [markdown]
# ## Claims
#
# Verdicts are computed from the tables saved above by `moelab.claims.defs.nb00_moe_primer`, where the paper's numbers
# are written beside each claim with the table or figure they come from; the verdict rule (interval, MDE, unit of
# replication) is in docs/CLAIMS.md, and `python -m moelab.claims rebuild` recomputes the same file from the committed
# tables. Three of the six facts are identities (upcycling at initialisation, the two aggregation norms): they are
# recorded as *holds by construction* with the measured deviation, and only a deviation beyond rounding would count.

# %%
claims = run.finish()
moelab.nbrun.claims_for_reader(claims)   # all 25 fields per claim: figures/00_moe_primer/claims.json
