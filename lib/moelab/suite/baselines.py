"""Baselines that a multiple-choice score must beat before it counts.

A model that "beats chance" on a multiple-choice task may only be exploiting how the items are written. Three
kinds of baseline, each returning **per-item correctness** (a float in [0, 1] per item, so a claim can pair it
with a model's per-item scores):

- ``chance``: 1 / #options of each item;
- ``position_correct``: always pick option ``p`` (one column per position; the best fixed position, chosen on
  the items themselves, is ``best_position``);
- question-blind (the options alone, never the question):
  - fixed heuristics ``HEURISTICS``: the option most (least) similar to the others by character n-gram TF-IDF
    cosine (for BIG-bench's date_understanding the distractors are edits of the gold date, so the gold is the
    "centre" of the options), the longest or the shortest option;
  - ``question_blind_cv``: a logistic regression on option features (character n-gram TF-IDF of the option
    text, its length and similarity ranks within the item), cross-validated over items (``N_FOLDS`` folds):
    every item is predicted by a model fitted on the other folds only, so it never sees the test item. It
    learns label priors (e.g. "No" is gold more often than "Yes") as well as surface regularities.
  Position is *not* a question-blind feature: it has its own baseline.

Ties (a heuristic or the model scoring several options equally) count as a uniform random pick among the tied
options: the item scores ``1/#tied`` if the gold is among them. Items: dicts with ``choices`` (list of str) and
``gold`` (index), e.g. ``bigbench.load_items`` or ``lmeval.task_docs`` of a multiple-choice task.

``per_item(items)`` gives every baseline's per-item correctness; ``summary(items)`` their accuracies;
``shortcut_table()`` / ``write_shortcut_doc()`` the suite-wide table in ``docs/suite-shortcuts.md``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy.stats import rankdata
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import KFold

from moelab.suite import bigbench, embed, instruct, lmeval, textcls

HEURISTICS = ("most_similar", "least_similar", "longest", "shortest")
N_FOLDS = 5
SEED = 0
NGRAMS = (2, 4)  # character n-grams (within word boundaries) for option similarity and option features
DOC = Path(__file__).resolve().parents[3] / "docs" / "suite-shortcuts.md"


def _check(items) -> list:
    items = list(items)
    if not items:
        raise ValueError("baselines need at least one item")
    for it in items:
        ch = it.get("choices")
        if not isinstance(ch, (list, tuple)) or len(ch) < 2:
            raise ValueError(f"item {it.get('id')!r} needs a list of at least two 'choices', got {ch!r}")
        g = it.get("gold")
        if not isinstance(g, (int, np.integer)) or not 0 <= g < len(ch):
            raise ValueError(f"item {it.get('id')!r} has gold {g!r} outside its {len(ch)} choices")
    return items


def pick_correct(scores, gold: int) -> float:
    """Correctness of picking the highest-scoring option, ties broken uniformly at random (in expectation)."""
    s = np.asarray(scores, float)
    top = np.flatnonzero(np.isclose(s, s.max(), rtol=0, atol=1e-12))
    return float(gold in top) / len(top)


def chance(items) -> np.ndarray:
    """Per-item chance correctness: 1 / #options."""
    return np.array([1.0 / len(it["choices"]) for it in _check(items)])


def position_correct(items) -> pd.DataFrame:
    """Per-item correctness of always picking position ``p``: columns ``pos_0 .. pos_{max-1}`` (0 where an item
    has fewer options)."""
    items = _check(items)
    n_pos = max(len(it["choices"]) for it in items)
    gold = np.array([it["gold"] for it in items])
    return pd.DataFrame({f"pos_{p}": (gold == p).astype(float) for p in range(n_pos)})


def best_position(items) -> tuple[int, np.ndarray]:
    """The fixed position with the highest accuracy on ``items`` (lowest index on ties) and its per-item
    correctness. Chosen on the items themselves, so it is an optimistic (hard-to-beat) baseline."""
    pos = position_correct(items)
    p = int(np.argmax(pos.mean().to_numpy()))
    return p, pos[f"pos_{p}"].to_numpy()


