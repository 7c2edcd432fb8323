"""Package layout of notebook 02's code (issue 19, item 5; STYLE.md "the shape of a paper package"): ``moelab.sba`` is a
package (method, geometry, loader, standin, data, experiment, report), ``moelab.nomic`` a thin shim onto
``moelab.sba.loader``, every name either module exported before still imports, no function-local imports, and no import
of another paper's package."""
import ast
import importlib
from pathlib import Path

OLD_SBA = ["ZERO_NORM_EPS", "AGGREGATIONS", "pair_geometry", "geometry_frame", "collect_geometry", "summarize_geometry",
           "routing_jsd", "wordnet_subject_texts", "build_moe_minilm", "set_aggregation", "st_forward_fn",
           "st_encode_fn", "PairCollate", "st_embed", "nomic_embed", "mnrl_loss", "finetune_embedder",
           "moe_specialisation", "load_allnli_triplets", "load_mteb_local", "evaluate_mteb_local",
           "finetune_and_measure", "init_geometry", "shrinkage_decomposition", "nomic_finetune_and_measure",
           "nomic_forward_fn", "scores_long", "upcycling_exactness", "training_table", "plot_validation",
           "plt_subplots", "plot_hist", "plot_fig5", "specialisation_table", "table_one", "ClusterAwareInit",
           "expert_similarity", "jensen_shannon"]
OLD_NOMIC = ["QUERY_PREFIX", "DOCUMENT_PREFIX", "MAX_LENGTH", "AGGREGATIONS", "NomicConfig", "rotary_cos_sin",
             "apply_rotary", "NomicAttention", "NomicDenseMLP", "make_moe_layer", "NomicBlock", "NomicEmbeddings",
             "NomicEncoder", "NomicEmbed", "expected_shapes", "check_state_dict", "load_state_dict_into",
             "upstream_state_dict", "read_safetensors", "load_nomic", "save_nomic"]
NEW = ["build_nomic_layout_moe", "build_nomic_layout_minilm", "compensate_init", "compensation_factors",
       "kept_weight_mass", "init_damage", "embedding_cosine_to_dense", "train_until_plateau", "plateau_reached",
       "finetune_checkpoint", "swap_aggregation", "phase_c_run", "swap_run", "measure_embedder",
       "norm_ratio_concentration", "fig5_table", "find_allnli_triplet_dir", "phase_b_table"]
OTHER_PAPERS = ("moelab.moce", "moelab.cluster_upcycling", "moelab.mass", "moelab.ginc", "moelab.free_moe")


def test_old_and_new_names_import():
    sba, nomic = importlib.import_module("moelab.sba"), importlib.import_module("moelab.nomic")
    assert [n for n in OLD_SBA + OLD_NOMIC + NEW if not hasattr(sba, n)] == []
    assert [n for n in OLD_NOMIC if not hasattr(nomic, n)] == []
    assert nomic.load_nomic is sba.load_nomic is importlib.import_module("moelab.sba.loader").load_nomic
    assert nomic.NomicEmbed is sba.NomicEmbed and nomic.AGGREGATIONS is sba.AGGREGATIONS
    assert sorted(sba.__all__) == sba.__all__ and all(hasattr(sba, n) for n in sba.__all__)


def test_package_shape_no_function_local_imports_no_other_paper():
    pkg = Path(importlib.import_module("moelab.sba").__file__).parent
    assert {p.stem for p in pkg.glob("*.py")} >= {"__init__", "method", "loader", "data", "experiment", "report"}
    shim = pkg.parent / "nomic.py"
    assert len(shim.read_text().splitlines()) < 10  # a thin re-export
    for p in list(pkg.glob("*.py")) + [shim]:
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
