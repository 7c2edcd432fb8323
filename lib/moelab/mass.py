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

from moelab import progress
from moelab.core import diagnostics
from moelab.profiles import paper_input_hint
# the elbow rule and the JSD are shared with notebooks 01 and 02 (issue 18, item 7); re-exported under the old names
from moelab.stats import elbow_max_chord, jensen_shannon

__all__ = ["StackedMoETransformer", "topk_weights", "top_p_weights", "train_stacked", "eval_per_sequence",
           "rolling_z", "cpd_pvalue", "weight_grad_cos", "project_rows", "MassConfig", "MassExpander",
           "frontier", "elbow_max_chord", "routing_jsd", "sinusoidal_positions", "collect_routing", "SynthSetup",
           "run_naive", "run_mass", "jsd_points", "mass_settings", "slots_delta", "plot_fig2", "plot_fig3", "plot_appc",
           "load_glue_task", "bert_large_path", "redundancy_term", "duplicate_rows", "MassPool", "GLUE_METHODS",
           "GlueStandinConfig", "duplicate_layer_expert", "MassLayerExpander", "DynMoEAdapter", "MiniLMClassifier",
           "glue_standin", "run_glue_standin", "glue_summary", "plot_glue_standin"]


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
    """MASS gate (Sec. 3.3): smallest set of sorted scores whose cumulative mass reaches p, renormalised only when
    some token of the model's batch keeps more than one expert (the authors' rule; issue 15).
    logits [..., N, E] (-inf on free slots; leading dims = models) -> weights, via
    ``moelab.core.routing.top_p_route`` ("mass", ``renormalize="mass_batch"``, one batch per model)."""
    from moelab.core.routing import top_p_route
    rows = logits.reshape(-1, *logits.shape[-2:])                                # [M, N, E]
    w = torch.stack([top_p_route(r, p, convention="mass", renormalize="mass_batch")[0] for r in rows])
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
                  log_every: int = 10, desc: str = "stacked MoE", router_frozen: bool = False,
                  progress_bar: bool | None = None) -> pd.DataFrame:
    """Adam on the sum over models of each model's mean CE (models independent: disjoint parameters, elementwise Adam).
    docs [n, S+1] token ids, drawn in a seeded order.  Hook points as in ``moelab.train``: ``aux_loss(step, model)``
    -> extra scalar added to the loss, ``after_backward(step, model, optimizer)`` may edit gradients (MASS),
    ``after_step(step, model)``.  Returns history (step, model, loss, router_grad_norm, router_frozen) at the logged
    steps (0-based ``step % log_every == 0`` and the last).

    ``router_grad_norm`` (issue 15, item 1): ||d CE_m / d W_g[m]|| of each model's gate from its task loss alone
    (``aux_loss`` excluded), via ``moelab.core.diagnostics``; a model whose gate gets no task gradient at any logged
    step where it has more than one active expert raises RuntimeError (run named ``desc``, model index) unless
    ``router_frozen`` (a single active expert has probability 1 under any rule: nothing to route, nothing to learn;
    ``active_experts`` is logged).  ``progress_bar``: a bar
    over the steps (None: follow ``MOELAB_PROGRESS``)."""
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
    bar = progress.bar(total=steps, desc=desc, unit="step", disable=None if progress_bar is None else not progress_bar)
    for step in range(steps):
        batch = docs_t[rng.integers(0, len(docs_t), batch_size)]
        logits = model(batch[:, :-1])
        per_model = _nll(logits, batch).mean(1)                     # [M]
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
        model._last_batch, model._last_losses = batch, per_model.detach()
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


def redundancy_term(gate_rows: torch.Tensor, pairs) -> torch.Tensor:
    """sum_{(i,j) in D} cos(W_g[i], W_g[j])^2 over the duplicated pairs D (MASS Sec. 3.7).  gate_rows [E, d] -> []."""
    if not pairs:
        return gate_rows.new_zeros(())
    i, j = map(list, zip(*pairs))
    gi, gj = F.normalize(gate_rows[i], dim=-1), F.normalize(gate_rows[j], dim=-1)
    return ((gi * gj).sum(-1) ** 2).sum()


@torch.no_grad()
def duplicate_rows(rows, optimizer) -> None:
    """MASS duplication with gradient decomposition (Sec. 3.6) on slot rows of parameters.
    ``rows``: (param, src_index, dst_index, project).  theta[dst] <- theta[src]; grad[dst] <- grad[src] (the copy takes
    the full gradient); if ``project``: grad[src] <- row-wise aligned part (:func:`project_rows`); Adam moments of dst
    start at zero."""
    for p, src, dst, project in rows:
        p[dst] = p[src]
        if p.grad is not None:
            g_src = p.grad[src].clone()
            p.grad[dst] = g_src
            if project:
                p.grad[src] = project_rows(g_src, p[src])
        st = optimizer.state.get(p, {}) if optimizer is not None else {}
        for key in ("exp_avg", "exp_avg_sq"):
            if key in st:
                st[key][dst] = 0.0


