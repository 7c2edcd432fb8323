"""Embedding training pairs and MTEB-style benchmarks from offline sources (SBA notebook 02).

MTEB's data (STS-B, StackExchange clustering, SprintDuplicateQuestions, ...) cannot be had offline, so the suite
builds the same *kinds* of benchmark, scored with MTEB's metric definitions, from WordNet 3.0, the Python
standard library and BIG-bench:

- ``wordnet_sts`` (STS): pairs of noun-synset definitions; gold = WordNet path similarity of the two synsets
  (``1/(1+shortest hypernym path)``, in (0, 1]); pairs are drawn stratified by relation (the synset and one of
  its hypernyms, siblings, cousins, random nouns) so the gold spreads over its range. Score: Spearman
  correlation of the embeddings' cosine similarity with the gold (MTEB ``cosine_spearman``).
- ``wordnet_clustering`` / ``bigbench_clustering`` (clustering): noun definitions labelled by lexicographer
  file (noun.animal, noun.artifact, ...); BIG-bench questions labelled by task. Score: V-measure of
  MiniBatchKMeans with k = number of labels (batch size 32, as MTEB), averaged over fixed subsets.
- ``wordnet_pairs`` (pair classification): (example sentence of a sense, definition) labelled 1 for the same
  synset and 0 for another sense of the same word (hard negatives). Score: average precision of the cosine
  similarity (MTEB ``cosine_ap``).
- ``code_retrieval`` / ``wordnet_retrieval`` (retrieval, one gold per query): docstring <-> function code with
  the docstring removed; lemma list <-> definition. Score: Recall@1 in both directions.

``pairs(profile)`` gives (anchor, positive) training pairs from the same sources; the synsets, stdlib modules and
BIG-bench items behind the benchmarks are never used for training pairs.
"""
from __future__ import annotations

import ast
import functools
import zlib
from dataclasses import dataclass, field

import numpy as np

from moelab import assets, cache, profiles, progress
from moelab.stats import bootstrap_ci
from moelab.suite import codegen, instruct, wordnet

SEED = 0
SIZES = {
    "smoke": dict(sts=60, clus_subsets=2, clus_size=80, pairclass=60, retrieval=40, train=300),
    "default": dict(sts=400, clus_subsets=5, clus_size=300, pairclass=400, retrieval=300, train=20000),
    "full": dict(sts=1000, clus_subsets=10, clus_size=500, pairclass=1000, retrieval=600, train=None),
}
SIZES["paper"] = SIZES["full"]


@dataclass
class Benchmark:
    """One benchmark: ``kind`` in {sts, clustering, pairclass, retrieval} and its data."""

    name: str
    kind: str
    texts_a: list = field(default_factory=list)  # sts/pairclass: first texts; retrieval: queries; clustering: texts
    texts_b: list = field(default_factory=list)  # sts/pairclass: second texts; retrieval: corpus (gold = same index)
    gold: np.ndarray | None = None  # sts: graded gold; pairclass: 0/1 labels; clustering: labels per subset
    subsets: list = field(default_factory=list)  # clustering: list of (texts, labels)

    def all_texts(self) -> list[str]:
        out = list(self.texts_a) + list(self.texts_b)
        for texts, _ in self.subsets:
            out += list(texts)
        return out


def _is_eval(key: str) -> bool:
    """Whether a synset / item belongs to the evaluation side (a seeded 20% hash split)."""
    return zlib.crc32(f"{SEED}:{key}".encode()) % 5 == 0


@functools.lru_cache(maxsize=1)
def _nouns():
    syn = wordnet.synsets("n")
    return syn


def _strip_docstring(code: str) -> str:
    tree = ast.parse(code)
    fn = tree.body[0]
    if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(getattr(fn.body[0], "value", None), ast.Constant):
        fn.body = fn.body[1:] or [ast.Pass()]
    return ast.unparse(fn)


