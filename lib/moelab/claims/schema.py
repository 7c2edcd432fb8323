"""The claim record schema, validated on save: a missing or ill-typed field is an error.

Every record in ``figures/**/claims.json`` has exactly the fields of :data:`FIELDS` (in that order). ``ours`` is a
difference for every comparative or "best" claim (``ours_is`` starts with "difference"), a level only for absolute
claims, a slope for trends.
"""
from __future__ import annotations

import math
from typing import Any

from moelab.claims.engine import DECISIVE, DETERMINED_BY, KINDS, VERDICTS

_NUM = (int, float)
_OPT_NUM = (int, float, type(None))
_OPT_INT = (int, type(None))

# field -> accepted types
FIELDS: dict[str, tuple] = {
    "id": (str,), "claim": (str,), "paper_ref": (str,), "paper_quote": (str,),
    "metric": (str,), "unit": (str,), "higher_is_better": (bool,),
    "paper_metric": (str,), "paper_unit": (str,), "proxy": (bool,),
    "paper_value": (dict, int, float, type(None)), "paper_effect": _OPT_NUM, "expected_sign": _OPT_INT,
    "target": _OPT_NUM, "tolerance": _OPT_NUM,
    "kind": (str,), "ours_is": (str,), "ours": _OPT_NUM, "ci_low": _OPT_NUM, "ci_high": _OPT_NUM,
    "n_items": _OPT_INT, "n_seeds": _OPT_INT, "mde": _OPT_NUM,
    "verdict": (str,), "reason": (str,), "method": (str,),
    # the referee's checklist (required non-empty on every decisive row)
    "determined_by": (str,), "regime": (dict, type(None)), "replication": (str,), "proxy_for": (str,),
    "scored_in": (str, type(None)), "sources": (list,),
}
RECORD_KINDS = KINDS
DECIDED = DECISIVE
CHECKLIST = ("determined_by", "regime", "replication", "proxy_for")


def required_checklist(rec: dict) -> tuple:
    """The checklist fields a decisive record must fill: all of :data:`CHECKLIST` for a trained stand-in; a fixed
    object (determined by the definition or the initialisation: an encoder's clusters, a model at initialisation) may
    have no regime check."""
    return CHECKLIST if rec.get("determined_by") == "training" else tuple(k for k in CHECKLIST if k != "regime")


