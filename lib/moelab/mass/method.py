"""MASS itself (paper 003, Sec. 3; notebook ``notebooks/04_mass.py``): top-p gate weights, the change-point test,
the semantic test with its threshold delta, duplication with gradient decomposition, the redundancy term and the
expansion state machine; DynMoE's adaptive process as the baseline method of the real-data part.

The paper's formulas were lost in extraction; where it is silent the public code (psmiz/MASS, read for
``docs/reference-facts.md``) is followed, and each such choice is named where it is made:

- change-point test (Sec. 3.4; ``tutel/impls/moe_layer_mass.py``): g_t = ||grad W1_e||_F; after a warm-up of
  ``warmup`` norms z_t = (g_t - mean W_t) / std W_t over the last ``window`` norms W_t; an expert is tested once it
  has ``warmup`` norms and a full window of norms; S = sum of the (at most ``window``) stored z / sqrt(window);
  p = 1 - Phi(S); fire when p < 0.01.  Public windows: warm-up max(30, int(0.05 T)), window max(60, int(0.09 T)),
  T = total steps, expansion in the first 10% of steps, so the first test is at step 0.09 T (:func:`mass_settings`).
- semantic test (Sec. 3.5): |cos(vec W1_e, vec grad W1_e)| < delta (0.001 GLUE, 0.002 PACS), delta scaled to the
  expert's size from the public GLUE shape 4096x1024 (:func:`slots_delta`; the public GLUE scripts run
  ``--max_expert_num 16 --expert_repeat 16``: every expert is a copy of the whole dense FFN of bert-large).  An
  expert with two matrices (``d_ff``) reads both: cos and norm of the concatenated vec(W1, W2).
- duplication (Sec. 3.6): copy expert and gate row into a free slot; the source keeps the row-wise aligned part of
  its gradients, the copy the full gradient.
- redundancy loss (Sec. 3.7): sum over duplicated pairs of cos(W_g[i], W_g[j])^2, weight 0.01, while expanding.
- stopping (public training loop): the NLL test runs only when more than one expert has been added
  (``expansion_count > 1``); a failed test removes the last-added expert and then still expands (the pool does not
  shrink) while patience lasts; the failed test after patience is spent stops expansion (:class:`MassPool`).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import norm

from moelab.core.experts import optimizer_copy_rows
from moelab.core.routing import top_p_route

__all__ = ["topk_weights", "top_p_weights", "rolling_z", "cpd_pvalue", "weight_grad_cos", "project_rows",
           "MassConfig", "mass_settings", "slots_delta", "PUBLIC_W1_SHAPE", "redundancy_term", "duplicate_rows",
           "MassPool", "MassExpander", "duplicate_layer_expert", "MassLayerExpander", "DynMoEAdapter"]

# W1 of one expert in the public GLUE runs (rte.sh: bert-large, --max_expert_num 16 --expert_repeat 16: each expert
# is a copy of the whole dense FFN, W1 of 4096 x 1024; not 16 slices of 256)
PUBLIC_W1_SHAPE = (4096, 1024)


# ----------------------------------------------------------------------------------------------- routing
def topk_weights(probs: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Naive MoE gate (tutel top-k; MASS Sec. 4.3 baseline, notebook 04): keep the k largest of p = softmax(W_g u) per
    model; renormalise when k > 1.  probs [M, N, E], k [M] long -> dense weights [M, N, E] (zero outside the top-k)."""
    if k.min() < 1:
        raise ValueError(f"top_k must be >= 1, got {k.tolist()}")
    rank = torch.argsort(torch.argsort(probs, dim=-1, descending=True), dim=-1)    # rank of each expert [M,N,E]
    keep = (rank < k[:, None, None]) & (probs > 0)
    w = probs * keep
    renorm = (k > 1)[:, None, None]
    return torch.where(renorm, w / w.sum(-1, keepdim=True).clamp_min(1e-20), w)