class MassPool:
    """Expansion state machine of one expert pool (MASS Alg. 1; notebook 04), shared by :class:`MassExpander` (one
    pool per stacked synthetic model) and :class:`MassLayerExpander` (one ``MoELayer``, real-data part).

    The pool decides; a *view* acts on the model: ``active() -> ids``, ``grad_norms() -> [E]`` (||grad W1_e||_F),
    ``cos(e)``, ``nll_full()``, ``nll_masked(e)`` (current batch without expert e), ``free() -> ids``,
    ``duplicate(src, dst)``, ``deactivate(e)``, ``n_active()``.  Per step in the expansion phase:
    1. g_t^e for each active expert; after its warm-up, z_t = (g_t - mean W)/std W over the last ``window`` norms;
       S = sum of the last ``window`` z / sqrt(window); p = 1 - Phi(S).
    2. the first expert with a full z-window, p < p_threshold and |cos(W1_e, grad W1_e)| < delta is a candidate.
    3. if an expert was added before: if the NLL without the last-added expert is not higher, remove it
       (patience -= 1, stop at 0) instead of expanding; else duplicate the candidate into a free slot; the source's
       warm-up restarts.
    4. stop at the maximum pool size.
    """

    def __init__(self, cfg: MassConfig, pool_id: int = 0, events: list | None = None, trace: list | None = None):
        E = cfg.max_experts
        self.cfg, self.pool_id = cfg, pool_id
        self.count = np.zeros(E, dtype=int)
        self.gwin = [deque(maxlen=cfg.window) for _ in range(E)]
        self.zwin = [deque(maxlen=cfg.window) for _ in range(E)]
        self.pairs, self.added = [], []
        self.patience = cfg.patience
        self.stopped, self.stop_reason = False, ""
        self.events = [] if events is None else events     # dicts: step, model, kind, expert, new, p, cos
        self.trace = [] if trace is None else trace        # tuples: step, model, expert, grad_norm, z, p

    def expanding(self, step: int) -> bool:
        return step < self.cfg.expand_until and not self.stopped

    def _event(self, step, kind, expert=-1, new=-1, p=np.nan, cos=np.nan):
        self.events.append(dict(step=step, model=self.pool_id, kind=kind, expert=int(expert), new=int(new), p=p, cos=cos))

    def observe(self, step: int, e: int, gnorm: float) -> float:
        """Record g_t of expert e; returns the change-point p-value (nan until warm-up + a full window)."""
        self.count[e] += 1
        gw = self.gwin[e]
        gw.append(gnorm)
        z = p = np.nan
        if self.count[e] >= self.cfg.warmup:
            arr = np.asarray(gw)
            sd = arr.std(ddof=1) if len(arr) > 1 else 0.0
            z = 0.0 if sd == 0 else (gnorm - arr.mean()) / sd     # z_t = (g_t - mean W) / std W
            self.zwin[e].append(z)
            if len(self.zwin[e]) == self.cfg.window:
                p = cpd_pvalue(self.zwin[e], self.cfg.window)     # p = 1 - Phi(sum z / sqrt(W))
        self.trace.append((step, self.pool_id, e, gnorm, z, p))
        return p

    def after_backward(self, step: int, view) -> None:
        if not self.expanding(step):
            return
        gn = view.grad_norms()
        cand = None
        for e in view.active():
            p = self.observe(step, e, float(gn[e]))
            if cand is None and p < self.cfg.p_threshold:
                cos = view.cos(e)
                self._event(step, "fire", e, p=p, cos=cos)
                if abs(cos) < self.cfg.delta:
                    cand = (int(e), p, cos)
        if cand is not None:
            self.act(step, view, cand)

    def act(self, step: int, view, cand) -> None:
        if self.added:                                          # NLL stopping test on the current batch
            last = self.added[-1]
            if view.nll_masked(last) <= view.nll_full():       # the last expert does not help: remove it
                view.deactivate(last)
                self.added.pop()
                self.pairs = [pr for pr in self.pairs if pr[1] != last]
                self.patience -= 1
                self._event(step, "remove", last, p=cand[1], cos=cand[2])
                if self.patience <= 0:
                    self.stop(step, "patience")
                return
        src = cand[0]
        free = view.free()
        if len(free) == 0:
            self.stop(step, "max_pool")
            return
        dst = int(free[0])
        view.duplicate(src, dst)
        self.added.append(dst)
        self.pairs.append((src, dst))
        self.count[src] = self.count[dst] = 0                   # source's warm-up restarts
        self.gwin[dst].clear()
        self.zwin[dst].clear()
        self._event(step, "expand", src, dst, cand[1], cand[2])
        if view.n_active() >= self.cfg.max_experts:
            self.stop(step, "max_pool")

    def stop(self, step: int, why: str) -> None:
        self.stopped, self.stop_reason = True, why
        self._event(step, f"stop_{why}")


