"""Moved to :mod:`moelab.mass.data` (issue 18); this shim keeps ``from moelab.ginc import ...`` working."""
from moelab.mass.data import (GINC, GINCConfig, bayes_labels, bayes_nll, build_ginc,  # noqa: F401
                              predictive_probs, sample_documents, sample_prompts)

__all__ = ["GINCConfig", "GINC", "build_ginc", "sample_documents", "sample_prompts", "predictive_probs",
           "bayes_labels", "bayes_nll"]
