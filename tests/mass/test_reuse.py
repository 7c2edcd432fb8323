"""Issue 49: notebook 04's top-k sweep at E experts holds models the naive grid already trained (the grid's top-k at
the same E and seeds); ``run_naive_groups(trained=)`` takes them from the grid instead of training them again. Checked
against the straightforward path (nothing recorded: every sweep model trained in one stack): equal bit for bit, and
the recorded models are not retrained."""
import numpy as np
import pandas as pd

from moelab.mass import SynthSetup, naive_frontier, run_naive, topk_sweep


def _setup():
    return SynthSetup(d_model=8, n_heads=2, batch_size=4, steps=6, n_test=8, max_experts=4, data_format="incontext",
                      n_examples=2, example_len=3, loss_on="all", device="cpu")


def test_topk_sweep_reuses_the_grids_models_bit_for_bit():
    s, calls, trained = _setup(), [], {}

    def cache(kind, key, compute):
        calls.append((kind, key["configs"], key["keep_routing"]))
        return compute()

    grid = naive_frontier(s, (1, 2), (2,), (0, 1), cache=cache, trained=trained)
    assert calls == [("mass_naive_group", [(1, 1, 0), (1, 1, 1)], True), ("mass_naive_group", [(2, 2, 0), (2, 2, 1)], True)]
    calls.clear()
    got = topk_sweep(s, 2, (1, 2), (0, 1, 2), cache=cache, trained=trained)
    assert calls == [("mass_naive_group", [(2, 1, 0), (2, 1, 1), (2, 1, 2), (2, 2, 2)], True)]   # (2, 2, 0..1): grid's
    configs = [(2, 1, 0), (2, 1, 1), (2, 1, 2), (2, 2, 0), (2, 2, 1), (2, 2, 2)]
    ref = run_naive(s, configs, keep_routing=True)                # straightforward: the whole sweep in one stack
    plain = topk_sweep(s, 2, (1, 2), (0, 1, 2), cache=None, trained=None)
    for other in (ref, plain):
        pd.testing.assert_frame_equal(got["table"], other["table"], check_exact=True)
        np.testing.assert_array_equal(got["item_losses"], other["item_losses"])
        for i in range(len(configs)):
            np.testing.assert_array_equal(got["routing"][i], other["routing"][i])
            np.testing.assert_array_equal(got["probs"][i], other["probs"][i])
        pd.testing.assert_frame_equal(got["history"].reset_index(drop=True), other["history"].reset_index(drop=True),
                                      check_exact=True)
    g = grid["table"].set_index(["num_experts", "top_k", "seed"]).test_loss
    t = got["table"].set_index(["num_experts", "top_k", "seed"]).test_loss
    assert g.loc[(2, 2, 0)] == t.loc[(2, 2, 0)] and g.loc[(2, 2, 1)] == t.loc[(2, 2, 1)]
    assert len(set(t.round(12))) == len(t)                         # the sweep's models differ from each other


def test_without_a_record_every_config_is_trained():
    s, calls = _setup(), []

    def cache(kind, key, compute):
        calls.append(key["configs"])
        return compute()

    naive_frontier(s, (2,), (2,), (0,), cache=cache, trained=None)
    topk_sweep(s, 2, (2,), (0,), cache=cache, trained=None)
    assert calls == [[(2, 2, 0)], [(2, 2, 0)]]