class _PerPool:
    """``expander.<attr>[m]`` (and ``[m, e]``) views onto the per-pool states (keeps MassExpander's per-model API)."""

    def __init__(self, pools, name):
        self.pools, self.name = pools, name

    def __getitem__(self, i):
        if isinstance(i, tuple):
            return getattr(self.pools[i[0]], self.name)[i[1:] if len(i) > 2 else i[1]]
        return getattr(self.pools[i], self.name)

    def __setitem__(self, i, value):
        setattr(self.pools[i], self.name, value)

    def __len__(self):
        return len(self.pools)

    def __iter__(self):
        return (getattr(p, self.name) for p in self.pools)


class _StackedView:
    """Model m of a :class:`StackedMoETransformer` as seen by :class:`MassPool`."""

    def __init__(self, model, m, optimizer, nll_fn, gn=None):
        self.model, self.m, self.opt, self.nll_fn, self.gn = model, m, optimizer, nll_fn, gn

    def active(self):
        return np.flatnonzero(self.model.active[self.m].numpy())

    def free(self):
        return np.flatnonzero(~self.model.active[self.m].numpy())

    def n_active(self):
        return int(self.model.active[self.m].sum())

    def grad_norms(self):
        return self.gn[self.m]

    def cos(self, e):
        return weight_grad_cos(self.model.w1[self.m, e], self.model.w1.grad[self.m, e])

    def nll_full(self):
        return self.model._last_losses[self.m]

    def nll_masked(self, e):
        masked = self.model.active.clone()
        masked[self.m, e] = False
        with torch.no_grad():
            return self.nll_fn(self.model, self.model._last_batch, masked)[self.m]

    def duplicate(self, src, dst):
        MassExpander.duplicate(self.model, self.opt, self.m, src, dst)

    def deactivate(self, e):
        self.model.active[self.m, e] = False


class MassExpander:
    """Adaptive expansion for every model of a :class:`StackedMoETransformer` (MASS Alg. 1; notebook 04): one
    :class:`MassPool` per model (see there for the per-step rule).  Duplication copies expert W1, b1 and the gate
    row into a free slot; gradients: source keeps the row-wise aligned part, the copy the full gradient; Adam
    moments of the new slot start at zero.
    ``redundancy_loss(step, model)`` = weight * sum_{(i,j) dup} cos(g_i, g_j)^2 during expansion (MASS Sec. 3.7).
    """

    def __init__(self, cfg: MassConfig, n_models: int, nll_fn=None):
        self.cfg = cfg
        # nll_fn(model, batch, active [M,E]) -> per-model NLL [M]; default: the stacked model's next-token CE
        self.nll_fn = nll_fn or (lambda model, batch, active: _nll(model(batch[:, :-1], active=active), batch).mean(1))
        self.M = n_models
        self.trace, self.events = [], []
        self.pools = [MassPool(cfg, m, self.events, self.trace) for m in range(n_models)]
        for name in ("count", "gwin", "zwin", "pairs", "added", "patience", "stopped", "stop_reason"):
            setattr(self, name, _PerPool(self.pools, name))

    def expanding(self, step: int, m: int) -> bool:
        return self.pools[m].expanding(step)

    def redundancy_loss(self, step: int, model: StackedMoETransformer) -> torch.Tensor:
        """L_red = w * sum_{(i,j) in D} cos(W_g[i], W_g[j])^2, only while expanding (MASS Sec. 3.7)."""
        tot = model.gate.new_zeros(())
        for m in range(self.M):
            if step < self.cfg.expand_until and self.pools[m].pairs:
                tot = tot + redundancy_term(model.gate[m], self.pools[m].pairs)
        return self.cfg.redundancy_weight * tot

    @torch.no_grad()
    def after_backward(self, step: int, model: StackedMoETransformer, optimizer) -> None:
        if model.E != self.cfg.max_experts:
            raise ValueError(f"model has {model.E} slots but max_experts={self.cfg.max_experts}")
        gn = model.w1.grad.flatten(2).norm(dim=-1)                                  # ||grad W1_e||_F  [M, E]
        for m, pool in enumerate(self.pools):
            pool.after_backward(step, _StackedView(model, m, optimizer, self.nll_fn, gn))

    def _act(self, step, model, optimizer, m, cand):
        self.pools[m].act(step, _StackedView(model, m, optimizer, self.nll_fn), cand)

    @staticmethod
    @torch.no_grad()
    def duplicate(model: StackedMoETransformer, optimizer, m: int, src: int, dst: int) -> None:
        """E_new <- copy(E_src), W_g[new] <- W_g[src]; gradients rewritten before the optimiser step:
        grad W1_src <- aligned part (row-wise projection on W1_src), grad W_g[src] <- projection on W_g[src];
        the new expert and gate row take the full gradients (MASS Sec. 3.6)."""
        if model.active[m, dst]:
            raise ValueError(f"slot {dst} of model {m} is already active")
        duplicate_rows([(model.w1, (m, src), (m, dst), True), (model.b1, (m, src), (m, dst), False),
                        (model.gate, (m, src), (m, dst), True)], optimizer)
        model.active[m, dst] = True


