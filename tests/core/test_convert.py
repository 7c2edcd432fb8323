"""Dense -> MoE conversion (tiny Llama and BERT configs): upcycling equals the dense model, initialisers, save/load."""
import pytest
import torch
import transformers as tf

from moelab.core import MoELayer, moe_layers
from moelab.core.convert import collect_ffn_inputs, ffn_sites, load_moe, moeify, save_moe
from moelab.core.init import dense_ffn_spec, drop_init

torch.set_num_threads(1)


def _llama():
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=16, intermediate_size=24, num_hidden_layers=3, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=64, max_position_embeddings=64, tie_word_embeddings=True)
    return tf.LlamaForCausalLM(cfg).eval()


def _bert():
    torch.manual_seed(0)
    cfg = tf.BertConfig(hidden_size=16, intermediate_size=24, num_hidden_layers=3, num_attention_heads=2,
                        vocab_size=64, max_position_embeddings=64)
    m = tf.BertModel(cfg).eval()
    with torch.no_grad():                                                   # non-zero biases so they matter
        for layer in m.encoder.layer:
            layer.intermediate.dense.bias.normal_(0, 0.5)
            layer.output.dense.bias.normal_(0, 0.5)
    return m


IDS = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))


def _out(model):
    with torch.no_grad():
        o = model(IDS)
    return o.logits if hasattr(o, "logits") else o.last_hidden_state


@pytest.mark.parametrize("make,kw", [(_llama, dict()), (_bert, dict()), (_bert, dict(shared_bias=True))])
def test_sparse_upcycling_equals_dense_with_renormalised_topk(make, kw):
    model = make()
    ref = _out(model)
    moeify(model, "all", num_experts=4, top_k=2, init="sparse", renormalize=True, **kw)
    assert len(moe_layers(model)) == 3
    assert torch.allclose(_out(model), ref, atol=1e-5)


@pytest.mark.parametrize("make", [_llama, _bert])
def test_without_renormalisation_output_scaled_by_kept_mass(make):
    model = make()
    site = ffn_sites(model)[1]
    dense = site.ffn
    x = torch.randn(10, 16)
    with torch.no_grad():
        y_dense = dense(x)
    moe = MoELayer.from_dense(dense, 4, 2, init="sparse", renormalize=False)
    with torch.no_grad():
        y = moe(x)
    mass = moe.last_route.weights.sum(-1, keepdim=True)                     # sum_{j in topk} p_j < 1
    assert (mass < 1).all()
    assert torch.allclose(y, mass * y_dense, atol=1e-5)                     # biases scale too (inside each expert)
    moe_sb = MoELayer.from_dense(dense, 4, 2, init="sparse", renormalize=False, shared_bias=True)
    if dense_ffn_spec(dense).b_out is not None:                             # BERT: shared b_out added once
        with torch.no_grad():
            y2 = moe_sb(x)
        b = dense_ffn_spec(dense).b_out
        assert torch.allclose(y2, moe_sb.last_route.weights.sum(-1, keepdim=True) * (y_dense - b) + b, atol=1e-5)


def test_bert_conversion_keeps_layernorm_and_residual():
    model = _bert()
    moeify(model, "every_other", num_experts=4, top_k=2)
    layer = model.encoder.layer[1]
    assert isinstance(layer.output.dense, MoELayer) and isinstance(layer.output.LayerNorm, torch.nn.LayerNorm)
    assert not isinstance(model.encoder.layer[0].output.dense, MoELayer)


def test_initialisers_noise_drop_and_callable_hook():
    model = _llama()
    dense = model.model.layers[0].mlp
    spec = dense_ffn_spec(dense)
    moe = MoELayer.from_dense(dense, 4, 2, init="noise")
    assert not torch.equal(moe.experts.w_in[0], moe.experts.w_in[1])
    assert torch.allclose(moe.experts.w_in[0], spec.w_in, atol=0.25 * float(spec.w_in.detach().std()))
    moe = MoELayer.from_dense(dense, 4, 2, init=drop_init(ratio=0.5, seed=0))
    f = spec.d_ff
    for e in range(4):
        changed_rows = (moe.experts.w_in[e, :f] != spec.w_in[:f]).any(-1)     # gate rows
        changed_cols = (moe.experts.w_out[e] != spec.w_out).any(0)
        assert int(changed_rows.sum()) == f // 2 and torch.equal(changed_rows, changed_cols)
        assert torch.equal((moe.experts.w_in[e, f:] != spec.w_in[f:]).any(-1), changed_rows)   # up rows too
    assert abs(float(moe.router.weight.std()) - 0.02) < 0.01
    seen = {}

    def hook(dense_ffn, layer, calib_x):
        seen["calib"] = calib_x
        with torch.no_grad():
            layer.router.weight.zero_()
    calib = collect_ffn_inputs(model, [IDS, {"input_ids": IDS, "attention_mask": torch.ones_like(IDS)}],
                               layers=[0, 2], max_tokens=25)
    assert set(calib) == {0, 2} and calib[0].shape == (25, 16)
    moeify(model, [0, 2], 4, 2, init=hook, calib_inputs=calib)
    assert seen["calib"] is calib[2] and (model.model.layers[2].mlp.router.weight == 0).all()
    mask = torch.ones_like(IDS)
    mask[0, 5:] = 0
    c2 = collect_ffn_inputs(_llama(), [{"input_ids": IDS, "attention_mask": mask}])
    assert c2[0].shape[0] == int(mask.sum())                                # padding dropped


