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
- Scoring helpers used by the sweeps (written here because the sweeps re-score the same items dozens of times and need
  one batched forward per item set): :func:`continuation_logprobs`, :func:`choice_accuracy`, :func:`answer_logprob`,
  :func:`generate_completions`.

Reading of "purify" implemented here (the paper is inconsistent, see ``../shared/notes/reference-facts.md``):
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
                self._saved[name] = w[em].clone()                                     # the purified values
                w[em] = 0                                                              # W_purified = DOWP(W, D)  (Eq. 10)
        self.active = True

    def remove(self) -> None:
        if not self.active:
            return
        mods = dict(self.model.named_modules())
        with torch.no_grad():
            for name, vals in self._saved.items():
                w = mods[name].weight
                w[self.mask.element_mask(name).to(w.device)] = vals
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
@torch.no_grad()
def continuation_logprobs(model: nn.Module, tok, contexts: Sequence[str], continuations: Sequence[str],
                          batch_size: int = 16, max_length: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """Σ log p(continuation tokens | context) per pair and the continuation's token count (lm-eval's loglikelihood
    request, written here so a band sweep re-scores its items with one batched forward per set)."""
    if len(contexts) != len(continuations):
        raise ValueError(f"{len(contexts)} contexts vs {len(continuations)} continuations")
    device = next(model.parameters()).device
    seqs = []
    for c, x in zip(contexts, continuations):
        ci = tok(c, add_special_tokens=False)["input_ids"]
        xi = tok(x, add_special_tokens=False)["input_ids"]
        if len(xi) == 0:
            raise ValueError(f"empty continuation {x!r}")
        ids = (ci + xi)[-max_length:]
        seqs.append((ids, min(len(xi), len(ids) - 1)))
    logp = np.zeros(len(seqs))
    ntok = np.array([n for _, n in seqs])
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        L = max(len(seqs[i][0]) for i in idx)
        ids = torch.full((len(idx), L), pad, dtype=torch.long)
        am = torch.zeros((len(idx), L), dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, :len(seqs[i][0])] = torch.tensor(seqs[i][0])
            am[r, :len(seqs[i][0])] = 1
        lp = torch.log_softmax(model(input_ids=ids.to(device), attention_mask=am.to(device)).logits.float(), -1)
        for r, i in enumerate(idx):
            toks, n = seqs[i]
            T = len(toks)
            tgt = torch.tensor(toks[T - n:], device=lp.device)                        # continuation tokens
            logp[i] = lp[r, T - n - 1:T - 1].gather(1, tgt[:, None]).sum().item()     # Σ log p(x_t | x_<t)
    return logp, ntok


def choice_accuracy(model: nn.Module, tok, items: Sequence[dict], batch_size: int = 16,
                    max_length: int = 512) -> np.ndarray:
    """Per-item accuracy (0/1) of multiple-choice items ``dict(prompt, choices: list[str], label: int)``: the choice
    with the highest summed log-likelihood wins (lm-eval's ``acc``)."""
    ctx, cont, owner = [], [], []
    for k, it in enumerate(items):
        if not it.get("choices"):
            raise ValueError(f"item {k} has no choices")
        for ch in it["choices"]:
            ctx.append(it["prompt"])
            cont.append(ch)
            owner.append(k)
    if not ctx:
        return np.zeros(0)
    lp, _ = continuation_logprobs(model, tok, ctx, cont, batch_size, max_length)
    owner = np.array(owner)
    acc = np.zeros(len(items))
    for k, it in enumerate(items):
        acc[k] = float(int(np.argmax(lp[owner == k])) == int(it["label"]))
    return acc


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
                                                                     "\nprint(", "\n#")) -> list[str]:
    """Greedy completions (left-padded batches), cut at the first stop sequence (HumanEval's usual stops)."""
    device = next(model.parameters()).device
    old_side = tok.padding_side
    tok.padding_side = "left"
    outs = [""] * len(prompts)
    try:
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            enc = tok([prompts[i] for i in idx], return_tensors="pt", padding=True).to(device)
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
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
    for sub, ranks in ranks_by_sub.items():
        items = items_by_sub.get(sub, [])
        if len(items) == 0:
            raise ValueError(f"subdomain {sub!r} has no reference examples")
        if include_base:
            for j, sc in enumerate(score_fn(model, items)):
                rows.append((sub, "base", j, float(sc)))
        for band in bands:
            with apply_mask(model, band_mask(ranks, band)):
                sc = score_fn(model, items)
            rows += [(sub, band_label(band), j, float(v)) for j, v in enumerate(sc)]
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
        raise MissingAsset(f"Free-MoE paper model not found at {path!r}: pass MODEL_PATH=<local HF folder of "
                           "Llama-2-7b-chat / Gemma-7b / ...> (these weights cannot be downloaded here)")
    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    target_linears(model)                                                            # fail early on foreign layouts
    return model, tok


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021): 1 - C(n-c, k)/C(n, k) (the paper's Eq. 11, 1 - Π(1 - P_i), is a
    different quantity: it treats per-sample success probabilities as independent and known)."""
    if not (0 <= c <= n) or k < 1 or k > n:
        raise ValueError(f"pass_at_k(n={n}, c={c}, k={k}): need 0 <= c <= n and 1 <= k <= n")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))
