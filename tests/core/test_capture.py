"""capture_moe on MoELayer and transformers' Mixtral / Qwen2-MoE / OLMoE blocks (tiny random configs)."""
import pytest
import torch

from moelab.core import MoELayer, capture_moe
from moelab.core.capture import is_hf_moe_block

torch.set_num_threads(1)


def _tiny(kind):
    import transformers as tf
    common = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, vocab_size=64,
                  max_position_embeddings=64)
    if kind == "mixtral":
        cfg = tf.MixtralConfig(intermediate_size=24, num_local_experts=4, num_experts_per_tok=2, **common)
        model = tf.MixtralForCausalLM(cfg)
    elif kind == "qwen2_moe":
        cfg = tf.Qwen2MoeConfig(intermediate_size=24, moe_intermediate_size=12, shared_expert_intermediate_size=20,
                                num_experts=4, num_experts_per_tok=2, **common)
        model = tf.Qwen2MoeForCausalLM(cfg)
    else:
        cfg = tf.OlmoeConfig(intermediate_size=24, num_experts=4, num_experts_per_tok=2, **common)
        model = tf.OlmoeForCausalLM(cfg)
    torch.manual_seed(0)
    for m in model.modules():
        if is_hf_moe_block(m):
            torch.nn.init.normal_(m.gate.weight, std=0.5)
            torch.nn.init.normal_(m.experts.gate_up_proj, std=0.2)
            torch.nn.init.normal_(m.experts.down_proj, std=0.2)
    return model.eval()


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe", "olmoe"])
def test_capture_hf_blocks_reconstructs_block_output(kind):
    model = _tiny(kind)
    outs = {}
    blocks = {n: m for n, m in model.named_modules() if is_hf_moe_block(m)}
    assert len(blocks) == 2
    hs = [m.register_forward_hook(lambda mod, a, o, n=n: outs.__setitem__(n, (a[0].detach(), o.detach())))
          for n, m in blocks.items()]
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), capture_moe(model) as cap:
        model(ids)
    for h in hs:
        h.remove()
    for name, blk in blocks.items():
        rec = cap.records[name]
        x, y = outs[name]
        x2 = x.reshape(-1, 16)
        _, w, idx = blk.gate(x2)
        assert torch.equal(rec["indices"], idx) and torch.allclose(rec["weights"], w)
        eo = rec["expert_outputs"]
        assert eo.shape == (14, 2, 16)
        recon = (rec["weights"][..., None] * eo).sum(1)                          # sum_j w_j e_j
        if kind == "qwen2_moe":
            recon = recon + torch.sigmoid(blk.shared_expert_gate(x2)) * blk.shared_expert(x2)
        assert torch.allclose(recon, y.reshape(-1, 16), atol=1e-5)
        st = cap.stats[name]
        assert st["tokens"] == 14 and torch.isclose(st["load"].sum(), torch.tensor(2.0))
    # hooks are gone after the context
    assert all(not m._forward_hooks for m in blocks.values())


def test_capture_moelayer_subsample_and_max_tokens():
    torch.manual_seed(0)
    net = torch.nn.Sequential(MoELayer(8, 12, 4, 2, renormalize=False), MoELayer(8, 12, 4, 2))
    x = torch.randn(3, 10, 8)
    y_plain = net(x)
    with capture_moe(net, max_tokens=7, sample_every=2) as cap:
        y = net(x)
        net(x)
    assert torch.allclose(y, y_plain, atol=1e-6)                                 # capture does not change outputs
    rec = cap.records["0"]
    assert rec["indices"].shape == (7, 2) and rec["expert_outputs"].shape == (7, 2, 8)
    assert torch.equal(rec["positions"], torch.arange(0, 14, 2))
    r0 = net[0].last_route                                                       # second pass: same tokens
    assert torch.equal(rec["indices"], r0.indices[0:14:2])
    x2 = x.reshape(-1, 8)
    for t_i, t in enumerate(range(0, 14, 2)):
        for j in range(2):
            e = int(rec["indices"][t_i, j])
            assert torch.allclose(rec["expert_outputs"][t_i, j], net[0].experts.forward_expert(e, x2[t]), atol=1e-5)
    assert cap.stats["0"]["tokens"] == 60                                        # stats stream over all tokens
    assert not net[0]._capture_fns
    with capture_moe(net, max_tokens=0, keep_outputs=False) as cap2:
        net(x)
    assert cap2.records["1"]["indices"].shape[0] == 0 and cap2.stats["1"]["tokens"] == 30
    with pytest.raises(ValueError, match="sample_every"):
        capture_moe(net, sample_every=0)
    with pytest.raises(ValueError, match="no MoE layer"):
        capture_moe(torch.nn.Linear(2, 2))