@pytest.mark.parametrize("make", [_llama, _bert])
def test_save_load_roundtrip(make, tmp_path):
    model = make()
    moeify(model, "every_other", num_experts=4, top_k=2, init="drop", renormalize=False)
    with torch.no_grad():
        for m in moe_layers(model):
            m.router.weight.normal_(0, 1.0)
    ref = _out(model)
    save_moe(model, tmp_path / "m")
    re = load_moe(tmp_path / "m")
    assert torch.equal(_out(re), ref)


def test_convert_bad_input():
    model = _llama()
    with pytest.raises(ValueError, match="out of range"):
        moeify(model, [7], 4, 2)
    with pytest.raises(ValueError, match="layers must be"):
        moeify(model, "odd", 4, 2)
    with pytest.raises(ValueError, match="init must be"):
        moeify(model, [0], 4, 2, init="svd")
    with pytest.raises(ValueError, match="top_k=5"):
        moeify(_llama(), [0], 4, 5)
    with pytest.raises(ValueError, match="no supported FFN"):
        ffn_sites(torch.nn.Linear(2, 2))


# ------------------------------------------------------------------------- padding and the aux loss
def _padded():
    mask = torch.ones_like(IDS)
    mask[0, 5:] = 0                                                         # right padding
    mask[1, :2] = 0                                                         # left padding
    return mask


def _moe_model(make):
    model = make()
    moeify(model, "all", num_experts=4, top_k=2, init="sparse", renormalize=True)
    with torch.no_grad():
        for m in moe_layers(model):
            m.router.weight.normal_(0, 1.0)                                 # routing that depends on the token
    return model


def _check_layers_against_transformers(model, mask):
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    for m in moe_layers(model):
        z = m.last_router_logits.detach()
        torch.testing.assert_close(m.aux_loss, load_balancing_loss_func((z,), 4, 2, attention_mask=mask))
        assert not torch.allclose(m.aux_loss, load_balancing_loss_func((z,), 4, 2), atol=1e-5)   # padding matters
        assert m.token_mask is None                                         # released after the forward pass


@pytest.mark.parametrize("make", [_llama, _bert])
def test_moeify_keeps_padding_out_of_the_balancing_loss(make):
    import copy
    model = _moe_model(make)
    mask = _padded()
    with torch.no_grad():
        model(input_ids=IDS, attention_mask=mask)
    _check_layers_against_transformers(model, mask)
    first = [m.aux_loss.clone() for m in moe_layers(model)]
    with torch.no_grad():
        model(IDS, mask)                                                    # positional attention_mask
    assert all(torch.equal(a, m.aux_loss) for a, m in zip(first, moe_layers(model)))
    twin = copy.deepcopy(model)                                             # the hooks follow the copy
    with torch.no_grad():
        twin(input_ids=IDS, attention_mask=mask)
    _check_layers_against_transformers(twin, mask)
    with pytest.raises(ValueError, match="2-D attention_mask"):
        model(input_ids=IDS, attention_mask=mask[:, None, None, :])


@pytest.mark.parametrize("make", [_llama, _bert])
def test_direct_forward_call_also_masks_padding(make):
    """sentence-transformers calls ``auto_model.forward(...)`` (no module hooks): the bound forward captures the mask
    too, also on a deep copy; and the model still saves and loads its state dict unchanged."""
    import copy
    model = _moe_model(make)
    mask = _padded()
    with torch.no_grad():
        model.forward(input_ids=IDS, attention_mask=mask)
    _check_layers_against_transformers(model, mask)
    twin = copy.deepcopy(model)
    assert twin.forward.__self__ is twin
    with torch.no_grad():
        twin.forward(input_ids=IDS, attention_mask=mask)
    _check_layers_against_transformers(twin, mask)
    assert set(twin.state_dict()) == set(model.state_dict())


def test_moeify_mask_with_kv_cache_uses_the_current_positions():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    model = _moe_model(_llama)
    mask = torch.ones_like(IDS)
    mask[1, :3] = 0                                                         # left padding
    mask[0, 7] = 0                                                          # a masked current position
    with torch.no_grad():
        out = model(input_ids=IDS[:, :6], attention_mask=mask[:, :6], use_cache=True)
        model(input_ids=IDS[:, 6:8], attention_mask=mask[:, :8], past_key_values=out.past_key_values)
    for m in moe_layers(model):
        z = m.last_router_logits.detach()
        assert z.shape[0] == 4
        torch.testing.assert_close(m.aux_loss, load_balancing_loss_func((z,), 4, 2, attention_mask=mask[:, 6:8]))
