"""Small helpers of the primer notebook ``notebooks/00_moe_primer.py`` (what an MoE layer does).

Real model: all-MiniLM-L6-v2 (``moelab.assets``), sparsely upcycled with :func:`moelab.core.moeify`.
Real data: WordNet 3.0 noun synsets (``moelab.assets.wordnet_dir``): (lemma, gloss) pairs for a short contrastive
run, the sentence encoder's own training objective (in-batch negatives, Henderson et al. 2017 / sentence-transformers'
MultipleNegativesRankingLoss), written here because it is five lines on top of our MoE layers' routing statistics.
"""
from __future__ import annotations

import copy
import random
import re
import time
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from torch import nn

from moelab.assets import minilm_path, wordnet_dir
from moelab.core import capture_moe, moe_layers, top_p_route, topk_route
from moelab.core.aggregation import linear, sba
from moelab.core.dispatch import moe_dispatch, naive_dispatch
from moelab.core.losses import in_batch_contrastive, load_balancing_loss
from moelab.train import TrainConfig, train

__all__ = ["wordnet_gloss_pairs", "load_minilm_hf", "embed", "contrastive_loss_fn", "routing_table", "expert_load",
           "load_imbalance", "train_only_moe", "moe_param_groups", "two_vector_aggregation", "time_dispatch",
           "router_logits", "active_expert_counts", "real_norm_ratio", "ffn_inputs", "contrastive_eval_fn",
           "upcycling_equivalence", "ROUTER_INIT_STD", "redraw_routers", "router_change", "BalancingRuns", "ARMS",
           "train_balancing_runs", "load_tables", "plot_balancing", "plot_routing_weights",
           "plot_active_experts", "plot_aggregation", "dispatch_medians", "plot_dispatch"]


