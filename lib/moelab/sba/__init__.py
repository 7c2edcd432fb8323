"""Spherical Barycentric Aggregation for MoE embedding models (paper 001, Kachuee & Sharifkhani; notebook
``notebooks/02_sba.py``).

``config`` (the frozen sizes per profile), ``method`` (SBA and the ablations with the paper's equations; the
aggregation switch), ``geometry`` (Figs. 1, 2, 5: norm ratio and its concentration, angles, ||y|| under both weight
readings, routing JSD, expert similarity), ``regime`` (did phase (b) move the experts: the targets and the probe),
``loader`` (nomic-embed-text-v2-moe in plain PyTorch), ``standin`` (all-MiniLM-L6-v2 upcycled in nomic's layout with
the cluster-aware initialiser, init compensation, its damage; the renormalised drop-upcycled ablation), ``data``
(WordNet subject prompts, pair collation, the stand-in benchmarks, all-nli and MTEB from local copies), ``items``
(per-item benchmark scores), ``experiment`` (MNRL fine-tuning, phases (a)-(c) as cached runs, the swap, the paper
profile on nomic), ``report`` (tables, sentences and figures), ``claims`` (the verdicts), ``standins`` (tiny inputs in
the paper profile's formats for its dry run, issue 51; imported by scripts/make_paper_standins.py, not here).

This package exports the names notebook 02 calls, plus :data:`OUTSIDE_USERS`, names files outside the package read
here (``run_from_config``: the ``moelab.launch`` entry point named in docs/paper-scale.md; ``training_table``:
tests/core/test_diagnostics.py); anything else imports from its module (``from moelab.sba.loader import load_nomic``).
"""
from moelab.sba import config, data, experiment, geometry, items, loader, method, regime, report, standin  # noqa: F401
from moelab.sba.config import dry_run_table, profile, profile_table
from moelab.sba.experiment import (
    drop_ablation, phase_b_runs, phase_c_runs, run_from_config, separation, setup, swap_runs)
from moelab.sba.report import (
    closing_lines, damage_sentence, damage_table, drop_ablation_table, fig5_by_seed, fig5_sentence, geometry_by_seed,
    geometry_change, geometry_sentence, items_long, phase_b_runs_table, phase_c_sentence, phase_c_table,
    plot_fig5_readings, plot_hist, plot_phase_b, plot_validation, regime_change, regime_sentence, scores_long,
    scores_wide, screen_table, separation_table, setup_sentence, table_one, table_sentence, token_geometry,
    training_table)

OUTSIDE_USERS = ("run_from_config", "training_table")

__all__ = [
    "closing_lines", "damage_sentence", "damage_table", "drop_ablation", "drop_ablation_table", "dry_run_table",
    "fig5_by_seed",
    "fig5_sentence", "geometry_by_seed", "geometry_change", "geometry_sentence", "items_long", "phase_b_runs",
    "phase_b_runs_table", "phase_c_runs", "phase_c_sentence", "phase_c_table", "plot_fig5_readings", "plot_hist",
    "plot_phase_b", "plot_validation", "profile", "profile_table", "regime_change", "regime_sentence",
    "run_from_config", "scores_long", "scores_wide", "screen_table", "separation", "separation_table", "setup",
    "setup_sentence", "swap_runs", "table_one", "table_sentence", "token_geometry", "training_table"]
