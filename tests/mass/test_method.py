"""MASS pieces (moelab.mass) against loops and the paper's formulas (notebook 04)."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.spatial.distance import jensenshannon
from scipy.stats import norm

from moelab.mass import (MassConfig, MassExpander, StackedMoETransformer, _nll, cpd_pvalue, elbow_max_chord,
                         eval_per_sequence, frontier, project_rows, rolling_z, routing_jsd, top_p_weights,
                         topk_weights, train_stacked, weight_grad_cos)


def tiny(M=3, E=4, num=None, **kw):
    kw = kw or dict(top_k=2)
    return StackedMoETransformer(M, 11, 8, 2, 6, E, num_experts=num if num is not None else E, seeds=range(M), **kw)


def test_topk_weights_match_loop():
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(2, 5, 6), -1)
    k = torch.tensor([1, 3])
    w = topk_weights(probs, k)
    for m in range(2):
        for n in range(5):
            top = torch.topk(probs[m, n], int(k[m])).indices
            ref = torch.zeros(6)
            ref[top] = probs[m, n, top]
            if k[m] > 1:
                ref = ref / ref.sum()
            torch.testing.assert_close(w[m, n], ref)


def test_top_p_weights_match_loop():
    torch.manual_seed(1)
    logits = torch.randn(3, 7, 8)
    logits[0, :, 5:] = float("-inf")                   # free slots
    w = top_p_weights(logits, 0.5)
    probs = torch.softmax(logits, -1)
    for m in range(3):
        for n in range(7):
            p, idx = torch.sort(probs[m, n], descending=True)
            keep, c = [], 0.0
            for j in range(8):                          # smallest set whose mass reaches p
                keep.append(int(idx[j]))
                c += float(p[j])
                if c >= 0.5:
                    break
            ref = torch.zeros(8)
            ref[keep] = probs[m, n, keep] / probs[m, n, keep].sum()
            torch.testing.assert_close(w[m, n], ref)
    assert (w[0, :, 5:] == 0).all()


def _single_model_reference(model, m, tokens):
    """Loop reference of model m: per token, per expert."""
    with torch.no_grad():
        B, S = tokens.shape
        d, H = model.d, model.h
        ln = lambda x, n: F.layer_norm(x, (d,)) * model.ln[f"{n}_g"][m] + model.ln[f"{n}_b"][m]
        x = model.emb[m][tokens] + model.pe[:S]
        heads = lambda t: t.reshape(B, S, H, d // H).transpose(1, 2)

        def attn(xn, wqkv, wo):
            q, k, v = (xn @ wqkv.T).split(d, -1)
            att = torch.softmax((heads(q) @ heads(k).transpose(-1, -2)) / math.sqrt(d // H)
                                + torch.triu(torch.full((S, S), float("-inf")), 1), -1) @ heads(v)
            return att.transpose(1, 2).reshape(B, S, d) @ wo.T

        for l in range(model.L - 1):
            xn = F.layer_norm(x, (d,)) * model.pre_ln_g[m, l] + model.pre_ln_b[m, l]
            x = x + attn(xn, model.pre_wqkv[m, l], model.pre_wo[m, l])
        h = x + attn(ln(x, "ln1"), model.wqkv[m], model.wo[m])
        u = ln(h, "ln2").reshape(-1, d)
        y = torch.zeros_like(u)
        act = model.active[m]
        for n in range(u.shape[0]):
            logit = model.gate[m] @ u[n]
            logit[~act] = float("-inf")
            p = torch.softmax(logit, -1)
            kk = min(int(model.top_k[m]), int(act.sum()))
            top = torch.topk(p, kk).indices
            w = p[top] / p[top].sum() if kk > 1 else p[top]
            for wi, e in zip(w, top):
                y[n] += wi * F.silu(model.w1[m, e] @ u[n] + model.b1[m, e])
        z = h + y.reshape(B, S, d)
        return ln(z, "ln3") @ model.dec[m].T


def test_stacked_forward_matches_per_model_loop():
    model = StackedMoETransformer(3, 11, 8, 2, 6, 4, num_experts=[1, 3, 4], top_k=[1, 2, 4], seeds=[0, 1, 2])
    tokens = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(0))
    out = model(tokens)
    for m in range(3):
        torch.testing.assert_close(out[m], _single_model_reference(model, m, tokens), atol=1e-5, rtol=1e-5)


def test_deeper_stack_matches_loop_and_keeps_one_layer_init():
    """attn_layers=3: two attention-only blocks before the MoE block, against the loop reference; the L = 1 part of
    the initialisation is the one-layer model's (same seed, same weights)."""
    deep = StackedMoETransformer(2, 11, 8, 2, 6, 4, num_experts=[2, 4], top_k=[1, 2], seeds=[3, 4], attn_layers=3)
    with torch.no_grad():                          # non-trivial LN parameters, so the reference checks their use
        deep.pre_ln_g.mul_(1.5).add_(0.1 * torch.randn_like(deep.pre_ln_g))
        deep.pre_ln_b.add_(0.1 * torch.randn_like(deep.pre_ln_b))
    tokens = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(1))
    out = deep(tokens)
    for m in range(2):
        torch.testing.assert_close(out[m], _single_model_reference(deep, m, tokens), atol=1e-5, rtol=1e-5)
    one = StackedMoETransformer(2, 11, 8, 2, 6, 4, num_experts=[2, 4], top_k=[1, 2], seeds=[3, 4])
    for k in ("emb", "wqkv", "wo", "gate", "w1", "dec"):
        torch.testing.assert_close(getattr(deep, k), getattr(one, k))
    _nll(deep(tokens[:, :-1]), tokens).sum().backward()
    assert deep.pre_wqkv.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="attn_layers=0"):
        StackedMoETransformer(1, 11, 8, 2, 6, 4, num_experts=1, top_k=1, attn_layers=0)


