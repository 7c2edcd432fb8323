"""Free-MoE: Domain-Oriented Weight Purification (DOWP) and a multi-level router (paper 004, "Free-MoE: Tuning-free
Mixture-of-Experts purifying LLMs to thrive across any field"; notebook ``notebooks/05_free_moe.py``).

``config`` (the frozen sizes per profile), ``method`` (Eq. 2-8: embedding features and k-means subdomains, patch
importance, ranks, bands and masks with their readings ``scope`` / ``mode`` / ``counts``, applying a DSS-Expert in place,
the multi-level router), ``data`` (the main domains from ``moelab.suite``, calibration texts), ``scoring`` (thin
wrappers over ``moelab.suite.scorer``, the one log-likelihood scorer; HumanEval pass@k), ``experiment`` (band sweep and θ* selection, DOWP per subdomain,
routing, routed scoring), ``report`` (appendix and Table 1 layouts, realised purification shares, test-selected vs
held-out DOWP row, flip analysis, accuracy beside likelihood with intervals and MDEs).

This package exports the names notebook 05 calls; anything else imports from its module
(``from moelab.free_moe.method import patch_importance``).
"""
from moelab.free_moe import config, data, experiment, method, report, scoring  # noqa: F401  (fm.method.X)
from moelab.free_moe.config import (
    config_for, profile_table)
from moelab.free_moe.method import (
    band_label)
from moelab.free_moe.data import (
    GENERAL_CANDIDATES, MATH_MC_LM_TASK, choose_general_tasks, load_groups_for, model_scorecard)
from moelab.free_moe.experiment import (
    ABLATION_SLUGS, cache_config, dowp_select, hook_check, keep_probe, load_model, model_rows,
    ratio_ablation,
    reference_clusters, route_test, run_ablations, table1_scores, test_sweep_items)
from moelab.free_moe.report import (
    ABLATION_CAPTION, ablation_sentence, ablation_summary, baseline_sentence, baseline_table_from_scores,
    closing_lines, cluster_sentence, cross_domain_summary, group_sweep_tables, plot_ablation, plot_band_sweep,
    plot_baselines, plot_improvements, plot_keep, plot_reference_vs_test, quantisation_grid_stats,
    reference_vs_test, regime_table, run_summary, selection_sentence, share_table, split_counts,
    table1_summary, test_selected_row)

__all__ = [
    "ABLATION_CAPTION", "ABLATION_SLUGS", "GENERAL_CANDIDATES", "MATH_MC_LM_TASK", "ablation_sentence",
    "ablation_summary", "band_label", "baseline_sentence", "baseline_table_from_scores", "cache_config",
    "choose_general_tasks",
    "closing_lines", "cluster_sentence", "config_for", "cross_domain_summary", "dowp_select", "group_sweep_tables",
    "hook_check", "keep_probe", "load_groups_for", "load_model", "model_rows",
    "model_scorecard", "plot_ablation", "plot_band_sweep",
    "plot_baselines", "plot_improvements", "plot_keep", "plot_reference_vs_test", "profile_table",
    "quantisation_grid_stats", "ratio_ablation", "reference_clusters", "reference_vs_test", "regime_table",
    "route_test", "run_ablations", "run_summary", "selection_sentence", "share_table", "split_counts",
    "table1_scores", "table1_summary", "test_selected_row", "test_sweep_items"]
