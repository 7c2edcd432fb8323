"""Shared pytest setup: one torch thread per test process, offline hubs, CUDA-marked tests skipped without a GPU;
the fixtures more than one test folder uses. A folder's own fixtures are in its conftest.py, shared helpers in
tests/helpers/."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("MOELAB_PROGRESS", "0")   # tests stay quiet (tests/train/test_progress.py turns bars on)
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
def tok():
    """A tiny byte-level BPE tokenizer trained on ``helpers.free_moe.TEXTS`` (no asset cache), one per test module:
    the Free-MoE and MoCE tests."""
    from helpers.free_moe import tiny_tokenizer
    return tiny_tokenizer()
