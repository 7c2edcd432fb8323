"""Mixture-of-Clustered-Experts (MoCE; Eo et al., "Mixture-of-Clustered-Experts: Advancing Expert Specialization and
Generalization in Instruction Tuning"; notebook ``notebooks/01_moce.py``).

``config`` (the frozen sizes per profile), ``method`` (the MoCE layer: grouped PESC adapter experts, Eqs. 1-6, and the
baselines as its settings; BTX's merge), ``clustering`` (instruction embeddings, k-means, the elbow, Fig. 2 / Fig. 5
inputs), ``data`` (prompts and answer tokens through the scorer's tokenisation, the cached trunk states, the paper's
data sets), ``trunk`` (the frozen lower blocks cached for training and memoised for evaluation), ``experiment``
(the paper / stand-in choice, training runs, evaluation with per-row cluster ids, ``run_from_config`` for
``moelab.launch``), ``report`` (tables, figures and the notebook's computed sentences), ``claims`` (the verdicts).

This package exports the names notebook 01 calls; anything else imports from its module
(``from moelab.moce.method import variant_spec``).
"""
from moelab.moce import clustering, config, data, experiment, method, report, trunk  # noqa: F401  (moce.method.X)
from moelab.moce.clustering import (
    clustering_study, fig5_distribution)
from moelab.moce.config import (
    config_for, profile_table)
from moelab.moce.experiment import (
    cache_trunk, cluster_groups, evaluate_runs, gemma_experiment, in_run_scorecard, lm_tasks_for, load_backbone,
    load_instruction_mix, moce_encoder, plan_runs, split_items, train_runs)
from moelab.moce.report import (
    aa_sentence, ablation_table, criterion_table, curves_table, dependence_table, domain_cluster_counts,
    domain_counts_sentence, domain_counts_table, fig5_sentence, k_sweep_labels, k_sweep_sentence, k_sweep_table,
    knee_sentence, plot_cluster_distribution, plot_curves, plot_elbow, plot_k_sweep, plot_projection, plot_table1,
    pooled_sentence, seed_means_table, summarize_scores, training_sentence, within_domain_sentence)
# Not the notebook's: ``moelab.suite.scorer`` finds MoCE's stack as ``sys.modules["moelab.moce"].TopStack`` (the
# scorer is frozen this session); the other names are read through the package by files outside this package that
# move to their defining module when next edited (docs/NOTES.md lists them). Nothing is added here.
from moelab.moce.clustering import find_knee  # noqa: F401  (tests/run/test_layering.py)
from moelab.moce.data import build_cache, subsample  # noqa: F401  (tests/suite/test_scorer.py, test_instruct_balance.py)
from moelab.moce.experiment import per_item_nll  # noqa: F401  (tests/suite/test_scorer.py)
from moelab.moce.method import (  # noqa: F401  (tests/suite/test_scorer.py, tests/core/test_router_task_grad.py)
    MoCEFFN, group_context, install, moce_layers, uninstall, variant_spec)
from moelab.moce.trunk import TopStack  # noqa: F401  (moelab.suite.scorer)
from moelab.moce.experiment import run_from_config  # noqa: F401  (launch target, docs/paper-scale.md)

OUTSIDE_USERS = ("run_from_config", "TopStack", "find_knee", "build_cache", "subsample", "per_item_nll", "MoCEFFN",
                 "group_context", "install", "moce_layers", "uninstall", "variant_spec")

__all__ = [
    "aa_sentence", "ablation_table", "cache_trunk", "cluster_groups", "clustering_study", "config_for",
    "criterion_table", "curves_table", "dependence_table", "domain_cluster_counts", "domain_counts_sentence",
    "domain_counts_table", "evaluate_runs", "fig5_distribution", "fig5_sentence", "gemma_experiment",
    "in_run_scorecard", "k_sweep_labels", "k_sweep_sentence", "k_sweep_table", "knee_sentence", "lm_tasks_for",
    "load_backbone",
    "load_instruction_mix", "moce_encoder", "plan_runs", "plot_cluster_distribution", "plot_curves", "plot_elbow",
    "plot_k_sweep", "plot_projection", "plot_table1", "pooled_sentence", "profile_table", "seed_means_table",
    "split_items", "summarize_scores", "train_runs", "training_sentence", "within_domain_sentence"]
