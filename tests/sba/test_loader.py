"""Tests for moelab.sba.loader (nomic-embed-text-v2-moe in plain PyTorch; SBA paper §V-A, notebook 02_sba).

A small randomly initialised checkpoint is written with the *upstream* key names and layouts (stacked expert matrices
[E*f, d]) at scaled-down shapes, saved with safetensors, and loaded back through ``load_nomic``. A naive reference
forward, written here independently (per-token loops, complex-number rotary, hand LayerNorm), must match the module.
A parity test against a real local copy runs when ``MOELAB_NOMIC_PATH`` points at one.
"""
from __future__ import annotations

import json
import math
import os
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from moelab.sba import loader as nomic
from moelab.sba.data import PairCollate
from moelab.sba.experiment import finetune_embedder, nomic_embed

from helpers.nomic import TINY, config_json, upstream_tensors, write_checkpoint


# ----------------------------------------------------------------------------------------------------------------------
# a tiny checkpoint in the upstream format (written by helpers.nomic)
# ----------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("nomic_tiny"))


@pytest.fixture(scope="module")
def model(ckpt):
    return nomic.load_nomic(ckpt)


# ----------------------------------------------------------------------------------------------------------------------
# naive reference forward (independent of moelab.sba.loader)
# ----------------------------------------------------------------------------------------------------------------------
def _ln(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def _gelu(x):  # exact (erf) GELU
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def _rotary_complex(x, base=10000.0):
    """x [S, Dh]: pair dimension j with j + Dh/2 as one complex number and rotate it by pos * base^(-2j/Dh)."""
    S, Dh = x.shape
    half = Dh // 2
    z = torch.complex(x[:, :half].double(), x[:, half:].double())
    pos = torch.arange(S, dtype=torch.float64)[:, None]
    theta = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / Dh)
    z = z * torch.exp(1j * pos * theta)
    return torch.cat([z.real, z.imag], -1).to(x.dtype)


def naive_embed(sd, texts_ids, num_heads, num_layers, top_k=2, aggregate=None):
    """One sequence at a time, one token at a time in the MoE; returns L2-normalised mean-pooled embeddings."""
    outs = []
    for ids in texts_ids:
        ids = torch.tensor(ids)
        x = sd["embeddings.word_embeddings.weight"][ids] + sd["embeddings.token_type_embeddings.weight"][0]
        x = _ln(x, sd["emb_ln.weight"], sd["emb_ln.bias"])
        S, d = x.shape
        Dh = d // num_heads
        for i in range(num_layers):
            p = f"encoder.layers.{i}."
            qkv = x @ sd[p + "attn.Wqkv.weight"].T + sd[p + "attn.Wqkv.bias"]
            q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
            heads = []
            for h in range(num_heads):
                sl = slice(h * Dh, (h + 1) * Dh)
                qh, kh = _rotary_complex(q[:, sl]), _rotary_complex(k[:, sl])
                a = torch.softmax(qh @ kh.T / math.sqrt(Dh), dim=-1)
                heads.append(a @ v[:, sl])
            att = torch.cat(heads, -1) @ sd[p + "attn.out_proj.weight"].T + sd[p + "attn.out_proj.bias"]
            hdn = _ln(att + x, sd[p + "norm1.weight"], sd[p + "norm1.bias"])
            if p + "mlp.router.layer.weight" in sd:
                R = sd[p + "mlp.router.layer.weight"]
                E = R.shape[0]
                w1 = sd[p + "mlp.experts.mlp.w1"].reshape(E, -1, d)
                w2 = sd[p + "mlp.experts.mlp.w2"].reshape(E, -1, d)
                m = torch.zeros_like(hdn)
                for t in range(S):
                    probs = torch.softmax((hdn[t] @ R.T).float(), -1)  # over all experts, no renormalisation
                    wts, idx = probs.topk(top_k)
                    eo = torch.stack([_gelu(w1[e] @ hdn[t]) @ w2[e] for e in idx.tolist()])  # [k, d]
                    if aggregate is None:
                        y = sum(wts[j] * eo[j] for j in range(top_k))
                    else:
                        y = aggregate(eo[None], wts[None])[0]
                    m[t] = y + sd[p + "mlp.experts.bias"]  # one shared bias after the weighted sum
            else:
                m = _gelu(hdn @ sd[p + "mlp.fc1.weight"].T + sd[p + "mlp.fc1.bias"]) @ sd[p + "mlp.fc2.weight"].T \
                    + sd[p + "mlp.fc2.bias"]
            x = _ln(m + hdn, sd[p + "norm2.weight"], sd[p + "norm2.bias"])
        e = x.mean(0)
        outs.append(e / e.norm())
    return torch.stack(outs)


