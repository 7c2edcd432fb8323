"""Free-MoE: Domain-Oriented Weight Purification (DOWP) and a multi-level router (paper 004, "Free-MoE: Tuning-free
Mixture-of-Experts purifying LLMs to thrive across any field"; notebook ``notebooks/05_free_moe.py``).

``config`` (the frozen sizes per profile), ``method`` (Eq. 2-8: embedding features and k-means subdomains, patch
importance, ranks, bands and masks with their readings ``scope`` / ``mode`` / ``counts``, applying a DSS-Expert in place, the multi-level router), ``data`` (the
main domains from ``moelab.suite``, calibration texts), ``scoring`` (thin wrappers over ``moelab.suite.scorer``, the
one log-likelihood scorer; HumanEval pass@k), ``experiment`` (band sweep and θ* selection, DOWP per subdomain,
routing, routed scoring), ``report`` (appendix and Table 1 layouts, realised purification shares, test-selected vs
held-out DOWP row, flip analysis, accuracy beside likelihood with intervals and MDEs). Every name the former module
``moelab.free_moe`` exported is re-exported here.
"""
from moelab.free_moe.config import *  # noqa: F401,F403
from moelab.free_moe.config import __all__ as _config_all
from moelab.free_moe.data import *  # noqa: F401,F403
from moelab.free_moe.data import __all__ as _data_all
from moelab.free_moe.experiment import *  # noqa: F401,F403
from moelab.free_moe.experiment import __all__ as _experiment_all
from moelab.free_moe.method import *  # noqa: F401,F403
from moelab.free_moe.method import __all__ as _method_all
from moelab.free_moe.report import *  # noqa: F401,F403
from moelab.free_moe.report import __all__ as _report_all
from moelab.free_moe.scoring import *  # noqa: F401,F403
from moelab.free_moe.scoring import __all__ as _scoring_all

__all__ = [*_config_all, *_method_all, *_data_all, *_scoring_all, *_experiment_all, *_report_all]
