"""The one module of claim kinds: every verdict in every notebook is computed here (foundation issue, item 6).

Kinds:
- ``effect``: "A beats B". Paired bootstrap of mean(A - B) over evaluation items (and seeds when >= 3).
  *reproduced* if the 95% interval excludes zero with the paper's sign, *contradicted* if it excludes zero with the
  opposite sign, *inconclusive* otherwise.
- ``equivalence``: an absolute value ("matches", "near 1", "balanced") with a tolerance stated beside the claim:
  *reproduced* if the interval lies inside ``target ± tol``, *contradicted* if it lies entirely outside, else inconclusive.
- ``best_of``: "option X works best": *reproduced* if the paper's option is our best or its interval overlaps our best's
  interval, *contradicted* otherwise.
- ``shape``: a stated quantitative criterion over time (the caller computes ``value`` and ``passed``).
- ``not_testable``: with the reason.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from moelab.stats import bootstrap_ci, paired_bootstrap

VERDICTS = ("reproduced", "contradicted", "inconclusive", "not testable")


def _direction_verdict(lo: float, hi: float, higher_is_better: bool) -> str:
    """Verdict of a difference (paper's side - other) from its interval: excludes 0 in the paper's favour ->
    reproduced, against it -> contradicted, else inconclusive."""
    if (lo > 0) if higher_is_better else (hi < 0):
        return "reproduced"
    if (hi < 0) if higher_is_better else (lo > 0):
        return "contradicted"
    return "inconclusive"


class ClaimSet:
    """An ordered list of checked claims, saved as ``claims.json`` by :meth:`moelab.nbrun.NotebookRun.finish`."""

    def __init__(self, seed: int = 0):
        self.records: list[dict] = []
        self.seed = seed

    def _add(self, **rec) -> dict:
        if not rec.get("claim"):
            raise ValueError("a claim needs a non-empty description")
        rec["paper"] = "" if rec.get("paper") is None else str(rec["paper"])
        for k in ("ours", "ci_low", "ci_high"):
            v = rec.get(k)
            rec[k] = None if v is None else float(v)
        assert rec["verdict"] in VERDICTS, rec["verdict"]
        self.records.append(rec)
        return rec

    def effect(self, claim, paper, a, b, higher_is_better: bool = True, n_boot: int = 2000, detail: str = ""):
        """A beats B (paired scores [items] or [seeds, items]); ours = mean(A - B) with its 95% CI."""
        est, lo, hi = paired_bootstrap(a, b, n_boot=n_boot, seed=self.seed)
        verdict = _direction_verdict(lo, hi, higher_is_better)
        shape = np.shape(a)
        return self._add(claim=claim, kind="effect", paper=paper, ours=est, ci_low=lo, ci_high=hi, verdict=verdict,
                         detail=(detail + f" [paired bootstrap, scores shape {shape}, "
                                 f"{'higher' if higher_is_better else 'lower'} is better]").strip())

    def equivalence(self, claim, paper, values, target: float, tol: float, detail: str = ""):
        """Mean of ``values`` within ``target ± tol`` (the tolerance is part of the claim)."""
        if not tol > 0:
            raise ValueError(f"equivalence tolerance must be > 0, got {tol!r}")
        est, lo, hi = bootstrap_ci(values, seed=self.seed)
        if target - tol <= lo and hi <= target + tol:
            verdict = "reproduced"
        elif hi < target - tol or lo > target + tol:
            verdict = "contradicted"
        else:
            verdict = "inconclusive"
        return self._add(claim=claim, kind="equivalence", paper=paper, ours=est, ci_low=lo, ci_high=hi, verdict=verdict,
                         detail=(detail + f" [target {target:g} ± {tol:g}]").strip())

    def best_of(self, claim, paper, paper_choice, scores: dict, higher_is_better: bool = True, detail: str = ""):
        """The paper's option is best among ``scores`` (option -> per-item scores).

        Paired scores (every option the same shape): the paired-bootstrap interval of (paper's option - other) for
        each other option; *reproduced* when every interval excludes zero in the paper's favour, *contradicted* when
        some option is significantly better, else *inconclusive* (a tie is not a win). Unpaired scores: the same
        rule on non-overlapping percentile intervals of the means.
        """
        if paper_choice not in scores:
            raise ValueError(f"paper's choice {paper_choice!r} is not among the options {list(scores)}")
        if len(scores) < 2:
            raise ValueError(f"best_of needs at least two options, got {list(scores)}")
        cis = {k: bootstrap_ci(v, seed=self.seed) for k, v in scores.items()}
        sgn = 1 if higher_is_better else -1
        others = [k for k in scores if k != paper_choice]
        paired = len({np.shape(v) for v in scores.values()}) == 1
        if paired:
            diffs = {k: paired_bootstrap(scores[paper_choice], scores[k], seed=self.seed) for k in others}   # a - b
            verdicts = [_direction_verdict(lo, hi, higher_is_better) for _, lo, hi in diffs.values()]
            win, lose = all(v == "reproduced" for v in verdicts), "contradicted" in verdicts
            rule = "; ".join(f"{paper_choice} - {k}: {d[0]:+.4g} [{d[1]:+.4g}, {d[2]:+.4g}]" for k, d in diffs.items())
        else:   # unpaired: the paper's option's interval against each other option's (non-overlap decides)
            c = cis[paper_choice]
            ahead = [(c[1] > cis[k][2]) if higher_is_better else (c[2] < cis[k][1]) for k in others]
            behind = [(cis[k][1] > c[2]) if higher_is_better else (cis[k][2] < c[1]) for k in others]
            win, lose = all(ahead), any(behind)
            rule = "unpaired: non-overlapping intervals"
        verdict = "contradicted" if lose else "reproduced" if win else "inconclusive"
        pe, plo, phi = cis[paper_choice]
        best = max(cis, key=lambda k: sgn * cis[k][0])
        table = ", ".join(f"{k}: {v[0]:.4g} [{v[1]:.4g}, {v[2]:.4g}]" for k, v in cis.items())
        return self._add(claim=claim, kind="best_of", paper=paper, ours=pe, ci_low=plo, ci_high=phi, verdict=verdict,
                         detail=(detail + f" [our best: {best}; {table}; {rule}]").strip())

    def shape(self, claim, paper, criterion: str, value: float, passed: bool, detail: str = ""):
        """A stated quantitative criterion over time; ``passed`` computed by the caller from ``value``."""
        if not criterion:
            raise ValueError("a shape claim needs its criterion stated")
        return self._add(claim=claim, kind="shape", paper=paper, ours=value, ci_low=None, ci_high=None,
                         verdict="reproduced" if passed else "contradicted",
                         detail=(detail + f" [criterion: {criterion}]").strip())

    def not_testable(self, claim, paper, reason: str):
        if not reason:
            raise ValueError("not_testable needs the reason")
        return self._add(claim=claim, kind="not testable", paper=paper, ours=None, ci_low=None, ci_high=None,
                         verdict="not testable", detail=reason)

    def frame(self):
        import pandas as pd

        cols = ["claim", "kind", "paper", "ours", "ci_low", "ci_high", "verdict", "detail"]
        return pd.DataFrame(self.records, columns=cols)

    def save(self, path: Path, provenance: dict):
        Path(path).write_text(json.dumps({"provenance": provenance, "claims": self.records}, indent=1, default=str))
