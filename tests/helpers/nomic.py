"""A tiny randomly initialised nomic-embed-text-v2-moe checkpoint in the *upstream* format (key names, stacked expert
matrices [E*f, d], config.json, a tiny XLM-R-like Unigram tokenizer), written with safetensors: the loader tests
(tests/sba/test_loader.py) and the SBA measurements on a nomic checkpoint (tests/sba/test_phase_b.py)."""
from __future__ import annotations

import json
import string

import torch
from safetensors.torch import save_file

TINY = dict(vocab_size=128, d_model=32, num_heads=4, d_ff=48, num_layers=4, num_experts=8, top_k=2)


def tiny_tokenizer():
    """A Unigram tokenizer with XLM-R's special ids (<s> 0, <pad> 1, </s> 2, <unk> 3) over characters and a few words."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>"]  # XLM-R ids 0..3
    chars = string.ascii_lowercase + string.digits + string.punctuation
    pieces = [(s, 0.0) for s in specials] + [("\u2581", -2.0)] + [(c, -3.0) for c in chars]
    pieces += [("\u2581" + c, -2.5) for c in string.ascii_lowercase]
    pieces += [("\u2581search", -1.0), ("_query", -1.0), ("_document", -1.0), ("\u2581the", -1.0)]
    tok = Tokenizer(models.Unigram(pieces, unk_id=3))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    assert tok.get_vocab_size() <= TINY["vocab_size"]
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", cls_token="<s>", sep_token="</s>", model_max_length=512)


def upstream_tensors(seed=0, **over):
    """Random tensors under the upstream names (written from the facts note, not from moelab.sba.loader)."""
    c = dict(TINY, **over)
    V, d, f, L, E = c["vocab_size"], c["d_model"], c["d_ff"], c["num_layers"], c["num_experts"]
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, std=0.2):
        return torch.randn(*shape, generator=g) * std

    sd = {"embeddings.word_embeddings.weight": rnd(V, d, std=1.0),
          "embeddings.token_type_embeddings.weight": rnd(1, d),
          "emb_ln.weight": 1 + rnd(d, std=0.1), "emb_ln.bias": rnd(d, std=0.1)}
    for i in range(L):
        p = f"encoder.layers.{i}."
        sd.update({p + "attn.Wqkv.weight": rnd(3 * d, d), p + "attn.Wqkv.bias": rnd(3 * d, std=0.1),
                   p + "attn.out_proj.weight": rnd(d, d), p + "attn.out_proj.bias": rnd(d, std=0.1),
                   p + "norm1.weight": 1 + rnd(d, std=0.1), p + "norm1.bias": rnd(d, std=0.1),
                   p + "norm2.weight": 1 + rnd(d, std=0.1), p + "norm2.bias": rnd(d, std=0.1)})
        if i % 2 == 1:  # odd layers are MoE
            sd.update({p + "mlp.router.layer.weight": rnd(E, d, std=1.0),
                       p + "mlp.experts.mlp.w1": rnd(E * f, d), p + "mlp.experts.mlp.w2": rnd(E * f, d),
                       p + "mlp.experts.bias": rnd(d, std=0.1)})
        else:
            sd.update({p + "mlp.fc1.weight": rnd(f, d), p + "mlp.fc1.bias": rnd(f, std=0.1),
                       p + "mlp.fc2.weight": rnd(d, f), p + "mlp.fc2.bias": rnd(d, std=0.1)})
    return sd


def config_json(**over):
    """nomic_bert's config.json for TINY (overridden by ``over``)."""
    c = dict(TINY, **over)
    return {"model_type": "nomic_bert", "architectures": ["NomicBertModel"], "vocab_size": c["vocab_size"],
            "n_embd": c["d_model"], "n_head": c["num_heads"], "n_inner": c["d_ff"], "n_layer": c["num_layers"],
            "num_experts": c["num_experts"], "moe_top_k": c["top_k"], "moe_every_n_layers": 2,
            "moe_normalize_expert_weights": False, "type_vocab_size": 1, "layer_norm_epsilon": 1e-5,
            "rotary_emb_base": 10000, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
            "prenorm": False, "activation_function": "gelu", "qkv_proj_bias": True, "pad_token_id": 1}


def write_checkpoint(path, sd=None, cfg=None, tokenizer=True):
    """``path`` holding config.json, model.safetensors and (``tokenizer``) the tiny tokenizer; defaults: TINY."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg if cfg is not None else config_json()))
    save_file({k: v.contiguous() for k, v in (sd if sd is not None else upstream_tensors()).items()},
              str(path / "model.safetensors"))
    if tokenizer:
        tiny_tokenizer().save_pretrained(str(path))
    return path
