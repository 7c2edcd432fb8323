"""Tests for the phase (b) / (c) plumbing of notebook 02_sba (SBA paper §V-B): the plateau
rule against a naive loop, phase (b) stopping by it and returning its checkpoint, phase (c) from one checkpoint per
aggregation, and the swap-without-fine-tuning arm. On a tiny random BERT in nomic's MoE layout."""
from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pytest
import torch

from moelab.sba.experiment import PHASE_B_FILE, finetune_checkpoint, measure_embedder, phase_c_run, plateau_reached, swap_aggregation, swap_run, train_until_plateau
from moelab.sba.method import get_aggregation, set_aggregation
from moelab.sba.report import phase_b_table
from moelab.sba.standin import build_nomic_layout_moe, kept_weight_mass
from moelab.core.layer import moe_layers

from helpers.sba import TEXTS, pairs

warnings.filterwarnings("ignore", message=".*rank-deficient.*")


def _naive_plateau(losses, window, tol):
    """The rule as stated: best of all but the last `window` vs best of the last `window`, relative improvement."""
    n = len(losses)
    if n <= window:
        return False, float("nan")
    before = min(losses[: n - window])
    recent = min(losses[n - window:])
    imp = (before - recent) / abs(before)
    return imp < tol, imp


def test_plateau_rule_matches_naive_loop():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n, window, tol = int(rng.integers(1, 12)), int(rng.integers(1, 5)), float(rng.uniform(0, 0.2))
        losses = list(2 + np.cumsum(rng.normal(-0.05, 0.05, n)))
        got = plateau_reached(losses, window, tol)
        ref = _naive_plateau(losses, window, tol)
        assert got[0] == ref[0]
        assert (math.isnan(got[1]) and math.isnan(ref[1])) or got[1] == pytest.approx(ref[1])


def test_plateau_rule_cases_and_errors():
    assert plateau_reached([3.0, 2.0, 1.5], window=2)[0] is False  # 25% better in the window
    assert plateau_reached([3.0, 2.0, 2.0, 2.0], window=2) == (True, 0.0)  # flat over 2 evaluations
    assert plateau_reached([3.0, 2.0], window=2) == (False, pytest.approx(float("nan"), nan_ok=True))
    for bad in (dict(window=0), dict(min_rel_improvement=1.5)):
        with pytest.raises(ValueError, match=list(bad)[0]):
            plateau_reached([1.0, 1.0], **bad)
    with pytest.raises(ValueError, match="non-finite"):
        plateau_reached([1.0, float("nan")])


@pytest.fixture(scope="module")
def template(tiny):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_nomic_layout_moe(tiny, init="cluster", calib_texts=TEXTS, seed=0, compensate=True)


@pytest.fixture(scope="module")
def phase_b(template):
    model = copy.deepcopy(template)
    set_aggregation(model, "sba")  # phase (b) switches to linear itself
    return train_until_plateau(model, pairs(24), pairs(8), max_steps=40, eval_every=2, window=1,
                                   min_rel_improvement=0.99, batch_size=4, lr=1e-3, seed=0, val_batches=2,
                                   device="cpu")


def test_phase_b_stops_by_the_rule_and_returns_its_checkpoint(phase_b, template):
    r = phase_b
    # min_rel_improvement=0.99 with window 1: the rule fires at the 2nd evaluation (step 4), never reaching max_steps
    assert r["stopped"] and r["steps"] == 4 and r["checkpoint_step"] == 4
    assert list(r["val"].step) == [2, 4] and list(r["history"].step) == [1, 2, 3, 4]
    assert r["improvement"] < 0.99
    assert get_aggregation(r["model"]) == "linear"
    assert set(r["checkpoint"]) == set(template.state_dict())
    moved = [k for k, v in r["checkpoint"].items() if not torch.equal(v, template.state_dict()[k])]
    assert any("experts" in k for k in moved) and any("router" in k for k in moved)
    assert all(torch.equal(v, r["model"].state_dict()[k].cpu()) for k, v in r["checkpoint"].items())
    assert "0.99" in r["rule"] and "1 evaluations" in r["rule"]
    t = phase_b_table(r)
    assert t.steps.iloc[0] == 4 and bool(t.stopped.iloc[0])


def test_phase_b_keep_best_and_errors(template):
    r = train_until_plateau(copy.deepcopy(template), pairs(24), pairs(8), max_steps=6, eval_every=2, window=1,
                                min_rel_improvement=0.0, batch_size=4, lr=1e-3, seed=1, val_batches=2, keep="best",
                                device="cpu")
    best = r["val"].loc[r["val"].val_mnrl.idxmin(), "step"]
    assert r["checkpoint_step"] == best
    if not r["stopped"]:
        assert r["steps"] == 6
    with pytest.raises(ValueError, match="never fire"):
        train_until_plateau(copy.deepcopy(template), pairs(24), pairs(8), max_steps=3, eval_every=2, window=1)
    with pytest.raises(ValueError, match="keep="):
        train_until_plateau(template, pairs(24), pairs(8), max_steps=30, eval_every=2, keep="first")


