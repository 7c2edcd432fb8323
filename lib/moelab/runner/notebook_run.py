"""Per-notebook run object: seeds, output directory, figures, tables, claims and provenance.

A notebook's derived-settings cell does ``run = moelab.start_run("04_mass", profile=PROFILE, seed=SEED)`` and then
saves every figure with ``run.savefig`` and every result table with ``run.save_table``; its conclusion cell calls
``run.finish()``, which computes the claims from the saved tables with the notebook's claim definitions
(:data:`moelab.claims.registry.CLAIM_DEFS`: ``moelab.<paper>.claims``, ``moelab.primer.claims`` for 00; docs/CLAIMS.md).

Where outputs go:

- **Scratch** (the default for every interactive run, always for ``smoke``): ``runs/scratch/<profile>/<nb>/``
  (git-ignored; ``MOELAB_SCRATCH`` overrides the root). Running cells in JupyterLab never touches ``figures/``.
- **Published** (``make figures``, the runner without ``--scratch``, or ``start_run(..., publish=True)``; the runner
  sets ``MOELAB_PUBLISH=1`` for its kernels): ``figures/<nb>/`` for ``default``, ``figures/<nb>/full/`` and
  ``figures/<nb>/paper/`` for those profiles. A published run writes into a hidden staging folder beside its target
  and swaps it in by renames only when :meth:`NotebookRun.finish` succeeds, so a failed or killed run never leaves a
  folder half old, half new (and a failed paper run leaves no empty ``paper/``). Publishing ``default`` keeps the
  ``full/`` and ``paper/`` subfolders; publishing ``full`` or ``paper`` leaves the default files alone.

``MOELAB_FIGURES`` overrides the figures root (tests use it). Each output directory keeps a ``manifest.json``;
``INDEX.md`` at the figures (or scratch) root is regenerated from all manifests.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from moelab.claims import frame as claims_frame
from moelab.claims import rebuild as claims_rebuild
from moelab.cache import source_digest, usage as cache_usage
from moelab.profiles import check_profile
from moelab.seed import seed_everything

REPO_ROOT = Path(__file__).resolve().parents[3]
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*$")
_SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
PACKAGES = ("torch", "transformers", "accelerate", "sentence-transformers", "peft", "lm-eval", "scikit-learn",
            "numpy", "scipy", "pandas", "matplotlib", "papermill")


def figures_root() -> Path:
    return Path(os.environ.get("MOELAB_FIGURES") or REPO_ROOT / "figures")


def scratch_root() -> Path:
    """Root of unpublished outputs: ``$MOELAB_SCRATCH`` (``$MOELAB_SMOKE_DIR`` is accepted too) or ``runs/scratch``."""
    env = os.environ.get("MOELAB_SCRATCH") or os.environ.get("MOELAB_SMOKE_DIR")
    return Path(env) if env else REPO_ROOT / "runs" / "scratch"


def publish_requested(publish=None, profile: str = "default") -> bool:
    """Whether a run publishes into ``figures/``: ``publish`` if given, else ``$MOELAB_PUBLISH`` (set by the runner).
    ``smoke`` never publishes."""
    check_profile(profile)
    if publish is None:
        publish = os.environ.get("MOELAB_PUBLISH", "0").strip().lower() in ("1", "true", "yes")
    if publish and profile == "smoke":
        raise ValueError("the smoke profile is never published (it is a quick check, not a result); "
                         "use PROFILE='default' (or 'full'/'paper') to publish, or publish=False")
    return bool(publish)


def check_dry_run(dry_run, profile: str, publish=None) -> bool:
    """``DRY_RUN`` of a notebook's parameters cell (issue 51): a dry run is of the ``paper`` profile only, is never
    published, and its claims say ``dry run``. Raises ``ValueError`` naming the value and the fix otherwise."""
    if dry_run not in (True, False, 0, 1):
        raise ValueError(f"DRY_RUN must be True or False, got {dry_run!r}")
    if not dry_run:
        return False
    if profile != "paper":
        raise ValueError(f"DRY_RUN=True rehearses the paper profile, but PROFILE is {profile!r}: set PROFILE='paper' "
                         f"(python -m moelab.runner run --profile paper --dry-run ...), or DRY_RUN=False")
    if publish:
        raise ValueError("a dry run is never published (its sizes are cut; its claims say 'dry run'): drop "
                         "publish=True, or run without DRY_RUN to publish the paper profile")
    return True


def index_root(profile: str, publish: bool = True) -> Path:
    """The root whose INDEX.md lists a profile's outputs: ``figures/`` when published, else the scratch root of
    that profile."""
    check_profile(profile)
    if publish and profile != "smoke":
        return figures_root()
    return scratch_root() / profile


def output_dir(notebook: str, profile: str, publish: bool = True) -> Path:
    """Where a notebook's figures, tables and claims end up for ``profile`` (published or scratch)."""
    if not (publish and profile != "smoke"):
        return index_root(profile, publish=False) / notebook
    base = figures_root() / notebook
    return base if profile == "default" else base / profile


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, e.g. a killed kernel nobody reaped, counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


