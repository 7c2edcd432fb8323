"""The stand-in for nomic-embed-text-v2-moe: all-MiniLM-L6-v2 upcycled into an MoE embedding model (SBA paper §III,
§V-A; notebook ``02_sba``, phase (a)).

Two layouts, both with the odd FFNs (layers 1, 3, 5) turned into 8-expert top-2 MoE layers by
:func:`moelab.core.convert.moeify`:

- **nomic's layout** (:func:`build_nomic_layout_moe`, :func:`build_nomic_layout_minilm`): top-2 of a softmax over all
  8 experts *without* renormalisation (``s = w_1 + w_2 < 1``), experts without output bias and **one shared output
  bias** added once after the aggregation (MiniLM's ``b_out``), as nomic. MiniLM's FFN has an input bias (nomic's
  experts have none); it stays with every expert, since dropping it would change the function each expert starts
  from. Experts are initialised by the cluster-aware initialiser of :mod:`moelab.core.cluster_init` (each expert the
  dense FFN with its input projection truncated on its own cluster of calibration tokens; router rows = unit
  centroids), which keeps every expert good on its own inputs and makes experts differ.
  The unnormalised top-2 scales the FFN's contribution by ``s`` (about 1/3 at init). **Init compensation**
  (:func:`compensate_init`) rescales every expert's output by ``c_l = 1 / E[s]`` measured on calibration text,
  layer by layer in order (each layer measured with the earlier ones already compensated):

      y = Σ_{i ∈ top2} w_i · c_l · E_i(x) + b,    c_l = 1 / E_x[Σ_{i ∈ top2} w_i(x)]

  With identical experts and a constant ``s`` this reproduces the dense model exactly.
  :func:`init_damage` measures what the upcycling costs (sentence-embedding cosine to dense MiniLM, and optionally
  the benchmarks) with and without compensation.
- **renormalised layout** (:func:`build_moe_minilm`, the earlier stand-in kept as an ablation): renormalised top-2,
  experts keeping both FFN biases, so sparse upcycling reproduces MiniLM exactly; ``init="drop"`` is the
  Drop-Upcycled "experts half random" ablation.
"""
from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from moelab.assets import load_minilm
from moelab.core import init as core_init
from moelab.core.cluster_init import ClusterAwareInit
from moelab.core.convert import collect_ffn_inputs, moeify
from moelab.core.layer import moe_layers
from moelab.seed import seed_everything

from .geometry import st_forward_fn
from .method import check_aggregation, set_aggregation

__all__ = ["NOMIC_LAYOUT", "build_moe_minilm", "build_nomic_layout_moe", "build_nomic_layout_minilm",
           "calibration_inputs", "kept_weight_mass", "kept_weight_masses", "compensation_factors", "compensate_init",
           "st_encode_fn", "embedding_cosine_to_dense", "init_damage", "upcycling_exactness"]

# nomic-embed-text-v2-moe's MoE layout (docs/reference-facts.md): odd layers, 8 experts, top-2 unnormalised, shared bias
NOMIC_LAYOUT = dict(layers="every_other", num_experts=8, top_k=2, renormalize=False, shared_bias=True)
CALIB_BATCH = 32


def calibration_inputs(st, texts, max_tokens: int = 4096) -> dict:
    """FFN inputs of the odd layers of a dense SentenceTransformer on ``texts`` (padding dropped): {layer: [T, d]}."""
    texts = list(texts or [])
    if not texts:
        raise ValueError("calibration needs texts (calib_texts is empty); pass e.g. the training anchors")
    batches = [dict(st.tokenize(texts[i:i + CALIB_BATCH])) for i in range(0, len(texts), CALIB_BATCH)]
    return collect_ffn_inputs(st[0].auto_model, batches, layers="every_other", max_tokens=max_tokens)


def _resolve_init(init: str, seed: int, drop_ratio: float, st, calib_texts, max_calib_tokens: int,
                  cluster_kw: dict | None = None):
    if init == "sparse":
        return core_init.sparse_upcycle, None
    if init == "drop":
        return core_init.drop_init(ratio=drop_ratio, seed=seed), None
    if init == "cluster":
        if not calib_texts:
            raise ValueError("init='cluster' needs calib_texts (texts whose FFN inputs are clustered)")
        return ClusterAwareInit(seed=seed, **(cluster_kw or {})), calibration_inputs(st, calib_texts, max_calib_tokens)
    raise ValueError(f"init={init!r}; expected 'sparse', 'drop' or 'cluster'")


