"""The SBA paper's data and its stand-ins (SBA paper §III, §V-B/C; notebook ``02_sba``).

- prompts spanning many subjects (the paper: 57 MMLU subjects): WordNet lexicographer files
  (:func:`wordnet_subject_texts`, read from the real WordNet 3.0 database by :mod:`moelab.suite.wordnet`);
- contrastive training pairs / triplets -> tokenised batches (:class:`PairCollate`); :func:`short_pairs` keeps the
  pairs whose two sides fit a token budget (all-nli's sentences are short; the suite's long BIG-bench inputs would pad
  every batch to 128 tokens);
- the stand-in benchmarks (:mod:`moelab.suite.embed`) scored by MTEB's protocol (:func:`evaluate_benchmarks`:
  clustering by ``MiniBatchKMeans`` with batch 500, :func:`v_measure_mteb`), each mapped to one column of the paper's
  Tables I/II (:data:`STANDIN_COLUMNS`; retrieval has none and is an extension);
- paper profile, from local copies (nothing can be downloaded here): sentence-transformers/all-nli's ``triplet``
  subset (:func:`load_allnli_triplets`; ``NLI_PATH`` may point at the all-nli root, its ``triplet/`` folder or a
  file) and the three MTEB tasks of Tables I/II (:func:`load_mteb_local`, scored with per-item scores by
  :func:`moelab.sba.items.evaluate_mteb_with_items`).
  Every missing input raises :class:`moelab.assets.MissingAsset` naming the notebook parameter to pass
  (:func:`moelab.profiles.paper_input_hint`); an input in the wrong layout or with a wrong field raises
  :class:`moelab.inputs.InputFormatError` naming the parameter, the file, the field and the fix.
  :func:`check_nomic_folder` checks ``MODEL_PATH`` the same way before anything is loaded.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr
from sklearn.cluster import MiniBatchKMeans
from sklearn.metrics import average_precision_score, v_measure_score

from moelab.assets import MissingAsset
from moelab.inputs import InputFormatError, require_hf_model
from moelab.profiles import paper_input_hint
from moelab.stats import bootstrap_ci
from moelab.suite import embed as suite_embed
from moelab.suite import wordnet

from .loader import NomicConfig

__all__ = ["wordnet_subject_texts", "PairCollate", "short_pairs", "ALLNLI_SUBSETS", "MTEB_TASKS",
           "MTEB_CLUSTERING_BATCH", "STANDIN_COLUMNS", "find_allnli_triplet_dir", "load_allnli_triplets",
           "load_mteb_local", "check_nomic_folder", "v_measure_mteb", "cached_encoder",
           "evaluate_benchmarks"]

ALLNLI_SUBSETS = ("pair", "pair-class", "pair-score", "triplet")  # the folders of sentence-transformers/all-nli
MTEB_TASKS = {"STSBenchmark": ["sentence1", "sentence2", "score"],
              "StackExchangeClustering": ["sentences", "labels"],
              "SprintDuplicateQuestions": ["sentence1", "sentence2", "labels"]}
MTEB_CLUSTERING_BATCH = 500  # MTEB's clustering protocol: MiniBatchKMeans(batch_size=500)
# each stand-in benchmark of moelab.suite.embed -> the one column of Tables I/II it stands in for (None: extension)
STANDIN_COLUMNS = {"wordnet_sts": "STSBenchmark", "wordnet_clustering": "StackExchangeClustering",
                   "bigbench_clustering": "StackExchangeClustering", "wordnet_pairs": "SprintDuplicateQuestions",
                   "code_retrieval": None, "wordnet_retrieval": None}
_TABLE_EXT = (".jsonl", ".jsonl.gz", ".json", ".parquet", ".csv")
_ALLNLI = "all-nli (sentence-transformers/all-nli, triplet)"


# ----------------------------------------------------------------------------------------------------------------------
# prompts spanning many subjects: WordNet lexicographer files (stand-in for the paper's 57 MMLU subjects)
# ----------------------------------------------------------------------------------------------------------------------
def wordnet_subject_texts(num_subjects: int = 24, per_subject: int = 16, seed: int = 0,
                          min_words: int = 6) -> dict:
    """{lexicographer file -> texts "lemma: definition"} from the real WordNet 3.0 database (read by
    :mod:`moelab.suite.wordnet`): the ``num_subjects`` noun/verb files with the most definitions of at least
    ``min_words`` words, ``per_subject`` of them drawn at random (seeded) from each file. SBA paper §III; nb 02_sba."""
    if not 1 <= num_subjects <= 41:
        raise ValueError(f"num_subjects={num_subjects} must be in [1, 41] (WordNet has 26 noun + 15 verb files)")
    if per_subject < 1:
        raise ValueError(f"per_subject={per_subject} must be >= 1")
    by_file: dict = {}
    for pos in (("n",) if num_subjects <= 26 else ("n", "v")):  # 26 noun files; verbs only when more are asked
        for off in sorted(syn := wordnet.synsets(pos)):
            s = syn[off]
            if len(s.definition.split()) >= min_words and s.lexname[:4] in ("noun", "verb"):
                by_file.setdefault(s.lexname, []).append(f"{s.lemmas[0]}: {s.definition}")
    ranked = sorted(by_file, key=lambda k: (-len(by_file[k]), k))[:num_subjects]
    rng = np.random.default_rng(seed)
    out = {}
    for name in sorted(ranked):
        items = by_file[name]
        pick = rng.choice(len(items), size=min(per_subject, len(items)), replace=False)
        out[name] = [items[i] for i in sorted(pick)]
    return out


class PairCollate:
    """Pairs (anchor, positive) or triplets (anchor, positive, negative) -> dict of tokenised features.

    ``tokenize_anchor`` / ``tokenize_doc``: texts -> features dict (for nomic: its query / document prefixes); a
    SentenceTransformer's ``tokenize`` serves both for MiniLM."""

    def __init__(self, tokenize_anchor, tokenize_doc=None):
        self.tok_a = tokenize_anchor
        self.tok_d = tokenize_doc or tokenize_anchor

    def __call__(self, batch):
        if not batch:
            raise ValueError("empty batch of pairs")
        n = {len(x) for x in batch}
        if n not in ({2}, {3}):
            raise ValueError(f"expected (anchor, positive[, negative]) tuples, got lengths {sorted(n)}")
        cols = list(zip(*batch))
        out = {"anchor": dict(self.tok_a(list(cols[0]))), "positive": dict(self.tok_d(list(cols[1])))}
        if len(cols) == 3:
            out["negative"] = dict(self.tok_d(list(cols[2])))
        return out


