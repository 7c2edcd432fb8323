"""Notebook runner behind ``make figures`` / ``make test`` (foundation issue, item 5).

    python -m moelab.notebooks run --profile default [--only 03 [04 ...]] [--force] [--fail-fast]
    python -m moelab.notebooks list
    python -m moelab.notebooks stale          # committed figures whose sources changed since they were produced
    python -m moelab.notebooks readme         # regenerate README's results table from the claims files

Notebooks are jupytext percent ``.py`` sources in ``notebooks/``; each run converts one to ``.ipynb``, executes it with
papermill on this interpreter's kernel (the venv's), with ``PROFILE`` and ``SEED`` injected, and stores the executed
notebook under the git-ignored ``runs/<profile>/``. A series resumes: a notebook whose last run in this profile finished
and whose source and imported moelab modules are unchanged (content hashes in its ``provenance.json``) is skipped
unless ``--force``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from moelab.nbrun import REPO_ROOT, figures_root, output_dir
from moelab.profiles import PROFILES, check_profile

NB_DIR = REPO_ROOT / "notebooks"
RUNS = REPO_ROOT / "runs"


def discover(only=None) -> list[Path]:
    """Notebook sources in series order; ``only`` filters by number prefix ('03') or full stem."""
    nbs = sorted(p for p in NB_DIR.glob("[0-9][0-9]_*.py"))
    if only:
        want = [str(o) for o in only]
        bad = [w for w in want if not any(p.stem == w or p.stem.startswith(f"{w.zfill(2)}_") for p in nbs)]
        if bad:
            raise ValueError(f"no notebook matches {bad}; available: {[p.stem for p in nbs]}")
        nbs = [p for p in nbs if any(p.stem == w or p.stem.startswith(f"{w.zfill(2)}_") for w in want)]
    return nbs


def sources_current(prov_path: Path) -> tuple[bool, list[str]]:
    """Whether every source hashed in ``provenance.json`` still has the same content; returns (current, changed)."""
    from moelab.nbrun import file_sha

    if not prov_path.exists():
        return False, ["(never run)"]
    prov = json.loads(prov_path.read_text())
    changed = []
    for rel, sha in prov.get("sources", {}).items():
        p = REPO_ROOT / rel
        if not p.exists() or file_sha(p) != sha:
            changed.append(rel)
    if not prov.get("sources"):
        changed.append("(no source hashes recorded)")
    return not changed, changed


def to_ipynb(src: Path, dest: Path) -> Path:
    import jupytext

    nb = jupytext.read(src)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    dest.parent.mkdir(parents=True, exist_ok=True)
    jupytext.write(nb, dest)
    return dest


def run_one(src: Path, profile: str, seed: int = 0, progress: bool = True, timeout: int | None = None) -> float:
    """Execute one notebook; returns its wall time. Raises ``papermill.PapermillExecutionError`` if a cell fails."""
    import papermill as pm

    out_dir = RUNS / profile
    inp = to_ipynb(src, out_dir / f"{src.stem}.input.ipynb")
    out = out_dir / f"{src.stem}.ipynb"
    work = out_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    pm.execute_notebook(str(inp), str(out), parameters={"PROFILE": profile, "SEED": seed}, kernel_name="python3",
                        progress_bar=progress, cwd=str(work), execution_timeout=timeout)
    return time.time() - t0


def cmd_run(a) -> int:
    check_profile(a.profile)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("MPLBACKEND", "Agg")
    nbs = discover(a.only)
    if not nbs:
        print("no notebooks found in notebooks/")
        return 0
    results, failed = [], []
    for i, src in enumerate(nbs, 1):
        prov = output_dir(src.stem, a.profile) / "provenance.json"
        current, _ = sources_current(prov)
        if current and not a.force:
            print(f"[{i}/{len(nbs)}] {src.stem}: up to date for profile {a.profile} (skip; --force reruns)", flush=True)
            results.append((src.stem, "skipped", 0.0))
            continue
        print(f"[{i}/{len(nbs)}] {src.stem}: running profile {a.profile} ...", flush=True)
        t0 = time.time()
        try:
            wall = run_one(src, a.profile, seed=a.seed, progress=not a.no_progress, timeout=a.cell_timeout)
            results.append((src.stem, "ok", wall))
            print(f"[{i}/{len(nbs)}] {src.stem}: ok in {wall:.0f} s", flush=True)
        except Exception as e:  # noqa: BLE001 - report every failure, then exit non-zero
            wall = time.time() - t0
            results.append((src.stem, "FAILED", wall))
            failed.append(src.stem)
            msg = str(e).strip().splitlines()
            print(f"[{i}/{len(nbs)}] {src.stem}: FAILED after {wall:.0f} s\n    " + "\n    ".join(msg[-15:]), flush=True)
            if a.fail_fast:
                break
    print("\nnotebook                         status    wall time")
    for name, st, wall in results:
        print(f"{name:32s} {st:9s} {wall:7.0f} s")
    print(f"executed notebooks: {RUNS / a.profile}")
    if a.profile != "smoke" and not failed:
        write_readme_results()
    return 1 if failed else 0


def stale_report(root: Path | None = None) -> list[tuple[str, list[str]]]:
    """Committed figure folders whose notebook source or imported moelab modules changed since they were produced."""
    root = root or figures_root()
    out = []
    for prov in sorted(root.glob("**/provenance.json")):
        current, changed = sources_current(prov)
        if not current:
            out.append((str(prov.parent.relative_to(root)), changed))
    return out


def cmd_stale(a) -> int:
    rows = stale_report()
    if not rows:
        print("stale-figures report: every committed figure folder matches its current sources.")
    else:
        print("stale-figures report (a report, not a failure): these figure folders were produced from sources that "
              "have changed since; rerun `make figures NB=..` to refresh them:")
        for d, changed in rows:
            print(f"  figures/{d}: {', '.join(changed[:6])}{' ...' if len(changed) > 6 else ''}")
    return 0


def results_table() -> str:
    """Markdown table of every claim in figures/**/claims.json (default and full)."""
    lines = ["| notebook | profile | claim | paper | ours [95% CI] | verdict |", "|---|---|---|---|---|---|"]
    for f in sorted(figures_root().glob("**/claims.json")):
        data = json.loads(f.read_text())
        prov = data.get("provenance", {})
        for c in data.get("claims", []):
            ours = "" if c.get("ours") is None else f"{c['ours']:.4g}"
            if c.get("ci_low") is not None:
                ours += f" [{c['ci_low']:.4g}, {c['ci_high']:.4g}]"
            claim = c["claim"].replace("|", "/")
            lines.append(f"| {prov.get('notebook', f.parent.name)} | {prov.get('profile', '')} | {claim} | "
                         f"{str(c.get('paper', '')).replace('|', '/')} | {ours} | {c['verdict']} |")
    return "\n".join(lines)


BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def write_readme_results(readme: Path = REPO_ROOT / "README.md") -> bool:
    if not readme.exists():
        return False
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        return False
    new = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END),
                 lambda m: f"{BEGIN}\n{results_table()}\n{END}", text, flags=re.S)
    readme.write_text(new)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moelab.notebooks", description="Run the notebook series.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="execute notebooks with papermill")
    r.add_argument("--profile", default="default", help=f"one of {PROFILES}")
    r.add_argument("--only", nargs="*", help="notebook numbers or names (e.g. 03 04_mass)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--force", action="store_true", help="rerun notebooks whose outputs are current")
    r.add_argument("--fail-fast", action="store_true")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--cell-timeout", type=int, default=None, help="seconds per cell (default: none)")
    sub.add_parser("list")
    sub.add_parser("stale")
    sub.add_parser("readme")
    a = ap.parse_args(argv)
    if a.cmd == "run":
        try:
            return cmd_run(a)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if a.cmd == "list":
        for p in discover():
            print(p.stem)
        return 0
    if a.cmd == "stale":
        return cmd_stale(a)
    if a.cmd == "readme":
        print("README updated" if write_readme_results() else "README has no results markers")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
