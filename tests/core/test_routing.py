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
    assert torch.allclose(w, probs * m)                                    # raw probabilities by default
    if convention == "mass":
        assert (probs * m).sum(-1).ge(p - 1e-6).all()


def _mass_batch_loop(probs, mask):
    """The MASS authors' dispatch rule, token by token: renormalise iff some token keeps > 1 expert."""
    k_max = max(int(mask[t].sum()) for t in range(probs.shape[0]))
    out = torch.zeros_like(probs)
    for t in range(probs.shape[0]):
        kept = [e for e in range(probs.shape[1]) if mask[t, e]]
        total = sum(float(probs[t, e]) for e in kept)
        for e in kept:
            out[t, e] = probs[t, e] / total if k_max > 1 else probs[t, e]
    return out


def test_top_p_renormalisation_options_match_loops():
    z = _logits(T=30, E=6, seed=4)
    probs = torch.softmax(z, -1)
    w, m = R.top_p_route(z, 0.5, renormalize="mass_batch")                 # mixed batch: renormalised
    assert 1 < int(m.sum(-1).max()) and int(m.sum(-1).min()) == 1
    torch.testing.assert_close(w, _mass_batch_loop(probs, m))
    torch.testing.assert_close(w.sum(-1), torch.ones(30))
    single = z.clone()
    single[:, 0] = z.max(-1).values + 2.0                                   # p_0 >= 0.6: every token keeps only 0
    w1, m1 = R.top_p_route(single, 0.5, renormalize="mass_batch")
    assert (m1.sum(-1) == 1).all()
    torch.testing.assert_close(w1, _mass_batch_loop(torch.softmax(single, -1), m1))
    assert (w1[:, 0] < 1).all()                                            # raw p_1 < 1: the gate gets a gradient
    wt, mt = R.top_p_route(z, 0.5, renormalize=True, allow_gradient_free_routes=True)   # per token (opt-in)
    torch.testing.assert_close(wt, probs * mt / (probs * mt).sum(-1, keepdim=True))
    w_full, _ = R.top_p_route(z, 1.0, renormalize=True)                    # p = 1 keeps every expert: allowed
    torch.testing.assert_close(w_full.sum(-1), torch.ones(30))


def test_topk_mass_batch_is_renormalised_for_k_above_1_and_raw_for_top1():
    z = _logits()
    torch.testing.assert_close(R.topk_route(z, 2, renormalize="mass_batch").weights,
                               R.topk_route(z, 2, renormalize=True).weights)
    torch.testing.assert_close(R.topk_route(z, 1, renormalize="mass_batch").weights,
                               torch.softmax(z, -1).max(-1, keepdim=True).values)


def test_gradient_free_routes_raise_unless_asked_for():
    z = _logits()
    with pytest.raises(ValueError, match="top-1 with renormalised weights gives every token weight 1"):
        R.topk_route(z, 1, renormalize=True)
    with pytest.raises(ValueError, match="softmax_over='topk'"):
        R.topk_route(z, 1, softmax_over="topk")
    with pytest.raises(ValueError, match="no gradient from the task loss"):
        R.top_p_route(z, 0.5, renormalize=True)
    with pytest.raises(ValueError, match="renormalize must be one of"):
        R.topk_route(z, 2, renormalize="yes")
    g = torch.zeros(z.shape[0], dtype=torch.long)
    with pytest.raises(ValueError, match="weight 1"):
        R.group_topk_route(z, g, 1, 1, softmax_over="topk")
    for make in (lambda **kw: R.LinearRouter(8, 4, 1, **kw), lambda **kw: R.GroupRouter(8, 2, 4, 1, **kw),
                 lambda **kw: R.CosineRouter(8, 4, top_k=1, **kw)):
        with pytest.raises(ValueError, match="allow_gradient_free_routes=True"):
            make(renormalize=True)
        make(renormalize=True, allow_gradient_free_routes=True)            # the explicit opt-in still works
    old = R.topk_route(z, 1, renormalize=True, allow_gradient_free_routes=True)
    assert torch.equal(old.weights, torch.ones(z.shape[0], 1))             # the old behaviour: weight exactly 1
    assert torch.equal(R.topk_route(z, 1, softmax_over="topk", allow_gradient_free_routes=True).weights,
                       torch.ones(z.shape[0], 1))
    raw = R.topk_route(z, 1)                                               # default: Switch raw probability
    torch.testing.assert_close(raw.weights, torch.softmax(z, -1).max(-1, keepdim=True).values)


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