# ------------------------------------------------------------------ benchmarks
def _sts(syn, n, rng):
    offs = sorted(o for o in syn if _is_eval(o) and syn[o].definition and syn[o].hypernyms)
    children: dict[str, list] = {}
    for o, s in syn.items():
        for h in s.hypernyms:
            children.setdefault(h, []).append(o)
    a_txt, b_txt, gold, seen = [], [], [], set()
    tries = 0
    while len(gold) < n and tries < 50 * n:
        tries += 1
        a = offs[rng.integers(len(offs))]
        kind = len(gold) % 4
        h = syn[a].hypernyms[0]
        if kind == 0:
            b = h
        elif kind == 1:
            sib = [c for c in children.get(h, []) if c != a]
            if not sib:
                continue
            b = sib[rng.integers(len(sib))]
        elif kind == 2:
            hh = syn[h].hypernyms
            if not hh:
                continue
            cous = [c for u in children.get(hh[0], []) if u != h for c in children.get(u, [])]
            if not cous:
                continue
            b = cous[rng.integers(len(cous))]
        else:
            b = offs[rng.integers(len(offs))]
        if b == a or not syn[b].definition or (a, b) in seen:
            continue
        seen.add((a, b))
        a_txt.append(syn[a].definition)
        b_txt.append(syn[b].definition)
        gold.append(wordnet.path_similarity(a, b, syn))
    return Benchmark("wordnet_sts", "sts", a_txt, b_txt, np.array(gold))


def _clustering_wordnet(syn, n_sub, size, rng):
    offs = sorted(o for o in syn if _is_eval(o) and syn[o].definition and syn[o].lexname != "noun.Tops")
    subsets = []
    for _ in range(n_sub):
        pick = rng.choice(len(offs), size, replace=False)
        subsets.append(([syn[offs[i]].definition for i in pick], [syn[offs[i]].lexname for i in pick]))
    return Benchmark("wordnet_clustering", "clustering", subsets=subsets)


def _clustering_bigbench(n_sub, size, rng):
    pool = []
    for t in instruct.REASONING_TRAIN_TASKS + instruct.REASONING_HELDOUT_TASKS + [instruct.MATH_MC_TASK]:
        pool += [(it["input"], t.split("/")[0]) for it in instruct.task_splits(t)["test"]]
    subsets = []
    for _ in range(n_sub):
        pick = rng.choice(len(pool), min(size, len(pool)), replace=False)
        subsets.append(([pool[i][0] for i in pick], [pool[i][1] for i in pick]))
    return Benchmark("bigbench_clustering", "clustering", subsets=subsets)


def _pairclass(syn, n, rng):
    by_lemma: dict[str, list] = {}
    for o, s in syn.items():
        for lem in s.lemmas:
            by_lemma.setdefault(lem.lower(), []).append(o)
    cands = sorted(o for o in syn if _is_eval(o) and syn[o].examples and syn[o].definition)
    a, b, y = [], [], []
    for i in rng.permutation(len(cands)):
        if len(y) >= n:
            break
        o = cands[i]
        ex = syn[o].examples[0]
        others = [p for lem in syn[o].lemmas for p in by_lemma[lem.lower()] if p != o and syn[p].definition]
        if not others:
            continue
        neg = others[rng.integers(len(others))]
        a += [ex, ex]
        b += [syn[o].definition, syn[neg].definition]
        y += [1, 0]
    return Benchmark("wordnet_pairs", "pairclass", a, b, np.array(y))


def _code_functions(split_test: bool):
    fns, _ = codegen.stdlib_functions()
    out = []
    for f in fns:
        is_test = codegen.module_split(f["module"], SEED) == "test"
        if is_test == split_test:
            try:
                out.append((f["doc"], _strip_docstring(f["code"])))
            except (SyntaxError, IndexError):
                continue
    return out


def _retrieval_code(n, rng):
    fns = _code_functions(split_test=True)
    pick = rng.choice(len(fns), min(n, len(fns)), replace=False)
    return Benchmark("code_retrieval", "retrieval", [fns[i][0] for i in pick], [fns[i][1] for i in pick])


def _retrieval_wordnet(syn, n, rng):
    offs = sorted(o for o in syn if _is_eval(o) and syn[o].definition and len(syn[o].lemmas) >= 2)
    pick = rng.choice(len(offs), min(n, len(offs)), replace=False)
    return Benchmark("wordnet_retrieval", "retrieval", [", ".join(syn[offs[i]].lemmas) for i in pick],
                     [syn[offs[i]].definition for i in pick])


def benchmarks(profile: str, sizes: dict | None = None) -> dict:
    """The embedding benchmarks for ``profile`` (deterministic, seed 0); ``sizes`` overrides ``SIZES[profile]``."""
    sz = dict(SIZES[profiles.check_profile(profile)], **(sizes or {}))
    syn = _nouns()
    rng = lambda k: np.random.default_rng([SEED, k])  # noqa: E731
    out = [_sts(syn, sz["sts"], rng(1)),
           _clustering_wordnet(syn, sz["clus_subsets"], sz["clus_size"], rng(2)),
           _clustering_bigbench(sz["clus_subsets"], sz["clus_size"], rng(3)),
           _pairclass(syn, sz["pairclass"], rng(4)),
           _retrieval_code(sz["retrieval"], rng(5)),
           _retrieval_wordnet(syn, sz["retrieval"], rng(6))]
    return {b.name: b for b in out}


