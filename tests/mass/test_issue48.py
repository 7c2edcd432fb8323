"""Issue 48's changes to notebook 04's synthetic model and MASS (against naive references): the expert with a hidden
width (forward, duplication and the orthogonality test over both matrices), the gate's own learning rate, the
vectorised change-point statistic of the calibration table, and active experts per token along training."""
import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from moelab.mass import (MassConfig, MassExpander, MassPool, StackedMoETransformer, SynthSetup, ar1_series,
                         cpd_calibration, cpd_pvalues, lag1_autocorr, run_mass, weight_grad_cos)
from moelab.mass.experiment import train_stacked


def _model(d_ff, E=4, M=2, d=8):
    return StackedMoETransformer(M, 10, d, 2, 6, E, num_experts=E, top_k=2, seeds=[1, 2], d_ff=d_ff)


def test_dff_expert_is_w2_silu_w1_and_none_keeps_the_paper_expert():
    torch.manual_seed(0)
    m0 = StackedMoETransformer(2, 10, 8, 2, 6, 4, num_experts=4, top_k=2, seeds=[1, 2])
    m_none = _model(None)
    for (n, a), (_, b) in zip(m0.named_parameters(), m_none.named_parameters()):
        assert torch.equal(a, b), n                              # d_ff=None: the same model as before
    m = _model(5)
    assert m.w1.shape == (2, 4, 5, 8) and m.w2.shape == (2, 4, 8, 5) and m.b1.shape == (2, 4, 5)
    tok = torch.randint(0, 10, (3, 6))
    m(tok)
    # naive: recompute the MoE output of model 0, token 0, expert by expert
    u = torch.randn(8)
    e = 1
    naive = m.w2[0, e] @ F.silu(m.w1[0, e] @ u + m.b1[0, e])
    got = torch.einsum("mneo->mneo", torch.einsum("mnef,meof->mneo",
                                                  F.silu(torch.einsum("mnd,mefd->mnef", u[None, None].expand(2, 1, 8),
                                                                      m.w1) + m.b1[:, None]), m.w2))[0, 0, e]
    assert torch.allclose(naive, got, atol=1e-6)
    assert m.expert_matrices() == [m.w1, m.w2] and m_none.expert_matrices() == [m_none.w1]
    with pytest.raises(ValueError, match="d_ff"):
        _model(0)


def test_cos_over_both_matrices_is_the_cos_of_the_concatenation():
    rng = np.random.default_rng(0)
    w1, w2, g1, g2 = (torch.tensor(rng.standard_normal(s)) for s in ((5, 8), (8, 5), (5, 8), (8, 5)))
    wv, gv = np.concatenate([w1.ravel(), w2.ravel()]), np.concatenate([g1.ravel(), g2.ravel()])
    assert weight_grad_cos([w1, w2], [g1, g2]) == pytest.approx(wv @ gv / np.linalg.norm(wv) / np.linalg.norm(gv))
    assert weight_grad_cos(w1, g1) == weight_grad_cos([w1], [g1])


def test_duplication_copies_and_projects_both_matrices():
    m = _model(5)
    m.active[:] = torch.tensor([True, True, False, False])
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for p in m.parameters():
        p.grad = torch.randn_like(p)
    g1, g2 = m.w1.grad[1, 0].clone(), m.w2.grad[1, 0].clone()
    MassExpander.duplicate(m, opt, 1, 0, 2)
    for p, g in ((m.w1, g1), (m.w2, g2)):
        assert torch.equal(p[1, 2], p[1, 0]) and torch.equal(p.grad[1, 2], g)      # copy: weights, full gradient
        w = p[1, 0]
        naive = torch.stack([(g[r] @ w[r]) / (w[r] @ w[r] + 1e-12) * w[r] for r in range(len(w))])
        assert torch.allclose(p.grad[1, 0], naive, atol=1e-6)                     # source: row-wise aligned part
    assert bool(m.active[1, 2]) and not bool(m.active[0, 2])


def test_grad_norm_reads_both_matrices():
    m = _model(5)
    cfg = MassConfig(total_steps=100, warmup=2, window=3, max_experts=4, init_experts=4)
    ex = MassExpander(cfg, 2)
    for p in m.parameters():
        p.grad = torch.randn_like(p)
    m._last_batch, m._last_losses = torch.randint(0, 10, (2, 7)), torch.zeros(2)
    ex.after_backward(0, m, None)
    got = [t[3] for t in ex.trace if t[1] == 1 and t[2] == 3][0]
    want = float(torch.sqrt(m.w1.grad[1, 3].pow(2).sum() + m.w2.grad[1, 3].pow(2).sum()))
    assert got == pytest.approx(want, rel=1e-5)