# ----------------------------------------------------------------------------------------------- analysis
def frontier(df: pd.DataFrame, x: str = "num_experts", y: str = "test_loss") -> pd.DataFrame:
    """Best run (lowest test loss) per expert count: the paper's 'optimal frontier' (Sec. 4.3)."""
    if df.empty:
        raise ValueError("empty grid table")
    return df.loc[df.groupby(x)[y].idxmin()].sort_values(x).reset_index(drop=True)


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
            out.append(jensen_shannon(np.stack([P[i], P[j]])))          # moelab.stats (issue 18, item 7)
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
    for slots, idx in progress.bar(sorted(idx_by_bucket.items()), desc="naive grid (stacked by slots)", unit="stack"):
        cf = [configs[i] for i in idx]
        model = StackedMoETransformer(len(cf), g.cfg.n_symbols, setup.d_model, setup.n_heads, setup.seq_len, slots,
                                      num_experts=[c[0] for c in cf], top_k=[c[1] for c in cf],
                                      seeds=[1000 * c[2] + 17 * c[0] + c[1] for c in cf])
        h = train_stacked(model, train, steps=setup.steps, batch_size=setup.batch_size, lr=setup.lr, seed=setup.data_seed,
                          desc=f"naive {len(cf)} models, {slots} slots")
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
                         seed=setup.data_seed, aux_loss=ex.redundancy_loss, after_backward=ex.after_backward,
                         desc=f"MASS {R} runs")
    items = eval_per_sequence(model, test["tokens"])
    w = collect_routing(model, test["tokens"])                          # [R, N, E]
    table = pd.DataFrame(dict(seed=list(seeds), final_experts=model.active.sum(1).numpy(),
                              mean_active=(w > 0).sum(-1).mean(1), test_loss=items.mean(1),
                              stop_reason=[r or "phase_end" for r in ex.stop_reason]))
    grads = pd.DataFrame([diagnostics.router_grad_summary(hist[hist.model == m]) for m in range(R)])
    table = pd.concat([table, grads], axis=1)
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


def slots_delta(d_model: int, paper_delta: float = 0.001, paper_numel: int = 1024 * 512, numel: int | None = None) -> float:
    """Semantic threshold scaled to our expert size: |cos| of unrelated vectors scales as 1/sqrt(numel W1), so the
    GLUE delta 0.001 (BERT-large FFN 4096 split into 8 experts: W1 512x1024) maps to 0.001*sqrt(524288/numel).
    ``numel`` = size of W1 (default d_model^2, the synthetic model's square W1)."""
    numel = d_model * d_model if numel is None else numel
    if numel < 1:
        raise ValueError(f"W1 size d_model={d_model} / numel={numel} must be >= 1")
    return paper_delta * math.sqrt(paper_numel / numel)


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
                           command=paper_input_hint("04", "GLUE_DIR", "the official GLUE data folder"))
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
                           command=paper_input_hint("04", "MODEL_PATH", "a local bert-large-uncased folder (HF format)"))
    return p


