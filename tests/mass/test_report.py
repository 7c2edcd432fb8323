"""Phase B of notebook 04: the learning-rate schedule, the validation split, the seed-level frontier and
its spread, the pool trace, the reachable pool of the public schedule (against MassPool itself), the JSD table,
the entity-switch readings and the reference levels -- each against a naive reference."""
import math

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")

from moelab import mass as ms
from moelab.mass.method import MassConfig, MassPool

from helpers.mass import SlotView


def test_lr_factor_matches_formula():
    steps, warm = 20, 4
    for s in range(steps):
        want = (s + 1) / warm if s < warm else 1.0
        assert ms.lr_factor(s, steps, warm, "none") == pytest.approx(want)
        if s >= warm:
            want = 0.5 * (1 + math.cos(math.pi * (s + 1 - warm) / (steps - warm)))
        assert ms.lr_factor(s, steps, warm, "cosine") == pytest.approx(want)
    assert ms.lr_factor(steps - 1, steps, warm, "cosine") == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="lr_decay"):
        ms.SynthSetup(lr_decay="linear")


def test_validation_split_is_a_different_draw():
    kw = dict(d_model=8, n_heads=2, batch_size=4, steps=3, n_test=16, data_format="incontext", n_examples=2,
              example_len=3)
    _, tr, te = ms.SynthSetup(**kw).data()
    _, tr2, va = ms.SynthSetup(**kw, eval_split="validation").data()
    assert np.array_equal(tr["tokens"], tr2["tokens"]) and not np.array_equal(te["tokens"], va["tokens"])
    with pytest.raises(ValueError, match="eval_split"):
        ms.SynthSetup(eval_split="train")
    # held-out scoring is always on the targets y, whatever the training loss
    s = ms.SynthSetup(**kw, loss_on="all")
    assert s.arrays(tr)[1] is None and np.array_equal(s.arrays(te, held_out=True)[1], te["target_mask"])


def _grid():
    rng = np.random.default_rng(0)
    rows = []
    for E in range(1, 9):
        for k in (1, 2):
            for s in range(3):
                rows.append(dict(num_experts=E, top_k=k, seed=s,
                                 test_loss=3 - 0.3 * min(E, 4) - 0.05 * k * (E > 1) + 0.01 * rng.standard_normal()))
    return pd.DataFrame(rows)


def test_frontier_bands_and_spread_match_loops():
    grid = _grid()
    fb = ms.frontier_bands(grid)
    sds = []
    for E in range(1, 9):
        means = {k: grid[(grid.num_experts == E) & (grid.top_k == k)].test_loss.mean() for k in (1, 2)}
        k = min(means, key=means.get)
        row = fb[fb.num_experts == E].iloc[0]
        vals = grid[(grid.num_experts == E) & (grid.top_k == k)].test_loss.to_numpy()
        assert row.top_k == k and row["mean"] == pytest.approx(vals.mean()) and row.sd == pytest.approx(vals.std(ddof=1))
        sds.append(vals.std(ddof=1))
    sp = ms.frontier_spread(grid)
    assert sp["spread"] == pytest.approx(fb["mean"].max() - fb["mean"].min())
    assert sp["seed_sd"] == pytest.approx(np.sqrt(np.mean(np.square(sds))))
    assert sp["ratio"] == pytest.approx(sp["spread"] / sp["seed_sd"]) and sp["best_E"] >= 4
    with pytest.raises(ValueError, match="empty"):
        ms.frontier_bands(grid.iloc[:0])


def test_pool_trace_matches_loop():
    ev = pd.DataFrame(dict(step=[3, 3, 5, 7, 9], model=[0, 1, 0, 0, 0], kind=["expand", "expand", "remove", "expand",
                                                                             "fire"]))
    got = ms.pool_trace(ev, 2, 12, model=0)
    want = [2 + sum(1 for r in ev.itertuples() if r.model == 0 and r.step < t and r.kind == "expand")
            - sum(1 for r in ev.itertuples() if r.model == 0 and r.step < t and r.kind == "remove") for t in range(12)]
    assert got.tolist() == want
    with pytest.raises(ValueError, match="init"):
        ms.pool_trace(ev, 0, 12)


class _AlwaysFires(SlotView):
    """A pool view whose every expert's gradient norm grows each step (so every testable expert has p ~ 0), whose
    gradients are orthogonal to the weights (cos 0) and whose last-added expert always lowers the NLL."""

    def __init__(self, init, slots, rate):
        super().__init__(slots, init)
        self.t, self.rate = 0, rate

    def grad_norms(self):
        self.t += 1
        return np.full(len(self.act), math.exp(self.rate * self.t))

    def cos(self, e):
        return 0.0

    def nll_full(self):
        return 1.0

    def nll_masked(self, e):
        return 2.0

    def duplicate(self, src, dst):
        self.act[dst] = True

    def deactivate(self, e):
        self.act[e] = False


