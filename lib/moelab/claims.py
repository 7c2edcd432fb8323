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
        sign = 1 if higher_is_better else -1
        if (sign > 0 and lo > 0) or (sign < 0 and hi < 0):
            verdict = "reproduced"
        elif (sign > 0 and hi < 0) or (sign < 0 and lo > 0):
            verdict = "contradicted"
        else:
            verdict = "inconclusive"
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
        """The paper's option is best: ours is best, or its CI overlaps the best option's CI."""
        if paper_choice not in scores:
            raise ValueError(f"paper's choice {paper_choice!r} is not among the options {list(scores)}")
        cis = {k: bootstrap_ci(v, seed=self.seed) for k, v in scores.items()}
        sgn = 1 if higher_is_better else -1
        best = max(cis, key=lambda k: sgn * cis[k][0])
        pe, plo, phi = cis[paper_choice]
        be, blo, bhi = cis[best]
        overlap = plo <= bhi and blo <= phi
        verdict = "reproduced" if (best == paper_choice or overlap) else "contradicted"
        table = ", ".join(f"{k}: {v[0]:.4g} [{v[1]:.4g}, {v[2]:.4g}]" for k, v in cis.items())
        return self._add(claim=claim, kind="best_of", paper=paper, ours=pe, ci_low=plo, ci_high=phi, verdict=verdict,
                         detail=(detail + f" [our best: {best}; {table}]").strip())

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