TEXTS = ["the cat sat on the mat.", "graph theory: eulerian paths!", "a", "moe layers route tokens to 2 experts"]


def _ids(model, texts, kind="document"):
    enc = model.tokenize(texts, kind)
    return [row[m.bool()].tolist() for row, m in zip(enc["input_ids"], enc["attention_mask"])]


# ----------------------------------------------------------------------------------------------------------------------
# tests
# ----------------------------------------------------------------------------------------------------------------------
def test_config_defaults_match_released_model():
    cfg = nomic.NomicConfig()
    assert cfg.moe_layers == (1, 3, 5, 7, 9, 11)
    assert (cfg.d_model, cfg.num_heads, cfg.d_ff, cfg.num_experts, cfg.top_k) == (768, 12, 3072, 8, 2)
    shapes = nomic.expected_shapes(cfg)
    assert shapes["encoder.layers.1.mlp.experts.mlp.w1"] == (8 * 3072, 768)
    assert shapes["embeddings.word_embeddings.weight"] == (250048, 768)
    n = sum(math.prod(s) for s in shapes.values())
    assert 470e6 < n < 480e6  # "about 475M float32 parameters"


def test_loads_tiny_checkpoint_and_matches_naive_reference(ckpt, model):
    sd = load_file(str(ckpt / "model.safetensors"))
    ids = _ids(model, TEXTS)
    assert len({len(i) for i in ids}) > 1  # padding is exercised
    ref = naive_embed(sd, ids, TINY["num_heads"], TINY["num_layers"])
    got = model.encode(TEXTS)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)
    assert torch.allclose(got.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-5)


def test_stacked_expert_layout(ckpt, model):
    """Expert e of layer 1 computes gelu(x @ w1[e].T) @ w2[e] with (E, f, d) reshapes of the stored [E*f, d]."""
    sd = load_file(str(ckpt / "model.safetensors"))
    E, f, d = TINY["num_experts"], TINY["d_ff"], TINY["d_model"]
    w1 = sd["encoder.layers.1.mlp.experts.mlp.w1"].reshape(E, f, d)
    w2 = sd["encoder.layers.1.mlp.experts.mlp.w2"].reshape(E, f, d)
    x = torch.randn(5, d, generator=torch.Generator().manual_seed(1))
    layer = model.encoder.layers[1].mlp
    for e in (0, 3, 7):
        torch.testing.assert_close(layer.experts.forward_expert(e, x), _gelu(x @ w1[e].T) @ w2[e],
                                   atol=1e-5, rtol=1e-5)


def test_roundtrip_upstream_state_dict(ckpt, model):
    sd = load_file(str(ckpt / "model.safetensors"))
    back = nomic.upstream_state_dict(model)
    assert set(back) == set(sd)
    for k in sd:
        torch.testing.assert_close(back[k], sd[k])


