"""Rebuild a folder's ``claims.json`` from its saved tables, without running anything (docs/CLAIMS.md).

``rebuild(folder, defs=...)`` reads ``provenance.json`` (``notebook``, ``profile``), takes the notebook's claim
definitions from ``defs`` (a module with a ``CLAIMS`` list, or a function notebook -> such a module), evaluates every
claim on the folder's tables and writes ``claims.json`` deterministically (rebuilding twice gives identical bytes).
The caller names the definitions: this engine sits below the paper packages, whose ``<paper>/claims.py`` hold them,
and imports none of them (the run layer's table is :data:`moelab.runner.notebook_run.CLAIM_DEFS`). Verdicts that change are
appended to the change log (``docs/verdict-changes.md``). ``check`` validates every committed ``claims.json`` and that
a rebuild reproduces it.
"""
from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path

import pandas as pd

from moelab.claims.engine import DRY_RUN, ENGINE_VERSION, ClaimEvidenceError, Tables, check_definitions, evaluate
from moelab.claims.schema import FIELDS, check_checklist, validate_file, validate_record

REPO_ROOT = Path(__file__).resolve().parents[3]
CHANGELOG = REPO_ROOT / "docs" / "verdict-changes.md"
_CHANGELOG_HEAD = ("# Verdict change log\n\n"
                   "Appended by `python -m moelab.claims rebuild` whenever a claim's verdict differs from the one in the "
                   "claims.json it replaces (paired by claim id, or by the claim definition's `legacy` text). "
                   "Do not edit by hand.\n\n"
                   "| date | folder | claim | old verdict | new verdict | why |\n|---|---|---|---|---|---|\n")


def figures_root() -> Path:
    """The committed figures folder (``MOELAB_FIGURES`` overrides it, as in ``moelab.runner.notebook_run``)."""
    return Path(os.environ.get("MOELAB_FIGURES") or REPO_ROOT / "figures")


def load_claims(defs, notebook: str | None = None) -> list:
    """The checked ``CLAIMS`` list of claim definitions ``defs``: a module (or any object) with a ``CLAIMS`` list, or a
    function that returns one for ``notebook`` (e.g. :func:`moelab.runner.notebook_run.claim_defs`)."""
    if defs is None:
        raise ValueError("no claim definitions given: pass defs= (a module with a CLAIMS list, or a function notebook "
                         "-> module such as moelab.runner.notebook_run.claim_defs)")
    mod = defs(notebook) if callable(defs) else defs
    if not hasattr(mod, "CLAIMS"):
        raise ValueError(f"{getattr(mod, '__name__', mod)!s} defines no CLAIMS list (see docs/CLAIMS.md)")
    return check_definitions(mod.CLAIMS)


def read_provenance(folder: Path) -> dict:
    prov = Path(folder) / "provenance.json"
    if not prov.exists():
        raise ValueError(f"{folder} has no provenance.json: not a notebook output folder")
    data = json.loads(prov.read_text())
    if not data.get("notebook") or not data.get("profile"):
        raise ValueError(f"{prov} lacks 'notebook' or 'profile'")
    return data


def evaluate_folder(folder, defs) -> tuple[dict, list[dict]]:
    """(provenance, records) for one folder, without writing anything; ``defs`` as in :func:`load_claims`."""
    folder = Path(folder)
    prov = read_provenance(folder)
    claims = load_claims(defs, prov["notebook"])
    tables = Tables(folder)
    records = []
    for c in claims:
        try:
            rec = evaluate(c, tables)
        except Exception as e:   # a bug in the definition or the tables: name the claim
            raise ClaimEvidenceError(f"{prov['notebook']} ({folder}) claim {c.id!r}: {type(e).__name__}: {e}") from e
        records.append(check_checklist(validate_record(rec)))
    if prov.get("dry_run"):
        records = [as_dry_run(r) for r in records]
    return prov, records


def as_dry_run(rec: dict) -> dict:
    """A record of a dry run (provenance ``dry_run``; issue 51): its numbers stay for inspection, its verdict is
    ``dry run`` with the label the rules gave in the reason (a dry run cuts steps, items and seeds, so no reading of it
    is evidence about the paper). An extension row stays ``extension`` (counted apart, never a verdict)."""
    if rec["verdict"] == "extension":   # our own readings stay counted apart (they quote no paper)
        return rec
    return validate_record({**rec, "verdict": DRY_RUN,
                            "reason": f"dry run (sizes cut to exercise the paper path; not evidence): the rules would "
                                      f"say {rec['verdict']!r}: {rec['reason']}"})


def dumps(payload: dict) -> str:
    """The canonical claims.json text (indent 1, keys in record order, trailing newline)."""
    return json.dumps(payload, indent=1, ensure_ascii=False, default=str) + "\n"


def _pair(old_records: list, new_claims_legacy: dict, rec: dict):
    """The old record a new one replaces: same id, else an old claim text equal to one of its ``legacy`` texts."""
    for o in old_records:
        if o.get("id") == rec["id"]:
            return o
    for o in old_records:
        if o.get("claim") in new_claims_legacy.get(rec["id"], ()):
            return o
    return None


