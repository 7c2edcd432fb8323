"""The verdict summaries, rendered as Markdown from every ``claims.json`` under a figures root: the README scorecard
(counts by label per notebook and profile), docs/RESULTS.md with one row per claim (paper's value and unit, our
difference and unit, its 95% interval, the MDE, seeds x items, the label, the reason in a few words, the table it comes
from; extensions apart), and docs/claims-review.md, the referee's checklist of every decisive verdict. (The
model-benchmark scorecard is a different thing: ``moelab.suite.scorecard``.)"""
from __future__ import annotations

import json
import re
from pathlib import Path

from moelab.claims.engine import DECISIVE, VERDICTS
from moelab.claims.schema import required_checklist


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


# the paper's totals; extensions are counted apart; a dry run (issue 51) is never published
LABELS = tuple(v for v in VERDICTS if v not in ("extension", "dry run"))


def short_reason(c: dict, width: int = 90) -> str:
    """The reason in a few words: its first clause, cut at ``width`` characters."""
    r = str(c.get("reason", "")).split("; ")[0]
    failed = re.match(r'regime check failed \("(.*?)"\)(?:: (.*))?$', r, re.S)   # what failed, else the check
    if failed:
        r = failed.group(2) or failed.group(1)
    return r if len(r) <= width else r[: width - 1].rstrip() + "…"


def label_cell(c: dict, others: dict) -> str:
    """The label; a ``not in this profile`` row points to the verdict of the profile that scores it."""
    v = c.get("verdict", "")
    if v == "not in this profile" and c.get("scored_in"):
        there = others.get((c.get("scored_in"), c.get("id")))
        return f"→ {c['scored_in']}: {there}" if there else f"→ {c['scored_in']}"
    return v


def counts_markdown(files) -> str:
    """Counts by label per notebook and profile (extensions in their own column, outside the total)."""
    lines = ["| notebook | profile | " + " | ".join(LABELS) + " | total (paper claims) | extension |",
             "|---|---|" + "---|" * (len(LABELS) + 2)]
    for nb, profile, recs in files:
        paper = [r for r in recs if r.get("verdict") != "extension"]
        n = []
        for v in LABELS:
            k = sum(r.get("verdict") == v for r in paper)
            if v == "not in this profile" and k:
                where = sorted({r.get("scored_in") or "?" for r in paper if r.get("verdict") == v})
                n.append(f"{k} (→ {', '.join(where)})")
            else:
                n.append(str(k))
        ext = len(recs) - len(paper)
        lines.append(f"| {nb} | {profile} | " + " | ".join(n) + f" | {len(paper)} | {ext} |")
    return "\n".join(lines)


def _folder_of(root: Path, nb: str, profile: str) -> str:
    return f"{Path(root).name}/{nb}" + ("" if profile == "default" else f"/{profile}")


def _source_links(c: dict, folder: str, prefix: str) -> str:
    return ", ".join(f"[{s}]({prefix}{folder}/{s})" for s in c.get("sources") or []) or "—"


def results_markdown(root, prefix: str = "../") -> str:
    """docs/RESULTS.md: per paper (notebook), one table of the paper's claims over both profiles, then one of its
    extensions; every row links to the saved table(s) it is computed from (``prefix`` + figures/...)."""
    root = Path(root)
    files = load_claims_files(root)
    scored = {(profile, c.get("id")): c.get("verdict") for nb, profile, recs in files for c in recs}
    by_nb: dict[str, list] = {}
    for nb, profile, recs in files:
        by_nb.setdefault(nb, []).append((profile, recs))
    head = ("| profile | claim (paper reference) | paper (value, unit) | ours (difference, unit) | 95% CI | MDE | "
            "seeds x items | label | reason (short) | from |\n|---|---|---|---|---|---|---|---|---|---|")
    out = ["# Results: every claim, per paper", "",
           "Generated by `python -m moelab.runner readme` from the committed `figures/**/claims.json` (do not "
           "edit). Labels and the verdict rule: docs/CLAIMS.md. A row labelled `→ <profile>: <verdict>` is scored by "
           "that profile (not in this profile). Extensions are checks that are not claims of the paper: their own "
           "table, never counted in the paper's totals. The referee's checklist of every decisive row: "
           "docs/claims-review.md.", "", "## Counts", "", counts_markdown(files)]
    for nb, groups in by_nb.items():
        rows, ext = [], []
        for profile, recs in groups:
            folder = _folder_of(root, nb, profile)
            others = {(p, i): v for (p, i), v in scored.items() if p != profile}
            for c in recs:
                ref = f" ({c['paper_ref']})" if c.get("paper_ref") else ""
                row = (f"| {profile} | {_cell(c.get('claim', ''))}{_cell(ref)} | {_cell(paper_cell(c))} | "
                       f"{_cell(ours_cell(c))} | {ci_cell(c)} | {_g(c.get('mde'))} | {n_cell(c)} | "
                       f"{_cell(label_cell(c, others))} | {_cell(short_reason(c))} | "
                       f"{_source_links(c, folder, prefix)} |")
                (ext if c.get("verdict") == "extension" else rows).append(row)
        out += ["", f"## {nb}", "", "### Claims of the paper", "", head, *rows]
        if ext:
            out += ["", "### Extensions (not claims of the paper)", "", head, *ext]
    return "\n".join(out) + "\n"


