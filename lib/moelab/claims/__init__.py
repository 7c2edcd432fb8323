"""Claims engine: every verdict is a pure function of the tables a notebook saved.

``Claim`` + evidence types and ``evaluate`` (engine), ``validate_record`` (schema), ``rebuild`` and the CLI
``python -m moelab.claims rebuild|check|review`` (rebuild), ``scorecard_markdown`` (the README table; the verdict
summaries are in ``verdict_summary``). See docs/CLAIMS.md.
The claim definitions live beside the code they judge (``moelab.<paper>.claims``; the primer's in
``moelab.primer.claims``); this package imports no paper package up front: ``moelab.claims.registry`` imports a
definitions module by name when its notebook is rebuilt, and ``rebuild`` / ``check`` are handed the
definitions by their caller (``moelab.claims.registry.claim_defs``, re-exported by the runner).
"""
from moelab.claims.engine import (DECISIVE, DETERMINED_BY, ENGINE_VERSION, VERDICTS, ByConstruction, Claim,
                                  ClaimEvidenceError, Insufficient, Items, Level, MissingTable, NotInProfile, Options,
                                  OutsideRegime, Precomputed, Regime, RiseThenFall, Seeds, Tables, Trend, Unobtainable,
                                  align_by_seed, check_definitions, evaluate, with_range_pseudo_pairs)
from moelab.claims.rebuild import check, frame, load_claims, output_folders, rebuild
from moelab.claims.schema import FIELDS, validate_file, validate_record
from moelab.claims.verdict_summary import scorecard_markdown

__all__ = ["DECISIVE", "DETERMINED_BY", "ENGINE_VERSION", "VERDICTS", "ByConstruction", "Claim", "ClaimEvidenceError",
           "FIELDS", "Insufficient", "Items", "Level", "MissingTable", "NotInProfile", "Options", "OutsideRegime",
           "Precomputed", "Regime", "align_by_seed", "RiseThenFall", "Seeds", "Tables", "Trend", "Unobtainable", "check", "check_definitions", "evaluate", "frame", "load_claims", "output_folders", "rebuild",
           "scorecard_markdown", "validate_file", "validate_record"]
