"""Data loaders and scorers for the moelab lm-eval tasks (referenced as `!function utils.<name>` by the YAMLs).

All data come from `moelab.suite.lmeval.task_docs(name)` (built from the offline assets, cached); nothing is
downloaded. See data/README.md for provenance.
"""
from moelab.suite import lmeval as _lmeval


def load(name=None, **kwargs):
    return _lmeval.task_dataset(name)


def process_nll(doc, results):
    return _lmeval.score_nll(doc, results)


def process_gsm(doc, results):
    return _lmeval.score_gsm(doc, results)


def process_humaneval(doc, results):
    return _lmeval.score_humaneval(doc, results)
