"""Notebook runner behind ``make figures`` / ``make test``.

    python -m moelab.runner run --profile default [--only 03 [04 ...]] [--force] [--fail-fast] [--scratch]
                                [--jobs N] [--dry-run] [-p NAME=VALUE ...]
    python -m moelab.runner list
    python -m moelab.runner stale        # committed figures whose sources changed since they were produced
    python -m moelab.runner readme       # regenerate README's results table from the claims files
    python -m moelab.runner notebook-md figures/03_cluster_upcycling   # rewrite its notebook.md
    python -m moelab.runner timings      # regenerate docs/timings.md from the committed provenance files

Notebooks are jupytext percent ``.py`` sources in ``notebooks/``; each run converts one to ``.ipynb``, executes it with
papermill on this interpreter's kernel (the venv's), with ``PROFILE`` and ``SEED`` injected, and stores the executed
notebook under the git-ignored ``runs/<profile>/``. The runner publishes (``figures/``, swapped in only when the
notebook finishes: see :mod:`moelab.runner.notebook_run`) unless ``--scratch`` or the profile is ``smoke``; ``-p NAME=VALUE``
(repeatable, as papermill's) passes further parameters, e.g. the paper profile's local paths:

    python -m moelab.runner run --profile paper --only 05 -p MODEL_PATH=/models/Llama-2-7b-chat-hf

``--dry-run`` (issue 51; ``make figures PROFILE=paper DRY_RUN=1 P=...``) rehearses the paper profile on cut sizes
into the scratch folder, so a wrong path or format shows in minutes on a laptop; its claims say ``dry run``.

``-p`` names must be parameters of the notebook (its ``parameters`` cell); an unknown name exits 2 naming them. With
several notebooks, each gets the parameters its cell declares. ``make figures P="A=1 B={'x': 2}"`` passes ``P`` whole
(``--params``), split before each ``NAME=``.

A series resumes: a notebook whose last run in this profile finished, with the same seed and ``-p`` values, and whose
source and imported moelab modules are unchanged (content hashes in its ``provenance.json``) is skipped unless
``--force``. Every run also writes the executed notebook as ``notebook.md`` into its output folder (published with the
figures: :mod:`moelab.runner.markdown`); ``notebook-md FOLDER`` rewrites it from the kept executed notebook, and ``timings``
regenerates ``docs/timings.md`` from the committed ``provenance.json`` files.

``--jobs N`` (issue 49; ``make figures`` passes ``JOBS``, 2 by default) runs N notebooks side by side (the queue that ends soonest by
``provenance.json``'s recorded times, :func:`moelab.runner.lanes.lane_order`),
each in a process of its own on one torch thread with its output in ``runs/<profile>/<nb>.log``
(:mod:`moelab.runner.lanes`); ``--jobs 1``, the default here, is the one-at-a-time runner described above.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import sys
import time
import traceback
from pathlib import Path

from moelab.cache import adopt_entries, cache_root
from moelab.claims import rebuild as claims_rebuild
from moelab.claims import scorecard_markdown
from moelab.claims.verdict_summary import results_markdown
from moelab.runner import lanes
from moelab.runner.markdown import MD_NAME, write_notebook_md
from moelab.runner.notebook_run import (FIGURE_LINKS_ENV, JOBS_ENV, OWNER_ENV, PARAMS_ENV, REPO_ROOT, claim_defs,
                                        dirty_sources, figures_root, git_commit, is_verdict_code, output_dir,
                                        publish_dir, recover_published, source_id, staging_dir, write_index)
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
        if is_verdict_code(rel):   # provenance written before these modules were left out
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


def notebook_parameters(src: Path) -> list[str]:
    """The names assigned in the notebook's cell tagged ``parameters`` (what ``-p`` may set)."""
    import jupytext

    names = []
    for cell in jupytext.read(src).cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            for node in ast.parse(cell.source).body:
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def params_for(nbs: list[Path], params: dict) -> dict[str, dict]:
    """Each notebook's share of ``params`` (the names its parameters cell declares); a name no selected notebook
    declares raises ValueError naming every notebook's parameters."""
    declared = {src.stem: notebook_parameters(src) for src in nbs}
    unknown = sorted(n for n in params if not any(n in names for names in declared.values()))
    if unknown:
        known = "; ".join(f"{nb}: {', '.join(n for n in names if n not in RESERVED) or '(none besides PROFILE, SEED)'}"
                          for nb, names in declared.items())
        raise ValueError(f"unknown notebook parameter(s) {', '.join(unknown)} (-p sets a name of the notebook's "
                         f"parameters cell; PROFILE and SEED have --profile and --seed). Parameters: {known}")
    return {nb: {k: v for k, v in params.items() if k in names} for nb, names in declared.items()}


def split_params(text: str) -> list[str]:
    """``make figures P="A=1 B={'x': 1, 'y': 2}"``: the string split before each ``NAME=`` (so a value may hold
    spaces and quotes) -> ``["A=1", "B={'x': 1, 'y': 2}"]``."""
    text = (text or "").strip()
    return [part.strip() for part in re.split(r"\s+(?=[A-Za-z_]\w*=)", text)] if text else []


