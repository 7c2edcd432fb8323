"""Notebook 00, the MoE primer (what an MoE layer does), as a package like the papers':

- :mod:`moelab.primer.method`: the primer's helpers (WordNet gloss pairs, upcycled all-MiniLM-L6-v2, routing and load
  statistics, the balancing-loss runs, aggregation and dispatch checks);
- :mod:`moelab.primer.config`: one frozen profile per run profile (``config.profile("default")``);
- :mod:`moelab.primer.claims`: the claim definitions (verdict code, read by ``moelab.claims``; never imported here).

``from moelab import primer`` gives the method's functions (``primer.train_balancing_runs`` ...).
"""
from moelab.primer import config
from moelab.primer.method import *  # noqa: F401,F403
from moelab.primer.method import __all__ as _method_all

__all__ = ["config", *_method_all]
