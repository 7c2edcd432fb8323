"""Notebook 03 (poster 002) cost cuts (issue 49): a text cell runs the held-out forward pass once where the analyses
and the entropy trajectory look at the same model (initialisation and the last step). Checked against the
straightforward path, which runs a fresh pass for every analysis, on a tiny sentence encoder: every number equal."""
import warnings

import numpy as np
import pandas as pd
import pytest

from moelab import cluster_upcycling as cu


def _tiny_text_data(st):
    words = "cat dog river music bank money tree house car road rain sun".split()
    g = np.random.default_rng(0)
    pairs = [(s, s + " " + words[i % 12]) for i, s in enumerate(" ".join(g.choice(words, 6)) for _ in range(48))]
    texts = [t for ab in pairs[:32] for t in ab]
    calib = cu.data.calibration_inputs(st, texts, max_tokens=400, max_len=16)
    special = cu.data.calibration_special_mask(st, texts, max_tokens=400, max_len=16)
    return pairs, calib, special


def _run(st, method, pairs, calib, special):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cu.experiment.run_text_condition(st, method, 0, pairs[:32], pairs[32:], [a for a, _ in pairs[32:]],
                                                calib, steps=3, batch_size=8, max_len=16, num_experts=4,
                                                special_mask=special)


def _assert_same(a, b, path="res"):
    assert type(a) is type(b), path
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            if k != "wall_s":
                _assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b, check_exact=True, obj=path)
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), path
    else:
        assert a == b or (a != a and b != b), path


@pytest.mark.parametrize("method", ["sparse", "cluster_eesd", "dense"])
def test_text_cell_shares_heldout_passes_and_equals_fresh_passes(tiny_st, monkeypatch, method):
    pairs, calib, special = _tiny_text_data(tiny_st)
    calls = []
    real_inputs = cu.analysis.heldout_layer_inputs

    def counted(*a, **k):
        calls.append(1)
        return real_inputs(*a, **k)

    monkeypatch.setattr(cu.analysis, "heldout_layer_inputs", counted)
    monkeypatch.setattr(cu.experiment, "heldout_layer_inputs", counted)
    cut = _run(tiny_st, method, pairs, calib, special)
    n_cut = len(calls)

    # the straightforward path: every analysis runs its own held-out pass (layer_inputs ignored)
    real_analyses = cu.analysis.moe_analyses
    monkeypatch.setattr(cu.experiment, "moe_analyses",
                        lambda model, batches, layer_inputs=None, **k: real_analyses(model, batches, **k))
    calls.clear()
    fresh = _run(tiny_st, method, pairs, calib, special)
    _assert_same(cut, fresh)
    if method == "dense":
        assert cut["analysis"] == {} and cut["entropy_heldout"] == []
    else:   # trajectory steps 0..3: the init pass serves step 0, the step-3 pass the final analyses
        assert sorted({r["step"] for r in cut["entropy_heldout"]}) == [0, 1, 2, 3]
        assert n_cut == 4 and len(calls) == 6
        assert cut["analysis"]["routing_entropy"] == [r["routing_entropy"] for r in cut["entropy_heldout"]
                                                      if r["step"] == 3]


def test_heldout_entropy_record_checks_the_step():
    traj = cu.analysis.HeldoutEntropy([{"x": None}], steps=[0, 5], keep=[5])
    with pytest.raises(ValueError, match="not one of the trajectory's steps"):
        traj.record(3, [])
