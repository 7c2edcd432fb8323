"""Shared pytest setup: one torch thread per test process, offline hubs, CUDA-marked tests skipped without a GPU."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("MOELAB_PROGRESS", "0")   # tests stay quiet (tests/test_progress.py turns bars on)
os.environ.pop("MOELAB_PUBLISH", None)          # a test never publishes by accident

import pytest  # noqa: E402

try:
    import torch  # noqa: E402

    torch.set_num_threads(1)
    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _HAS_CUDA = False


def pytest_collection_modifyitems(config, items):
    if _HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """An empty MOELAB_CACHE for tests that exercise cache behaviour."""
    monkeypatch.setenv("MOELAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def tmp_figures(tmp_path, monkeypatch):
    """Redirect figure outputs (default/full/paper and smoke scratch) into tmp."""
    monkeypatch.setenv("MOELAB_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("MOELAB_SMOKE_DIR", str(tmp_path / "smoke"))
    return tmp_path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random BERT sentence-transformer with all-MiniLM-L6-v2's module structure (tests/sba_tiny.py), one per
    test module: the SBA stand-in tests build their upcycled MoEs from it."""
    from sba_tiny import tiny_sentence_transformer
    return tiny_sentence_transformer(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="module")
def tiny_standin(tmp_path_factory):
    """The same tiny random BERT with a stand-in WordPiece tokenizer (``sba_tiny.standin_tokenizer``) instead of
    MiniLM's: the CUDA tests check device behaviour and run without the asset cache (issue 33)."""
    from sba_tiny import standin_tokenizer, tiny_sentence_transformer
    return tiny_sentence_transformer(tmp_path_factory.mktemp("tiny_bert_standin"), tokenizer=standin_tokenizer())