def wordnet_gloss_pairs(n: int, seed: int = 0, min_words: int = 3) -> list[tuple[str, str]]:
    """``n`` (lemma, gloss) pairs from WordNet's noun synsets, shuffled with ``seed`` (gloss = text before the first
    ';' or example quote; lemmas with underscores become spaces). One pair per synset, glosses of >= ``min_words``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    pairs = []
    with open(wordnet_dir() / "data.noun", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.startswith("  ") or "|" not in line:
                continue  # licence header
            head, gloss = line.split("|", 1)
            f = head.split()
            lemma = f[4].replace("_", " ")
            lemma = re.sub(r"\(.*\)$", "", lemma)
            g = re.split(r';|"', gloss.strip())[0].strip()
            if len(g.split()) >= min_words and lemma.isascii():
                pairs.append((lemma, g))
    rng = random.Random(seed)
    rng.shuffle(pairs)
    if n > len(pairs):
        raise ValueError(f"asked for {n} pairs, WordNet nouns give {len(pairs)}")
    return pairs[:n]


def load_minilm_hf():
    """(BertModel, tokenizer) of the real all-MiniLM-L6-v2 in float32 (transformers' AutoModel)."""
    from transformers import AutoModel, AutoTokenizer

    p = str(minilm_path())
    return AutoModel.from_pretrained(p, dtype=torch.float32), AutoTokenizer.from_pretrained(p)


def embed(model, tok, texts, max_length: int = 32, normalize: bool = True):
    """Sentence embeddings as all-MiniLM-L6-v2 makes them: masked mean pooling, then L2 normalisation  [N, d].
    Returns (embeddings, batch encoding) so callers can read the attention mask."""
    dev = next(model.parameters()).device
    enc = tok(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt").to(dev)
    h = model(**enc).last_hidden_state                                    # [N,S,d]
    m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)                   # [N,S,1]
    e = (h * m).sum(1) / m.sum(1).clamp_min(1e-9)                         # mean over real tokens   [N,d]
    return (nn.functional.normalize(e, dim=-1) if normalize else e), enc


def _layer_stats(model, mask):
    """Per MoE layer: router logits of real tokens and the load f_e (fraction of token-slots per expert)."""
    keep = mask.reshape(-1).bool()
    out = []
    for layer in moe_layers(model):
        z = layer.last_router_logits                                      # [T,E]  (T = N*S, padding included)
        idx = layer.last_route.indices[keep]                              # [T_real,k]
        load = torch.bincount(idx.reshape(-1).clamp_min(0), minlength=layer.num_experts).float()
        out.append((z, load / load.sum()))
    return out


def train_only_moe(model) -> int:
    """Freeze everything but the MoE layers (experts + routers); returns the number of trainable parameters."""
    model.requires_grad_(False)
    for layer in moe_layers(model):
        layer.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def moe_param_groups(model, router_lr: float, expert_lr: float) -> list[dict]:
    """Optimiser groups for :func:`moelab.train.train`: routers at ``router_lr``, experts at ``expert_lr`` (a router
    starts from scratch, the experts are copies of a trained FFN)."""
    routers, experts = [], []
    for layer in moe_layers(model):
        for name, p in layer.named_parameters():
            if p.requires_grad:
                (routers if name.startswith("router.") else experts).append(p)
    if not routers:
        raise ValueError("no trainable router parameters found (call train_only_moe first)")
    return [{"params": routers, "lr": router_lr}, {"params": experts, "lr": expert_lr}]


def load_imbalance(load) -> np.ndarray:
    """Coefficient of variation of expert load, std_e(f_e) / mean_e(f_e) (0 = perfectly balanced); works on [E] or
    [..., E] arrays."""
    f = np.asarray(load, dtype=float)
    return f.std(-1) / f.mean(-1)


def contrastive_loss_fn(tok, aux_coef: float = 0.0, scale: float = 20.0, max_length: int = 32):
    """``loss_fn(model, batch)`` for :func:`moelab.train.train`: batch = list of (lemma, gloss) pairs.

    L = CE(scale · cos(a_i, g_j), i)   (in-batch negatives)  + aux_coef · Σ_layers L_balance   where L_balance is the
    Switch loss E Σ_e f_e P_e over real tokens (:func:`moelab.core.load_balancing_loss`). Metrics: the contrastive
    loss, the balancing loss and each MoE layer's load imbalance (coefficient of variation of f_e)."""
    if aux_coef < 0:
        raise ValueError(f"aux_coef must be >= 0, got {aux_coef}")

    def loss_fn(model, batch):
        anchors, glosses = zip(*batch)
        ea, enc_a = embed(model, tok, anchors, max_length)
        stats_a = _layer_stats(model, enc_a["attention_mask"])
        eg, enc_g = embed(model, tok, glosses, max_length)
        stats_g = _layer_stats(model, enc_g["attention_mask"])
        lc = in_batch_contrastive(ea, eg, scale)                           # [B,B] scores inside
        bal = []
        metrics = {"contrastive": lc.detach()}
        for i, ((za, la), (zg, lg)) in enumerate(zip(stats_a, stats_g)):
            layer = moe_layers(model)[i]
            bal.append(load_balancing_loss(torch.cat([za, zg]), layer.num_experts, layer.top_k,
                                           torch.cat([enc_a["attention_mask"].reshape(-1),
                                                      enc_g["attention_mask"].reshape(-1)])))
            metrics[f"imbalance_L{i}"] = float(load_imbalance(((la + lg) / 2).cpu().numpy()))
        lb = torch.stack(bal).sum()
        metrics["balance_loss"] = lb.detach()
        metrics["task_loss"] = lc   # the contrastive loss alone: its router gradient is logged
        return lc + aux_coef * lb, metrics

    return loss_fn


@torch.no_grad()
def expert_load(model, tok, texts, batch_size: int = 32, max_length: int = 32) -> pd.DataFrame:
    """Tidy expert load on real tokens: one row per (batch, layer, expert) with ``load`` = fraction of the batch's
    token-slots routed to the expert."""
    model.eval()
    rows = []
    for b in range(0, len(texts), batch_size):
        _, enc = embed(model, tok, texts[b:b + batch_size], max_length)
        for li, (_, load) in enumerate(_layer_stats(model, enc["attention_mask"])):
            rows += [{"batch": b // batch_size, "layer": li, "expert": e, "load": float(v)} for e, v in enumerate(load)]
    return pd.DataFrame(rows)


@torch.no_grad()
def routing_table(model, tok, text: str, layer: int = -1) -> pd.DataFrame:
    """Router probabilities softmax(z) of every token of ``text`` at MoE layer ``layer`` with the kept top-k flag:
    one row per (token, expert)."""
    model.eval()
    _, enc = embed(model, tok, [text])
    lay = moe_layers(model)[layer]
    probs = torch.softmax(lay.last_router_logits.float(), -1)             # [S,E]
    kept = torch.zeros_like(probs, dtype=torch.bool).scatter_(1, lay.last_route.indices.clamp_min(0), True)
    toks = tok.convert_ids_to_tokens(enc["input_ids"][0])
    return pd.DataFrame([{"position": t, "token": toks[t], "expert": e, "prob": float(probs[t, e]),
                          "kept": bool(kept[t, e])} for t in range(len(toks)) for e in range(probs.shape[1])])


def two_vector_aggregation(angles_deg, weights=(0.5, 0.5), norms=(1.0, 1.0)) -> pd.DataFrame:
    """Linear vs spherical (SBA) aggregation of two expert outputs at the given angles (2-D, so it can be drawn):
    ``y_lin = w1 e1 + w2 e2`` vs ``moelab.core.aggregation.sba``. Returns norms of both and the expected linear norm
    for equal unit vectors and weights, cos(θ/2) (SBA paper 001, Sec. III: the inward collapse)."""
    rows = []
    w = torch.tensor([list(weights)], dtype=torch.float64)
    for a in angles_deg:
        t = np.deg2rad(a)
        e = torch.tensor([[[norms[0], 0.0], [norms[1] * np.cos(t), norms[1] * np.sin(t)]]], dtype=torch.float64)
        yl, ys = linear(e, w)[0], sba(e, w)[0]
        rows.append({"angle_deg": float(a), "linear_norm": float(yl.norm()), "sba_norm": float(ys.norm()),
                     "mean_expert_norm": float((w[0] * e[0].norm(dim=-1)).sum()),
                     "cos_half_angle": float(np.cos(t / 2)),
                     "linear_x": float(yl[0]), "linear_y": float(yl[1]), "sba_x": float(ys[0]), "sba_y": float(ys[1])})
    return pd.DataFrame(rows)


def time_dispatch(layer, x, tokens_list, repeats: int = 3) -> pd.DataFrame:
    """Wall time of the sorted grouped dispatch (:func:`moelab.core.moe_dispatch`) vs the per-token loop
    (:func:`moelab.core.dispatch.naive_dispatch`) for a real MoE ``layer`` on real FFN inputs ``x [T,d]`` routed by
    the layer's own router. One row per (tokens, impl, repeat), with the max abs difference of the two outputs."""
    if max(tokens_list) > x.shape[0]:
        raise ValueError(f"tokens_list asks for {max(tokens_list)} tokens, x has {x.shape[0]}")
    rows = []
    with torch.no_grad():
        _, route = layer.route(x)
        for T in tokens_list:
            xt, idx, w = x[:T], route.indices[:T], route.weights[:T]
            diff = float((moe_dispatch(xt, idx, w, layer.experts) - naive_dispatch(xt, idx, w, layer.experts)).abs().max())
            for name, fn in (("grouped", moe_dispatch), ("naive_loop", naive_dispatch)):
                for r in range(repeats):
                    t0 = time.perf_counter()
                    fn(xt, idx, w, layer.experts)
                    rows.append({"tokens": T, "impl": name, "repeat": r, "seconds": time.perf_counter() - t0,
                                 "max_abs_diff": diff})
    return pd.DataFrame(rows)


@torch.no_grad()
def router_logits(model, tok, texts, batch_size: int = 32, max_length: int = 32) -> list[torch.Tensor]:
    """Router logits of every real (non-padding) token at each MoE layer: list over layers of [T_real, E]."""
    model.eval()
    out = [[] for _ in moe_layers(model)]
    for b in range(0, len(texts), batch_size):
        _, enc = embed(model, tok, texts[b:b + batch_size], max_length)
        keep = enc["attention_mask"].reshape(-1).bool()
        for i, layer in enumerate(moe_layers(model)):
            out[i].append(layer.last_router_logits[keep].float().cpu())
    return [torch.cat(z) for z in out]


def active_expert_counts(logits: list[torch.Tensor], top_k: int, top_ps) -> pd.DataFrame:
    """Number of experts each token activates under top-k and under top-p (MASS convention, ``core.top_p_route``):
    one row per (rule, layer, token)."""
    rows = []
    for li, z in enumerate(logits):
        r = topk_route(z, top_k)
        n = (r.indices >= 0).sum(-1)
        rows.append(pd.DataFrame({"rule": f"top-{top_k}", "layer": li, "token": np.arange(len(z)), "active": n.numpy()}))
        for p in top_ps:
            _, mask = top_p_route(z, p, convention="mass")
            rows.append(pd.DataFrame({"rule": f"top-p {p}", "layer": li, "token": np.arange(len(z)),
                                      "active": mask.sum(-1).numpy()}))
    return pd.concat(rows, ignore_index=True)


@torch.no_grad()
def real_norm_ratio(model, tok, texts, max_length: int = 32) -> pd.DataFrame:
    """For real tokens (one text at a time, so no padding) at each MoE layer: the norm of the linear mix and of the
    SBA mix of the kept experts' outputs, relative to the weighted mean expert norm Σ_i w_i ||e_i|| (SBA's radius)."""
    model.eval()
    with capture_moe(model, keep_outputs=True, stats=False) as cap:
        for t in texts:
            embed(model, tok, [t], max_length)
    rows = []
    for li, (name, rec) in enumerate(cap.records.items()):
        e, w = rec["expert_outputs"].double(), rec["weights"].double()     # [T,k,d], [T,k]
        radius = (w * e.norm(dim=-1)).sum(-1)                              # r = Σ w_i ||e_i||   [T]
        rows.append(pd.DataFrame({"layer": li, "token": np.arange(len(w)),
                                  "linear_ratio": (linear(e, w).norm(dim=-1) / radius).numpy(),
                                  "sba_ratio": (sba(e, w).norm(dim=-1) / radius).numpy(),
                                  "cos_top2": torch.nn.functional.cosine_similarity(e[:, 0], e[:, 1], -1).numpy()}))
    return pd.concat(rows, ignore_index=True)


@torch.no_grad()
def ffn_inputs(model, tok, texts, layer: int = -1, max_tokens: int = 256, batch_size: int = 32,
               max_length: int = 32) -> torch.Tensor:
    """Real inputs x [T,d] (padding dropped) of the MoE layer ``layer`` (index among MoE layers)."""
    lay = moe_layers(model)[layer]
    got = []

    def hook(mod, args):
        got.append(args[0].reshape(-1, args[0].shape[-1]).detach()[keep[0]])

    h = lay.register_forward_pre_hook(hook)
    try:
        for b in range(0, len(texts), batch_size):
            enc = tok(list(texts[b:b + batch_size]), padding=True, truncation=True, max_length=max_length,
                      return_tensors="pt")
            keep = [enc["attention_mask"].reshape(-1).bool()]
            model(**enc)
            if sum(len(g) for g in got) >= max_tokens:
                break
    finally:
        h.remove()
    x = torch.cat(got)[:max_tokens]
    if len(x) < max_tokens:
        raise ValueError(f"texts give {len(x)} tokens, max_tokens={max_tokens} requested")
    return x


def contrastive_eval_fn(tok, pairs, batch_size: int = 32, scale: float = 20.0, max_length: int = 32):
    """``eval_fn(model) -> {"heldout_contrastive": mean in-batch-negatives loss}`` over held-out (lemma, gloss)
    pairs in fixed batches (for :func:`moelab.train.train`'s ``eval_fn``; also callable on any model)."""
    if len(pairs) < batch_size:
        raise ValueError(f"need at least batch_size={batch_size} held-out pairs, got {len(pairs)}")

    @torch.no_grad()
    def eval_fn(model):
        losses = []
        for b in range(0, len(pairs) - batch_size + 1, batch_size):
            anchors, glosses = zip(*pairs[b:b + batch_size])
            ea, _ = embed(model, tok, anchors, max_length)
            eg, _ = embed(model, tok, glosses, max_length)
            losses.append(float(in_batch_contrastive(ea, eg, scale)))
        return {"heldout_contrastive": float(np.mean(losses))}

    return eval_fn


# ------------------------------------------------------------------ the notebook's steps (00 sections 1-6) and plots

@torch.no_grad()
def upcycling_equivalence(dense, upcycled, tok, texts) -> pd.DataFrame:
    """Section 1 of notebook 00: per sentence, the largest |dense - upcycled| embedding coordinate and the cosine of
    the two (unit) embeddings; sparse upcycling with renormalised top-k weights gives Σ_i w_i E(x) = E(x)."""
    e_dense, _ = embed(dense.eval(), tok, texts)
    e_moe, _ = embed(upcycled.eval(), tok, texts)
    return pd.DataFrame({"text": list(texts), "max_abs_diff": (e_dense - e_moe).abs().amax(-1).numpy(),
                         "cosine": (e_dense * e_moe).sum(-1).numpy()})


# the router initialisation of moelab.core's LinearRouter (N(0, 0.02^2)), redrawn per training seed
ROUTER_INIT_STD = 0.02


@torch.no_grad()
def redraw_routers(model, seed: int, std: float = ROUTER_INIT_STD):
    """A copy of the upcycled ``model`` whose routers are drawn afresh from N(0, ``std``^2) with ``seed`` (a
    generator of its own, so the draw depends on ``seed`` alone): the object a training seed draws. The experts stay
    copies of the dense FFN, so the copy still equals the dense model (section 1)."""
    model = copy.deepcopy(model)
    g = torch.Generator().manual_seed(int(seed))
    for layer in moe_layers(model):
        w = layer.router.weight
        w.copy_(torch.randn(w.shape, generator=g, dtype=w.dtype) * std)
    return model


@torch.no_grad()
def router_change(before, after) -> list[float]:
    """Per MoE layer: how far training moved the router, ||W_after - W_before||_F / ||W_before||_F."""
    return [float((a.router.weight - b.router.weight).norm() / b.router.weight.norm())
            for b, a in zip(moe_layers(before), moe_layers(after))]


@dataclass
class BalancingRuns:
    """What :func:`train_balancing_runs` returns: ``inits`` (seed -> upcycled model with that seed's router draw),
    ``runs`` ((seed, arm) -> trained model), ``history`` (per-step metrics, columns ``seed`` and ``run``),
    ``heldout`` (held-out contrastive loss: step 0 is the seed's model at initialisation, run ``both``, = dense
    MiniLM) and ``router_change`` (per seed, arm and MoE layer: ``rel_change`` of :func:`router_change`)."""
    inits: dict
    runs: dict
    history: pd.DataFrame
    heldout: pd.DataFrame
    router_change: pd.DataFrame

    def models(self) -> dict:
        """(seed, run) -> model for every seed: ``at initialisation`` and both arms (for :func:`load_tables`)."""
        out = {}
        for seed, init in self.inits.items():
            out[(seed, "at initialisation")] = init
            out.update({k: m for k, m in self.runs.items() if k[0] == seed})
        return out


ARMS = ("no balancing loss", "with balancing loss")


def train_balancing_runs(upcycled, tok, train_pairs, eval_fn, *, seeds, aux_coef: float, steps: int, batch: int,
                         router_lr: float, expert_lr: float, warmup_frac: float, eval_every: int) -> BalancingRuns:
    """Section 2 of notebook 00: for every training seed, the routers of ``upcycled`` are redrawn with the seed
    (:func:`redraw_routers`) and two copies trained through :func:`moelab.train.train` (MoE layers only, routers at
    ``router_lr``, experts at ``expert_lr``), once without and once with ``aux_coef`` x the Switch balancing loss:
    the two arms of a seed share its router draw, batches and dropout (a paired comparison by seed)."""
    if not seeds or len(set(seeds)) != len(list(seeds)):
        raise ValueError(f"seeds must be distinct training seeds, got {seeds!r}")
    inits, runs, histories, evals, moved = {}, {}, [], [], []
    for seed in seeds:
        init = inits[seed] = redraw_routers(upcycled, seed)
        loss0 = eval_fn(init.eval())["heldout_contrastive"]
        evals.append(pd.DataFrame({"seed": [seed], "step": [0], "heldout_contrastive": [loss0], "run": ["both"]}))
        for name, coef in zip(ARMS, (0.0, aux_coef)):
            model = copy.deepcopy(init)
            train_only_moe(model)
            loader = torch.utils.data.DataLoader(train_pairs, batch_size=batch, shuffle=True, collate_fn=list)
            res = train(model, loader, loss_fn=contrastive_loss_fn(tok, aux_coef=coef),
                        cfg=TrainConfig(lr=router_lr, steps=steps, warmup_frac=warmup_frac, seed=seed,
                                        eval_every=eval_every, desc=f"{name}, seed {seed}"), eval_fn=eval_fn,
                        param_groups=moe_param_groups(model, router_lr, expert_lr))
            runs[(seed, name)] = res.model
            histories.append(res.history.assign(seed=seed, run=name))
            evals.append(res.eval_history.assign(seed=seed, run=name))
            moved += [{"seed": seed, "run": name, "layer": i, "rel_change": c}
                      for i, c in enumerate(router_change(init, res.model))]
    return BalancingRuns(inits, runs, pd.concat(histories, ignore_index=True), pd.concat(evals, ignore_index=True),
                         pd.DataFrame(moved))


def load_tables(models: dict, tok, texts) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Expert load of every model on held-out ``texts`` (:func:`expert_load`; ``models`` maps (seed, run) -> model,
    columns ``seed`` and ``run``) and its imbalance per (seed, run, layer, batch): the coefficient of variation of
    the load (:func:`load_imbalance`)."""
    load = pd.concat([expert_load(m, tok, texts).assign(seed=seed, run=name) for (seed, name), m in models.items()])
    imb = (load.groupby(["seed", "run", "layer", "batch"]).load.apply(_imbalance_of).rename("imbalance")
           .reset_index())
    return load, imb


def _imbalance_of(s: pd.Series) -> float:
    return float(load_imbalance(s.to_numpy()))


def plot_balancing(history, heldout, load, runs_order, num_experts: int):
    """Fig. 1 of notebook 00, means over the training seeds: contrastive loss (training batches faint, held-out
    dots), load imbalance while training (thin: each seed), and the held-out load of the last MoE layer by expert
    rank (each seed's experts sorted by load, then averaged: expert ids are arbitrary per seed; dashed: 1/E)."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    imb_cols = [c for c in history.columns if c.startswith("imbalance_L")]
    history = history.assign(imbalance=history[imb_cols].mean(axis=1))
    colors = {"at initialisation": "0.6"}
    for name, h in history.groupby("run"):
        mean = h.groupby("step")[["contrastive", "imbalance"]].mean()
        axes[0].plot(mean.index, mean.contrastive, alpha=0.35, lw=1)
        color = colors[name] = axes[0].lines[-1].get_color()
        e = heldout[heldout.run.isin([name, "both"])].groupby("step").heldout_contrastive.mean()
        axes[0].plot(e.index, e.values, "o-", color=color, label=f"{name} (held-out)")
        for _, hs in h.groupby("seed"):
            axes[1].plot(hs.step, hs.imbalance, color=color, lw=0.6, alpha=0.4)
        axes[1].plot(mean.index, mean.imbalance, color=color, lw=2, label=name)
    n_seeds = history.seed.nunique()
    axes[0].set(xlabel="step", ylabel="contrastive loss",
                title=f"loss: training batches (faint), held-out (dots); mean of {n_seeds} seed(s)")
    axes[1].set(xlabel="step", ylabel="mean CV of expert load", title="load imbalance while training")
    last = load[load.layer == load.layer.max()]  # expert ids are per layer: show the last MoE layer
    share = last.groupby(["seed", "run", "expert"]).load.mean().rename("share").reset_index()
    share["rank"] = share.groupby(["seed", "run"]).share.rank(ascending=False, method="first").astype(int)
    share.groupby(["run", "rank"]).share.mean().unstack(0)[list(runs_order)].plot.bar(
        ax=axes[2], rot=0, color=[colors.get(r, "k") for r in runs_order])
    axes[2].axhline(1 / num_experts, color="k", lw=0.8, ls="--")  # uniform share 1/E
    axes[2].set(xlabel="expert rank (by load)", ylabel="share of token-slots",
                title="held-out load by expert rank, last MoE layer")
    axes[0].legend()
    fig.tight_layout()
    return fig


def plot_routing_weights(rt: pd.DataFrame):
    """Fig. 2 of notebook 00: router probabilities per token (rows) and expert (columns); red = kept top-k."""
    grid = rt.pivot(index="position", columns="expert", values="prob")
    kept = rt.pivot(index="position", columns="expert", values="kept")
    fig, ax = plt.subplots(figsize=(6, 0.32 * len(grid) + 1.2))
    im = ax.imshow(grid.to_numpy(), cmap="viridis", aspect="auto")
    for (i, j) in zip(*np.nonzero(kept.to_numpy())):
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="red", lw=1.5))
    ax.set_yticks(range(len(grid)), rt.drop_duplicates("position").token)
    ax.set_xlabel("expert")
    fig.colorbar(im, label="router probability")
    return fig


def plot_active_experts(active: pd.DataFrame, num_experts: int):
    """Fig. 3 of notebook 00: the distribution of active experts per token under each routing rule."""
    fig, ax = plt.subplots(figsize=(7, 3.4))
    bins = np.arange(0.5, num_experts + 1.5)
    for rule, a in active.groupby("rule", sort=False):
        ax.hist(a.active, bins=bins, histtype="step", lw=2, density=True, label=rule)
    ax.set(xlabel="active experts per token", ylabel="share of tokens", title="top-k vs top-p")
    ax.legend()
    return fig


def plot_aggregation(agg: pd.DataFrame, angles=(60, 120, 165)):
    """Fig. 4 of notebook 00: the linear and SBA mixes of two unit vectors drawn at ``angles`` (left), and the norm of
    each mix against the angle with cos(θ/2) (right)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    t = np.linspace(0, np.pi, 200)
    axes[0].plot(np.cos(t), np.sin(t), color="0.7", lw=1)
    for a in angles:
        r = agg[agg.angle_deg == a].iloc[0]
        th = np.deg2rad(a)
        axes[0].plot([1, np.cos(th)], [0, np.sin(th)], "k:", lw=0.8)
        axes[0].annotate("", (np.cos(th), np.sin(th)), (0, 0), arrowprops=dict(arrowstyle="->", color="0.4"))
        axes[0].plot(r.linear_x, r.linear_y, "o", color="C0", label="linear" if a == angles[0] else None)
        axes[0].plot(r.sba_x, r.sba_y, "s", color="C1", label="SBA" if a == angles[0] else None)
    axes[0].annotate("", (1, 0), (0, 0), arrowprops=dict(arrowstyle="->", color="0.4"))
    axes[0].set(aspect="equal", title="mixing two unit vectors (w = ½, ½)")
    axes[0].legend()
    axes[1].plot(agg.angle_deg, agg.linear_norm, "o-", label="linear")
    axes[1].plot(agg.angle_deg, agg.sba_norm, "s-", label="SBA")
    axes[1].plot(agg.angle_deg, agg.cos_half_angle, "k--", lw=0.8, label="cos(θ/2)")
    axes[1].set(xlabel="angle between experts θ (degrees)", ylabel="norm of the mix", title="inward collapse")
    axes[1].legend()
    fig.tight_layout()
    return fig


def dispatch_medians(timing: pd.DataFrame) -> pd.DataFrame:
    """Median seconds per (tokens, implementation) of :func:`time_dispatch`'s table: one row per token count."""
    return timing.groupby(["tokens", "impl"]).seconds.median().unstack()


def plot_dispatch(tm: pd.DataFrame):
    """Fig. 5 of notebook 00: median wall time of the grouped dispatch and the per-token loop (log scale)."""
    fig, ax = plt.subplots(figsize=(6, 3.4))
    tm.plot.bar(ax=ax, rot=0, logy=True)
    ax.set(ylabel="seconds (median)", title="dispatch: grouped vs per-token loop")
    return fig
