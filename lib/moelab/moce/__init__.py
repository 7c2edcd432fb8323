"""Mixture-of-Clustered-Experts (MoCE; Eo et al., "Mixture-of-Clustered-Experts: Advancing Expert Specialization and
Generalization in Instruction Tuning"; notebook ``notebooks/01_moce.py``).

``method`` (the MoCE layer: grouped PESC adapter experts, Eqs. 1-6, and the baselines as its settings; BTX's merge),
``clustering`` (instruction embeddings, k-means, the elbow, Fig. 2 / Fig. 5 inputs), ``data`` (prompts and answer tokens
through the scorer's tokenisation, the cached trunk states, the paper's data sets), ``trunk`` (the frozen lower blocks
cached for training and memoised for evaluation), ``experiment`` (training runs, evaluation with per-row cluster ids,
``run_from_config`` for ``moelab.launch``), ``report`` (tables and figures). Every name the former module
``moelab.moce`` exported is re-exported here (with the private helpers the tests use).
"""
from moelab.moce.clustering import *  # noqa: F401,F403
from moelab.moce.clustering import __all__ as _clustering_all
from moelab.moce.clustering import _E5_MEMO, _check_embeddings, _minilm_tokenizer, _raise_overflow  # noqa: F401
from moelab.moce.data import *  # noqa: F401,F403
from moelab.moce.data import __all__ as _data_all
from moelab.moce.data import _paper_record, _read_records  # noqa: F401
from moelab.moce.experiment import *  # noqa: F401,F403
from moelab.moce.experiment import __all__ as _experiment_all
from moelab.moce.experiment import _load_state  # noqa: F401
from moelab.moce.method import *  # noqa: F401,F403
from moelab.moce.method import __all__ as _method_all
from moelab.moce.report import *  # noqa: F401,F403
from moelab.moce.report import __all__ as _report_all
from moelab.moce.trunk import *  # noqa: F401,F403
from moelab.moce.trunk import __all__ as _trunk_all
from moelab.moce.trunk import _MemoBlock, _same_type, _Skip, _skipping_lower_blocks, _Stop, _TrunkMemo  # noqa: F401

__all__ = [*_method_all, *_clustering_all, *_data_all, *_trunk_all, *_experiment_all, *_report_all]
