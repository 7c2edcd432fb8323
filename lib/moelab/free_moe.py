"""Free-MoE: Domain-Oriented Weight Purification (DOWP) and a multi-level router (paper 004, "Free-MoE:
Tuning-free Mixture-of-Experts purifying LLMs to thrive across any field"). Notebook: ``notebooks/05_free_moe.py``.

What is here (paper section -> function):

- §3.1 clustering-based classification, Eq. 2-3: :func:`embedding_features`, :func:`fit_subdomains`.
- §3.1 metric on patches, Eq. 4: calibration statistics :func:`collect_input_norms` (forward hooks on every target
  ``nn.Linear``, streamed: only the per-input-column sum of squares is kept), :func:`patch_importance`.
- §3.1 DSS-Expert formation, Eq. 5-6: :func:`patch_ranks`, :func:`band_mask` (-> :class:`PurificationMask`, packed
  bits per matrix), :func:`apply_mask` / :class:`MaskSwitcher` (in place, the zeroed values are stored so removal
  restores the weights bit for bit), :func:`band_sweep`, :func:`sweep_table` (appendix Tables 6-10 layout).
- §3.2 multi-level trainable router, Eq. 7-8: :class:`MultiLevelRouter`.
- Scoring helpers used by the sweeps (thin wrappers over ``moelab.suite.scorer``, the project's one log-likelihood
  scorer, issue 17): :func:`continuation_logprobs`, :func:`choice_accuracy`, :func:`answer_logprob`; and
  :func:`generate_completions`.

Reading of "purify" implemented here (the paper is inconsistent, see ``docs/reference-facts.md``):
purifying a band ``[θmin, θmax)`` (percentiles of the ascending importance ranking, compared within each output row
of patches as in Wanda, or within the whole matrix with ``scope="matrix"``) **sets those patches' weights to zero**.
The band ``[0, 5)`` at 1x1 patches is exactly Wanda at 5% sparsity; the appendix bands 50-55% ... 95-100% zero
progressively *more* important weights. Patch sizes that do not divide a matrix are rejected (ValueError), not padded:
padding would give edge patches fewer elements and so systematically lower importance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import nn

from moelab import progress
from moelab.profiles import paper_input_hint
from moelab.suite import scorer

SUBLAYER_PROJECTIONS = {
    "mlp": ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
    "attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"),
}
SUBLAYERS = ("mlp", "attn", "both")
PATCH_SIZES = (1, 2, 4, 16)
APPENDIX_BANDS = tuple((float(lo), float(lo + 5)) for lo in range(50, 100, 5))   # Tables 6-10: 50-55% ... 95-100%
WANDA_BAND = (0.0, 5.0)


# ----------------------------------------------------------------------------------------------------------------
# target modules and calibration statistics
# ----------------------------------------------------------------------------------------------------------------
def target_linears(model: nn.Module, sublayers: str = "both") -> dict[str, nn.Linear]:
    """The ``nn.Linear`` projections DOWP purifies (§3.1 "purifying MLP or Self-Attention layers", Table 3).

    Llama/Gemma naming: ``*.mlp.{gate,up,down}_proj`` and ``*.self_attn.{q,k,v,o}_proj``. ``sublayers`` is
    ``"mlp"``, ``"attn"`` or ``"both"``. A model without any such module -> ValueError.
    """
    if sublayers not in SUBLAYERS:
        raise ValueError(f"sublayers={sublayers!r}: expected one of {SUBLAYERS}")
    suffixes = SUBLAYER_PROJECTIONS["mlp"] + SUBLAYER_PROJECTIONS["attn"] if sublayers == "both" \
        else SUBLAYER_PROJECTIONS[sublayers]
    found = {name: mod for name, mod in model.named_modules()
             if isinstance(mod, nn.Linear) and name.endswith(suffixes)}
    if not found:
        raise ValueError(f"model {type(model).__name__} has no nn.Linear named *{{{', '.join(suffixes)}}} "
                         f"(sublayers={sublayers!r}); DOWP expects Llama/Gemma-style module names")
    return found


@dataclass
class InputNorms:
    """Streamed calibration statistics: per target Linear, Σ_t x_tj^2 over calibration tokens ([in_features], fp64)."""
    sumsq: dict[str, torch.Tensor]
    n_tokens: int

    def norm(self, name: str) -> torch.Tensor:
        """||X_j||_2 over all calibration tokens, [in_features] float32 (Eq. 4's ||X||_2; Wanda's sqrt(scaler_row))."""
        return self.sumsq[name].sqrt().float()


@torch.no_grad()
def collect_input_norms(model: nn.Module, batches: Iterable[dict], sublayers: str = "both",
                        max_tokens: int | None = None) -> InputNorms:
    """Calibration pass of §3.1 (Eq. 4's ||X_n||_2) with forward hooks on each target Linear.

    ``batches`` yields dicts with ``input_ids`` [B,S] and optional ``attention_mask`` [B,S]; padding tokens are excluded.
    Streamed: each hook adds Σ_t x_tj^2 for its batch into an fp64 accumulator [in_features] and drops the activations
    (Wanda keeps a running mean of the same quantity, proportional to this). One pass over the dense model: unlike
    Wanda's block-by-block pass, later layers see unpurified inputs (DOWP evaluates many bands from one calibration).
    """
    linears = target_linears(model, sublayers)
    sumsq = {n: torch.zeros(m.in_features, dtype=torch.float64) for n, m in linears.items()}
    keep: dict[str, torch.Tensor | None] = {"mask": None}

    def make_hook(name):
        def hook(_mod, inputs, _out):
            x = inputs[0].detach()
            x = x.reshape(-1, x.shape[-1])                                    # [B*S, in]
            if keep["mask"] is not None:
                x = x[keep["mask"]]                                          # [T, in] non-pad tokens
            sumsq[name] += x.double().pow(2).sum(0).cpu()                   # Σ_t x_tj^2   [in]
        return hook

    handles = [m.register_forward_hook(make_hook(n)) for n, m in linears.items()]
    n_tokens = 0
    device = next(model.parameters()).device
    try:
        for batch in batches:
            ids = batch["input_ids"].to(device)
            am = batch.get("attention_mask")
            am = torch.ones_like(ids) if am is None else am.to(device)
            if max_tokens is not None and n_tokens >= max_tokens:
                break
            keep["mask"] = am.reshape(-1).bool()
            model(input_ids=ids, attention_mask=am)
            n_tokens += int(am.sum())
    finally:
        for h in handles:
            h.remove()
    if n_tokens == 0:
        raise ValueError("collect_input_norms: no calibration tokens (empty batches)")
    return InputNorms(sumsq=sumsq, n_tokens=n_tokens)


def tokenize_batches(tok, texts: Sequence[str], batch_size: int = 8, max_length: int = 256) -> list[dict]:
    """Right-padded token batches for calibration (texts sorted by length to limit padding)."""
    if len(texts) == 0:
        raise ValueError("tokenize_batches: empty text list")
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = []
    for s in range(0, len(order), batch_size):
        chunk = [texts[i] for i in order[s:s + batch_size]]
        enc = tok(chunk, return_tensors="pt", padding=True, truncation=True, max_length=max_length)
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    return out


# ----------------------------------------------------------------------------------------------------------------
# Eq. 4: patch importance, Eq. 5: ranking and bands
# ----------------------------------------------------------------------------------------------------------------
def _check_patch(shape: tuple[int, int], patch: int, name: str = "weight") -> None:
    if not isinstance(patch, int) or patch < 1:
        raise ValueError(f"patch={patch}: must be a positive int (paper: {PATCH_SIZES})")
    if shape[0] % patch or shape[1] % patch:
        raise ValueError(f"patch={patch} does not divide {name} of shape {tuple(shape)}; "
                         "DOWP here rejects (no padding: padded edge patches would rank artificially low)")


def patch_importance(weight: torch.Tensor, col_norm: torch.Tensor, patch: int = 1) -> torch.Tensor:
    """Eq. 4: M_ij = Σ_{(m,n)∈P_ij} |W_mn| · ||X_n||_2 over p x p patches.

    weight [out, in], col_norm [in] (||X_n||_2 of input column n) -> M [out/p, in/p] (float32).
    At p = 1 this is Wanda's metric |W_ij| · ||X_j||_2.
    """
    if weight.dim() != 2 or col_norm.dim() != 1 or col_norm.shape[0] != weight.shape[1]:
        raise ValueError(f"patch_importance: weight {tuple(weight.shape)} and col_norm {tuple(col_norm.shape)} "
                         "do not match ([out,in] and [in])")
    _check_patch(tuple(weight.shape), patch)
    s = weight.detach().float().abs() * col_norm.float().to(weight.device)[None, :]   # |W_mn|·||X_n||  [out, in]
    if patch == 1:
        return s
    o, i = s.shape
    return s.reshape(o // patch, patch, i // patch, patch).sum(dim=(1, 3))              # Σ over P_ij  [out/p, in/p]


def _ranks(m: torch.Tensor, scope: str) -> torch.Tensor:
    """Ascending rank (0 = least important) of each patch within its row of patches (``scope="row"``) or within the
    matrix (``"matrix"``); stable sort (ties keep column order, as Wanda's ``torch.sort(..., stable=True)``)."""
    if scope == "row":
        flat = m
    elif scope == "matrix":
        flat = m.reshape(1, -1)
    else:
        raise ValueError(f"scope={scope!r}: expected 'row' or 'matrix'")
    n = flat.shape[1]
    dtype = torch.int16 if n <= 32767 else torch.int32
    order = torch.sort(flat, dim=1, stable=True).indices                              # M_(1) <= M_(2) <= ...
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(n, device=m.device).expand_as(order).contiguous())
    return ranks.to(dtype).reshape(m.shape)


@dataclass
class PatchRanks:
    """Per-matrix ranks of Eq. 4's importance (computed once per subdomain, reused for every band)."""
    ranks: dict[str, torch.Tensor]          # name -> int [out/p, in/p]
    patch: int
    scope: str
    sublayers: str

    def group_size(self, name: str) -> int:
        r = self.ranks[name]
        return r.shape[1] if self.scope == "row" else r.numel()


def patch_ranks(model: nn.Module, norms: InputNorms, patch: int = 1, sublayers: str = "both",
                scope: str = "row") -> PatchRanks:
    """Rank all patches of every target matrix by Eq. 4 importance (ascending, §3.1 "sorted in ascending order")."""
    linears = target_linears(model, sublayers)
    ranks = {}
    for name, lin in linears.items():
        if name not in norms.sumsq:
            raise ValueError(f"no calibration statistics for {name!r}; collect_input_norms with sublayers covering it")
        _check_patch(tuple(lin.weight.shape), patch, name)
        ranks[name] = _ranks(patch_importance(lin.weight, norms.norm(name), patch), scope).cpu()
    return PatchRanks(ranks=ranks, patch=patch, scope=scope, sublayers=sublayers)


def check_band(band: tuple[float, float]) -> tuple[float, float]:
    """Band (θmin, θmax) in percent of the ascending ranking; must satisfy 0 <= θmin < θmax <= 100."""
    if len(band) != 2:
        raise ValueError(f"band={band!r}: expected (theta_min, theta_max)")
    lo, hi = float(band[0]), float(band[1])
    if not (0.0 <= lo < hi <= 100.0) or any(map(math.isnan, (lo, hi))):
        raise ValueError(f"band={band!r}: need 0 <= theta_min < theta_max <= 100 (percentiles)")
    return lo, hi


def band_label(band: tuple[float, float]) -> str:
    lo, hi = check_band(band)
    return f"{lo:g}-{hi:g}%"


@dataclass
class PurificationMask:
    """A DSS-Expert (§3.1): which patches of which matrices are purified (zeroed), stored as packed bits of the patch
    grid per matrix (1 bit per patch: 13 MB for all of SmolLM2's projections at 1x1, 52 KB at 16x16)."""
    bits: dict[str, np.ndarray]             # name -> np.packbits(patch grid, flattened)
    grid: dict[str, tuple[int, int]]        # name -> (out/p, in/p)
    patch: int
    band: tuple[float, float]
    meta: dict = field(default_factory=dict)

    def patch_mask(self, name: str) -> torch.Tensor:
        g = self.grid[name]
        return torch.from_numpy(np.unpackbits(self.bits[name], count=g[0] * g[1]).astype(bool)).reshape(g)

    def element_mask(self, name: str) -> torch.Tensor:
        m = self.patch_mask(name)
        if self.patch > 1:
            m = m.repeat_interleave(self.patch, 0).repeat_interleave(self.patch, 1)   # patch -> its p x p weights
        return m

    def n_purified(self) -> int:
        return int(sum(int(np.unpackbits(b, count=g[0] * g[1]).sum()) for b, g in
                       zip(self.bits.values(), self.grid.values()))) * self.patch ** 2

    def n_bytes(self) -> int:
        return int(sum(b.nbytes for b in self.bits.values()))


def band_mask(ranks: PatchRanks, band: tuple[float, float]) -> PurificationMask:
    """Eq. 5: θ_r = {M_(i) ∈ [θmin, θmax]}: patches whose ascending rank r (0-based, within each comparison group of
    n patches) satisfies ⌊n·θmin/100⌋ <= r < ⌊n·θmax/100⌋. For (0, s) this is exactly Wanda's pruned set
    ``sort(metric)[:, :int(n·s/100)]``; adjacent bands tile the ranking without overlap."""
    lo, hi = check_band(band)
    bits, grid = {}, {}
    for name, r in ranks.ranks.items():
        n = ranks.group_size(name)
        start, stop = int(n * lo / 100.0), int(n * hi / 100.0)
        m = (r >= start) & (r < stop)                                                 # [out/p, in/p] bool
        bits[name] = np.packbits(m.reshape(-1).numpy())
        grid[name] = tuple(r.shape)
    return PurificationMask(bits=bits, grid=grid, patch=ranks.patch, band=(lo, hi),
                            meta=dict(scope=ranks.scope, sublayers=ranks.sublayers))


# ----------------------------------------------------------------------------------------------------------------
# applying / removing a DSS-Expert in place
# ----------------------------------------------------------------------------------------------------------------
class AppliedMask:
    """Handle of a mask applied in place; :meth:`remove` writes the stored values back (bit-for-bit restore)."""

    def __init__(self, model: nn.Module, mask: PurificationMask):
        self.model, self.mask = model, mask
        mods = dict(model.named_modules())
        self._saved: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name in mask.bits:
                if name not in mods:
                    raise ValueError(f"mask names module {name!r} that the model does not have")
                w = mods[name].weight
                em = mask.element_mask(name).to(w.device)
                if em.shape != w.shape:
                    raise ValueError(f"mask for {name!r} has shape {tuple(em.shape)}, weight {tuple(w.shape)}")
                idx = em.reshape(-1).nonzero().squeeze(1)                               # flat positions [n]
                flat = w.view(-1)
                self._saved[name] = (idx, flat[idx].clone())                            # the purified values
                flat[idx] = 0                                                           # W_purified = DOWP(W, D) (Eq. 10)
        self.active = True

    def remove(self) -> None:
        if not self.active:
            return
        mods = dict(self.model.named_modules())
        with torch.no_grad():
            for name, (idx, vals) in self._saved.items():
                mods[name].weight.view(-1)[idx] = vals                                  # bit-for-bit restore
        self._saved = {}
        self.active = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def apply_mask(model: nn.Module, mask: PurificationMask) -> AppliedMask:
    """Zero the purified patches in place (no model copy); the returned handle restores them (also a context manager)."""
    return AppliedMask(model, mask)


class MaskSwitcher:
    """Holds one DSS-Expert mask per key (subdomain) and switches the live model between them (§3.2 inference:
    the routed subdomain's purified weights). ``set(None)`` restores the dense model. Switching to the key already
    applied is free, so callers should group requests by key."""

    def __init__(self, model: nn.Module, masks: dict):
        self.model, self.masks = model, dict(masks)
        self.current, self._handle = None, None
        self.n_switches = 0

    def set(self, key) -> None:
        if key == self.current:
            return
        if key is not None and key not in self.masks:
            raise ValueError(f"MaskSwitcher: no mask for key {key!r} (have {sorted(map(str, self.masks))})")
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if key is not None and self.masks[key] is not None:
            self._handle = apply_mask(self.model, self.masks[key])
        self.current = key
        self.n_switches += 1

    def close(self) -> None:
        self.set(None)


# ----------------------------------------------------------------------------------------------------------------
# §3.1 Eq. 2-3: subdomains by k-means over embedding-layer features
# ----------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def embedding_features(model: nn.Module, tok, texts: Sequence[str], max_length: int = 256,
                       batch_size: int = 64) -> np.ndarray:
    """F_T = Embedding(T) (§3.1): mean over the text's tokens of the LM's input-embedding vectors, [N, d] float32.
    Only the embedding lookup runs (no transformer layers), so this is cheap."""
    if len(texts) == 0:
        raise ValueError("embedding_features: empty text list")
    emb = model.get_input_embeddings()
    out = []
    for s in range(0, len(texts), batch_size):
        enc = tok(list(texts[s:s + batch_size]), return_tensors="pt", padding=True, truncation=True,
                  max_length=max_length)
        e = emb(enc["input_ids"].to(emb.weight.device)).float()                      # [B, S, d]
        m = enc["attention_mask"].to(e.device).unsqueeze(-1).float()                 # [B, S, 1]
        out.append(((e * m).sum(1) / m.sum(1).clamp_min(1)).cpu().numpy())          # [B, d]
    return np.concatenate(out).astype(np.float32)


