"""Notebook runner behind ``make figures`` / ``make test`` (foundation issue, item 5).

    python -m moelab.notebooks run --profile default [--only 03 [04 ...]] [--force] [--fail-fast] [--scratch]
                                   [-p NAME=VALUE ...]
    python -m moelab.notebooks list
    python -m moelab.notebooks stale          # committed figures whose sources changed since they were produced
    python -m moelab.notebooks readme         # regenerate README's results table from the claims files

Notebooks are jupytext percent ``.py`` sources in ``notebooks/``; each run converts one to ``.ipynb``, executes it with
papermill on this interpreter's kernel (the venv's), with ``PROFILE`` and ``SEED`` injected, and stores the executed
notebook under the git-ignored ``runs/<profile>/``. The runner publishes (``figures/``, swapped in only when the
notebook finishes: see :mod:`moelab.nbrun`) unless ``--scratch`` or the profile is ``smoke``; ``-p NAME=VALUE``
(repeatable, as papermill's) passes further parameters, e.g. the paper profile's local paths:

    python -m moelab.notebooks run --profile paper --only 05 -p MODEL_PATH=/models/Llama-2-7b-chat-hf

A series resumes: a notebook whose last run in this profile finished and whose source and imported moelab modules are
unchanged (content hashes in its ``provenance.json``) is skipped unless ``--force`` (or ``-p`` is given).
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

from moelab.cache import cache_root
from moelab.claims import rebuild as claims_rebuild
from moelab.claims import scorecard_markdown
from moelab.nbrun import (REPO_ROOT, VERDICT_CODE, figures_root, git_commit, output_dir, recover_published,
                          source_id)
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
    if not prov_path.exists():
        return False, ["(never run)"]
    prov = json.loads(prov_path.read_text())
    kind = prov.get("source_digest")  # None: written before normalised digests (raw sha256 of every file)
    changed = []
    for rel, sha in prov.get("sources", {}).items():
        if rel.startswith(VERDICT_CODE):   # provenance written before these modules were left out
            continue
        p = REPO_ROOT / rel
        if not p.exists() or source_id(rel, kind) != sha:
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


RESERVED = {"PROFILE": "--profile", "SEED": "--seed"}


def parse_params(items) -> dict:
    """``["MODEL_PATH=/m", "STEPS=50"]`` -> ``{"MODEL_PATH": "/m", "STEPS": 50}`` (values read as Python literals when
    they are one, else kept as strings), as papermill's ``-p NAME VALUE``."""
    out = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise ValueError(f"-p takes NAME=VALUE with NAME a Python identifier, got {item!r} "
                             f"(e.g. -p MODEL_PATH=/models/llama)")
        if name in RESERVED:
            raise ValueError(f"-p {name}=... is not allowed: use {RESERVED[name]} instead")
        try:
            out[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[name] = value
    return out


@contextlib.contextmanager
def _env(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_one(src: Path, profile: str, seed: int = 0, progress: bool = True, timeout: int | None = None,
            publish: bool = True, params: dict | None = None) -> float:
    """Execute one notebook; returns its wall time. Raises ``papermill.PapermillExecutionError`` if a cell fails.

    ``publish`` is passed to the kernel as ``MOELAB_PUBLISH`` (``NotebookRun`` reads it); with ``progress`` the
    kernel's output (progress bars included) is forwarded to this terminal."""
    import papermill as pm

    out_dir = RUNS / profile
    inp = to_ipynb(src, out_dir / f"{src.stem}.input.ipynb")
    out = out_dir / f"{src.stem}.ipynb"
    work = out_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    publish = publish and profile != "smoke"
    t0 = time.time()
    # with progress, the kernel's stdout/stderr (moelab's text progress bars: MOELAB_PROGRESS=text) are forwarded to
    # this terminal; papermill's own per-cell bar is off so the two do not overwrite each other
    stream = dict(stdout_file=sys.stdout, stderr_file=sys.stderr) if progress else {}
    with _env(MOELAB_PUBLISH=int(publish), MOELAB_PROGRESS="text" if progress else "0"):
        try:
            pm.execute_notebook(str(inp), str(out), parameters={"PROFILE": profile, "SEED": seed, **(params or {})},
                                kernel_name="python3", progress_bar=False, cwd=str(work),
                                execution_timeout=timeout, **stream)
        finally:
            if publish:   # a failed run leaves its staging folder behind: remove it, keep the published one
                recover_published(output_dir(src.stem, profile, True), profile)
    return time.time() - t0


def cmd_run(a) -> int:
    check_profile(a.profile)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("MPLBACKEND", "Agg")
    params = parse_params(a.param)
    publish = not a.scratch and a.profile != "smoke"
    nbs = discover(a.only)
    if not nbs:
        print("no notebooks found in notebooks/")
        return 0
    where = "publishing into figures/" if publish else f"scratch outputs in {output_dir('NN', a.profile, False).parent}"
    print(f"profile {a.profile}: {where}" + (f"; parameters {params}" if params else ""), flush=True)
    results, failed = [], []
    for i, src in enumerate(nbs, 1):
        prov = output_dir(src.stem, a.profile, publish) / "provenance.json"
        current, _ = sources_current(prov)
        if current and not a.force and not params:
            if publish:   # the claim definitions may have changed since: recompute from the saved tables
                claims_rebuild(prov.parent)
            print(f"[{i}/{len(nbs)}] {src.stem}: up to date for profile {a.profile} (skip; --force reruns; claims "
                  f"recomputed from the saved tables)", flush=True)
            results.append((src.stem, "skipped", 0.0))
            continue
        print(f"[{i}/{len(nbs)}] {src.stem}: running profile {a.profile} ...", flush=True)
        t0 = time.time()
        try:
            wall = run_one(src, a.profile, seed=a.seed, progress=not a.no_progress, timeout=a.cell_timeout,
                           publish=publish, params=params)
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
    if publish and not failed:
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
    """The README's scorecard: verdict counts per notebook, then one row per claim (see docs/CLAIMS.md)."""
    return scorecard_markdown(figures_root())


BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def write_readme_results(readme: Path | None = None) -> bool:
    """Rewrite the results table between the README's markers from the claims files under ``figures_root()``.
    The README is the one beside that figures folder (the repository's by default): a run that publishes into
    ``$MOELAB_FIGURES`` elsewhere (tests, a user's scratch copy) never rewrites the repository's README."""
    readme = Path(readme) if readme is not None else figures_root().parent / "README.md"
    if not readme.exists():
        return False
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        return False
    new = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END),
                 lambda m: f"{BEGIN}\n{results_table()}\n{END}", text, flags=re.S)
    readme.write_text(new)
    return True


