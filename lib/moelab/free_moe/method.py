"""Free-MoE's method (paper 004, "Free-MoE: Tuning-free Mixture-of-Experts purifying LLMs to thrive across any
field", §3; notebook ``notebooks/05_free_moe.py``): DOWP's patch importance, ranks, bands and masks, applying a
DSS-Expert in place, the k-means subdomains and the multi-level router. No I/O, no caching, no scoring.

Paper section -> function:

- §3.1 clustering-based classification, Eq. 2-3: :func:`embedding_features`, :func:`fit_subdomains`.
- §3.1 metric on patches, Eq. 4: calibration statistics :func:`collect_input_norms` (forward hooks on every target
  ``nn.Linear``, streamed: only the per-input-column sum of squares is kept), :func:`patch_importance`.
- §3.1 DSS-Expert formation, Eq. 5: :func:`patch_ranks`, :func:`band_boundaries`, :func:`band_mask`
  (-> :class:`PurificationMask`, packed bits per matrix), :func:`purified_share`, :func:`apply_mask` /
  :class:`MaskSwitcher` (in place; the zeroed values are stored so removal restores the weights bit for bit),
  :func:`restrict_mask` (Table 3's sublayers).
- §3.2 multi-level trainable router, Eq. 7-8: :class:`MultiLevelRouter`.

Readings of "purify" (the paper is inconsistent, see ``docs/reference-facts.md``). Default: purifying a band
``[θmin, θmax)`` (percentiles of the ascending importance ranking, compared within each output row of patches as in
Wanda, or within the whole matrix with ``scope="matrix"``) **sets those patches' weights to zero**
(``mode="remove"``); ``mode="keep"`` zeros every patch *outside* the band instead. Band sizes: ``counts="exact"``
(default) spreads the rounding over the rows so every patch size purifies the same share of weights (within one
patch per matrix); ``counts="floor"`` is Wanda's per-row ``int(n·s)``, under which ``[0, 5)`` at 1x1 is exactly
Wanda at 5% sparsity. Patch sizes that do not divide a matrix are rejected (ValueError), not padded: padding would
give edge patches fewer elements and so systematically lower importance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch
from sklearn.cluster import KMeans
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from torch import nn

__all__ = ["SUBLAYER_PROJECTIONS", "SUBLAYERS", "PATCH_SIZES", "APPENDIX_BANDS", "WANDA_BAND", "SCOPES", "MODES",
           "COUNTS", "target_linears", "InputNorms", "collect_input_norms", "patch_importance", "PatchRanks",
           "patch_ranks", "check_band", "band_label", "PurificationMask", "band_boundaries", "band_mask",
           "purified_share", "AppliedMask", "apply_mask", "MaskSwitcher", "restrict_mask", "embedding_features",
           "fit_subdomains", "MultiLevelRouter"]

SUBLAYER_PROJECTIONS = {
    "mlp": ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
    "attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"),
}
SUBLAYERS = ("mlp", "attn", "both")
PATCH_SIZES = (1, 2, 4, 16)
APPENDIX_BANDS = tuple((float(lo), float(lo + 5)) for lo in range(50, 100, 5))   # Tables 6-10: 50-55% ... 95-100%
WANDA_BAND = (0.0, 5.0)
SCOPES = ("row", "matrix")              # comparison group of the ranking: an output row of patches, or the matrix
MODES = ("remove", "keep")              # purify (zero) the band, or keep only the band
COUNTS = ("exact", "floor")             # band sizes: equal share at every patch size, or Wanda's per-row int(n·s)


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
        raise ValueError(f"scope={scope!r}: expected one of {SCOPES} (comparison group of the ranking)")
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

    def n_weights(self) -> int:
        """Weights of the matrices this mask covers (purified or not)."""
        return int(sum(g[0] * g[1] for g in self.grid.values())) * self.patch ** 2


def _percent_fraction(theta: float) -> Fraction:
    """θ (percent) as an exact fraction p/q (q <= 10^4, so 52.5 -> 105/2), for integer boundary arithmetic."""
    return Fraction(theta).limit_denominator(10_000)


def band_boundaries(n: int, n_groups: int, theta: float, counts: str = "exact") -> torch.Tensor:
    """B_g(θ): how many of the n patches of comparison group g (0 <= g < G) lie below percentile θ; the band
    [θmin, θmax) is then the ranks r with B_g(θmin) <= r < B_g(θmax). Returns int64 [G].

    - ``counts="exact"``: B_g(θ) = ⌊n·θ/100 + (g + 1/2)/G⌋. By Hermite's identity Σ_g ⌊x + (g + 1/2)/G⌋ =
      ⌊G·x + 1/2⌋, so Σ_g B_g(θ) = round(N·θ/100) with N = n·G the patches in the matrix: a band purifies
      round(N·θmax/100) - round(N·θmin/100) patches, within one patch of its nominal share at every patch size,
      groups differ by at most one patch, and adjacent bands still tile the ranking.
    - ``counts="floor"``: B_g(θ) = ⌊n·θ/100⌋ in every group: Wanda's rule (``sort(metric)[:, :int(n·s)]``);
      its share depends on n (e.g. 16x16 patches of a 576-wide row: 36 per row, 5% = 1 or 2 patches).
    Integer arithmetic on θ = p/q (``_percent_fraction``), so no float rounding at integer boundaries.
    """
    if counts not in COUNTS:
        raise ValueError(f"counts={counts!r}: expected one of {COUNTS}")
    f = _percent_fraction(theta)
    p, q = f.numerator, f.denominator
    g = torch.arange(n_groups, dtype=torch.int64)
    if counts == "floor":
        return torch.full((n_groups,), (n * p) // (100 * q), dtype=torch.int64)
    # ⌊n·p/(100·q) + (2g + 1)/(2G)⌋ = ⌊(2·n·p·G + (2g + 1)·100·q) / (200·q·G)⌋
    return torch.div(2 * n * p * n_groups + (2 * g + 1) * 100 * q, 200 * q * n_groups, rounding_mode="floor")


def band_mask(ranks: PatchRanks, band: tuple[float, float], mode: str = "remove",
              counts: str = "exact") -> PurificationMask:
    """Eq. 5: θ_r = {M_(i) ∈ [θmin, θmax]}: the patches whose ascending rank r (0-based within each comparison
    group: an output row of patches for ``scope="row"``, the whole matrix for ``"matrix"``; ties broken by position,
    stable sort) satisfies B_g(θmin) <= r < B_g(θmax) (:func:`band_boundaries`).

    ``mode="remove"`` purifies (zeros) the band: the reading used by notebook 05, where (0, 5) with
    ``counts="floor"`` is exactly Wanda at 5% sparsity. ``mode="keep"`` keeps only the band and purifies every
    other patch (the keep-only reading: the band is the domain's sub-network, the rest is filtered out; notebook 05
    runs it as an ablation).
    """
    lo, hi = check_band(band)
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: expected one of {MODES} ('remove' zeros the band, 'keep' keeps only it)")
    bits, grid = {}, {}
    for name, r in ranks.ranks.items():
        groups = r.reshape(r.shape[0], -1) if ranks.scope == "row" else r.reshape(1, -1)   # [G, n] ranks
        G, n = groups.shape
        start = band_boundaries(n, G, lo, counts)[:, None]                                 # B_g(θmin)  [G, 1]
        stop = band_boundaries(n, G, hi, counts)[:, None]                                  # B_g(θmax)  [G, 1]
        rr = groups.to(torch.int64)
        m = (rr >= start) & (rr < stop)                                                    # patch in θ_r  [G, n]
        if mode == "keep":
            m = ~m                                                                         # purify all but θ_r
        bits[name] = np.packbits(m.reshape(-1).numpy())
        grid[name] = tuple(r.shape)
    return PurificationMask(bits=bits, grid=grid, patch=ranks.patch, band=(lo, hi),
                            meta=dict(scope=ranks.scope, sublayers=ranks.sublayers, mode=mode, counts=counts))


def purified_share(mask: PurificationMask) -> pd.DataFrame:
    """Realised share of weights a DSS-Expert purifies, per matrix: columns matrix, weights, purified, share
    (purified / weights), row_share_min / row_share_max (over output rows of weights). With
    ``counts="exact"`` the share equals the band's width within one patch at every patch size."""
    rows = []
    for name, g in mask.grid.items():
        pm = mask.patch_mask(name)                                                         # [out/p, in/p]
        per_row = pm.sum(1).double() / g[1]                                                # share of each row of weights
        n_w = g[0] * g[1] * mask.patch ** 2
        n_p = int(pm.sum()) * mask.patch ** 2
        rows.append(dict(matrix=name, weights=n_w, purified=n_p, share=n_p / n_w,
                         row_share_min=float(per_row.min()), row_share_max=float(per_row.max())))
    return pd.DataFrame(rows)


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

    def predict(self, features: np.ndarray, allowed: Sequence | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Main domain, then subdomain (Eq. 7). ``allowed`` (optional, one collection of main labels per item): the
        main level picks the most probable allowed label (the request's task type decides which main labels hold
        an expert of that type)."""
        if self.main is None:
            raise ValueError("router.predict before fit")
        if allowed is None:
            dom = self.main.predict(features)
        else:
            if len(allowed) != len(features):
                raise ValueError(f"router.predict: {len(allowed)} allowed sets for {len(features)} items")
            classes = list(self.main.classes_)
            ok = np.array([[c in set(a) for c in classes] for a in allowed])
            if not ok.any(1).all():
                raise ValueError(f"router.predict: an item allows none of the main labels {classes}")
            proba = np.where(ok, self.main.predict_proba(features), -1.0)
            dom = np.array(classes, dtype=object)[proba.argmax(1)]
        sub = np.empty(len(features), dtype=object)
        for d in np.unique(dom):
            sel = dom == d
            s = self.sub[d]
            sub[sel] = s if not hasattr(s, "predict") else s.predict(features[sel])
        return dom, sub