# ----------------------------------------------------------------------------------------------- real-data part (GLUE stand-in)
# MASS Sec. 4.4 / Fig. 4 fine-tunes BERT-large with MoE FFNs on five GLUE tasks and compares a cosine-router MoE (GMoE),
# DynMoE and MASS (accuracy, final pool size, active experts per token; 3 seeds).  Offline stand-in (notebook 04,
# section 7, ``full`` profile): all-MiniLM-L6-v2 with the FFN of one layer sparse-upcycled to an MoE, fine-tuned on the
# suite's usable text classification tasks (``moelab.suite.textcls``).
GLUE_METHODS = ("cosine", "dynmoe", "mass")


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

    def __post_init__(self):
        for n in ("steps", "batch_size", "max_length", "eval_every", "cosine_experts", "cosine_top_k", "init_experts",
                  "max_experts", "dyn_interval", "patience"):
            if int(getattr(self, n)) < 1:
                raise ValueError(f"GlueStandinConfig.{n}={getattr(self, n)!r} must be >= 1")
        if not 1 <= self.init_experts <= self.max_experts or self.cosine_top_k > self.cosine_experts:
            raise ValueError(f"need 1 <= init_experts={self.init_experts} <= max_experts={self.max_experts} and "
                             f"cosine_top_k={self.cosine_top_k} <= cosine_experts={self.cosine_experts}")

    def mass_config(self, numel_w1: int) -> MassConfig:
        """MASS settings for the real-data part: warm-up/window from :func:`mass_settings` (a first test after
        warm-up + window - 1 steps, inside the expansion phase when steps >= ~80), delta = GLUE's 0.001 scaled to
        the expert's W1 size (:func:`slots_delta`)."""
        warmup, window = mass_settings(self.steps)
        return MassConfig(total_steps=self.steps, warmup=warmup, window=window, patience=self.patience,
                          delta=slots_delta(0, numel=numel_w1), max_experts=self.max_experts,
                          expand_frac=self.expand_frac)


class _LayerView:
    """One :class:`moelab.core.MoELayer` as seen by :class:`MassPool` (W1 = the experts' ``w_in``)."""

    def __init__(self, layer, optimizer, nll_fn):
        self.layer, self.opt, self.nll_fn = layer, optimizer, nll_fn

    def active(self):
        return np.flatnonzero(self.layer.active_mask.cpu().numpy())

    def free(self):
        return np.flatnonzero(~self.layer.active_mask.cpu().numpy())

    def n_active(self):
        return int(self.layer.active_mask.sum())

    def grad_norms(self):
        w = self.layer.experts.w_in
        return torch.zeros(w.shape[0]) if w.grad is None else w.grad.flatten(1).norm(dim=-1).cpu()   # [E]

    def cos(self, e):
        w = self.layer.experts.w_in
        return 1.0 if w.grad is None else weight_grad_cos(w[e], w.grad[e])

    def nll_full(self):
        return self.nll_fn(None)

    def nll_masked(self, e):
        return self.nll_fn(e)

    def duplicate(self, src, dst):
        duplicate_layer_expert(self.layer, self.opt, src, dst)

    def deactivate(self, e):
        self.layer.active_mask[e] = False


@torch.no_grad()
def duplicate_layer_expert(layer, optimizer, src: int, dst: int) -> None:
    """MASS duplication (Sec. 3.6) in a ``MoELayer``: expert ``src`` (w_in, b_in, w_out, b_out) and its router row
    into free slot ``dst``; grad w_in[src] and grad router[src] keep only their row-wise aligned parts, the copy
    takes the full gradients; Adam moments of ``dst`` start at zero."""
    if bool(layer.active_mask[dst]):
        raise ValueError(f"slot {dst} is already active")
    ex = layer.experts
    rows = [(ex.w_in, src, dst, True), (ex.w_out, src, dst, False), (layer._router_rows(), src, dst, True)]
    rows += [(p, src, dst, False) for p in (ex.b_in, ex.b_out) if p is not None]
    duplicate_rows(rows, optimizer)
    layer.active_mask[dst] = True


class MassLayerExpander:
    """MASS on one ``MoELayer`` with ``router="top_p"`` (real-data part, notebook 04 section 7): a :class:`MassPool`
    driven from the trainer's ``after_backward(step, model, optimizer)`` hook (step 1-based).  ``nll_fn(masked_expert
    or None) -> float``: loss of the current batch without that expert (the stopping test)."""

    def __init__(self, cfg: MassConfig, layer, nll_fn):
        if layer.num_experts != cfg.max_experts:
            raise ValueError(f"layer has {layer.num_experts} slots but max_experts={cfg.max_experts}")
        self.cfg, self.layer, self.nll_fn = cfg, layer, nll_fn
        self.pool = MassPool(cfg)

    def after_backward(self, step: int, model, optimizer) -> None:
        with torch.no_grad():
            self.pool.after_backward(step - 1, _LayerView(self.layer, optimizer, self.nll_fn))

    def redundancy_loss(self, step: int) -> torch.Tensor:
        """w * sum_{(i,j) in D} cos(W_g[i], W_g[j])^2 while expanding (MASS Sec. 3.7); step 0-based."""
        rows = self.layer._router_rows()
        if step >= self.cfg.expand_until or not self.pool.pairs:
            return rows.new_zeros(())
        return self.cfg.redundancy_weight * redundancy_term(rows, self.pool.pairs)


