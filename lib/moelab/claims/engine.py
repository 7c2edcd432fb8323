"""Claims engine: a claim is a pure function of the tables a notebook saved.

A :class:`Claim` says what the paper states (its numbers, written beside the claim with the table they come from)
and how to read the matching evidence from the saved tables (``evidence(T) -> Seeds | Items | ...``).
:func:`evaluate` turns the two into one record (see ``moelab.claims.schema``) by the verdict rule of docs/CLAIMS.md:

1. the 95% interval of ``ours`` excludes 0 -> ``reproduced`` (sign = ``expected_sign``) or ``contradicted``;
   equivalence claims: interval inside ``[-tolerance, tolerance]`` -> ``reproduced``, entirely outside ->
   ``contradicted``;
2. otherwise ``underpowered`` when the paper's effect (the tolerance, for an equivalence claim) is below our minimum
   detectable effect and the metric is the paper's own (``proxy=False``);
3. otherwise ``inconclusive``.

Gates that do not look at the answer, applied before the rule: evidence that cannot be had
(``unobtainable``), a claim another profile scores (``not in this profile``), a failed regime check of the stand-in
(``outside the regime``: the claim's ``regime=``), a check that is no claim of the paper (``extension``), and a
quantity fixed by the definition or the initialisation (``determined_by``: ``holds by construction`` whichever way it
falls). Proxy rows are never ``underpowered``. Every decisive record carries ``determined_by``, ``regime``,
``replication`` and ``proxy_for`` (an empty one is an error). The direction of a claim is derived from the paper's
numbers (``expected_sign`` may be typed only when the paper gives none); every comparative ``ours`` is a difference
``a - b``; a claim has one metric and one unit.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from moelab.stats import (Interval, minimum_detectable_effect, ols_slope_interval, paired_t_interval, t_interval,
                          welch_interval)

ENGINE_VERSION = "moelab.claims v4.0"
VERDICTS = ("reproduced", "contradicted", "smaller than reported", "underpowered", "inconclusive",
            "holds by construction", "unobtainable", "not in this profile", "outside the regime", "extension",
            "dry run")
# "smaller than reported": the interval includes 0 but excludes the paper's effect (in the paper's own unit): a
# decisive statement about magnitude (issue 47, item 5), never for a proxy (decided on sign only).
DECISIVE = ("reproduced", "contradicted", "smaller than reported")
# "dry run": the folder is a dry run of the paper profile (issue 51: every cell of the paper path on cut sizes, to
# check paths, formats and code before booking GPUs); its rows are computed but never a verdict.
DRY_RUN = "dry run"
DETERMINED_BY = ("definition", "initialisation", "training")
KINDS = ("comparative", "best", "absolute", "trend", "statistic", "qualitative")
MIN_SEEDS = 3
FEW_SEEDS = "fewer than 3 seeds: a training comparison cannot be decided"
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_]*$")


class MissingTable(LookupError):
    """A table the claim needs was not saved by this run (the engine records ``inconclusive`` with the reason)."""


class ClaimEvidenceError(RuntimeError):
    """An unexpected error while reading a claim's evidence: a bug in the claim definition or the tables."""


# ---------------------------------------------------------------- the tables of one output folder
class Tables:
    """Read-only access to one output folder (``figures/<nb>[/<profile>]``) for ``Claim.evidence``.

    ``T.csv("table1_main")`` reads ``table1_main.csv`` (raises :class:`MissingTable` when absent), ``T.json(stem)``,
    ``T.has(stem)``, and the folder's ``T.provenance``, ``T.notebook``, ``T.profile``.
    """

    def __init__(self, folder):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise ValueError(f"{self.folder} is not a folder of saved tables")
        prov = self.folder / "provenance.json"
        self.provenance: dict = json.loads(prov.read_text()) if prov.exists() else {}
        self.notebook: str = self.provenance.get("notebook", "")
        self.profile: str = self.provenance.get("profile", "")
        self._cache: dict[str, Any] = {}
        self.reads: list[str] = []   # file names read (by the claim being evaluated: its record's ``sources``)

    def _path(self, stem: str, suffix: str) -> Path:
        stem = stem[: -len(suffix)] if stem.endswith(suffix) else stem
        return self.folder / f"{stem}{suffix}"

    def has(self, stem: str) -> bool:
        """Whether ``<stem>.csv`` or ``<stem>.json`` was saved."""
        return self._path(stem, ".csv").exists() or self._path(stem, ".json").exists()

    def csv(self, stem: str) -> pd.DataFrame:
        """The saved table ``<stem>.csv`` (a copy: evidence functions may modify it)."""
        path = self._path(stem, ".csv")
        if not path.exists():
            raise MissingTable(f"needs table {path.name}, produced by the next run (not saved by this run)")
        if path.name not in self.reads:
            self.reads.append(path.name)
        if path.name not in self._cache:
            self._cache[path.name] = pd.read_csv(path)
        return self._cache[path.name].copy()

    def json(self, stem: str):
        """The saved JSON file ``<stem>.json``."""
        path = self._path(stem, ".json")
        if not path.exists():
            raise MissingTable(f"needs file {path.name}, produced by the next run (not saved by this run)")
        if path.name not in self.reads:
            self.reads.append(path.name)
        return json.loads(path.read_text())


# ---------------------------------------------------------------- evidence types
def _unit_check(units, what: str):
    """Reject evidence that would pool metrics of different units: no claim pools metrics of different
    units."""
    distinct = sorted({u for u in units if u is not None})
    if len(distinct) > 1:
        raise ValueError(f"{what} mixes units {distinct}: a claim compares one metric in one unit; split it into one "
                         "claim per metric")
    return distinct[0] if distinct else None