def test_models_are_independent_and_seeded():
    a = StackedMoETransformer(2, 11, 8, 2, 6, 4, num_experts=4, top_k=2, seeds=[7, 8])
    b = StackedMoETransformer(1, 11, 8, 2, 6, 4, num_experts=4, top_k=2, seeds=[8])
    tokens = torch.randint(0, 11, (2, 6))
    torch.testing.assert_close(a(tokens)[1], b(tokens)[0])
    # gradient of model 0's loss does not touch model 1
    _nll(a(tokens[:, :-1]), tokens)[0].sum().backward()
    assert a.w1.grad[1].abs().sum() == 0 and a.w1.grad[0].abs().sum() > 0


def test_free_slots_get_no_gradient():
    model = tiny(M=1, E=4, num=2)
    tokens = torch.randint(0, 11, (3, 6))
    _nll(model(tokens[:, :-1]), tokens).sum().backward()
    assert model.w1.grad[0, 2:].abs().sum() == 0 and model.gate.grad[0, 2:].abs().sum() == 0
    assert torch.isfinite(model.gate.grad).all()


def test_training_lowers_loss_and_eval_shape():
    docs = np.tile(np.arange(7) % 5, (40, 1))       # a deterministic cycle
    model = tiny(M=2, E=2)
    hist = train_stacked(model, docs, steps=40, batch_size=8, lr=1e-2, log_every=39)
    first, last = hist[hist.step == 0].loss.mean(), hist[hist.step == 39].loss.mean()
    assert last < 0.5 * first
    assert eval_per_sequence(model, docs[:5]).shape == (2, 5)


def test_rolling_z_and_pvalue_match_formula():
    rng = np.random.default_rng(0)
    g = rng.random(30)
    z = rolling_z(g, window=5, warmup=3)
    t = 10
    w = g[t - 4: t + 1]
    assert z[t - 2] == pytest.approx((g[t] - w.mean()) / w.std(ddof=1))
    s = z[-5:].sum() / math.sqrt(5)
    assert cpd_pvalue(z[-5:], 5) == pytest.approx(1 - norm.cdf(s))


