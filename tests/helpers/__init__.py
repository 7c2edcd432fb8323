"""Helpers the test files share (importable as ``helpers``: pytest puts ``tests/`` on ``sys.path``, see
pyproject.toml's ``[tool.pytest.ini_options]``). One module per area: ``helpers.free_moe`` (tiny Llama and
tokenizer), ``helpers.cluster_upcycling`` (tiny word-pair data), ``helpers.core`` (synthetic clusters, a tiny BERT
FFN), ``helpers.claims`` (synthetic result folders), ``helpers.mass`` (a pool of expert slots), ``helpers.sba`` (a
tiny BERT sentence-transformer). Fixtures live in the ``conftest.py`` of the folder that uses them.

``ROOT`` is the repository root, for tests that read committed files (README, notebooks, figures, lib)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


PAPERS_DIR = ROOT / "docs" / "papers"   # plain-text copies of the five papers (docs/papers/README.md)


def paper_text(number: str) -> str:
    """The text of paper ``number`` ("000".."004") from docs/papers/ (the quote tests read it)."""
    hits = sorted(PAPERS_DIR.glob(f"{number}_*.txt"))
    if not hits:
        raise FileNotFoundError(f"no docs/papers/{number}_*.txt: the papers' texts are part of the repository")
    return hits[0].read_text()