def validate_record(rec: Any) -> dict:
    """Raise ``ValueError`` naming the claim and the field when ``rec`` does not follow the schema; return it."""
    if not isinstance(rec, dict):
        raise ValueError(f"a claim record must be a dict, got {type(rec).__name__}")
    who = f"claim record {rec.get('id', rec.get('claim', '?'))!r}"
    missing = [k for k in FIELDS if k not in rec]
    extra = [k for k in rec if k not in FIELDS]
    if missing or extra:
        raise ValueError(f"{who}: missing fields {missing}, unknown fields {extra} (rebuild it with "
                         "`python -m moelab.claims rebuild FOLDER`)")
    for k, types in FIELDS.items():
        v = rec[k]
        if isinstance(v, bool) and bool not in types:
            raise ValueError(f"{who}: {k} must be {'/'.join(t.__name__ for t in types)}, got a bool")
        if not isinstance(v, types):
            raise ValueError(f"{who}: {k} must be {'/'.join(t.__name__ for t in types)}, got {type(v).__name__} {v!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{who}: {k} is not finite ({v})")
    for k in ("id", "claim", "paper_ref", "metric", "unit", "reason"):
        if not rec[k].strip():
            raise ValueError(f"{who}: {k} is empty")
    if isinstance(rec["paper_value"], dict) and not all(
            isinstance(v, _NUM) and not isinstance(v, bool) for v in rec["paper_value"].values()):
        raise ValueError(f"{who}: paper_value entries must be numbers, got {rec['paper_value']}")
    if rec["verdict"] not in VERDICTS:
        raise ValueError(f"{who}: verdict {rec['verdict']!r} is not one of {VERDICTS}")
    if rec["kind"] not in RECORD_KINDS:
        raise ValueError(f"{who}: kind {rec['kind']!r} is not one of {RECORD_KINDS}")
    if rec["expected_sign"] not in (None, -1, 0, 1):
        raise ValueError(f"{who}: expected_sign must be -1, 0 (equivalence), +1 or null, got {rec['expected_sign']}")
    if rec["kind"] in ("comparative", "best") and not rec["ours_is"].startswith("difference"):
        raise ValueError(f"{who}: a {rec['kind']} claim's ours must be a difference, ours_is={rec['ours_is']!r}")
    if rec["kind"] == "absolute" and rec["target"] is None:
        raise ValueError(f"{who}: an absolute claim needs its target")
    if (rec["ci_low"] is None) != (rec["ci_high"] is None):
        raise ValueError(f"{who}: ci_low and ci_high must both be given or both be null")
    if rec["ci_low"] is not None and rec["ci_low"] > rec["ci_high"]:
        raise ValueError(f"{who}: reversed interval [{rec['ci_low']}, {rec['ci_high']}]")
    if rec["verdict"] in DECIDED and rec["ci_low"] is None:
        raise ValueError(f"{who}: verdict {rec['verdict']!r} needs an interval")
    if rec["verdict"] in DECIDED and rec["expected_sign"] is None:
        raise ValueError(f"{who}: verdict {rec['verdict']!r} needs the expected sign")
    if rec["verdict"] == "underpowered" and rec["mde"] is None:
        raise ValueError(f"{who}: verdict 'underpowered' needs the MDE")
    if rec["determined_by"] not in DETERMINED_BY:
        raise ValueError(f"{who}: determined_by must be one of {DETERMINED_BY}, got {rec['determined_by']!r}")
    if rec["regime"] is not None and set(rec["regime"]) != {"check", "value", "passed"}:
        raise ValueError(f"{who}: regime must have exactly check, value, passed; got {sorted(rec['regime'])}")
    if rec["verdict"] != "extension" and not rec["paper_quote"].strip():
        raise ValueError(f"{who}: a paper claim needs paper_quote (the sentence or table cell it tests)")
    if rec["verdict"] in DECIDED:
        if rec["regime"] is not None and not rec["regime"]["passed"]:
            raise ValueError(f"{who}: decisive verdict with a failed regime check")
    if rec["verdict"] == "not in this profile" and not rec["scored_in"]:
        raise ValueError(f"{who}: 'not in this profile' must name the profile that scores it (scored_in)")
    if rec["verdict"] == "underpowered" and rec["proxy"]:
        raise ValueError(f"{who}: a proxy row is inconclusive or decisive, never underpowered")
    if rec["method"].startswith("holds by") and rec["verdict"] not in ("holds by construction", "extension", "dry run"):
        raise ValueError(f"{who}: evidence that holds by construction cannot be {rec['verdict']!r}")
    for k in ("n_items", "n_seeds"):
        if rec[k] is not None and rec[k] < 0:
            raise ValueError(f"{who}: {k} must be >= 0, got {rec[k]}")
    return rec


def check_checklist(rec: dict) -> dict:
    """A decisive record must carry the referee's checklist (determined_by, regime, replication, proxy_for);
    an empty field raises ``ValueError`` (called by ``rebuild`` and ``check`` on every record of a notebook)."""
    if rec["verdict"] in DECIDED:
        need = required_checklist(rec)
        empty = [k for k in need if not rec[k] or (k == "regime" and not str(rec[k]["check"]).strip())]
        if empty:
            raise ValueError(f"claim record {rec['id']!r}: decisive verdict {rec['verdict']!r} with empty checklist "
                             f"field(s) {empty} (give the claim determined_by=, regime=, proxy_for=)")
    return rec


def validate_file(data: Any) -> dict:
    """Validate a whole claims.json payload: ``{"provenance": {...}, "engine": str, "claims": [records]}``."""
    if not isinstance(data, dict) or set(data) != {"provenance", "engine", "claims"}:
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"claims.json must have exactly the keys provenance, engine, claims; got {keys}")
    if not isinstance(data["provenance"], dict) or not isinstance(data["engine"], str):
        raise ValueError("claims.json: provenance must be an object and engine a string")
    if not isinstance(data["claims"], list):
        raise ValueError("claims.json: claims must be a list")
    ids = [validate_record(r)["id"] for r in data["claims"]]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"claims.json: duplicate claim ids {dup}")
    return data
