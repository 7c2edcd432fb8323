"""Package layout: every ``moelab.<module>:<function>`` target the README and docs/paper-scale.md document resolves, and
the names ``moelab.mass`` exported before the split into ``moelab/mass/`` (with the GINC names, once also in the
removed ``moelab.ginc`` shim) still import from ``moelab.mass``."""
import ast
import importlib
import re
from pathlib import Path

import pytest

from helpers import ROOT

DOCS = (ROOT / "README.md", ROOT / "docs" / "paper-scale.md")   # the launch targets live in paper-scale.md
TARGET = re.compile(r"\bmoelab(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_.]*")


def _targets():
    return sorted({t for d in DOCS for t in TARGET.findall(d.read_text(encoding="utf-8"))})


def test_readme_documents_concrete_targets():
    assert "moelab.mass:run_from_config" in _targets()


@pytest.mark.parametrize("target", _targets())
def test_readme_launch_targets_resolve(target):
    mod_name, fn_name = target.split(":")
    obj = importlib.import_module(mod_name)
    for part in fn_name.split("."):
        obj = getattr(obj, part)
    assert callable(obj), target


OLD_MASS = ["StackedMoETransformer", "topk_weights", "top_p_weights", "train_stacked", "eval_per_sequence",
            "rolling_z", "cpd_pvalue", "weight_grad_cos", "project_rows", "MassConfig", "MassExpander", "frontier",
            "elbow_max_chord", "routing_jsd", "sinusoidal_positions", "collect_routing", "SynthSetup", "run_naive",
            "run_mass", "jsd_points", "mass_settings", "slots_delta", "plot_fig2", "plot_fig3", "plot_appc",
            "load_glue_task", "bert_large_path", "redundancy_term", "duplicate_rows", "MassPool", "GLUE_METHODS",
            "GlueStandinConfig", "duplicate_layer_expert", "MassLayerExpander", "DynMoEAdapter", "MiniLMClassifier",
            "glue_standin", "run_glue_standin", "glue_summary", "plot_glue_standin", "_nll"]
OLD_GINC = ["GINCConfig", "GINC", "build_ginc", "sample_documents", "sample_prompts", "predictive_probs",
            "bayes_labels", "bayes_nll"]


def test_old_names_still_import():
    mass, data = importlib.import_module("moelab.mass"), importlib.import_module("moelab.mass.data")
    assert [n for n in OLD_MASS + OLD_GINC if not hasattr(mass, n)] == []
    assert [n for n in OLD_GINC if getattr(data, n) is not getattr(mass, n)] == []
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("moelab.ginc")


def test_package_shape_and_no_function_local_imports():
    pkg = Path(importlib.import_module("moelab.mass").__file__).parent
    assert {p.stem for p in pkg.glob("*.py")} >= {"__init__", "method", "data", "experiment", "report"}
    for p in pkg.glob("*.py"):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
                assert not inner, f"{p.name}:{node.name} imports inside a function"