def _values(x, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if a.size and not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains non-finite values: {a.ravel()[~np.isfinite(a.ravel())][:3]}")
    return a


@dataclass
class Seeds:
    """Compared models were trained: ``a``, ``b`` hold per-seed means (items averaged within each seed), or
    [seeds, items] arrays that are averaged here. ``paired=True`` when the arms share seeds (aligned; pandas Series
    are aligned on their index), else Welch. ``units``: the metric unit of each arm when known (checked equal)."""
    a: Any
    b: Any
    paired: bool
    n_items: int | None = None
    units: tuple | None = None


@dataclass
class Items:
    """Compared models are fixed by design (no training between them): aligned per-item scores of one model pair.
    ``score_range=(lo, hi)`` for bounded scores adds one pseudo-pair at each extreme of the difference range."""
    a: Any
    b: Any
    score_range: tuple | None = None
    units: tuple | None = None


@dataclass
class Options:
    """"x is best": ``scores`` maps option -> per-seed (or per-item) values, aligned across options."""
    scores: Mapping[str, Any]
    unit_of_replication: str = "seeds"
    n_items: int | None = None
    paired: bool = True
    score_range: tuple | None = None
    units: Mapping[str, str] | None = None


@dataclass
class Level:
    """An absolute level (claims with ``target=``): per-seed or per-item values; t-interval of the mean."""
    values: Any
    unit_of_replication: str = "seeds"
    n_items: int | None = None
    units: tuple | None = None


@dataclass
class Trend:
    """A trajectory on a FIXED held-out batch: OLS slope per step with its t-interval (df = n - 2); with
    ``values`` of shape [seeds, steps], one slope per seed and a t-interval over seeds. ``null`` states the null."""
    steps: Any
    values: Any
    null: str
    n_items: int | None = None


@dataclass
class Precomputed:
    """A special test computed elsewhere (e.g. an independence test); the engine applies the verdict rule."""
    ours: float
    ci_low: float
    ci_high: float
    n_items: int | None
    n_seeds: int | None
    mde: float | None
    method: str


@dataclass
class ByConstruction:
    """An identity: true of the method's definition (arithmetic) or, for a claim about training, of a quantity the
    initialisation fixed and training did not move (the reason gives both numbers). Never evidence for the paper.

    A claim about a fixed *object* (an encoder's clusters, a model at initialisation, a rule applied to a trained
    router) is not an identity: test it (``Items``, ``Precomputed`` permutation test, ...) and let it decide.
    ``ours`` is the measured value and ``holds`` whether it satisfies the identity or threshold the reason states:
    a measured value that breaks it is a failed check, raised at rebuild (:class:`ClaimEvidenceError`), never a
    label. Give ``holds`` whenever ``ours`` is given."""
    which: str
    reason: str
    ours: float | None = None
    holds: bool | None = None


@dataclass
class RiseThenFall:
    """"Rises, then re-stabilises" on a FIXED held-out batch: ``values`` [seeds, steps] (column 0 = initialisation).
    Per seed, with ``early`` = mean of the first half of the post-init steps and ``late`` = mean of their last third:
    rise = early - init, fall = early - late, and the seed's statistic is min(rise, fall); t-interval over seeds. A
    monotone (saturating) rise has fall <= 0, so it cannot pass (tests/claims/test_calibration.py)."""
    steps: Any
    values: Any
    n_items: int | None = None


@dataclass
class Unobtainable:
    """The paper's weights or data cannot be had offline (``reason`` names them)."""
    reason: str


@dataclass
class NotInProfile:
    """The claim is scored by another profile (``profile`` names it)."""
    profile: str
    reason: str


@dataclass
class OutsideRegime:
    """The stand-in failed a regime check computed inside the evidence (``check`` names it with its numbers)."""
    check: str
    reason: str = ""


@dataclass
class Insufficient:
    reason: str


@dataclass
class Regime:
    """A claim's regime check (``Claim.regime``): what is checked, the measured value(s), whether it passed."""
    check: str
    value: str
    passed: bool


EVIDENCE_TYPES = (Seeds, Items, Options, Level, Trend, RiseThenFall, Precomputed, ByConstruction, Unobtainable,
                  NotInProfile, OutsideRegime, Insufficient)


# ---------------------------------------------------------------- the claim
def _sign(x: float) -> int:
    return int(x > 0) - int(x < 0)


def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class Claim:
    """One claim of a paper, defined from its table (docs/CLAIMS.md). Definition errors raise ``ValueError`` here.

    Kinds: ``compare=(a, b)`` comparative (``ours = a - b``); ``best="x"`` ("x is best"; ``ours`` = x - best other);
    ``target=`` absolute level; otherwise a trend/statistic/qualitative claim whose evidence decides.
    """
    id: str
    claim: str
    paper_ref: str
    metric: str
    unit: str
    higher_is_better: bool = True
    paper_metric: str | None = None
    paper_unit: str | None = None
    paper_higher_is_better: bool | None = None
    proxy: bool = False
    paper_value: Any = None
    compare: tuple | None = None
    best: str | None = None
    target: float | None = None
    tolerance: float | None = None
    tolerance_why: str = ""
    paper_tolerance: float | None = None
    expected_sign: int | None = None
    legacy: Any = None
    note: str = ""
    evidence: Callable | None = field(default=None, repr=False)
    determined_by: str | None = None   # definition | initialisation | training (what sets the quantity); a notebook's
                                       # definitions must declare it (load_claims), ad-hoc claims default to training
    regime: Any = None               # Regime, or a function of the tables -> Regime (None: no regime check)
    replication: str = ""            # why seeds x items is the right unit (default: from the evidence type)
    proxy_for: str = ""              # proxy=True: the paper metric it stands in for and the evidence it tracks it
    extension: bool = False          # not a claim of the paper (own table, never counted in the paper's totals)
    paper_quote: str = ""            # the sentence or table cell of the paper the claim tests, copied from it
                                     # (required for every non-extension claim: check_definitions)
    circular: str = ""               # non-empty: the regime gate / a setting was chosen to produce this quantity (say
                                     # how); the row cannot be decisive (inconclusive, "circular: ...")

    def __post_init__(self):
        where = f"claim {self.id!r}"
        if not isinstance(self.id, str) or not _ID_RE.match(self.id):
            raise ValueError(f"claim id must be a lower-case slug like 'sba_vs_linear_sts', got {self.id!r}")
        for name in ("claim", "paper_ref", "metric", "unit"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise ValueError(f"{where}: {name} must be a non-empty string, got {getattr(self, name)!r}")
        self.paper_metric = self.paper_metric or self.metric
        self.paper_unit = self.paper_unit or self.unit
        if self.paper_higher_is_better is None:   # same direction unless stated (state it for every proxy that runs
            self.paper_higher_is_better = self.higher_is_better   # the other way, e.g. bpb for accuracy)
        if not self.proxy and self.paper_unit != self.unit:
            raise ValueError(f"{where}: our unit {self.unit!r} differs from the paper's {self.paper_unit!r}; report "
                             "ours in the paper's unit, or set proxy=True when our metric stands in for another")
        if self.legacy is not None and not isinstance(self.legacy, (str, list, tuple)):
            raise ValueError(f"{where}: legacy must be the old claim's text (or a list of texts), got {self.legacy!r}")
        if self.evidence is None or not callable(self.evidence):
            raise ValueError(f"{where}: evidence must be a function of the tables, e.g. lambda T: Seeds(...)")
        if sum(x is not None for x in (self.compare, self.best, self.target)) > 1:
            raise ValueError(f"{where}: give only one of compare=, best=, target=")
        if self.tolerance is not None:
            if not (_is_number(self.tolerance) and self.tolerance > 0):
                raise ValueError(f"{where}: tolerance must be a positive number in {self.unit}, got {self.tolerance!r}")
            if not self.tolerance_why.strip():
                raise ValueError(f"{where}: tolerance={self.tolerance} needs tolerance_why (the papers report no "
                                 "spreads: say where the tolerance comes from)")
        self.declared = self.determined_by is not None
        if self.determined_by is None:
            self.determined_by = "training"
        if self.determined_by not in DETERMINED_BY:
            raise ValueError(f"{where}: determined_by must be one of {DETERMINED_BY} (what sets the quantity), got "
                             f"{self.determined_by!r}")
        if self.proxy and not self.proxy_for.strip():
            raise ValueError(f"{where}: a proxy claim needs proxy_for= (the paper metric it stands in for and the "
                             "evidence that it tracks it)")
        if not isinstance(self.paper_quote, str) or not isinstance(self.circular, str):
            raise ValueError(f"{where}: paper_quote and circular must be strings")
        if self.regime is not None and not (callable(self.regime) or isinstance(self.regime, Regime)):
            raise ValueError(f"{where}: regime must be a Regime or a function of the tables returning one")
        self._check_paper_value(where)
        self.paper_effect = self._paper_effect(where)
        self.equivalence = self._is_equivalence(where)
        self.expected_sign = self._expected_sign(where)

    # -- definition checks
    def _check_paper_value(self, where):
        pv = self.paper_value
        if isinstance(pv, Mapping):
            bad = {k: v for k, v in pv.items() if not _is_number(v)}
            if bad:
                raise ValueError(f"{where}: paper_value entries must be numbers, got {bad}")
            if self.compare is None and self.best is None:
                raise ValueError(f"{where}: paper_value is a table of options {list(pv)} but the claim has neither "
                                 "compare=(a, b) nor best=")
        elif pv is not None and not _is_number(pv):
            raise ValueError(f"{where}: paper_value must be a dict option -> number, a number, or None, got {pv!r}")
        if self.compare is not None:
            if not (isinstance(self.compare, (tuple, list)) and len(self.compare) == 2
                    and all(isinstance(c, str) for c in self.compare) and self.compare[0] != self.compare[1]):
                raise ValueError(f"{where}: compare must be two different option names (a, b), got {self.compare!r}")
            self.compare = tuple(self.compare)
            if isinstance(pv, Mapping):
                missing = [c for c in self.compare if c not in pv]
                if missing:
                    raise ValueError(f"{where}: compare names {missing} are not in paper_value {list(pv)}")
        if self.best is not None and pv is not None:
            if not isinstance(pv, Mapping) or len(pv) < 2:
                raise ValueError(f"{where}: best={self.best!r} needs paper_value as a dict with the paper's numbers "
                                 "for at least two options (or None when the paper states it without numbers)")
            if self.best not in pv:
                raise ValueError(f"{where}: best={self.best!r} is not in paper_value {list(pv)}")
            better = max if self.paper_higher_is_better else min
            paper_best = better(pv, key=pv.get)
            ties = [k for k in pv if pv[k] == pv[paper_best]]
            if len(ties) > 1:
                raise ValueError(f"{where}: the paper's numbers tie between {ties}: no single best; state the claim "
                                 "as an equivalence (compare= with tolerance=)")
            if paper_best != self.best:
                raise ValueError(f"{where}: best={self.best!r} but the paper's numbers make {paper_best!r} best "
                                 f"({pv}); the table defines the claim (put a disagreeing text in note=)")
        if self.target is not None and not _is_number(self.target):
            raise ValueError(f"{where}: target must be a number, got {self.target!r}")

    def _paper_effect(self, where):
        pv = self.paper_value
        if pv is None:
            return None
        if self.compare is not None:
            return float(pv[self.compare[0]] - pv[self.compare[1]]) if isinstance(pv, Mapping) else float(pv)
        if self.best is not None:
            others = [v for k, v in pv.items() if k != self.best]
            return float(pv[self.best] - (max(others) if self.paper_higher_is_better else min(others)))
        if self.target is not None:
            return float(pv - self.target)
        return float(pv)

    def _is_equivalence(self, where) -> bool:
        if self.tolerance is None:
            return False
        if self.paper_effect is None:
            return True
        if self.proxy and self.paper_tolerance is None:
            raise ValueError(f"{where}: a proxy claim with tolerance= and paper numbers needs paper_tolerance= (in "
                             f"{self.paper_unit}) to decide whether the paper's effect is an equivalence")
        return abs(self.paper_effect) <= (self.paper_tolerance if self.paper_tolerance is not None else self.tolerance)

    def _expected_sign(self, where) -> int | None:
        typed = self.expected_sign
        if typed is not None and typed not in (-1, 1):
            raise ValueError(f"{where}: expected_sign must be +1 or -1, got {typed!r}")
        if self.paper_effect is not None:
            if typed is not None:
                raise ValueError(f"{where}: expected_sign is derived from paper_value ({self.paper_value}); remove "
                                 "the typed expected_sign (a text that disagrees with the table goes into note=)")
            if self.equivalence:
                return 0
            if self.paper_effect == 0:
                raise ValueError(f"{where}: the paper's numbers give a zero effect; state an equivalence claim with "
                                 "tolerance= and tolerance_why=")
            flip = 1 if self.paper_higher_is_better == self.higher_is_better else -1
            return _sign(self.paper_effect) * flip
        if self.equivalence:
            if typed is not None:
                raise ValueError(f"{where}: an equivalence claim (tolerance=) has no expected_sign")
            return 0
        if typed is None and (self.compare is not None or self.target is not None):
            raise ValueError(f"{where}: no paper numbers: type expected_sign=+1/-1 (qualitative claim; say in note= "
                             "which sentence of the paper it reads) or give paper_value")
        if self.best is not None:   # "x is best" without numbers: the direction is that of "better"
            if typed is not None:
                raise ValueError(f"{where}: a best= claim's direction follows from higher_is_better; remove "
                                 "expected_sign")
            return 1 if self.higher_is_better else -1
        return typed

    # -- derived
    @property
    def kind(self) -> str:
        if self.compare is not None:
            return "comparative"
        if self.best is not None:
            return "best"
        if self.target is not None:
            return "absolute"
        return "qualitative"


def check_definitions(claims) -> list:
    """Check a notebook's ``CLAIMS`` list: every entry a :class:`Claim`, ids unique. Raises ``ValueError`` listing
    every problem; returns the list. (Per-claim checks run when each ``Claim`` is built.)"""
    claims = list(claims)
    problems = [f"entry {i} is a {type(c).__name__}, not a Claim" for i, c in enumerate(claims)
                if not isinstance(c, Claim)]
    seen: dict[str, int] = {}
    for c in claims:
        if isinstance(c, Claim):
            seen[c.id] = seen.get(c.id, 0) + 1
    problems += [f"claim id {k!r} is used {n} times" for k, n in seen.items() if n > 1]
    problems += [f"claim {c.id!r} does not declare determined_by= (definition, initialisation or training)"
                 for c in claims if isinstance(c, Claim) and not c.declared]
    problems += [f"claim {c.id!r} has no paper_quote= (the sentence or table cell of the paper it tests, copied from "
                 "the paper); a reading the paper does not state is extension=True"
                 for c in claims if isinstance(c, Claim) and not c.extension and not c.paper_quote.strip()]
    if problems:
        raise ValueError("claim definitions: " + "; ".join(problems))
    return claims


# ---------------------------------------------------------------- evaluation
def _r(x, sig: int = 6):
    """Round to ``sig`` significant digits (claims.json is then stable across BLAS/platform noise)."""
    if x is None:
        return None
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"non-finite statistic {x}")
    return 0.0 if x == 0 else float(f"{x:.{sig}g}")


def _fmt(x, signed=True) -> str:
    return "?" if x is None else (f"{x:+.4g}" if signed else f"{x:.4g}")


@dataclass
class _Stat:
    """Internal result of one evidence computation."""
    ours: float | None
    ci: tuple | None
    mde: float | None
    n_items: int | None
    n_seeds: int | None
    method: str
    ours_is: str
    note: str = ""
    decided: str | None = None   # a verdict fixed by the evidence (by construction, unobtainable, ..., inconclusive)
    kind: str | None = None      # "trend" / "statistic" for claims whose evidence gives them their kind
    scored_in: str | None = None   # NotInProfile: the profile that scores the claim
    unit_why: str = ""             # default replication reason (from the evidence type)


def _series_pair(a, b, paired: bool, name: str):
    """Per-seed arrays from Series/arrays; [seeds, items] arrays are averaged over items."""
    n_items = None
    if paired:
        a, b = align_by_seed(a, b, name)
    a, b = _values(a, f"{name} a"), _values(b, f"{name} b")
    if a.ndim == 2 and b.ndim == 2:
        n_items = a.shape[1] if a.shape[1] == b.shape[1] else None
        a, b = a.mean(1), b.mean(1)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"{name}: per-seed values must be 1-D (or [seeds, items]), got shapes {a.shape}, {b.shape}")
    if paired and a.shape != b.shape:
        raise ValueError(f"{name}: paired=True needs the same seeds in both arms, got {len(a)} and {len(b)} values; "
                         "use paired=False (Welch) for arms trained on different seeds")
    return a, b, n_items


