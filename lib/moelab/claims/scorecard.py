"""The README scorecard (issue 14, item 7): verdict counts per notebook and profile, then one row per claim with the
paper's value and unit, our difference and unit, its 95% interval, the MDE, seeds x items and the verdict."""
from __future__ import annotations

import json
from pathlib import Path

from moelab.claims.engine import VERDICTS


def _g(x) -> str:
    return "" if x is None else f"{x:.4g}"


def _s(x) -> str:
    return "" if x is None else f"{x:+.4g}"


def _cell(s) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def paper_cell(c: dict) -> str:
    """The paper's value(s) and unit, and its signed effect for comparative/best claims."""
    if "paper_unit" not in c:   # a record of the old (v1) format
        return _cell(c.get("paper", ""))
    pv, unit, eff = c["paper_value"], c["paper_unit"], c["paper_effect"]
    if pv is None:
        sign = {1: "expects ours > 0", -1: "expects ours < 0", 0: "expects ours ≈ 0"}.get(c["expected_sign"], "")
        return f"qualitative ({sign})" if sign else "qualitative"
    if isinstance(pv, dict):
        vals = " vs ".join(f"{k} {_g(v)}" for k, v in pv.items())
        return f"{vals}: {_s(eff)} {unit}" if eff is not None else f"{vals} {unit}"
    if c["kind"] == "absolute":
        return f"{_g(pv)} {unit}"
    return f"{_s(pv)} {unit}"


def ours_cell(c: dict) -> str:
    if "ours_is" not in c:
        return _g(c.get("ours"))
    if c["ours"] is None:
        return ""
    if c["kind"] == "absolute":
        return f"{_g(c['ours'])} {c['unit']} (level)"
    if c["kind"] == "trend":
        return f"{_s(c['ours'])} {c['unit']}/step"
    return f"{_s(c['ours'])} {c['unit']}"


def ci_cell(c: dict) -> str:
    if c.get("ci_low") is None:
        return ""
    return f"[{_g(c['ci_low'])}, {_g(c['ci_high'])}]"


def n_cell(c: dict) -> str:
    s, i = c.get("n_seeds"), c.get("n_items")
    if s is None and i is None:
        return ""
    return f"{'?' if s is None else s} x {'?' if i is None else i}"


def load_claims_files(root) -> list[tuple[str, str, list]]:
    """(notebook, profile, records) for every claims.json under ``root``, in path order."""
    out = []
    for f in sorted(Path(root).glob("**/claims.json")):
        data = json.loads(f.read_text())
        prov = data.get("provenance", {})
        out.append((prov.get("notebook", f.parent.name), prov.get("profile", ""), data.get("claims", [])))
    return out


def counts_markdown(files) -> str:
    lines = ["| notebook | profile | " + " | ".join(VERDICTS) + " | total |",
             "|---|---|" + "---|" * (len(VERDICTS) + 1)]
    for nb, profile, recs in files:
        n = [sum(r.get("verdict") == v for r in recs) for v in VERDICTS]
        lines.append(f"| {nb} | {profile} | " + " | ".join(str(k) for k in n) + f" | {len(recs)} |")
    return "\n".join(lines)


def scorecard_markdown(root) -> str:
    """Markdown for the README: the verdict counts per notebook and profile, then the per-claim table."""
    files = load_claims_files(root)
    lines = ["| notebook | profile | claim | paper (value, unit) | ours (difference, unit) | 95% CI | MDE | "
             "seeds x items | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for nb, profile, recs in files:
        for c in recs:
            ref = f" ({c['paper_ref']})" if c.get("paper_ref") else ""
            lines.append(f"| {nb} | {profile} | {_cell(c.get('claim', ''))}{_cell(ref)} | {_cell(paper_cell(c))} | "
                         f"{_cell(ours_cell(c))} | {ci_cell(c)} | {_g(c.get('mde'))} | {n_cell(c)} | "
                         f"{c.get('verdict', '')} |")
    return counts_markdown(files) + "\n\n" + "\n".join(lines)
