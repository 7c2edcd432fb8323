"""MASS: Mixture-of-Experts for Adaptive Semantic Specialization (paper 003), synthetic GINC experiment.

Notebook ``notebooks/04_mass.py``.  Pieces:
- :class:`StackedMoETransformer`: M independent single-layer Transformer encoders (token embedding, sinusoidal
  positions, causal self-attention, MoE FFN of Linear+SiLU experts d->d with a linear softmax gate, shared decoder)
  held as stacked parameters with a leading model axis, so that a whole naive grid trains in one process with
  batched matmuls (written by hand: one Adam over [M, ...] tensors is M independent Adams; no library batches
  differently-routed models).  Every model has ``max_experts`` slots; free slots are masked out of the gate.
- :func:`train_stacked`: a plain loop with the trainer's hook points (``after_backward(step, model, optimizer)``,
  ``after_step``) -- not ``moelab.train.train`` because the grid trains many models with one summed loss and MASS's
  NLL stopping test re-runs the current batch inside the step.
- :class:`MassExpander` (MASS Sec. 3.4-3.6, public code ``tutel/impls/moe_layer_mass.py``): per-expert gradient-norm
  change-point test, semantic alignment test, duplication with gradient decomposition, redundancy loss, NLL-based
  stopping with patience.
- grid/frontier/elbow helpers and the routing JSD of Fig. 3.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from scipy.stats import norm

__all__ = ["StackedMoETransformer", "topk_weights", "top_p_weights", "train_stacked", "eval_per_sequence",
           "rolling_z", "cpd_pvalue", "weight_grad_cos", "project_rows", "MassConfig", "MassExpander",
           "frontier", "elbow_max_chord", "routing_jsd", "sinusoidal_positions", "collect_routing", "SynthSetup",
           "run_naive", "run_mass", "jsd_points", "mass_settings", "slots_delta", "plot_fig2", "plot_fig3", "plot_appc",
           "load_glue_task", "bert_large_path"]


# ----------------------------------------------------------------------------------------------- routing
def topk_weights(probs: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Naive MoE gate (tutel top-k): keep the k largest of p = softmax(W_g u) per model; renormalise when k > 1.
    probs [M, N, E], k [M] long -> dense weights [M, N, E] (zero outside the top-k)."""
    if k.min() < 1:
        raise ValueError(f"top_k must be >= 1, got {k.tolist()}")
    rank = torch.argsort(torch.argsort(probs, dim=-1, descending=True), dim=-1)    # rank of each expert [M,N,E]
    keep = (rank < k[:, None, None]) & (probs > 0)
    w = probs * keep
    renorm = (k > 1)[:, None, None]
    return torch.where(renorm, w / w.sum(-1, keepdim=True).clamp_min(1e-20), w)


def top_p_weights(logits: torch.Tensor, p: float) -> torch.Tensor:
    """MASS gate (Sec. 3.3): smallest set of sorted scores whose cumulative mass reaches p, renormalised.
    logits [..., E] (-inf on free slots) -> weights [..., E], via ``moelab.core.routing.top_p_route`` ("mass")."""
    from moelab.core.routing import top_p_route
    E = logits.shape[-1]
    w, _ = top_p_route(logits.reshape(-1, E), p, convention="mass", renormalize=True)
    return w.reshape(logits.shape)