def top_p_weights(logits: torch.Tensor, p: float) -> torch.Tensor:
    """MASS gate (Sec. 3.3; notebook 04): S_t = smallest set of sorted scores whose cumulative mass reaches p;
    w_ti = p_ti / sum_{j in S_t} p_tj if some token of the model's batch keeps more than one expert, else w_ti = p_ti
    (the authors' rule, ``renormalize="mass_batch"`` of :func:`moelab.core.routing.top_p_route`, one batch per model).
    logits [..., N, E] (-inf on free slots; leading dims = models) -> weights [..., N, E]."""
    rows = logits.reshape(-1, *logits.shape[-2:])                                # [M, N, E]
    w = torch.stack([top_p_route(r, p, convention="mass", renormalize="mass_batch")[0] for r in rows])
    return w.reshape(logits.shape)


# ----------------------------------------------------------------------------------------------- statistics
def rolling_z(values, window: int, warmup: int) -> np.ndarray:
    """z-scores of the change-point test (MASS Sec. 3.4; notebook 04): from the warm-up on,
    z_t = (g_t - mean(W_t)) / std(W_t), W_t = the last ``window`` norms including g_t (unbiased std); std = 0 gives
    z = 0 (the public code would divide by zero).  values [T] -> z [T - warmup + 1]."""
    g = np.asarray(values, dtype=float)
    zs = []
    for t in range(warmup - 1, len(g)):
        w = g[max(0, t - window + 1): t + 1]
        sd = w.std(ddof=1) if len(w) > 1 else 0.0
        zs.append(0.0 if sd == 0 or not np.isfinite(sd) else (g[t] - w.mean()) / sd)
    return np.asarray(zs)


def cpd_pvalue(z_window, window: int) -> float:
    """S = sum_{i in window} z_i / sqrt(window);  p = 1 - Phi(S)   (MASS Sec. 3.4, right-tailed; notebook 04).
    The public code divides by sqrt(window) even while fewer than ``window`` z-scores are stored."""
    if window < 1:
        raise ValueError(f"window={window} must be >= 1")
    s = float(np.sum(z_window)) / math.sqrt(window)
    return float(norm.sf(s))


def weight_grad_cos(w, g) -> float:
    """cos(vec W1_e, vec grad W1_e) (MASS Sec. 3.5; notebook 04).  ``w``, ``g``: one tensor each, or lists of
    tensors (an expert with two matrices: cos of the concatenations vec(W1, W2) and vec(grad W1, grad W2)).  Zero
    weight or zero gradient -> 1.0 ("no evidence of drift": an expert with no tokens has a zero gradient and must
    not be duplicated)."""
    if isinstance(w, (list, tuple)):
        w = torch.cat([t.reshape(-1) for t in w])
        g = torch.cat([t.reshape(-1) for t in g])
    w, g = w.reshape(-1).double(), g.reshape(-1).double()
    nw, ng = w.norm(), g.norm()
    if nw == 0 or ng == 0:
        return 1.0
    return float(w @ g / (nw * ng))