def align_by_seed(a, b, name: str = "Seeds"):
    """Join two arms' per-seed values on their seed index (paired comparisons pair by seed, never by row position).

    Both must be pandas Series indexed by seed (or DataFrames [seed x items]) with the same set of unique seeds; the
    result is ``(a, b)`` ordered by seed. A bare array is refused: pairing by position pairs the wrong seeds as soon as a
    table's rows are in another order."""
    for x, arm in ((a, "a"), (b, "b")):
        if not isinstance(x, (pd.Series, pd.DataFrame)):
            raise ValueError(f"{name}: paired=True needs arm {arm} as a pandas Series indexed by seed (e.g. "
                             f"df.groupby('seed').value.mean()), got {type(x).__name__}: a paired comparison joins the "
                             "arms on the seed, never on row position")
        if not x.index.is_unique:
            raise ValueError(f"{name}: arm {arm} has repeated seeds {sorted(set(x.index[x.index.duplicated()]))}")
    if set(a.index) != set(b.index):
        raise ValueError(f"{name}: paired arms need the same seeds, got {sorted(a.index)} and {sorted(b.index)}; "
                         "use paired=False (Welch) for arms trained on different seeds")
    order = sorted(a.index)
    return a.loc[order], b.loc[order]


def _diff_interval(a, b, paired: bool) -> Interval:
    return paired_t_interval(a, b) if paired else welch_interval(a, b)