class DynMoEAdapter:
    """DynMoE's adaptive process on one ``MoELayer`` with ``router="topany"`` (Guo et al. 2024, LINs-lab/DynMoE;
    notebook 04 section 7).  During training, per interval of ``interval`` steps, it records the tokens routed to
    each expert and the tokens routed to none (top-any selects no expert: s_e <= sigmoid(theta_e) for all e).
    At the end of the interval: experts that received no token are masked out (at least one stays); if some tokens
    were unrouted and a slot is free, one expert is added with gate row w_new = mean of the unrouted tokens
    (direction; the gate is a cosine), threshold 0 and FFN weights = the dense FFN copy it was upcycled from.
    Simplifications: DynMoE's extra gate losses (diversity / simplicity) are replaced by the balancing loss used
    for every method here; the adaptation runs through the whole fine-tuning (no separate stop)."""

    def __init__(self, layer, interval: int):
        if layer.router_type != "topany":
            raise ValueError(f"DynMoE needs router='topany', got {layer.router_type!r}")
        if interval < 1:
            raise ValueError(f"interval={interval} must be >= 1")
        self.layer, self.interval = layer, interval
        ex = layer.experts
        self.fresh = {n: getattr(ex, n)[0].detach().clone() for n in ex._params()}   # the dense FFN (slot 0 at init)
        self.events = []
        self._reset()
        self._hook = layer.register_forward_hook(self._record)

    def _reset(self):
        E = self.layer.num_experts
        self.routed = torch.zeros(E, dtype=torch.long)
        self.unrouted_sum = torch.zeros(self.layer.d_model)
        self.unrouted_n = 0

    @torch.no_grad()
    def _record(self, layer, args, out):
        if not layer.training:
            return
        x = args[0].reshape(-1, layer.d_model)                                    # [T, d]
        idx = layer.last_route.indices                                           # [T, k'] (-1 = no expert)
        self.routed += torch.bincount(idx[idx >= 0].cpu(), minlength=layer.num_experts)
        un = (idx < 0).all(-1)                                                   # unrouted tokens [T]
        self.unrouted_sum += x[un].float().sum(0).cpu()
        self.unrouted_n += int(un.sum())

    def after_backward(self, step: int, model, optimizer) -> None:
        if step % self.interval == 0:
            self.adapt(optimizer, step)

    @torch.no_grad()
    def adapt(self, optimizer=None, step: int = 0) -> dict:
        """Remove experts with no routed token in the interval, add one for unrouted tokens; returns what changed."""
        from moelab.core.experts import optimizer_copy_rows
        layer = self.layer
        act = layer.active_mask.cpu()
        unused = [int(e) for e in np.flatnonzero((act & (self.routed == 0)).numpy())]
        if len(unused) >= int(act.sum()):
            unused = unused[1:]                                                  # keep at least one expert
        for e in unused:
            layer.active_mask[e] = False
        added = -1
        free = np.flatnonzero(~layer.active_mask.cpu().numpy())
        if self.unrouted_n > 0 and len(free):
            added = int(free[0])
            gate = layer.router
            gate.weight[added] = (self.unrouted_sum / self.unrouted_n).to(gate.weight)   # w_new = mean unrouted x
            gate.threshold[added] = 0.0
            optimizer_copy_rows(optimizer, gate.weight, added, added, "zero")
            optimizer_copy_rows(optimizer, gate.threshold, added, added, "zero")
            for n, w in self.fresh.items():
                p = getattr(layer.experts, n)
                p[added] = w
                optimizer_copy_rows(optimizer, p, added, added, "zero")
            layer.active_mask[added] = True
        self.events.append(dict(step=step, removed=len(unused), added=int(added >= 0), unrouted=self.unrouted_n,
                                pool=int(layer.active_mask.sum())))
        self._reset()
        return dict(removed=unused, added=added)

    def close(self):
        self._hook.remove()


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


def _check_task(task: dict) -> None:
    for split in ("train", "validation", "test"):
        if not task.get(split):
            raise ValueError(f"task split {split!r} is empty or missing")
    if not task.get("labels"):
        raise ValueError("task has no labels")