def short_pairs(pairs, tokenize, max_tokens: int = 32) -> list:
    """The pairs (or triplets) every side of which is at most ``max_tokens`` tokens long by ``tokenize(text) ->
    input ids`` (special tokens included), in their order (notebook 02_sba: the stand-in's training and validation
    pairs)."""
    if max_tokens < 2:
        raise ValueError(f"max_tokens={max_tokens!r} must be >= 2 (the special tokens alone take 2)")
    out = [p for p in pairs if all(len(tokenize(t)) <= max_tokens for t in p)]
    if not out:
        raise ValueError(f"no pair has every side within {max_tokens} tokens; raise max_tokens")
    return out


# ----------------------------------------------------------------------------------------------------------------------
# the stand-in benchmarks scored by MTEB's protocol
# ----------------------------------------------------------------------------------------------------------------------
def v_measure_mteb(emb, labels, seed: int = 0) -> float:
    """MTEB's clustering score (SBA paper §V-C, StackExchangeClustering): ``MiniBatchKMeans`` with k = the number of
    labels, batch size :data:`MTEB_CLUSTERING_BATCH` (500) and ``n_init="auto"``, then the V-measure of its labels."""
    labels = list(labels)
    emb = np.asarray(emb, dtype=float)
    if emb.ndim != 2 or len(emb) != len(labels):
        raise ValueError(f"embeddings of shape {emb.shape} for {len(labels)} labels; expected [n, d] with n = labels")
    k = len(set(labels))
    pred = MiniBatchKMeans(n_clusters=k, batch_size=MTEB_CLUSTERING_BATCH, n_init="auto",
                           random_state=seed).fit_predict(emb)
    return float(v_measure_score(labels, pred))


def cached_encoder(encode_fn):
    """``encode_fn`` that encodes every distinct text once and remembers it: a list with repeats (pair
    classification repeats each example sentence) or texts seen in an earlier call cost nothing more. Returns
    ``texts -> array [len(texts), d]`` in the order given."""
    store: dict = {}

    def encode(texts):
        texts = list(texts)
        new = [t for t in dict.fromkeys(texts) if t not in store]
        if new:
            emb = np.asarray(encode_fn(new))
            if emb.ndim != 2 or len(emb) != len(new):
                raise ValueError(f"encode_fn returned shape {emb.shape} for {len(new)} texts; expected [n, d]")
            store.update(zip(new, emb))
        return np.stack([store[t] for t in texts])

    return encode