def with_range_pseudo_pairs(d: np.ndarray, score_range) -> np.ndarray:
    """Add one pseudo-pair at each extreme of the difference range (hi - lo): bounded scores with identical answers
    then never give a zero-width interval (Agresti-Caffo style). Public so that a notebook's own summary tables
    (e.g. ``moelab.free_moe.report.domain_summary``) give the same interval as the claims file."""
    if score_range is None:
        return d
    lo, hi = score_range
    if not (_is_number(lo) and _is_number(hi) and hi > lo):
        raise ValueError(f"score_range must be (low, high) with high > low, got {score_range!r}")
    span = hi - lo
    return np.concatenate([d, [span, -span]])


def _stat_seeds(ev: Seeds, claim: Claim) -> _Stat:
    a_name, b_name = claim.compare or ("a", "b")
    ours_is = f"difference {a_name} - {b_name}"
    a, b, n_items = _series_pair(ev.a, ev.b, ev.paired, "Seeds")
    n_items = ev.n_items if ev.n_items is not None else n_items
    ours = float(a.mean() - b.mean()) if len(a) and len(b) else None
    n_seeds = min(len(a), len(b))
    if n_seeds < MIN_SEEDS:
        return _Stat(ours, None, None, n_items, n_seeds, "seed-level comparison", ours_is,
                     decided="inconclusive", note=f"{FEW_SEEDS} ({len(a)} vs {len(b)} seeds)")
    iv = _diff_interval(a, b, ev.paired)
    method = (f"paired t over {n_seeds} seeds (df={n_seeds - 1})" if ev.paired
              else f"Welch t over {len(a)} vs {len(b)} seeds (df={iv.df:.3g})")
    return _Stat(ours, (iv.low, iv.high), minimum_detectable_effect(iv.se, iv.df), n_items, n_seeds, method, ours_is)