def _build_glue_model(n_labels: int, method: str, cfg: GlueStandinConfig, seed: int):
    """MiniLM + head with the FFN of layer ``cfg.layer`` sparse-upcycled (experts = copies of the FFN)."""
    from moelab import assets
    from moelab.core import moe_layers
    from moelab.core.convert import moeify
    from moelab.seed import seed_everything
    seed_everything(seed)
    st = assets.load_minilm()
    bert, tok = st[0].auto_model, st.tokenizer
    bert.train()
    kw = dict(cosine=dict(num_experts=cfg.cosine_experts, top_k=cfg.cosine_top_k, router="cosine", renormalize=True),
              dynmoe=dict(num_experts=cfg.max_experts, top_k=1, router="topany", num_active=cfg.init_experts),
              mass=dict(num_experts=cfg.max_experts, top_k=1, router="top_p", top_p=cfg.top_p, renormalize="mass_batch",
                        num_active=cfg.init_experts))[method]
    moeify(bert, [cfg.layer], init="sparse", **kw)
    model = MiniLMClassifier(bert, n_labels)
    return model, tok, moe_layers(model)[0]


def glue_standin(task: dict, method: str, seed: int, cfg: GlueStandinConfig, name: str = "task") -> dict:
    """One run of the GLUE stand-in (MASS Sec. 4.4 / Fig. 4; notebook 04 section 7): MiniLM with one upcycled MoE
    layer + mean pooling + linear head, fine-tuned with ``moelab.train.train`` on ``task['train']``; every
    ``eval_every`` steps the validation accuracy is measured and the test metrics are taken at the best one (early
    selection on validation).  ``method``: "cosine" (fixed pool, cosine router top-k), "dynmoe" (top-any gate +
    :class:`DynMoEAdapter`), "mass" (top-p routing + :class:`MassLayerExpander`, redundancy loss while expanding).
    Returns dict(row: task, method, seed, acc, chance, final_pool, pool_at_best, mean_active, best_step, steps,
    n_test, expansions, removals, wall_s; correct [n_test] per-item test correctness; history; events)."""
    import time

    import torch.nn.functional as Fn
    from torch.utils.data import DataLoader

    from moelab import train as mtrain
    if method not in GLUE_METHODS:
        raise ValueError(f"method={method!r} not among {GLUE_METHODS}")
    _check_task(task)
    t0 = time.perf_counter()
    model, tok, layer = _build_glue_model(len(task["labels"]), method, cfg, seed)

    def encode(items):
        enc = tok([x for x, _ in items], truncation=True, max_length=cfg.max_length, padding=True, return_tensors="pt")
        return dict(enc), torch.tensor([y for _, y in items])

    state = dict(batch=None)
    mass_ex = dyn = None

    def loss_fn(m, batch):
        enc, y = batch
        state["batch"] = batch
        ce = Fn.cross_entropy(m(**enc), y)                               # L = CE(W pooled, y)
        loss = ce + cfg.aux_weight * layer.aux_loss                       # + balancing loss
        if mass_ex is not None:
            loss = loss + mass_ex.redundancy_loss(state.get("step", 0))  # + L_red while expanding
        state["step"] = state.get("step", 0) + 1
        # task_loss: CE alone, whose router gradient the trainer logs (issue 15, item 1)
        return loss, dict(ce=ce.detach(), pool=float(layer.active_mask.sum()), task_loss=ce)

    @torch.no_grad()
    def batch_nll(masked):                                               # MASS stopping test (eval mode: no dropout)
        enc, y = state["batch"]
        was = model.training
        keep = layer.active_mask.clone()
        model.eval()
        try:
            if masked is not None:
                layer.active_mask[masked] = False
            return float(Fn.cross_entropy(model(**enc), y))
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
        for s in range(0, len(items), 64):
            enc, y = encode(items[s:s + 64])
            pred = model(**enc).argmax(-1)
            correct.append((pred == y).numpy())
            real = enc["attention_mask"].reshape(-1).bool()
            n_act += int((layer.last_route.indices[real] >= 0).sum())   # experts used per real token
            n_tok += int(real.sum())
        return np.concatenate(correct).astype(float), n_act / max(n_tok, 1)

    best = dict(val=-1.0)

    def eval_fn(m):
        val, _ = predict(task["validation"])
        if val.mean() >= best["val"]:                                      # early selection on validation
            correct, active = predict(task["test"])
            best.update(val=float(val.mean()), correct=correct, mean_active=active, step=state.get("step", 0),
                        pool=int(layer.active_mask.sum()))
        return dict(val_acc=float(val.mean()))

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    fresh = [p for n, p in named if n.startswith("head") or ".router." in n]
    old = [p for n, p in named if not (n.startswith("head") or ".router." in n)]
    g = torch.Generator().manual_seed(seed)
    loader = DataLoader(list(task["train"]), batch_size=cfg.batch_size, shuffle=True, collate_fn=encode, generator=g,
                        drop_last=len(task["train"]) > cfg.batch_size)
    tcfg = mtrain.TrainConfig(lr=cfg.lr, steps=cfg.steps, seed=seed, eval_every=cfg.eval_every, warmup_frac=cfg.warmup_frac,
                              decay="linear", device="cpu", max_grad_norm=1.0, log_every=0,
                              desc=f"{name}-{method}-s{seed}")
    res = mtrain.train(model, loader, loss_fn=loss_fn, cfg=tcfg, eval_fn=eval_fn, hooks=hooks,
                       param_groups=[dict(params=old, lr=cfg.lr), dict(params=fresh, lr=cfg.lr_new)])
    if dyn is not None:
        dyn.close()
    ev = pd.DataFrame(mass_ex.pool.events if mass_ex is not None else (dyn.events if dyn is not None else []))
    kinds = ev.kind if "kind" in ev else pd.Series(dtype=str)
    row = dict(task=name, method=method, seed=seed, acc=float(best["correct"].mean()), chance=float(task["chance"]),
               final_pool=int(layer.active_mask.sum()), pool_at_best=best["pool"], mean_active=best["mean_active"],
               best_step=best["step"], steps=cfg.steps, n_test=len(task["test"]),
               expansions=int((kinds == "expand").sum()) if method == "mass" else int(ev.get("added", pd.Series()).sum()),
               removals=int((kinds == "remove").sum()) if method == "mass" else int(ev.get("removed", pd.Series()).sum()),
               wall_s=time.perf_counter() - t0)
    return dict(row=row, correct=best["correct"], history=res.history, events=ev)