def _canonical(params) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def run_current(prov_path: Path, seed: int, params: dict) -> tuple[bool, list[str]]:
    """Whether the run recorded in ``provenance.json`` is current for this request: unchanged sources
    (:func:`sources_current`), the same seed and the same ``-p`` values (provenance without ``params``, from before
    they were recorded, counts as none). A run from JupyterLab records ``params: null`` and is never current."""
    current, why = sources_current(prov_path)
    if not prov_path.exists():
        return current, why
    prov = json.loads(prov_path.read_text())
    if prov.get("seed") != seed:
        why.append(f"seed {prov.get('seed')} (recorded) != {seed}")
    recorded = prov.get("params", {})
    if recorded is None:
        why.append("run outside the runner (parameters unknown)")
    elif _canonical(recorded) != _canonical(json.loads(_canonical(params))):
        why.append(f"parameters {recorded} (recorded) != {params}")
    return not why, why


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
            publish: bool = True, params: dict | None = None, jobs: int = 1, runs: Path | None = None,
            engine: dict | None = None) -> float:
    """Execute one notebook; returns its wall time. Raises ``papermill.PapermillExecutionError`` if a cell fails.

    ``publish`` is passed to the kernel as ``MOELAB_PUBLISH`` (``NotebookRun`` reads it); with ``progress`` the
    kernel's output (progress bars included) is forwarded to this terminal (a lane's log file under ``--jobs``).
    ``jobs`` (the lane count, issue 49) reaches the kernel's provenance; ``runs`` replaces :data:`RUNS` (a lane's
    process gets it from the runner); ``engine`` names a papermill engine and its arguments (a lane's status file:
    :mod:`moelab.runner.lanes`)."""
    import papermill as pm

    from traitlets.config import Config

    out_dir = (runs or RUNS) / profile
    inp = to_ipynb(src, out_dir / f"{src.stem}.input.ipynb")
    out = out_dir / f"{src.stem}.ipynb"
    work = out_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    publish = publish and profile != "smoke"
    final = output_dir(src.stem, profile, publish)
    t0 = time.time()
    # with progress, the kernel's stdout/stderr (moelab's progress bars) are forwarded to this terminal: redrawn bars
    # on a terminal, plain lines in a log; papermill's own per-cell bar is off so the two do not overwrite each other
    stream = dict(stdout_file=sys.stdout, stderr_file=sys.stderr) if progress else {}
    bars = ("text" if sys.stderr.isatty() else "log") if progress else "0"
    # the kernel listens on local sockets (IPC), not TCP: nothing to encrypt, and no "running over TCP without
    # encryption" warning on every run
    kernel_config = Config({"KernelManager": {"transport": "ipc"}})
    if jobs > 1:   # lanes start kernels at once in the same folder: sockets of their own (kernel-<pid>-ipc-<n>)
        kernel_config.KernelManager.ip = f"kernel-{os.getpid()}-ipc"
    env = {"MOELAB_PUBLISH": int(publish), "MOELAB_PROGRESS": bars, PARAMS_ENV: json.dumps(params or {}, default=str),
           OWNER_ENV: os.getpid(), FIGURE_LINKS_ENV: 1, JOBS_ENV: jobs}
    with _env(**env):
        try:
            pm.execute_notebook(str(inp), str(out), parameters={"PROFILE": profile, "SEED": seed, **(params or {})},
                                kernel_name="python3", progress_bar=False, cwd=str(work),
                                execution_timeout=timeout, config=kernel_config, **stream, **(engine or {}))
            if publish:   # finish() handed its staging folder over: add the Markdown, then swap it in
                staged = staging_dir(final, os.getpid())
                if not staged.is_dir():
                    raise RuntimeError(f"{src.stem} finished without run.finish() handing over {staged}")
                write_notebook_md(out, staged)
                publish_dir(staged, final, profile)
                write_index(figures_root())
            elif final.is_dir():
                write_notebook_md(out, final)
        finally:
            if publish:   # a failed run leaves its staging folder behind: remove it, keep the published one
                recover_published(final, profile)
    return time.time() - t0


def _skip_current(src: Path, a, params: dict, publish: bool, label: str) -> bool:
    """Whether ``src`` is current for this request (:func:`run_current`) and so skipped (unless ``--force`` or
    ``--cold``): a published one gets its claims recomputed from its saved tables. Removes a killed earlier run's
    staging folder either way."""
    folder = output_dir(src.stem, a.profile, publish)
    if publish:   # a killed earlier run's staging folder goes now, whether this one runs or is skipped
        recover_published(folder, a.profile)
    current, _ = run_current(folder / "provenance.json", a.seed, params)
    if not current or a.force or a.cold:
        return False
    if publish:   # the claim definitions may have changed since: recompute from the saved tables
        claims_rebuild(folder, defs=claim_defs)
    print(f"{label} {src.stem}: up to date for profile {a.profile} (skip; --force reruns; claims "
          f"recomputed from the saved tables)", flush=True)
    return True


