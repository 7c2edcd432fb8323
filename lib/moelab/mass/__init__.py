"""MASS: Mixture-of-Experts for Adaptive Semantic Specialization (paper 003; notebook ``notebooks/04_mass.py``).

``method`` (MASS itself: top-p gate, change-point and semantic tests, duplication, redundancy term, expansion state
machine; DynMoE as the baseline method), ``data`` (the GINC generator, the paper's in-context format, its Bayes
floor and n-gram baselines; GLUE loaders), ``experiment`` (the stacked synthetic model, training, naive grid and MASS
runs, GLUE stand-in), ``report`` (frontier, JSD, figures, summaries); ``claims`` (the notebook's claim definitions,
loaded only by the runner and ``python -m moelab.claims``, never from here). Every name ``moelab.mass`` exported before
the split into a package is re-exported here; the GINC generator is imported from ``moelab.mass`` or
``moelab.mass.data``.
"""
from moelab.mass.data import *  # noqa: F401,F403
from moelab.mass.data import __all__ as _data_all
from moelab.mass.experiment import *  # noqa: F401,F403
from moelab.mass.experiment import __all__ as _experiment_all
from moelab.mass.experiment import _nll  # noqa: F401  (tests and notebook 00's router checks use it)
from moelab.mass.method import *  # noqa: F401,F403
from moelab.mass.method import __all__ as _method_all
from moelab.mass.config import *  # noqa: F401,F403
from moelab.mass.config import __all__ as _config_all
from moelab.mass.report import *  # noqa: F401,F403
from moelab.mass.report import __all__ as _report_all
# the elbow rule and the JSD are shared with notebooks 01 and 02 (moelab.stats); re-exported under the old names
from moelab.stats import elbow_max_chord, jensen_shannon  # noqa: F401

__all__ = [*_method_all, *_data_all, *_experiment_all, *_report_all, *_config_all, "elbow_max_chord", "jensen_shannon"]