HEADLINE_PROFILES = ("full", "default")   # the profile a notebook's headline comes from: the largest committed


def _claim_words(c: dict, width: int = 70) -> str:
    """A claim in a few words: its text up to the first colon, cut at ``width`` characters."""
    t, depth = str(c.get("claim", c.get("id", ""))), 0
    for i, ch in enumerate(t):   # the first ": " outside parentheses ("... (paper: better)" stays whole)
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and t.startswith(": ", i):
            t = t[:i]
            break
    return t if len(t) <= width else t[: width - 1].rstrip() + "…"


def _number_words(c: dict) -> str:
    """Ours, its 95% interval and its unit, leaving out what the record lacks."""
    return " ".join(x for x in (_s(c.get("ours")), ci_cell(c), c.get("unit", "")) if x)


def headlines_markdown(files, most: int = 2) -> str:
    """One line per notebook: the decisive verdicts (reproduced / contradicted) of its largest committed profile
    (:data:`HEADLINE_PROFILES`), up to ``most`` per label with ours and the 95% interval; a notebook with none says
    what its claims are instead (the most frequent labels)."""
    by_nb: dict[str, dict[str, list]] = {}
    for nb, profile, claims in files:
        by_nb.setdefault(nb, {})[profile] = claims
    lines = []
    for nb in sorted(by_nb):
        profile = next((p for p in HEADLINE_PROFILES if p in by_nb[nb]), None)
        if profile is None:
            continue
        claims = [c for c in by_nb[nb][profile] if c.get("verdict") in LABELS]
        parts = []
        for label in DECISIVE:
            hits = [c for c in claims if c["verdict"] == label]
            if hits:
                shown = "; ".join(f"{_claim_words(c)} ({_number_words(c)})" for c in hits[:most])
                more = f"; and {len(hits) - most} more" if len(hits) > most else ""
                parts.append(f"{label} {len(hits)}: {shown}{more}")
        if not parts:
            counts = sorted({v: sum(c["verdict"] == v for c in claims) for v in LABELS}.items(), key=lambda kv: -kv[1])
            parts.append("no decisive verdict (" + ", ".join(f"{n} {v}" for v, n in counts if n)[:200] + ")")
        lines.append(f"- **{nb}** ({profile}): " + "; ".join(parts).replace("|", "\\|"))
    return "\n".join(lines)


def scorecard_markdown(root, results_link: str = "docs/RESULTS.md") -> str:
    """The README block: counts by label per notebook and profile (the paper's claims; extensions apart), the
    decisive verdicts of each notebook in a line (:func:`headlines_markdown`), pointing to the full per-claim tables
    in ``results_link``."""
    files = load_claims_files(root)
    return (counts_markdown(files) + "\n\nDecisive verdicts of each notebook's largest committed profile:\n\n"
            + headlines_markdown(files) + f"\n\nEvery claim, with its numbers, label, reason and source table: "
            f"[{results_link}]({results_link}); the referee's checklist of every decisive verdict: "
            "[docs/claims-review.md](docs/claims-review.md). `→ full` / `→ default`: the claims that profile scores.")