def dry_run_request(a, params: dict) -> None:
    """``run --dry-run`` (issue 51): the paper profile's every cell on cut sizes, into the scratch folder, always
    rerun; every notebook gets ``DRY_RUN=True`` (its derived-settings cell cuts steps, items, seeds and grids and
    says so in its first table; its claims say ``dry run``). Refuses another profile, naming the fix."""
    if a.profile != "paper":
        raise ValueError(f"--dry-run rehearses the paper profile; got --profile {a.profile}: use --profile paper "
                         f"(make figures PROFILE=paper DRY_RUN=1 P=...)")
    if "DRY_RUN" in params and params["DRY_RUN"] is not True:
        raise ValueError(f"--dry-run with -p DRY_RUN={params['DRY_RUN']!r}: drop one of them")
    params["DRY_RUN"] = True
    a.scratch, a.force = True, True


def cmd_run(a) -> int:
    check_profile(a.profile)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("MPLBACKEND", "Agg")
    params = parse_params(a.param + [p for text in a.params for p in split_params(text)])
    if a.dry_run:
        dry_run_request(a, params)
    publish = not a.scratch and a.profile != "smoke"
    if a.jobs < 1:
        raise ValueError(f"--jobs takes a count of notebooks to run side by side (1 or more), got {a.jobs}")
    nbs = discover(a.only)
    if not nbs:
        print("no notebooks found in notebooks/")
        return 0
    per_nb = params_for(nbs, params)
    if a.dry_run:
        lacking = [src.stem for src in nbs if "DRY_RUN" not in notebook_parameters(src)]
        if lacking:
            raise ValueError(f"--dry-run: {', '.join(lacking)} declare(s) no DRY_RUN parameter (no dry run "
                             f"implemented); leave them out with --only")
    where = "publishing into figures/" if publish else f"scratch outputs in {output_dir('NN', a.profile, False).parent}"
    print(f"profile {a.profile}: {where}" + (f"; parameters {params}" if params else "")
          + (f"; {a.jobs} lanes, one torch thread per notebook" if a.jobs > 1 else ""), flush=True)
    dirty = dirty_sources() if publish else []
    if dirty:
        print("WARNING " + "!" * 60 + f"\nWARNING: publishing from a working tree whose sources differ from the commit "
              f"({len(dirty)} file(s)): the provenance of these figures will say {git_commit()}.\nWARNING: commit "
              f"first for a reproducible record. Changed: {', '.join(d[3:] for d in dirty[:8])}"
              f"{' ...' if len(dirty) > 8 else ''}\nWARNING " + "!" * 60, file=sys.stderr, flush=True)
    if a.jobs > 1:
        return run_in_lanes(a, nbs, per_nb, publish)
    results, failed = [], []
    for i, src in enumerate(nbs, 1):
        if _skip_current(src, a, per_nb[src.stem], publish, f"[{i}/{len(nbs)}]"):
            results.append((src.stem, "skipped", 0.0))
            continue
        print(f"[{i}/{len(nbs)}] {src.stem}: running profile {a.profile}"
              + (" cold (empty artifact cache; built entries join the cache afterwards)" if a.cold else "") + " ...",
              flush=True)
        t0 = time.time()
        try:
            with cold_run(RUNS / "cold" / src.stem) if a.cold else contextlib.nullcontext():
                wall = run_one(src, a.profile, seed=a.seed, progress=not a.no_progress, timeout=a.cell_timeout,
                               publish=publish, params=per_nb[src.stem])
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
    if publish and any(st == "ok" for _, st, _ in results):
        write_timings()
    return 1 if failed else 0


def run_in_lanes(a, nbs: list[Path], per_nb: dict[str, dict], publish: bool) -> int:
    """``run --jobs N`` with N > 1 (issue 49): skip the current notebooks (as one lane does), run the others in N
    lanes, in the order that ends soonest (:mod:`moelab.runner.lanes`: each in a process of its own on one torch thread, its output in
    ``runs/<profile>/<nb>.log``), then print the table of what ran and, as one lane does, regenerate the results and
    timings. Exits 1 naming each failed notebook and its log, 130 after Ctrl-C (every published folder of a stopped
    notebook as it was)."""
    todo = [src for i, src in enumerate(nbs, 1)
            if not _skip_current(src, a, per_nb[src.stem], publish, f"[{i}/{len(nbs)}]")]
    skipped = [src.stem for src in nbs if src not in todo]
    folders = {src.stem: output_dir(src.stem, a.profile, publish) for src in todo}
    walls = {name: lanes.recorded_wall(f / "provenance.json") or lanes.recorded_wall(
        output_dir(name, a.profile, True) / "provenance.json") for name, f in folders.items()}
    by_name = {src.stem: src for src in todo}
    logs = RUNS / a.profile
    tasks = []
    for name in lanes.lane_order(list(by_name), walls, a.jobs):
        spec = {"src": str(by_name[name]), "profile": a.profile, "seed": a.seed, "params": per_nb[name],
                "publish": publish, "progress": not a.no_progress, "timeout": a.cell_timeout, "cold": a.cold,
                "jobs": a.jobs, "runs": str(RUNS), "status": str(logs / f"{name}.status.json")}
        tasks.append(lanes.Task(name, [sys.executable, "-m", "moelab.runner", "_lane", json.dumps(spec, default=str)],
                                logs / f"{name}.log", logs / f"{name}.status.json", walls[name],
                                folders[name] / "provenance.json"))
    if tasks:
        print(f"{len(tasks)} notebook(s) in {min(a.jobs, len(tasks))} lane(s), in the order that ends soonest by the "
              "last recorded times: "
              + ", ".join(f"{t.name} ({'last ' + lanes.clock(t.expected_s) if t.expected_s else 'no time recorded'})"
                          for t in tasks), flush=True)
    results, interrupted = lanes.run_lanes(tasks, a.jobs, live=not a.no_progress, fail_fast=a.fail_fast)
    if publish:   # a stopped lane's kernel is dead now: its staging folder goes
        for name in folders:
            recover_published(folders[name], a.profile)
    print("\n" + lanes.summary_table(results, skipped))
    print(f"executed notebooks and logs: {logs}")
    ok = [r for r in results if r.status == "ok"]
    if publish and ok:   # two lanes may have published at once: one last index over every folder
        write_index(figures_root())
    if interrupted:
        print("interrupted: the notebooks stopped left their published folders as they were", flush=True)
        return 130
    failed = [r for r in results if r.status == "FAILED"]
    if publish and not failed:
        write_readme_results()
    if publish and ok:
        write_timings()
    for r in failed:
        print(f"FAILED: {r.name}" + (f" at {r.where}" if r.where else "") + f"; log {r.log}", flush=True)
    return 1 if failed else 0


