"""MASS's expansion rule (moelab.mass.method.MassPool) against a naive re-statement of the public code's loop
(psmiz/MASS ``moe_layer_mass.py`` + ``search_glue_no_trainer_mass.py``, as read for docs/reference-facts.md;
notebook 04): small synthetic gradient-norm sequences, cosines and loss gaps drive both."""
import math

import numpy as np
import pytest
from scipy.stats import norm

from moelab.mass import MassConfig, MassPool, mass_settings

from helpers.mass import SlotView


class PublicRule:
    """The public loop, restated plainly: K contiguous experts 0..K-1; per expert a norm count, a norm window and a
    z window (both at most ``window`` long); a test needs count >= warmup and a full norm window."""

    def __init__(self, warmup, window, p_limit, sim, patience, max_k, init_k, expand_until):
        self.w0, self.W, self.p_limit, self.sim, self.max_k, self.until = warmup, window, p_limit, sim, max_k, expand_until
        self.K, self.patience, self.count_exp, self.stop, self.masked_last = init_k, patience, 0, False, False
        self.cnt, self.gw, self.zw = [0] * init_k, [[] for _ in range(init_k)], [[] for _ in range(init_k)]
        self.events = []

    def step(self, t, norms, cos, gap):
        if self.stop or t >= self.until:
            return
        for i in range(self.K):                                   # gradient hook: every expert's norm
            g = float(norms[i])
            self.cnt[i] += 1
            self.gw[i] = (self.gw[i] + [g])[-self.W:]
            if self.cnt[i] < self.w0:
                continue
            sd = float(np.std(self.gw[i], ddof=1)) if len(self.gw[i]) > 1 else 0.0
            z = 0.0 if sd == 0 else (g - float(np.mean(self.gw[i]))) / sd
            self.zw[i] = (self.zw[i] + [z])[-self.W:]
        info = None
        for i in range(self.K):                                   # _check_expansion_conditions
            if self.cnt[i] < self.w0 or len(self.gw[i]) < self.W:
                continue
            p = 1 - norm.cdf(sum(self.zw[i]) / math.sqrt(self.W))
            if p < self.p_limit:
                self.events.append(("fire", t, i))
                if abs(cos[i]) < self.sim:
                    info = i
                    break
        if info is None:
            return
        expansion = True
        if self.count_exp > 1:                                    # loss test on the last expert
            last = self.K - 1
            if gap(t, last) <= 0:
                if self.patience:
                    self.patience -= 1
                    self.K -= 1
                    self.count_exp -= 1
                    self.cnt.pop(), self.gw.pop(), self.zw.pop()
                    self.events.append(("remove", t, last))
                    if info == last:     # public code: IndexError resetting the removed source; no expansion here
                        return
                else:
                    self.stop, self.masked_last, expansion = True, True, False
                    self.events.append(("remove", t, last))
                    self.events.append(("stop_patience", t, -1))
        if expansion:
            dst = self.K
            self.K += 1
            self.count_exp += 1
            self.cnt[info] = 0
            self.cnt.append(0), self.gw.append([]), self.zw.append([])
            self.events.append(("expand", t, info))
            if self.K >= self.max_k:
                self.stop = True
                self.events.append(("stop_max_pool", t, -1))
            assert dst == self.K - 1

    def routed(self):
        return self.K - int(self.masked_last)


class View(SlotView):
    """A pool of E slots driven by tables: norms[t, e], cos[t, e], gap(t, e)."""

    def __init__(self, E, init_k, norms, cos, gap):
        super().__init__(E, init_k)
        self.norms, self.cos_t, self.gap, self.t = norms, cos, gap, 0

    def grad_norms(self):
        return self.norms[self.t]

    def cos(self, e):
        return float(self.cos_t[self.t, e])

    def nll_full(self):
        return 0.0

    def nll_masked(self, e):
        return self.gap(self.t, e)

    def duplicate(self, src, dst):
        assert not self.act[dst]
        self.act[dst] = True

    def deactivate(self, e):
        self.act[e] = False


