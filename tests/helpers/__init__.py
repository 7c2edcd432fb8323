"""Helpers the test files share (importable as ``helpers``: pytest puts ``tests/`` on ``sys.path``, see
pyproject.toml's ``[tool.pytest.ini_options]``). One module per area: ``helpers.free_moe`` (tiny Llama and
tokenizer), ``helpers.cluster_upcycling`` (tiny word-pair data), ``helpers.core`` (synthetic clusters, a tiny BERT
FFN), ``helpers.claims`` (synthetic result folders), ``helpers.mass`` (a pool of expert slots), ``helpers.sba`` (a
tiny BERT sentence-transformer). Fixtures live in the ``conftest.py`` of the folder that uses them.

``ROOT`` is the repository root, for tests that read committed files (README, notebooks, figures, lib)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