def test_zero_gradients_are_defined():
    z = rolling_z(np.zeros(20), window=5, warmup=2)
    assert np.all(z == 0)
    assert cpd_pvalue(z[-5:], 5) == pytest.approx(0.5)
    assert weight_grad_cos(torch.ones(3, 3), torch.zeros(3, 3)) == 1.0
    assert weight_grad_cos(torch.zeros(3, 3), torch.ones(3, 3)) == 1.0
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    assert weight_grad_cos(a, b) == pytest.approx(float(F.cosine_similarity(a.reshape(1, -1), b.reshape(1, -1))), abs=1e-6)


def test_project_rows_matches_loop():
    w, g = torch.randn(4, 3), torch.randn(4, 3)
    out = project_rows(g, w)
    for r in range(4):
        torch.testing.assert_close(out[r], (g[r] @ w[r]) / (w[r] @ w[r] + 1e-12) * w[r])
    torch.testing.assert_close(project_rows(g[0], w[0]), out[0])
    with pytest.raises(ValueError, match="shape"):
        project_rows(g, w[:2])


def test_duplicate_copies_and_decomposes_gradients():
    model = tiny(M=2, E=4, num=2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 11, (3, 6))
    _nll(model(tokens[:, :-1]), tokens).sum().backward()
    opt.step()
    _nll(model(tokens[:, :-1]), tokens).sum().backward()
    g_w1, g_gate = model.w1.grad[1, 0].clone(), model.gate.grad[1, 0].clone()
    MassExpander.duplicate(model, opt, 1, src=0, dst=2)
    assert model.active[1].tolist() == [True, True, True, False] and model.active[0].tolist() == [True, True, False, False]
    torch.testing.assert_close(model.w1[1, 2], model.w1[1, 0])
    torch.testing.assert_close(model.gate[1, 2], model.gate[1, 0])
    torch.testing.assert_close(model.w1.grad[1, 2], g_w1)               # new expert: full gradient
    torch.testing.assert_close(model.w1.grad[1, 0], project_rows(g_w1, model.w1[1, 0]))   # source: aligned part
    torch.testing.assert_close(model.gate.grad[1, 0], project_rows(g_gate, model.gate[1, 0]))
    assert opt.state[model.w1]["exp_avg"][1, 2].abs().sum() == 0
    with pytest.raises(ValueError, match="already active"):
        MassExpander.duplicate(model, opt, 1, src=0, dst=2)


class _FakeModel:
    """Minimal stand-in exposing what MassExpander reads: w1 (+grad), active, E."""

    def __init__(self, M, E, active):
        self.M, self.E = M, E
        self.w1 = torch.nn.Parameter(torch.randn(M, E, 4, 4))
        self.b1 = torch.nn.Parameter(torch.zeros(M, E, 4))
        self.gate = torch.nn.Parameter(torch.randn(M, E, 4))
        self.active = torch.arange(E)[None] < torch.tensor(active)[:, None]
        for p in (self.w1, self.b1, self.gate):
            p.grad = torch.zeros_like(p)


def _orthogonal_grad(w, scale):
    g = torch.randn_like(w)
    g = g - (g * w).sum() / (w * w).sum() * w            # exactly orthogonal: |cos| ~ 0 < delta
    return scale * g / g.norm()


def _more_is_better(model, batch, active):
    return -active.sum(1).float()                        # NLL falls with every active expert


