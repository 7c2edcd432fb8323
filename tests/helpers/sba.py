"""A tiny random BERT SentenceTransformer (all-MiniLM-L6-v2's tokenizer, 4 layers, d=32) for the SBA stand-in tests:
the same module structure as MiniLM (Transformer -> mean Pooling -> Normalize) at a size that trains in seconds.
:func:`standin_tokenizer` replaces MiniLM's tokenizer by a tiny one of the same kind (BERT WordPiece, lower-cased) for
the CUDA tests, which check device behaviour and must run on a GPU machine without the asset cache."""
from __future__ import annotations

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
from transformers import AutoTokenizer, BertConfig, BertModel, BertTokenizer

from moelab.assets import minilm_path

TINY_BERT = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=64)

TEXTS = ["a man is playing a guitar on the stage", "the cat sat on the warm mat", "stock markets fell sharply today",
         "rain is expected over the weekend", "she cooked pasta with fresh tomatoes", "the train to paris was late",
         "children play football in the park", "a new vaccine was approved by regulators",
         "the museum opens a painting exhibition", "he repaired the old bicycle himself",
         "volcanoes erupt when pressure builds up", "the orchestra played a symphony by brahms",
         "prices of houses keep rising in the city", "birds migrate south before winter",
         "the programmer fixed a bug in the code", "a storm knocked down power lines",
         "students took an exam in chemistry", "the chef tasted the soup and added salt",
         "astronomers found a distant planet", "the river flooded the small village",
         "a dog chased the ball across the yard", "the bank raised its interest rates",
         "farmers harvest wheat in late summer", "the team celebrated their victory"]


def standin_tokenizer() -> BertTokenizer:
    """A WordPiece tokenizer like MiniLM's (BERT uncased: [CLS] ... [SEP], lower-cased) whose vocabulary is the words
    of TEXTS plus single characters: needs no asset cache."""
    chars = "abcdefghijklmnopqrstuvwxyz0123456789"
    words = sorted({w for t in TEXTS for w in t.lower().split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars), *words]
    return BertTokenizer(vocab={w: i for i, w in enumerate(dict.fromkeys(vocab))}, do_lower_case=True)


def tiny_sentence_transformer(path, seed: int = 0, tokenizer=None) -> SentenceTransformer:
    """The tiny random BERT in MiniLM's layout, with MiniLM's tokenizer (from the asset cache) or ``tokenizer``."""
    tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(str(minilm_path()))
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=tok.vocab_size, **TINY_BERT)
    BertModel(cfg).save_pretrained(str(path))
    tok.save_pretrained(str(path))
    tr = Transformer(str(path), max_seq_length=48)
    return SentenceTransformer(modules=[tr, Pooling(TINY_BERT["hidden_size"], "mean"), Normalize()], device="cpu")


def pairs(n: int = 24):
    """(anchor, positive) pairs built from TEXTS: a text and its word-reversed copy."""
    return [(t, " ".join(reversed(t.split()))) for t in (TEXTS * (1 + n // len(TEXTS)))[:n]]
