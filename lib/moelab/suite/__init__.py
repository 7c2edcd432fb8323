"""Data and evaluation suite shared by the five notebooks.

Submodules (imported lazily so ``import moelab.suite`` stays cheap):

- ``instruct``: the maths / code / reasoning instruction mix (MoCE notebook 01, Free-MoE notebook 05).
- ``lmeval``: LM evaluation through lm-eval 0.4.13 with the task YAMLs in ``data/lm_tasks/``.
- ``sandbox``: resource-limited execution of generated code; unbiased pass@k.
- ``scorecard``: base-model scorecard (which LM tasks SmolLM2 / Gemma-3 solve above chance).
- ``embed``: embedding training pairs and MTEB-style benchmarks (SBA notebook 02).
- ``textcls``: BIG-bench text classification tasks (the GLUE stand-in of the MASS notebook 04).
- ``images``: Fashion-MNIST and the CIFAR-10 test images (MASS notebook 04, cluster upcycling notebook 03).
- ``bigbench``: normalised multiple-choice items from BIG-bench task JSONs; ``dedup``: near-duplicate filtering;
  ``mathgen``: templated GSM8K-style word problems; ``codegen``: stdlib function/docstring pairs.
"""
from __future__ import annotations

import importlib

from moelab.assets import BIGBENCH_TASKS  # noqa: F401  (the one list; the suite reads these tasks)

_SUBMODULES = ("instruct", "lmeval", "sandbox", "scorecard", "embed", "textcls", "images", "bigbench", "dedup",
               "mathgen", "codegen", "wordnet")


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"moelab.suite.{name}")
    raise AttributeError(f"module 'moelab.suite' has no attribute {name!r}")