_STAGE_RE = re.compile(r"^\.(?P<name>.+)\.(?P<what>staging|old)-(?P<pid>\d+)$")


def _keep_subdirs(profile: str) -> tuple[str, ...]:
    """Subfolders of a published folder that belong to other profiles (kept when this one is replaced)."""
    return ("full", "paper") if profile == "default" else ()


def recover_published(final: Path, profile: str) -> None:
    """Finish or undo a swap that a killed process left half done, and remove staging folders of dead processes.

    The swap (:func:`publish_dir`) is: rename ``final`` -> ``.<name>.old-<pid>``; move the other profiles' subfolders
    from there into the staging folder; rename staging -> ``final``; delete the old folder. Every intermediate state
    is recognised here: if ``final`` is missing but an old folder exists, the old one (with the subfolders moved back
    from staging) is restored.
    """
    parent, name = final.parent, final.name
    if not parent.is_dir():
        return
    for p in sorted(parent.iterdir()):
        m = _STAGE_RE.match(p.name)
        if not m or m["name"] != name or _pid_alive(int(m["pid"])) and int(m["pid"]) != os.getpid():
            continue
        if m["what"] == "old":
            if not final.exists():      # killed between the renames: put the old folder back
                staging = parent / f".{name}.staging-{m['pid']}"
                for sub in _keep_subdirs(profile):
                    if (staging / sub).exists() and not (p / sub).exists():
                        os.replace(staging / sub, p / sub)
                os.replace(p, final)
            else:
                shutil.rmtree(p, ignore_errors=True)
    for p in sorted(parent.iterdir()):     # staging folders of dead (or this) processes: a run that never finished
        m = _STAGE_RE.match(p.name)
        if m and m["name"] == name and m["what"] == "staging" and (
                not _pid_alive(int(m["pid"])) or int(m["pid"]) == os.getpid()):
            shutil.rmtree(p, ignore_errors=True)


def publish_dir(staging: Path, final: Path, profile: str) -> None:
    """Replace ``final`` by ``staging`` with renames, keeping the other profiles' subfolders of ``final``."""
    old = final.parent / f".{final.name}.old-{os.getpid()}"
    if final.exists():
        os.replace(final, old)
        keep = _keep_subdirs(profile)
        for p in list(old.iterdir()) if keep else ():
            # the other profiles' folders, and the staging folder of a full/paper run still going inside this one
            m = _STAGE_RE.match(p.name)
            if p.name in keep or (m and m["name"] in keep):
                os.replace(p, staging / p.name)
    os.replace(staging, final)
    shutil.rmtree(old, ignore_errors=True)


# Tracked files that runs and reports write (never sources of a run's numbers): a change there does not make a
# commit "+dirty". The README's results table and docs/RESULTS.md are regenerated after a publishing run,
# docs/verdict-changes.md is appended to by every publishing run (otherwise the second notebook of a series would
# count the first's entry as a change), docs/verify/ is written by `make verify`, docs/timings.md by
# `moelab.runner.cli timings`.
GENERATED_OUTPUTS = ("figures", "README.md", "docs/RESULTS.md", "docs/verdict-changes.md", "docs/verify",
                     "docs/timings.md")


