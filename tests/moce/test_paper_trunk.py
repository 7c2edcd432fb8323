"""Notebook 01's paper profile adapts every block (n_top="all"): nothing is frozen below the adapters, so the trunk
cache must hold nothing (issue 51: it stored the embedding output of every sequence, ~170 GB for 20,000 Llama-2-7b
sequences); the examples keep their token ids and the embeddings are looked up per batch, exactly what block 0
receives (checked against the stored states and the full model's forward pass, Llama and Gemma-3 layouts)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from moelab import moce
from moelab.moce.trunk import lower_hidden_states

from .test_method import TINY_LMS, CharTok

ITEMS = [{"instruction": "add 2 and 3", "answer": "5"}, {"instruction": "hi", "answer": "hello there"},
         {"instruction": "a much longer instruction text", "answer": "ok"}]


@pytest.mark.parametrize("family", sorted(TINY_LMS))
def test_every_block_adapted_stores_no_trunk_states_and_equals_the_full_model(family):
    model = TINY_LMS[family](layers=4)
    ex = moce.build_cache(model, CharTok(), ITEMS, groups=[0, 1, 1], start=0, max_len=64,
                          cache_config={"model": f"tiny-{family}", "test": "no trunk at start 0"})
    assert all(e["h"] is None for e in ex)  # nothing stored, on disk or in memory
    stored = lower_hidden_states(model, [e["input_ids"] for e in ex], 0)
    for e, h in zip(ex, stored):
        assert torch.equal(moce.data.example_inputs(e), h)
    batch = moce.data.collate(ex)
    assert batch["h"].shape == (3, max(len(e["input_ids"]) for e in ex), 32)
    moce.install(model, moce.variant_spec("moce", 2, 2, rank=4), [0, 1, 2, 3])
    for m in moce.moce_layers(model):
        torch.nn.init.normal_(m.experts.w_up, std=0.2)
    got = moce.per_item_nll(moce.TopStack(model, 0), ex, batch_size=3)
    for i, e in enumerate(ex):
        with moce.group_context(model, [e["group"]]):
            logits = model(e["input_ids"][None]).logits[0, :-1]
        lab = e["labels"][1:]
        ref = F.cross_entropy(logits[lab != -100], lab[lab != -100]).item()
        assert got[i] == pytest.approx(ref, rel=1e-4, abs=1e-5)


def test_adapters_are_installed_on_the_models_device():
    # the paper backbone sits on the GPU (moelab.device); adapters made on the CPU beside it broke scoring after
    # training with a device mismatch. "meta" stands for a device other than the CPU on a CPU-only machine.
    model = TINY_LMS["llama"](layers=2).to("meta")
    moce.install(model, moce.variant_spec("moce_gen", 2, 2, rank=4), [0, 1])
    assert {p.device.type for m in moce.moce_layers(model) for p in m.parameters()} == {"meta"}


# ---------------------------------------------------------------------------------------- the in-run scorecard
def _scores(task, vanilla_right, arms=None):
    from moelab.suite import lmeval

    ids = [d["id"] for d in lmeval.task_docs(task[len("moelab_"):])][:60]
    rows = [dict(variant="vanilla", seed=-1, task=task, item_id=i, metric="acc", score=float(vanilla_right))
            for i in ids]
    for (variant, seed), acc in (arms or {}).items():
        rows += [dict(variant=variant, seed=seed, task=task, item_id=i, metric="acc", score=float(j < acc * len(ids)))
                 for j, i in enumerate(ids)]
    return pd.DataFrame(rows)


def test_in_run_scorecard_applies_the_usability_rule_to_the_untrained_model():
    tasks, note = moce.lm_tasks_for("/models/llama", 20, in_run=True)
    assert tasks and all(t.startswith("moelab_bb_") or t == "moelab_math_mc" for t in tasks) and "scorecard" in note
    assert moce.lm_tasks_for("/models/llama", 2, in_run=True)[0] == tasks[:2]
    t = "moelab_bb_causal_judgment"
    right = moce.in_run_scorecard(_scores(t, True), [t], "user-model").set_index("task").loc[t]
    wrong = moce.in_run_scorecard(_scores(t, False), [t], "user-model").set_index("task").loc[t]
    assert bool(right["usable"]) and right["acc"] == 1.0 and right["n"] == 60
    assert not bool(wrong["usable"]) and "does not beat" in wrong["reason"]
    with pytest.raises(ValueError, match="untrained-model accuracy"):
        moce.in_run_scorecard(_scores(t, True), ["moelab_bb_navigate"], "user-model")


def _tables(tmp_path, scores, card):
    from moelab.claims.engine import Tables

    tmp_path.mkdir()
    scores.to_csv(tmp_path / "table1_per-item-scores.csv", index=False)
    if card is not None:
        card.to_csv(tmp_path / "table1_scorecard.csv", index=False)
    (tmp_path / "provenance.json").write_text(json.dumps({"notebook": "01_moce", "profile": "paper"}))
    return Tables(tmp_path)


def test_accuracy_claim_reads_only_the_tasks_the_run_found_usable(tmp_path):
    from moelab.claims import OutsideRegime, Seeds
    from moelab.moce import claims

    good, bad = "moelab_bb_causal_judgment", "moelab_bb_navigate"
    arms = {("moce", 0): 0.9, ("moce", 1): 0.8, ("moce", 2): 0.7, ("pesc", 0): 0.5, ("pesc", 1): 0.6, ("pesc", 2): 0.5}
    scores = pd.concat([_scores(good, True, arms), _scores(bad, False, {k: 0.0 for k in arms})])
    card = moce.in_run_scorecard(scores, [good, bad], "user-model")
    ev = claims.accuracy_pair(_tables(tmp_path / "a", scores, card), "moce", "pesc")
    assert isinstance(ev, Seeds)   # naive: per-seed mean accuracy on the usable task only, in points
    s = scores[scores.task == good]
    for arm, got in (("moce", ev.a), ("pesc", ev.b)):
        want = s[s.variant == arm].groupby("seed")["score"].mean() * 100
        assert np.allclose(got.sort_index().to_numpy(), want.sort_index().to_numpy())
    none = moce.in_run_scorecard(_scores(bad, False, arms), [bad], "user-model")
    ev = claims.accuracy_pair(_tables(tmp_path / "b", _scores(bad, False, arms), none), "moce", "pesc")
    assert isinstance(ev, OutsideRegime) and "none of its 1" in ev.check and bad in ev.check


def test_paper_elbow_claim_reads_the_encoder_the_run_clustered_with(tmp_path):
    # the paper profile's encoder is named by its ENCODER_PATH folder: the E5 elbow row found no "e5" curve there
    from moelab.claims import Precomputed
    from moelab.claims.engine import Tables
    from moelab.moce import claims

    enc = "/models/e5-large-v2"
    sse = [100.0, 60.0, 35.0, 20.0, 18.0, 17.0, 16.5]
    pd.DataFrame({"encoder": enc, "k": range(1, 8), "sse": sse}).to_csv(tmp_path / "appB_elbow-sse.csv", index=False)
    pd.DataFrame({"encoder": [enc], "domain": ["maths"], "cluster": [0], "count": [5], "used_by_moce": [True]}).to_csv(
        tmp_path / "appC_domain-cluster-counts.csv", index=False)
    (tmp_path / "provenance.json").write_text(json.dumps({"notebook": "01_moce", "profile": "paper"}))
    ev = claims.elbow_e5(Tables(tmp_path))
    want = moce.clustering.find_knee(np.arange(1, 8), np.array(sse), method="chord")["k"]
    assert isinstance(ev, Precomputed) and ev.ours == want


def test_profile_table_says_the_paper_seeds_and_their_cost():
    from moelab.moce import config as mc

    c = mc.config_for("paper")
    n, hours = mc.training_gpu_hours(c)
    assert n == 3 * 4   # 3 seeds x (dense, pesc, moce, moce_gen)
    # naive: 6 FLOPs per parameter and token, 625 steps of 32 x 512 tokens, 12 runs, 40 % of 989 TFLOP/s
    assert hours == pytest.approx(6 * 6.74e9 * 32 * 512 * 625 * 12 / (0.4 * 989e12) / 3600)
    cell = mc.profile_table("paper").set_index("setting").loc["seeds", "paper (this run)"]
    assert cell.startswith("3 (") and f"{n} trainings, ~{hours:.1f} H100-hours" in cell
    assert mc.profile_table("paper").set_index("setting").loc["seeds", "default"] == "3"