def _stat_items(ev: Items, claim: Claim) -> _Stat:
    a_name, b_name = claim.compare or ("a", "b")
    a, b = _values(ev.a, "Items a"), _values(ev.b, "Items b")
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"Items takes aligned 1-D per-item scores of one fixed model pair, got shapes {a.shape} and "
                         f"{b.shape}; for trained models average items within each seed and use Seeds")
    ours = float(a.mean() - b.mean()) if len(a) else None
    d = with_range_pseudo_pairs(a - b, ev.score_range)
    if len(d) < 2:
        return _Stat(ours, None, None, len(a), 1, "paired t over items", f"difference {a_name} - {b_name}",
                     decided="inconclusive", note="fewer than 2 items")
    if ev.score_range is None and np.ptp(d) == 0:   # no spread: an interval would read "d [d, d]"
        return _Stat(ours, None, None, len(a), 1, "paired t over items", f"difference {a_name} - {b_name}",
                     decided="inconclusive", note=f"every item difference equals {d[0]:.4g}: no spread to build an "
                     "interval from (bounded scores: give score_range=)")
    iv = t_interval(d)
    method = f"paired t over {len(a)} items (models fixed by design)"
    if ev.score_range is not None:
        method += f", one pseudo-pair at each extreme of the range {tuple(ev.score_range)}"
    return _Stat(ours, (iv.low, iv.high), minimum_detectable_effect(iv.se, iv.df), len(a), 1, method,
                 f"difference {a_name} - {b_name}")


def _stat_options(ev: Options, claim: Claim) -> _Stat:
    x = claim.best
    scores = dict(ev.scores)
    if x not in scores or len(scores) < 2:
        raise ValueError(f"Options needs the claimed best {x!r} and at least one other option, got {list(scores)}")
    if ev.unit_of_replication not in ("seeds", "items"):
        raise ValueError(f"unit_of_replication must be 'seeds' or 'items', got {ev.unit_of_replication!r}")
    if ev.unit_of_replication == "seeds" and ev.paired:   # pair by seed: every option joined on the seed index
        keys = list(scores)
        for k in keys[1:]:
            scores[keys[0]], scores[k] = align_by_seed(scores[keys[0]], scores[k], f"Options[{k}]")
        order = list(scores[keys[0]].index)
        scores = {k: v.loc[order] for k, v in scores.items()}
    arrays = {k: _values(v, f"Options[{k}]") for k, v in scores.items()}
    n_items = ev.n_items
    if ev.unit_of_replication == "seeds" and all(v.ndim == 2 for v in arrays.values()):
        n_items = n_items or arrays[x].shape[1]
        arrays = {k: v.mean(1) for k, v in arrays.items()}
    if any(v.ndim != 1 for v in arrays.values()):
        raise ValueError(f"Options scores must be 1-D per {ev.unit_of_replication[:-1]}, got "
                         f"{ {k: v.shape for k, v in arrays.items()} }")
    sgn = 1 if claim.higher_is_better else -1
    means = {k: float(v.mean()) for k, v in arrays.items()}
    other = max((k for k in arrays if k != x), key=lambda k: sgn * means[k])
    winner = max(arrays, key=lambda k: sgn * means[k])
    ours = means[x] - means[other]
    ours_is = f"difference {x} - {other} (best other option by our mean)"
    note = f"our best: {winner}" + ("" if winner == x else f" (not {x})") + "; " + ", ".join(
        f"{k} {_fmt(m, False)}" for k, m in means.items())
    if ev.unit_of_replication == "seeds":
        paired = ev.paired and arrays[x].shape == arrays[other].shape
        n = min(len(arrays[x]), len(arrays[other]))
        if n < MIN_SEEDS:
            return _Stat(ours, None, None, n_items, n, "seed-level comparison", ours_is, decided="inconclusive",
                         note=f"{FEW_SEEDS}; {note}")
        iv = _diff_interval(arrays[x], arrays[other], paired)
        method = f"{'paired' if paired else 'Welch'} t over {n} seeds, {x} vs the best other option"
        return _Stat(ours, (iv.low, iv.high), minimum_detectable_effect(iv.se, iv.df), n_items, n, method, ours_is,
                     note)
    if arrays[x].shape != arrays[other].shape:
        raise ValueError(f"Options over items need aligned per-item scores, got {arrays[x].shape} and "
                         f"{arrays[other].shape}")
    d = with_range_pseudo_pairs(arrays[x] - arrays[other], ev.score_range)
    iv = t_interval(d)
    return _Stat(ours, (iv.low, iv.high), minimum_detectable_effect(iv.se, iv.df), len(arrays[x]), 1,
                 f"paired t over {len(arrays[x])} items, {x} vs the best other option", ours_is, note)