# ----------------------------------------------------------------------------------------------- model
def sinusoidal_positions(length: int, d: int) -> torch.Tensor:
    """PE[t, 2i] = sin(t / 10000^{2i/d}), PE[t, 2i+1] = cos(...)   [length, d] (Vaswani et al.)."""
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
    """

    def __init__(self, n_models: int, vocab: int, d_model: int, n_heads: int, seq_len: int, max_experts: int,
                 num_experts, top_k=None, top_p: float | None = None, seeds=None):
        super().__init__()
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
                      gate=(max_experts, d_model), w1=(max_experts, d_model, d_model), b1=(max_experts, d_model),
                      dec=(vocab, d_model))
        per = {k: [] for k in shapes}
        for s in seeds:                                   # each model's init from its own generator (exact per seed)
            g = torch.Generator().manual_seed(int(s))
            per["emb"].append(torch.randn(vocab, d_model, generator=g) * 0.1)
            per["wqkv"].append(torch.randn(3 * d_model, d_model, generator=g) / math.sqrt(d_model))
            per["wo"].append(torch.randn(d_model, d_model, generator=g) / math.sqrt(d_model))
            per["gate"].append(torch.randn(max_experts, d_model, generator=g) * 0.02)
            per["w1"].append(torch.randn(max_experts, d_model, d_model, generator=g) / math.sqrt(d_model))
            per["b1"].append(torch.zeros(max_experts, d_model))
            per["dec"].append(torch.randn(vocab, d_model, generator=g) / math.sqrt(d_model))
        for k in shapes:
            setattr(self, k, torch.nn.Parameter(torch.stack(per[k])))
        self.ln = torch.nn.ParameterDict({f"{n}_{w}": torch.nn.Parameter(torch.full((n_models, d_model), float(w == "g")))
                                          for n in ("ln1", "ln2", "ln3") for w in ("g", "b")})
        self.last_probs = self.last_weights = None

    def _ln(self, x, name):
        g, b = self.ln[f"{name}_g"], self.ln[f"{name}_b"]
        return F.layer_norm(x, x.shape[-1:]) * g[:, None, None, :] + b[:, None, None, :]

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
        M, (B, S), d, H = self.M, tokens.shape, self.d, self.h
        x = self.emb[:, tokens] + self.pe[:S]                                        # [M, B, S, d]
        qkv = torch.einsum("mbsd,mfd->mbsf", self._ln(x, "ln1"), self.wqkv)
        q, k, v = (t.reshape(M * B, S, H, d // H).transpose(1, 2) for t in qkv.split(d, dim=-1))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)              # causal: next-token prediction
        h = x + torch.einsum("mbsd,med->mbse", att.transpose(1, 2).reshape(M, B, S, d), self.wo)
        u = self._ln(h, "ln2").reshape(M, B * S, d)
        probs, weights = self.route(u, active)
        # expert outputs SiLU(W1_e u + b1_e)  [M, N, E, d]; y = sum_e w_e * out_e  [M, N, d]
        out = F.silu(torch.einsum("mnd,meod->mneo", u, self.w1) + self.b1[:, None])
        y = torch.einsum("mne,mneo->mno", weights, out)
        self.last_probs, self.last_weights = probs, weights
        z = h + y.reshape(M, B, S, d)
        return torch.einsum("mbsd,mvd->mbsv", self._ln(z, "ln3"), self.dec)


def _nll(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Per-model, per-sequence mean next-token cross-entropy: logits [M,B,S,V] (inputs tokens[:, :-1]) -> [M, B]."""
    M, B, S, V = logits.shape
    tgt = tokens[:, 1:S + 1].expand(M, B, S)
    return F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1), reduction="none").reshape(M, B, S).mean(-1)