@pytest.mark.parametrize("method", ["sba", "sba_normfree", "sba_unit"])
def test_aggregation_switch_keeps_routing_and_weights(ckpt, model, method):
    from moelab.core.aggregation import aggregate

    sd = load_file(str(ckpt / "model.safetensors"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lin = model.encode(TEXTS)
    routes_lin = [layer.last_route.indices.clone() for layer in model.moe_layers()]
    try:
        model.set_aggregation(method)
        assert model.aggregation == method
        got = model.encode(TEXTS)
        routes = [layer.last_route.indices.clone() for layer in model.moe_layers()]
        # layer 1's input does not depend on the aggregation, so its routing must be identical
        assert torch.equal(routes[0], routes_lin[0])
        assert not torch.allclose(got, lin, atol=1e-4)
        ref = naive_embed(sd, _ids(model, TEXTS), TINY["num_heads"], TINY["num_layers"],
                          aggregate=lambda eo, w: aggregate(eo, w, method=method))
        torch.testing.assert_close(got, ref, atol=5e-5, rtol=1e-4)
    finally:
        model.set_aggregation("linear")
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    torch.testing.assert_close(model.encode(TEXTS), lin)


def test_bad_aggregation_name(model):
    with pytest.raises(ValueError, match="bogus"):
        model.set_aggregation("bogus")


def test_prefixes(model):
    q = model.encode(["the cat"], kind="query")
    dcm = model.encode(["the cat"], kind="document")
    raw = model.encode(["search_query: the cat"], kind=None)
    torch.testing.assert_close(q, raw)
    assert not torch.allclose(q, dcm)
    with pytest.raises(ValueError, match="passage"):
        model.encode(["x"], kind="passage")


def test_empty_input_list(model):
    with pytest.raises(ValueError, match="empty"):
        model.encode([])


def test_long_input_truncated_with_warning(model):
    long = " ".join(["the"] * 700)  # > 512 tokens
    with pytest.warns(UserWarning, match="truncated to 512"):
        e = model.encode([long, "short"])
    assert e.shape == (2, TINY["d_model"]) and model.last_truncated == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.encode(["short"])  # no warning when nothing is truncated
    assert model.last_truncated == 0
    with pytest.raises(ValueError, match="max_length"):
        model(torch.ones(1, 600, dtype=torch.long))


def test_missing_key_fails_loudly(tmp_path):
    sd = upstream_tensors()
    del sd["encoder.layers.3.mlp.experts.bias"]
    p = write_checkpoint(tmp_path / "m", sd=sd, tokenizer=False)
    with pytest.raises(ValueError, match="missing.*encoder.layers.3.mlp.experts.bias"):
        nomic.load_nomic(p, tokenizer=False)


def test_misshaped_key_fails_loudly(tmp_path):
    sd = upstream_tensors()
    sd["encoder.layers.1.mlp.experts.mlp.w1"] = sd["encoder.layers.1.mlp.experts.mlp.w1"][:-1]
    p = write_checkpoint(tmp_path / "m", sd=sd, tokenizer=False)
    with pytest.raises(ValueError, match=r"encoder.layers.1.mlp.experts.mlp.w1.*shape"):
        nomic.load_nomic(p, tokenizer=False)


def test_unexpected_key_fails_loudly(tmp_path):
    sd = upstream_tensors()
    sd["encoder.layers.0.mlp.experts.bias"] = torch.zeros(TINY["d_model"])  # layer 0 is dense upstream
    p = write_checkpoint(tmp_path / "m", sd=sd, tokenizer=False)
    with pytest.raises(ValueError, match="unexpected"):
        nomic.load_nomic(p, tokenizer=False)


def test_other_architectures_fail_loudly(tmp_path):
    bert_cfg = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 32}
    p = write_checkpoint(tmp_path / "bert", cfg=bert_cfg, tokenizer=False)
    with pytest.raises(ValueError, match="model_type='bert'"):
        nomic.load_nomic(p, tokenizer=False)
    dense = dict(config_json(), num_experts=0)  # nomic-embed-text-v1.5: nomic_bert without MoE
    p = write_checkpoint(tmp_path / "v15", cfg=dense, tokenizer=False)
    with pytest.raises(ValueError, match="dense nomic_bert"):
        nomic.load_nomic(p, tokenizer=False)
    renorm = dict(config_json(), moe_normalize_expert_weights=True)
    p = write_checkpoint(tmp_path / "renorm", cfg=renorm, tokenizer=False)
    with pytest.raises(ValueError, match="moe_normalize_expert_weights"):
        nomic.load_nomic(p, tokenizer=False)
    bert_keys = {"bert.encoder.layer.0.attention.self.query.weight": torch.zeros(32, 32)}
    p = write_checkpoint(tmp_path / "bertkeys", sd=bert_keys, tokenizer=False)
    with pytest.raises(ValueError, match="another architecture"):
        nomic.load_nomic(p, tokenizer=False)


def test_missing_directory_is_missing_asset(tmp_path):
    from moelab.assets import MissingAsset

    with pytest.raises(MissingAsset, match="nomic-embed-text-v2-moe"):
        nomic.load_nomic(tmp_path / "nowhere")
    with pytest.raises(MissingAsset):
        nomic.load_nomic(None)


def test_sharded_checkpoint(tmp_path):
    sd = upstream_tensors()
    p = tmp_path / "sharded"
    p.mkdir()
    (p / "config.json").write_text(json.dumps(config_json()))
    keys = sorted(sd)
    halves = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for name, ks in halves.items():
        save_file({k: sd[k].contiguous() for k in ks}, str(p / name))
    (p / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {k: n for n, ks in halves.items() for k in ks}}))
    m = nomic.load_nomic(p, tokenizer=False)
    ids = torch.tensor([[0, 5, 6, 7, 2]])
    ref = naive_embed(sd, ids.tolist(), TINY["num_heads"], TINY["num_layers"])
    torch.testing.assert_close(m.embed(ids), ref, atol=2e-5, rtol=1e-4)


