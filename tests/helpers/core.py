"""Synthetic inputs for the core initialiser tests and the cluster-upcycling tests that reuse them."""
import torch


def blobs(n_per=60, d=16, E=4, noise=0.05, seed=0):
    """``E`` random unit directions, ``n_per`` points along each (random length 1-4, small noise): (x, labels, dirs)."""
    g = torch.Generator().manual_seed(seed)
    dirs = torch.nn.functional.normalize(torch.randn(E, d, generator=g), dim=1)
    x = torch.cat([dirs[i] * (1 + torch.rand(n_per, 1, generator=g) * 3) + noise * torch.randn(n_per, d, generator=g)
                   for i in range(E)])
    y = torch.arange(E).repeat_interleave(n_per)
    return x, y, dirs


def tiny_bert_ffn(d=16, f=32, seed=0):
    """The feed-forward block of a one-layer random BERT, wrapped as core's ``BertFFN``."""
    from transformers import BertConfig, BertModel

    from moelab.core.init import BertFFN
    torch.manual_seed(seed)
    m = BertModel(BertConfig(hidden_size=d, intermediate_size=f, num_hidden_layers=1, num_attention_heads=2,
                             vocab_size=50, max_position_embeddings=16))
    return BertFFN(m.encoder.layer[0])