def run_glue_standin(tasks: dict, methods, seeds, cfg: GlueStandinConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    """All runs of the GLUE stand-in (notebook 04 section 7).  ``tasks``: {name: task dict} from
    ``moelab.suite.textcls.tasks``.  Returns (runs: one row per (task, method, seed), see :func:`glue_standin`;
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
        r = glue_standin(tasks[name], method, seed, cfg, name=name)
        rows.append(r["row"])
        items.append(pd.DataFrame(dict(task=name, method=method, seed=seed, item=np.arange(len(r["correct"])),
                                       correct=r["correct"])))
    return pd.DataFrame(rows), pd.concat(items, ignore_index=True)


def glue_summary(runs: pd.DataFrame, items: pd.DataFrame, n_boot: int = 2000) -> pd.DataFrame:
    """Per task and method: accuracy (mean over seeds) with a 95% bootstrap interval over test items of the
    seed-averaged correctness, chance, final pool and active experts per token (mean and sd over seeds)."""
    from moelab.stats import bootstrap_ci
    if runs.empty or items.empty:
        raise ValueError("empty runs or items table")
    out = []
    for (t, m), sub in items.groupby(["task", "method"], sort=False):
        per_item = sub.pivot(index="item", columns="seed", values="correct").mean(1).to_numpy()
        est, lo, hi = bootstrap_ci(per_item, n_boot=n_boot)
        r = runs[(runs.task == t) & (runs.method == m)]
        out.append(dict(task=t, method=m, acc=est, ci_low=lo, ci_high=hi, chance=r.chance.iloc[0], seeds=len(r),
                        final_pool=r.final_pool.mean(), final_pool_sd=r.final_pool.std(ddof=0),
                        mean_active=r.mean_active.mean(), mean_active_sd=r.mean_active.std(ddof=0)))
    return pd.DataFrame(out)


def plot_glue_standin(summary: pd.DataFrame):
    """Fig. 4 stand-in: left accuracy per task and method with 95% intervals and the chance level; right final pool
    size (bars) and mean active experts per token (dots) per task and method."""
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    tasks, methods = list(dict.fromkeys(summary.task)), list(dict.fromkeys(summary.method))
    w = 0.8 / len(methods)
    for j, m in enumerate(methods):
        s = summary[summary.method == m].set_index("task").reindex(tasks)
        x = np.arange(len(tasks)) + (j - (len(methods) - 1) / 2) * w
        a.bar(x, s.acc, w, yerr=[s.acc - s.ci_low, s.ci_high - s.acc], capsize=3, label=m)
        b.bar(x, s.final_pool, w, alpha=0.5, label=f"{m}: pool")
        b.scatter(x, s.mean_active, color="k", marker="o", s=14, zorder=5)
    for i, t in enumerate(tasks):
        ch = summary[summary.task == t].chance.iloc[0]
        a.hlines(ch, i - 0.45, i + 0.45, colors="red", linestyles=":", label="chance" if i == 0 else None)
    for ax in (a, b):
        ax.set_xticks(range(len(tasks)), tasks)
    a.set(ylabel="test accuracy", title="accuracy (95% bootstrap interval over items)")
    b.set(ylabel="experts", title="final pool (bars), active experts per token (dots)")
    a.legend(fontsize=7)
    b.legend(fontsize=7)
    fig.tight_layout()
    return fig