# ---------------------------------------------------------------- make verify (shared-code issue, item 4)
VERIFY = REPO_ROOT / "runs" / "verify"
VERIFY_DOCS = REPO_ROOT / "docs" / "verify"
FLOAT_TOL = 1e-3   # relative tolerance for numbers without an interval (deterministic by construction)


def cold_cache(root: Path, real: Path) -> Path:
    """A cache root with every entry of the real cache linked in except ``artifacts/`` (trained models, hidden
    states, memoised results), which starts empty: a rerun from it recomputes everything but reuses the installed
    assets."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for entry in sorted(real.iterdir()) if real.is_dir() else []:
        if entry.name != "artifacts" and not entry.name.startswith("."):
            (root / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
    return root


def compare_claims(committed: dict, fresh: dict) -> list[dict]:
    """One row per claim: committed vs fresh verdict and number; ``status`` is ``ok``, ``flipped`` (verdict differs),
    ``outside`` (the fresh number lies outside the committed 95% interval, or beyond ``FLOAT_TOL`` relative where
    there is no interval), ``missing`` or ``new``. Claims measured in wall time (unit in seconds) are compared by
    verdict only: their numbers depend on the machine's load."""
    def key(c):
        return c.get("id") or c["claim"]

    old = {key(c): c for c in committed.get("claims", [])}
    new = {key(c): c for c in fresh.get("claims", [])}
    rows = []
    for k in list(old) + [k for k in new if k not in old]:
        a, b = old.get(k), new.get(k)
        row = {"claim": k, "committed": a and a["verdict"], "fresh": b and b["verdict"],
               "committed_ours": a and a.get("ours"), "fresh_ours": b and b.get("ours"),
               "ci": a and (a.get("ci_low"), a.get("ci_high"))}
        if a is None or b is None:
            row["status"] = "new" if a is None else "missing"
        elif a["verdict"] != b["verdict"]:
            row["status"] = "flipped"
        elif "second" in str(a.get("unit", "")):   # wall-time measurements depend on machine load: verdict only
            row["status"] = "ok"
        else:
            x, lo, hi, y = a.get("ours"), a.get("ci_low"), a.get("ci_high"), b.get("ours")
            if x is None or y is None:
                ok = x is None and y is None
            elif lo is not None and hi is not None:
                ok = lo <= y <= hi
            else:
                ok = abs(y - x) <= FLOAT_TOL * max(1.0, abs(x))
            row["status"] = "ok" if ok else "outside"
        rows.append(row)
    return rows