@pytest.mark.parametrize("init,T,warmup,window", [(2, 1000, None, None), (4, 3000, None, None), (8, 3000, None, None),
                                                  (2, 200, 3, 6), (3, 400, 5, 12)])
def test_max_reachable_pool_equals_mass_pool_when_every_test_fires(init, T, warmup, window):
    cfg = MassConfig.public(T, max_experts=16, init_experts=init, delta=0.01) if warmup is None else \
        MassConfig(total_steps=T, warmup=warmup, window=window, max_experts=16, init_experts=init, delta=0.01)
    # fast growth: the newest norm is the window's maximum, z -> (W-1)/sqrt(W), so even a short z list gives p < 0.01
    pool, view = MassPool(cfg), _AlwaysFires(init, cfg.max_experts, rate=0.5 if warmup is None else 3.0)
    for step in range(cfg.expand_until):
        pool.after_backward(step, view)
    want = view.n_active()
    assert ms.max_reachable_pool(init, cfg.max_experts, cfg.warmup, cfg.window, cfg.expand_until) == want
    if warmup is None:
        assert want == min(16, 2 * init)          # public windows: each expert can split once before 0.1T
    else:
        assert want > 2 * init or want == 16


def test_jsd_table_matches_jsd_points():
    rng = np.random.default_rng(0)
    states = rng.integers(0, 100, (16, 6))
    def dist(n):
        w = rng.random((n, 16 * 5, 4))
        return w / w.sum(-1, keepdims=True)
    mres = dict(probs=dist(2), routing=dist(2))
    naive = dict(probs={0: dist(1)[0], 3: dist(1)[0]}, routing={0: dist(1)[0], 3: dist(1)[0]})
    t = ms.jsd_table(mres, naive, states, 10, 10, n_chunks=4)
    assert set(t.routing) == {"gate softmax", "post-top-p/top-k weights"}
    one = t[(t.routing == "gate softmax") & (t.method == "naive") & (t.run == 3)].reset_index(drop=True)
    ref = ms.jsd_points(naive["probs"][3], states, 10, 10, n_chunks=4)
    pd.testing.assert_frame_equal(one[ref.columns], ref)
    assert len(t) == 2 * (2 + 2) * 4
    with pytest.raises(ValueError, match="keep_routing"):
        ms.jsd_table(mres, dict(probs={}, routing={}), states, 10, 10)


def test_switch_readings_match_top_switch_share():
    t = ms.switch_readings(n_docs=32, length=32).set_index("entity_switch")
    for rule in ms.ENTITY_SWITCH:
        g = ms.build_ginc(ms.GINCConfig(entity_switch=rule))
        assert t.loc[rule, "expected_top_share"] == pytest.approx(ms.top_switch_share(g))
    assert t.loc["uniform", "expected_top_share"] == pytest.approx(1 / 9)
    assert t.loc["ginc", "measured_top_share"] > t.loc["uniform", "measured_top_share"]


def test_reference_levels_match_direct_calls():
    s = ms.SynthSetup(steps=20, batch_size=8, n_test=32, data_format="incontext", n_examples=2, example_len=3,
                      entity_switch="uniform")
    t = ms.reference_levels(s)
    g, tr, te = s.data()
    assert t.target_nll[0] == pytest.approx(ms.incontext_bayes(g, te)["target_nll"].mean())
    row = t[(t.fit_on == "all") & (t.name == "trigram")].iloc[0]
    ng = ms.ngram_baselines(tr, te, g.cfg.n_symbols, orders=(3,), k=row.k, fit_on="all")
    assert row.target_nll == pytest.approx(ng.target_nll[0])
    with pytest.raises(ValueError, match="incontext"):
        ms.reference_levels(ms.SynthSetup())


def test_expansion_trace_plot_has_four_rows_per_run():
    trace = pd.DataFrame([(s, m, e, 1.0 + 0.1 * s, 0.5, 0.5 if s < 8 else 0.001) for m in range(2) for s in range(12)
                          for e in range(2)], columns=["step", "model", "expert", "grad_norm", "z", "p"])
    events = pd.DataFrame([dict(step=8, model=0, kind="fire", expert=0, new=-1, p=0.001, cos=0.001),
                           dict(step=8, model=0, kind="expand", expert=0, new=2, p=0.001, cos=0.001),
                           dict(step=9, model=1, kind="fire", expert=1, new=-1, p=0.001, cos=0.5),
                           dict(step=10, model=0, kind="remove", expert=2, new=-1, p=0.001, cos=0.001)])
    runs = pd.DataFrame(dict(seed=[0, 1], init_experts=[2, 2]))
    fig = ms.plot_expansion_trace(trace, events, runs, 0.01, 0.016, 12)
    assert len(fig.axes) == 8
    ms.plot_fig3(pd.DataFrame(dict(entity_jsd=[0.1, 0.2], property_jsd=[0.1, 0.3], method=["MASS", "naive"],
                                   routing=["gate softmax"] * 2)))