def test_expander_fires_on_rising_gradient():
    torch.manual_seed(0)
    cfg = MassConfig(total_steps=400, warmup=3, window=5, max_experts=4, delta=1e-3)
    assert cfg.can_fire
    fm = _FakeModel(1, 4, [1])
    ex = MassExpander(cfg, 1, nll_fn=_more_is_better)
    for step in range(40):
        with torch.no_grad():
            fm.w1.grad[0, 0] = _orthogonal_grad(fm.w1[0, 0], 1.0 + 0.5 * step)
        ex.after_backward(step, fm, None)
        if ex.added[0]:
            break
    # first test at max(warm-up, window) - 1 = 4 (3 z-scores stored, S = sum z / sqrt(5)); p < 0.01 first at 6
    assert step == 6 and [e["kind"] for e in ex.events] == ["fire", "expand"]
    assert int(fm.active[0].sum()) == 2 and ex.pairs[0] == [(0, 1)]
    assert ex.count[0, 0] == 0                                # source's warm-up restarts


def test_semantic_test_blocks_aligned_gradients():
    cfg = MassConfig(total_steps=400, warmup=3, window=5, max_experts=4, delta=1e-3)
    fm = _FakeModel(1, 4, [1])
    ex = MassExpander(cfg, 1, nll_fn=_more_is_better)
    for step in range(30):
        with torch.no_grad():
            fm.w1.grad[0, 0] = (1.0 + step) * fm.w1[0, 0]    # |cos| = 1: no semantic drift
        ex.after_backward(step, fm, None)
    assert {e["kind"] for e in ex.events} == {"fire"} and int(fm.active[0].sum()) == 1


def test_expander_stops_at_max_pool():
    torch.manual_seed(0)
    cfg = MassConfig(total_steps=1000, warmup=2, window=5, max_experts=3, delta=1e-3)
    fm = _FakeModel(1, 3, [2])
    ex = MassExpander(cfg, 1, nll_fn=_more_is_better)
    for step in range(60):
        with torch.no_grad():
            for e in range(3):
                fm.w1.grad[0, e] = _orthogonal_grad(fm.w1[0, e], 1.0 + step ** 2) if fm.active[0, e] else 0.0
        ex.after_backward(step, fm, None)
        if ex.stopped[0]:
            break
    assert ex.stopped[0] and ex.stop_reason[0] == "max_pool"
    assert int(fm.active[0].sum()) == 3
    n_before = len(ex.events)
    ex.after_backward(step + 1, fm, None)                 # stopped: nothing more happens
    assert len(ex.events) == n_before


def test_window_longer_than_run_never_fires():
    cfg = MassConfig(total_steps=100, warmup=5, window=50, max_experts=4)
    assert not cfg.can_fire
    fm = _FakeModel(1, 4, [1])
    ex = MassExpander(cfg, 1)
    for step in range(100):
        with torch.no_grad():
            fm.w1.grad[0, 0] = _orthogonal_grad(fm.w1[0, 0], 1.0 + step)
        ex.after_backward(step, fm, None)
    assert not ex.events and int(fm.active[0].sum()) == 1


def test_expert_with_no_tokens_never_fires():
    cfg = MassConfig(total_steps=1000, warmup=2, window=3, max_experts=4)
    fm = _FakeModel(1, 4, [2])
    ex = MassExpander(cfg, 1)
    for step in range(50):                                # all gradients zero (no tokens routed)
        ex.after_backward(step, fm, None)
    zs = np.array([r[4] for r in ex.trace], float)
    assert not ex.events and np.all(np.nan_to_num(zs) == 0)


def _no_gain(model, batch, active):
    return torch.zeros(model.M)                          # masking any expert leaves the loss unchanged (gap = 0)