def cmd_lane(a) -> int:
    """One notebook of a ``run --jobs N`` (issue 49), in a process of its own that :func:`moelab.runner.lanes.run_lanes`
    started with its output going to the notebook's log: :func:`run_one` (in a cold cache of its own with
    ``--cold``) under the lane engine, which writes the cell it starts into the lane's status file; the outcome (ok,
    failed with the error's last lines, interrupted) goes there too. Exits 0, 1 (failed) or 130 (stopped by the
    runner: SIGTERM, :func:`moelab.runner.lanes.catch_stop`)."""
    spec = json.loads(a.spec)
    lanes.catch_stop()
    src, status, runs = Path(spec["src"]), Path(spec["status"]), Path(spec["runs"])
    t0 = time.time()
    lanes.write_status(status, state="running", pid=os.getpid())
    try:
        with cold_run(runs / "cold" / src.stem) if spec["cold"] else contextlib.nullcontext():
            wall = run_one(src, spec["profile"], seed=spec["seed"], progress=spec["progress"], timeout=spec["timeout"],
                           publish=spec["publish"], params=spec["params"], jobs=spec["jobs"], runs=runs,
                           engine=lanes.status_engine(status))
    except KeyboardInterrupt:
        lanes.write_status(status, state="interrupted", wall=time.time() - t0)
        print(f"{src.stem}: stopped by the runner", flush=True)
        return 130
    except Exception as e:  # noqa: BLE001 - the runner reports it with the log
        traceback.print_exc()
        lanes.write_status(status, state="failed", wall=time.time() - t0, error=str(e).strip().splitlines()[-15:])
        return 1
    lanes.write_status(status, state="ok", wall=wall)
    print(f"{src.stem}: ok in {wall:.0f} s", flush=True)
    return 0


def stale_report(root: Path | None = None) -> list[tuple[str, list[str]]]:
    """Committed figure folders whose notebook source or imported moelab modules changed since they were produced."""
    root = root or figures_root()
    out = []
    for prov in sorted(root.glob("**/provenance.json")):
        if any(part.startswith(".") for part in prov.relative_to(root).parts):   # staging / old folders
            continue
        current, changed = sources_current(prov)
        if not (prov.parent / MD_NAME).exists():
            changed.append(f"({MD_NAME} missing)")
        if changed:
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
    """The README's results block: counts by label per notebook and profile, pointing to docs/RESULTS.md (see
    docs/CLAIMS.md)."""
    return scorecard_markdown(figures_root())


BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def write_readme_results(readme: Path | None = None) -> bool:
    """Rewrite the results block between the README's markers from the claims files under ``figures_root()``, and
    ``docs/RESULTS.md`` beside the README (the full per-claim tables, grouped per paper).
    The README is the one beside that figures folder (the repository's by default): a run that publishes into
    ``$MOELAB_FIGURES`` elsewhere (tests, a user's scratch copy) never rewrites the repository's README."""
    readme = Path(readme) if readme is not None else figures_root().parent / "README.md"
    if not readme.exists():
        return False
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        return False
    readme.write_text(_between(text, BEGIN, END, results_table()))
    docs = readme.parent / "docs"
    if docs.is_dir():   # the full per-claim tables beside the README
        (docs / "RESULTS.md").write_text(results_markdown(figures_root()))
    return True


# ---------------------------------------------------------------- make verify
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


@contextlib.contextmanager
def cold_run(root: Path):
    """Run the block with an empty artifact cache at ``root`` (:func:`cold_cache`), then copy what it built into the
    real cache (:func:`moelab.cache.adopt_entries`), also when the block fails, and remove ``root``: a cold run is
    measured as a fresh clone's would be, and later runs still reuse its work."""
    real = cache_root()
    cache = cold_cache(root, real)
    try:
        with _env(MOELAB_CACHE=cache):
            yield cache
    finally:
        n = adopt_entries(cache / "artifacts", real / "artifacts")
        print(f"cold run: {n} cache entr{'y' if n == 1 else 'ies'} that the real cache lacked copied into "
              f"{real / 'artifacts'}", flush=True)
        shutil.rmtree(root, ignore_errors=True)


