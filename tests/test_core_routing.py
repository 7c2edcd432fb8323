"""moelab.core.routing against naive references and transformers' routers."""
import pytest
import torch

from moelab.core import routing as R

torch.set_num_threads(1)


def _logits(T=12, E=6, seed=0):
    return torch.randn(T, E, generator=torch.Generator().manual_seed(seed)) * 2


def test_topk_matches_transformers_mixtral_and_olmoe_routers():
    from transformers import MixtralConfig, OlmoeConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.olmoe.modeling_olmoe import OlmoeTopKRouter
    torch.manual_seed(0)
    x = torch.randn(10, 16)
    mix = MixtralTopKRouter(MixtralConfig(hidden_size=16, num_local_experts=6, num_experts_per_tok=2))
    torch.nn.init.normal_(mix.weight)
    z, w, i = mix(x)
    r = R.topk_route(z, 2, renormalize=True)
    assert torch.equal(r.indices, i) and torch.allclose(r.weights, w)
    olm = OlmoeTopKRouter(OlmoeConfig(hidden_size=16, num_experts=6, num_experts_per_tok=2))
    torch.nn.init.normal_(olm.weight)
    z, w, i = olm(x)
    r = R.topk_route(z, 2, renormalize=False)
    assert torch.equal(r.indices, i) and torch.allclose(r.weights, w)
    assert (r.weights.sum(-1) < 1).all()                                  # un-renormalised: kept mass < 1


def test_topk_pesc_softmax_over_kept_logits():
    z = _logits()
    r = R.topk_route(z, 3, softmax_over="topk")
    top, idx = torch.topk(z, 3, dim=-1)
    assert torch.equal(r.indices, idx)
    assert torch.allclose(r.weights, torch.softmax(top, -1))
    assert torch.allclose(r.probs, torch.softmax(z, -1))


def test_active_mask_excludes_free_slots():
    z = _logits()
    z[:, 5] = 100.0                                                        # a free slot with huge logit
    active = torch.tensor([True] * 5 + [False])
    for so in ("all", "topk"):
        r = R.topk_route(z, 2, softmax_over=so, active_mask=active)
        assert not (r.indices == 5).any()
        assert (r.probs[:, 5] == 0).all()
    w, m = R.top_p_route(z, 0.9, active_mask=active)
    assert not m[:, 5].any() and (w[:, 5] == 0).all()
    assert (R.soft_route(z, active)[:, 5] == 0).all()


def _top_p_loop(probs, p, convention):
    mask = torch.zeros_like(probs, dtype=torch.bool)
    for t in range(probs.shape[0]):
        order = torch.argsort(probs[t], descending=True)
        cum = 0.0
        for e in order.tolist():
            if convention == "mass" and cum >= p:       # smallest set reaching p
                break
            if convention == "huang" and cum > p:       # up to and including the first where cumsum > p
                break
            mask[t, e] = True
            cum += float(probs[t, e])
    return mask


@pytest.mark.parametrize("convention", ["mass", "huang"])
@pytest.mark.parametrize("p", [0.3, 0.5, 0.9, 1.0])
def test_top_p_matches_loop(convention, p):
    z = _logits(T=40, E=8, seed=3)
    w, m = R.top_p_route(z, p, convention=convention)
    probs = torch.softmax(z, -1)
    assert torch.equal(m, _top_p_loop(probs.double(), p, convention))
    if convention == "mass":                                               # renormalised by default
        assert torch.allclose(w.sum(-1), torch.ones(40))
        assert (probs * m).sum(-1).ge(p - 1e-6).all()
    else:                                                                  # not renormalised
        assert torch.allclose(w, probs * m)


def test_top_p_conventions_differ_at_exact_boundary():
    probs = torch.tensor([[0.5, 0.25, 0.125, 0.125]])                      # exact binary fractions
    z = probs.log()
    _, m_mass = R.top_p_route(z, 0.75, convention="mass")
    _, m_huang = R.top_p_route(z, 0.75, convention="huang")
    assert m_mass.sum() == 2                                               # {0.5, 0.25} reaches 0.75
    assert m_huang.sum() == 3                                              # needs cumsum > 0.75


def test_dense_to_sparse_roundtrip():
    z = _logits(T=20, E=8)
    w, m = R.top_p_route(z, 0.7)
    idx, ws = R.dense_to_sparse(w, m)
    back = torch.zeros_like(w)
    for t in range(20):
        for j in range(idx.shape[1]):
            if idx[t, j] >= 0:
                back[t, idx[t, j]] += ws[t, j]
    assert torch.allclose(back, w)
    assert ((idx < 0) == (ws == 0)).all()


def test_group_routing_global_ids_and_router():
    torch.manual_seed(0)
    gr = R.GroupRouter(8, num_groups=3, num_experts=4, top_k=2, softmax_over="topk")
    x = torch.randn(9, 8)
    g = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    r = gr(x, g)
    z_ref = torch.stack([gr.weight[g[t]] @ x[t] for t in range(9)])       # z_t = W_{g_t} x_t
    assert torch.allclose(gr.last_logits, z_ref, atol=1e-6)
    loc = R.topk_route(z_ref, 2, softmax_over="topk")
    assert torch.equal(r.indices, loc.indices + 4 * g[:, None])
    assert torch.allclose(r.weights, loc.weights)
    assert r.probs.shape == (9, 12) and torch.allclose(r.probs.sum(-1), torch.ones(9))
    for t in range(9):                                                     # no mass outside the token's group
        assert r.probs[t, : 4 * g[t]].sum() == 0
    with pytest.raises(ValueError, match="group_ids"):
        gr(x, torch.full((9,), 3))


def test_cosine_router_and_topany_gate():
    torch.manual_seed(0)
    cr = R.CosineRouter(8, 5, top_k=2, temperature=0.5)
    x = torch.randn(6, 8)
    ref = torch.stack([torch.stack([torch.nn.functional.cosine_similarity(x[t], cr.weight[e], dim=0)
                                    for e in range(5)]) for t in range(6)]) / 0.5
    assert torch.allclose(cr.logits(x), ref, atol=1e-5)
    ta = R.TopAnyGate(8, 5)
    with torch.no_grad():
        ta.threshold.fill_(-1.0)                                           # sigmoid(-1)=0.27: many selected
    out = ta(x)
    k = out.mask.sum(-1)
    assert torch.allclose(out.weights.sum(-1)[k > 0], torch.ones(int((k > 0).sum())))
    with torch.no_grad():
        ta.threshold.fill_(20.0)                                           # nothing passes
    assert ta(x).unrouted.all()
    ta.eval()
    assert (ta(x).mask.sum(-1) == 1).all()                                 # argmax fallback at eval


def test_bad_input_raises_value_error():
    z = _logits()
    with pytest.raises(ValueError, match="top_k=7"):
        R.topk_route(z, 7)
    with pytest.raises(ValueError, match="top_k"):
        R.topk_route(z, 0)
    for p in (0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="p must be in"):
            R.top_p_route(z, p)
    bad = z.clone()
    bad[3, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        R.topk_route(bad, 2)
    with pytest.raises(ValueError, match="shape"):
        R.topk_route(z[0], 2)
    with pytest.raises(ValueError, match="active_mask"):
        R.topk_route(z, 2, active_mask=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="active experts"):
        R.topk_route(z, 2, active_mask=torch.tensor([True] + [False] * 5))
    with pytest.raises(ValueError, match="convention"):
        R.top_p_route(z, 0.5, convention="x")