def build_moe_minilm(renormalize: bool = True, init: str = "drop", aggregation: str = "linear",
                     num_experts: int = 8, top_k: int = 2, seed: int = 0, drop_ratio: float = 0.5,
                     max_seq_length: int = 128, calib_texts=None, base=None):
    """all-MiniLM-L6-v2 (``moelab.assets.load_minilm``, or a copy of ``base``) with its odd FFNs turned into MoE layers
    whose experts keep both FFN biases (notebook 02_sba; the renormalised stand-in, kept as an ablation).

    With ``renormalize=True`` the kept top-2 weights sum to one, so sparse upcycling (``init="sparse"``) reproduces
    MiniLM exactly: Σ_i w_i FFN(x) = FFN(x); ``renormalize=False`` gives s·FFN(x). ``init``: "sparse" (identical
    copies), "drop" (Drop-Upcycling, ``drop_ratio`` of the hidden units re-drawn per expert), "cluster" (cluster-aware
    init, calibrated on ``calib_texts``).
    """
    check_aggregation(aggregation)
    seed_everything(seed)
    st = load_minilm() if base is None else copy.deepcopy(base)
    st.max_seq_length = max_seq_length
    init_fn, calib = _resolve_init(init, seed, drop_ratio, st, calib_texts, 4096)
    moeify(st[0].auto_model, layers="every_other", num_experts=num_experts, top_k=top_k, init=init_fn,
           calib_inputs=calib, renormalize=renormalize, aggregation=aggregation, bias=True)
    return st


def build_nomic_layout_moe(base, init: str = "cluster", calib_texts=None, *, seed: int = 0,
                           num_experts: int = NOMIC_LAYOUT["num_experts"], top_k: int = NOMIC_LAYOUT["top_k"],
                           aggregation: str = "linear", compensate: bool = False, compensation_texts=None,
                           drop_ratio: float = 0.5, max_calib_tokens: int = 4096, max_seq_length: int = 128,
                           cluster_kw: dict | None = None):
    """A copy of the dense SentenceTransformer ``base`` with its odd FFNs upcycled in nomic's layout (module docstring;
    SBA paper §V-A; notebook 02_sba, phase (a)).

    ``init``: "cluster" (default; calibrated on ``calib_texts`` (at most ``max_calib_tokens`` tokens per layer);
    ``cluster_kw`` go to :class:`moelab.core.cluster_init.ClusterAwareInit`, e.g. ``energy``, ``router_scale``),
    "sparse" (copies; router N(0, 0.02²)) or "drop".
    Routing: softmax over all ``num_experts`` logits, top-``top_k`` kept *without* renormalisation; experts: the FFN's
    input bias kept per expert, no output bias; the FFN's output bias becomes the one shared bias.
    ``compensate=True`` applies :func:`compensate_init` on ``compensation_texts`` (default ``calib_texts``); the
    factors are then in ``model.init_compensation`` (a DataFrame), else that attribute is None.
    """
    check_aggregation(aggregation)
    seed_everything(seed)
    st = copy.deepcopy(base)
    st.max_seq_length = max_seq_length
    init_fn, calib = _resolve_init(init, seed, drop_ratio, st, calib_texts, max_calib_tokens, cluster_kw)
    moeify(st[0].auto_model, layers=NOMIC_LAYOUT["layers"], num_experts=num_experts, top_k=top_k, init=init_fn,
           calib_inputs=calib, renormalize=NOMIC_LAYOUT["renormalize"], shared_bias=NOMIC_LAYOUT["shared_bias"],
           aggregation=aggregation, bias=True)
    for layer in moe_layers(st):
        # nomic's experts have no output bias: b_out lives in the one shared bias (moved there by the initialiser)
        if layer.experts.b_out is not None and bool(layer.experts.b_out.detach().abs().max() > 0):
            raise RuntimeError("expected the initialiser to move the FFN's output bias into the shared bias")
        layer.experts.b_out = None
    st.init_compensation = None
    if compensate:
        compensate_init(st, compensation_texts if compensation_texts is not None else calib_texts)
    return st


def build_nomic_layout_minilm(init: str = "cluster", calib_texts=None, **kw):
    """:func:`build_nomic_layout_moe` on all-MiniLM-L6-v2 (``moelab.assets.load_minilm``): the stand-in of notebook
    02_sba's phases (a)-(c)."""
    return build_nomic_layout_moe(load_minilm(), init=init, calib_texts=calib_texts, **kw)