def compare_claims(committed: dict, fresh: dict) -> list[dict]:
    """One row per claim: committed vs fresh verdict and number; ``status`` is ``ok``, ``flipped`` (verdict differs),
    ``outside`` (the fresh number lies outside the committed 95% interval, or beyond ``FLOAT_TOL`` relative where
    there is no interval), ``missing`` or ``new``. Claims measured in wall time (unit in seconds) are compared by
    verdict only: their numbers depend on the machine's load. A wall-clock *ratio* (unit in s/step, e.g. 02's training
    cost in % of the linear arm's s/step) whose verdict differs while the fresh number lies inside the committed
    interval is ``ok: wall clock`` (the number reproduced; the width of its interval, and with it the verdict, is the
    machine's load during the two runs), never silently: the report shows both verdicts. :func:`agrees` reads a
    status."""
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
        rows.append(row)
        if a is None or b is None:
            row["status"] = "new" if a is None else "missing"
            continue
        x, lo, hi, y = a.get("ours"), a.get("ci_low"), a.get("ci_high"), b.get("ours")
        inside = None not in (lo, hi, y) and lo <= y <= hi      # the fresh number in the committed interval
        if a["verdict"] != b["verdict"]:
            row["status"] = "ok: wall clock" if _wall_clock(a) and inside else "flipped"
        elif "second" in str(a.get("unit", "")):   # wall-time measurements depend on machine load: verdict only
            row["status"] = "ok"
        else:
            if x is None or y is None:
                ok = x is None and y is None
            elif lo is not None and hi is not None:
                ok = inside
            else:
                ok = abs(y - x) <= FLOAT_TOL * max(1.0, abs(x))
            row["status"] = "ok" if ok else "outside"
    return rows


def _wall_clock(claim: dict) -> bool:
    """A claim measured in wall time (seconds) or as a ratio of wall times (s/step): its interval depends on load."""
    unit = str(claim.get("unit", ""))
    return "second" in unit or "s/step" in unit


def agrees(row: dict) -> bool:
    """A :func:`compare_claims` row that verify counts as reproduced (``ok``, or ``ok: wall clock``)."""
    return str(row["status"]).startswith("ok")


def _fmt(v):
    return "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def verify_report(nb: str, profile: str, rows: list[dict], commit: str) -> str:
    bad = [r for r in rows if not agrees(r)]
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


