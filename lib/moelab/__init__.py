"""moelab: a reproducibility companion for five Mixture-of-Experts papers.

Layout (see README.md):
- ``moelab.core``: the shared MoE core (routers, losses, experts, dispatch, aggregation, capture, dense->MoE conversion).
- one package per paper, each with its claim definitions in ``<paper>/claims.py``: ``moce`` (01), ``sba`` (02),
  ``cluster_upcycling`` (03), ``mass`` (04), ``free_moe`` (05); ``primer`` holds notebook 00's experiments.
- shared services: ``assets`` (real offline models/data), ``cache`` (one cache dir, atomic entries), ``suite`` (data and
  evaluation), ``train`` (Accelerate trainer), ``stats`` (intervals and rules the reports share), ``claims`` (the
  verdict engine; it imports no paper package), ``profiles``, ``seed``.
- the run layer on top: ``runner`` (``runner.notebook_run``: figures, tables, provenance, the notebook -> claim
  definitions table; ``runner.cli``: the papermill runner, ``python -m moelab.runner``).

Imports are lazy so that ``import moelab`` stays cheap (no torch at import time).
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

__all__ = ["start_run", "__version__"]


def start_run(notebook: str, profile: str, seed: int = 0, **kwargs):
    """Start a notebook run: seeds, output directory, provenance. See :class:`moelab.runner.notebook_run.NotebookRun`."""
    from moelab.runner.notebook_run import NotebookRun

    return NotebookRun(notebook, profile=profile, seed=seed, **kwargs)


def __getattr__(name):  # lazy submodules: moelab.core, moelab.assets, ...
    try:
        return importlib.import_module(f"moelab.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"moelab.{name}":
            raise AttributeError(f"module 'moelab' has no attribute {name!r}") from None
        raise