def _stat_level(ev: Level, claim: Claim) -> _Stat:
    if ev.unit_of_replication not in ("seeds", "items"):
        raise ValueError(f"unit_of_replication must be 'seeds' or 'items', got {ev.unit_of_replication!r}")
    v = _values(ev.values, "Level values").ravel()
    ours = float(v.mean()) if len(v) else None
    ours_is = f"level (target {claim.target:g})"
    n_seeds = len(v) if ev.unit_of_replication == "seeds" else 1
    n_items = len(v) if ev.unit_of_replication == "items" else ev.n_items
    need = MIN_SEEDS if ev.unit_of_replication == "seeds" else 2
    if len(v) < need:
        why = FEW_SEEDS if ev.unit_of_replication == "seeds" else "fewer than 2 items"
        return _Stat(ours, None, None, n_items, n_seeds, f"t-interval over {ev.unit_of_replication}", ours_is,
                     decided="inconclusive", note=why)
    iv = t_interval(v)
    return _Stat(ours, (iv.low, iv.high), minimum_detectable_effect(iv.se, iv.df), n_items, n_seeds,
                 f"t-interval of the mean over {len(v)} {ev.unit_of_replication}", ours_is)


def _stat_trend(ev: Trend, claim: Claim) -> _Stat:
    if not isinstance(ev.null, str) or not ev.null.strip():
        raise ValueError("Trend needs its null stated, e.g. null='no change of the metric with step'")
    steps = _values(ev.steps, "Trend steps")
    vals = _values(ev.values, "Trend values")
    if vals.ndim == 1:
        iv = ols_slope_interval(steps, vals)
        return _Stat(iv.estimate, (iv.low, iv.high), minimum_detectable_effect(iv.se, iv.df), ev.n_items, 1,
                     f"OLS slope over {len(steps)} steps (df={len(steps) - 2}); null: {ev.null}", "slope per step")
    slopes = np.array([ols_slope_interval(steps, row).estimate for row in vals])
    ours = float(slopes.mean())
    if len(slopes) < MIN_SEEDS:
        return _Stat(ours, None, None, ev.n_items, len(slopes), "per-seed OLS slopes", "slope per step",
                     decided="inconclusive", note=FEW_SEEDS)
    iv = t_interval(slopes)
    return _Stat(ours, (iv.low, iv.high), minimum_detectable_effect(iv.se, iv.df), ev.n_items, len(slopes),
                 f"t-interval of per-seed OLS slopes over {len(slopes)} seeds; null: {ev.null}", "slope per step")