def option_similarity(choices) -> np.ndarray:
    """Mean cosine similarity of each option to the other options of its item, on character n-gram TF-IDF
    vectors fitted on the item's own options. [n_options]"""
    vec = TfidfVectorizer(analyzer="char_wb", ngram_range=NGRAMS, lowercase=True)
    try:
        X = vec.fit_transform([str(c) for c in choices])
    except ValueError:  # no n-gram at all (e.g. one-character options): no similarity signal
        return np.zeros(len(choices))
    S = (X @ X.T).toarray()  # rows are L2-normalised: cosine similarities
    n = len(choices)
    return (S.sum(1) - S.diagonal()) / (n - 1)


def heuristic_scores(choices, name: str) -> np.ndarray:
    """The score a question-blind heuristic gives each option (the heuristic picks the highest)."""
    if name == "most_similar":
        return option_similarity(choices)
    if name == "least_similar":
        return -option_similarity(choices)
    if name == "longest":
        return np.array([len(str(c)) for c in choices], float)
    if name == "shortest":
        return -np.array([len(str(c)) for c in choices], float)
    raise ValueError(f"unknown question-blind heuristic {name!r}; known: {HEURISTICS}")


def heuristic_correct(items, name: str) -> np.ndarray:
    """Per-item correctness of one question-blind heuristic (``HEURISTICS``)."""
    return np.array([pick_correct(heuristic_scores(it["choices"], name), it["gold"]) for it in _check(items)])


def _dense_features(choices) -> np.ndarray:
    """Within-item features of each option: length and similarity, raw, z-scored and as ranks. [n, 8]
    Invariant to the order in which the options are listed (position has its own baseline)."""
    n = len(choices)
    length = np.array([len(str(c)) for c in choices], float)
    sim = option_similarity(choices)

    def z(x):
        return (x - x.mean()) / (x.std() + 1e-9)

    def rank(x):  # 0 = smallest, 1 = largest; ties share their average rank, so the option's position never leaks
        return (rankdata(x, method="average") - 1) / max(n - 1, 1)

    n_words = np.array([len(str(c).split()) for c in choices], float)
    return np.column_stack([np.log1p(length), z(length), rank(length), sim, z(sim), rank(sim),
                            np.log1p(n_words), np.full(n, 1.0 / n)])


def question_blind_cv(items, n_folds: int = N_FOLDS, seed: int = SEED) -> np.ndarray:
    """Per-item correctness of a logistic regression on the options alone, cross-validated over items.

    Each option is a row (label 1 for the gold option): character n-gram TF-IDF of its text (vectoriser fitted on
    the training folds' options) next to within-item length and similarity features (``_dense_features``). Items
    are split into ``n_folds`` seeded folds; an item's options are scored by the model fitted on the other folds
    and the item picks its highest-probability option (ties: ``pick_correct``).
    """
    items = _check(items)
    if not 2 <= n_folds <= len(items):
        raise ValueError(f"n_folds must be between 2 and the number of items ({len(items)}), got {n_folds}")
    texts = [[str(c) for c in it["choices"]] for it in items]
    dense = [_dense_features(t) for t in texts]
    labels = [np.eye(len(t))[it["gold"]] for t, it in zip(texts, items)]
    out = np.empty(len(items))
    for train, test in KFold(n_folds, shuffle=True, random_state=seed).split(np.arange(len(items))):
        vec = TfidfVectorizer(analyzer="char_wb", ngram_range=NGRAMS, lowercase=True, min_df=2, sublinear_tf=True)
        try:
            vec.fit([c for i in train for c in texts[i]])
            has_text = True
        except ValueError:  # no n-gram seen twice in the training folds: dense features only
            has_text = False

        def design(idx):
            D = sp.csr_matrix(np.vstack([dense[i] for i in idx]))
            return sp.hstack([vec.transform([c for i in idx for c in texts[i]]), D]).tocsr() if has_text else D

        y = np.concatenate([labels[i] for i in train])
        if y.min() == y.max():
            raise ValueError("question_blind_cv: a training fold has a single class; use more items")
        clf = LogisticRegression(C=1.0, max_iter=2000).fit(design(train), y)
        p = clf.predict_proba(design(test))[:, 1]
        start = 0
        for i in test:
            k = len(texts[i])
            out[i] = pick_correct(p[start:start + k], items[i]["gold"])
            start += k
    return out


