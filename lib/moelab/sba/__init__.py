"""Spherical Barycentric Aggregation for MoE embedding models (paper 001, Kachuee & Sharifkhani; notebook
``notebooks/02_sba.py``).

``method`` (SBA and the ablations with the paper's equations; the aggregation switch), ``geometry`` (Figs. 1, 2, 5:
norm ratio and its concentration, angles, ||y|| against r̄ and against Σ w_i r_i, routing JSD, expert similarity),
``loader`` (nomic-embed-text-v2-moe in plain PyTorch; ``moelab.nomic`` re-exports it), ``standin`` (all-MiniLM-L6-v2
upcycled in nomic's layout with the cluster-aware initialiser, init compensation, its damage; the renormalised
drop-upcycled ablation), ``data`` (WordNet subject prompts, pair collation, all-nli and MTEB from local copies),
``experiment`` (MNRL fine-tuning, phase (b) until a validation plateau, phase (c) per aggregation from one checkpoint,
the swap arm, measurements), ``report`` (tables and figures). Every name ``moelab.sba`` and ``moelab.nomic``
exported before the split is re-exported here.
"""
from moelab.sba.data import *  # noqa: F401,F403
from moelab.sba.data import __all__ as _data_all
from moelab.sba.experiment import *  # noqa: F401,F403
from moelab.sba.experiment import __all__ as _experiment_all
from moelab.sba.geometry import *  # noqa: F401,F403
from moelab.sba.geometry import __all__ as _geometry_all
from moelab.sba.loader import *  # noqa: F401,F403
from moelab.sba.loader import __all__ as _loader_all
from moelab.sba.method import *  # noqa: F401,F403
from moelab.sba.method import __all__ as _method_all
from moelab.sba.report import *  # noqa: F401,F403
from moelab.sba.report import __all__ as _report_all
from moelab.sba.standin import *  # noqa: F401,F403
from moelab.sba.standin import __all__ as _standin_all
# shared with notebook 03 through the core (issue 21, item 0); re-exported under the names 02 used before
from moelab.core.cluster_init import ClusterAwareInit  # noqa: F401

__all__ = sorted(set([*_method_all, *_geometry_all, *_loader_all, *_standin_all, *_data_all, *_experiment_all,
                      *_report_all, "ClusterAwareInit"]))