# ------------------------------------------------------------------ training pairs
def _build_pairs(profile: str) -> dict:
    sz = SIZES[profile]
    syn = _nouns()
    pairs = []
    for o in sorted(syn):
        s = syn[o]
        if _is_eval(o) or not s.definition:
            continue
        pairs.append((s.lemmas[0], s.definition))
        pairs += [(ex, s.definition) for ex in s.examples[:1]]
        if len(s.lemmas) >= 2:
            pairs.append((s.lemmas[0], s.lemmas[1]))
    pairs += _code_functions(split_test=False)
    for t in instruct.REASONING_TRAIN_TASKS + [instruct.MATH_MC_TASK]:
        pairs += [(it["input"], it["choices"][it["gold"]]) for it in instruct.task_splits(t)["train"]]
    rng = np.random.default_rng(SEED)
    pairs = [pairs[i] for i in rng.permutation(len(pairs))]
    if sz["train"] is not None:
        pairs = pairs[: sz["train"] + max(20, sz["train"] // 20) * 2]
    n_hold = max(10, len(pairs) // 40)
    return dict(train=pairs[2 * n_hold:], validation=pairs[:n_hold], test=pairs[n_hold:2 * n_hold])


def pairs(profile: str) -> dict:
    """(anchor, positive) pairs: ``{"train", "validation", "test"}``; disjoint from every benchmark's sources."""
    profiles.check_profile(profile)
    return cache.memo("embed_pairs", dict(version="pairs-v1", profile=profile, sizes=SIZES[profile]),
                      lambda: _build_pairs(profile))


# ------------------------------------------------------------------ metrics (MTEB definitions)
def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return a, b


def sts_spearman(ea, eb, gold) -> float:
    """Spearman correlation of row-wise cosine similarity with the gold scores."""
    from scipy.stats import spearmanr

    a, b = _cos(np.asarray(ea, float), np.asarray(eb, float))
    return float(spearmanr((a * b).sum(1), gold).statistic)


def cosine_ap(ea, eb, labels) -> float:
    """Average precision of cosine similarity for binary labels (MTEB pair classification ``cosine_ap``)."""
    from sklearn.metrics import average_precision_score

    a, b = _cos(np.asarray(ea, float), np.asarray(eb, float))
    return float(average_precision_score(labels, (a * b).sum(1)))


def recall_at_1(eq, ec) -> tuple[np.ndarray, np.ndarray]:
    """Per-query hits of Recall@1 in both directions (query i's gold is corpus item i): (q->c, c->q)."""
    q, c = _cos(np.asarray(eq, float), np.asarray(ec, float))
    s = q @ c.T
    idx = np.arange(len(q))
    return (s.argmax(1) == idx).astype(float), (s.argmax(0) == idx).astype(float)


def v_measure(emb, labels, seed: int = 0) -> float:
    """V-measure of MiniBatchKMeans (k = number of labels, batch 32) on the embeddings (MTEB clustering)."""
    from sklearn.cluster import MiniBatchKMeans
    from sklearn.metrics import v_measure_score

    k = len(set(labels))
    km = MiniBatchKMeans(n_clusters=k, batch_size=32, n_init="auto", random_state=seed)
    pred = km.fit_predict(np.asarray(emb, float))
    return float(v_measure_score(labels, pred))


def evaluate(encode_fn, benchmarks: dict, n_boot: int = 1000, seed: int = 0):
    """Score ``encode_fn(list[str]) -> array [n, d]`` on each benchmark: DataFrame
    (benchmark, kind, metric, score, ci_low, ci_high, n). Intervals: percentile bootstrap over pairs / queries;
    over subsets for clustering."""
    import pandas as pd

    rows = []
    rng = np.random.default_rng(seed)

    def boot(fn, n):
        vals = [fn(rng.integers(0, n, n)) for _ in range(n_boot)]
        return np.quantile(vals, [0.025, 0.975])

    for name, b in progress.bar(list(benchmarks.items()), desc="embedding benchmarks", unit="benchmark"):
        if b.kind == "clustering":
            scores = [v_measure(_encode(encode_fn, t), lab, seed) for t, lab in b.subsets]
            est, lo, hi = bootstrap_ci(np.array(scores), n_boot=n_boot, seed=seed)
            rows.append(dict(benchmark=name, kind=b.kind, metric="v_measure", score=est, ci_low=lo, ci_high=hi,
                             n=len(scores)))
            continue
        if not b.texts_a or len(b.texts_a) != len(b.texts_b):
            raise ValueError(f"benchmark {name!r} is empty or has unequal sides")
        ea, eb = _encode(encode_fn, b.texts_a), _encode(encode_fn, b.texts_b)
        n = len(ea)
        if b.kind == "sts":
            est = sts_spearman(ea, eb, b.gold)
            lo, hi = boot(lambda i: sts_spearman(ea[i], eb[i], b.gold[i]), n)
            rows.append(dict(benchmark=name, kind=b.kind, metric="cosine_spearman", score=est, ci_low=lo, ci_high=hi, n=n))
        elif b.kind == "pairclass":
            est = cosine_ap(ea, eb, b.gold)
            lo, hi = boot(lambda i: cosine_ap(ea[i], eb[i], b.gold[i]), n)
            rows.append(dict(benchmark=name, kind=b.kind, metric="cosine_ap", score=est, ci_low=lo, ci_high=hi, n=n))
        elif b.kind == "retrieval":
            for metric, hits in zip(("recall@1_a2b", "recall@1_b2a"), recall_at_1(ea, eb)):
                est, lo, hi = bootstrap_ci(hits, n_boot=n_boot, seed=seed)
                rows.append(dict(benchmark=name, kind=b.kind, metric=metric, score=est, ci_low=lo, ci_high=hi, n=n))
        else:
            raise ValueError(f"unknown benchmark kind {b.kind!r} for {name!r}")
    return pd.DataFrame(rows)


def _encode(encode_fn, texts) -> np.ndarray:
    e = np.asarray(encode_fn(list(texts)), dtype=float)
    if e.ndim != 2 or e.shape[0] != len(texts):
        raise ValueError(f"encode_fn returned shape {e.shape} for {len(texts)} texts; expected [n, d]")
    if not np.all(np.isfinite(e)):
        raise ValueError("encode_fn returned non-finite embeddings")
    return e


# ------------------------------------------------------------------ baselines
def bow_encoder(benchmarks: dict):
    """Bag-of-words baseline: TF-IDF vectors (fitted on all benchmark texts), densified."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    vec = TfidfVectorizer(lowercase=True, token_pattern=r"(?u)\b\w+\b")
    vec.fit([t for b in benchmarks.values() for t in b.all_texts()])
    return lambda texts: vec.transform(texts).toarray()


def random_encoder(dim: int = 384, seed: int = 0):
    """Chance baseline: an independent Gaussian vector per distinct text (seeded by the text)."""
    def enc(texts):
        return np.stack([np.random.default_rng([seed, zlib.crc32(t.encode())]).standard_normal(dim) for t in texts])

    return enc


def validate(profiles_=("default", "full"), path=None):
    """all-MiniLM-L6-v2 vs the bag-of-words and random baselines on ``benchmarks(p)`` for each profile ``p`` (the
    very sets the notebooks evaluate on); writes ``data/embedding_validation.csv`` (profile, encoder, benchmark,
    kind, metric, score, ci_low, ci_high, n, above_baselines)."""
    import pandas as pd

    if isinstance(profiles_, str):
        profiles_ = (profiles_,)
    df = pd.concat([_validate_one(p).assign(profile=p) for p in profiles_], ignore_index=True)
    df = df[["profile"] + [c for c in df.columns if c != "profile"]]
    if path is None:
        from pathlib import Path

        path = Path(__file__).resolve().parents[3] / "data" / "embedding_validation.csv"
    if path:
        df.to_csv(path, index=False, float_format="%.4f")
    return df


def _validate_one(profile: str, sizes: dict | None = None):
    import pandas as pd

    bms = benchmarks(profile, sizes)
    st = assets.load_minilm()
    st.max_seq_length = 128
    encoders = {"all-MiniLM-L6-v2": lambda t: st.encode(t, batch_size=64, convert_to_numpy=True),
                "bag-of-words (tf-idf)": bow_encoder(bms), "random": random_encoder()}
    df = pd.concat([evaluate(fn, bms).assign(encoder=name) for name, fn in encoders.items()], ignore_index=True)
    key = ["benchmark", "metric"]
    base_hi = df[df.encoder != "all-MiniLM-L6-v2"].groupby(key).ci_high.max().rename("baseline_ci_high")
    df = df.join(base_hi, on=key)
    df["above_baselines"] = (df.encoder == "all-MiniLM-L6-v2") & (df.ci_low > df.baseline_ci_high)
    return df[["encoder", "benchmark", "kind", "metric", "score", "ci_low", "ci_high", "n", "above_baselines"]]