def per_item(items, n_folds: int = N_FOLDS, seed: int = SEED) -> pd.DataFrame:
    """Every baseline's per-item correctness: ``item_id, chance, pos_0.., <HEURISTICS>.., cv_logreg``."""
    items = _check(items)
    df = pd.DataFrame(dict(item_id=[it.get("id", i) for i, it in enumerate(items)], chance=chance(items)))
    df = pd.concat([df, position_correct(items)], axis=1)
    for name in HEURISTICS:
        df[name] = heuristic_correct(items, name)
    df["cv_logreg"] = question_blind_cv(items, n_folds=n_folds, seed=seed)
    return df


def blind_columns(df: pd.DataFrame) -> list[str]:
    """The question-blind columns of a ``per_item`` table."""
    return [c for c in (*HEURISTICS, "cv_logreg") if c in df.columns]


def summary(items, n_folds: int = N_FOLDS, seed: int = SEED) -> dict:
    """Accuracies of every baseline on ``items``: chance, each position, the best position, each question-blind
    baseline and the best of them (both best-ofs are chosen on the items: optimistic baselines)."""
    df = per_item(items, n_folds=n_folds, seed=seed)
    acc = df.drop(columns="item_id").mean().to_dict()
    pos = {c: v for c, v in acc.items() if c.startswith("pos_")}
    blind = {c: acc[c] for c in blind_columns(df)}
    best_p, best_b = max(pos, key=pos.get), max(blind, key=blind.get)
    return dict(acc, n_items=len(df), best_position=int(best_p[4:]), best_position_acc=pos[best_p],
                best_blind=best_b, best_blind_acc=blind[best_b])


# ------------------------------------------------------------------ suite-wide shortcut table (docs/suite-shortcuts.md)
def _fmt_dist(fracs) -> str:
    return " / ".join(f"{100 * f:.0f}" for f in fracs)


def mc_task_rows() -> list[dict]:
    """One row per multiple-choice lm task (``lmeval.MC_TASKS``) on its evaluation pool: gold-position
    distribution in BIG-bench's order and after the seeded shuffle, the best position, question-blind
    baselines (shuffled items) and chance."""
    rows = []
    for name, task in lmeval.MC_TASKS.items():
        pool = instruct.task_splits(task)["test"]
        dist = bigbench.gold_position_distribution(task, pool)
        s = summary(pool)
        rows.append(dict(set="lm multiple choice", task=f"moelab_{name}", n=len(pool),
                         gold_pos_before=_fmt_dist(dist.frac_before), gold_pos_after=_fmt_dist(dist.frac_after),
                         best_pos_before=float(dist.frac_before.max()),
                         best_pos_after=f"{s['best_position_acc']:.3f} (pos {s['best_position']})",
                         blind=f"{s['best_blind_acc']:.3f} ({s['best_blind']})",
                         blind_all=", ".join(f"{c} {s[c]:.2f}" for c in (*HEURISTICS, "cv_logreg")),
                         chance=s["chance"]))
    return rows


def textcls_rows() -> list[dict]:
    """Text classification candidates (``textcls``): no options are shown, so the shortcut is label balance;
    the question-blind baseline is the majority label of the training split applied to the test split."""
    rows = []
    for t in textcls.CANDIDATES:
        s = textcls._task_splits(t)
        k = len(s["labels"])
        y_test = np.array([y for _, y in s["test"]])
        y_train = np.array([y for _, y in s["train"]])
        major = int(np.bincount(y_train, minlength=k).argmax())
        dist = np.bincount(y_test, minlength=k) / len(y_test)
        rows.append(dict(set="text classification", task=t, n=len(y_test), gold_pos_before=_fmt_dist(dist),
                         gold_pos_after="(labels, not positions)", best_pos_before=float(dist.max()),
                         best_pos_after="n/a", blind=f"{float((y_test == major).mean()):.3f} (train majority)",
                         blind_all="", chance=1.0 / k))
    return rows


