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
           "frontier", "elbow_max_chord", "routing_jsd", "sinusoidal_positions", "collect_routing"]


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
