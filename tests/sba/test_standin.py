"""Tests for moelab.sba.standin: all-MiniLM-L6-v2's stand-in upcycled in nomic's layout, init compensation and its
damage (SBA paper §V-A; notebook 02_sba). On a tiny random BERT with MiniLM's module structure."""
from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from moelab import sba
from moelab.sba.geometry import moe_specialisation
from moelab.sba.method import set_aggregation
from moelab.sba.standin import build_nomic_layout_moe, compensate_init, compensation_factors, embedding_cosine_to_dense, init_damage
from moelab.core.layer import moe_layers

from helpers.sba import TEXTS

warnings.filterwarnings("ignore", message=".*rank-deficient.*")


@pytest.fixture(scope="module")
def cluster_moe(tiny):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_nomic_layout_moe(tiny, init="cluster", calib_texts=TEXTS, seed=0)


def _naive_nomic_layer(layer, x):
    """Per-token loop: p = softmax(W_r x) over all experts, the two largest kept unnormalised,
    y = Σ_{i ∈ top2} p_i · W_out_i gelu(W_in_i x + b_in_i) + b   (nomic's MoE FFN)."""
    ex = layer.experts
    Wr = layer.router.proj.weight.double()
    out = []
    for t in range(x.shape[0]):
        xt = x[t].double()
        z = [float(Wr[e] @ xt) for e in range(Wr.shape[0])]
        m = max(z)
        p = [math.exp(v - m) for v in z]
        p = [v / sum(p) for v in p]
        top = sorted(range(len(p)), key=lambda e: -p[e])[:2]
        y = layer.shared_bias.double().clone()
        for e in top:
            h = ex.w_in[e].double() @ xt + ex.b_in[e].double()
            y = y + p[e] * (ex.w_out[e].double() @ F.gelu(h))
        out.append(y)
    return torch.stack(out)


def test_nomic_layout_structure_and_layer_matches_naive_loop(cluster_moe, tiny):
    layers = moe_layers(cluster_moe)
    assert len(layers) == 2  # odd layers 1 and 3 of 4
    for layer in layers:
        assert layer.num_experts == 8 and layer.top_k == 2 and layer.renormalize is False
        assert layer.shared_bias is not None and layer.experts.b_out is None and layer.experts.b_in is not None
        assert layer.aggregation == "linear"
        x = torch.randn(12, 32, generator=torch.Generator().manual_seed(1)) * 3
        with torch.no_grad():
            torch.testing.assert_close(layer(x).double(), _naive_nomic_layer(layer, x), atol=1e-5, rtol=1e-5)
    # the cluster-aware initialiser made the experts differ, the dense model is untouched
    assert moe_specialisation(cluster_moe).expert_similarity.max() < 0.999
    assert not moe_layers(tiny)
    assert cluster_moe.init_compensation is None


def test_copies_with_exact_compensation_equal_dense(tiny):
    """Identical experts + a zero router (uniform softmax: s = 2/8 for every token) + compensation c = 4 -> dense."""
    ref = tiny.encode(TEXTS, convert_to_tensor=True)
    m = build_nomic_layout_moe(tiny, init="sparse", seed=0)
    with torch.no_grad():
        for layer in moe_layers(m):
            layer.router.proj.weight.zero_()
    assert (m.encode(TEXTS, convert_to_tensor=True) - ref).abs().max() > 1e-3  # uncompensated: FFN scaled by 1/4
    tab = compensate_init(m, TEXTS)
    np.testing.assert_allclose(tab.kept_mass_mean, 0.25, rtol=1e-6)
    np.testing.assert_allclose(tab.factor, 4.0, rtol=1e-6)
    torch.testing.assert_close(m.encode(TEXTS, convert_to_tensor=True), ref, atol=1e-5, rtol=1e-5)
    assert m.init_compensation is tab
    set_aggregation(m, "sba")  # aligned experts: SBA == linear
    torch.testing.assert_close(m.encode(TEXTS, convert_to_tensor=True), ref, atol=1e-5, rtol=1e-5)