def project_rows(grad: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Aligned component of the gradient, row by row (MASS Sec. 3.6, public code; notebook 04):
    g_r <- (g_r·w_r / (w_r·w_r + 1e-12)) w_r."""
    if grad.shape != w.shape:
        raise ValueError(f"grad shape {tuple(grad.shape)} != weight shape {tuple(w.shape)}")
    w2 = w.reshape(-1, w.shape[-1]) if w.ndim > 1 else w[None]
    g2 = grad.reshape(w2.shape)
    coef = (g2 * w2).sum(-1, keepdim=True) / ((w2 * w2).sum(-1, keepdim=True) + 1e-12)
    return (coef * w2).reshape(w.shape)


# ----------------------------------------------------------------------------------------------- settings
def mass_settings(total_steps: int, warmup_frac: float = 0.05, window_frac: float = 0.09, min_warmup: int = 30,
                  min_window: int = 60) -> tuple[int, int]:
    """(warm-up, window) of the change-point test (MASS Sec. 3.4; notebook 04).  Defaults = the public training loop:
    warm-up max(30, int(0.05 T)), window max(60, int(0.09 T)), T = total steps; an expert is first tested at
    0-based step max(warm-up, window) - 1, i.e. 0.09 T for T >= 667 (inside an expansion phase of 0.1 T).
    Other values are a stated deviation (the GLUE stand-in's 100-step runs use 0.005 / 0.01 with minima 3 / 6)."""
    if total_steps < 1:
        raise ValueError(f"total_steps={total_steps} must be >= 1")
    if min(warmup_frac, window_frac) < 0 or min_warmup < 1 or min_window < 2:
        raise ValueError(f"need fractions >= 0, min_warmup >= 1 and min_window >= 2, got {warmup_frac}, "
                         f"{window_frac}, {min_warmup}, {min_window}")
    return max(min_warmup, int(warmup_frac * total_steps)), max(min_window, int(window_frac * total_steps))


def slots_delta(d_model: int, paper_delta: float = 0.001, paper_numel: int = PUBLIC_W1_SHAPE[0] * PUBLIC_W1_SHAPE[1],
                numel: int | None = None) -> float:
    """Semantic threshold delta scaled to our expert size (MASS Sec. 3.5; notebook 04): |cos| of unrelated vectors
    scales as 1/sqrt(numel), so the GLUE delta 0.001 for the public W1 of 4096x1024 (rte.sh, each expert the whole
    dense FFN) maps to delta = 0.001 * sqrt(4194304 / numel).  ``numel`` = size of the weights the cosine reads
    (default d_model^2, the synthetic model's square W1): d_model = 64 gives delta = 0.032; MiniLM's 1536x384 W1
    gives 0.0027."""
    numel = d_model * d_model if numel is None else numel
    if numel < 1 or paper_numel < 1:
        raise ValueError(f"W1 size d_model={d_model} / numel={numel} / paper_numel={paper_numel} must be >= 1")
    return paper_delta * math.sqrt(paper_numel / numel)


@dataclass
class MassConfig:
    """MASS expansion settings (MASS Sec. 3; notebook 04).  Public-code defaults except where a notebook states
    otherwise: ``total_steps`` T; change-point ``warmup`` / ``window`` (public: :func:`mass_settings`); ``p_threshold``
    0.01; semantic ``delta`` (public GLUE value 0.001 at 4096x1024, scale with :func:`slots_delta`); ``patience`` 3
    (removals allowed before the next failed NLL test stops expansion); ``max_experts`` 16; expansion in the first
    ``expand_frac`` = 10% of steps; redundancy weight 0.01; ``init_experts``: the start size (the public GLUE script
    starts at 8 of 16; the synthetic notebook states its own)."""
    total_steps: int
    warmup: int
    window: int
    p_threshold: float = 0.01
    delta: float = 0.001
    patience: int = 3
    max_experts: int = 16
    expand_frac: float = 0.10
    redundancy_weight: float = 0.01
    init_experts: int = 2

    def __post_init__(self):
        if self.warmup < 1 or self.window < 2:
            raise ValueError(f"warmup={self.warmup} must be >= 1 and window={self.window} >= 2")
        if self.total_steps < 1:
            raise ValueError(f"total_steps={self.total_steps} must be >= 1")
        if not 0 < self.p_threshold < 1 or self.delta <= 0 or self.patience < 0:
            raise ValueError(f"bad p_threshold={self.p_threshold}, delta={self.delta} or patience={self.patience} "
                             "(need 0 < p_threshold < 1, delta > 0, patience >= 0)")
        if not 1 <= self.init_experts <= self.max_experts:
            raise ValueError(f"init_experts={self.init_experts} must lie in [1, max_experts={self.max_experts}]")

    @classmethod
    def public(cls, total_steps: int, **kw) -> "MassConfig":
        """The public code's windows for ``total_steps`` (:func:`mass_settings` defaults); other fields by keyword."""
        warmup, window = mass_settings(total_steps)
        return cls(total_steps=total_steps, warmup=warmup, window=window, **kw)

    @property
    def expand_until(self) -> int:
        """Expansion steps are the 0-based steps < int(expand_frac * T)."""
        return int(self.expand_frac * self.total_steps)

    @property
    def first_test(self) -> int:
        """0-based step of an expert's first change-point test: it needs ``warmup`` norms and a full window of norms."""
        return max(self.warmup, self.window) - 1

    @property
    def can_fire(self) -> bool:
        return self.first_test < self.expand_until


# ----------------------------------------------------------------------------------------------- duplication
def redundancy_term(gate_rows: torch.Tensor, pairs) -> torch.Tensor:
    """sum_{(i,j) in D} cos(W_g[i], W_g[j])^2 over the duplicated pairs D (MASS Sec. 3.7; notebook 04).
    gate_rows [E, d] -> []."""
    if not pairs:
        return gate_rows.new_zeros(())
    i, j = map(list, zip(*pairs))
    gi, gj = F.normalize(gate_rows[i], dim=-1), F.normalize(gate_rows[j], dim=-1)
    return ((gi * gj).sum(-1) ** 2).sum()


@torch.no_grad()
def duplicate_rows(rows, optimizer) -> None:
    """MASS duplication with gradient decomposition (Sec. 3.6; notebook 04) on slot rows of parameters.
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


# ----------------------------------------------------------------------------------------------- expansion
class MassPool:
    """Expansion state machine of one expert pool (MASS Alg. 1 as the public code runs it; notebook 04), shared by
    :class:`MassExpander` (one pool per stacked synthetic model) and :class:`MassLayerExpander` (one ``MoELayer``).

    The pool decides; a *view* acts on the model: ``active() -> ids``, ``grad_norms() -> [E]`` (||grad W1_e||_F),
    ``cos(e)``, ``nll_full()``, ``nll_masked(e)`` (current batch without expert e), ``free() -> ids``,
    ``duplicate(src, dst)``, ``deactivate(e)``, ``n_active()``.  Per step in the expansion phase (0-based step <
    ``expand_until``):

    1. every active expert records g_t; once it has ``warmup`` norms since its last reset it stores
       z_t = (g_t - mean W)/std W over its last ``window`` norms (kept across a reset, as the public code keeps them);
    2. an expert is tested when it has >= ``warmup`` norms since its reset and a full window of norms:
       S = sum of its stored z (at most ``window``) / sqrt(window), p = 1 - Phi(S); the first tested expert (slot
       order) with p < p_threshold and |cos(W1_e, grad W1_e)| < delta is the candidate;
    3. with a candidate: if more than one expert has been added (public ``expansion_count > 1``), the NLL of the
       current batch without the last-added expert is compared with the full NLL; if it is not higher
       (gap <= 0) and patience > 0: patience -= 1, the last-added expert is removed and the candidate is still
       duplicated (the pool does not shrink); if patience is 0: expansion stops and the failed expert stays out of
       routing (the public code leaves its gate mask at 0; here it is deactivated, so the pool counts the experts
       that route); if the gap is positive, or fewer than two experts were added, the candidate is duplicated.
       When the candidate is the removed last expert itself, the removal stands alone (the public code reaches an
       index error there: it shortens its statistics lists before resetting the source's count);
    4. duplication into the first free slot; the source's warm-up count restarts, the copy starts fresh windows;
       expansion stops when the pool reaches ``max_experts``.
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
        """Record g_t of expert e; returns the change-point p-value (nan while e is not testable)."""
        self.count[e] += 1
        gw = self.gwin[e]
        gw.append(gnorm)
        z = p = np.nan
        if self.count[e] >= self.cfg.warmup:
            arr = np.asarray(gw)
            sd = arr.std(ddof=1) if len(arr) > 1 else 0.0
            z = 0.0 if sd == 0 else (gnorm - arr.mean()) / sd     # z_t = (g_t - mean W) / std W
            self.zwin[e].append(z)
            if len(gw) == self.cfg.window:                         # tested: warm-up done and a full norm window
                p = cpd_pvalue(self.zwin[e], self.cfg.window)     # p = 1 - Phi(sum z / sqrt(window))
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

    def _drop_last(self, view) -> int:
        last = self.added.pop()
        view.deactivate(last)
        self.pairs = [pr for pr in self.pairs if pr[1] != last]
        return last

    def act(self, step: int, view, cand) -> None:
        """Step 3-4 of the rule above for candidate ``cand`` = (expert, p, cos)."""
        if len(self.added) > 1:                                 # NLL test on the current batch (expansion_count > 1)
            last = self.added[-1]
            gap = float(view.nll_masked(last)) - float(view.nll_full())     # L(without last) - L
            if gap <= 0:
                if self.patience > 0:
                    self.patience -= 1
                    self._drop_last(view)
                    self._event(step, "remove", last, p=cand[1], cos=cand[2])
                    if cand[0] == last:      # the candidate itself was removed: nothing left to duplicate
                        return
                else:
                    self._drop_last(view)
                    self._event(step, "remove", last, p=cand[1], cos=cand[2])
                    self.stop(step, "patience")
                    return
        self.expand(step, view, cand)

    def expand(self, step: int, view, cand) -> None:
        src = cand[0]
        free = view.free()
        if len(free) == 0:
            self.stop(step, "max_pool")
            return
        dst = int(free[0])
        view.duplicate(src, dst)
        self.added.append(dst)
        self.pairs.append((src, dst))
        self.count[src] = self.count[dst] = 0                   # source's warm-up restarts, copy starts fresh
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


def _expert_mats(model) -> list:
    """The expert matrices MASS's tests read: ``model.expert_matrices()`` when the model has them, else [w1]."""
    return model.expert_matrices() if hasattr(model, "expert_matrices") else [model.w1]


class _StackedView:
    """Model m of a stacked model (``w1`` [M, E, ...], ``gate`` [M, E, d], ``active`` [M, E]) as seen by
    :class:`MassPool`."""

    def __init__(self, model, m, optimizer, nll_fn, gn=None):
        self.model, self.m, self.opt, self.nll_fn, self.gn = model, m, optimizer, nll_fn, gn

    def active(self):
        return np.flatnonzero(self.model.active[self.m].cpu().numpy())

    def free(self):
        return np.flatnonzero(~self.model.active[self.m].cpu().numpy())

    def n_active(self):
        return int(self.model.active[self.m].sum())

    def grad_norms(self):
        return self.gn[self.m]

    def cos(self, e):
        mats = _expert_mats(self.model)
        return weight_grad_cos([p[self.m, e] for p in mats], [p.grad[self.m, e] for p in mats])

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


def _model_batch_nll(model, batch, active):
    """Default stopping-test loss: the stacked model's own per-model NLL of ``batch`` under ``active`` [M]."""
    return model.batch_nll(batch, active)


class MassExpander:
    """Adaptive expansion for every model of a stacked MoE (MASS Alg. 1; notebook 04): one :class:`MassPool` per
    model (see there for the per-step rule).  Duplication copies expert W1, b1 and the gate row into a free slot;
    gradients: source keeps the row-wise aligned part, the copy the full gradient; Adam moments of the new slot
    start at zero.  ``redundancy_loss(step, model)`` = weight * sum_{(i,j) dup} cos(g_i, g_j)^2 during expansion
    (MASS Sec. 3.7).  ``nll_fn(model, batch, active [M, E]) -> [M]``: loss of the current batch under an active mask
    (default: ``model.batch_nll``)."""

    def __init__(self, cfg: MassConfig, n_models: int, nll_fn=None):
        self.cfg = cfg
        self.nll_fn = nll_fn or _model_batch_nll
        self.M = n_models
        self.trace, self.events = [], []
        self.pools = [MassPool(cfg, m, self.events, self.trace) for m in range(n_models)]
        for name in ("count", "gwin", "zwin", "pairs", "added", "patience", "stopped", "stop_reason"):
            setattr(self, name, _PerPool(self.pools, name))

    def expanding(self, step: int, m: int) -> bool:
        return self.pools[m].expanding(step)

    def redundancy_loss(self, step: int, model) -> torch.Tensor:
        """L_red = w * sum_{(i,j) in D} cos(W_g[i], W_g[j])^2, only while expanding (MASS Sec. 3.7)."""
        tot = model.gate.new_zeros(())
        for m in range(self.M):
            if step < self.cfg.expand_until and self.pools[m].pairs:
                tot = tot + redundancy_term(model.gate[m], self.pools[m].pairs)
        return self.cfg.redundancy_weight * tot

    @torch.no_grad()
    def after_backward(self, step: int, model, optimizer) -> None:
        if model.E != self.cfg.max_experts:
            raise ValueError(f"model has {model.E} slots but max_experts={self.cfg.max_experts}")
        # ||grad W1_e||_F  [M, E] (an expert with W1 and W2: the norm of both gradients together)
        gn = torch.stack([p.grad.flatten(2).pow(2).sum(-1) for p in _expert_mats(model)]).sum(0).sqrt().float().cpu()
        for m, pool in enumerate(self.pools):
            pool.after_backward(step, _StackedView(model, m, optimizer, self.nll_fn, gn))

    def _act(self, step, model, optimizer, m, cand):
        self.pools[m].act(step, _StackedView(model, m, optimizer, self.nll_fn), cand)

    @staticmethod
    @torch.no_grad()
    def duplicate(model, optimizer, m: int, src: int, dst: int) -> None:
        """E_new <- copy(E_src), W_g[new] <- W_g[src]; gradients rewritten before the optimiser step:
        grad W1_src <- aligned part (row-wise projection on W1_src; W2 likewise when the expert has one),
        grad W_g[src] <- projection on W_g[src];
        the new expert and gate row take the full gradients (MASS Sec. 3.6)."""
        if model.active[m, dst]:
            raise ValueError(f"slot {dst} of model {m} is already active")
        rows = [(model.w1, (m, src), (m, dst), True), (model.b1, (m, src), (m, dst), False),
                (model.gate, (m, src), (m, dst), True)]
        if getattr(model, "w2", None) is not None:                        # expert with a hidden width: W2 too
            rows.append((model.w2, (m, src), (m, dst), True))
        duplicate_rows(rows, optimizer)
        model.active[m, dst] = True


# ----------------------------------------------------------------------------------------------- one MoELayer
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
    """MASS duplication (Sec. 3.6; notebook 04 real-data part) in a ``MoELayer``: expert ``src`` (w_in, b_in, w_out,
    b_out) and its router row into free slot ``dst``; grad w_in[src] and grad router[src] keep only their row-wise
    aligned parts, the copy takes the full gradients; Adam moments of ``dst`` start at zero."""
    if bool(layer.active_mask[dst]):
        raise ValueError(f"slot {dst} is already active")
    ex = layer.experts
    rows = [(ex.w_in, src, dst, True), (ex.w_out, src, dst, False), (layer._router_rows(), src, dst, True)]
    rows += [(p, src, dst, False) for p in (ex.b_in, ex.b_out) if p is not None]
    duplicate_rows(rows, optimizer)
    layer.active_mask[dst] = True


class MassLayerExpander:
    """MASS on one ``MoELayer`` with ``router="top_p"`` (MASS Sec. 3; notebook 04 real-data part): a
    :class:`MassPool` driven from the trainer's ``after_backward(step, model, optimizer)`` hook (step 1-based).
    ``nll_fn(masked_expert or None) -> float``: loss of the current batch without that expert (the stopping test)."""

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


# ----------------------------------------------------------------------------------------------- DynMoE (baseline)
class DynMoEAdapter:
    """DynMoE's adaptive process on one ``MoELayer`` with ``router="topany"`` (Guo et al. 2024, LINs-lab/DynMoE; the
    baseline of MASS Sec. 4.4, notebook 04 real-data part).  During training, per interval of ``interval`` steps, it
    records the tokens routed to each expert and the tokens routed to none (top-any selects no expert:
    s_e <= sigmoid(theta_e) for all e).  At the end of the interval: experts that received no token are masked out
    (at least one stays); if some tokens were unrouted and a slot is free, one expert is added with gate row
    w_new = mean of the unrouted tokens (direction; the gate is a cosine), threshold 0 and FFN weights = the dense
    FFN copy it was upcycled from.  Simplifications: DynMoE's extra gate losses (diversity / simplicity) are
    replaced by the balancing loss used for every method here; the adaptation runs through the whole fine-tuning."""

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