def test_router_lr_mult_scales_only_the_gate_step():
    docs = np.random.default_rng(0).integers(0, 10, (64, 7))
    steps = {}
    for mult in (1.0, 0.1):
        m = _model(None)
        before = {n: p.detach().clone() for n, p in m.named_parameters()}
        train_stacked(m, docs, steps=1, batch_size=8, lr=1e-2, warmup_frac=0.0, router_lr_mult=mult,
                      progress_bar=False, device="cpu")
        steps[mult] = {n: (p.detach() - before[n]).abs().max().item() for n, p in m.named_parameters()}
    # Adam's first step moves every weight with a nonzero gradient by ~lr
    assert steps[1.0]["gate"] == pytest.approx(1e-2, rel=1e-3) and steps[0.1]["gate"] == pytest.approx(1e-3, rel=1e-3)
    assert steps[0.1]["w1"] == pytest.approx(steps[1.0]["w1"], rel=1e-6)
    with pytest.raises(ValueError, match="router_lr_mult"):
        train_stacked(_model(None), docs, steps=1, batch_size=8, lr=1e-2, router_lr_mult=0.0, progress_bar=False)


def test_setup_key_keeps_old_keys_and_expert_numel():
    s = SynthSetup(device="cpu")
    assert "d_ff" not in s.key() and "router_lr_mult" not in s.key()
    t = dataclasses.replace(s, d_ff=16, router_lr_mult=0.1)
    assert t.key()["d_ff"] == 16 and t.key()["router_lr_mult"] == 0.1
    assert s.expert_numel == 32 * 32 and t.expert_numel == 2 * 32 * 16


def test_vectorised_cpd_pvalues_match_the_pool():
    g = ar1_series(3, 40, 0.5, seed=2)
    cfg = MassConfig(total_steps=1000, warmup=4, window=7, max_experts=1, init_experts=1)
    p = cpd_pvalues(g, cfg.warmup, cfg.window)
    for i in range(3):
        pool = MassPool(cfg)
        ref = np.array([pool.observe(t, 0, float(g[i, t])) for t in range(40)])
        assert np.allclose(np.nan_to_num(ref, nan=-1), np.nan_to_num(p[i], nan=-1))
    assert np.isnan(p[:, :6]).all() and np.isfinite(p[:, 6:]).all()


def test_ar1_has_its_autocorrelation_and_the_calibration_counts_firings():
    x = ar1_series(200, 400, 0.6, seed=1)
    r = np.mean([np.corrcoef(s[:-1], s[1:])[0, 1] for s in x])
    assert r == pytest.approx(0.6, abs=0.03)
    cal = cpd_calibration([0.0, 0.9], 100, 10, 20, n_series=50, measured=0.3)
    assert sorted(cal.rho.unique()) == [0.0, 0.3, 0.9] and cal.groupby("rho").size().eq(50).all()
    assert cal[cal.measured].rho.eq(0.3).all() and cal.tests.eq(81).all()
    p = cpd_pvalues(ar1_series(50, 100, 0.9, seed=2), 10, 20)      # rho 0.9 is the third: seed 0 + 2
    assert np.array_equal(cal[cal.rho == 0.9].fires.to_numpy(), (np.nan_to_num(p, nan=1) < 0.01).sum(1))
    # strongly autocorrelated noise fires more often than white noise
    assert cal[cal.rho == 0.9].fire_rate.mean() > cal[cal.rho == 0.0].fire_rate.mean()


def test_lag1_autocorr_per_expert():
    x = ar1_series(2, 200, 0.7, seed=3)
    tr = pd.DataFrame([dict(step=t, model=m, expert=0, grad_norm=x[m, t]) for m in range(2) for t in range(200)])
    r = lag1_autocorr(tr.sample(frac=1, random_state=0))
    assert len(r) == 2 and np.allclose(r.to_numpy(), [np.corrcoef(s[:-1], s[1:])[0, 1] for s in x])
    assert len(lag1_autocorr(tr, until=5)) == 0


def test_run_mass_reports_active_experts_at_init_expansion_end_and_end():
    s = SynthSetup(d_model=8, n_heads=2, steps=20, batch_size=4, n_test=16, max_experts=4, data_format="incontext",
                   n_entities=3, n_properties=3, n_symbols=6, n_examples=2, example_len=4, device="cpu", d_ff=4,
                   router_lr_mult=0.1)
    cfg = MassConfig(total_steps=20, warmup=2, window=3, max_experts=4, init_experts=3, expand_frac=0.5)
    t = run_mass(s, cfg, [0, 1])["table"]
    for c in ("active_init", "active_expansion_end", "mean_active"):
        assert t[c].between(1, 4).all(), c
    assert (t.active_init > 1).all()      # a near-uniform gate over 3 experts keeps 2 at p = 0.5