def _naive_factors(model, texts):
    """Direct loop: for each MoE layer in order, its inputs on the real tokens (hooked), per token the sum of the two
    largest softmax probabilities, the mean, c = 1/mean; the layer's W_out scaled by c before the next layer."""
    model = copy.deepcopy(model)
    out = []
    for layer in moe_layers(model):
        xs = []
        h = layer.register_forward_pre_hook(lambda mod, args: xs.append(args[0].detach().reshape(-1, 32)))
        masks = []
        with torch.no_grad():
            for i in range(0, len(texts), 5):
                f = model.tokenize(texts[i:i + 5])
                model(dict(f))
                masks.append(f["attention_mask"].reshape(-1).bool())
        h.remove()
        x = torch.cat(xs)[torch.cat(masks)]
        W = layer.router.proj.weight.detach().double()
        sums = []
        for t in range(x.shape[0]):
            p = torch.softmax(W @ x[t].double(), 0).tolist()
            sums.append(sum(sorted(p)[-2:]))
        s = sum(sums) / len(sums)
        out.append((s, 1 / s))
        with torch.no_grad():
            layer.experts.w_out.mul_(1 / s)
    return out


def test_compensation_factors_match_direct_loop(cluster_moe):
    before = {k: v.clone() for k, v in cluster_moe.state_dict().items()}
    tab = compensation_factors(cluster_moe, TEXTS)  # apply=False: the model is left as it was
    assert all(torch.equal(v, before[k]) for k, v in cluster_moe.state_dict().items())
    ref = _naive_factors(cluster_moe, TEXTS)
    np.testing.assert_allclose(tab.kept_mass_mean, [r[0] for r in ref], rtol=1e-5)
    np.testing.assert_allclose(tab.factor, [r[1] for r in ref], rtol=1e-5)
    assert ((tab.kept_mass_mean > 0.25 - 1e-9) & (tab.kept_mass_mean <= 1)).all()  # top-2 of 8 holds >= 2/8
    with pytest.raises(ValueError, match="calibration texts"):
        compensation_factors(cluster_moe, [])


def test_build_errors(tiny):
    with pytest.raises(ValueError, match="calib_texts"):
        build_nomic_layout_moe(tiny, init="cluster", calib_texts=None)
    with pytest.raises(ValueError, match="init='bogus'"):
        build_nomic_layout_moe(tiny, init="bogus")
    with pytest.raises(ValueError, match="aggregation='mean'"):
        build_nomic_layout_moe(tiny, init="sparse", aggregation="mean")


def test_init_damage_with_and_without_compensation(tiny):
    def evaluate(encode):
        e = encode(TEXTS[:4])
        return pd.DataFrame([dict(benchmark="toy", metric="mean_cos", score=float((e[0] * e[1:]).sum(1).mean()))])

    res = init_damage(tiny, TEXTS[:16], TEXTS[16:], evaluate=evaluate, init="sparse")
    t = res["table"].set_index("model")
    assert list(t.index) == ["dense", "sparse (nomic layout)", "sparse (nomic layout, compensated)"]
    assert t.loc["dense", "cos_mean"] == 1.0
    raw, comp = t.loc["sparse (nomic layout)"], t.loc["sparse (nomic layout, compensated)"]
    assert comp.compensated and not raw.compensated
    # copies + a near-uniform router: s ≈ 1/4 for every token, so compensation nearly undoes the damage
    assert 0.25 <= raw.kept_mass_mean < 0.4
    assert (1 - comp.cos_mean) < 0.2 * (1 - raw.cos_mean)
    f = res["factors"]
    np.testing.assert_allclose(f.factor, 1 / f.kept_mass_mean)
    assert (f.factor > 2.5).all() and (f.factor <= 4 + 1e-9).all()
    assert set(res["scores"].model) == set(t.index) and len(res["scores"]) == 3
    # a direct cosine for one model
    cos = embedding_cosine_to_dense(res["models"]["sparse (nomic layout)"], tiny, TEXTS[16:])
    a = res["models"]["sparse (nomic layout)"].encode(TEXTS[16:], convert_to_tensor=True)
    b = tiny.encode(TEXTS[16:], convert_to_tensor=True)
    np.testing.assert_allclose(cos, [float(F.cosine_similarity(a[i], b[i], dim=0)) for i in range(len(a))],
                               rtol=1e-5)