def dirty_sources() -> list[str]:
    """Tracked files that differ from HEAD, outside :data:`GENERATED_OUTPUTS` (``git status --porcelain`` lines)."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "."]
                         + [f":(exclude){p}" for p in GENERATED_OUTPUTS], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=10).stdout
    return [line for line in out.splitlines() if line.strip()]


def git_commit() -> str:
    """HEAD, with ``+dirty`` when tracked sources differ from it. Generated outputs (:data:`GENERATED_OUTPUTS`) do not
    count: a rerun over committed figures is otherwise always dirty."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        return (sha or "unknown") + ("+dirty" if dirty_sources() else "")
    except Exception:
        return "unknown"


def package_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            pass
    return out


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo; else ``platform.processor()``). Recorded because some embedders
    (e.g. the prebuilt e5 engine) give machine-dependent floats: numbers can move between CPU models."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def hardware() -> dict:
    hw = {"platform": platform.platform(), "cpu_count": os.cpu_count(), "machine": platform.machine(),
          "cpu_model": cpu_model()}
    try:
        import torch

        hw["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            hw["cuda"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:  # pragma: no cover
        pass
    return hw


def peak_rss_mib() -> dict:
    """``{"peak_rss_mib": ...}``: the peak resident memory of this process (``resource.getrusage``; ``{}`` where the
    module is missing). Inside a runner kernel this is the notebook's own peak: issue 49 runs two kernels side by side
    and records each one's peak in ``provenance.json`` (``memory``), so that two lanes are known to fit the machine.
    (The children's figure is left out: on Linux a forked child counts the memory of the parent it was forked from.)"""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return {}
    per_mib = 2 ** 20 if sys.platform == "darwin" else 2 ** 10   # ru_maxrss: bytes on macOS, KiB on Linux
    return {"peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / per_mib, 1)}


# How provenance's ``sources`` identify a file. "ast-v1": moelab modules by :func:`moelab.cache.source_digest` (the
# normalised AST, as in the cache keys), the notebook by its bytes (its narrative is published with the run).
# Provenance written before it has no ``source_digest`` field and holds raw sha256 prefixes throughout.
SOURCE_DIGEST = "ast-v1"


def file_sha(path: Path) -> str:
    """16-hex-digit sha256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def source_id(rel: str, kind: str | None = SOURCE_DIGEST) -> str:
    """The identity of repository file ``rel`` as provenance records it under digest ``kind`` (``None``: legacy raw
    sha256 for every file)."""
    p = REPO_ROOT / rel
    if kind is None or not rel.startswith("lib/"):
        return file_sha(p)
    if kind != SOURCE_DIGEST:
        raise ValueError(f"unknown source digest {kind!r} in provenance.json; this moelab knows {SOURCE_DIGEST!r}")
    return source_digest(p)


# not sources of a run's numbers: verdict code (recomputed from saved tables by `moelab.claims rebuild`, never by a
# rerun) and the run plumbing (where files go, provenance, the runner, ``moelab.start_run``)
VERDICT_CODE = ("lib/moelab/claims/", "lib/moelab/runner/", "lib/moelab/__init__.py",
                # the artifact cache decides whether a step is rebuilt, never what it computes; the progress bar
                # only displays; profiles.py names the profiles and words the messages (all left out of the cache
                # keys too: cache.NOT_IN_KEYS)
                "lib/moelab/cache.py", "lib/moelab/progress.py", "lib/moelab/profiles.py")
# a paper package's claim definitions are verdict code too (cache.py leaves ``*.claims`` modules out of keys alike)
PAPER_CLAIMS_RE = re.compile(r"^lib/moelab/[A-Za-z0-9_]+/claims\.py$")


def is_verdict_code(rel: str) -> bool:
    """Whether repository file ``rel`` is verdict code or run plumbing (:data:`VERDICT_CODE`, a paper's
    ``claims.py``): never part of a folder's sources, so a change there makes no folder stale."""
    return rel.startswith(VERDICT_CODE) or bool(PAPER_CLAIMS_RE.match(rel))


# The notebook -> claim definitions table lives in the claims package (moelab.claims.registry), which imports a
# definitions module only when its notebook's claims are computed; re-exported here for the runner.
from moelab.claims.registry import CLAIM_DEFS, claim_defs  # noqa: E402


def source_hashes(notebook: str) -> dict:
    """Content hashes of the notebook's source and every moelab module imported so far (for the staleness report and
    the runner's resume check). The claims package and the papers' ``claims.py`` are left out (a change there is applied to published folders by
    ``python -m moelab.claims rebuild``, and by the runner when it skips a current notebook, not by a rerun), and so
    is the run plumbing (this module and the runner), which decides where files go, not what they contain."""
    out = {}
    nb = REPO_ROOT / "notebooks" / f"{notebook}.py"
    if nb.exists():
        out[str(nb.relative_to(REPO_ROOT))] = source_id(str(nb.relative_to(REPO_ROOT)))
    lib = REPO_ROOT / "lib" / "moelab"
    for name, mod in sorted(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if name.startswith("moelab") and f and Path(f).resolve().is_relative_to(lib):
            rel = str(Path(f).resolve().relative_to(REPO_ROOT))
            if not is_verdict_code(rel):
                out[rel] = source_id(rel)
    return out


# Set by the runner (moelab.runner.cli) for its kernels: the ``-p`` values it passed (JSON), the runner's pid (a
# published run's staging folder is handed to it at finish(), so that it publishes the folder together with the
# executed notebook's Markdown), and whether savefig shows a link to the saved PNG (the executed notebook's Markdown
# then shows each figure from the file the helper wrote).
PARAMS_ENV, OWNER_ENV, FIGURE_LINKS_ENV = "MOELAB_PARAMS", "MOELAB_PUBLISH_OWNER", "MOELAB_FIGURE_LINKS"
# ... and how many notebooks it runs side by side (``--jobs``, issue 49), recorded in provenance as ``jobs``
JOBS_ENV = "MOELAB_JOBS"


def runner_params() -> dict | None:
    """The ``-p`` parameters the runner passed to this kernel (``{}`` for none), or None outside the runner (a run
    started in JupyterLab: its parameters are whatever the cell said, so the runner never counts it as current)."""
    raw = os.environ.get(PARAMS_ENV)
    return None if raw is None else json.loads(raw)


def runner_jobs() -> int | None:
    """How many notebooks the runner ran side by side with this one (``--jobs``; issue 49), or None outside the
    runner. With more than one, every kernel runs on one torch thread (``hardware.torch_threads`` says so)."""
    raw = os.environ.get(JOBS_ENV)
    return int(raw) if raw else None


def staging_dir(final: Path, pid: int) -> Path:
    """The hidden staging folder of process ``pid`` for published folder ``final``."""
    return final.parent / f".{final.name}.staging-{pid}"


def claims_for_reader(claims):
    """The columns of a claims frame (``run.finish()``) a reader needs: the claim, the paper's reference and number,
    ours with its 95% interval, and the verdict (the full record has 25 columns)."""
    return claims[["claim", "paper_ref", "paper_value", "ours", "ci_low", "ci_high", "verdict"]]


class NotebookRun:
    """Seeds, output directory, figure/table helpers, claims and provenance for one notebook execution."""

    def __init__(self, notebook: str, profile: str, seed: int = 0, seeds=None, publish: bool | None = None,
                 dry_run: bool = False):
        if not re.match(r"^\d\d_[a-z0-9_]+$", notebook or ""):
            raise ValueError(f"notebook name must look like '04_mass', got {notebook!r}")
        self.notebook = notebook
        self.profile = check_profile(profile)
        self.dry_run = check_dry_run(dry_run, profile, publish)
        self.publish = False if self.dry_run else publish_requested(publish, profile)
        self.seed = seed_everything(seed)
        self.seeds = list(seeds) if seeds is not None else [seed]
        self.final_dir = output_dir(notebook, profile, self.publish)
        if self.publish:   # write into a staging folder; finish() swaps it in
            recover_published(self.final_dir, profile)
            self.out_dir = staging_dir(self.final_dir, os.getpid())
        else:              # scratch: start from an empty folder so no earlier output mixes in
            self.out_dir = self.final_dir
            shutil.rmtree(self.out_dir, ignore_errors=True)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time()
        self._cache_at_start = cache_usage()
        self.commit_at_start = git_commit()   # a long run can span commits: provenance keeps both ends
        self._manifest_path = self.out_dir / "manifest.json"
        self._entries: dict[str, dict] = {}
        self._extra: dict = {}
        self.finished = False

    # ---- provenance ----
    def provenance(self) -> dict:
        return {"notebook": self.notebook, "profile": self.profile, "seed": self.seed, "seeds": self.seeds,
                "commit": git_commit(), "commit_at_start": self.commit_at_start, "packages": package_versions(),
                "hardware": hardware(),
                "wall_time_s": round(time.time() - self.t0, 1), "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                "params": runner_params(), "jobs": runner_jobs(), "memory": peak_rss_mib(),
                **({"dry_run": True} if self.dry_run else {}),
                "artifact_cache": self.artifact_cache(), **self._extra}

    def artifact_cache(self) -> dict:
        """Artifact-cache use since this run started: ``reused`` entries (built before the run), ``reused_own``
        (built earlier in this run, asked for again), ``built`` entries, ``build_s`` seconds building, and ``state``
        "cold" (nothing from before the run reused) or "warm" (its wall time is a rerun's, not a cold run's)."""
        now = cache_usage()
        d = {k: round(now[k] - self._cache_at_start[k], 1) if k == "build_s" else now[k] - self._cache_at_start[k]
             for k in now}
        return {**d, "state": "warm" if d["reused"] else "cold"}

    def note(self, **info):
        """Record extra provenance (e.g. steps each variant got, model names) in provenance.json."""
        self._extra.update(info)

    def _check_ids(self, fig_id: str, slug: str):
        if not _ID_RE.match(fig_id or ""):
            raise ValueError(f"figure/table id must be the paper's id like 'fig2' or 'table1', got {fig_id!r}")
        if not _SLUG_RE.match(slug or ""):
            raise ValueError(f"slug must be lower-case letters, digits, '_' or '-', got {slug!r}")

    def _record(self, kind, fig_id, slug, files, caption):
        self._entries[f"{fig_id}_{slug}"] = {
            "kind": kind, "id": fig_id, "slug": slug, "files": [f.name for f in files], "caption": caption,
            "profile": self.profile, "seed": self.seed, "commit": git_commit(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
        self._write_manifest()

    def _write_manifest(self):
        old = {}
        if self._manifest_path.exists():
            try:
                old = json.loads(self._manifest_path.read_text()).get("entries", {})
            except json.JSONDecodeError:
                old = {}
        old.update(self._entries)
        self._manifest_path.write_text(json.dumps({"notebook": self.notebook, "profile": self.profile,
                                                   "entries": old}, indent=1))
        if not self.publish:   # a published run's index is written when it is swapped in
            write_index(index_root(self.profile, publish=False))

    # ---- outputs ----
    def savefig(self, fig, fig_id: str, slug: str, caption: str = "", dpi: int = 130):
        """Save ``fig`` as ``<out_dir>/<fig_id>_<slug>.png`` and ``.pdf`` and index it. Returns the PNG path."""
        self._check_ids(fig_id, slug)
        if fig is None or not hasattr(fig, "savefig"):
            raise ValueError(f"savefig needs a matplotlib Figure, got {type(fig).__name__}")
        png = self.out_dir / f"{fig_id}_{slug}.png"
        pdf = png.with_suffix(".pdf")
        fig.savefig(png, dpi=dpi, bbox_inches="tight", metadata={"Software": f"moelab {self.notebook} {self.profile}"})
        fig.savefig(pdf, bbox_inches="tight")
        self._record("figure", fig_id, slug, [png, pdf], caption)
        if os.environ.get(FIGURE_LINKS_ENV) == "1":   # the runner's kernel: the figure in the executed notebook
            from IPython.display import Markdown, display   # only under the runner, which runs an IPython kernel

            display(Markdown(f"![{fig_id} {slug}: {caption}]({png.name})"))
        return png

    def save_table(self, df, table_id: str, slug: str, caption: str = "", index: bool = False):
        """Save a tidy DataFrame as ``<out_dir>/<table_id>_<slug>.csv`` and index it. Returns the path."""
        self._check_ids(table_id, slug)
        if not hasattr(df, "to_csv"):
            raise ValueError(f"save_table needs a pandas DataFrame, got {type(df).__name__}")
        path = self.out_dir / f"{table_id}_{slug}.csv"
        df.to_csv(path, index=index)
        self._record("table", table_id, slug, [path], caption)
        return path

    def save_json(self, obj, name: str):
        if not _SLUG_RE.match(name or ""):
            raise ValueError(f"json name must be a slug, got {name!r}")
        path = self.out_dir / f"{name}.json"
        path.write_text(json.dumps(obj, indent=1, default=str))
        return path

    def finish(self):
        """Write ``provenance.json`` (commit at the start and at the end of the run, versions, seeds, profile, hardware, wall time, source hashes), compute
        ``claims.json`` from the saved tables with the notebook's claim definitions (:func:`moelab.claims.rebuild`),
        publish the folder if this run publishes, and return the claims as a DataFrame."""
        prov = self.provenance()
        prov["publish"] = self.publish
        prov["sources"] = source_hashes(self.notebook)
        prov["source_digest"] = SOURCE_DIGEST
        (self.out_dir / "provenance.json").write_text(json.dumps(prov, indent=1, default=str))
        previous = self.final_dir / "claims.json"
        if self.publish and previous.exists():   # lets rebuild log verdict changes against the published file
            shutil.copyfile(previous, self.out_dir / "claims.json")
        records = claims_rebuild(self.out_dir, defs=claim_defs)
        owner = int(os.environ.get(OWNER_ENV) or 0)
        if self.publish and owner and owner != os.getpid():
            # under the runner: hand the staging folder to it (renamed after its pid); it adds the executed notebook's
            # Markdown and publishes the folder once the notebook has finished (moelab.runner.cli.run_one)
            handed = staging_dir(self.final_dir, owner)
            shutil.rmtree(handed, ignore_errors=True)
            os.replace(self.out_dir, handed)
            self.out_dir = handed
            self.finished = True
            return claims_frame(records)
        if self.publish:
            publish_dir(self.out_dir, self.final_dir, self.profile)
            self.out_dir = self.final_dir
        self._manifest_path = self.out_dir / "manifest.json"
        write_index(index_root(self.profile, self.publish))
        self.finished = True
        return claims_frame(records)


def write_index(root: Path | None = None) -> Path:
    """Regenerate ``INDEX.md`` (paper figure/table -> notebook -> file -> profile) from every manifest under root."""
    root = Path(root) if root is not None else figures_root()
    path = root / "INDEX.md"
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".INDEX.md.{os.getpid()}"   # two lanes (issue 49) may publish at once: each writes a whole file
    tmp.write_text(index_text(root))
    os.replace(tmp, path)
    return path


def index_text(root: Path) -> str:
    """The text of ``root/INDEX.md`` as :func:`write_index` writes it, from the manifests under ``root``."""
    rows = []
    for m in sorted(root.glob("**/manifest.json")):
        if any(part.startswith(".") for part in m.relative_to(root).parts):   # staging / old folders
            continue
        try:
            data = json.loads(m.read_text())
        except json.JSONDecodeError:
            continue
        for e in data.get("entries", {}).values():
            rel = m.parent.relative_to(root)
            for f in e["files"]:
                if f.endswith(".pdf"):
                    continue
                rows.append((e["id"], data["notebook"], f"[{rel / f}]({rel / f})", e["profile"], e.get("caption", "")))
    lines = ["# Figures and tables", "",
             "Generated by `moelab.runner.notebook_run.write_index` from each output directory's manifest.json; do not edit by hand.", "",
             "| paper figure/table | notebook | file | profile | caption |", "|---|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows]
    return "\n".join(lines) + "\n"