def verdict_changes(old_payload: dict | None, records: list[dict], legacy: dict) -> list[tuple]:
    """(claim, old verdict, new verdict, why) for each paired claim whose verdict changed, and each old claim that no
    new claim replaces (new verdict '(removed)')."""
    old = list((old_payload or {}).get("claims", []))
    used, out = set(), []
    for rec in records:
        o = _pair(old, legacy, rec)
        if o is None:
            continue
        used.add(id(o))
        if o.get("verdict") != rec["verdict"]:
            out.append((rec["claim"], o.get("verdict", "?"), rec["verdict"], rec["reason"]))
    for o in old:
        if id(o) not in used:
            out.append((o.get("claim", "?"), o.get("verdict", "?"), "(removed)", "no claim definition replaces it"))
    return out


def _cell(s) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def append_changelog(path: Path, folder: str, changes: list[tuple], today: str | None = None):
    if not changes:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text() if path.exists() else _CHANGELOG_HEAD
    today = today or datetime.date.today().isoformat()
    rows = "".join(f"| {today} | {_cell(folder)} | {_cell(c)} | {o} | {n} | {_cell(w)} |\n" for c, o, n, w in changes)
    path.write_text(text + rows)


_STAGING_RE = re.compile(r"^\.(?P<name>.+)\.staging-\d+$")


def _final_folder(folder: Path) -> Path:
    """The folder a run's staging folder (``.<name>.staging-<pid>``, see ``moelab.runner.notebook_run``) will become."""
    folder = Path(folder).resolve()
    m = _STAGING_RE.match(folder.name)
    return folder.parent / m["name"] if m else folder


def _display(folder: Path) -> str:
    folder = _final_folder(folder)
    try:
        return str(folder.relative_to(REPO_ROOT))
    except ValueError:
        return str(folder)


def _is_committed_folder(folder: Path) -> bool:
    """Whether ``folder`` (or the folder its staging name becomes) lies under the repository's figures/."""
    return _final_folder(folder).is_relative_to((REPO_ROOT / "figures").resolve())


def frame(records: list[dict]) -> pd.DataFrame:
    """The records as a DataFrame (schema columns), e.g. for a notebook's closing cell."""
    return pd.DataFrame(records, columns=list(FIELDS))


def rebuild(folder, *, defs, write: bool = True, changelog="auto") -> list[dict]:
    """Recompute ``<folder>/claims.json`` from the folder's tables and return its records.

    ``defs``: the claim definitions, as in :func:`load_claims`. ``write=False`` computes only. ``changelog``: the
    verdict change log to append to; ``"auto"`` (default) means ``docs/verdict-changes.md`` for folders under the
    repository's ``figures/`` (a published run, or a rebuild of a committed folder) and no log for scratch, smoke or
    test folders; ``None`` never logs.
    """
    folder = Path(folder)
    prov, records = evaluate_folder(folder, defs)
    if not write:
        return records
    payload = validate_file({"provenance": prov, "engine": ENGINE_VERSION, "claims": records})
    path = folder / "claims.json"
    old = None
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except json.JSONDecodeError:
            old = None
    if changelog == "auto":
        changelog = CHANGELOG if _is_committed_folder(folder) else None
    if changelog is not None:
        legacy = {}
        for c in load_claims(defs, prov["notebook"]):
            texts = c.legacy if isinstance(c.legacy, (list, tuple)) else [c.legacy] if c.legacy else []
            legacy[c.id] = tuple(texts)
        append_changelog(changelog, _display(folder), verdict_changes(old, records, legacy))
    path.write_text(dumps(payload))
    return records


def output_folders(root: Path | None = None) -> list[Path]:
    """Every folder under ``root`` (default: figures/) that holds a provenance.json."""
    root = Path(root) if root is not None else figures_root()
    return sorted(p.parent for p in root.glob("**/provenance.json")
                  if not any(part.startswith(".") for part in p.relative_to(root).parts))   # staging folders


def check(root: Path | None = None, *, defs) -> list[str]:
    """Problems with the committed claims: each claims.json must validate and equal an in-memory rebuild with
    ``defs`` (as in :func:`load_claims`)."""
    problems = []
    root = Path(root) if root is not None else figures_root()
    for folder in output_folders(root):
        path = folder / "claims.json"
        where = _display(folder)
        if not path.exists():
            problems.append(f"{where}: no claims.json")
            continue
        try:
            data = validate_file(json.loads(path.read_text()))
            for rec in data["claims"]:
                check_checklist(rec)
        except (ValueError, json.JSONDecodeError) as e:
            problems.append(f"{where}: {e}")
            continue
        try:
            prov, records = evaluate_folder(folder, defs)
        except Exception as e:
            problems.append(f"{where}: rebuild failed: {type(e).__name__}: {e}")
            continue
        expected = dumps({"provenance": prov, "engine": ENGINE_VERSION, "claims": records})
        if expected != path.read_text():
            old = {r["id"]: r for r in data["claims"]}
            new = {r["id"]: r for r in records}
            diffs = [i for i in sorted(set(old) | set(new)) if old.get(i) != new.get(i)]
            problems.append(f"{where}: claims.json differs from a rebuild (claims {diffs or 'header'}); run "
                            f"`python -m moelab.claims rebuild {where}`")
    return problems