def fit_subdomains(features: np.ndarray, k: int, seed: int = 0):
    """Eq. 2: S* = argmin_S Σ_i Σ_{F∈D_ji} ||F - μ_i||  (k-means, scikit-learn, n_init=10). Eq. 3 assignment of a new
    task is ``.predict`` (nearest centroid)."""
    from sklearn.cluster import KMeans
    if k < 1 or k > len(features):
        raise ValueError(f"k={k}: need 1 <= k <= number of reference examples ({len(features)})")
    return KMeans(n_clusters=k, n_init=10, random_state=seed).fit(features)


# ----------------------------------------------------------------------------------------------------------------
# §3.2 Eq. 7-8: multi-level trainable router
# ----------------------------------------------------------------------------------------------------------------
class MultiLevelRouter:
    """D_jk = R_sub,j(R_main(F_T)) (Eq. 7): a main-domain classifier, then one subdomain classifier per main domain,
    each a multinomial logistic regression (softmax + cross-entropy, Eq. 8) on embedding features (scikit-learn)."""

    def __init__(self, C: float = 1.0, seed: int = 0):
        self.C, self.seed = C, seed
        self.main = None
        self.sub: dict = {}

    def _clf(self):
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
        return make_pipeline(StandardScaler(), LogisticRegression(C=self.C, max_iter=2000, random_state=self.seed))

    def fit(self, features: np.ndarray, domains: Sequence, subdomains: Sequence) -> "MultiLevelRouter":
        domains, subdomains = np.asarray(domains), np.asarray(subdomains)
        if not (len(features) == len(domains) == len(subdomains)):
            raise ValueError(f"router.fit: {len(features)} features, {len(domains)} domains, "
                             f"{len(subdomains)} subdomain labels")
        if len(set(domains.tolist())) < 2:
            raise ValueError("router.fit: need at least two main domains")
        self.main = self._clf().fit(features, domains)                               # R_main
        for d in np.unique(domains):
            sel = domains == d
            labels = np.unique(subdomains[sel])
            self.sub[d] = labels[0] if len(labels) == 1 else self._clf().fit(features[sel], subdomains[sel])  # R_sub,j
        return self

    def predict(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.main is None:
            raise ValueError("router.predict before fit")
        dom = self.main.predict(features)
        sub = np.empty(len(features), dtype=object)
        for d in np.unique(dom):
            sel = dom == d
            s = self.sub[d]
            sub[sel] = s if not hasattr(s, "predict") else s.predict(features[sel])
        return dom, sub


# ----------------------------------------------------------------------------------------------------------------
# scoring (batched log-likelihoods and greedy generation)
# ----------------------------------------------------------------------------------------------------------------
def _continuation_request(tok, context: str, continuation: str, max_length: int) -> tuple[list[int], list[int]]:
    """This module's tokenisation of one pair (context and continuation apart, no special tokens, the pair
    left-truncated to ``max_length`` tokens, at least one context token kept) as a scorer request."""
    ci = tok(context, add_special_tokens=False)["input_ids"]
    xi = tok(continuation, add_special_tokens=False)["input_ids"]
    if len(xi) == 0:
        raise ValueError(f"empty continuation {continuation!r}")
    ids = (ci + xi)[-max_length:]
    n = min(len(xi), len(ids) - 1)
    return ids[:-n], ids[-n:]


def continuation_logprobs(model: nn.Module, tok, contexts: Sequence[str], continuations: Sequence[str],
                          batch_size: int = 16, max_length: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """Σ log p(continuation tokens | context) per pair and the continuation's token count (lm-eval's loglikelihood
    request), scored by ``moelab.suite.scorer`` (issue 17: one scorer for every evaluation; batched by length,
    continuation-only logits, shared contexts run once)."""
    if len(contexts) != len(continuations):
        raise ValueError(f"{len(contexts)} contexts vs {len(continuations)} continuations")
    reqs = [_continuation_request(tok, c, x, max_length) for c, x in zip(contexts, continuations)]
    res = scorer.loglikelihood_tokens(model, reqs, batch_size=batch_size)
    return np.array([lp for lp, _ in res], dtype=float), np.array([len(x) for _, x in reqs])


def _choice_requests(tok, prompt: str, choices: Sequence[str], max_length: int) -> list[tuple[list[int], list[int]]]:
    """One scorer request per choice: the prompt keeps its last ``max_length - longest choice`` tokens."""
    ci = tok(prompt, add_special_tokens=False)["input_ids"]
    xs = [tok(c, add_special_tokens=False)["input_ids"] for c in choices]
    if any(len(x) == 0 for x in xs):
        raise ValueError(f"empty choice among {list(choices)!r}")
    ci = ci[-(max_length - max(map(len, xs))):]
    return [(ci, x) for x in xs]


def choice_logprobs(model: nn.Module, tok, prompt: str, choices: Sequence[str], max_length: int = 512) -> np.ndarray:
    """Σ log p(choice tokens | prompt) for each choice; the shared prompt runs once (``moelab.suite.scorer`` repeats
    its KV cache over the choices)."""
    res = scorer.loglikelihood_tokens(model, _choice_requests(tok, prompt, choices, max_length))
    return np.array([lp for lp, _ in res], dtype=float)


def choice_accuracy(model: nn.Module, tok, items: Sequence[dict], batch_size: int = 16,
                    max_length: int = 512) -> np.ndarray:
    """Per-item accuracy (0/1) of multiple-choice items ``dict(prompt, choices: list[str], label: int)``: the choice
    with the highest summed log-likelihood wins (lm-eval's ``acc``; same prompt + " " + choice format). All items go
    to ``moelab.suite.scorer`` in one call (each prompt runs once for all its choices)."""
    reqs, spans = [], []
    for k, it in enumerate(items):
        if not it.get("choices"):
            raise ValueError(f"item {k} has no choices")
        r = _choice_requests(tok, it["prompt"], it["choices"], max_length)
        spans.append((len(reqs), len(reqs) + len(r)))
        reqs += r
    lp = np.array([x for x, _ in scorer.loglikelihood_tokens(model, reqs, batch_size=batch_size)], dtype=float)
    return np.array([float(int(np.argmax(lp[a:b])) == int(it["label"])) for (a, b), it in zip(spans, items)])


def answer_logprob(model: nn.Module, tok, items: Sequence[dict], batch_size: int = 16,
                   max_length: int = 512) -> np.ndarray:
    """Per-item mean log-likelihood per token of the reference answer given the prompt (``dict(prompt, answer)``):
    the selection score where the reference data has no accuracy (code without tests). Higher is better."""
    lp, n = continuation_logprobs(model, tok, [it["prompt"] for it in items], [it["answer"] for it in items],
                                  batch_size, max_length)
    return lp / np.maximum(n, 1)


@torch.no_grad()
def generate_completions(model: nn.Module, tok, prompts: Sequence[str], max_new_tokens: int = 128,
                         batch_size: int = 8, stop: Sequence[str] = ("\ndef ", "\nclass ", "\nif __name__",
                                                                     "\nprint(", "\n#", "\n```"),
                         do_sample: bool = False, temperature: float = 0.8) -> list[str]:
    """Greedy (or sampled) completions in left-padded batches, cut at the first stop sequence (HumanEval's stops)."""
    device = next(model.parameters()).device
    old_side = tok.padding_side
    tok.padding_side = "left"
    outs = [""] * len(prompts)
    try:
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            enc = tok([prompts[i] for i in idx], return_tensors="pt", padding=True).to(device)
            kw = dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0) if do_sample else \
                dict(do_sample=False, temperature=None, top_p=None, top_k=None)
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, **kw,
                                 pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
            for r, i in enumerate(idx):
                text = tok.decode(gen[r, enc["input_ids"].shape[1]:], skip_special_tokens=True)
                cut = min([text.find(st) for st in stop if st in text] + [len(text)])
                outs[i] = text[:cut]
    finally:
        tok.padding_side = old_side
    return outs


# ----------------------------------------------------------------------------------------------------------------
# Eq. 6: band sweep per subdomain and the appendix table
# ----------------------------------------------------------------------------------------------------------------
ScoreFn = Callable[[nn.Module, Sequence[dict]], np.ndarray]


def band_sweep(model: nn.Module, ranks_by_sub: dict, items_by_sub: dict, score_fn: ScoreFn,
               bands: Sequence[tuple[float, float]], include_base: bool = True) -> "pd.DataFrame":
    """θ* = argmax_θr acc(Output_{MODEL-θr}) (Eq. 6) evaluated for every subdomain and band: apply the band's mask,
    score the subdomain's items, restore. Returns per-item scores: columns cluster, band, item, score (band "base" =
    dense model). A subdomain with no items -> ValueError."""
    import pandas as pd
    rows = []
    bar = progress.bar(total=len(ranks_by_sub) * (len(bands) + include_base), desc="band sweep", unit="band")
    for sub, ranks in ranks_by_sub.items():
        items = items_by_sub.get(sub, [])
        if len(items) == 0:
            raise ValueError(f"subdomain {sub!r} has no reference examples")
        if include_base:
            for j, sc in enumerate(score_fn(model, items)):
                rows.append((sub, "base", j, float(sc)))
            bar.update(1)
        for band in bands:
            with apply_mask(model, band_mask(ranks, band)):
                sc = score_fn(model, items)
            rows += [(sub, band_label(band), j, float(v)) for j, v in enumerate(sc)]
            bar.update(1)
    bar.close()
    return pd.DataFrame(rows, columns=["cluster", "band", "item", "score"])


def select_bands(sweep: "pd.DataFrame", bands: Sequence[tuple[float, float]]) -> dict:
    """θ* per cluster: the band with the highest mean reference score (Eq. 6; ties -> the first band listed)."""
    labels = [band_label(b) for b in bands]
    means = sweep[sweep.band.isin(labels)].groupby(["cluster", "band"]).score.mean()
    best = {}
    for c in sweep.cluster.unique():
        vals = [means.get((c, l), -np.inf) for l in labels]
        best[c] = tuple(bands[int(np.argmax(vals))])
    return best


def sweep_table(sweep: "pd.DataFrame", scale: float = 100.0) -> "pd.DataFrame":
    """Appendix Tables 6-10 layout: cluster, samples, one column per band (mean score x scale), max, share (%)."""
    t = sweep.groupby(["cluster", "band"], sort=False).score.mean().unstack("band") * scale
    cols = [c for c in sweep.band.drop_duplicates().tolist()]
    t = t[cols]
    samples = sweep[sweep.band == cols[0]].groupby("cluster", sort=False).size()
    band_cols = [c for c in cols if c != "base"]
    t.insert(0, "samples", samples.reindex(t.index).values)
    t["max"] = t[band_cols].max(axis=1)
    t["best_band"] = t[band_cols].idxmax(axis=1)
    t["share"] = 100.0 * t["samples"] / t["samples"].sum()
    return t.reset_index()


def load_local_model(path, dtype=torch.float32):
    """Paper profile (LLaMA-2-7b-chat, LLaMA-2-13b-chat, Gemma-7b, Gemma-2-9b): load a Hugging Face folder from a local
    path. ``None`` or a missing folder -> ``moelab.assets.MissingAsset`` naming the path."""
    from pathlib import Path

    from moelab.assets import MissingAsset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if path is None or not Path(path).is_dir() or not (Path(path) / "config.json").exists():
        raise MissingAsset("Free-MoE paper model", f"no local Hugging Face folder at {path!r}",
                           paper_input_hint("05", "MODEL_PATH", "a local Hugging Face folder of Llama-2-7b-chat, "
                                            "Llama-2-13b-chat, Gemma-7b or Gemma-2-9b"))
    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    target_linears(model)                                                            # fail early on foreign layouts
    return model, tok


# ----------------------------------------------------------------------------------------------------------------
# pipeline pieces used by notebook 05 (domains -> subdomains -> calibration -> band sweep -> routed inference)
# ----------------------------------------------------------------------------------------------------------------
def score_items(model: nn.Module, tok, items: Sequence[dict], batch_size: int = 16) -> np.ndarray:
    """Per-item score: accuracy (0/1) for multiple-choice items (``choices`` present), else the reference answer's mean
    log-likelihood per token (used where the reference data has no accuracy, e.g. code without tests). Mixed lists
    are split by kind and scored in two batched passes."""
    out = np.zeros(len(items))
    mc = [i for i, it in enumerate(items) if "choices" in it]
    free = [i for i, it in enumerate(items) if "choices" not in it]
    if mc:
        out[mc] = choice_accuracy(model, tok, [items[i] for i in mc], batch_size)
    if free:
        out[free] = answer_logprob(model, tok, [items[i] for i in free], batch_size)
    return out


def calibration_text(item: dict) -> str:
    """Prompt plus its reference answer (gold choice for multiple choice): the text DOWP calibrates on."""
    ans = item["choices"][item["label"]] if "choices" in item else item["answer"]
    return item["prompt"] + ans


def assign_subdomains(model: nn.Module, tok, reference: dict, test: dict, k: int, seed: int = 0,
                      max_length: int = 256) -> dict:
    """§3.1 per main domain: k-means (Eq. 2) on the embedding-layer features of the reference prompts; every reference
    and test item gets the nearest centroid (Eq. 3). Returns dict(domain -> dict(kmeans, ref_labels, test_labels,
    ref_features, test_features)); subdomain names are ``f"{domain}_{i}"``."""
    out = {}
    for dom, items in reference.items():
        if len(items) == 0:
            raise ValueError(f"main domain {dom!r} has no reference examples")
        fr = embedding_features(model, tok, [it["prompt"] for it in items], max_length)
        ft = embedding_features(model, tok, [it["prompt"] for it in test[dom]], max_length) if test.get(dom) else \
            np.zeros((0, fr.shape[1]), np.float32)
        km = fit_subdomains(fr, min(k, len(items)), seed)
        name = lambda a: np.array([f"{dom}_{i}" for i in a], dtype=object)
        out[dom] = dict(kmeans=km, ref_labels=name(km.labels_), test_labels=name(km.predict(ft)) if len(ft) else
                        np.array([], dtype=object), ref_features=fr, test_features=ft)
    return out


def subdomain_norms(model: nn.Module, tok, texts: Sequence[str], sublayers: str = "both", max_tokens: int = 4096,
                    batch_size: int = 8, max_length: int = 256, cache_config: dict | None = None) -> InputNorms:
    """Calibration statistics for one subdomain's reference texts, cached with ``moelab.cache.memo`` when
    ``cache_config`` (a JSON-able description of model + texts) is given."""
    if len(texts) == 0:
        raise ValueError("subdomain_norms: subdomain with no reference texts")

    def compute():
        return collect_input_norms(model, tokenize_batches(tok, texts, batch_size, max_length), sublayers, max_tokens)
    if cache_config is None:
        return compute()
    from moelab import cache
    cfg = dict(cache_config, sublayers=sublayers, max_tokens=max_tokens, max_length=max_length,
               texts=cache.key({"t": list(texts)}))
    return cache.memo("free_moe_norms", cfg, compute)


def restrict_mask(mask: PurificationMask, sublayers: str) -> PurificationMask:
    """The same DSS-Expert limited to the MLP or the self-attention projections (Table 3): ranks are per matrix, so
    restricting a mask equals recomputing it on the sublayer alone."""
    if sublayers not in SUBLAYERS:
        raise ValueError(f"sublayers={sublayers!r}: expected one of {SUBLAYERS}")
    if sublayers == "both":
        return mask
    keep = [n for n in mask.bits if n.endswith(SUBLAYER_PROJECTIONS[sublayers])]
    if not keep:
        raise ValueError(f"mask has no {sublayers} matrices")
    return PurificationMask(bits={n: mask.bits[n] for n in keep}, grid={n: mask.grid[n] for n in keep},
                            patch=mask.patch, band=mask.band, meta=dict(mask.meta, sublayers=sublayers))


def routed_scores(model: nn.Module, tok, items: Sequence[dict], keys: Sequence, masks: dict,
                  batch_size: int = 16, score_fn: ScoreFn | None = None) -> np.ndarray:
    """§3.2 inference: every item is scored with the DSS-Expert of its key (subdomain chosen by Eq. 3 or by the
    router); items are grouped by key so each mask is applied once. ``masks[key] = None`` means the dense model."""
    if len(items) != len(keys):
        raise ValueError(f"{len(items)} items vs {len(keys)} routing keys")
    score_fn = score_fn or (lambda m, it: score_items(m, tok, it, batch_size))
    parts: dict = {}
    sw = MaskSwitcher(model, masks)
    try:
        keys = np.asarray(keys, dtype=object)
        for key in dict.fromkeys(keys.tolist()):
            idx = np.flatnonzero(keys == key)
            sw.set(key)
            parts[key] = (idx, np.asarray(score_fn(model, [items[i] for i in idx])))
    finally:
        sw.close()
    if not parts:
        return np.zeros(0)
    first = next(iter(parts.values()))[1]
    out = np.zeros((len(items),) + first.shape[1:])
    for idx, sc in parts.values():
        out[idx] = sc
    return out


def quantisation_grid_stats(model: nn.Module, block: int = 32, sublayers: str = "both",
                            max_blocks: int | None = 512) -> "pd.DataFrame":
    """How the 4-bit GGUF origin shows in the dequantised weights: per target matrix, the mean number of distinct
    values per block of ``block`` consecutive weights (Q4 blocks hold at most 16), the share of exact zeros, and the
    share of weights whose |w| is below half the block's grid step (these all rank as "small" only up to the grid).
    ``max_blocks``: statistics on the first that many blocks of each matrix (None = all)."""
    import pandas as pd
    rows = []
    for name, lin in target_linears(model, sublayers).items():
        w = lin.weight.detach().float().reshape(-1, block)[:max_blocks]              # [blocks, 32]
        s = torch.sort(w, dim=1).values
        distinct = 1 + (s[:, 1:] != s[:, :-1]).sum(1).float()                        # distinct values per block
        d = (s[:, 1:] - s[:, :-1])
        step = torch.where(d > 0, d, torch.full_like(d, float("inf"))).min(1).values  # smallest grid step per block
        small = (w.abs() < step[:, None] / 2).float().mean()
        rows.append(dict(matrix=name, distinct_per_block=float(distinct.mean()), max_distinct=int(distinct.max()),
                         zero_share=float((w == 0).float().mean()), below_half_step=float(small)))
    return pd.DataFrame(rows)


def humaneval_score_fn(tok, n: int = 1, ks: Sequence[int] = (1,), temperature: float = 0.8, max_new_tokens: int = 128,
                       batch_size: int = 8, seed: int = 0) -> ScoreFn:
    """Score function for HumanEval problems (``dict(prompt, test, entry_point)``): ``n`` completions per problem
    (greedy if n == 1, else sampled at ``temperature``), each run in ``moelab.suite.sandbox``; returns per-problem
    unbiased pass@k (Chen et al. 2021) for each k in ``ks`` as an array [problems, len(ks)]. The paper's Eq. 11,
    1 - Π_i (1 - P_i), is not this estimator; the standard one is used."""
    from moelab.suite import sandbox
    if n < max(ks):
        raise ValueError(f"n={n} samples cannot estimate pass@{max(ks)}")

    def fn(model, items):
        torch.manual_seed(seed)
        prompts = [it["prompt"] for it in items for _ in range(n)]
        comps = generate_completions(model, tok, prompts, max_new_tokens, batch_size,
                                     do_sample=n > 1, temperature=temperature)
        out = np.zeros((len(items), len(ks)))
        for j, it in enumerate(items):
            c = sum(sandbox.run_code(sandbox.humaneval_program(it, comp), timeout=5, memory_mb=512).passed
                    for comp in comps[j * n:(j + 1) * n])
            out[j] = [sandbox.pass_at_k(n, int(c), k) for k in ks]
        return out
    return fn


def improvement_table(scores: "pd.DataFrame", methods: Sequence[str], base: str = "BASELINE",
                      scale: dict | None = None) -> "pd.DataFrame":
    """Table 1 layout from per-item scores (columns model, method, task, item, score): per model the rows
    BASELINE, then each method and its improvement over BASELINE (mean x scale[task], default 100)."""
    import pandas as pd
    scale = scale or {}
    m = scores.groupby(["model", "method", "task"], sort=False).score.mean().unstack("task")
    for t in m.columns:
        m[t] = m[t] * scale.get(t, 100.0)
    rows = []
    for model in scores.model.drop_duplicates():
        b = m.loc[(model, base)]
        rows.append(dict(model=model, row=base, **b.to_dict()))
        for meth in methods:
            v = m.loc[(model, meth)]
            rows.append(dict(model=model, row=meth, **v.to_dict()))
            rows.append(dict(model=model, row="Improvement", **(v - b).to_dict()))
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------------------------
# data: main domains from the suite (reference = validation splits, test = the lm-eval evaluation pools)
# ----------------------------------------------------------------------------------------------------------------
MATH_MC_LM_TASK = "moelab_math_mc"


def _mc_item(it: dict, domain: str, task: str) -> dict:
    return dict(id=it["id"], domain=domain, task=task, prompt=it["prompt"],
                choices=[" " + c for c in it["choices"]], label=int(it["gold"]))


def _free_item(iid, domain: str, task: str, prompt: str, answer: str) -> dict:
    return dict(id=iid, domain=domain, task=task, prompt=prompt, answer=answer)


def load_domains(general_tasks: Sequence[str], n_ref_per_task: int, n_test_per_task: int, n_train_per_task: int,
                 n_code_ref: int, n_code_test: int, n_code_train: int, n_humaneval: int,
                 instruct_profile: str = "default") -> dict:
    """The three main domains of §4.1 built from ``moelab.suite`` (§3.1 D = {D_A, D_B, ...}):

    - ``general`` (knowledge & reasoning): BIG-bench multiple-choice lm tasks ``general_tasks`` (``moelab_bb_*``);
    - ``maths``: ``moelab_math_mc`` (elementary_math_qa, five options) plus GSM-style held-out templates
      (``moelab_nll_maths``, test only, reference-answer likelihood);
    - ``code``: stdlib function-writing records of ``suite.instruct`` (reference-answer likelihood: no tests) and
      HumanEval (``moelab_nll_code`` likelihood of the canonical solution; ``moelab_humaneval`` pass@k).

    Reference = the suite's validation split (selection), test = the first ``n_test_per_task`` items of each lm task's
    evaluation pool (``suite.lmeval.task_docs``), train = training split items (router only).
    Returns dict(reference, test, train) -> {domain: [items]}, plus ``humaneval`` (problems).
    """
    from moelab.suite import instruct, lmeval
    ref, test, train = ({d: [] for d in ("general", "maths", "code")} for _ in range(3))
    mc = [(t, "general") for t in general_tasks] + [(MATH_MC_LM_TASK, "maths")]
    for lm_task, dom in mc:
        if lm_task not in lmeval.MC_TASKS and lm_task.removeprefix("moelab_") not in lmeval.MC_TASKS:
            raise ValueError(f"{lm_task!r} is not a moelab multiple-choice lm task ({sorted(lmeval.MC_TASKS)})")
        src = lmeval.MC_TASKS[lm_task.removeprefix("moelab_")]
        sp = instruct.task_splits(src)
        ref[dom] += [_mc_item(it, dom, lm_task) for it in sp["validation"][:n_ref_per_task]]
        train[dom] += [_mc_item(it, dom, lm_task) for it in sp["train"][:n_train_per_task]]
        test[dom] += [_mc_item(it, dom, lm_task) for it in lmeval.task_docs(lm_task.removeprefix("moelab_"))
                      [:n_test_per_task]]
    for d in lmeval.task_docs("nll_maths")[:n_test_per_task]:
        test["maths"].append(_free_item(d["id"], "maths", "moelab_nll_maths", d["context"], d["continuation"]))
    for d in lmeval.task_docs("nll_code")[:n_code_test]:
        test["code"].append(_free_item(d["id"], "code", "moelab_nll_code", d["context"], d["continuation"]))
    mix = instruct.build(instruct_profile)
    for split, store, n in (("validation", ref, n_code_ref), ("train", train, n_code_train)):
        recs = [r for r in mix[split] if r["domain"] == "code"][:n]
        store["code"] += [_free_item(r["id"], "code", "stdlib_code", r["instruction"] + "\n", r["answer"])
                          for r in recs]
    he = [dict(d, domain="code", task="moelab_humaneval") for d in lmeval.task_docs("humaneval")[:n_humaneval]]
    for dom in ref:
        if not ref[dom]:
            raise ValueError(f"main domain {dom!r} has no reference examples")
    return dict(reference=ref, test=test, train=train, humaneval=he)


# ----------------------------------------------------------------------------------------------------------------
# the whole per-model pipeline (notebook 05 runs it for SmolLM2, and for Gemma-3 in `full`)
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class DowpResult:
    """Per-subdomain band sweep on reference data (Eq. 6), the selected bands θ* and the DSS-Expert masks."""
    sweep: "pd.DataFrame"                    # domain, cluster, band, item, score (reference data)
    selected: dict                           # subdomain -> (θmin, θmax)
    masks: dict                              # subdomain -> {"selected" | "0-5%" | "ratio<r>" | ...: PurificationMask}


def dowp_select(model: nn.Module, tok, ref_by_sub: dict, bands: Sequence[tuple[float, float]], patch: int = 1,
                sublayers: str = "both", scope: str = "row", calib_tokens: int = 4096, ratios: Sequence[float] = (),
                extra_bands: Sequence[tuple[float, float]] = (WANDA_BAND,), batch_size: int = 16,
                cache_config: dict | None = None, domain_of: Callable[[str], str] = lambda s: s.rsplit("_", 1)[0],
                log: Callable[[str], None] | None = None) -> DowpResult:
    """DOWP (§3.1, Algorithm 1) for each subdomain D_jk: calibrate on its reference texts (streamed ||X_n||), rank
    the patches (Eq. 4), sweep the bands on its reference items (Eq. 5-6), keep θ* = the best band and build the
    masks: ``selected`` (θ*), each ``extra_bands`` entry (the Wanda-like 0-5% by default), and ``ratio<r>`` =
    [θ*min, θ*min + r] for each purification ratio r (Table 2). Ranks are dropped after each subdomain (memory)."""
    import pandas as pd
    frames, selected, masks = [], {}, {}
    for sub, items in progress.bar(list(ref_by_sub.items()), desc="DOWP subdomains", unit="subdomain"):
        if len(items) == 0:
            raise ValueError(f"subdomain {sub!r} has no reference examples")
        cc = None if cache_config is None else dict(cache_config, subdomain=sub)
        norms = subdomain_norms(model, tok, [calibration_text(it) for it in items], sublayers, calib_tokens,
                                cache_config=cc)
        ranks = patch_ranks(model, norms, patch, sublayers, scope)
        sw = band_sweep(model, {sub: ranks}, {sub: items}, lambda m, it: score_items(m, tok, it, batch_size), bands)
        sw.insert(0, "domain", domain_of(sub))
        sw["metric"] = ["acc" if "choices" in items[j] else "loglik" for j in sw["item"]]
        frames.append(sw)
        best = select_bands(sw, bands)[sub]
        selected[sub] = best
        masks[sub] = {"selected": band_mask(ranks, best)}
        for b in extra_bands:
            masks[sub][band_label(b)] = band_mask(ranks, b)
        for r in ratios:
            masks[sub][f"ratio{r:g}"] = band_mask(ranks, (best[0], min(100.0, best[0] + r)))
        del ranks
        if log:
            log(f"{sub}: {len(items)} reference items, θ* = {band_label(best)}")
    return DowpResult(sweep=pd.concat(frames, ignore_index=True), selected=selected, masks=masks)


def masks_for(dowp: DowpResult, which: str) -> dict:
    """{subdomain: mask} for one kind of mask ("selected", "0-5%", "ratio3", ...)."""
    return {s: m[which] for s, m in dowp.masks.items()}


def evaluate_methods(model: nn.Module, tok, items: Sequence[dict], routes: dict, batch_size: int = 16,
                     score_fn: ScoreFn | None = None) -> "pd.DataFrame":
    """Score test items under several methods: ``routes[method] = (keys, masks)`` with one routing key per item
    (keys None -> dense model). Returns per-item scores: method, task, id, score (column per extra score dim)."""
    import pandas as pd
    frames = []
    for method, (keys, masks) in progress.bar(list(routes.items()), desc="methods on test items", unit="method"):
        keys = [None] * len(items) if keys is None else list(keys)
        sc = routed_scores(model, tok, items, keys, masks if masks is not None else {}, batch_size, score_fn)
        df = pd.DataFrame(dict(method=method, task=[it["task"] for it in items], id=[it["id"] for it in items]))
        if sc.ndim == 1:
            df["score"] = sc
        else:
            for j in range(sc.shape[1]):
                df[f"score{j}"] = sc[:, j]
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def eq3_keys(model: nn.Module, tok, items: Sequence[dict], subdomains: dict, max_length: int = 256) -> np.ndarray:
    """Oracle main domain (the item's own) + Eq. 3 nearest centroid: the DOWP setting of Table 1."""
    keys = np.empty(len(items), dtype=object)
    for dom, sd in subdomains.items():
        idx = [i for i, it in enumerate(items) if it["domain"] == dom]
        if idx:
            f = embedding_features(model, tok, [items[i]["prompt"] for i in idx], max_length)
            keys[idx] = [f"{dom}_{c}" for c in sd["kmeans"].predict(f)]
    if any(k is None for k in keys):
        raise ValueError("eq3_keys: some items belong to no main domain with subdomains")
    return keys


def fit_router(model: nn.Module, tok, train_by_dom: dict, subdomains: dict, seed: int = 0,
               max_length: int = 256) -> MultiLevelRouter:
    """Train the multi-level router (Eq. 7-8) on the training split: main-domain labels are the items' domains,
    subdomain labels their Eq. 3 nearest centroid of that domain's k-means (fit on reference data)."""
    items = [it for d in subdomains for it in train_by_dom.get(d, [])]
    if not items:
        raise ValueError("fit_router: no training items")
    F = embedding_features(model, tok, [it["prompt"] for it in items], max_length)
    dom = np.array([it["domain"] for it in items], dtype=object)
    sub = np.empty(len(items), dtype=object)
    for d, sd in subdomains.items():
        sel = dom == d
        if sel.any():
            sub[sel] = [f"{d}_{c}" for c in sd["kmeans"].predict(F[sel])]
    return MultiLevelRouter(seed=seed).fit(F, dom.astype(str), sub.astype(str))


def route_items(router: MultiLevelRouter, model: nn.Module, tok, items: Sequence[dict], max_length: int = 256):
    """Router predictions (main domain, subdomain) for test items (§3.2 inference, Eq. 9)."""
    F = embedding_features(model, tok, [it["prompt"] for it in items], max_length)
    return router.predict(F)


def reference_gains(dowp: DowpResult) -> "pd.DataFrame":
    """Per reference item: score of the dense model and of the selected band θ* (chosen on these same items, hence
    optimistic). Columns domain, cluster, item, metric ("acc" | "loglik"), base, selected."""
    sw = dowp.sweep
    rows = []
    for sub, band in dowp.selected.items():
        s = sw[sw.cluster == sub]
        b = s[s.band == "base"].set_index("item").score
        v = s[s.band == band_label(band)].set_index("item").score
        met = s[s.band == "base"].set_index("item").metric
        rows.append(pd_frame(domain=s.domain.iloc[0], cluster=sub, item=b.index.values, metric=met.values,
                             base=b.values, selected=v.reindex(b.index).values))
    import pandas as pd
    return pd.concat(rows, ignore_index=True)


def pd_frame(**cols):
    import pandas as pd
    return pd.DataFrame(cols)


def choose_general_tasks(model_name: str, candidates: Sequence[str], max_tasks: int) -> tuple[list[str], str]:
    """General-domain lm tasks: the candidates the suite's scorecard marks usable (above chance) for ``model_name``,
    in candidate order; without a scorecard, the first candidates (the returned note says which happened)."""
    try:
        from moelab.suite import scorecard
        if not scorecard.CSV.exists():      # never trigger the (hour-long) scorecard build from here
            return list(candidates[:max_tasks]), "no committed scorecard yet; fixed candidate list used"
        usable = set(scorecard.usable_tasks(model_name))
    except (ImportError, ValueError) as e:  # scorecard module absent or model not in it: say so in the notebook
        return list(candidates[:max_tasks]), f"scorecard unusable ({e}); fixed candidate list used"
    chosen = [t for t in candidates if t in usable][:max_tasks]
    if not chosen:
        return list(candidates[:max_tasks]), "scorecard marks none of the candidates usable; fixed list used"
    return chosen, f"scorecard: {len(chosen)} of {len(candidates)} candidates above chance"