def _run_both(seed, steps=240, E=6, init_k=2, warmup=3, window=6, patience=2, p_gap_pos=0.3):
    rng = np.random.default_rng(seed)
    norms = rng.gamma(4.0, 0.25, size=(steps, E))
    for e in range(E):                                            # occasional upward shifts of the norm level
        for t0 in rng.choice(steps, size=4, replace=False):
            norms[t0:t0 + 8, e] += rng.uniform(1.0, 4.0) * np.arange(1, 9)[: steps - t0]
    cos = np.where(rng.random((steps, E)) < 0.7, 1e-4, 0.5)       # most firings pass the semantic test
    gap_tab = np.where(rng.random(steps) < p_gap_pos, 0.1, rng.choice([0.0, -0.1], size=steps))
    gap = lambda t, e: float(gap_tab[t])
    cfg = MassConfig(total_steps=steps * 10, warmup=warmup, window=window, patience=patience, max_experts=E,
                     delta=1e-3, expand_frac=0.1, init_experts=init_k)
    pool, view = MassPool(cfg), View(E, init_k, norms, cos, gap)
    ref = PublicRule(warmup, window, 0.01, 1e-3, patience, E, init_k, cfg.expand_until)
    sizes, ref_sizes = [], []
    for t in range(steps):
        view.t = t
        pool.after_backward(t, view)
        ref.step(t, norms[t], cos[t], gap)
        sizes.append(view.n_active())
        ref_sizes.append(ref.routed())
    ours = [(e["kind"], e["step"], e["expert"]) for e in pool.events]
    return ours, ref.events, sizes, ref_sizes, pool


@pytest.mark.parametrize("seed", range(8))
def test_pool_matches_public_loop_on_random_sequences(seed):
    ours, ref, sizes, ref_sizes, _ = _run_both(seed)
    assert ours == ref
    assert sizes == ref_sizes


def test_random_sequences_exercise_every_branch():
    kinds = set()
    for seed in range(8):
        ours, *_ = _run_both(seed)
        kinds |= {k for k, _, _ in ours}
    assert {"fire", "expand", "remove"} <= kinds and kinds & {"stop_patience", "stop_max_pool"}


def _drive(gaps, patience, n_fires):
    """A pool whose expert 0 is the candidate at every step (forced p-values); returns (events, sizes)."""
    cfg = MassConfig(total_steps=10_000, warmup=1, window=2, patience=patience, max_experts=16, init_experts=2)
    pool = MassPool(cfg)
    view = View(16, 2, np.zeros((n_fires, 16)), np.full((n_fires, 16), 0.0), lambda t, e: gaps[t])
    sizes = []
    for t in range(n_fires):
        view.t = t
        if pool.stopped:
            break
        pool.act(t, view, (0, 1e-5, 0.0))
        sizes.append(view.n_active())
    return [e["kind"] for e in pool.events], sizes, pool


def test_loss_test_only_after_more_than_one_expansion():
    kinds, sizes, _ = _drive([-1.0] * 3, patience=3, n_fires=3)
    # fires 1 and 2 expand untested (expansion_count 0, 1); fire 3 tests and, with gap <= 0, removes then expands
    assert kinds == ["expand", "expand", "remove", "expand"] and sizes == [3, 4, 4]


def test_removal_is_followed_by_expansion_and_patience_counts_removals():
    kinds, sizes, pool = _drive([-1.0] * 10, patience=3, n_fires=10)
    # 2 untested expansions, then exactly `patience` = 3 remove+expand pairs, then the 4th failure stops
    assert kinds == ["expand", "expand"] + ["remove", "expand"] * 3 + ["remove", "stop_patience"]
    assert sizes == [3, 4, 4, 4, 4, 3] and pool.stop_reason == "patience"
    kinds0, _, _ = _drive([-1.0] * 10, patience=0, n_fires=10)
    assert kinds0 == ["expand", "expand", "remove", "stop_patience"]


def test_positive_gap_keeps_the_last_expert():
    kinds, sizes, pool = _drive([0.5] * 4, patience=1, n_fires=4)
    assert kinds == ["expand"] * 4 and sizes == [3, 4, 5, 6] and pool.patience == 1


def test_first_test_of_public_windows_is_at_009T():
    T = 1000
    warmup, window = mass_settings(T)
    cfg = MassConfig.public(T, max_experts=4, init_experts=1, delta=1e-3)
    steps = cfg.expand_until
    norms = np.zeros((steps, 4))
    norms[:, 0] = 1.0 + np.arange(steps) ** 1.5                   # a steadily rising norm
    view = View(4, 1, norms, np.full((steps, 4), 1e-5), lambda t, e: 1.0)
    pool = MassPool(cfg)
    ref = PublicRule(warmup, window, 0.01, 1e-3, 3, 4, 1, cfg.expand_until)
    for t in range(steps):
        view.t = t
        pool.after_backward(t, view)
        ref.step(t, norms[t], np.full(4, 1e-5), lambda t, e: 1.0)
    tested = [s for s, m, e, g, z, p in pool.trace if e == 0 and not np.isnan(p)]
    assert tested[0] == cfg.first_test == int(0.09 * T) - 1 < cfg.expand_until
    assert [(e["kind"], e["step"], e["expert"]) for e in pool.events] == ref.events
    assert pool.events[0]["step"] == 89 and pool.events[0]["kind"] == "fire"
