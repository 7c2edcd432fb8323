"""Issue 22 item 6: ``moelab.free_moe`` is a package in the STYLE.md shape (method / data / scoring / experiment /
report); every public name of the former module still imports from ``moelab.free_moe``, including each ``fm.X`` that
notebook 05 uses; imports sit at the top of each file; the only log-likelihood scorer is ``moelab.suite.scorer``."""
import ast
import re
from pathlib import Path

import pytest

from moelab import free_moe as fm

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "lib" / "moelab" / "free_moe"
# the public names of lib/moelab/free_moe.py before the split (issue 22 item 6)
OLD_NAMES = ["APPENDIX_BANDS", "AppliedMask", "DowpResult", "InputNorms", "MATH_MC_LM_TASK", "MaskSwitcher",
             "MultiLevelRouter", "PATCH_SIZES", "PatchRanks", "PurificationMask", "SUBLAYERS", "SUBLAYER_PROJECTIONS",
             "ScoreFn", "WANDA_BAND", "answer_logprob", "apply_mask", "assign_subdomains", "band_label", "band_mask",
             "band_sweep", "calibration_text", "check_band", "choice_accuracy", "choice_logprobs",
             "choose_general_tasks", "collect_input_norms", "continuation_logprobs", "dowp_select",
             "embedding_features", "eq3_keys", "evaluate_methods", "fit_router", "fit_subdomains",
             "generate_completions", "humaneval_score_fn", "improvement_table", "load_domains", "load_local_model",
             "masks_for", "patch_importance", "patch_ranks", "pd_frame", "quantisation_grid_stats", "reference_gains",
             "restrict_mask", "route_items", "routed_scores", "score_items", "select_bands", "subdomain_norms",
             "sweep_table", "target_linears", "tokenize_batches"]
FILES = ["__init__.py", "method.py", "data.py", "scoring.py", "experiment.py", "report.py"]


def test_package_shape():
    assert not (ROOT / "lib" / "moelab" / "free_moe.py").exists()
    assert set(FILES) <= {p.name for p in PKG.glob("*.py")}


@pytest.mark.parametrize("name", OLD_NAMES)
def test_old_names_still_import(name):
    assert hasattr(fm, name), name


def test_notebook_names_resolve():
    nb = (ROOT / "notebooks" / "05_free_moe.py").read_text()
    used = set(re.findall(r"\bfm\.([A-Za-z_]\w*)", nb))
    assert used and not [n for n in sorted(used) if not hasattr(fm, n)]


def test_all_is_complete_and_unique():
    assert len(fm.__all__) == len(set(fm.__all__))
    assert all(hasattr(fm, n) for n in fm.__all__)


@pytest.mark.parametrize("fname", FILES)
def test_imports_at_the_top(fname):
    tree = ast.parse((PKG / fname).read_text())
    inner = [f"line {n.lineno}" for top in tree.body if not isinstance(top, (ast.Import, ast.ImportFrom))
             for n in ast.walk(top) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert inner == [], f"{fname}: imports inside functions or classes at {inner}"


def test_method_is_only_the_method_and_scoring_is_thin():
    method = (PKG / "method.py").read_text()
    for dep in ("moelab.cache", "moelab.suite", "moelab.progress", "matplotlib", "open("):
        assert dep not in method, dep                                     # no I/O, caching, scoring or plots
    src = "\n".join((PKG / f).read_text() for f in FILES)
    assert "log_softmax" not in src                                        # no second scorer
    assert "scorer.loglikelihood_tokens" in (PKG / "scoring.py").read_text()