def rise_then_fall_stats(values) -> np.ndarray:
    """Per-seed min(rise, fall) of :class:`RiseThenFall` for ``values`` [..., seeds, steps] (vectorised)."""
    v = np.asarray(values, dtype=float)
    post = v[..., 1:]
    n = post.shape[-1]
    early = post[..., : max(1, n // 2)].mean(-1)
    late = post[..., n - max(1, n // 3):].mean(-1)
    return np.minimum(early - v[..., 0], early - late)


def _stat_shape(ev: RiseThenFall, claim: Claim) -> _Stat:
    vals = _values(ev.values, "RiseThenFall values")
    if vals.ndim != 2 or vals.shape[1] < 4:
        raise ValueError(f"RiseThenFall needs [seeds, steps] with >= 4 steps (init + 3), got {vals.shape}")
    m = rise_then_fall_stats(vals)
    ours = float(m.mean())
    ours_is = "min(rise, fall) per seed (early - init, early - late)"
    if len(m) < MIN_SEEDS:
        return _Stat(ours, None, None, ev.n_items, len(m), "per-seed rise/fall", ours_is, decided="inconclusive",
                     note=FEW_SEEDS, kind="trend")
    iv = t_interval(m)
    return _Stat(ours, (iv.low, iv.high), minimum_detectable_effect(iv.se, iv.df), ev.n_items, len(m),
                 f"t-interval over {len(m)} seeds of min(rise, fall): rise = mean of the first half of the post-init "
                 "steps - init, fall = that mean - mean of the last third (a monotone rise has fall <= 0)", ours_is,
                 kind="trend")


_ALLOWED = {Seeds: ("comparative",), Items: ("comparative",), Options: ("best",), Level: ("absolute",),
            Trend: ("qualitative",), RiseThenFall: ("qualitative",)}


def _compute(ev, claim: Claim) -> _Stat:
    kind = claim.kind
    if type(ev) in _ALLOWED and kind not in _ALLOWED[type(ev)]:
        raise ValueError(f"{type(ev).__name__} evidence does not fit a {kind} claim (it fits "
                         f"{_ALLOWED[type(ev)][0]} claims: compare=, best=, target= or none)")
    units = {Seeds: lambda e: e.units, Items: lambda e: e.units, Level: lambda e: e.units,
             Options: lambda e: tuple((e.units or {}).values())}.get(type(ev))
    if units is not None:
        u = _unit_check(list(units(ev) or ()), f"{type(ev).__name__} evidence")
        if u is not None and u != claim.unit:
            raise ValueError(f"evidence unit {u!r} differs from the claim's unit {claim.unit!r}")
    if isinstance(ev, Seeds):
        return _stat_seeds(ev, claim)
    if isinstance(ev, Items):
        return _stat_items(ev, claim)
    if isinstance(ev, Options):
        return _stat_options(ev, claim)
    if isinstance(ev, Level):
        return _stat_level(ev, claim)
    if isinstance(ev, (Trend, Precomputed, RiseThenFall)) and claim.expected_sign is None:
        raise ValueError(f"{type(ev).__name__} evidence needs a direction: paper_value (the paper's signed effect) or "
                         "a typed expected_sign for a qualitative claim")
    if isinstance(ev, RiseThenFall):
        return _stat_shape(ev, claim)
    if isinstance(ev, Trend):
        st = _stat_trend(ev, claim)
        st.kind = "trend"
        return st
    ours_is = {"comparative": f"difference {' - '.join(claim.compare or ())}",
               "best": f"difference {claim.best} - best other option", "absolute": "level"}.get(kind, "")
    if isinstance(ev, Precomputed):
        if not ev.method.strip():
            raise ValueError("Precomputed needs its method named")
        ci = None if ev.ci_low is None else (float(ev.ci_low), float(ev.ci_high))
        if ci is not None and ci[0] > ci[1]:
            raise ValueError(f"Precomputed interval is reversed: [{ci[0]}, {ci[1]}]")
        return _Stat(ev.ours, ci, ev.mde, ev.n_items, ev.n_seeds, ev.method, ours_is or f"statistic ({ev.method})",
                     kind=None if ours_is else "statistic")
    if isinstance(ev, ByConstruction):
        if ev.which not in ("definition", "initialisation"):
            raise ValueError(f"ByConstruction.which must be 'definition' or 'initialisation', got {ev.which!r}")
        if not ev.reason.strip():
            raise ValueError("ByConstruction needs the reason")
        if ev.ours is not None and ev.holds is None:
            raise ValueError("ByConstruction with a measured value (ours=) needs holds= (whether the value satisfies "
                             "the identity or threshold the reason states)")
        if ev.holds is False:
            raise ClaimEvidenceError(f"claim {claim.id!r}: failed check: the measured value {ev.ours!r} breaks the "
                                     f"identity it states ({ev.reason}); a broken identity is a bug, not a label")
        return _Stat(ev.ours, None, None, None, None, f"holds by {ev.which}", ours_is or "value",
                     decided="holds by construction", note=f"true of the {ev.which} alone: {ev.reason}")
    if isinstance(ev, (Unobtainable, NotInProfile, OutsideRegime, Insufficient)):
        why = ev.check if isinstance(ev, OutsideRegime) else ev.reason
        if not why.strip():
            raise ValueError(f"{type(ev).__name__} needs its reason")
        label = {Unobtainable: "unobtainable", NotInProfile: "not in this profile", OutsideRegime: "outside the regime",
                 Insufficient: "inconclusive"}[type(ev)]
        if isinstance(ev, NotInProfile):
            why = f"scored by the {ev.profile} profile: {ev.reason}"
        elif isinstance(ev, OutsideRegime):
            why = f'regime check failed ("{ev.check}")' + (f"; {ev.reason}" if ev.reason else "")
        st = _Stat(None, None, None, None, None, "", ours_is or "value", decided=label, note=why)
        st.scored_in = ev.profile if isinstance(ev, NotInProfile) else None
        return st
    raise ValueError(f"evidence must be one of {[t.__name__ for t in EVIDENCE_TYPES]}, got {type(ev).__name__}")


def _verdict(claim: Claim, st: _Stat) -> tuple[str, str]:
    """The verdict rule of docs/CLAIMS.md (in order) and its one-line reason."""
    if st.decided is not None:
        return st.decided, st.note
    if st.ci is None:
        return "inconclusive", "no interval" + (f"; {st.note}" if st.note else "")
    lo, hi = st.ci
    shift = claim.target if claim.kind == "absolute" else 0.0   # absolute claims test level - target
    dlo, dhi = lo - shift, hi - shift
    what = "level - target" if claim.kind == "absolute" else "ours"
    ivs = f"{what} {_fmt(st.ours - shift if st.ours is not None else None)} [{_fmt(dlo)}, {_fmt(dhi)}]"
    if claim.equivalence:
        tol = claim.tolerance
        if -tol <= dlo and dhi <= tol:
            return "reproduced", f"{ivs} lies inside ±{tol:g} (equivalence)"
        if dlo > tol or dhi < -tol:
            return "contradicted", f"{ivs} lies entirely outside ±{tol:g} (equivalence)"
        if st.mde is not None and tol < st.mde and not claim.proxy:
            return "underpowered", f"{ivs} overlaps ±{tol:g}; the tolerance is below our MDE {st.mde:.3g}"
        return "inconclusive", f"{ivs} overlaps the edge of ±{tol:g}"
    if dlo > 0 or dhi < 0:
        if claim.expected_sign is None:
            raise ValueError("a directional verdict needs expected_sign (paper numbers or a typed sign)")
        sign = 1 if dlo > 0 else -1
        side = "the paper's direction" if sign == claim.expected_sign else "the direction opposite to the paper's"
        return ("reproduced" if sign == claim.expected_sign else "contradicted"), f"{ivs} excludes 0 in {side}"
    pe = claim.paper_effect
    same_frame = claim.paper_higher_is_better == claim.higher_is_better
    if pe is not None and not claim.proxy and same_frame and not (dlo <= pe <= dhi):
        # the interval includes 0 and excludes the paper's effect (same metric, same unit): a statement of magnitude
        return "smaller than reported", (f"{ivs} includes 0 but excludes the paper's effect {_fmt(pe)} "
                                         f"{claim.paper_unit}")
    if pe is not None and not claim.proxy and st.mde is not None and abs(pe) < st.mde:
        return "underpowered", (f"{ivs} includes 0; the paper's effect {abs(pe):.3g} {claim.paper_unit} is below our "
                                f"MDE {st.mde:.3g}")
    why = ("proxy metric: decided on sign only" if claim.proxy else
           "the paper gives no number" if pe is None else
           f"our MDE {st.mde:.3g} is below the paper's effect {abs(pe):.3g}" if st.mde is not None else "")
    return "inconclusive", f"{ivs} includes 0" + (f"; {why}" if why else "")


def _unit_why(ev) -> str:
    """The default reason why the evidence's unit of replication is the right one for the comparison."""
    seeds = "seeds are the unit: the compared models were trained, so seed-to-seed variation is the comparison's " \
            "noise (items are averaged within each seed)"
    items = "items are the unit: the compared quantities come from models fixed by design (no training between " \
            "them), paired by item"
    if isinstance(ev, Seeds):
        return seeds
    if isinstance(ev, Items):
        return items
    if isinstance(ev, (Options, Level)):
        return seeds if ev.unit_of_replication == "seeds" else items
    if isinstance(ev, (Trend, RiseThenFall)):
        return "seeds are the unit: one statistic per seed on a fixed held-out batch at fixed steps"
    if isinstance(ev, Precomputed):
        return f"as the test resamples: {ev.method.split(';')[0]}"
    return ""


def _regime_dict(reg) -> dict | None:
    if reg is None:
        return None
    return {"check": str(reg.check), "value": str(reg.value), "passed": bool(reg.passed)}


def record(claim: Claim, st: _Stat, verdict: str, reason: str, regime=None, unit_why: str = "",
           sources=()) -> dict:
    """The claim record (field order fixed; see ``moelab.claims.schema``)."""
    pv = claim.paper_value
    pv = {k: _r(v) for k, v in pv.items()} if isinstance(pv, Mapping) else _r(pv)
    ci = st.ci if st.ci is not None and verdict not in ("holds by construction", "unobtainable",
                                                        "not in this profile") else (None, None)
    reasons = [r for r in (reason, claim.note) if r]
    if st.note and st.note not in reason:
        reasons.insert(1, st.note)
    why = claim.replication or unit_why
    n = (f"{st.n_seeds if st.n_seeds is not None else '?'} seed(s) x {st.n_items if st.n_items is not None else '?'} "
         "item(s)") if (st.n_seeds is not None or st.n_items is not None) else ""
    replication = f"{n}: {why}" if n and why else why
    proxy_for = claim.proxy_for if claim.proxy else f"none: ours is the paper's metric ({claim.paper_metric})"
    return {
        "id": claim.id, "claim": claim.claim, "paper_ref": claim.paper_ref, "paper_quote": claim.paper_quote,
        "metric": claim.metric, "unit": claim.unit, "higher_is_better": bool(claim.higher_is_better),
        "paper_metric": claim.paper_metric, "paper_unit": claim.paper_unit, "proxy": bool(claim.proxy),
        "paper_value": pv, "paper_effect": _r(claim.paper_effect), "expected_sign": claim.expected_sign,
        "target": _r(claim.target), "tolerance": _r(claim.tolerance),
        "kind": st.kind or claim.kind, "ours_is": st.ours_is, "ours": _r(st.ours), "ci_low": _r(ci[0]), "ci_high": _r(ci[1]),
        "n_items": None if st.n_items is None else int(st.n_items),
        "n_seeds": None if st.n_seeds is None else int(st.n_seeds),
        "mde": _r(st.mde), "verdict": verdict, "reason": "; ".join(reasons).replace("\n", " "), "method": st.method,
        "determined_by": claim.determined_by, "regime": _regime_dict(regime), "replication": replication,
        "proxy_for": proxy_for, "scored_in": st.scored_in, "sources": sorted(sources),
    }


def _gate(claim: Claim, st: _Stat, verdict: str, reason: str, reg, reg_missing: str) -> tuple[str, str]:
    """The gates which never look at the answer: extension, unobtainable / another profile, the regime check, a
    circular row; then a zero-width interval is flagged. A quantity fixed by the definition or the initialisation is
    no longer a gate (issue 47): a fixed object is tested like any other; only ``ByConstruction`` evidence (an
    identity, checked) gives ``holds by construction``."""
    if claim.extension:
        return "extension", f"not a claim of the paper; as a test it would read {verdict}: {reason}"
    if verdict in ("unobtainable", "not in this profile", "outside the regime", "holds by construction") \
            or st.decided == "inconclusive":
        return verdict, reason   # undecided for a reason of its own (missing table, proxy guard, few seeds)
    if reg_missing:
        return ("inconclusive" if verdict in DECISIVE + ("underpowered",) else verdict), \
            f"the regime check {reg_missing}; measured: {reason}"
    if reg is not None and not reg.passed:
        return "outside the regime", f'regime check failed ("{reg.check}"): {reg.value}; measured anyway: {reason}'
    if claim.circular and verdict in DECISIVE + ("underpowered",):
        return "inconclusive", (f"circular: {claim.circular}; the quantity was chosen to come out this way, so it "
                                f"cannot decide; as a test it would read {verdict}: {reason}")
    if verdict in DECISIVE and st.ci is not None and st.ci[0] == st.ci[1]:
        reason += (f"; degenerate interval [{_fmt(st.ci[0])}, {_fmt(st.ci[1])}] (zero width: every resample "
                   f"identical); the test that decided: {st.method}")
    return verdict, reason


def evaluate(claim: Claim, tables: Tables) -> dict:
    """Evaluate one claim on a folder's tables: its record (a :class:`MissingTable` -> ``inconclusive``, the reason
    naming the table and that the next run produces it)."""
    if not isinstance(claim, Claim):
        raise ValueError(f"evaluate needs a Claim, got {type(claim).__name__}")
    if isinstance(tables, Tables):
        tables.reads = []
    try:
        ev = claim.evidence(tables)
    except MissingTable as e:
        ev = Insufficient(str(e))
    if isinstance(ev, ByConstruction) and not claim.declared:   # an ad-hoc claim (tests): the evidence says which
        claim.determined_by = ev.which
    if isinstance(ev, ByConstruction) and ev.which != claim.determined_by:
        raise ValueError(f"claim {claim.id!r}: ByConstruction({ev.which!r}) evidence on a claim determined_by="
                         f"{claim.determined_by!r}: the gate must not depend on the answer (declare determined_by)")
    st = _compute(ev, claim)
    verdict, reason = _verdict(claim, st)
    reg, reg_missing = None, ""
    if claim.regime is not None:
        try:
            reg = claim.regime(tables) if callable(claim.regime) else claim.regime
        except MissingTable as e:
            reg_missing = str(e)
    verdict, reason = _gate(claim, st, verdict, reason, reg, reg_missing)
    return record(claim, st, verdict, reason, reg, _unit_why(ev), tables.reads if isinstance(tables, Tables) else ())