def test_nll_stopping_removes_then_expands_and_stops_after_patience():
    # public rule: the NLL test runs once more than one expert was added; a failed test (gap <= 0) removes the
    # last-added expert and still expands (pool does not shrink) while patience lasts; the next failure stops
    fm = _FakeModel(1, 4, [1])
    fm._last_losses, fm._last_batch = torch.zeros(1), None
    ex = MassExpander(MassConfig(total_steps=1000, warmup=2, window=3, patience=2, max_experts=4), 1, nll_fn=_no_gain)
    for i in range(2):                                   # two expansions without a test (expansion_count <= 1)
        ex._act(i, fm, None, 0, (0, 1e-4, 0.0))
    assert fm.active[0].tolist() == [True, True, True, False] and ex.added[0] == [1, 2]
    for i in range(2, 4):                                # two failed tests: remove slot 2, expand into it again
        ex._act(i, fm, None, 0, (0, 1e-4, 0.0))
        assert fm.active[0].tolist() == [True, True, True, False] and not ex.stopped[0]
    assert ex.patience[0] == 0 and [e["kind"] for e in ex.events][2:] == ["remove", "expand"] * 2
    ex._act(4, fm, None, 0, (0, 1e-4, 0.0))              # patience spent: the failed expert leaves, expansion stops
    assert ex.stopped[0] and ex.stop_reason[0] == "patience"
    assert fm.active[0].tolist() == [True, True, False, False] and ex.pairs[0] == [(0, 1)]


def test_redundancy_loss_formula():
    model = tiny(M=2, E=4)
    ex = MassExpander(MassConfig(total_steps=100, warmup=2, window=3, max_experts=4), 2)
    ex.pairs[1] = [(0, 2), (1, 3)]
    gate = model.gate.detach()
    ref = sum(float(F.cosine_similarity(gate[1, i], gate[1, j], dim=0)) ** 2 for i, j in [(0, 2), (1, 3)])
    assert float(ex.redundancy_loss(0, model).detach()) == pytest.approx(0.01 * ref, rel=1e-5)
    assert float(ex.redundancy_loss(50, model)) == 0.0       # only during expansion (first 10%)


def test_frontier_and_elbow():
    import pandas as pd
    df = pd.DataFrame(dict(num_experts=[1, 1, 2, 2, 3], test_loss=[3.0, 2.5, 2.0, 2.2, 1.9], top_k=[1, 2, 1, 2, 1]))
    fr = frontier(df)
    assert fr.test_loss.tolist() == [2.5, 2.0, 1.9] and fr.top_k.tolist() == [2, 1, 1]
    # the elbow rule moved to moelab.stats (tests in tests/claims/test_stats.py); the old name still imports
    x = np.arange(1, 17)
    y = np.where(x <= 6, 10 - 1.5 * x, 1.0 - 0.01 * (x - 6))   # piecewise linear: knee at 6
    assert elbow_max_chord(x, y) == 6


def test_routing_jsd_matches_scipy():
    rng = np.random.default_rng(0)
    w = rng.dirichlet(np.ones(5), size=200)
    groups = rng.integers(0, 4, 200)
    out = routing_jsd(w, groups, 5)                      # group 4 is empty: skipped
    assert len(out) == 6
    P = [w[groups == a].mean(0) for a in range(4)]
    ref = [jensenshannon(P[i], P[j], base=2) ** 2 for i in range(4) for j in range(i + 1, 4)]
    np.testing.assert_allclose(out, ref, atol=1e-10)
    assert np.all((out >= 0) & (out <= 1))


def test_bad_model_and_config_input():
    with pytest.raises(ValueError, match="num_experts"):
        tiny(M=1, E=4, num=5)
    with pytest.raises(ValueError, match="exactly one"):
        StackedMoETransformer(1, 11, 8, 2, 6, 4, num_experts=2)
    with pytest.raises(ValueError, match="window"):
        MassConfig(total_steps=10, warmup=1, window=1)
    with pytest.raises(ValueError, match="top_k"):
        topk_weights(torch.rand(1, 2, 3), torch.tensor([0]))


