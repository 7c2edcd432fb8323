"""Cluster-aware upcycling (poster 002, Chu et al.; notebook ``notebooks/03_cluster_upcycling.py``).

``config`` (the frozen sizes per profile), ``method`` (Steps 1-3 from :mod:`moelab.core.cluster_init` with the special
tokens handled explicitly, EESD), ``data`` (sentence pairs, the calibration token set and its special-token mask, the
vision stand-in's images), ``clip`` (the paper profile: the user's open_clip checkpoint and image-text pairs, the
same experiment on CLIP's image tower), ``standins`` (its tiny inputs for the dry run), ``analysis`` (the
poster's panels and router movement on a fixed held-out token set, the held-out entropy trajectory), ``experiment``
(methods, the training settings, building and training the upcycled models, caching, the text and vision runs),
``report`` (tables, figures and the notebook's computed sentences), ``claims`` (the verdicts).

This package exports the names notebook 03 calls; anything else imports from its module
(``from moelab.cluster_upcycling.method import EESD``).
"""
from moelab.cluster_upcycling import analysis, clip, config, data, experiment, method, report  # noqa: F401
from moelab.cluster_upcycling.clip import (
    clip_runs, clip_special_token_study, load_clip, load_image_text_pairs)
from moelab.cluster_upcycling.config import (
    config_for, dry_run_table, profile_table)
from moelab.cluster_upcycling.experiment import (
    METHODS, TUNING_DIR, eesd_decay_for, run_summary, special_token_study, text_runs, training_settings,
    vision_experiment, vision_settings)
from moelab.cluster_upcycling.report import (
    ANALYSIS_CAPTIONS, VISION_CAPTIONS, analysis_tables, benchmark_table, damage_sentences, damage_summary,
    init_damage_table, init_rank_summary, init_sentence, init_table, movement_sentences, plot_analysis_panels,
    plot_r1_init_end, plot_router_movement, plot_vision, r1_summary, r1_table, runs_sentence, special_token_sentence,
    tuning_tables, vision_sentences, vision_table, vision_tables)
# Not the notebook's: read through the package by files outside it, which move to the defining module when next
# edited (docs/NOTES.md lists them). Nothing is added here.
from moelab.cluster_upcycling.experiment import text_experiment  # noqa: F401  (scripts/tune_03.py)
from moelab.cluster_upcycling.report import choose_tuned, tuning_summary  # noqa: F401  (scripts/tune_03.py)
from moelab.cluster_upcycling.analysis import expert_similarity  # noqa: F401  (tests/run/test_layering.py)
from moelab.cluster_upcycling.method import (  # noqa: F401  (tests/run/test_layering.py: the moved names)
    ClusterAwareInit, KMeansResult, TruncResult, cluster_aware_expert_weights, data_aware_truncate, effective_rank,
    spherical_kmeans, whitening_factor)
from moelab.cluster_upcycling.experiment import run_from_config  # noqa: F401  (launch target, docs/paper-scale.md)

OUTSIDE_USERS = ("run_from_config", "text_experiment", "choose_tuned", "tuning_summary", "ClusterAwareInit",
                 "KMeansResult", "TruncResult", "cluster_aware_expert_weights", "data_aware_truncate", "effective_rank",
                 "expert_similarity", "spherical_kmeans", "whitening_factor")

__all__ = [
    "ANALYSIS_CAPTIONS", "METHODS", "TUNING_DIR", "VISION_CAPTIONS", "analysis_tables", "benchmark_table",
    "clip_runs", "clip_special_token_study", "config_for", "damage_sentences", "damage_summary", "dry_run_table",
    "eesd_decay_for", "init_damage_table", "init_rank_summary", "init_sentence", "init_table", "load_clip",
    "load_image_text_pairs", "movement_sentences", "plot_analysis_panels",
    "plot_r1_init_end", "plot_router_movement", "plot_vision", "profile_table", "r1_summary", "r1_table",
    "run_summary", "runs_sentence", "special_token_sentence", "special_token_study", "text_runs",
    "training_settings", "tuning_tables", "vision_experiment", "vision_sentences", "vision_settings", "vision_table",
    "vision_tables"]