def _row_cosines(a, b) -> np.ndarray:
    """cos(a_i, b_i) for every row i of two [n, d] arrays."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    na = np.maximum(np.linalg.norm(a, axis=1), 1e-12)
    nb = np.maximum(np.linalg.norm(b, axis=1), 1e-12)
    return (a * b).sum(1) / (na * nb)


def _spearman(cos, gold) -> float:
    return float(spearmanr(cos, gold).statistic)


def _average_precision(cos, labels) -> float:
    return float(average_precision_score(labels, cos))


def evaluate_benchmarks(encode_fn, benches: dict, seed: int = 0, n_boot: int = 1000) -> pd.DataFrame:
    """The stand-in benchmarks ``benches`` (:func:`moelab.suite.embed.benchmarks`) scored as MTEB scores the paper's
    tasks (SBA paper §V-C; notebook 02_sba), with the metrics of :mod:`moelab.suite.embed`:

    - STS: Spearman of the pairs' cosine similarity with the gold; pair classification: average precision of the
      cosine (``cosine_spearman`` / ``cosine_ap``); percentile bootstrap over pairs, resampling the pairs' cosines
      (the same intervals as resampling their embeddings, at a cost that does not grow with the embedding width:
      the bag-of-words baseline has thousands of dimensions);
    - clustering: MTEB's protocol (:func:`v_measure_mteb`: ``MiniBatchKMeans`` with batch 500; the suite's own
      scorer uses batch 32), one V-measure per fixed subset, bootstrap over subsets;
    - retrieval: :func:`moelab.suite.embed.evaluate` (recall@1 both ways).

    Every distinct text is encoded once (:func:`cached_encoder`). Returns [benchmark, kind, metric, score, ci_low,
    ci_high, n, column] in the order of ``benches`` (``column``: :data:`STANDIN_COLUMNS`)."""
    if not benches:
        raise ValueError("no benchmarks to evaluate")
    enc = cached_encoder(encode_fn)
    rng = np.random.default_rng(seed)
    frames = []
    for name, b in benches.items():
        if b.kind == "retrieval":
            frames.append(suite_embed.evaluate(enc, {name: b}, n_boot=n_boot, seed=seed))
            continue
        if b.kind == "clustering":
            scores = np.array([v_measure_mteb(enc(t), lab, seed) for t, lab in b.subsets])
            est, lo, hi = bootstrap_ci(scores, n_boot=n_boot, seed=seed)
            metric, n = "v_measure", len(scores)
        elif b.kind in ("sts", "pairclass"):
            if not b.texts_a or len(b.texts_a) != len(b.texts_b):
                raise ValueError(f"benchmark {name!r} is empty or has unequal sides")
            fn, metric = (_spearman, "cosine_spearman") if b.kind == "sts" else (_average_precision, "cosine_ap")
            cos, gold = _row_cosines(enc(b.texts_a), enc(b.texts_b)), np.asarray(b.gold)
            n = len(cos)
            est = fn(cos, gold)
            boots = [fn(cos[i], gold[i]) for i in rng.integers(0, n, size=(n_boot, n))]
            lo, hi = (float(q) for q in np.quantile(boots, [0.025, 0.975]))
        else:
            raise ValueError(f"unknown benchmark kind {b.kind!r} for {name!r}")
        frames.append(pd.DataFrame([dict(benchmark=name, kind=b.kind, metric=metric, score=est, ci_low=lo,
                                         ci_high=hi, n=n)]))
    out = pd.concat(frames, ignore_index=True)
    return out.assign(column=out.benchmark.map(STANDIN_COLUMNS))


# ----------------------------------------------------------------------------------------------------------------------
# paper profile: the paper's data from local copies
# ----------------------------------------------------------------------------------------------------------------------
def _missing(asset: str, param: str, detail: str, what: str) -> MissingAsset:
    return MissingAsset(asset, detail, paper_input_hint("02", param, what))


def find_allnli_triplet_dir(path) -> Path:
    """The folder (or file) holding all-nli's ``triplet`` subset, given ``NLI_PATH`` (SBA paper §V-C; nb 02_sba).

    Accepts the all-nli root (``<root>/triplet/{train,dev,test}-*.parquet``: the other subsets ``pair``,
    ``pair-class``, ``pair-score`` sit beside it and are never read), a folder above it, the ``triplet`` folder
    itself, or one file. A missing path raises ``MissingAsset`` naming what to pass, a root with other subsets but no
    ``triplet/`` :class:`moelab.inputs.InputFormatError`."""
    what = ("a local copy of sentence-transformers/all-nli (the root folder with its triplet/ subfolder, or the "
            "triplet/ folder itself)")
    if path is None or not Path(path).exists():
        raise _missing(_ALLNLI, "NLI_PATH", f"no local copy at {str(path)!r}", what)
    p = Path(path)
    if p.is_file() or p.name == "triplet":
        return p
    if (p / "triplet").is_dir():
        return p / "triplet"
    nested = sorted(d for d in p.rglob("triplet") if d.is_dir())
    if nested:
        return nested[0]
    others = [n for n in ALLNLI_SUBSETS if (p / n).is_dir()]
    if others:
        raise InputFormatError("02", "NLI_PATH", p, f"holds the all-nli subset(s) {others} but no 'triplet/' folder "
                               "(the paper trains on the triplets)", f"pass {what}")
    return p  # a folder of triplet files without the subset folder


def _find_split_file(p: Path, split: str, param: str, what: str) -> Path:
    if p.is_file():
        return p
    cands = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(_TABLE_EXT) and
                   (f.name.startswith(split) or f.parent.name == split))
    if not cands:
        found = sorted(str(f.relative_to(p)) for f in p.rglob("*") if f.is_file())[:5]
        raise InputFormatError("02", param, p, f"has no '{split}' split file (found {found or 'no files'})",
                               f"pass {what}: `{split}.jsonl.gz` or `{split}-00000-of-00001.parquet` (extensions "
                               f"{', '.join(_TABLE_EXT)})")
    return cands[0]


def _read_table(f: Path) -> pd.DataFrame:
    name = f.name
    if name.endswith(".parquet"):
        return pd.read_parquet(f)
    if name.endswith(".csv"):
        return pd.read_csv(f)
    return pd.read_json(f, lines=not name.endswith(".json"), compression="infer")


def _need_columns(df, cols, f: Path, param: str, what: str):
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise InputFormatError("02", param, f, f"has no field {' / '.join(map(repr, missing))} (its fields: "
                               f"{list(df.columns)})", f"pass {what}, whose rows have the fields {list(cols)}")
    if df.empty:
        raise InputFormatError("02", param, f, "holds no rows", f"pass {what}")


def load_allnli_triplets(path, split: str = "train", limit: int | None = None) -> list:
    """sentence-transformers/all-nli ``triplet`` subset from a local copy -> [(anchor, positive, negative)]
    (SBA paper §V-C: 30K triplets; notebook 02_sba, paper profile). ``path``: see :func:`find_allnli_triplet_dir`;
    ``split``: train | dev | test. Columns anchor, positive, negative."""
    d = find_allnli_triplet_dir(path)
    what = f"the all-nli triplet '{split}' split (triplet/{split}-00000-of-00001.parquet)"
    f = _find_split_file(d, split, "NLI_PATH", what)
    df = _read_table(f)
    _need_columns(df, ["anchor", "positive", "negative"], f, "NLI_PATH", what)
    bad = [c for c in ("anchor", "positive", "negative") if not df[c].map(lambda x: isinstance(x, str)).all()]
    if bad:
        raise InputFormatError("02", "NLI_PATH", f, f"field(s) {bad} hold non-text values", f"pass {what}")
    if limit is not None:
        df = df.iloc[:limit]
    return list(df[["anchor", "positive", "negative"]].itertuples(index=False, name=None))


def load_mteb_local(root, split: str = "test") -> dict:
    """The paper's three MTEB tasks from local copies under ``root`` (one folder each, MTEB's HF layouts; nb 02_sba):

    - ``STSBenchmark`` (mteb/stsbenchmark-sts): sentence1, sentence2, score in [0, 5];
    - ``StackExchangeClustering`` (mteb/stackexchange-clustering): rows of sentences (list), labels (list);
    - ``SprintDuplicateQuestions`` (mteb/sprintduplicatequestions-pairclassification): rows of sentence1 (list),
      sentence2 (list), labels (list of 0/1).

    Returns {task: DataFrame}. A missing folder -> ``MissingAsset`` naming ``MTEB_PATH``; a task folder without its
    split, a missing field or a row of the wrong shape -> :class:`moelab.inputs.InputFormatError`.
    """
    what = ("a folder with the MTEB tasks STSBenchmark/, StackExchangeClustering/, SprintDuplicateQuestions/ "
            f"(each with its '{split}' split, e.g. {split}.jsonl.gz)")
    if root is None or not Path(root).is_dir():
        raise _missing("MTEB tasks", "MTEB_PATH", f"no local folder at {str(root)!r}", what)
    out = {}
    for task, cols in MTEB_TASKS.items():
        p = Path(root) / task
        if not p.exists():
            found = sorted(d.name for d in Path(root).iterdir() if d.is_dir())[:8]
            raise InputFormatError("02", "MTEB_PATH", root, f"has no task folder {task}/ (its folders: {found})",
                                   f"pass {what}")
        f = _find_split_file(p, split, "MTEB_PATH", f"MTEB's {task} (mteb/{task.lower()}) with its '{split}' split")
        df = _read_table(f)
        _need_columns(df, cols, f, "MTEB_PATH", f"MTEB's {task}")
        _check_mteb_rows(task, df, f)
        out[task] = df
    return out


def _check_mteb_rows(task: str, df: pd.DataFrame, f: Path) -> None:
    """The shape of every row of an MTEB task (STS: texts and a score in [0, 5]; clustering: one set per row, lists of
    equal length; pair classification: one set per row, three lists of equal length, labels 0/1)."""
    def bad(row: int, problem: str, fix: str):
        raise InputFormatError("02", "MTEB_PATH", f, f"row {row}: {problem}", fix)

    if task == "STSBenchmark":
        sc = pd.to_numeric(df["score"], errors="coerce")
        out = sc.isna() | (sc < 0) | (sc > 5)
        if out.any():
            i = int(np.flatnonzero(out.to_numpy())[0])
            bad(i, f"field 'score' is {df['score'].tolist()[i]!r}, expected a number in [0, 5]",
                "pass mteb/stsbenchmark-sts (gold similarity 0-5)")
        return
    lists = MTEB_TASKS[task]
    for i, r in enumerate(df[lists].itertuples(index=False)):
        vals = [list(v) if isinstance(v, (list, tuple, np.ndarray)) else None for v in r]
        if any(v is None for v in vals):
            bad(i, f"fields {lists} must be lists (one {'set' if task.endswith('Clustering') else 'pair set'} per "
                   "row)", f"pass MTEB's {task} in its Hugging Face layout")
        if len({len(v) for v in vals}) != 1 or not vals[0]:
            bad(i, f"lists {lists} have lengths {[len(v) for v in vals]}, expected equal and non-empty",
                f"pass MTEB's {task} in its Hugging Face layout")
        if task == "SprintDuplicateQuestions" and not set(vals[2]) <= {0, 1}:
            bad(i, f"field 'labels' holds {sorted(set(vals[2]))[:4]}, expected 0/1", "pass the pair-classification "
                   "task mteb/sprintduplicatequestions-pairclassification")


def check_nomic_folder(path) -> dict:
    """``MODEL_PATH`` checked before anything loads (notebook 02, paper profile): a folder with ``config.json`` of
    ``model_type`` ``nomic_bert`` with experts (nomic-embed-text-v2-moe, not the dense v1.5), safetensors weights and a
    tokenizer. Returns the parsed config; ``MissingAsset`` / :class:`moelab.inputs.InputFormatError` otherwise."""
    what = "a local folder of nomic-ai/nomic-embed-text-v2-moe (config.json, model.safetensors, tokenizer files)"
    cfg = require_hf_model("02", "MODEL_PATH", path, what, model_types=("nomic_bert",))
    p = Path(path).expanduser()
    try:
        NomicConfig.from_hf_config(cfg, source=str(p / "config.json"))
    except ValueError as e:
        raise InputFormatError("02", "MODEL_PATH", p / "config.json", str(e), f"pass {what}") from None
    if not ((p / "model.safetensors").is_file() or (p / "model.safetensors.index.json").is_file()):
        raise InputFormatError("02", "MODEL_PATH", p, "has no model.safetensors (or model.safetensors.index.json)",
                               "copy the safetensors weights of the release beside config.json")
    return cfg
