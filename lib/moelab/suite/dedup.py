"""Exact and near-duplicate filtering of training text against evaluation items.

Two tests, both against every evaluation item:

- exact: equal after :func:`normalize` (NFKC, lower case, every run of non-alphanumerics -> one space);
- near: IDF-weighted Jaccard similarity of character ``n``-gram sets >= ``threshold``: n-grams that occur in
  many evaluation items (task templates such as "Which sentence has the correct adjective order") weigh little,
  so two items from one template are compared mostly on what differs.

Written by hand (no library in the pinned set does template-aware near-duplicate search); the Jaccard
intersections are one sparse matrix product (scikit-learn's ``HashingVectorizer`` + scipy), chunked.
Used by ``instruct.build`` and ``embed.pairs``.
"""
from __future__ import annotations

import re
import unicodedata

import numpy as np

_NON_ALNUM = re.compile(r"[^0-9a-z]+")


def normalize(text: str) -> str:
    """NFKC, lower case, non-alphanumeric runs collapsed to one space, stripped."""
    return _NON_ALNUM.sub(" ", unicodedata.normalize("NFKC", str(text)).lower()).strip()


def shingles(text: str, n: int = 5) -> set[str]:
    """Character n-grams of the normalised text (the text itself if shorter than n)."""
    t = normalize(text)
    if len(t) <= n:
        return {t} if t else set()
    return {t[i:i + n] for i in range(len(t) - n + 1)}


def jaccard(a: set, b: set) -> float:
    """|a ∩ b| / |a ∪ b| (0 for two empty sets)."""
    u = len(a | b)
    return len(a & b) / u if u else 0.0


class NearDupIndex:
    """Index of evaluation texts; :meth:`flags` marks candidate texts that duplicate any of them.

    Near-duplicate score: IDF-weighted Jaccard of character n-gram sets,
    ``J_w(A, B) = sum_{g in A∩B} w_g / sum_{g in A∪B} w_g`` with ``w_g = log((N + 1) / (df_g + 1))`` over the N
    evaluation texts, so template n-grams shared by a whole task count little and the varying part decides.
    """

    def __init__(self, eval_texts: list[str], n: int = 5, threshold: float = 0.9, weighted: bool = False):
        from sklearn.feature_extraction.text import HashingVectorizer

        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
        self.n, self.threshold = n, threshold
        self.exact = {normalize(t) for t in eval_texts}
        self.vec = HashingVectorizer(analyzer="char", ngram_range=(n, n), n_features=2**22, binary=True, norm=None,
                                     alternate_sign=False, preprocessor=normalize, lowercase=False)
        self.E = None
        if eval_texts:
            import scipy.sparse as sp

            E = self.vec.transform(list(eval_texts)).tocsr()
            df = np.asarray(E.sum(0)).ravel()
            if weighted:
                idf = np.log((E.shape[0] + 1) / (df + 1))
                idf[df == 0] = np.log(E.shape[0] + 1)  # n-grams unseen in the evaluation set: maximal weight
            else:
                idf = np.ones_like(df, dtype=np.float64)
            self.W = sp.diags(idf)
            self.E = E
            self.E_w = np.asarray((E @ self.W).sum(1)).ravel()

    def flags(self, texts: list[str], chunk: int = 2000) -> np.ndarray:
        """Per text: 0 = keep, 1 = exact duplicate, 2 = near duplicate of an evaluation item."""
        out = np.zeros(len(texts), dtype=np.int8)
        for i, t in enumerate(texts):
            if normalize(t) in self.exact:
                out[i] = 1
        if self.E is None or not len(texts):
            return out
        for s in range(0, len(texts), chunk):
            X = (self.vec.transform(texts[s:s + chunk]) @ self.W).tocsr()
            x_w = np.asarray(X.sum(1)).ravel()
            inter = (X @ self.E.T).tocoo()  # sum of weights of shared n-grams
            union = x_w[inter.row] + self.E_w[inter.col] - inter.data
            jac = np.divide(inter.data, union, out=np.zeros_like(inter.data), where=union > 0)
            hit = np.unique(inter.row[jac >= self.threshold - 1e-12]) + s
            out[hit] = np.where(out[hit] == 0, 2, out[hit])
        return out

    def score(self, a: str, b_index: int) -> float:
        """Weighted Jaccard of text ``a`` with evaluation text number ``b_index`` (for tests)."""
        X = (self.vec.transform([a]) @ self.W).tocsr()
        inter = float((X @ self.E[b_index].T).toarray()[0, 0])
        return inter / (float(X.sum()) + self.E_w[b_index] - inter)


def filter_against(candidates: list[dict], eval_texts: list[str], key=lambda d: d["instruction"], **kw):
    """Drop candidates whose ``key`` text duplicates an evaluation text; returns ``(kept, counts)``
    with counts ``{"exact": ..., "near": ...}``; also removes exact duplicates within the candidates."""
    idx = NearDupIndex(eval_texts, **kw)
    f = idx.flags([key(c) for c in candidates])
    kept, seen, internal = [], set(), 0
    for c, flag in zip(candidates, f):
        if flag:
            continue
        k = normalize(key(c))
        if k in seen:
            internal += 1
            continue
        seen.add(k)
        kept.append(c)
    return kept, {"exact": int((f == 1).sum()), "near": int((f == 2).sum()), "internal": internal}
