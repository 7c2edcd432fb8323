"""Run-by-run resumable GLUE stand-in (notebook 04 section 6; issue 18: "full ... resumable run by run").

:func:`run_glue_standin_cached` runs :func:`moelab.mass.experiment.run_glue_standin` one (task, method, seed) at a
time, each through ``cache(kind, key, compute)`` (e.g. :func:`moelab.cache.memo`), keyed by the task's data digest,
the method, the seed and the configuration. It is a module of its own (not exported by ``moelab.mass``) because the
cache keys every entry by the code it can run: adding it to ``experiment.py`` or the package ``__init__`` would
have invalidated the ~1 h of cached synthetic runs of 04 ``full``. See docs/NOTES.md (fold it into
``run_glue_standin`` the next time ``experiment.py`` changes for another reason).
"""
from __future__ import annotations

import hashlib
import json

import pandas as pd

from moelab.mass.experiment import GlueStandinConfig, run_glue_standin


def task_digest(task: dict) -> str:
    """16-hex sha256 of a task's splits (texts and labels), so a cached run is keyed by the data it saw."""
    return hashlib.sha256(json.dumps(task, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_glue_standin_cached(tasks: dict, methods, seeds, cfg: GlueStandinConfig,
                            cache) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Same return value as :func:`run_glue_standin` on all cells (runs, items; rows in task, method, seed order),
    each cell computed or read through ``cache`` on its own. Runs are independent (each seeds itself), so the result
    does not depend on which cells came from the cache."""
    methods, seeds = list(methods), list(seeds)
    if not tasks or not methods or not seeds:
        raise ValueError(f"need tasks, methods and seeds, got {len(tasks or {})} tasks, methods={methods}, seeds={seeds}")
    runs, items = [], []
    for name, task in tasks.items():
        digest = task_digest(task)
        for method in methods:
            for seed in seeds:
                r, it = cache("mass_glue_run", dict(task=name, data=digest, method=method, seed=int(seed),
                                                    cfg=vars(cfg)),
                              lambda name=name, task=task, method=method, seed=seed:
                              run_glue_standin({name: task}, [method], [seed], cfg))
                runs.append(r)
                items.append(it)
    return pd.concat(runs, ignore_index=True), pd.concat(items, ignore_index=True)