# ----------------------------------------------------------------------------------------------------------------------
# parity against a real local copy (skipped unless MOELAB_NOMIC_PATH is set)
# ----------------------------------------------------------------------------------------------------------------------
REAL = os.environ.get("MOELAB_NOMIC_PATH")


@pytest.mark.skipif(not REAL, reason="MOELAB_NOMIC_PATH not set (no local copy of nomic-embed-text-v2-moe)")
@pytest.mark.slow
def test_real_checkpoint_parity():
    from pathlib import Path

    m = nomic.load_nomic(REAL)
    assert m.cfg.moe_layers == (1, 3, 5, 7, 9, 11) and m.cfg.num_experts == 8 and m.cfg.top_k == 2
    texts = ["What is the capital of France?", "Paris is the capital of France.", "Photosynthesis needs light."]
    got = m.encode(texts[:1], kind="query")
    docs = m.encode(texts[1:], kind="document")
    sims = (got @ docs.T)[0]
    assert sims[0] > sims[1]  # the relevant document is closer
    sd = {k: v.float() for k, v in nomic.read_safetensors(Path(REAL)).items()}
    ref = naive_embed(sd, _ids(m, texts[:1], "query"), 12, 12)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-3)
    # optional: embeddings computed upstream (sentence-transformers with trust_remote_code) saved as .npy
    ref_file = os.environ.get("MOELAB_NOMIC_REFERENCE")  # npy [3, 768] for `texts` with the 'search_document: ' prefix
    if ref_file:
        upstream = torch.from_numpy(np.load(ref_file)).float()
        torch.testing.assert_close(m.encode(texts, kind="document"), upstream, atol=1e-4, rtol=1e-3)


def test_finetune_tiny_nomic_through_trainer(ckpt):
    """The paper profile's path: MNRL on triplets with nomic's query/document prefixes through moelab.train."""
    m = nomic.load_nomic(ckpt, aggregation="sba")
    m.train()
    trip = [(f"what is {w}", f"{w} is a thing", f"not {w}") for w in ["cats", "dogs", "rain", "maths", "songs", "tea"]]
    collate = PairCollate(lambda t: m.tokenize(t, "query"), lambda t: m.tokenize(t, "document"))
    before = {k: v.detach().cpu().clone() for k, v in m.state_dict().items()}
    res = finetune_embedder(m, trip, trip[:2], steps=2, batch_size=3, lr=1e-3, embed=nomic_embed,
                                collate=collate, aux_coef=0.1)
    assert len(res.history) == 2 and np.isfinite(res.history.loss).all()
    assert "val_mnrl" in res.eval_history
    # the trained model stays on the trainer's device (the GPU under device="auto"): compare on the CPU
    changed = [k for k, v in res.model.state_dict().items() if not torch.equal(v.cpu(), before[k])]
    assert any("experts" in k for k in changed) and any("router" in k for k in changed)