def review_rows(root) -> tuple[list[tuple], list[str]]:
    """(folder, record) of every decisive verdict under ``root``, and the problems (an empty checklist field)."""
    rows, problems = [], []
    for f in sorted(Path(root).glob("**/claims.json")):
        data = json.loads(f.read_text())
        for c in data.get("claims", []):
            if c.get("verdict") not in DECISIVE:
                continue
            folder = str(f.parent.relative_to(Path(root).parent)) if Path(root).parent in f.parents else str(f.parent)
            rows.append((folder, c))
            empty = [k for k in required_checklist(c) + ("paper_quote",) if not c.get(k)]
            if empty:
                problems.append(f"{folder}: {c.get('id')} ({c.get('verdict')}) has empty {empty}")
    return rows, problems


def _regime_text(r) -> str:
    if not r:
        return ""
    return f"{r['check']}: {r['value']} ({'passed' if r['passed'] else 'failed'})"


NOTES_MARKER = "## Notes from an independent read"


def review_markdown(root, keep_notes: str = "") -> str:
    """docs/claims-review.md: the referee's checklist of every decisive verdict in the committed folders, then every
    paper claim with the sentence of the paper it tests (``paper_quote``), so that a reader can check each row beside
    the paper. ``keep_notes``: the hand-written notes section (from :data:`NOTES_MARKER` on) kept at the end."""
    rows, problems = review_rows(root)
    out = ["# Claims review: the referee's checklist", "",
           "Generated by `python -m moelab.claims review --write docs/claims-review.md` (do not edit above the notes "
           "section, which the command keeps). First every decisive record (`reproduced` / `contradicted` / `smaller "
           "than reported`) in `figures/**/claims.json`: the sentence of the paper it tests, what determines the "
           "quantity, the regime check of the stand-in (check: value), the replication (seeds x items and why that "
           "unit), and what a proxy stands in for. A decisive record with an empty field is an error at rebuild "
           "time. Then every claim of the papers with its quote and label.", "",
           f"{len(rows)} decisive verdict(s).", "",
           "| folder | claim | verdict | ours [95% CI] (MDE) | paper says | determined_by | regime | replication | "
           "proxy_for |", "|---|---|---|---|---|---|---|---|---|"]
    for folder, c in rows:
        est = (f"{_s(c.get('ours'))} [{_g(c.get('ci_low'))}, {_g(c.get('ci_high'))}] {c.get('unit', '')} "
               f"(MDE {_g(c.get('mde'))})")
        out.append(f"| {folder} | {_cell(c['id'])} | {c['verdict']} | {_cell(est)} | "
                   f"{_cell(c.get('paper_quote', ''))} ({_cell(paper_cell(c))}) | {c['determined_by']} | "
                   f"{_cell(_regime_text(c['regime']))} | {_cell(c['replication'])} | {_cell(c['proxy_for'])} |")
    if problems:
        out += ["", "## Problems", "", *[f"- {p}" for p in problems]]
    out += ["", "## Every claim of the papers, with the sentence it tests", ""]
    for f in sorted(Path(root).glob("**/claims.json")):
        data = json.loads(f.read_text())
        folder = str(f.parent.relative_to(Path(root).parent)) if Path(root).parent in f.parents else str(f.parent)
        out += [f"### {folder}", "", "| claim | paper reference | the paper says | label | ours [95% CI] (MDE) | reason "
                "(short) |", "|---|---|---|---|---|---|"]
        for c in data.get("claims", []):
            if c.get("verdict") == "extension":
                continue
            est = "" if c.get("ours") is None else f"{_s(c.get('ours'))} {ci_cell(c)} (MDE {_g(c.get('mde'))})"
            out.append(f"| {_cell(c['id'])} | {_cell(c.get('paper_ref', ''))} | {_cell(c.get('paper_quote', ''))} | "
                       f"{c['verdict']} | {_cell(est)} | {_cell(short_reason(c, 140))} |")
        out.append("")
    text = "\n".join(out).rstrip("\n") + "\n"
    if keep_notes.strip():
        text += "\n" + keep_notes.strip() + "\n"
    return text


def existing_notes(path) -> str:
    """The notes section (from :data:`NOTES_MARKER` on) of an existing review file, or ''."""
    p = Path(path)
    if not p.exists():
        return ""
    t = p.read_text()
    i = t.find(NOTES_MARKER)
    return t[i:] if i >= 0 else ""
