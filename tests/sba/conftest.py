"""Fixtures of the SBA tests (notebook 02): the tiny BERT sentence-transformers the stand-in tests build on."""
import pytest


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random BERT sentence-transformer with all-MiniLM-L6-v2's module structure (tests/helpers/sba.py), one per
    test module: the SBA stand-in tests build their upcycled MoEs from it."""
    from helpers.sba import tiny_sentence_transformer
    return tiny_sentence_transformer(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="module")
def tiny_standin(tmp_path_factory):
    """The same tiny random BERT with a stand-in WordPiece tokenizer (``helpers.sba.standin_tokenizer``) instead of
    MiniLM's: the CUDA tests check device behaviour and run without the asset cache."""
    from helpers.sba import standin_tokenizer, tiny_sentence_transformer
    return tiny_sentence_transformer(tmp_path_factory.mktemp("tiny_bert_standin"), tokenizer=standin_tokenizer())
