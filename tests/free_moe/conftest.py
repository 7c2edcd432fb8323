"""Fixtures of the Free-MoE tests (notebook 05); the tokenizer ``tok`` is in tests/conftest.py (MoCE uses it too)."""
import pytest

from helpers.free_moe import tiny_llama


@pytest.fixture(scope="module")
def model():
    """A tiny random Llama (helpers.free_moe.tiny_llama, seed 0), one per test module."""
    return tiny_llama()
