"""Run-by-run resumable GLUE stand-in (notebook 04 section 6): now in :mod:`moelab.mass.experiment`; this module
re-exports the two names for code that imported them from here."""
from moelab.mass.experiment import run_glue_standin_cached, task_digest  # noqa: F401

__all__ = ["run_glue_standin_cached", "task_digest"]