def _verify_substance(text: str) -> list:
    """What a verify report says, without what changes on every run: the commit, and the fresh number of a claim that
    agrees (its verdict is the same and the number lies in the committed interval)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("Cold rerun"):
            rows.append(re.sub(r"at commit \S+", "", line))
        elif line.startswith("| ") and not line.startswith("| claim |"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) == 6 and cells[5].startswith("ok"):
                cells[4] = ""
            rows.append(cells)
        elif line.strip() and not line.startswith("|---"):
            rows.append(line)
    return rows


def write_verify_report(path: Path, report: str, force: bool = False) -> bool:
    """Write ``report`` to ``path`` only when asked (``force``) or when it differs in substance from the file there
    (so a passing ``make verify`` leaves no tracked file changed); returns whether it wrote."""
    if not force and path.exists() and _verify_substance(path.read_text()) == _verify_substance(report):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report)
    return True


THREAD_VARS = lanes.THREAD_VARS   # OMP_NUM_THREADS, MKL_NUM_THREADS


def committed_threads(prov_path: Path) -> dict:
    """``{OMP_NUM_THREADS: n, MKL_NUM_THREADS: n}`` for the torch thread count the committed run recorded (``{}``
    when it recorded none). A cold rerun with another count sums in another order, and a trained model drifts by
    more than rounding (02's phase b: geometry levels 1-3% apart between 1 and 2 threads), so verify reruns with the
    committed run's count."""
    if not prov_path.exists():
        return {}
    n = json.loads(prov_path.read_text()).get("hardware", {}).get("torch_threads")
    return {v: int(n) for v in THREAD_VARS} if isinstance(n, int) and n > 0 else {}


def cmd_verify(a) -> int:
    """Rerun notebooks cold into the scratch folder (with the committed run's torch thread count) and compare their
    claims with the committed ones."""
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
        threads = committed_threads(committed_path.parent / "provenance.json")
        with _env(MOELAB_CACHE=cache, MOELAB_SCRATCH=work / "scratch", **threads):
            print(f"{src.stem}: cold rerun of profile {a.profile} (artifact cache {cache} empty"
                  + (f"; {threads['OMP_NUM_THREADS']} torch thread(s), as the committed run" if threads else "")
                  + ") ...", flush=True)
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
        suffix = "" if a.profile == "default" else f"-{a.profile}"
        wrote = write_verify_report(VERIFY_DOCS / f"{src.stem}{suffix}.md", report, force=a.write_report)
        print(report, flush=True)
        print(f"{src.stem}: cold rerun {wall:.0f} s; report docs/verify/{src.stem}{suffix}.md "
              + ("written" if wrote else "unchanged in substance (not rewritten; --write-report writes it)"),
              flush=True)
        if not all(agrees(r) for r in rows):
            status = 1
    return status


def cmd_notebook_md(a) -> int:
    """Rewrite ``<folder>/notebook.md`` from the executed notebook the runner kept (``runs/<profile>/<nb>.ipynb``),
    after checking that it is the run the folder holds (same profile and seed)."""
    folder = Path(a.folder).resolve()
    prov_path = folder / "provenance.json"
    if not prov_path.exists():
        raise ValueError(f"{folder} has no provenance.json: give a run's output folder, "
                         f"e.g. figures/03_cluster_upcycling")
    prov = json.loads(prov_path.read_text())
    ipynb = Path(a.ipynb) if a.ipynb else RUNS / prov["profile"] / f"{prov['notebook']}.ipynb"
    if not ipynb.exists():
        raise ValueError(f"no executed notebook at {ipynb}: rerun the notebook (make figures NB=..) or pass --ipynb")
    import nbformat

    used = nbformat.read(str(ipynb), as_version=4).metadata.get("papermill", {}).get("parameters", {})
    if not a.ipynb and (used.get("PROFILE"), used.get("SEED")) != (prov["profile"], prov["seed"]):
        raise ValueError(f"{ipynb} ran PROFILE={used.get('PROFILE')!r} SEED={used.get('SEED')!r}, but {folder} holds "
                         f"profile {prov['profile']!r} seed {prov['seed']}: pass --ipynb to use it anyway")
    print(f"wrote {write_notebook_md(ipynb, folder)}")
    return 0


# ---------------------------------------------------------------- docs/timings.md
TIMINGS_DOC = REPO_ROOT / "docs" / "timings.md"


def cache_state(prov: dict) -> str:
    """How a run used the artifact cache, from its provenance: "cold (N built)", "warm (R reused, B built)", or "not
    recorded" (runs from before provenance recorded it)."""
    c = prov.get("artifact_cache")
    if not c:
        return "not recorded"
    return f"cold ({c['built']} built)" if not c["reused"] else f"warm ({c['reused']} reused, {c['built']} built)"


def timing_rows(root: Path | None = None) -> list[dict]:
    """One row per committed ``provenance.json`` under the figures root: notebook, profile, wall time, commit,
    finished, machine and threads, in notebook then profile order."""
    root = root or figures_root()
    rows = []
    order = {p: i for i, p in enumerate(PROFILES)}
    for path in root.glob("*/**/provenance.json"):
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            continue
        prov = json.loads(path.read_text())
        hw = prov.get("hardware", {})
        rows.append({"notebook": prov["notebook"], "profile": prov["profile"], "wall_time_s": prov.get("wall_time_s"),
                     "commit": str(prov.get("commit", ""))[:12] + ("+dirty" if "+dirty" in str(prov.get("commit"))
                                                                    else ""),
                     "finished": prov.get("finished", ""),
                     "machine": f"{hw.get('machine', '?')}, {hw.get('cpu_count', '?')} CPUs"
                                + (f", {', '.join(hw['cuda'])}" if hw.get("cuda") else ""),
                     "threads": hw.get("torch_threads"), "folder": str(path.parent.relative_to(root)),
                     "cache": cache_state(prov), "lanes": prov.get("jobs"),
                     "peak_rss_mib": (prov.get("memory") or {}).get("peak_rss_mib")})
    return sorted(rows, key=lambda r: (r["notebook"], order.get(r["profile"], 9)))


def timings_markdown(root: Path | None = None) -> str:
    rows = timing_rows(root)
    lines = ["# Timings", "",
             "Generated by `python -m moelab.runner timings` from the committed `figures/**/provenance.json` files; "
             "do not edit by hand. Wall time is the whole notebook run as its `provenance.json` records it; the "
             "machine and the torch threads are the run's own. *Artifact cache* says whether the run found its "
             "steps cached: a `warm` row times a rerun, not a cold run (`make figures` on a fresh clone is cold). "
             "*Lanes* is how many notebooks ran side by side (`run --jobs`, issue 49) and *peak RSS* the kernel's "
             "peak memory; runs from before they were recorded show —.", "",
             "| notebook | profile | wall time (s) | wall time | commit | finished | machine | torch threads | "
             "lanes | peak RSS (MiB) | artifact cache |",
             "|---|---|---:|---:|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        w = r["wall_time_s"]
        lines.append(f"| [{r['notebook']}](../figures/{r['folder']}/) | {r['profile']} | {w} | {_human(w)} | "
                     f"{r['commit']} | {r['finished']} | {r['machine']} | {r['threads']} | "
                     f"{'—' if r['lanes'] is None else r['lanes']} | "
                     f"{'—' if r['peak_rss_mib'] is None else round(r['peak_rss_mib'])} | {r['cache']} |")
    default = [r for r in rows if r["profile"] == "default"]
    total = _total(default)
    lines += ["", f"Total of the `default` rows: {total:.0f} s ({total / 60:.1f} min)." + total_caveat(default)]
    span = lanes_span(default)
    if span:
        lines[-1] += (f" They ran in {span['lanes']} lanes (`make figures`, issue 49): the series took {span['s']:.0f} s "
                      f"({span['s'] / 60:.1f} min) from the first notebook's start to the last one's finish.")
    return "\n".join(lines) + "\n"


def lanes_span(rows: list[dict]) -> dict | None:
    """The wall time of a series that ran side by side: when every row records lanes > 1 and the runs overlap into one
    stretch (start = finished - wall time), ``{"lanes", "s"}`` with ``s`` = last finish - first start; else None (runs
    made one at a time, or on different occasions, have no common wall time: their sum is the series' time)."""
    if not rows or any(not r.get("lanes") or r["lanes"] < 2 or not r.get("wall_time_s") for r in rows):
        return None
    try:
        spans = sorted((end - dt.timedelta(seconds=r["wall_time_s"]), end) for r in rows
                       for end in [dt.datetime.strptime(r["finished"], "%Y-%m-%d %H:%M:%S UTC")])
    except (KeyError, TypeError, ValueError):
        return None
    reach = spans[0][1]
    for start, end in spans[1:]:
        if start > reach + dt.timedelta(seconds=60):   # a gap: not one run of the series
            return None
        reach = max(reach, end)
    return {"lanes": max(r["lanes"] for r in rows), "s": (reach - spans[0][0]).total_seconds()}


def _total(rows: list[dict]) -> float:
    """Summed wall time of ``rows`` (a run without one counts 0)."""
    return sum(r["wall_time_s"] or 0 for r in rows)


def _human(w: float | None) -> str:
    """``1093.2`` -> ``18 min 13 s``; ``6.5`` -> ``6 s``; None -> ``""``."""
    return "" if w is None else f"{int(w // 60)} min {int(w % 60):02d} s" if w >= 60 else f"{w:.0f} s"


TIMINGS_BEGIN, TIMINGS_END = "<!-- timings:begin -->", "<!-- timings:end -->"
# docs/timings.md: the generated table above this line, hand-written notes (profiles, before/after tables) below it,
# which the generator keeps
TIMINGS_NOTES = "<!-- hand-written below: kept by python -m moelab.runner timings -->"


def timings_notes(doc: Path) -> str:
    """The hand-written part of ``doc`` (from :data:`TIMINGS_NOTES` on, preceded by a blank line), or ''."""
    text = Path(doc).read_text() if Path(doc).exists() else ""
    return "\n" + text[text.index(TIMINGS_NOTES):] if TIMINGS_NOTES in text else ""


def timings_generated(text: str) -> str:
    """The generated part of a docs/timings.md text (what :func:`timings_markdown` must equal)."""
    return text.split("\n" + TIMINGS_NOTES)[0] if TIMINGS_NOTES in text else text


def readme_timings_markdown(root: Path | None = None) -> str:
    """The README's timing block: one row per notebook with its committed ``default`` and ``full`` wall times and
    whether each ran cold, and the total of the ``default`` column (what a first ``make figures`` takes), from the
    same rows as ``docs/timings.md`` (:func:`timing_rows`)."""
    rows = timing_rows(root)
    cell = {(r["notebook"], r["profile"]): r for r in rows}
    names = list(dict.fromkeys(r["notebook"] for r in rows))

    def fmt(r):   # "cold" / "warm" / "not recorded": cache_state's label without its counts
        if r is None:
            return "—"
        kind = r["cache"].split(" (")[0]
        return f"{_human(r['wall_time_s'])}, {kind}, {r['threads']} thread{'s' if r['threads'] != 1 else ''}"

    lines = ["| notebook | `make figures` (`default`) | `PROFILE=full` |", "|---|---:|---:|"]
    lines += [f"| {n} | {fmt(cell.get((n, 'default')))} | {fmt(cell.get((n, 'full')))} |" for n in names]
    default = [r for r in rows if r["profile"] == "default"]
    full = [r for r in rows if r["profile"] == "full"]
    lines.append(f"| **total** | **{_human(_total(default))}** | {_human(_total(full))} |")
    span = lanes_span(default)
    if span:
        lines.append(f"| **`make figures` wall time, {span['lanes']} lanes** | **{_human(span['s'])}** | |")
    caveat = total_caveat(default, these="the `default` runs").strip()
    return "\n".join(lines) + ("\n\n" + caveat if caveat else "")


def total_caveat(rows: list[dict], these: str = "these") -> str:
    """What the total of ``rows`` is not: rows that ran on a warm artifact cache make it a lower bound of a cold
    ``make figures``, and rows that did not record their cache use (runs from before provenance did) may be either."""
    warm = [r["notebook"] for r in rows if r["cache"].startswith("warm")]
    unknown = [r["notebook"] for r in rows if r["cache"] == "not recorded"]
    out = ""
    if warm:
        out += (f" Of {these}, {', '.join(warm)} ran on a warm artifact cache, so the total is below a cold "
                "`make figures`.")
    if unknown:
        out += (f" {', '.join(unknown)} did not record {'its' if len(unknown) == 1 else 'their'} cache use (published "
                "before provenance did): warm or cold is not known, so the total is not a measured cold time.")
    if warm or unknown:
        out += " `make figures NB=.. COLD=1` republishes a notebook from an empty artifact cache, timing it cold."
    return out


def write_timings(doc: Path | None = None) -> Path | None:
    """Regenerate the timing table from the provenance files under ``figures_root()``, into the ``docs/timings.md``
    beside that figures folder (the repository's by default; a run publishing into ``$MOELAB_FIGURES`` elsewhere
    writes none, as :func:`write_readme_results`), and the README's short table beside it
    (:func:`readme_timings_markdown`, between its timing markers). Returns the path written, or None."""
    doc = Path(doc) if doc is not None else figures_root().parent / "docs" / "timings.md"
    if not doc.parent.is_dir():
        return None
    doc.write_text(timings_markdown() + timings_notes(doc))
    readme = doc.parent.parent / "README.md"   # the README beside that docs/ folder carries the short table
    if doc.parent.name == "docs" and readme.exists():
        text = readme.read_text()
        new = _between(text, TIMINGS_BEGIN, TIMINGS_END, readme_timings_markdown())
        if new != text:
            readme.write_text(new)
    return doc


def _between(text: str, begin: str, end: str, body: str) -> str:
    """``text`` with what lies between the markers ``begin`` and ``end`` replaced by ``body`` (unchanged without
    them)."""
    if begin not in text or end not in text:
        return text
    return re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda m: f"{begin}\n{body}\n{end}", text, flags=re.S)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moelab.runner", description="Run the notebook series.")
    # `_lane` (one notebook of `run --jobs N`, started by the runner itself) is left out of the usage
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{run,verify,list,stale,readme,notebook-md,timings}")
    r = sub.add_parser("run", help="execute notebooks with papermill")
    r.add_argument("--profile", default="default", help=f"one of {PROFILES}")
    r.add_argument("--only", nargs="+", metavar="NB", help="notebook numbers or names (e.g. 03 04_mass)")
    r.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a notebook parameter (repeatable), e.g. -p MODEL_PATH=/models/llama")
    r.add_argument("--params", action="append", default=[], metavar="'NAME=VALUE ...'",
                   help="several parameters in one string, split before each NAME= (make figures P=...)")
    r.add_argument("--scratch", action="store_true",
                   help="write outputs to the scratch folder (runs/scratch) instead of publishing into figures/")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--dry-run", action="store_true",
                   help="paper profile only: every cell of the paper path on cut sizes, into runs/scratch (issue 51; "
                        "claims say 'dry run'); check local paths and formats before booking GPUs")
    r.add_argument("--force", action="store_true", help="rerun notebooks whose outputs are current")
    r.add_argument("--cold", action="store_true",
                   help="rerun with an empty artifact cache (as on a fresh clone; implies --force), so the recorded "
                        "wall time is a cold one; what it builds is copied into the cache afterwards")
    r.add_argument("--fail-fast", action="store_true")
    r.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="run N notebooks side by side (the order that ends soonest by the recorded times), each on one torch thread, each one's output "
                        "in runs/<profile>/<nb>.log (default 1: one at a time, as before; make figures: JOBS=2)")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--cell-timeout", type=int, default=None, help="seconds per cell (default: none)")
    v = sub.add_parser("verify", help="rerun notebooks with an empty artifact cache into scratch and compare claims")
    v.add_argument("--profile", default="default", help="default, full or paper")
    v.add_argument("--only", nargs="+", metavar="NB", help="notebook numbers or names (e.g. 00)")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--no-progress", action="store_true")
    v.add_argument("--write-report", action="store_true",
                   help="write docs/verify/<nb>.md even when it says the same as the file there")
    lane = sub.add_parser("_lane")
    lane.add_argument("spec", help="the lane's JSON specification")
    sub.add_parser("list")
    sub.add_parser("stale")
    sub.add_parser("readme")
    m = sub.add_parser("notebook-md", help="rewrite FOLDER/notebook.md from the kept executed notebook")
    m.add_argument("folder", help="a run's output folder, e.g. figures/03_cluster_upcycling or its full/")
    m.add_argument("--ipynb", help="the executed notebook (default: runs/<profile>/<nb>.ipynb)")
    t = sub.add_parser("timings", help="regenerate docs/timings.md from the committed provenance.json files")
    t.add_argument("--check", action="store_true", help="exit 1 if docs/timings.md is not what it would be")
    a = ap.parse_args(argv)
    commands = {"run": cmd_run, "verify": cmd_verify, "notebook-md": cmd_notebook_md, "_lane": cmd_lane}
    if a.cmd in commands:
        try:
            return commands[a.cmd](a)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if a.cmd == "timings":
        text = timings_markdown()
        if a.check:
            readme = (REPO_ROOT / "README.md").read_text()
            ok = TIMINGS_DOC.exists() and timings_generated(TIMINGS_DOC.read_text()) == text and \
                _between(readme, TIMINGS_BEGIN, TIMINGS_END, readme_timings_markdown()) == readme
            print("docs/timings.md and the README's timing table are current" if ok
                  else "docs/timings.md or the README's timing table differs: run python -m moelab.runner timings")
            return 0 if ok else 1
        write_timings(TIMINGS_DOC)
        print(f"wrote {TIMINGS_DOC.relative_to(REPO_ROOT)} and the README's timing table ({len(timing_rows())} runs)")
        return 0
    if a.cmd == "list":
        for p in discover():
            print(p.stem)
        return 0
    if a.cmd == "stale":
        return cmd_stale(a)
    if a.cmd == "readme":
        print("README and docs/RESULTS.md updated" if write_readme_results() else "README has no results markers")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