def test_swap_arm_keeps_routing_and_weights(phase_b, template):
    ck = phase_b["checkpoint"]
    lin = swap_aggregation(template, ck, "linear")
    sb = swap_aggregation(template, ck, "sba")
    assert get_aggregation(lin) == "linear" and get_aggregation(sb) == "sba"
    assert get_aggregation(template) == "linear" and not torch.equal(
        template.state_dict()[next(k for k in ck if "experts.w_in" in k)], ck[next(k for k in ck if "experts.w_in" in k)])
    for m in (lin, sb):
        assert all(torch.equal(v, ck[k]) for k, v in m.state_dict().items())
    e_lin, e_sba = lin.encode(TEXTS[:6], convert_to_tensor=True), sb.encode(TEXTS[:6], convert_to_tensor=True)
    assert (e_lin - e_sba).abs().max() > 1e-6  # the experts differ, so the operators differ
    idx = []
    for m in (lin, sb):
        m.encode(TEXTS[:6])
        idx.append([l.last_route.indices.clone() for l in moe_layers(m)][0])
    assert torch.equal(idx[0], idx[1])  # routing untouched in the first MoE layer (same inputs)
    out = swap_run(template, ck, aggregation="sba_unit", val_pairs=pairs(8), subjects={"a": TEXTS[:3],
                                                                                          "b": TEXTS[3:6]})
    assert np.isfinite(out["val_mnrl"]) and {"radius_ratio_linear", "ratio_sba"} <= set(out["geo"].columns)
    with pytest.raises(ValueError, match="aggregation='avg'"):
        swap_aggregation(template, ck, "avg")
    with pytest.raises(ValueError, match="does not match the template"):
        swap_aggregation(template, {"bogus": torch.zeros(1)}, "sba")


def test_phase_c_fixed_steps_seeded_from_one_checkpoint(phase_b, template):
    ck = phase_b["checkpoint"]
    kw = dict(steps=3, train_pairs=pairs(24), val_pairs=pairs(8), batch_size=4, lr=1e-3, eval_every=1,
              val_batches=2, device="cpu")
    a = finetune_checkpoint(template, ck, aggregation="sba", seed=0, **kw)
    b = finetune_checkpoint(template, ck, aggregation="sba", seed=0, **kw)
    c = finetune_checkpoint(template, ck, aggregation="linear", seed=0, **kw)
    assert len(a.history) == 3 and get_aggregation(a.model) == "sba"
    np.testing.assert_allclose(a.history.loss, b.history.loss, rtol=1e-6)  # same seed -> same run
    assert not np.allclose(a.history.loss, c.history.loss)  # another operator, same start and data
    assert list(a.eval_history.step) == [1, 2, 3]
    run = phase_c_run(template, ck, aggregation="sba_normfree", seed=1, subjects={"a": TEXTS[:3]}, **kw)
    assert {"history", "val", "flattened", "eval", "geo", "counts", "similarity", "wall_s"} <= set(run)
    assert run["eval"] is None and len(run["similarity"]) == 2


def test_run_from_config_phases_b_then_c(template, tmp_path, monkeypatch):
    """The launch target on the tiny model (MiniLM and the suite's pairs swapped for the tiny ones)."""
    from moelab.sba import experiment

    data = dict(train=pairs(24), validation=pairs(8))
    monkeypatch.setattr(experiment.suite_embed, "pairs", lambda profile: data)
    monkeypatch.setattr(experiment, "build_nomic_layout_minilm", lambda **kw: copy.deepcopy(template))
    b = experiment.run_from_config(dict(phase="b", out_dir=str(tmp_path), max_steps=8, eval_every=2, window=1,
                                        min_rel_improvement=0.99, batch_size=4, lr=1e-3, val_batches=2,
                                        device="cpu"))
    assert b["stopped"] and b["steps"] == 4 and (tmp_path / PHASE_B_FILE).is_file()
    c = experiment.run_from_config(dict(phase="c", out_dir=str(tmp_path), aggregation="sba", steps=2,
                                        batch_size=4, lr=1e-3, eval_every=1, val_batches=2, device="cpu"))
    assert c["aggregation"] == "sba" and len(c["val"]) == 2 and c["phase_b"]["steps"] == 4 and c["eval"] is None
    with pytest.raises(ValueError, match="unknown phase-c config keys"):
        experiment.run_from_config(dict(phase="c", out_dir=str(tmp_path), stepz=2))
    with pytest.raises(ValueError, match="run phase 'b'"):
        experiment.run_from_config(dict(phase="c", out_dir=str(tmp_path / "empty")))
    with pytest.raises(ValueError, match="'phase'"):
        experiment.run_from_config(dict(out_dir=str(tmp_path)))


@pytest.mark.cuda
def test_phases_on_cuda(tiny_standin):
    """The CUDA path: phase (b) and (c) train on the GPU; the checkpoint comes back on the CPU. The tiny BERT has a
    stand-in tokenizer (conftest ``tiny_standin``): this checks device behaviour and needs no asset cache."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        template = build_nomic_layout_moe(tiny_standin, init="cluster", calib_texts=TEXTS, seed=0, compensate=True)
    r = train_until_plateau(copy.deepcopy(template), pairs(24), pairs(8), max_steps=8, eval_every=2, window=1,
                                min_rel_improvement=0.99, batch_size=4, lr=1e-3, seed=0, val_batches=2,
                                device="cuda")
    assert r["stopped"] and next(r["model"].parameters()).is_cuda
    assert all(v.device.type == "cpu" for v in r["checkpoint"].values())
    res = finetune_checkpoint(template, r["checkpoint"], aggregation="sba", seed=0, steps=2,
                                  train_pairs=pairs(24), val_pairs=pairs(8), batch_size=4, lr=1e-3, eval_every=1,
                                  val_batches=2, device="cuda")
    assert next(res.model.parameters()).is_cuda and np.isfinite(res.eval_history.val_mnrl).all()
    out = measure_embedder(res.model, subjects={"a": TEXTS[:4]}, max_tokens=50)
    assert np.isfinite(out["geo"].radius_ratio_sba).all()
    assert kept_weight_mass(res.model, moe_layers(res.model)[0], TEXTS[:4]) > 0.25 - 1e-6