def test_settings_are_the_public_windows_and_delta():
    from moelab.mass import mass_settings, slots_delta
    for T in (60, 600, 1000, 1500, 3000, 10000):
        assert mass_settings(T) == (max(30, int(0.05 * T)), max(60, int(0.09 * T)))
    public = MassConfig.public(1000)
    assert (public.warmup, public.window, public.first_test, public.expand_until) == (50, 90, 89, 100)
    assert public.can_fire                                      # first test at 0.09T, inside the first 0.1T
    assert not MassConfig.public(400).can_fire                   # window 60 > 0.1 * 400
    # public GLUE scripts: --max_expert_num 16 --expert_repeat 16, each expert the whole bert-large FFN (W1 4096x1024)
    from moelab.mass.method import PUBLIC_W1_SHAPE
    assert PUBLIC_W1_SHAPE == (4096, 1024)
    assert slots_delta(64) == pytest.approx(0.032)               # 0.001 * sqrt(4096*1024 / 64^2)
    assert slots_delta(32) == pytest.approx(0.064)
    assert slots_delta(1024) == pytest.approx(0.001 * math.sqrt(4194304 / 1024 ** 2))
    assert slots_delta(0, numel=2 * 16 * 64) == pytest.approx(0.001 * math.sqrt(4194304 / 2048))
    with pytest.raises(ValueError):
        mass_settings(0)
    with pytest.raises(ValueError, match="init_experts"):
        MassConfig(total_steps=10, warmup=2, window=3, max_experts=4, init_experts=5)


def test_glue_loader_reads_official_tsv_layout(tmp_path):
    from moelab.assets import MissingAsset
    from moelab.mass import bert_large_path, load_glue_task
    (tmp_path / "RTE").mkdir()
    (tmp_path / "RTE" / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\tA man runs.\tA person moves."
                                                "\tentailment\n1\tIt rains.\tIt is dry.\tnot_entailment\n")
    (tmp_path / "CoLA").mkdir()
    (tmp_path / "CoLA" / "dev.tsv").write_text("gj04\t1\t\tThe dog barked.\ngj04\t0\t*\tDog the barked.\n")
    (tmp_path / "MRPC").mkdir()
    (tmp_path / "MRPC" / "train.tsv").write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tHi there.\tHello there.\n")
    (tmp_path / "MNLI").mkdir()
    (tmp_path / "MNLI" / "dev_matched.tsv").write_text("index\tsentence1\tsentence2\tgold_label\n0\tA\tB\tneutral\n")
    rte = load_glue_task(tmp_path, "rte")
    assert rte.label.tolist() == ["entailment", "not_entailment"] and rte.text_b[0] == "A person moves."
    cola = load_glue_task(tmp_path, "cola", "dev")
    assert cola.text_a.tolist() == ["The dog barked.", "Dog the barked."] and cola.label.tolist() == ["1", "0"]
    assert load_glue_task(tmp_path, "mrpc").label.tolist() == ["1"]
    assert load_glue_task(tmp_path, "mnli", "dev").label.tolist() == ["neutral"]
    with pytest.raises(MissingAsset, match="QNLI"):
        load_glue_task(tmp_path, "qnli")
    with pytest.raises(ValueError, match="task"):
        load_glue_task(tmp_path, "sst9")
    with pytest.raises(MissingAsset, match="bert-large"):
        bert_large_path(None)
    (tmp_path / "bert" ).mkdir()
    (tmp_path / "bert" / "config.json").write_text("{}")
    from moelab.inputs import InputFormatError                # issue 51: a folder without model_type "bert" is refused
    with pytest.raises(InputFormatError, match="model_type"):
        bert_large_path(tmp_path / "bert")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_stacked_forward_matches_cpu():
    """The stacked synthetic model (two attention layers, top-p routing) on CUDA equals its CPU forward."""
    model = StackedMoETransformer(2, 11, 8, 2, 6, 4, num_experts=[2, 4], top_p=0.5, seeds=[0, 1], attn_layers=2)
    tokens = torch.randint(0, 11, (3, 6), generator=torch.Generator().manual_seed(0))
    ref = model(tokens)
    got = model.cuda()(tokens.cuda()).cpu()
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
