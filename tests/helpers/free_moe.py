"""A tiny random Llama, a tiny byte-level BPE tokenizer trained on eight short texts (no asset cache) and the
calibration batches built from them: the Free-MoE tests (notebook 05) and the MoCE tests that need a tokenizer.
The fixtures ``tok`` (tests/conftest.py) and ``model`` (tests/free_moe/conftest.py) are built from these."""
import torch

from moelab import free_moe as fm

TEXTS = ["def add(a, b): return a + b", "What is 12 times 7? 84", "The capital of France is Paris.",
         "for i in range(10): print(i)", "If x + 3 = 5 then x = 2", "Cats are mammals and birds lay eggs.",
         "import math\nmath.sqrt(16)", "Solve 3y = 12: y = 4"]


def tiny_llama(seed=0, hidden=32, inter=64, layers=2):
    """A random 2-layer Llama (vocabulary 300, 4 heads, 2 key-value heads) in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=300, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


def tiny_tokenizer():
    """A byte-level BPE tokenizer (vocabulary 300, ``<pad>`` doubling as end of sequence) trained on TEXTS."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
    from transformers import PreTrainedTokenizerFast
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(TEXTS * 5, trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<unk>"],
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>", unk_token="<unk>", eos_token="<pad>")


def batches(tok):
    """TEXTS tokenized by ``tok`` in batches of 3 (Free-MoE's calibration input)."""
    return fm.data.tokenize_batches(tok, TEXTS, batch_size=3, max_length=64)
