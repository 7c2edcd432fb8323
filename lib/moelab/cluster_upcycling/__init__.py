"""Cluster-aware upcycling (poster 002, Chu et al.; notebook ``notebooks/03_cluster_upcycling.py``).

``method`` (Steps 1-3 from :mod:`moelab.core.cluster_init` with the special tokens handled explicitly, EESD, the
paper profile's open_clip upcycling), ``data`` (sentence pairs, the calibration token set and its special-token mask,
the open_clip checkpoint, the vision stand-in's images), ``analysis`` (the poster's panels and router movement on a
fixed held-out token set, the held-out entropy trajectory), ``experiment`` (methods, building and training the
upcycled models, caching, the text and vision runs), ``report`` (tables and figures). Every name the former module
``moelab.cluster_upcycling`` exported is re-exported here.
"""
from moelab.cluster_upcycling.analysis import *  # noqa: F401,F403
from moelab.cluster_upcycling.analysis import __all__ as _analysis_all
from moelab.cluster_upcycling.data import *  # noqa: F401,F403
from moelab.cluster_upcycling.data import __all__ as _data_all
from moelab.cluster_upcycling.experiment import *  # noqa: F401,F403
from moelab.cluster_upcycling.experiment import __all__ as _experiment_all
from moelab.cluster_upcycling.method import *  # noqa: F401,F403
from moelab.cluster_upcycling.method import __all__ as _method_all
from moelab.cluster_upcycling.report import *  # noqa: F401,F403
from moelab.cluster_upcycling.report import __all__ as _report_all

__all__ = [*_method_all, *_data_all, *_analysis_all, *_experiment_all, *_report_all]