# ----------------------------------------------------------------------------------------------------------------------
# init compensation: c_l = 1 / E[Σ kept weights]
# ----------------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def kept_weight_mass(model, layer, texts, forward_fn=None) -> float:
    """E[Σ_{i ∈ top-k} w_i] of one MoE ``layer`` of ``model`` over the real (unpadded) tokens of ``texts``.

    ``forward_fn(texts) -> token mask`` runs the model (default :func:`moelab.sba.st_forward_fn` for a
    SentenceTransformer) and returns the padding mask over the tokens the layer saw, in order (None: real tokens
    only, as nomic). The mask comes from the forward function, not from the layer's ``token_mask``: recent
    sentence-transformers call the BERT model's ``forward`` directly, which skips the hooks that set it."""
    return kept_weight_masses(model, texts, forward_fn, layers=[layer])[0]


@torch.no_grad()
def kept_weight_masses(model, texts, forward_fn=None, layers=None) -> list[float]:
    """:func:`kept_weight_mass` of every MoE layer in ``layers`` (default: all of ``model``'s, in order) from ONE
    forward pass over ``texts`` (each layer's number equals its own pass's: the layers are only observed)."""
    texts = list(texts or [])
    if not texts:
        raise ValueError("kept_weight_mass needs calibration texts (got none)")
    layers = list(moe_layers(model) if layers is None else layers)
    sums = [[] for _ in layers]

    def hook(i):
        def fn(mod, args, out):
            sums[i].append(mod.last_route.weights.detach().double().sum(-1).cpu())  # Σ_{i ∈ top-k} w_i   [T]
        return fn

    handles = [layer.register_forward_hook(hook(i)) for i, layer in enumerate(layers)]
    try:
        mask = (forward_fn or st_forward_fn(model))(texts)
    finally:
        for h in handles:
            h.remove()
    out = []
    for per_layer in sums:
        s = torch.cat(per_layer) if per_layer else torch.zeros(0, dtype=torch.float64)
        if mask is not None:
            if mask.numel() != s.numel():
                raise ValueError(f"forward_fn returned a mask over {mask.numel()} tokens, the layer saw {s.numel()}")
            s = s[mask.reshape(-1).bool().cpu()]
        if s.numel() == 0:
            raise ValueError("the MoE layer saw no real tokens on the calibration texts")
        out.append(float(s.mean()))
    return out


@torch.no_grad()
def compensation_factors(model, texts, forward_fn=None, apply: bool = False) -> pd.DataFrame:
    """Per MoE layer, in order: the mean kept weight mass E[s] and the factor ``c = 1 / E[s]`` (phase (a)).

    Layer l is measured with layers < l already rescaled (on a working copy unless ``apply``), so each factor sees the
    inputs the compensated model gives it. Returns [layer, kept_mass_mean, factor]."""
    target = model if apply else copy.deepcopy(model)
    rows = []
    for li, layer in enumerate(moe_layers(target)):
        s = kept_weight_mass(target, layer, texts, forward_fn)
        if not s > 0:
            raise ValueError(f"MoE layer {li}: mean kept weight mass {s} is not positive; cannot compensate")
        c = 1.0 / s
        _scale_expert_outputs(layer, c)
        rows.append(dict(layer=li, kept_mass_mean=s, factor=c))
    if not rows:
        raise ValueError(f"{type(model).__name__} has no MoE layers")
    return pd.DataFrame(rows)


def _scale_expert_outputs(layer, c: float) -> None:
    """E_i(x) -> c · E_i(x) for every expert (W_out and any per-expert output bias; the shared bias is not scaled)."""
    ex = layer.experts
    ex.w_out.mul_(c)
    if ex.b_out is not None:
        ex.b_out.mul_(c)


def compensate_init(model, texts, forward_fn=None) -> pd.DataFrame:
    """Rescale every MoE layer's expert outputs by ``1 / E[Σ kept weights]`` measured on ``texts``, in place (module
    docstring; phase (a)). Stores and returns the factors table (:func:`compensation_factors`)."""
    tab = compensation_factors(model, texts, forward_fn, apply=True)
    model.init_compensation = tab
    return tab


# ----------------------------------------------------------------------------------------------------------------------
# damage of the upcycling, with and without compensation
# ----------------------------------------------------------------------------------------------------------------------
def st_encode_fn(st, batch_size: int = 64):
    """texts -> L2-normalised numpy embeddings [N, d] (the encode function for ``moelab.suite.embed.evaluate``)."""

    def encode(texts):
        texts = list(texts)
        if not texts:
            raise ValueError("encode got an empty list of texts")
        return st.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                         show_progress_bar=False)

    return encode


