"""The notebook runner pointed at a temporary tree (notebooks, runs, scratch), shared by the runner and lanes tests."""
from __future__ import annotations

from pathlib import Path

from moelab.runner import cli


def point_runner(tmp_path: Path, monkeypatch) -> Path:
    """Notebooks from ``tmp_path/nbs``, runs in ``tmp_path/runs``, scratch in ``tmp_path/scratch``."""
    monkeypatch.setattr(cli, "NB_DIR", tmp_path / "nbs")
    monkeypatch.setattr(cli, "RUNS", tmp_path / "runs")
    monkeypatch.setenv("MOELAB_SCRATCH", str(tmp_path / "scratch"))
    return tmp_path


def tree(d: Path) -> dict:
    """Every file under ``d`` (relative path -> bytes): a folder's state, to compare before and after."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}
