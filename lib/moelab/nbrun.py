"""Per-notebook run object: seeds, output directory, figures, tables, claims and provenance (foundation issue, item 6).

A notebook's derived-settings cell does ``run = moelab.start_run("04_mass", profile=PROFILE, seed=SEED)`` and then
saves every figure with ``run.savefig`` and every result table with ``run.save_table``; its conclusion cell records
claims in ``run.claims`` and calls ``run.finish()``.

Output directories (``run.out_dir``): ``figures/<nb>/`` for ``default``, ``figures/<nb>/full/`` and
``figures/<nb>/paper/`` for those profiles, and a scratch directory under the git-ignored ``runs/smoke/`` for ``smoke``
(smoke runs never write over committed figures). ``MOELAB_FIGURES`` overrides the figures root (tests use it).
Each output directory keeps a ``manifest.json``; ``figures/INDEX.md`` is regenerated from all manifests.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from moelab.claims import ClaimSet
from moelab.profiles import check_profile
from moelab.seed import seed_everything

REPO_ROOT = Path(__file__).resolve().parents[2]
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*$")
_SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
PACKAGES = ("torch", "transformers", "accelerate", "sentence-transformers", "peft", "lm-eval", "scikit-learn",
            "numpy", "scipy", "pandas", "matplotlib", "papermill")


def figures_root() -> Path:
    return Path(os.environ.get("MOELAB_FIGURES") or REPO_ROOT / "figures")


def index_root(profile: str) -> Path:
    """The root whose INDEX.md lists a profile's outputs: the scratch root for smoke, else ``figures/``."""
    check_profile(profile)
    if profile == "smoke":
        return Path(os.environ.get("MOELAB_SMOKE_DIR") or REPO_ROOT / "runs" / "smoke" / "figures")
    return figures_root()


def output_dir(notebook: str, profile: str) -> Path:
    """Where a notebook's figures, tables and claims go for ``profile``."""
    base = index_root(profile) / notebook
    return base if profile in ("smoke", "default") else base / profile


def git_commit() -> str:
    """HEAD, with ``+dirty`` when tracked sources differ from it. Generated outputs (``figures/``, the README's
    results table) do not count: a rerun over committed figures is otherwise always dirty."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)figures", ":(exclude)README.md"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (sha or "unknown") + ("+dirty" if dirty else "")
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


def hardware() -> dict:
    hw = {"platform": platform.platform(), "cpu_count": os.cpu_count(), "machine": platform.machine()}
    try:
        import torch

        hw["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            hw["cuda"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:  # pragma: no cover
        pass
    return hw


def file_sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def source_hashes(notebook: str) -> dict:
    """Content hashes of the notebook's source and every moelab module imported so far (for the staleness report)."""
    out = {}
    nb = REPO_ROOT / "notebooks" / f"{notebook}.py"
    if nb.exists():
        out[str(nb.relative_to(REPO_ROOT))] = file_sha(nb)
    lib = REPO_ROOT / "lib" / "moelab"
    for name, mod in sorted(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if name.startswith("moelab") and f and Path(f).resolve().is_relative_to(lib):
            out[str(Path(f).resolve().relative_to(REPO_ROOT))] = file_sha(Path(f))
    return out


class NotebookRun:
    """Seeds, output directory, figure/table helpers, claims and provenance for one notebook execution."""

    def __init__(self, notebook: str, profile: str, seed: int = 0, seeds=None):
        if not re.match(r"^\d\d_[a-z0-9_]+$", notebook or ""):
            raise ValueError(f"notebook name must look like '04_mass', got {notebook!r}")
        self.notebook = notebook
        self.profile = check_profile(profile)
        self.seed = seed_everything(seed)
        self.seeds = list(seeds) if seeds is not None else [seed]
        self.out_dir = output_dir(notebook, profile)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # a run in progress is not current: the runner's resume check must not skip it if it fails midway
        (self.out_dir / "provenance.json").unlink(missing_ok=True)
        self.claims = ClaimSet(seed=seed)
        self.t0 = time.time()
        self._manifest_path = self.out_dir / "manifest.json"
        self._entries: dict[str, dict] = {}
        self._extra: dict = {}

    # ---- provenance ----
    def provenance(self) -> dict:
        return {"notebook": self.notebook, "profile": self.profile, "seed": self.seed, "seeds": self.seeds,
                "commit": git_commit(), "packages": package_versions(), "hardware": hardware(),
                "wall_time_s": round(time.time() - self.t0, 1), "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                **self._extra}

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
        write_index(index_root(self.profile))

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
        """Write ``claims.json`` and ``provenance.json`` (commit, versions, seeds, profile, hardware, wall time,
        source hashes); return the claims as a DataFrame."""
        prov = self.provenance()
        prov["sources"] = source_hashes(self.notebook)
        (self.out_dir / "provenance.json").write_text(json.dumps(prov, indent=1, default=str))
        self.claims.save(self.out_dir / "claims.json", prov)
        write_index(index_root(self.profile))
        return self.claims.frame()


def write_index(root: Path | None = None) -> Path:
    """Regenerate ``INDEX.md`` (paper figure/table -> notebook -> file -> profile) from every manifest under root."""
    root = Path(root) if root is not None else figures_root()
    rows = []
    for m in sorted(root.glob("**/manifest.json")):
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
             "Generated by `moelab.nbrun.write_index` from each output directory's manifest.json; do not edit by hand.", "",
             "| paper figure/table | notebook | file | profile | caption |", "|---|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows]
    path = root / "INDEX.md"
    root.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