# ----------------------------------------------------------------------------------------------- training
def train_stacked(model: StackedMoETransformer, docs: np.ndarray, *, steps: int, batch_size: int, lr: float,
                  warmup_frac: float = 0.05, seed: int = 0, aux_loss=None, after_backward=None, after_step=None,
                  log_every: int = 10) -> pd.DataFrame:
    """Adam on the sum over models of each model's mean CE (models independent: disjoint parameters, elementwise Adam).
    docs [n, S+1] token ids, drawn in a seeded order.  Hook points as in ``moelab.train``: ``aux_loss(step, model)``
    -> extra scalar added to the loss, ``after_backward(step, model, optimizer)`` may edit gradients (MASS),
    ``after_step(step, model)``.  Returns history (step, model, loss)."""
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps={steps} and batch_size={batch_size} must be >= 1")
    docs_t = torch.as_tensor(docs, dtype=torch.long)
    rng = np.random.default_rng(seed)
    torch.set_num_threads(1)   # many small ops: one thread is ~10x faster than two on the shared, loaded CPU
    opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=True)
    warm = max(1, int(warmup_frac * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    rows = []
    model.train()
    for step in range(steps):
        batch = docs_t[rng.integers(0, len(docs_t), batch_size)]
        logits = model(batch[:, :-1])
        per_model = _nll(logits, batch).mean(1)                     # [M]
        loss = per_model.sum()
        if aux_loss is not None:
            loss = loss + aux_loss(step, model)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        model._last_batch, model._last_losses = batch, per_model.detach()
        if after_backward is not None:
            after_backward(step, model, opt)
        opt.step()
        sched.step()
        if after_step is not None:
            after_step(step, model)
        if step % log_every == 0 or step == steps - 1:
            pl = per_model.detach().tolist()
            rows += [dict(step=step, model=m, loss=pl[m]) for m in range(model.M)]
    return pd.DataFrame(rows)


@torch.no_grad()
def eval_per_sequence(model: StackedMoETransformer, docs: np.ndarray, chunk: int = 32) -> np.ndarray:
    """Per-model, per-sequence mean test NLL (nats)  [M, n_docs]."""
    model.eval()
    docs_t = torch.as_tensor(docs, dtype=torch.long)
    out = [_nll(model(b[:, :-1]), b) for b in docs_t.split(chunk)]
    return torch.cat(out, 1).numpy()


@torch.no_grad()
def collect_routing(model: StackedMoETransformer, docs: np.ndarray, chunk: int = 32) -> np.ndarray:
    """Routing weights after top-k / top-p for each input token  [M, n_docs*(S), E] (token t of doc = input t)."""
    model.eval()
    docs_t = torch.as_tensor(docs, dtype=torch.long)
    ws = []
    for b in docs_t.split(chunk):
        model(b[:, :-1])
        ws.append(model.last_weights.reshape(model.M, b.shape[0], -1, model.E))
    return torch.cat(ws, 1).reshape(model.M, -1, model.E).numpy()


# ----------------------------------------------------------------------------------------------- MASS statistics
def rolling_z(values, window: int, warmup: int) -> np.ndarray:
    """Public-code z-scores: from the warm-up on, z_t = (g_t - mean(W_t)) / std(W_t) with W_t the last ``window``
    norms including g_t (unbiased std); std = 0 gives z = 0 (no division by zero).  values [T] -> z [T - warmup + 1]."""
    g = np.asarray(values, dtype=float)
    zs = []
    for t in range(warmup - 1, len(g)):
        w = g[max(0, t - window + 1): t + 1]
        sd = w.std(ddof=1) if len(w) > 1 else 0.0
        zs.append(0.0 if sd == 0 or not np.isfinite(sd) else (g[t] - w.mean()) / sd)
    return np.asarray(zs)


def cpd_pvalue(z_window, window: int) -> float:
    """S = sum_{i in window} z_i / sqrt(window);  p = 1 - Phi(S)   (MASS Sec. 3.4, right-tailed)."""
    if window < 1:
        raise ValueError(f"window={window} must be >= 1")
    s = float(np.sum(z_window)) / math.sqrt(window)
    return float(norm.sf(s))


def weight_grad_cos(w: torch.Tensor, g: torch.Tensor) -> float:
    """cos(vec W1_e, vec grad W1_e) (MASS Sec. 3.5).  Zero weight or zero gradient -> 1.0 ("no evidence of drift":
    an expert with no tokens has a zero gradient and must not be duplicated)."""
    w, g = w.reshape(-1).double(), g.reshape(-1).double()
    nw, ng = w.norm(), g.norm()
    if nw == 0 or ng == 0:
        return 1.0
    return float(w @ g / (nw * ng))


def project_rows(grad: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Aligned component of the gradient, row by row (public code): g_r <- (g_r·w_r / (w_r·w_r + 1e-12)) w_r."""
    if grad.shape != w.shape:
        raise ValueError(f"grad shape {tuple(grad.shape)} != weight shape {tuple(w.shape)}")
    w2 = w.reshape(-1, w.shape[-1]) if w.ndim > 1 else w[None]
    g2 = grad.reshape(w2.shape)
    coef = (g2 * w2).sum(-1, keepdim=True) / ((w2 * w2).sum(-1, keepdim=True) + 1e-12)
    return (coef * w2).reshape(w.shape)


@dataclass
class MassConfig:
    """MASS expansion settings (public code defaults except where stated in notebook 04)."""
    total_steps: int
    warmup: int
    window: int
    p_threshold: float = 0.01
    delta: float = 0.001
    patience: int = 3
    max_experts: int = 16
    expand_frac: float = 0.10
    redundancy_weight: float = 0.01

    def __post_init__(self):
        if self.warmup < 1 or self.window < 2:
            raise ValueError(f"warmup={self.warmup} must be >= 1 and window={self.window} >= 2")
        if self.total_steps < 1:
            raise ValueError(f"total_steps={self.total_steps} must be >= 1")
        if not 0 < self.p_threshold < 1 or self.delta <= 0 or self.patience < 1:
            raise ValueError(f"bad p_threshold={self.p_threshold}, delta={self.delta} or patience={self.patience}")

    @property
    def expand_until(self) -> int:
        return int(self.expand_frac * self.total_steps)

    @property
    def can_fire(self) -> bool:
        """A fresh expert first fires once it has ``warmup`` norms and a full window of z-scores."""
        return self.warmup + self.window - 1 <= self.expand_until


class MassExpander:
    """Adaptive expansion for every model of a :class:`StackedMoETransformer` (MASS Alg. 1; notebook 04).

    Per step in the expansion phase (first ``expand_frac`` of steps, until stopped), per model:
    1. g_t^e = ||grad W1_e||_F for each active expert; after its warm-up, z_t = (g_t - mean W)/std W over the last
       ``window`` norms; S = sum of the last ``window`` z / sqrt(window); p = 1 - Phi(S).
    2. the first expert with a full z-window, p < p_threshold and |cos(W1_e, grad W1_e)| < delta is a candidate.
    3. if an expert was added before: re-run the batch with the last-added expert masked; if that does not raise
       the NLL, remove it (patience -= 1, stop at 0) instead of expanding; else duplicate the candidate into a free
       slot (expert W1, b1 and gate row); its gradients: source keeps the row-wise aligned part, the copy the full
       gradient; the source's warm-up restarts; Adam moments of the new slot start at zero.
    4. stop at the maximum pool size.
    ``redundancy_loss(step, model)`` = weight * sum_{(i,j) dup} cos(g_i, g_j)^2 during expansion (MASS Sec. 3.7).
    """

    def __init__(self, cfg: MassConfig, n_models: int, nll_fn=None):
        self.cfg = cfg
        # nll_fn(model, batch, active [M,E]) -> per-model NLL [M]; default: the stacked model's next-token CE
        self.nll_fn = nll_fn or (lambda model, batch, active: _nll(model(batch[:, :-1], active=active), batch).mean(1))
        self.M = n_models
        E = cfg.max_experts
        self.count = np.zeros((n_models, E), dtype=int)
        self.gwin = [[deque(maxlen=cfg.window) for _ in range(E)] for _ in range(n_models)]
        self.zwin = [[deque(maxlen=cfg.window) for _ in range(E)] for _ in range(n_models)]
        self.pairs = [[] for _ in range(n_models)]
        self.added = [[] for _ in range(n_models)]
        self.patience = np.full(n_models, cfg.patience)
        self.stopped = np.zeros(n_models, dtype=bool)
        self.stop_reason = [""] * n_models
        self.trace = []       # rows: step, model, expert, grad_norm, z, p
        self.events = []      # rows: step, model, kind (fire|expand|remove|stop_*), expert, new, p, cos

    def expanding(self, step: int, m: int) -> bool:
        return step < self.cfg.expand_until and not self.stopped[m]

    def redundancy_loss(self, step: int, model: StackedMoETransformer) -> torch.Tensor:
        """L_red = w * sum_{(i,j) in D} cos(W_g[i], W_g[j])^2, only while expanding (MASS Sec. 3.7)."""
        tot = model.gate.new_zeros(())
        for m in range(self.M):
            if step < self.cfg.expand_until and self.pairs[m]:
                i, j = map(list, zip(*self.pairs[m]))
                gi, gj = F.normalize(model.gate[m, i], dim=-1), F.normalize(model.gate[m, j], dim=-1)
                tot = tot + ((gi * gj).sum(-1) ** 2).sum()
        return self.cfg.redundancy_weight * tot

    def _observe(self, step, m, e, gnorm):
        c = self.count[m, e] = self.count[m, e] + 1
        gw = self.gwin[m][e]
        gw.append(gnorm)
        z = p = np.nan
        if c >= self.cfg.warmup:
            arr = np.asarray(gw)
            sd = arr.std(ddof=1) if len(arr) > 1 else 0.0
            z = 0.0 if sd == 0 else (gnorm - arr.mean()) / sd
            self.zwin[m][e].append(z)
            if len(self.zwin[m][e]) == self.cfg.window:
                p = cpd_pvalue(self.zwin[m][e], self.cfg.window)
        self.trace.append((step, m, e, gnorm, z, p))
        return p

    @torch.no_grad()
    def after_backward(self, step: int, model: StackedMoETransformer, optimizer) -> None:
        cfg = self.cfg
        if model.E != cfg.max_experts:
            raise ValueError(f"model has {model.E} slots but max_experts={cfg.max_experts}")
        gn = model.w1.grad.flatten(2).norm(dim=-1)                                  # ||grad W1_e||_F  [M, E]
        for m in range(self.M):
            if not self.expanding(step, m):
                continue
            act = np.flatnonzero(model.active[m].numpy())
            cand = None
            for e in act:
                p = self._observe(step, m, e, float(gn[m, e]))
                if cand is None and p < cfg.p_threshold:
                    cos = weight_grad_cos(model.w1[m, e], model.w1.grad[m, e])
                    self.events.append(dict(step=step, model=m, kind="fire", expert=int(e), new=-1, p=p, cos=cos))
                    if abs(cos) < cfg.delta:
                        cand = (int(e), p, cos)
            if cand is not None:
                self._act(step, model, optimizer, m, cand)

    def _act(self, step, model, optimizer, m, cand):
        cfg = self.cfg
        if self.added[m]:                                       # NLL stopping test on the current batch
            last = self.added[m][-1]
            masked = model.active.clone()
            masked[m, last] = False
            batch = model._last_batch
            with torch.no_grad():
                nll_masked = self.nll_fn(model, batch, masked)[m]
            if nll_masked <= model._last_losses[m]:             # the last expert does not help: remove it
                model.active[m, last] = False
                self.added[m].pop()
                self.pairs[m] = [pr for pr in self.pairs[m] if pr[1] != last]
                self.patience[m] -= 1
                self.events.append(dict(step=step, model=m, kind="remove", expert=last, new=-1, p=cand[1], cos=cand[2]))
                if self.patience[m] <= 0:
                    self._stop(step, m, "patience")
                return
        src = cand[0]
        free = np.flatnonzero(~model.active[m].numpy())
        if len(free) == 0:
            self._stop(step, m, "max_pool")
            return
        dst = int(free[0])
        self.duplicate(model, optimizer, m, src, dst)
        self.added[m].append(dst)
        self.pairs[m].append((src, dst))
        self.count[m, src] = 0                                  # source's warm-up restarts
        self.count[m, dst] = 0
        self.gwin[m][dst].clear()
        self.zwin[m][dst].clear()
        self.events.append(dict(step=step, model=m, kind="expand", expert=src, new=dst, p=cand[1], cos=cand[2]))
        if int(model.active[m].sum()) >= cfg.max_experts:
            self._stop(step, m, "max_pool")

    def _stop(self, step, m, why):
        self.stopped[m] = True
        self.stop_reason[m] = why
        self.events.append(dict(step=step, model=m, kind=f"stop_{why}", expert=-1, new=-1, p=np.nan, cos=np.nan))

    @staticmethod
    @torch.no_grad()
    def duplicate(model: StackedMoETransformer, optimizer, m: int, src: int, dst: int) -> None:
        """E_new <- copy(E_src), W_g[new] <- W_g[src]; gradients rewritten before the optimiser step:
        grad W1_src <- aligned part (row-wise projection on W1_src), grad W_g[src] <- projection on W_g[src];
        the new expert and gate row take the full gradients (MASS Sec. 3.6)."""
        if model.active[m, dst]:
            raise ValueError(f"slot {dst} of model {m} is already active")
        for p in (model.w1, model.b1, model.gate):
            p[m, dst] = p[m, src]
            if p.grad is not None:
                g_src = p.grad[m, src].clone()
                p.grad[m, dst] = g_src
                if p is not model.b1:
                    p.grad[m, src] = project_rows(g_src, p[m, src])
            st = optimizer.state.get(p, {}) if optimizer is not None else {}
            for key in ("exp_avg", "exp_avg_sq"):
                if key in st:
                    st[key][m, dst] = 0.0
        model.active[m, dst] = True


# ----------------------------------------------------------------------------------------------- analysis
def frontier(df: pd.DataFrame, x: str = "num_experts", y: str = "test_loss") -> pd.DataFrame:
    """Best run (lowest test loss) per expert count: the paper's 'optimal frontier' (Sec. 4.3)."""
    if df.empty:
        raise ValueError("empty grid table")
    return df.loc[df.groupby(x)[y].idxmin()].sort_values(x).reset_index(drop=True)


def elbow_max_chord(x, y) -> float:
    """Knee of a decreasing convex curve: the point farthest from the chord joining its ends, after scaling both
    axes to [0, 1] (the Kneedle difference-curve rule; hand-written because kneed is not installed)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or len(x) != len(y):
        raise ValueError(f"need >= 3 points of equal length, got {len(x)} and {len(y)}")
    xs = (x - x.min()) / max(np.ptp(x), 1e-12)
    ys = (y - y.min()) / max(np.ptp(y), 1e-12)
    # distance to the chord from (xs0, ys0) to (xs-1, ys-1)
    dx, dy = xs[-1] - xs[0], ys[-1] - ys[0]
    dist = np.abs(dy * (xs - xs[0]) - dx * (ys - ys[0])) / max(math.hypot(dx, dy), 1e-12)
    return float(x[int(np.argmax(dist))])


def routing_jsd(weights: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Pairwise JSD (base 2, in [0, 1]) between the average routing distributions of groups (MASS Sec. 4.3):
    P_a = mean_{t in a} w_t;  JSD(P_a||P_b) = 1/2 KL(P_a||M) + 1/2 KL(P_b||M),  M = (P_a+P_b)/2.
    weights [N, E] (rows sum to 1), groups [N] ints -> values for every pair of non-empty groups [n_pairs]."""
    weights, groups = np.asarray(weights, float), np.asarray(groups)
    if weights.ndim != 2 or len(weights) != len(groups):
        raise ValueError(f"weights [N, E] and groups [N] must match, got {weights.shape} and {groups.shape}")
    P = [weights[groups == a].mean(0) for a in range(n_groups) if np.any(groups == a)]
    out = []
    for i in range(len(P)):
        for j in range(i + 1, len(P)):
            a, b = P[i] / P[i].sum(), P[j] / P[j].sum()
            mid = (a + b) / 2
            kl = lambda p, q: float(np.sum(np.where(p > 0, p * np.log2(np.where(p > 0, p, 1) / np.where(q > 0, q, 1)), 0)))
            out.append(0.5 * kl(a, mid) + 0.5 * kl(b, mid))
    return np.asarray(out)


# ----------------------------------------------------------------------------------------------- experiment drivers
@dataclass
class SynthSetup:
    """Width, sequence length, steps etc. of the synthetic experiment (fixed from the naive grid; notebook 04)."""
    d_model: int = 32
    n_heads: int = 2
    seq_len: int = 16
    batch_size: int = 16
    steps: int = 400
    lr: float = 1e-2
    max_experts: int = 16
    n_test: int = 256
    ginc_seed: int = 0
    data_seed: int = 1

    def data(self):
        """(GINC family, train docs [steps*B, S+1], test dict with tokens/states) -- all seeded."""
        from moelab.ginc import GINCConfig, build_ginc, sample_documents
        g = build_ginc(GINCConfig(seed=self.ginc_seed))
        train = sample_documents(g, self.steps * self.batch_size, self.seq_len + 1, seed=self.data_seed)["tokens"]
        test = sample_documents(g, self.n_test, self.seq_len + 1, seed=self.data_seed + 1000)
        return g, train, test


def _bucket(num_experts: int) -> int:
    """Slots per stacked group: models are stacked with E padded to 4, 8 or 16 (dense compute scales with slots)."""
    return next(b for b in (4, 8, 16, 32, 64) if num_experts <= b)


def run_naive(setup: SynthSetup, configs: list[tuple[int, int, int]], keep_routing: bool = False) -> dict:
    """Train naive top-k MoEs ``configs`` = [(num_experts, top_k, seed)], stacked per slot bucket.
    Returns dict(table: DataFrame(num_experts, top_k, seed, test_loss), item_losses [n_cfg, n_test],
    history: DataFrame(step, num_experts, top_k, seed, loss), routing: {cfg_index: [N, E]} if keep_routing)."""
    for E, k, s in configs:
        if not 1 <= k <= E <= setup.max_experts:
            raise ValueError(f"bad naive config num_experts={E}, top_k={k} (need 1 <= k <= E <= {setup.max_experts})")
    g, train, test = setup.data()
    idx_by_bucket: dict[int, list[int]] = {}
    for i, (E, _, _) in enumerate(configs):
        idx_by_bucket.setdefault(_bucket(E), []).append(i)
    items = np.zeros((len(configs), setup.n_test))
    hists, routing = [], {}
    for slots, idx in sorted(idx_by_bucket.items()):
        cf = [configs[i] for i in idx]
        model = StackedMoETransformer(len(cf), g.cfg.n_symbols, setup.d_model, setup.n_heads, setup.seq_len, slots,
                                      num_experts=[c[0] for c in cf], top_k=[c[1] for c in cf],
                                      seeds=[1000 * c[2] + 17 * c[0] + c[1] for c in cf])
        h = train_stacked(model, train, steps=setup.steps, batch_size=setup.batch_size, lr=setup.lr, seed=setup.data_seed)
        h[["num_experts", "top_k", "seed"]] = np.asarray(cf)[h.model.to_numpy()]
        hists.append(h.drop(columns="model"))
        items[idx] = eval_per_sequence(model, test["tokens"])
        if keep_routing:
            w = collect_routing(model, test["tokens"])
            for j, i in enumerate(idx):
                routing[i] = w[j]
    table = pd.DataFrame(configs, columns=["num_experts", "top_k", "seed"])
    table["test_loss"] = items.mean(1)
    return dict(table=table, item_losses=items, history=pd.concat(hists, ignore_index=True), routing=routing)


def run_mass(setup: SynthSetup, mass_cfg: MassConfig, seeds, init_experts: int = 2, top_p: float = 0.5) -> dict:
    """Train ``len(seeds)`` MASS models stacked (MASS Alg. 1 with top-p routing).  Returns dict(table per run:
    seed, final_experts, mean_active, test_loss, stop_reason; item_losses [R, n_test]; events; trace; history;
    routing [R, N, E])."""
    g, train, test = setup.data()
    R = len(seeds)
    model = StackedMoETransformer(R, g.cfg.n_symbols, setup.d_model, setup.n_heads, setup.seq_len,
                                  mass_cfg.max_experts, num_experts=init_experts, top_p=top_p,
                                  seeds=[5000 + 1000 * s for s in seeds])
    ex = MassExpander(mass_cfg, R)
    hist = train_stacked(model, train, steps=setup.steps, batch_size=setup.batch_size, lr=setup.lr,
                         seed=setup.data_seed, aux_loss=ex.redundancy_loss, after_backward=ex.after_backward)
    items = eval_per_sequence(model, test["tokens"])
    w = collect_routing(model, test["tokens"])                          # [R, N, E]
    table = pd.DataFrame(dict(seed=list(seeds), final_experts=model.active.sum(1).numpy(),
                              mean_active=(w > 0).sum(-1).mean(1), test_loss=items.mean(1),
                              stop_reason=[r or "phase_end" for r in ex.stop_reason]))
    trace = pd.DataFrame(ex.trace, columns=["step", "model", "expert", "grad_norm", "z", "p"])
    events = pd.DataFrame(ex.events, columns=["step", "model", "kind", "expert", "new", "p", "cos"])
    return dict(table=table, item_losses=items, events=events, trace=trace, history=hist, routing=w)


def jsd_points(routing: np.ndarray, states: np.ndarray, n_entities: int, n_properties: int,
               n_chunks: int = 8) -> pd.DataFrame:
    """Mean pairwise routing JSD over entities and over properties (MASS Fig. 3), per chunk of test documents.
    routing [n_docs*S, E] (input-token order), states [n_docs, S+1] hidden states -> DataFrame(chunk, entity_jsd,
    property_jsd)."""
    st = np.asarray(states)[:, :-1]
    n_docs, S = st.shape
    w = np.asarray(routing).reshape(n_docs, S, -1)
    rows = []
    for c, docs in enumerate(np.array_split(np.arange(n_docs), n_chunks)):
        ww, ss = w[docs].reshape(-1, w.shape[-1]), st[docs].reshape(-1)
        rows.append(dict(chunk=c, entity_jsd=routing_jsd(ww, ss // n_properties, n_entities).mean(),
                         property_jsd=routing_jsd(ww, ss % n_properties, n_properties).mean()))
    return pd.DataFrame(rows)


def mass_settings(total_steps: int) -> tuple[int, int]:
    """(warm-up, window) used here: max(3, 0.005 T), max(6, 0.01 T).  The public max(30, .05T) / max(60, .09T)
    need 0.14 T of history before a first test, after the expansion phase (first 0.1 T) has ended; ours let a fresh
    expert fire after ~0.015 T, so duplications can chain inside the phase.  (With W z-scores each z <= (W-1)/sqrt(W),
    so S <= W-1; p < 0.01 needs S > 2.33, i.e. W >= 4; we take W >= 6.)"""
    if total_steps < 1:
        raise ValueError(f"total_steps={total_steps} must be >= 1")
    return max(3, round(0.005 * total_steps)), max(6, round(0.01 * total_steps))


def slots_delta(d_model: int, paper_delta: float = 0.001, paper_numel: int = 1024 * 512) -> float:
    """Semantic threshold scaled to our expert size: |cos| of unrelated vectors scales as 1/sqrt(numel W1), so the
    GLUE delta 0.001 (BERT-large FFN 4096 split into 8 experts: W1 512x1024) maps to 0.001*sqrt(524288/numel)."""
    if d_model < 1:
        raise ValueError(f"d_model={d_model} must be >= 1")
    return paper_delta * math.sqrt(paper_numel / (d_model * d_model))


# ----------------------------------------------------------------------------------------------- figures
def plot_fig2(grid: pd.DataFrame, front: pd.DataFrame, elbow: float, mass: pd.DataFrame, sweep: pd.DataFrame,
              fixed_experts: int, bayes_floor: float):
    """Fig. 2: left test loss vs #experts (naive runs, frontier, elbow, MASS runs); right test loss vs top-k at a
    fixed pool (naive) with MASS at its mean active experts."""
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for k, sub in grid.groupby("top_k"):
        a.scatter(sub.num_experts, sub.test_loss, s=12, alpha=0.5, label=f"naive top-{k}")
    a.plot(front.num_experts, front.test_loss, "k-", lw=1.5, label="frontier (best per count)")
    a.axvline(elbow, color="gray", ls="--", label=f"elbow = {elbow:g}")
    a.scatter(mass.final_experts, mass.test_loss, marker="*", s=150, c="purple", label="MASS runs", zorder=5)
    a.set(xlabel="# experts", ylabel="test loss (nats/token)", title="Fig 2 left")
    a.legend(fontsize=7)
    m = sweep.groupby("top_k").test_loss.agg(["mean", "std"]).reset_index()
    b.errorbar(m.top_k, m["mean"], yerr=m["std"], fmt="o-", color="gray", label=f"naive, E={fixed_experts}")
    b.errorbar([mass.mean_active.mean()], [mass.test_loss.mean()], xerr=[mass.mean_active.std()],
               yerr=[mass.test_loss.std()], fmt="*", ms=14, color="purple", label="MASS (top-p), mean active")
    for ax in (a, b):
        ax.axhline(bayes_floor, color="green", ls=":", lw=1, label="Bayes-optimal")
    b.set(xlabel="top-k (active experts per token)", ylabel="test loss", title="Fig 2 right")
    b.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_fig3(points: pd.DataFrame):
    """Fig. 3: contours of (entity JSD, property JSD) points of MASS vs naive runs (points: method, entity_jsd,
    property_jsd)."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    fig, ax = plt.subplots(figsize=(5, 4.5))
    colors = {"MASS": "purple", "naive": "gray"}
    for meth, sub in points.groupby("method"):
        if len(sub) > 3 and sub[["entity_jsd", "property_jsd"]].std().min() > 0:
            sns.kdeplot(data=sub, x="entity_jsd", y="property_jsd", ax=ax, color=colors.get(meth), levels=5, fill=False)
        ax.scatter(sub.entity_jsd, sub.property_jsd, s=8, color=colors.get(meth), alpha=0.6, label=meth)
    ax.set(xlabel="entity-level JSD of mean routing", ylabel="property-level JSD", title="Fig 3")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_appc(trace: pd.DataFrame, events: pd.DataFrame, max_panels: int = 4, span: int = 30):
    """App. C: gradient-norm traces of experts around expansion events, detected change points marked."""
    import matplotlib.pyplot as plt
    ev = events[events.kind == "expand"].head(max_panels)
    n = max(1, len(ev))
    fig, axes = plt.subplots(1, n, figsize=(4 * n, 3.2), squeeze=False)
    if ev.empty:
        axes[0, 0].text(0.5, 0.5, "no expansion event", ha="center")
    for ax, (_, e) in zip(axes[0], ev.iterrows()):
        tr = trace[(trace.model == e.model) & (trace.step.between(e.step - span, e.step + span))]
        for ex_id, sub in tr.groupby("expert"):
            if ex_id in (e.expert, e.new):
                ax.plot(sub.step, sub.grad_norm, label=f"expert {ex_id}" + (" (new)" if ex_id == e.new else ""))
        fires = events[(events.model == e.model) & (events.kind == "fire") & (events.expert == e.expert)
                       & events.step.between(e.step - span, e.step + span)]
        src = tr[tr.expert == e.expert].set_index("step").grad_norm
        ax.scatter(fires.step, src.reindex(fires.step).to_numpy(), color="red", zorder=5, label="change point (p<0.01)")
        ax.axvline(e.step, color="purple", ls="--", lw=1)
        ax.set(title=f"run {e.model}: expert {e.expert} -> {e.new} @ {e.step}", xlabel="step", ylabel="||grad W1||_F")
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------- paper profile (GLUE)
GLUE_FILES = {"cola": ("CoLA", None), "rte": ("RTE", ("sentence1", "sentence2")), "qnli": ("QNLI", ("question", "sentence")),
              "mnli": ("MNLI", ("sentence1", "sentence2")), "mrpc": ("MRPC", ("#1 String", "#2 String"))}


def load_glue_task(glue_dir, task: str, split: str = "train") -> pd.DataFrame:
    """Read a GLUE task from the official TSV layout (``<glue_dir>/<TASK>/{train,dev}.tsv``; MNLI dev is
    ``dev_matched.tsv``) -> DataFrame(text_a, text_b, label). Missing folder -> MissingAsset (paper profile)."""
    import csv
    from pathlib import Path

    from moelab.assets import MissingAsset
    if task not in GLUE_FILES:
        raise ValueError(f"task={task!r} not among {list(GLUE_FILES)}")
    folder, cols = GLUE_FILES[task]
    name = "dev_matched" if (task == "mnli" and split == "dev") else split
    path = Path(glue_dir) / folder / f"{name}.tsv"
    if not path.is_file():
        raise MissingAsset(f"GLUE/{folder}", f"{path} not found (pass GLUE_DIR: the official GLUE data folder)",
                           command="download GLUE yourself and pass its folder as GLUE_DIR")
    if cols is None:       # CoLA: no header; columns source, label, original label, sentence
        rows = list(csv.reader(path.open(encoding="utf-8"), delimiter="\t", quoting=csv.QUOTE_NONE))
        return pd.DataFrame(dict(text_a=[r[3] for r in rows], text_b="", label=[r[1] for r in rows]))
    df = pd.read_csv(path, sep="\t", quoting=csv.QUOTE_NONE, dtype=str, keep_default_na=False)
    lab = "Quality" if task == "mrpc" else ("gold_label" if task == "mnli" and "gold_label" in df else "label")
    return pd.DataFrame(dict(text_a=df[cols[0]], text_b=df[cols[1]], label=df[lab]))


def bert_large_path(path) -> "Path":
    """A local BERT-large Hugging Face folder (config.json + weights), else MissingAsset (not obtainable offline)."""
    from pathlib import Path

    from moelab.assets import MissingAsset
    p = Path(path) if path else None
    if p is None or not (p / "config.json").is_file():
        raise MissingAsset("bert-large", f"no config.json under {p} (pass MODEL_PATH: a local bert-large folder)",
                           command="copy bert-large-uncased (HF format) locally and pass MODEL_PATH")
    return p
