"""Which module holds each notebook's claim definitions (its ``CLAIMS`` list).

The table names modules by string and imports one only when its notebook's claims are computed (``claim_defs``), so
the claims package finds the definitions itself without importing any paper package up front (the engine modules
never import one). The primer's definitions sit in its own package like the papers' (``moelab.primer.claims``).
"""
from __future__ import annotations

import importlib

CLAIM_DEFS = {"00_moe_primer": "moelab.primer.claims", "01_moce": "moelab.moce.claims", "02_sba": "moelab.sba.claims",
              "03_cluster_upcycling": "moelab.cluster_upcycling.claims", "04_mass": "moelab.mass.claims",
              "05_free_moe": "moelab.free_moe.claims"}


def claim_defs(notebook: str):
    """The module that defines notebook ``notebook``'s ``CLAIMS`` (the ``defs`` resolver of ``rebuild`` / ``check``)."""
    name = CLAIM_DEFS.get(notebook)
    if name is None:
        raise ValueError(f"no claim definitions for notebook {notebook!r}: add it to moelab.claims.registry.CLAIM_DEFS "
                         f"with the module that defines its CLAIMS list (lib/moelab/<paper>/claims.py; see "
                         f"docs/CLAIMS.md); known: {sorted(CLAIM_DEFS)}")
    return importlib.import_module(name)