def _fmt(v):
    return "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def verify_report(nb: str, profile: str, rows: list[dict], commit: str) -> str:
    bad = [r for r in rows if r["status"] != "ok"]
    lines = [f"# make verify: {nb} ({profile})", "",
             f"Cold rerun (empty artifact cache, scratch outputs) at commit {commit}, compared with the committed "
             f"`claims.json`: {len(rows) - len(bad)} of {len(rows)} claims agree"
             + (f"; {len(bad)} differ." if bad else "."), "",
             "| claim | committed verdict | fresh verdict | committed ours [95% CI] | fresh ours | status |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        ci = r["ci"] or (None, None)
        ci_txt = f" [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci[0] is not None else ""
        lines.append(f"| {r['claim']} | {_fmt(r['committed'])} | {_fmt(r['fresh'])} | "
                     f"{_fmt(r['committed_ours'])}{ci_txt} | {_fmt(r['fresh_ours'])} | {r['status']} |")
    return "\n".join(lines) + "\n"


def cmd_verify(a) -> int:
    """Rerun notebooks cold into the scratch folder and compare their claims with the committed ones."""
    check_profile(a.profile)
    if a.profile == "smoke":
        raise ValueError("verify compares with published results; smoke is never published: use --profile default")
    nbs = discover(a.only)
    real_cache = cache_root()
    status = 0
    for src in nbs:
        committed_path = output_dir(src.stem, a.profile, True) / "claims.json"
        if not committed_path.exists():
            print(f"{src.stem}: no committed {committed_path.relative_to(REPO_ROOT)}; nothing to verify against")
            status = 1
            continue
        work = VERIFY / src.stem
        cache = cold_cache(work / "cache", real_cache)
        with _env(MOELAB_CACHE=cache, MOELAB_SCRATCH=work / "scratch"):
            print(f"{src.stem}: cold rerun of profile {a.profile} (artifact cache {cache} empty) ...", flush=True)
            try:
                wall = run_one(src, a.profile, seed=a.seed, progress=not a.no_progress, publish=False)
            except Exception as e:  # noqa: BLE001 - a failing notebook fails verify
                print(f"{src.stem}: FAILED: {str(e).strip().splitlines()[-1:]}")
                status = 1
                continue
            fresh_path = output_dir(src.stem, a.profile, False) / "claims.json"
            fresh = json.loads(fresh_path.read_text())
        rows = compare_claims(json.loads(committed_path.read_text()), fresh)
        report = verify_report(src.stem, a.profile, rows, git_commit())
        VERIFY_DOCS.mkdir(parents=True, exist_ok=True)
        suffix = "" if a.profile == "default" else f"-{a.profile}"
        (VERIFY_DOCS / f"{src.stem}{suffix}.md").write_text(report)
        print(report, flush=True)
        print(f"{src.stem}: cold rerun {wall:.0f} s; report in docs/verify/{src.stem}{suffix}.md", flush=True)
        if any(r["status"] != "ok" for r in rows):
            status = 1
    return status


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moelab.notebooks", description="Run the notebook series.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="execute notebooks with papermill")
    r.add_argument("--profile", default="default", help=f"one of {PROFILES}")
    r.add_argument("--only", nargs="+", metavar="NB", help="notebook numbers or names (e.g. 03 04_mass)")
    r.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a notebook parameter (repeatable), e.g. -p MODEL_PATH=/models/llama")
    r.add_argument("--scratch", action="store_true",
                   help="write outputs to the scratch folder (runs/scratch) instead of publishing into figures/")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--force", action="store_true", help="rerun notebooks whose outputs are current")
    r.add_argument("--fail-fast", action="store_true")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--cell-timeout", type=int, default=None, help="seconds per cell (default: none)")
    v = sub.add_parser("verify", help="rerun notebooks with an empty artifact cache into scratch and compare claims")
    v.add_argument("--profile", default="default", help="default, full or paper")
    v.add_argument("--only", nargs="+", metavar="NB", help="notebook numbers or names (e.g. 00)")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--no-progress", action="store_true")
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
    if a.cmd == "verify":
        try:
            return cmd_verify(a)
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