@torch.no_grad()
def embedding_cosine_to_dense(model, dense, texts, batch_size: int = 64, dense_emb=None) -> np.ndarray:
    """cos(emb_model(t), emb_dense(t)) per text [N] (1 = the upcycled model embeds the text as the dense model);
    ``dense_emb``: ``st_encode_fn(dense, batch_size)(texts)`` when already computed (it is not encoded again)."""
    texts = list(texts)
    if not texts:
        raise ValueError("embedding_cosine_to_dense needs texts")
    a = torch.as_tensor(st_encode_fn(model, batch_size)(texts))
    b = torch.as_tensor(st_encode_fn(dense, batch_size)(texts) if dense_emb is None else dense_emb)
    if b.shape != a.shape:
        raise ValueError(f"dense_emb has shape {tuple(b.shape)}, the model's embeddings {tuple(a.shape)}")
    return F.cosine_similarity(a.double(), b.double(), dim=-1).numpy()


def init_damage(base, calib_texts, texts, *, compensation_texts=None, evaluate=None, seed: int = 0,
                init: str = "cluster", build_kw: dict | None = None, base_scores: pd.DataFrame | None = None,
                base_emb=None) -> dict:
    """What nomic-layout upcycling costs at init, with and without compensation (phase (a); notebook 02_sba).

    Builds the nomic-layout MoE of ``base`` (``init``, calibrated on ``calib_texts``), copies it and compensates the
    copy on ``compensation_texts`` (default ``calib_texts``); on held-out ``texts`` measures the sentence-embedding
    cosine to ``base`` and, with ``evaluate(encode_fn) -> table [benchmark, metric, score, ...]``
    (``moelab.suite.embed.evaluate``), the benchmarks of all three (dense included; ``base_scores``: the dense model's
    table when it was already scored, so it is not evaluated twice). ``base_emb``: ``st_encode_fn(base)(texts)``
    when already computed (else encoded here, once for both cosines). Returns dict(table: one row per
    model [model, compensated, cos_mean, cos_min, cos_median, kept_mass_mean (mean over layers)], scores (long table
    or None), factors (per layer), models {name: model})."""
    raw = build_nomic_layout_moe(base, init=init, calib_texts=calib_texts, seed=seed, **(build_kw or {}))
    comp = copy.deepcopy(raw)
    factors = compensate_init(comp, compensation_texts if compensation_texts is not None else calib_texts)
    held_out_mass = kept_weight_masses(raw, texts)  # every layer from one pass over the held-out texts
    models = {"dense": base, f"{init} (nomic layout)": raw, f"{init} (nomic layout, compensated)": comp}
    ref = st_encode_fn(base)(list(texts)) if base_emb is None else base_emb  # the dense embeddings, once
    rows, scores = [], []
    for name, m in models.items():
        cos = embedding_cosine_to_dense(m, base, texts, dense_emb=ref) if m is not base else np.ones(len(list(texts)))
        rows.append(dict(model=name, compensated=m is comp, cos_mean=float(cos.mean()), cos_min=float(cos.min()),
                         cos_median=float(np.median(cos)),
                         kept_mass_mean=np.nan if m is base else float(np.mean(held_out_mass))))
        if evaluate is not None:
            sc = base_scores if (m is base and base_scores is not None) else evaluate(st_encode_fn(m))
            scores.append(sc.assign(model=name))
    return dict(table=pd.DataFrame(rows), scores=pd.concat(scores, ignore_index=True) if scores else None,
                factors=factors.assign(held_out_kept_mass=held_out_mass), models=models)


def upcycling_exactness(texts, base=None) -> pd.DataFrame:
    """Max |embedding difference| between MiniLM and its sparse-upcycled MoE under both routings (nb 02_sba §1)."""
    dense = load_minilm() if base is None else copy.deepcopy(base)
    dense.max_seq_length = 128
    ref = dense.encode(list(texts), convert_to_tensor=True)
    rows = []
    for name, renorm in [("renormalised top-2", True), ("unnormalised top-2 (nomic)", False)]:
        st = build_moe_minilm(renormalize=renorm, init="sparse", base=base)
        for agg in ("linear", "sba"):
            set_aggregation(st, agg)
            emb = st.encode(list(texts), convert_to_tensor=True)
            rows.append(dict(construction=name if agg == "linear" else f"{name}, SBA", aggregation=agg,
                             max_abs_diff=float((emb - ref).abs().max()),
                             min_cosine=float((emb * ref).sum(-1).min())))
    return pd.DataFrame(rows)
