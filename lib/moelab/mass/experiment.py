"""Runs of the MASS experiments (paper 003, Sec. 4; notebook ``notebooks/04_mass.py``): the synthetic model, its
training loop, the naive grid and the MASS runs, and the real-data part (GLUE stand-in).

- :class:`StackedMoETransformer` (MASS Sec. 4.1 "Model"): M independent single-layer Transformer encoders (token
  embedding, sinusoidal positions, causal self-attention, MoE FFN of Linear+SiLU experts d->d with a linear softmax
  gate, shared decoder) held as stacked parameters with a leading model axis, so that a whole naive grid trains in
  one process with batched matmuls (written by hand: one Adam over [M, ...] tensors is M independent Adams; no
  library batches differently-routed models).  Every model has ``max_experts`` slots; free slots are masked out.
- :func:`train_stacked`: a plain loop with the trainer's hook points (``after_backward(step, model, optimizer)``,
  ``after_step``) -- not ``moelab.train.train`` because the grid trains many models with one summed loss and MASS's
  NLL stopping test re-runs the current batch inside the step.  An optional loss mask scores only the target tokens
  y of the in-context format (MASS Sec. 4.1).
- :class:`SynthSetup`, :func:`run_naive`, :func:`run_mass`: the synthetic experiment (documents or the paper's
  in-context format, ``data_format``); :func:`run_from_config` runs either from a config dict
  (``python -m moelab.launch moelab.mass:run_from_config --config cfg.json``).
- :func:`glue_standin`, :func:`run_glue_standin`: the real-data part (MASS Sec. 4.4 stand-in).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from transformers import AutoTokenizer, BertModel
from transformers.utils import logging as hf_logging

from moelab import assets, progress
from moelab import train as mtrain
from moelab.core import diagnostics, moe_layers
from moelab.cache import memo, path_identity
from moelab.core.convert import moeify
from moelab.mass.data import (GINCConfig, bert_large_path, build_ginc, check_glue_dir, glue_task, incontext_bayes,
                              ngram_baselines, sample_documents, sample_incontext, within_example_bayes)
from moelab.mass.method import (DynMoEAdapter, MassConfig, MassExpander, MassLayerExpander, mass_settings,
                                slots_delta, top_p_weights, topk_weights)
from moelab.seed import seed_everything
from moelab.suite import textcls

__all__ = ["sinusoidal_positions", "StackedMoETransformer", "train_stacked", "lr_factor", "LR_DECAYS",
           "run_naive_groups", "eval_per_sequence", "evaluate_stacked", "collect_routing", "SynthSetup", "EVAL_SPLITS", "reference_levels",
           "run_naive", "run_mass", "run_from_config", "GLUE_METHODS", "GlueStandinConfig", "MiniLMClassifier",
           "BertPoolerClassifier", "glue_standin", "run_glue_standin", "resolve_device", "DEVICES", "NGRAM_K_GRID", "mass_config",
           "cached_reference_levels", "TRAINED", "naive_frontier", "mass_start_runs", "topk_sweep", "task_digest",
           "run_glue_standin_cached", "glue_part"]


# ----------------------------------------------------------------------------------------------- model
def sinusoidal_positions(length: int, d: int) -> torch.Tensor:
    """PE[t, 2i] = sin(t / 10000^{2i/d}), PE[t, 2i+1] = cos(...)   [length, d] (Vaswani et al.; the "sinusoidal
    positional encoding" of MASS Sec. 4.1 "Model", notebook 04)."""
    pos = torch.arange(length, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    pe = torch.zeros(length, d)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)[:, : d // 2]
    return pe


class StackedMoETransformer(torch.nn.Module):
    """M single-layer MoE Transformers with stacked parameters (MASS Sec. 4.1 "Model"; notebook 04).

    x = Emb[tok] + PE;  h = x + Attn(LN(x));  u = LN(h);  p = softmax(W_g u)  [M, N, E];
    y = h + sum_e w_e(p) SiLU(W1_e u + b1_e);  logits = Dec(LN(y)).
    ``num_experts`` [M]: initially active slots per model; ``top_k`` [M] (naive) or ``top_p`` (MASS) routing.

    ``d_ff`` (default None: the paper's expert SiLU(W1_e u + b1_e), W1 d x d): an expert with a hidden width,
    W2_e SiLU(W1_e u + b1_e) with W1_e [d_ff, d], W2_e [d, d_ff] (a stated departure of notebook 04's ``default``).

    ``attn_layers`` (default 1, the paper's single layer): with L > 1, L - 1 attention-only residual blocks
    x <- x + Attn_l(LN_l(x)) run before the block above (its attention is the L-th), so the model can form the
    two-layer induction circuits in-context inference needs; the MoE layer, and so everything MASS edits, is
    unchanged.  The extra blocks draw their initial weights from a separate generator stream, so L = 1 models are
    identical to the one-layer model of the same seed.
    """

    def __init__(self, n_models: int, vocab: int, d_model: int, n_heads: int, seq_len: int, max_experts: int,
                 num_experts, top_k=None, top_p: float | None = None, seeds=None, attn_layers: int = 1,
                 d_ff: int | None = None):
        super().__init__()
        if d_ff is not None and int(d_ff) < 1:
            raise ValueError(f"d_ff={d_ff} must be >= 1 (None: the paper's single Linear+SiLU expert)")
        self.d_ff = None if d_ff is None else int(d_ff)
        f = d_model if self.d_ff is None else self.d_ff
        if attn_layers < 1:
            raise ValueError(f"attn_layers={attn_layers} must be >= 1 (1: the paper's one-layer model)")
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        num_experts = torch.as_tensor(num_experts, dtype=torch.long).reshape(-1).expand(n_models).clone()
        if num_experts.min() < 1 or num_experts.max() > max_experts:
            raise ValueError(f"num_experts={num_experts.tolist()} must lie in [1, max_experts={max_experts}]")
        if (top_k is None) == (top_p is None):
            raise ValueError("give exactly one of top_k (naive) or top_p (MASS)")
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"top_p={top_p} must lie in (0, 1]")
        self.M, self.V, self.d, self.h, self.E = n_models, vocab, d_model, n_heads, max_experts
        self.top_p = top_p
        self.register_buffer("active", torch.arange(max_experts)[None, :] < num_experts[:, None])   # [M, E] bool
        self.register_buffer("top_k", None if top_k is None else
                             torch.as_tensor(top_k, dtype=torch.long).reshape(-1).expand(n_models).clone())
        self.register_buffer("pe", sinusoidal_positions(seq_len, d_model))
        seeds = list(range(n_models)) if seeds is None else list(seeds)
        if len(seeds) != n_models:
            raise ValueError(f"len(seeds)={len(seeds)} != n_models={n_models}")
        shapes = dict(emb=(vocab, d_model), wqkv=(3 * d_model, d_model), wo=(d_model, d_model),
                      gate=(max_experts, d_model), w1=(max_experts, f, d_model), b1=(max_experts, f),
                      dec=(vocab, d_model))
        per = {k: [] for k in shapes}
        for s in seeds:                                   # each model's init from its own generator (exact per seed)
            g = torch.Generator().manual_seed(int(s))
            per["emb"].append(torch.randn(vocab, d_model, generator=g) * 0.1)
            per["wqkv"].append(torch.randn(3 * d_model, d_model, generator=g) / math.sqrt(d_model))
            per["wo"].append(torch.randn(d_model, d_model, generator=g) / math.sqrt(d_model))
            per["gate"].append(torch.randn(max_experts, d_model, generator=g) * 0.02)
            per["w1"].append(torch.randn(max_experts, f, d_model, generator=g) / math.sqrt(d_model))
            per["b1"].append(torch.zeros(max_experts, f))
            per["dec"].append(torch.randn(vocab, d_model, generator=g) / math.sqrt(d_model))
            if self.d_ff is not None:                      # drawn last: the d_ff=None stream is unchanged
                per.setdefault("w2", []).append(torch.randn(max_experts, d_model, f, generator=g) / math.sqrt(f))
        for k in per:
            setattr(self, k, torch.nn.Parameter(torch.stack(per[k])))
        if self.d_ff is None:
            self.w2 = None
        self.L = int(attn_layers)
        if self.L > 1:                                    # extra attention-only blocks [M, L-1, ...]
            pre_q, pre_o = [], []
            for s in seeds:
                g = torch.Generator().manual_seed(10_007 + int(s))
                pre_q.append(torch.randn(self.L - 1, 3 * d_model, d_model, generator=g) / math.sqrt(d_model))
                pre_o.append(torch.randn(self.L - 1, d_model, d_model, generator=g) / math.sqrt(d_model))
            self.pre_wqkv = torch.nn.Parameter(torch.stack(pre_q))
            self.pre_wo = torch.nn.Parameter(torch.stack(pre_o))
            self.pre_ln_g = torch.nn.Parameter(torch.ones(n_models, self.L - 1, d_model))
            self.pre_ln_b = torch.nn.Parameter(torch.zeros(n_models, self.L - 1, d_model))
        self.ln = torch.nn.ParameterDict({f"{n}_{w}": torch.nn.Parameter(torch.full((n_models, d_model), float(w == "g")))
                                          for n in ("ln1", "ln2", "ln3") for w in ("g", "b")})
        self.last_probs = self.last_weights = None

    def _ln(self, x, name):
        g, b = self.ln[f"{name}_g"], self.ln[f"{name}_b"]
        return F.layer_norm(x, x.shape[-1:]) * g[:, None, None, :] + b[:, None, None, :]

    def _attention(self, x: torch.Tensor, wqkv: torch.Tensor, wo: torch.Tensor) -> torch.Tensor:
        """Causal multi-head self-attention of LN'd x [M, B, S, d] with per-model wqkv [M, 3d, d], wo [M, d, d]."""
        M, B, S, d = x.shape
        H = self.h
        qkv = torch.einsum("mbsd,mfd->mbsf", x, wqkv)
        q, k, v = (t.reshape(M * B, S, H, d // H).transpose(1, 2) for t in qkv.split(d, dim=-1))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)              # causal: next-token prediction
        return torch.einsum("mbsd,med->mbse", att.transpose(1, 2).reshape(M, B, S, d), wo)

    def route(self, u: torch.Tensor, active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """u [M, N, d] -> (probs [M, N, E], weights [M, N, E]); free slots get probability 0."""
        logits = torch.einsum("mnd,med->mne", u, self.gate)                       # W_g u   [M, N, E]
        logits = logits.masked_fill(~active[:, None, :], float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p is not None:
            weights = top_p_weights(logits, self.top_p)
        else:
            k = torch.minimum(self.top_k, active.sum(1))
            weights = topk_weights(probs, k)
        return probs, weights

    def forward(self, tokens: torch.Tensor, active: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [B, S] (shared by all models) -> logits [M, B, S, V]; stores ``last_probs``/``last_weights`` [M, B*S, E]."""
        if tokens.ndim != 2 or tokens.shape[1] > self.pe.shape[0]:
            raise ValueError(f"tokens must be [B, S<= {self.pe.shape[0]}], got {tuple(tokens.shape)}")
        active = self.active if active is None else active
        M, (B, S), d = self.M, tokens.shape, self.d
        x = self.emb[:, tokens] + self.pe[:S]                                        # [M, B, S, d]
        for l in range(self.L - 1):                                                 # attention-only blocks
            xn = F.layer_norm(x, (d,)) * self.pre_ln_g[:, l, None, None] + self.pre_ln_b[:, l, None, None]
            x = x + self._attention(xn, self.pre_wqkv[:, l], self.pre_wo[:, l])
        h = x + self._attention(self._ln(x, "ln1"), self.wqkv, self.wo)
        u = self._ln(h, "ln2").reshape(M, B * S, d)
        probs, weights = self.route(u, active)
        # expert outputs SiLU(W1_e u + b1_e) (d_ff: W2_e SiLU(W1_e u + b1_e))  [M, N, E, d]; y = sum_e w_e out_e
        out = F.silu(torch.einsum("mnd,meod->mneo", u, self.w1) + self.b1[:, None])
        if self.w2 is not None:
            out = torch.einsum("mnef,meof->mneo", out, self.w2)
        y = torch.einsum("mne,mneo->mno", weights, out)
        self.last_probs, self.last_weights = probs, weights
        z = h + y.reshape(M, B, S, d)
        return torch.einsum("mbsd,mvd->mbsv", self._ln(z, "ln3"), self.dec)

    def expert_matrices(self) -> list:
        """The expert weight matrices the MASS tests read: [w1] (the paper's expert) or [w1, w2] (``d_ff``)."""
        return [self.w1] if self.w2 is None else [self.w1, self.w2]

    def batch_nll(self, batch: torch.Tensor, active: torch.Tensor | None = None,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
        """Per-model mean NLL of ``batch`` [B, S+1] under ``active`` [M, E] (MASS's stopping test)  [M]; ``mask``
        as in :func:`_nll` (default: the loss mask of the current training batch, if any)."""
        mask = getattr(self, "_last_mask", None) if mask is None else mask
        return _nll(self(batch[:, :-1], active=active), batch, mask).mean(1)


def _nll(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-model, per-sequence mean next-token cross-entropy: logits [M,B,S,V] (inputs tokens[:, :-1]) -> [M, B].
    ``mask`` [B, S+1] bool aligned with ``tokens``: only tokens t >= 1 with mask[t] are scored (the in-context
    format's targets y); None scores tokens 1..S."""
    M, B, S, V = logits.shape
    tgt = tokens[:, 1:S + 1].expand(M, B, S)
    ce = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1), reduction="none").reshape(M, B, S)
    if mask is None:
        return ce.mean(-1)
    w = mask[:, 1:S + 1].to(ce.dtype)                                           # [B, S]
    if torch.any(w.sum(-1) == 0):
        raise ValueError("a sequence has no scored position in mask")
    return (ce * w).sum(-1) / w.sum(-1)


def _autocast(device: str):
    """bf16 autocast on CUDA (the GPU path), nothing on CPU (float32, numerically today's path)."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()


# ----------------------------------------------------------------------------------------------- training
LR_DECAYS = ("none", "cosine")


def lr_factor(step: int, steps: int, warm: int, decay: str = "none") -> float:
    """Learning-rate multiplier of 0-based ``step`` (notebook 04's schedule): linear warm-up (s + 1)/warm over the
    first ``warm`` steps, then 1 ("none") or the cosine 1/2 (1 + cos(pi (s + 1 - warm) / (steps - warm))) down to 0
    at the last step ("cosine")."""
    if step < warm:
        return (step + 1) / warm
    if decay == "none" or steps <= warm:
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step + 1 - warm) / (steps - warm))))


def train_stacked(model: StackedMoETransformer, docs: np.ndarray, *, steps: int, batch_size: int, lr: float,
                  warmup_frac: float = 0.05, seed: int = 0, aux_loss=None, after_backward=None, after_step=None,
                  log_every: int = 10, desc: str = "stacked MoE", router_frozen: bool = False,
                  progress_bar: bool | None = None, loss_mask: np.ndarray | None = None,
                  decay: str = "none", device: str = "cpu", router_lr_mult: float = 1.0) -> pd.DataFrame:
    """Adam on the sum over models of each model's mean CE (models independent: disjoint parameters, elementwise Adam;
    MASS Sec. 4.1, notebook 04).  docs [n, S+1] token ids, drawn in a seeded order; ``loss_mask`` [n, S+1] bool: score
    only those tokens (the in-context format's targets y; None: every next token).  Hook points as in ``moelab.train``: ``aux_loss(step, model)``
    -> extra scalar added to the loss, ``after_backward(step, model, optimizer)`` may edit gradients (MASS),
    ``after_step(step, model)``.  Returns history (step, model, loss, router_grad_norm, router_frozen) at the logged
    steps (0-based ``step % log_every == 0`` and the last).

    ``router_grad_norm``: ||d CE_m / d W_g[m]|| of each model's gate from its task loss alone
    (``aux_loss`` excluded), via ``moelab.core.diagnostics``; a model whose gate gets no task gradient at any logged
    step where it has more than one active expert raises RuntimeError (run named ``desc``, model index) unless
    ``router_frozen`` (a single active expert has probability 1 under any rule: nothing to route, nothing to learn;
    ``active_experts`` is logged).  ``decay``: the learning-rate schedule after warm-up (:func:`lr_factor`).
    ``router_lr_mult``: the gate's learning rate is ``router_lr_mult`` x ``lr`` (its own Adam parameter group, same
    schedule; 1: one learning rate for everything).
    ``progress_bar``: a bar over the steps (None: follow ``MOELAB_PROGRESS``).  ``device``: "cpu" (float32, one
    thread: the path every committed CPU number comes from), "cuda" (the model is moved there and the forward pass
    runs under bf16 autocast; Adam's state and the loss stay float32) or "auto" (:func:`resolve_device`)."""
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps={steps} and batch_size={batch_size} must be >= 1")
    dev = resolve_device(device)
    model.to(dev)
    docs_t = torch.as_tensor(docs, dtype=torch.long, device=dev)
    mask_t = None if loss_mask is None else torch.as_tensor(np.asarray(loss_mask, bool), device=dev)
    if mask_t is not None and mask_t.shape != docs_t.shape:
        raise ValueError(f"loss_mask shape {tuple(mask_t.shape)} != docs shape {tuple(docs_t.shape)}")
    rng = np.random.default_rng(seed)
    if dev == "cpu":
        torch.set_num_threads(1)   # many small ops: one thread is ~10x faster than two on the shared, loaded CPU
    if not router_lr_mult > 0:
        raise ValueError(f"router_lr_mult={router_lr_mult} must be > 0")
    if router_lr_mult == 1.0:
        opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=True)
    else:
        rest = [p for n, p in model.named_parameters() if n != "gate"]
        opt = torch.optim.Adam([dict(params=rest, lr=lr), dict(params=[model.gate], lr=lr * router_lr_mult)],
                               lr=lr, foreach=True)
    if decay not in LR_DECAYS:
        raise ValueError(f"decay={decay!r} must be one of {LR_DECAYS}")
    warm = max(1, int(warmup_frac * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, warm, decay))
    rows = []
    model.train()
    bar = progress.bar(total=steps, desc=desc, unit="step", disable=None if progress_bar is None else not progress_bar)
    for step in range(steps):
        rows_i = torch.as_tensor(rng.integers(0, len(docs_t), batch_size), device=dev)
        batch = docs_t[rows_i]
        bmask = None if mask_t is None else mask_t[rows_i]
        with _autocast(dev):
            logits = model(batch[:, :-1])
        per_model = _nll(logits.float(), batch, bmask).mean(1)      # [M]
        loss = per_model.sum()
        logged = step % log_every == 0 or step == steps - 1
        if logged:   # task gradient of each gate: models are independent, so d(sum_m CE_m)/dW_g[m] = dCE_m/dW_g[m]
            g_gate = diagnostics.router_grads(loss, {"gate": [model.gate]})["gate"][0]          # [M, E, d]
            router_norms = g_gate.flatten(1).double().norm(dim=1).tolist()
            n_active = model.active.sum(1).tolist()
        if aux_loss is not None:
            loss = loss + aux_loss(step, model)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        model._last_batch, model._last_losses, model._last_mask = batch, per_model.detach(), bmask
        if after_backward is not None:
            after_backward(step, model, opt)
        opt.step()
        sched.step()
        if after_step is not None:
            after_step(step, model)
        bar.update(1)
        if logged:
            pl = per_model.detach().tolist()
            rows += [dict(step=step, model=m, loss=pl[m], router_grad_norm=router_norms[m], active_experts=n_active[m],
                          router_frozen=router_frozen) for m in range(model.M)]
    bar.close()
    hist = pd.DataFrame(rows)
    routed = hist[hist.active_experts > 1]
    diagnostics.check_router_learns({f"model {m}": g.router_grad_norm for m, g in routed.groupby("model")}, run=desc,
                                    router_frozen=router_frozen)
    return hist


@torch.no_grad()
def eval_per_sequence(model: StackedMoETransformer, docs: np.ndarray, chunk: int = 32,
                      mask: np.ndarray | None = None) -> np.ndarray:
    """Per-model, per-sequence mean test NLL (nats)  [M, n_docs] over the tokens of ``mask`` (None: tokens 1..S)."""
    return evaluate_stacked(model, docs, mask, chunk)["nll"]


@torch.no_grad()
def evaluate_stacked(model: StackedMoETransformer, docs: np.ndarray, mask: np.ndarray | None = None,
                     chunk: int = 32) -> dict:
    """Test metrics per model and sequence (notebook 04): dict(nll [M, n] over the tokens of ``mask`` (the targets y
    of the in-context format; None: tokens 1..S), full_nll [M, n] over tokens 1..S, acc [M, n] (argmax == token)
    over the tokens of ``mask``)."""
    model.eval()
    dev = model.pe.device.type
    docs_t = torch.as_tensor(docs, dtype=torch.long, device=dev)
    mask_t = None if mask is None else torch.as_tensor(np.asarray(mask, bool), device=dev)
    nll, full, acc = [], [], []
    for i, b in enumerate(docs_t.split(chunk)):
        bm = None if mask_t is None else mask_t[i * chunk: i * chunk + len(b)]
        with _autocast(dev):
            logits = model(b[:, :-1])                                          # [M, B, S, V]
        logits = logits.float()
        nll.append(_nll(logits, b, bm))
        full.append(_nll(logits, b))
        hit = (logits.argmax(-1) == b[None, :, 1:]).to(torch.float64)          # [M, B, S]
        w = torch.ones_like(hit[0]) if bm is None else bm[:, 1:].to(torch.float64)
        acc.append((hit * w).sum(-1) / w.sum(-1))
    return {k: torch.cat(v, 1).cpu().numpy() for k, v in dict(nll=nll, full_nll=full, acc=acc).items()}


@torch.no_grad()
def collect_routing(model: StackedMoETransformer, docs: np.ndarray, chunk: int = 32, which: str = "weights") -> np.ndarray:
    """Routing of each input token  [M, n_docs*(S), E] (token t of doc = input t; MASS Sec. 4.3 Fig. 3):
    ``which="weights"``: the weights after top-k / top-p; ``"probs"``: the gate's softmax p = softmax(W_g u) (the
    paper's routing distribution)."""
    if which not in ("weights", "probs"):
        raise ValueError(f"which={which!r} must be 'weights' or 'probs'")
    model.eval()
    dev = model.pe.device.type
    docs_t = torch.as_tensor(docs, dtype=torch.long, device=dev)
    ws = []
    for b in docs_t.split(chunk):
        with _autocast(dev):
            model(b[:, :-1])
        w = model.last_weights if which == "weights" else model.last_probs
        ws.append(w.float().reshape(model.M, b.shape[0], -1, model.E).cpu())
    return torch.cat(ws, 1).reshape(model.M, -1, model.E).numpy()



# ----------------------------------------------------------------------------------------------- experiment drivers
DEVICES = ("auto", "cpu", "cuda")


def resolve_device(device: str) -> str:
    """"auto" -> "cuda" when a GPU is present, else "cpu"; "cuda" without a GPU raises ValueError."""
    if device not in DEVICES:
        raise ValueError(f"device={device!r} must be one of {DEVICES}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no CUDA device is present: use device='auto' or 'cpu'")
    return device


DATA_FORMATS = ("documents", "incontext")
# held-out splits: independent draws of the same process, seeded data_seed + offset (train: data_seed)
EVAL_SPLITS = {"test": 1000, "validation": 2000}


@dataclass
class SynthSetup:
    """Width, sequence length, steps, data etc. of the synthetic experiment (MASS Sec. 4.1; fixed from naive runs
    only; notebook 04).  ``data_format``: "documents" (raw GINC documents of ``seq_len + 1`` tokens, loss on every
    next token) or "incontext" (the paper's [x1, y1, o, ..., xn, yn] sequences of ``n_examples`` examples of
    ``example_len`` tokens, :func:`moelab.mass.data.sample_incontext`; loss on the targets y with
    ``loss_on="targets"``, on every next token with "all"; the model's input length is n_examples (example_len+1) - 2
    and ``seq_len`` is ignored).  ``entity_switch``: :class:`moelab.mass.data.GINCConfig`'s switching rule.
    ``eval_split``: which held-out draw :meth:`data` returns as its third element ("test": seed data_seed + 1000;
    "validation": data_seed + 2000, the only split model settings are chosen on, ``scripts/tune_04.py``).
    ``attn_layers``: attention layers of :class:`StackedMoETransformer` (1: the paper's one-layer model).
    ``n_entities``, ``n_properties``, ``n_symbols``: the GINC family (10/10/50: GINC's scripts; 5/5/10: the defaults
    of GINC's generator).  ``device``: "auto" (CUDA with bf16 autocast when present, else CPU in float32), "cuda" or
    "cpu".  ``d_ff``: the experts' hidden width (None: the paper's single Linear+SiLU expert, W1 d x d; an integer:
    W2 SiLU(W1 u + b1) with W1 [d_ff, d]).  ``router_lr_mult``: the gate's learning rate as a multiple of ``lr``."""
    d_model: int = 32
    n_heads: int = 2
    seq_len: int = 16
    batch_size: int = 16
    steps: int = 400
    lr: float = 1e-2
    lr_decay: str = "none"
    max_experts: int = 16
    n_test: int = 256
    ginc_seed: int = 0
    data_seed: int = 1
    data_format: str = "documents"
    n_examples: int = 3
    example_len: int = 5
    loss_on: str = "targets"
    entity_switch: str = "t1"
    eval_split: str = "test"
    attn_layers: int = 1
    n_entities: int = 10
    n_properties: int = 10
    n_symbols: int = 50
    device: str = "auto"
    d_ff: int | None = None
    router_lr_mult: float = 1.0

    def __post_init__(self):
        resolve_device(self.device)
        if self.d_ff is not None and int(self.d_ff) < 1:
            raise ValueError(f"d_ff={self.d_ff} must be >= 1 (None: the paper's single Linear+SiLU expert)")
        if not self.router_lr_mult > 0:
            raise ValueError(f"router_lr_mult={self.router_lr_mult} must be > 0")
        if self.attn_layers < 1:
            raise ValueError(f"attn_layers={self.attn_layers} must be >= 1 (1: the paper's one-layer model)")
        if self.eval_split not in EVAL_SPLITS:
            raise ValueError(f"eval_split={self.eval_split!r} must be one of {EVAL_SPLITS} (tune on 'validation')")
        if self.data_format not in DATA_FORMATS:
            raise ValueError(f"data_format={self.data_format!r} must be one of {DATA_FORMATS}")
        if self.lr_decay not in LR_DECAYS:
            raise ValueError(f"lr_decay={self.lr_decay!r} must be one of {LR_DECAYS}")
        if self.loss_on not in ("targets", "all"):
            raise ValueError(f"loss_on={self.loss_on!r} must be 'targets' or 'all'")
        if self.data_format == "incontext" and (self.n_examples < 1 or self.example_len < 2
                                                or self.n_examples * (self.example_len + 1) < 3):
            raise ValueError(f"n_examples={self.n_examples}, example_len={self.example_len}: need n_examples >= 1, "
                             "example_len >= 2 and a sequence of at least 2 tokens")

    @property
    def input_len(self) -> int:
        """Tokens the model reads per sequence (sequence length - 1)."""
        if self.data_format == "incontext":
            return self.n_examples * (self.example_len + 1) - 2
        return self.seq_len

    def ginc(self):
        return build_ginc(GINCConfig(seed=self.ginc_seed, entity_switch=self.entity_switch, n_entities=self.n_entities,
                                     n_properties=self.n_properties, n_symbols=self.n_symbols))

    @property
    def torch_device(self) -> str:
        """The device runs train on: "cuda" or "cpu" (``device="auto"``: CUDA when present)."""
        return resolve_device(self.device)

    def key(self) -> dict:
        """Cache key of the setup: its fields with the device resolved (a GPU run, bf16, is not a CPU run); the fields
        added later (``d_ff``, ``router_lr_mult``) enter only when they differ from their defaults, so the keys of
        setups that do not use them are unchanged."""
        key = dict(vars(self), device=self.torch_device)
        for name, default in _LATER_FIELDS.items():
            if key[name] == default:
                del key[name]
        return key

    @property
    def expert_numel(self) -> int:
        """Size of the weights MASS's semantic test reads per expert: d^2 (W1), or 2 d d_ff (W1 and W2)."""
        return self.d_model ** 2 if self.d_ff is None else 2 * self.d_model * int(self.d_ff)

    def data(self):
        """(GINC family, train, test) -- all seeded.  documents: train = tokens [steps*B, S+1], test = dict(tokens,
        states, concept); incontext: both dicts of :func:`moelab.mass.data.sample_incontext`."""
        g = self.ginc()
        n_train = self.steps * self.batch_size
        held = self.data_seed + EVAL_SPLITS[self.eval_split]
        if self.data_format == "incontext":
            train = sample_incontext(g, n_train, self.n_examples, self.example_len, seed=self.data_seed)
            test = sample_incontext(g, self.n_test, self.n_examples, self.example_len, seed=held)
            return g, train, test
        train = sample_documents(g, n_train, self.seq_len + 1, seed=self.data_seed)["tokens"]
        test = sample_documents(g, self.n_test, self.seq_len + 1, seed=held)
        return g, train, test

    def arrays(self, data, held_out: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """(tokens, mask or None) of a part returned by :meth:`data`: the training loss mask (``loss_on``), or with
        ``held_out=True`` the scoring mask, always the targets y of the in-context format (the paper evaluates the
        prediction of y whatever the training loss)."""
        if isinstance(data, dict) and "target_mask" in data:
            return data["tokens"], (data["target_mask"] if held_out or self.loss_on == "targets" else None)
        return (data["tokens"] if isinstance(data, dict) else data), None


_LATER_FIELDS = dict(d_ff=None, router_lr_mult=1.0)

NGRAM_K_GRID = (0.01, 0.03, 0.1, 0.3, 1.0)


def reference_levels(setup: SynthSetup, orders=(1, 2, 3, 4), k_grid=NGRAM_K_GRID) -> pd.DataFrame:
    """Reference levels of the in-context task on the setup's held-out draw (MASS Sec. 4.1; notebook 04's regime
    check): the exact Bayes floor (:func:`moelab.mass.data.incontext_bayes`), the Bayes predictor that sees only the
    current example (:func:`moelab.mass.data.within_example_bayes`), and add-k n-grams of ``orders`` fitted on the
    SAME training draw the models see (``steps x batch_size`` sequences of the setup), counted on the targets
    (``fit_on="targets"``) and on every position ("all"), with k chosen from ``k_grid`` by the target NLL of an
    independent validation draw (seed data_seed + 2000; the test draw is never used to choose).  Returns
    DataFrame(name, order, fit_on, k, target_nll, full_nll, target_acc, val_target_nll), the Bayes row first."""
    if setup.data_format != "incontext":
        raise ValueError(f"reference_levels needs data_format='incontext', got {setup.data_format!r}")
    g, train, test = setup.data()
    val = sample_incontext(g, setup.n_test, setup.n_examples, setup.example_len,
                           seed=setup.data_seed + EVAL_SPLITS["validation"])
    b, w = incontext_bayes(g, test), within_example_bayes(g, test)
    rows = [dict(name="Bayes", order=0, fit_on="exact", k=np.nan, target_nll=float(b["target_nll"].mean()),
                 full_nll=float(b["full_nll"].mean()), target_acc=float(b["target_acc"].mean()),
                 val_target_nll=float(incontext_bayes(g, val)["target_nll"].mean())),
            dict(name="within-example Bayes", order=0, fit_on="exact", k=np.nan,
                 target_nll=float(w["target_nll"].mean()), full_nll=np.nan, target_acc=float(w["target_acc"].mean()),
                 val_target_nll=float(within_example_bayes(g, val)["target_nll"].mean()))]
    for fit_on in ("targets", "all"):
        for o in orders:
            on_val = {k: float(ngram_baselines(train, val, g.cfg.n_symbols, orders=(o,), k=k, fit_on=fit_on)
                               .target_nll[0]) for k in k_grid}
            k = min(on_val, key=on_val.get)                                   # add-k chosen on validation
            r = ngram_baselines(train, test, g.cfg.n_symbols, orders=(o,), k=k, fit_on=fit_on).iloc[0]
            rows.append(dict(name=r["name"], order=o, fit_on=fit_on, k=k, target_nll=float(r.target_nll),
                             full_nll=float(r.full_nll), target_acc=float(r.target_acc), val_target_nll=on_val[k]))
    return pd.DataFrame(rows)


def _bucket(num_experts: int) -> int:
    """Slots per stacked group: models are stacked with E padded to 4, 8 or 16 (dense compute scales with slots)."""
    return next(b for b in (4, 8, 16, 32, 64) if num_experts <= b)


def run_naive(setup: SynthSetup, configs: list[tuple[int, int, int]], keep_routing: bool = False) -> dict:
    """Train naive top-k MoEs ``configs`` = [(num_experts, top_k, seed)], stacked per slot bucket (MASS Sec. 4.3 naive
    frontier; notebook 04).  Returns dict(table: DataFrame(num_experts, top_k, seed, test_loss (targets y for the
    in-context format with loss_on="targets"), test_full_loss, test_acc), item_losses [n_cfg, n_test],
    history: DataFrame(step, num_experts, top_k, seed, loss), routing: {cfg_index: [N, E]} (post-top-k weights)
    and probs: {cfg_index: [N, E]} (gate softmax) if keep_routing)."""
    for E, k, s in configs:
        if not 1 <= k <= E <= setup.max_experts:
            raise ValueError(f"bad naive config num_experts={E}, top_k={k} (need 1 <= k <= E <= {setup.max_experts})")
    g, train, test = setup.data()
    tr_tok, tr_mask = setup.arrays(train)
    te_tok, te_mask = setup.arrays(test, held_out=True)
    idx_by_bucket: dict[int, list[int]] = {}
    for i, (E, _, _) in enumerate(configs):
        idx_by_bucket.setdefault(_bucket(E), []).append(i)
    items = np.zeros((len(configs), setup.n_test))
    full, acc = np.zeros(len(configs)), np.zeros(len(configs))
    hists, routing, probs = [], {}, {}
    for slots, idx in progress.bar(sorted(idx_by_bucket.items()), desc="naive grid (stacked by slots)", unit="stack"):
        cf = [configs[i] for i in idx]
        model = StackedMoETransformer(len(cf), g.cfg.n_symbols, setup.d_model, setup.n_heads, setup.input_len, slots,
                                      num_experts=[c[0] for c in cf], top_k=[c[1] for c in cf],
                                      seeds=[1000 * c[2] + 17 * c[0] + c[1] for c in cf],
                                      attn_layers=setup.attn_layers, d_ff=setup.d_ff)
        h = train_stacked(model, tr_tok, steps=setup.steps, batch_size=setup.batch_size, lr=setup.lr,
                          seed=setup.data_seed, desc=f"naive {len(cf)} models, {slots} slots", loss_mask=tr_mask,
                          decay=setup.lr_decay, device=setup.torch_device, router_lr_mult=setup.router_lr_mult)
        h[["num_experts", "top_k", "seed"]] = np.asarray(cf)[h.model.to_numpy()]
        hists.append(h.drop(columns="model"))
        ev = evaluate_stacked(model, te_tok, te_mask)
        items[idx], full[idx], acc[idx] = ev["nll"], ev["full_nll"].mean(1), ev["acc"].mean(1)
        if keep_routing:
            w, p = collect_routing(model, te_tok), collect_routing(model, te_tok, which="probs")
            for j, i in enumerate(idx):
                routing[i], probs[i] = w[j], p[j]
    table = pd.DataFrame(configs, columns=["num_experts", "top_k", "seed"])
    table["test_loss"], table["test_full_loss"], table["test_acc"] = items.mean(1), full, acc
    return dict(table=table, item_losses=items, history=pd.concat(hists, ignore_index=True), routing=routing,
                probs=probs)


def run_naive_groups(setup: SynthSetup, configs: list[tuple[int, int, int]], keep_routing: bool = False,
                     cache=None, trained: dict | None = None) -> dict:
    """:func:`run_naive` one expert count at a time, each group through ``cache(kind, key, compute)`` (e.g.
    :func:`moelab.cache.memo`; None: no cache), so a stopped long profile resumes group by group (a long
    profile is resumable run by run).  Same return value as :func:`run_naive` on all ``configs``, in their order; each group's
    models get the seeds :func:`run_naive` gives them, so the numbers do not depend on the grouping except through
    stacking (models are independent).

    ``trained`` (optional, a dict kept across calls, e.g. :data:`TRAINED`): every model trained or loaded here is
    recorded in it by setup and config, and a config already recorded for the same setup is taken from it instead of
    being trained again (notebook 04's top-k sweep at E = 4 holds three models of the naive grid).  Groups keep their
    routing so that any recorded model can serve a ``keep_routing`` call.  A model's numbers do not depend on the
    other models of its stack (disjoint parameters, per-model batched matmuls, elementwise Adam; the same draw of
    training batches), so a reused model is the one a fresh stack would train."""
    groups: dict[int, list[int]] = {}
    for i, (E, _, _) in enumerate(configs):
        groups.setdefault(E, []).append(i)
    skey = json.dumps(setup.key(), sort_keys=True, default=str)
    runs = {} if trained is None else trained                            # (setup, config) -> that model's results
    items = np.zeros((len(configs), setup.n_test))
    tables, hists, routing, probs = [None] * len(configs), [], {}, {}
    for E, idx in groups.items():
        cf = [tuple(int(v) for v in configs[i]) for i in idx]
        todo = [c for c in dict.fromkeys(cf) if (skey, c) not in runs]
        if todo:
            keep = keep_routing or trained is not None
            compute = (lambda todo=todo, keep=keep: run_naive(setup, todo, keep_routing=keep))
            res = compute() if cache is None else cache("mass_naive_group", dict(setup=setup.key(), configs=todo,
                                                                                  keep_routing=keep), compute)
            h = res["history"]
            for j, c in enumerate(todo):
                runs[(skey, c)] = dict(row=res["table"].iloc[j], items=res["item_losses"][j],
                                       history=h[(h.num_experts == c[0]) & (h.top_k == c[1]) & (h.seed == c[2])],
                                       routing=res["routing"].get(j), probs=res["probs"].get(j))
        for i, c in zip(idx, cf):
            r = runs[(skey, c)]
            items[i], tables[i] = r["items"], r["row"]
            if keep_routing:
                if r["routing"] is None:
                    raise ValueError(f"naive model {c} was recorded without routing: pass keep_routing=True")
                routing[i], probs[i] = r["routing"], r["probs"]
        hists.append(pd.concat([runs[(skey, c)]["history"] for c in cf])
                     .sort_values("step", kind="stable"))                # run_naive's order: step, then stack
    return dict(table=pd.DataFrame(tables).reset_index(drop=True).astype(
                    {"num_experts": int, "top_k": int, "seed": int}),
                item_losses=items, history=pd.concat(hists, ignore_index=True), routing=routing, probs=probs)


ACTIVE_PROBE = 128     # test sequences on which run_mass counts active experts at init and at the end of expansion


@torch.no_grad()
def _active_per_token(model: StackedMoETransformer, tokens: np.ndarray) -> np.ndarray:
    """Mean number of experts with a nonzero routing weight per input token, per model  [M] (leaves the model in
    training mode)."""
    dev = model.pe.device.type
    w = collect_routing(model.to(dev), tokens)
    model.train()
    return (w > 0).sum(-1).mean(1)


def run_mass(setup: SynthSetup, mass_cfg: MassConfig, seeds, init_experts: int | None = None,
             top_p: float = 0.5) -> dict:
    """Train ``len(seeds)`` MASS models stacked (MASS Alg. 1 with top-p routing; notebook 04), starting from
    ``init_experts`` active experts (None: ``mass_cfg.init_experts``).  Returns dict(table per run: seed,
    init_experts, final_experts, mean_active, test_loss, test_full_loss, test_acc, stop_reason, expansions,
    removals, active_init / active_expansion_end (mean active experts per token on the first ``ACTIVE_PROBE`` test
    sequences at initialisation and after the last expansion step; ``mean_active``: at the end, every test
    sequence); item_losses [R, n_test]; events; trace; history; routing [R, N, E] (post-top-p weights); probs
    [R, N, E] (gate softmax))."""
    init = mass_cfg.init_experts if init_experts is None else int(init_experts)
    if not 1 <= init <= mass_cfg.max_experts:
        raise ValueError(f"init_experts={init} must lie in [1, max_experts={mass_cfg.max_experts}]")
    g, train, test = setup.data()
    tr_tok, tr_mask = setup.arrays(train)
    te_tok, te_mask = setup.arrays(test, held_out=True)
    R = len(seeds)
    model = StackedMoETransformer(R, g.cfg.n_symbols, setup.d_model, setup.n_heads, setup.input_len,
                                  mass_cfg.max_experts, num_experts=init, top_p=top_p,
                                  seeds=[5000 + 1000 * s for s in seeds], attn_layers=setup.attn_layers,
                                  d_ff=setup.d_ff)
    ex = MassExpander(mass_cfg, R)
    probe = te_tok[:ACTIVE_PROBE]                                       # active experts per token along training
    active_at = {"init": _active_per_token(model, probe)}

    def after_step(step, m):
        if step == mass_cfg.expand_until - 1:
            active_at["expansion_end"] = _active_per_token(m, probe)

    hist = train_stacked(model, tr_tok, steps=setup.steps, batch_size=setup.batch_size, lr=setup.lr,
                         seed=setup.data_seed, aux_loss=ex.redundancy_loss, after_backward=ex.after_backward,
                         after_step=after_step, desc=f"MASS {R} runs", loss_mask=tr_mask, decay=setup.lr_decay,
                         device=setup.torch_device, router_lr_mult=setup.router_lr_mult)
    active_at.setdefault("expansion_end", np.full(R, np.nan))
    ev = evaluate_stacked(model, te_tok, te_mask)
    w = collect_routing(model, te_tok)                                  # [R, N, E]
    p = collect_routing(model, te_tok, which="probs")
    events = pd.DataFrame(ex.events, columns=["step", "model", "kind", "expert", "new", "p", "cos"])
    table = pd.DataFrame(dict(seed=list(seeds), init_experts=init, final_experts=model.active.sum(1).cpu().numpy(),
                              mean_active=(w > 0).sum(-1).mean(1), active_init=active_at["init"],
                              active_expansion_end=active_at["expansion_end"], test_loss=ev["nll"].mean(1),
                              test_full_loss=ev["full_nll"].mean(1), test_acc=ev["acc"].mean(1),
                              stop_reason=[r or "phase_end" for r in ex.stop_reason],
                              expansions=[int(((events.model == m) & (events.kind == "expand")).sum()) for m in range(R)],
                              removals=[int(((events.model == m) & (events.kind == "remove")).sum()) for m in range(R)]))
    grads = pd.DataFrame([diagnostics.router_grad_summary(hist[hist.model == m]) for m in range(R)])
    table = pd.concat([table, grads], axis=1)
    trace = pd.DataFrame(ex.trace, columns=["step", "model", "expert", "grad_norm", "z", "p"])
    return dict(table=table, item_losses=ev["nll"], events=events, trace=trace, history=hist, routing=w, probs=p)


def run_from_config(config: dict) -> pd.DataFrame:
    """Run the synthetic experiment from a config dict (notebook 04; ``python -m moelab.launch
    moelab.mass:run_from_config --config cfg.json``, one process: the stacked models train in one loop).
    Keys: ``setup`` (fields of :class:`SynthSetup`), ``kind`` ("naive" or "mass"); naive: ``configs``
    [[num_experts, top_k, seed], ...]; mass: ``seeds``, ``top_p`` (0.5), ``mass`` (fields of :class:`MassConfig`;
    ``total_steps`` defaults to the setup's steps, ``warmup``/``window`` to the public :func:`mass_settings`,
    ``delta`` to :func:`slots_delta` of the setup's width).  Returns the runs table."""
    if not isinstance(config, dict) or config.get("kind") not in ("naive", "mass"):
        raise ValueError(f"config must be a dict with kind 'naive' or 'mass', got {config!r}")
    setup = SynthSetup(**config.get("setup", {}))
    if config["kind"] == "naive":
        configs = [tuple(int(v) for v in c) for c in config.get("configs", [])]
        if not configs:
            raise ValueError("kind='naive' needs configs: [[num_experts, top_k, seed], ...]")
        return run_naive(setup, configs)["table"]
    mk = dict(config.get("mass", {}))
    mk.setdefault("total_steps", setup.steps)
    warmup, window = mass_settings(mk["total_steps"])
    mk.setdefault("warmup", warmup)
    mk.setdefault("window", window)
    mk.setdefault("delta", slots_delta(setup.d_model, numel=setup.expert_numel))
    mk.setdefault("max_experts", setup.max_experts)
    seeds = list(config.get("seeds", [0]))
    return run_mass(setup, MassConfig(**mk), seeds, top_p=float(config.get("top_p", 0.5)))["table"]


# ----------------------------------------------------------------------------------------------- real-data part (GLUE stand-in)
# MASS Sec. 4.4 / Fig. 4 fine-tunes BERT-large with MoE FFNs on five GLUE tasks and compares a cosine-router MoE (GMoE),
# DynMoE and MASS (accuracy, final pool size, active experts per token; 3 seeds).  Offline stand-in (notebook 04,
# section 6, ``full`` profile): all-MiniLM-L6-v2 with the FFN of one layer sparse-upcycled to an MoE, fine-tuned on the
# suite's usable text classification tasks (``moelab.suite.textcls``).  ``paper`` profile: the user's BERT
# (``MODEL_PATH``, CLS pooler + linear head as BertForSequenceClassification) on the official GLUE files
# (``GLUE_DIR``), plus "dense": the same BERT fine-tuned without an MoE layer (the dense parent the regime compares
# the reference MoE with).
GLUE_METHODS = ("cosine", "dynmoe", "mass", "dense")


@dataclass
class GlueStandinConfig:
    """Settings of the GLUE stand-in (notebook 04 section 7).  ``layer``: MiniLM layer whose FFN becomes the MoE
    (-1 = last).  cosine: fixed pool ``cosine_experts``, top-``cosine_top_k``.  dynmoe / mass: start with
    ``init_experts`` active of ``max_experts`` slots; dynmoe adapts every ``dyn_interval`` steps; mass uses top-p
    routing (p = 0.5, the paper's GLUE value) and expands in the first ``expand_frac`` of the steps."""
    steps: int = 100
    batch_size: int = 16
    lr: float = 5e-5            # pretrained weights (MiniLM and the upcycled experts)
    lr_new: float = 1e-3        # fresh weights (router rows, gate thresholds, classification head)
    max_length: int = 64
    eval_every: int = 25
    warmup_frac: float = 0.1
    aux_weight: float = 0.01    # Switch/GShard balancing loss, same weight for every method
    layer: int = -1
    cosine_experts: int = 4
    cosine_top_k: int = 2
    init_experts: int = 4
    max_experts: int = 9        # the paper's DynMoE pool on GLUE is 9
    dyn_interval: int = 10
    top_p: float = 0.5
    expand_frac: float = 0.10
    patience: int = 3
    # change-point windows of the 100-step stand-in (a stated deviation: the public max(30, .05T) / max(60, .09T)
    # cannot test inside a 10-step expansion phase): warm-up max(3, int(.005T)), window max(6, int(.01T))
    cpd_warmup_frac: float = 0.005
    cpd_window_frac: float = 0.01
    cpd_min_warmup: int = 3
    cpd_min_window: int = 6
    device: str = "auto"        # "auto": CUDA with bf16 autocast when present, else CPU in float32 (moelab.train)

    def __post_init__(self):
        for n in ("steps", "batch_size", "max_length", "eval_every", "cosine_experts", "cosine_top_k", "init_experts",
                  "max_experts", "dyn_interval", "patience"):
            if int(getattr(self, n)) < 1:
                raise ValueError(f"GlueStandinConfig.{n}={getattr(self, n)!r} must be >= 1")
        if not 1 <= self.init_experts <= self.max_experts or self.cosine_top_k > self.cosine_experts:
            raise ValueError(f"need 1 <= init_experts={self.init_experts} <= max_experts={self.max_experts} and "
                             f"cosine_top_k={self.cosine_top_k} <= cosine_experts={self.cosine_experts}")

    def mass_config(self, numel_w1: int) -> MassConfig:
        """MASS settings for the real-data part: warm-up/window from :func:`mass_settings` with this config's
        ``cpd_*`` values (first test at max(warm-up, window) - 1), delta = GLUE's 0.001 at 4096x1024 scaled to the
        expert's W1 size (:func:`slots_delta`), start size ``init_experts``."""
        warmup, window = mass_settings(self.steps, self.cpd_warmup_frac, self.cpd_window_frac, self.cpd_min_warmup,
                                       self.cpd_min_window)
        return MassConfig(total_steps=self.steps, warmup=warmup, window=window, patience=self.patience,
                          delta=slots_delta(0, numel=numel_w1), max_experts=self.max_experts,
                          expand_frac=self.expand_frac, init_experts=self.init_experts)



    def key(self) -> dict:
        """Cache key: the fields with the device resolved (a GPU run in bf16 is not a CPU run)."""
        return dict(vars(self), device=resolve_device(self.device))


class MiniLMClassifier(torch.nn.Module):
    """all-MiniLM-L6-v2 body (HF BertModel), mean pooling over real tokens, linear head:
    h = BERT(x) [B,S,d];  pooled = sum_s m_s h_s / sum_s m_s [B,d];  logits = W pooled + b [B,C]."""

    def __init__(self, bert, n_labels: int):
        super().__init__()
        self.bert = bert
        self.head = torch.nn.Linear(bert.config.hidden_size, n_labels)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        h = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
        m = attention_mask[..., None].to(h.dtype)
        return self.head((h * m).sum(1) / m.sum(1).clamp_min(1.0))


class BertPoolerClassifier(torch.nn.Module):
    """BERT's sequence classifier (the head of transformers' BertForSequenceClassification, which the public GLUE
    scripts fine-tune; paper profile): logits = W dropout(pooler(h_[CLS])) + b, pooler = tanh(W_p h_[CLS] + b_p) from
    the checkpoint, W a fresh [C, d] head."""

    def __init__(self, bert, n_labels: int):
        super().__init__()
        self.bert = bert
        self.drop = torch.nn.Dropout(bert.config.hidden_dropout_prob)
        self.head = torch.nn.Linear(bert.config.hidden_size, n_labels)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return self.head(self.drop(out.pooler_output))


def _check_task(task: dict) -> None:
    for split in ("train", "validation", "test"):
        if not task.get(split):
            raise ValueError(f"task split {split!r} is empty or missing")
    if not task.get("labels"):
        raise ValueError("task has no labels")


def _build_glue_model(n_labels: int, method: str, cfg: GlueStandinConfig, seed: int, model_path=None):
    """The body + head with the FFN of layer ``cfg.layer`` sparse-upcycled (experts = copies of the FFN); "dense":
    no MoE layer (returns layer None).  ``model_path`` None: all-MiniLM-L6-v2 with mean pooling (the stand-in); a
    local BERT folder: that BERT with its pooler head (:class:`BertPoolerClassifier`, the paper profile)."""
    seed_everything(seed)
    if model_path is None:
        st = assets.load_minilm()
        bert, tok = st[0].auto_model, st.tokenizer
    else:
        verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()          # a pretraining checkpoint's cls.* heads are unused here, by design
        hf_logging.disable_progress_bar()         # one load per run: no report or bar each time
        try:
            bert, tok = BertModel.from_pretrained(str(model_path)), AutoTokenizer.from_pretrained(str(model_path))
        finally:
            hf_logging.set_verbosity(verbosity)
            if bar:
                hf_logging.enable_progress_bar()
        seed_everything(seed)                     # the head and the routers are drawn the same whatever the loader drew
    bert.train()
    if method == "dense":
        model = MiniLMClassifier(bert, n_labels) if model_path is None else BertPoolerClassifier(bert, n_labels)
        return model, tok, None
    kw = dict(cosine=dict(num_experts=cfg.cosine_experts, top_k=cfg.cosine_top_k, router="cosine", renormalize=True),
              dynmoe=dict(num_experts=cfg.max_experts, top_k=1, router="topany", num_active=cfg.init_experts),
              mass=dict(num_experts=cfg.max_experts, top_k=1, router="top_p", top_p=cfg.top_p, renormalize="mass_batch",
                        num_active=cfg.init_experts))[method]
    moeify(bert, [cfg.layer], init="sparse", **kw)
    model = MiniLMClassifier(bert, n_labels) if model_path is None else BertPoolerClassifier(bert, n_labels)
    return model, tok, moe_layers(model)[0]


def glue_standin(task: dict, method: str, seed: int, cfg: GlueStandinConfig, name: str = "task",
                 model_path=None) -> dict:
    """One run of the GLUE stand-in (MASS Sec. 4.4 / Fig. 4; notebook 04 section 7): MiniLM with one upcycled MoE
    layer + mean pooling + linear head, fine-tuned with ``moelab.train.train`` on ``task['train']``; every
    ``eval_every`` steps the validation accuracy is measured and the test metrics are taken at the best one (early
    selection on validation).  ``method``: "cosine" (fixed pool, cosine router top-k), "dynmoe" (top-any gate +
    :class:`DynMoEAdapter`), "mass" (top-p routing + :class:`MassLayerExpander`, redundancy loss while expanding), "dense" (no MoE layer: the dense parent;
    pool 1, one active FFN per token).  ``model_path``: a local BERT folder (paper profile) instead of MiniLM; items
    are (text, label) or ((text_a, text_b), label) for sentence pairs.  Trains on ``cfg.device`` through
    ``moelab.train`` ("auto": CUDA with bf16 autocast when present, else CPU in float32).
    Returns dict(row: task, method, seed, acc, chance, final_pool, pool_at_best, mean_active, best_step, steps,
    n_test, expansions, removals, wall_s; correct [n_test] per-item test correctness; history; events)."""
    if method not in GLUE_METHODS:
        raise ValueError(f"method={method!r} not among {GLUE_METHODS}")
    _check_task(task)
    t0 = time.perf_counter()
    model, tok, layer = _build_glue_model(len(task["labels"]), method, cfg, seed, model_path)

    def encode(items):
        xs = [x for x, _ in items]
        texts = ([a for a, _ in xs], [b for _, b in xs]) if isinstance(xs[0], (tuple, list)) else (xs,)
        enc = tok(*texts, truncation=True, max_length=cfg.max_length, padding=True, return_tensors="pt")
        return dict(enc), torch.tensor([y for _, y in items])

    state = dict(batch=None)
    mass_ex = dyn = None

    def loss_fn(m, batch):
        enc, y = batch
        state["batch"] = batch
        ce = F.cross_entropy(m(**enc), y)                               # L = CE(W pooled, y)
        loss = ce if layer is None else ce + cfg.aux_weight * layer.aux_loss   # + balancing loss
        if mass_ex is not None:
            loss = loss + mass_ex.redundancy_loss(state.get("step", 0))  # + L_red while expanding
        state["step"] = state.get("step", 0) + 1
        # task_loss: CE alone, whose router gradient the trainer logs
        return loss, dict(ce=ce.detach(), pool=1.0 if layer is None else float(layer.active_mask.sum()), task_loss=ce)

    @torch.no_grad()
    def batch_nll(masked):                                               # MASS stopping test (eval mode: no dropout)
        enc, y = state["batch"]
        was = model.training
        keep = layer.active_mask.clone()
        model.eval()
        try:
            if masked is not None:
                layer.active_mask[masked] = False
            return float(F.cross_entropy(model(**enc), y))
        finally:
            layer.active_mask.copy_(keep)
            model.train(was)

    hooks = {}
    if method == "mass":
        mass_ex = MassLayerExpander(cfg.mass_config(layer.experts.w_in[0].numel()), layer, batch_nll)
        hooks["after_backward"] = mass_ex.after_backward
    elif method == "dynmoe":
        dyn = DynMoEAdapter(layer, cfg.dyn_interval)
        hooks["after_backward"] = dyn.after_backward

    def predict(items):
        """Per-item correctness and (active experts, real tokens) summed over the split."""
        correct, n_act, n_tok = [], 0, 0
        dev = next(model.parameters()).device                            # the trainer placed the model
        for s in range(0, len(items), 64):
            enc, y = encode(items[s:s + 64])
            enc = {k: v.to(dev) for k, v in enc.items()}
            pred = model(**enc).argmax(-1).cpu()
            correct.append((pred == y).numpy())
            real = enc["attention_mask"].reshape(-1).bool()
            n_act += int(real.sum()) if layer is None else int((layer.last_route.indices[real] >= 0).sum())
            n_tok += int(real.sum())
        return np.concatenate(correct).astype(float), n_act / max(n_tok, 1)

    best = dict(val=-1.0)

    def eval_fn(m):
        val, _ = predict(task["validation"])
        if val.mean() >= best["val"]:                                      # early selection on validation
            correct, active = predict(task["test"])
            best.update(val=float(val.mean()), correct=correct, mean_active=active, step=state.get("step", 0),
                        pool=1 if layer is None else int(layer.active_mask.sum()))
        return dict(val_acc=float(val.mean()))

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    fresh = [p for n, p in named if n.startswith("head") or ".router." in n]
    old = [p for n, p in named if not (n.startswith("head") or ".router." in n)]
    g = torch.Generator().manual_seed(seed)
    loader = DataLoader(list(task["train"]), batch_size=cfg.batch_size, shuffle=True, collate_fn=encode, generator=g,
                        drop_last=len(task["train"]) > cfg.batch_size)
    tcfg = mtrain.TrainConfig(lr=cfg.lr, steps=cfg.steps, seed=seed, eval_every=cfg.eval_every, warmup_frac=cfg.warmup_frac,
                              decay="linear", device=cfg.device, max_grad_norm=1.0, log_every=0,
                              desc=f"{name}-{method}-s{seed}")
    res = mtrain.train(model, loader, loss_fn=loss_fn, cfg=tcfg, eval_fn=eval_fn, hooks=hooks,
                       param_groups=[dict(params=old, lr=cfg.lr), dict(params=fresh, lr=cfg.lr_new)])
    if dyn is not None:
        dyn.close()
    ev = pd.DataFrame(mass_ex.pool.events if mass_ex is not None else (dyn.events if dyn is not None else []))
    kinds = ev.kind if "kind" in ev else pd.Series(dtype=str)
    row = dict(task=name, method=method, seed=seed, acc=float(best["correct"].mean()), chance=float(task["chance"]),
               final_pool=1 if layer is None else int(layer.active_mask.sum()), pool_at_best=best["pool"], mean_active=best["mean_active"],
               best_step=best["step"], steps=cfg.steps, n_test=len(task["test"]),
               expansions=int((kinds == "expand").sum()) if method == "mass" else int(ev.get("added", pd.Series()).sum()),
               removals=int((kinds == "remove").sum()) if method == "mass" else int(ev.get("removed", pd.Series()).sum()),
               wall_s=time.perf_counter() - t0)
    return dict(row=row, correct=best["correct"], history=res.history, events=ev)


def run_glue_standin(tasks: dict, methods, seeds, cfg: GlueStandinConfig,
                     model_path=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """All runs of the GLUE stand-in (notebook 04 section 6).  ``tasks``: {name: task dict} from
    ``moelab.suite.textcls.tasks`` (or :func:`moelab.mass.data.glue_task` with ``model_path``, the paper profile).
    Returns (runs: one row per (task, method, seed), see :func:`glue_standin`;
    items: task, method, seed, item, correct -- per-item test correctness for paired bootstraps)."""
    methods, seeds = list(methods), list(seeds)
    if not tasks or not methods or not seeds:
        raise ValueError(f"need tasks, methods and seeds, got {len(tasks or {})} tasks, methods={methods}, seeds={seeds}")
    bad = [m for m in methods if m not in GLUE_METHODS]
    if bad:
        raise ValueError(f"methods {bad} not among {GLUE_METHODS}")
    rows, items = [], []
    cells = [(name, method, seed) for name in tasks for method in methods for seed in seeds]
    for name, method, seed in progress.bar(cells, desc="GLUE stand-in runs", unit="run"):
        r = glue_standin(tasks[name], method, seed, cfg, name=name, model_path=model_path)
        rows.append(r["row"])
        items.append(pd.DataFrame(dict(task=name, method=method, seed=seed, item=np.arange(len(r["correct"])),
                                       correct=r["correct"])))
    return pd.DataFrame(rows), pd.concat(items, ignore_index=True)



# ----------------------------------------------------------------------------------------------- notebook 04's runs
# What each section of notebook 04 calls: the runs above, each cached through ``moelab.cache.memo`` one piece at a
# time (a reference table, an expert count, a MASS start size, a GLUE cell), so a stopped profile resumes there.
def mass_config(setup: SynthSetup, start: int) -> MassConfig:
    """The public code's MASS settings at the setup's schedule (MASS Sec. 3.4; notebook 04 section 3): warm-up
    max(30, .05T), window max(60, .09T), delta = 0.001 at the public 4096x1024 W1 scaled to the expert's size
    (:attr:`SynthSetup.expert_numel`), start ``start``."""
    return MassConfig.public(setup.steps, delta=slots_delta(setup.d_model, numel=setup.expert_numel),
                             max_experts=setup.max_experts,
                             init_experts=int(start))


def cached_reference_levels(setup: SynthSetup, cache=memo) -> pd.DataFrame:
    """:func:`reference_levels` through ``cache`` (notebook 04 section 1)."""
    return cache("mass_reference_levels", dict(setup=setup.key()), lambda: reference_levels(setup))


TRAINED: dict = {}   # the naive models this process trained or loaded, by setup and config (run_naive_groups)


def naive_frontier(setup: SynthSetup, counts, ks, seeds, cache=memo, trained: dict | None = TRAINED) -> dict:
    """The naive grid of Fig. 2 left (MASS Sec. 4.3; notebook 04 section 2): every (E, min(k, E), seed), cached per
    expert count (:func:`run_naive_groups`, its models recorded in ``trained`` for the top-k sweep).  Returns its
    dict plus ``items``: DataFrame(num_experts, top_k, seed, item, loss) of per-sequence target NLL."""
    configs = list(dict.fromkeys((int(E), min(int(k), int(E)), int(s)) for E in counts for k in ks for s in seeds))
    res = run_naive_groups(setup, configs, cache=cache, trained=trained)
    res["items"] = pd.concat([pd.DataFrame(dict(num_experts=r.num_experts, top_k=r.top_k, seed=r.seed,
                                                item=np.arange(len(l)), loss=np.round(l, 5)))
                              for r, l in zip(res["table"].itertuples(), res["item_losses"])], ignore_index=True)
    return res


def mass_start_runs(setup: SynthSetup, starts, seeds, cache=memo) -> dict:
    """MASS from every start size in ``starts`` with ``seeds`` (MASS Alg. 1; notebook 04 section 3), each start
    cached on its own.  Returns dict(table: the runs of every start (seed, init_experts, final_experts, mean_active,
    test_loss, ...); items: DataFrame(init_experts, seed, item, loss); events and trace with ``init_experts``;
    probs/routing [R, N, E] of all runs in table order; by_start: {start: :func:`run_mass` output}; configs:
    {start: MassConfig})."""
    seeds = [int(s) for s in seeds]
    by_start, configs = {}, {}
    for s0 in starts:
        mc = configs[int(s0)] = mass_config(setup, s0)
        by_start[int(s0)] = cache("mass_runs", dict(setup=setup.key(), mcfg=vars(mc), seeds=seeds),
                                  lambda mc=mc: run_mass(setup, mc, seeds))
    res = list(by_start.values())
    items = [pd.DataFrame(dict(init_experts=s0, seed=s, item=np.arange(len(l)), loss=np.round(l, 5)))
             for s0, r in by_start.items() for s, l in zip(r["table"].seed, r["item_losses"])]
    return dict(table=pd.concat([r["table"] for r in res], ignore_index=True),
                items=pd.concat(items, ignore_index=True),
                events=pd.concat([r["events"].assign(init_experts=s0) for s0, r in by_start.items()], ignore_index=True),
                trace=pd.concat([r["trace"].assign(init_experts=s0) for s0, r in by_start.items()], ignore_index=True),
                probs=np.concatenate([r["probs"] for r in res]), routing=np.concatenate([r["routing"] for r in res]),
                by_start=by_start, configs=configs)


def topk_sweep(setup: SynthSetup, num_experts: int, ks, seeds, cache=memo, trained: dict | None = TRAINED) -> dict:
    """Naive models with ``num_experts`` experts over top-k (Fig. 2 right; notebook 04 section 4), routing kept for
    Fig. 3 (the naive arm at a matched pool).  Models the naive grid already trained in this process (``trained``:
    the grid's (E, k, seed) at the same E) are reused, not trained again (:func:`run_naive_groups`)."""
    E = int(np.clip(num_experts, 1, setup.max_experts))
    configs = [(E, int(k), int(s)) for k in sorted(set(ks)) if k <= E for s in seeds]
    return run_naive_groups(setup, configs, keep_routing=True, cache=cache, trained=trained)


def task_digest(task: dict) -> str:
    """16-hex sha256 of a task's splits (texts and labels), so a cached GLUE run is keyed by the data it saw."""
    return hashlib.sha256(json.dumps(task, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_glue_standin_cached(tasks: dict, methods, seeds, cfg: GlueStandinConfig, cache=memo,
                            model_path=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`run_glue_standin` one (task, method, seed) at a time through ``cache``, keyed by the task's data digest
    (the content of every item it trains and is scored on), the method, the seed, the configuration with its device
    resolved and, with ``model_path`` (paper profile), the model folder's identity (:func:`moelab.cache.path_identity`:
    another checkpoint of the same shape is another key).  Runs seed themselves, so the result does not depend on
    which cells came from the cache.  Same return value (runs, items)."""
    methods, seeds = list(methods), list(seeds)
    if not tasks or not methods or not seeds:
        raise ValueError(f"need tasks, methods and seeds, got {len(tasks or {})} tasks, methods={methods}, seeds={seeds}")
    extra = {} if model_path is None else dict(model=path_identity(model_path))
    runs, items = [], []
    for name, task in tasks.items():
        digest = task_digest(task)
        for method in methods:
            for seed in seeds:
                r, it = cache("mass_glue_run", dict(task=name, data=digest, method=method, seed=int(seed),
                                                    cfg=cfg.key(), **extra),
                              lambda name=name, task=task, method=method, seed=seed:
                              run_glue_standin({name: task}, [method], [seed], cfg, model_path=model_path))
                runs.append(r)
                items.append(it)
    return pd.concat(runs, ignore_index=True), pd.concat(items, ignore_index=True)


def glue_part(glue, smoke: bool = False, cache=memo, model_path=None,
              glue_dir=None) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The real-data part (MASS Sec. 4.4; notebook 04 section 6) for a :class:`moelab.mass.config.GlueProfile` (None:
    not in this profile), every task, method and seed, cached run by run.  ``glue.source`` "standin": the suite's text
    classification tasks on MiniLM (``smoke``: the smoke subset); "glue" (paper profile): the GLUE tasks of
    ``glue_dir`` (:func:`moelab.mass.data.glue_task`) on the BERT at ``model_path``, each task with its own schedule
    (:meth:`GlueProfile.task_config`: ``epochs`` over its training split, evaluated every epoch).  Returns (runs,
    items) or None."""
    if glue is None:
        return None
    if glue.source == "standin":
        tasks = textcls.tasks("smoke" if smoke else "full", None if glue.tasks is None else list(glue.tasks))
        return run_glue_standin_cached(tasks, glue.methods, glue.seeds, GlueStandinConfig(**glue.standin_config()),
                                       cache=cache)
    bert_large_path(model_path, glue.layer)
    check_glue_dir(glue_dir, glue.tasks)
    runs, items = [], []
    for name in glue.tasks:
        task = glue_task(glue_dir, name, glue.val_items, glue.max_train, glue.max_eval)
        cfg = GlueStandinConfig(**glue.task_config(len(task["train"])))
        r, it = run_glue_standin_cached({name: task}, glue.methods, glue.seeds, cfg, cache=cache,
                                        model_path=model_path)
        runs.append(r)
        items.append(it)
    return pd.concat(runs, ignore_index=True), pd.concat(items, ignore_index=True)
