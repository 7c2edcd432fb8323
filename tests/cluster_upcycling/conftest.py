"""Fixtures of the cluster-upcycling tests (notebook 03)."""
import pytest
import torch


@pytest.fixture(scope="module")
def tiny_st(tmp_path_factory):
    """A tiny random BERT sentence encoder (2 layers, d=32) on all-MiniLM-L6-v2's tokenizer, one per test module;
    skips when the MiniLM tokenizer is not in the asset cache."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import AutoTokenizer, BertConfig, BertModel
    import moelab
    try:
        tok_dir = moelab.assets.minilm_path()
    except moelab.assets.MissingAsset:
        pytest.skip("MiniLM tokenizer not installed")
    d = tmp_path_factory.mktemp("tinybert")
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=64)).save_pretrained(d)
    tok.save_pretrained(d)
    tr = Transformer(str(d), max_seq_length=16)
    return SentenceTransformer(modules=[tr, Pooling(32, "mean"), Normalize()], device="cpu")