def embed_pair_rows(profiles_=("default", "full")) -> list[dict]:
    """``wordnet_pairs`` as two-option items: the example sentence is the question, the two definitions (same
    synset / another sense of the same word) are the options. Scored by cosine AP over pairs, so the listing
    order (positive first) is not seen by the metric; the question-blind baselines ask whether the definitions
    alone reveal the positive."""
    rows = []
    for prof in profiles_:
        b = embed.benchmarks(prof)["wordnet_pairs"]
        items = [dict(id=f"pair-{i}", choices=[b.texts_b[i], b.texts_b[i + 1]], gold=int(np.argmax(b.gold[i:i + 2])))
                 for i in range(0, len(b.gold), 2)]
        dist = bigbench_like_distribution(items)
        s = summary(items)
        rows.append(dict(set="embedding pairs", task=f"wordnet_pairs ({prof})", n=len(items),
                         gold_pos_before=_fmt_dist(dist), gold_pos_after="(AP over pairs: order unused)",
                         best_pos_before=float(dist.max()), best_pos_after="n/a",
                         blind=f"{s['best_blind_acc']:.3f} ({s['best_blind']})",
                         blind_all=", ".join(f"{c} {s[c]:.2f}" for c in (*HEURISTICS, "cv_logreg")), chance=0.5))
    return rows


def bigbench_like_distribution(items) -> np.ndarray:
    """Fraction of items whose gold is at each position (for item lists without ``source_gold``)."""
    items = _check(items)
    g = np.array([it["gold"] for it in items])
    return np.bincount(g, minlength=max(len(it["choices"]) for it in items)) / len(items)


def shortcut_table() -> pd.DataFrame:
    """The suite-wide shortcut table: every multiple-choice lm task, every text classification
    candidate, the embedding pair sets."""
    return pd.DataFrame(mc_task_rows() + textcls_rows() + embed_pair_rows())


def write_shortcut_doc(path: Path = DOC, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Write ``docs/suite-shortcuts.md`` from ``shortcut_table()`` (generated, never edited by hand)."""
    t = shortcut_table() if table is None else table
    cols = ["set", "task", "n", "gold_pos_before", "gold_pos_after", "best_pos_before", "best_pos_after", "blind",
            "chance", "blind_all"]
    head = ("set | task | items | gold position % before (0 / 1 / ...) | after shuffle | best fixed position "
            "before | best fixed position after | best question-blind (which) | chance | all question-blind")
    lines = [
        "# Shortcuts in the suite's evaluation sets (issue 15, item 3)",
        "",
        "Generated by `moelab.suite.baselines.write_shortcut_doc()`; do not edit by hand.",
        "",
        "Multiple-choice lm tasks: evaluation pools (`instruct.task_splits(task)['test']`), gold position in "
        "BIG-bench's option order and after the seeded per-item shuffle (`bigbench.option_order`); baselines on "
        "the shuffled items. Question-blind: heuristics on the options alone (most/least similar to the other "
        "options by character n-gram TF-IDF cosine, longest, shortest) and a logistic regression on option "
        f"features cross-validated over items ({N_FOLDS} folds). The best position and the best question-blind "
        "baseline are chosen on the same items (optimistic). Text classification: label distribution of the test "
        "split and the training split's majority label. Embedding pairs: `wordnet_pairs` read as two-option "
        "items (example sentence -> which of two definitions); mathgen's GSM problems have no options (exact match "
        "of a generated number) and are not listed.",
        "",
        "| " + head + " |",
        "|" + "---|" * len(cols),
    ]
    for _, r in t.iterrows():
        vals = [r[c] for c in cols]
        lines.append("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in vals) + " |")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return t
