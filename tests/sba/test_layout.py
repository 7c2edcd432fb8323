"""Package layout of notebook 02's code (STYLE.md "the shape of a paper package"): ``moelab.sba`` is a package
(config, method, geometry, regime, loader, standin, data, items, experiment, report, claims); the nomic loader lives
in ``moelab.sba.loader`` (the ``moelab.nomic`` shim is gone); every public name imports from the module that defines
it; no function-local imports, and no import of another paper's package."""
import ast
import importlib
from pathlib import Path

MODULES = ["config", "method", "geometry", "regime", "loader", "standin", "data", "items", "experiment", "report"]
LOADER = ["QUERY_PREFIX", "DOCUMENT_PREFIX", "MAX_LENGTH", "AGGREGATIONS", "NomicConfig", "rotary_cos_sin",
          "apply_rotary", "NomicAttention", "NomicDenseMLP", "make_moe_layer", "NomicBlock", "NomicEmbeddings",
          "NomicEncoder", "NomicEmbed", "expected_shapes", "check_state_dict", "load_state_dict_into",
          "upstream_state_dict", "read_safetensors", "load_nomic", "save_nomic"]
OTHER_PAPERS = ("moelab.moce", "moelab.cluster_upcycling", "moelab.mass", "moelab.ginc", "moelab.free_moe")


def test_every_module_exports_what_it_lists_and_the_loader_is_whole():
    for m in MODULES:
        mod = importlib.import_module(f"moelab.sba.{m}")
        assert mod.__all__ and [n for n in mod.__all__ if not hasattr(mod, n)] == [], m
    loader = importlib.import_module("moelab.sba.loader")
    assert [n for n in LOADER if not hasattr(loader, n)] == []
    sba = importlib.import_module("moelab.sba")
    assert sorted(sba.__all__) == sba.__all__ and all(hasattr(sba, n) for n in sba.__all__)
    assert not (Path(sba.__file__).parents[1] / "nomic.py").exists()


def test_package_shape_no_function_local_imports_no_other_paper():
    pkg = Path(importlib.import_module("moelab.sba").__file__).parent
    assert {p.stem for p in pkg.glob("*.py")} >= {"__init__", *MODULES, "claims"}
    for p in pkg.glob("*.py"):
        tree = ast.parse(p.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
                assert not inner, f"{p.name}:{node.name} imports inside a function"
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(OTHER_PAPERS), f"{p.name} imports {node.module}"
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith(OTHER_PAPERS) for a in node.names), p.name
    method = (pkg / "method.py").read_text()
    for eq in ("Eq. 1", "Eq. 4", "Eq. 5", "Eq. 6", "Eq. 11"):  # the paper's equations beside the code
        assert eq in method, eq
