"""Phase B of notebook 01 (MoCE): early stopping on validation that restores the best checkpoint (against a naive loop
over the validation curve), rounds that continue one AdamW optimiser, the A/A arm of ``plan_runs``, domain-specialised
validation, per-model score caching, the seed-means table and the dependence table (against naive references), and
the A/A / accuracy claims on synthetic tables."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from moelab import moce
from moelab import train as mtrain
from moelab.claims import Tables, evaluate
from moelab.moce import claims as nb01_moce
from moelab.suite import lmeval

torch.set_num_threads(1)


def tiny_llama(vocab=64, layers=3, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


class CharTok:
    eos_token_id = 1

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [2 + (ord(c) % 60) for c in text]}


ITEMS = [{"instruction": f"repeat {w}", "answer": w * 3, "domain": d}
         for w, d in zip(["ab", "cd", "ef", "gh", "ij", "kl"] * 2, ["maths", "code", "reasoning"] * 4)]


def cached_examples(model, groups=None):
    groups = np.zeros(len(ITEMS), int) if groups is None else groups
    return moce.build_cache(model, CharTok(), ITEMS, groups, start=2, max_len=48)


# ---------------------------------------------------------------------------------------------------- early stopping
def naive_early_stop(losses, patience):
    """Reference: walk the curve; the best is the first strict minimum so far; stop at the first evaluation after
    which `patience` evaluations in a row brought no new minimum. Returns (best index, stop index or None)."""
    best, best_i, since = math.inf, -1, 0
    for i, x in enumerate(losses):
        if x < best:
            best, best_i, since = x, i, 0
        else:
            since += 1
        if patience is not None and since >= patience:
            return best_i, i
    return best_i, None


class _Param(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(2))


@pytest.mark.parametrize("patience", [1, 2, 3, None])
@pytest.mark.parametrize("seed", range(6))
def test_early_stopping_matches_a_naive_walk_of_the_curve(patience, seed):
    rng = np.random.default_rng(seed)
    losses = list(np.round(2.0 - 0.1 * np.arange(12) + rng.normal(0, 0.25, 12), 2))   # falling, noisy, with ties
    m = _Param()
    es = moce.experiment.EarlyStopping(patience)
    stop_at = None
    for i, x in enumerate(losses):
        with torch.no_grad():
            m.w.fill_(float(i))                       # the model's state at evaluation i
        es.observe(10 * (i + 1), x, m)
        if es.exhausted:
            stop_at = i
            break
    best_i, ref_stop = naive_early_stop(losses, patience)
    assert stop_at == ref_stop
    assert es.best_step == 10 * (best_i + 1) and es.best_loss == losses[best_i]
    with torch.no_grad():
        m.w.fill_(-1.0)
    es.restore(m)
    assert m.w.tolist() == [float(best_i)] * 2      # the best checkpoint, not the last one


def test_early_stopping_bad_input():
    with pytest.raises(ValueError, match="patience"):
        moce.experiment.EarlyStopping(0)
    with pytest.raises(ValueError, match="diverged"):
        moce.experiment.EarlyStopping(2).observe(1, float("nan"), _Param())
    with pytest.raises(ValueError, match="nothing to restore"):
        moce.experiment.EarlyStopping(2).restore(_Param())


def _curve_and_states(monkeypatch, curve):
    """Make the validation loss follow ``curve`` and record the adapters' weights at each evaluation."""
    it, states = iter(curve), []

    def fake(stack, val_ex):
        states.append({k: v.detach().cpu().clone() for k, v in stack.model.named_parameters() if v.requires_grad})
        return np.array([next(it)])

    monkeypatch.setattr(moce.experiment, "per_item_nll", fake)
    return states


def test_train_variant_stops_on_patience_and_restores_the_best_checkpoint(monkeypatch):
    model = tiny_llama()
    ex = cached_examples(model)
    # rounds of 4 steps, an evaluation every 2: 2 evaluations per round; the minimum at evaluation 3 (step 6)
    curve = [2.0, 1.8, 1.5, 1.52, 1.55, 1.51, 1.6, 1.7, 1.9, 2.0]
    states = _curve_and_states(monkeypatch, curve)
    res = moce.experiment.train_variant(model, moce.variant_spec("pesc", 1, 2, rank=4), ex, ex[:3], layers=[2], steps=4,
                             batch_size=4, lr=1e-2, eval_every=2, max_rounds=5, patience=3)
    ev = res.eval_history.val_loss.tolist()
    best_i, stop_i = naive_early_stop(ev, 3)
    assert ev == curve[: len(ev)] and stop_i == len(ev) - 1          # stopped at the round after patience ran out
    assert res.stop_reason == "patience" and res.converged and res.restored_best
    assert res.best_step == 6 and res.best_val_loss == 1.5 and res.steps == 4 * (len(ev) // 2)
    # checkpoints are compared on the CPU: on CUDA the model's weights live on the GPU, the saved best state on the CPU
    assert all(torch.equal(res.state[k].cpu(), states[best_i][k]) for k in res.state)
    assert not all(torch.equal(res.state[k].cpu(), states[-1][k]) for k in res.state)
    live = moce.method.trainable_state(model)                                  # the model holds the restored weights too
    assert all(torch.equal(live[k].cpu(), res.state[k].cpu()) for k in res.state)
    crit = moce.criterion_table([res], 1, 32)
    assert crit.stop_reason.tolist() == ["patience"] and crit.best_step.tolist() == [6]
    assert crit.val_loss_best.tolist() == [1.5] and bool(crit.converged.iloc[0])


def test_train_variant_budget_and_no_restore(monkeypatch):
    model = tiny_llama()
    ex = cached_examples(model)
    _curve_and_states(monkeypatch, [3.0 - 0.3 * i for i in range(10)])    # still falling fast: runs out of budget
    res = moce.experiment.train_variant(model, moce.variant_spec("pesc", 1, 2, rank=4), ex, ex[:3], layers=[2], steps=2,
                             batch_size=4, eval_every=1, max_rounds=3, patience=2)
    assert res.stop_reason == "budget" and not res.converged and res.steps == 6 and res.best_step == 6
    assert not res.restored_best and res.trend == "falling"
    with pytest.raises(ValueError, match="max_rounds"):
        moce.experiment.train_variant(model, moce.variant_spec("pesc", 1, 2, rank=4), ex, ex[:3], layers=[2], steps=2,
                           max_rounds=0)


def test_flattened_stops_only_a_curve_of_enough_evaluations(monkeypatch):
    model = tiny_llama()
    ex = cached_examples(model)
    curve = [2.0, 1.5, 1.49, 1.488, 1.487, 1.486, 1.4855, 1.485, 1.4849, 1.4848, 1.4847, 1.4846]
    _curve_and_states(monkeypatch, curve)
    for n in (4, 6):                                  # the rule already reads "flattened" on these short curves
        assert moce.experiment.validation_trend(curve[:n])[0] == "flattened"
    res = moce.experiment.train_variant(model, moce.variant_spec("pesc", 1, 2, rank=4), ex, ex[:3], layers=[2], steps=2,
                             batch_size=4, eval_every=1, max_rounds=6, patience=5)
    assert len(res.eval_history) == moce.experiment.FLAT_MIN_EVALS == 8 and res.steps == 8
    assert res.stop_reason == "flattened" and res.flat and res.best_step == 8


def test_rounds_continue_one_adamw_optimiser(monkeypatch):
    """After r rounds of n steps the optimiser has taken r*n steps with moments carried over (a fresh optimiser per
    round would restart its step count at n): checked on the AdamW state the trainer hands back each round."""
    model = tiny_llama()
    ex = cached_examples(model)
    steps_seen, first_moment = [], []
    real = mtrain.train

    def spy(*a, **kw):
        res = real(*a, **kw)
        st = res.optimizer.state_dict()["state"]
        steps_seen.append(sorted({float(v["step"]) for v in st.values()}))
        first_moment.append({k: v["exp_avg"].clone() for k, v in st.items()})
        return res

    monkeypatch.setattr(moce.experiment.mtrain, "train", spy)
    _curve_and_states(monkeypatch, [3.0 - 0.3 * i for i in range(12)])
    moce.experiment.train_variant(model, moce.variant_spec("pesc", 1, 2, rank=4), ex, ex[:3], layers=[2], steps=3,
                       batch_size=4, eval_every=3, max_rounds=3)
    assert steps_seen == [[3.0], [6.0], [9.0]]
    # m_t = beta1 * m_{t-1} + (1 - beta1) g: a carried moment is not the one-step moment (1 - beta1) g of a restart
    assert all(v.abs().sum() > 0 for v in first_moment[1].values())


# ---------------------------------------------------------------------------------------------------- runs and data
def test_plan_runs_a_a_arm_has_seeds_of_its_own():
    cfg = {"seeds": [0, 1, 2], "variants": ["pesc", "moce"], "experts_per_group": 4,
           "extra": [dict(label="pesc_aa", variant="pesc", seed_offset=3)]}
    runs = moce.plan_runs(cfg, 3)
    aa = [r for r in runs if r["label"] == "pesc_aa"]
    main = [r for r in runs if r["label"] == "pesc"]
    assert sorted(r["seed"] for r in aa) == [3, 4, 5] and sorted(r["seed"] for r in main) == [0, 1, 2]
    assert {(r["variant"], r["M"], r["N"], r["top_k"], r["domain"]) for r in aa} == \
        {(r["variant"], r["M"], r["N"], r["top_k"], r["domain"]) for r in main}      # identically configured
    spec = moce.variant_spec("pesc", 3, 4)
    assert moce.experiment.run_identity(spec, aa[0]) != moce.experiment.run_identity(spec, main[0])        # so trained, not copied
    with pytest.raises(ValueError, match="seeds of its own"):
        moce.plan_runs({**cfg, "extra": [dict(label="pesc_aa", variant="pesc", seed_offset=1)]}, 3)


def test_specialised_runs_and_btx_branches_validate_on_their_own_domain(monkeypatch, tmp_cache):
    model = tiny_llama()
    ex = cached_examples(model)
    seen = []
    real = moce.experiment.train_variant

    def spy(model_, spec, tr, va, **kw):
        seen.append((spec.name, sorted({e["domain"] for e in tr}), sorted({e["domain"] for e in va})))
        return real(model_, spec, tr, va, **kw)

    monkeypatch.setattr(moce.experiment, "train_variant", spy)
    cfg = {"seeds": [0], "variants": ["btx"], "experts_per_group": 1, "rank": 4, "steps": 2, "batch": 4,
           "lr": 1e-3, "eval_every": 1, "max_rounds": 1, "patience": 1,
           "extra": [dict(label="specialised_code", variant="pesc", domain="code")]}
    runs = moce.plan_runs(cfg, 3)
    zeros = (np.zeros(len(ex), int), np.zeros(6, int))
    res = moce.train_runs(model, runs, ex, ex[:6], {3: zeros}, layers=[2], cfg=cfg, cache_config={"model": "tiny"})
    assert ("btx_branch", ["code"], ["code"]) in seen and ("btx_branch", ["maths"], ["maths"]) in seen
    assert ("specialised_code", ["code"], ["code"]) in seen
    assert ("btx", ["code", "maths", "reasoning"], ["code", "maths", "reasoning"]) in seen
    assert {b["n_val"] for b in res[0].branches.values()} == {2} and res[0].branches["code"]["stop_reason"]


def test_evaluate_runs_caches_each_model(monkeypatch, tmp_cache):
    from moelab import assets

    tok = assets.load_smollm2()[1]
    model = tiny_llama(len(tok))
    spec = moce.variant_spec("moce", 2, 2, rank=4)
    moce.install(model, spec, [2])
    res = moce.experiment.VariantResult(spec=spec, seed=0, state=moce.method.trainable_state(model), history=pd.DataFrame(),
                             eval_history=pd.DataFrame({"step": [1], "val_loss": [1.0]}), flat=False,
                             rel_fall=float("nan"), params={}, wall_s=0.0, steps=1)
    moce.method.uninstall(model)
    items = [dict(it, id=f"i{j}") for j, it in enumerate(ITEMS[:4])]
    groups = {2: np.array([0, 1, 1, 0])}
    a = moce.evaluate_runs(model, tok, [None, res], items, groups, [], None, {}, [2], cache_config={"model": "t"})
    calls = []
    real = lmeval.domain_nll
    monkeypatch.setattr(moce.experiment.lmeval, "domain_nll", lambda *x, **k: calls.append(1) or real(*x, **k))
    b = moce.evaluate_runs(model, tok, [None, res], items, groups, [], None, {}, [2], cache_config={"model": "t"})
    pd.testing.assert_frame_equal(a, b)
    assert calls == []                                                   # both models read from the cache
    moved = {2: np.array([1, 1, 1, 0])}                                  # other clusters -> scored again
    moce.evaluate_runs(model, tok, [res], items, moved, [], None, {}, [2], cache_config={"model": "t"})
    assert calls == [1]
    # one run trained under two labels (seq_only = moce_N1) is scored once; its rows carry both names
    twin = moce.experiment.VariantResult(**{**res.__dict__, "spec": moce.method.MoCESpec(**{**res.spec.__dict__, "name": "twin"})})
    calls.clear()
    c = moce.evaluate_runs(model, tok, [res, twin], items, moved, [], None, {}, [2])
    assert calls == [1] and c.variant.tolist() == ["moce"] * 4 + ["twin"] * 4
    np.testing.assert_array_equal(c.score[:4].to_numpy(), c.score[4:].to_numpy())


# ---------------------------------------------------------------------------------------------------- report tables
def test_seed_means_table_matches_a_naive_loop():
    rng = np.random.default_rng(0)
    rows = [dict(variant=v, seed=s, task=f"nll_{d}", item_id=f"{d}{i}", metric="bpb", score=float(rng.normal()))
            for v in ("pesc", "moce") for s in (0, 1, 2) for d in ("code", "maths", "reasoning") for i in range(4)]
    rows += [dict(variant="pesc", seed=0, task="bb_x", item_id="q", metric="acc", score=1.0)]
    df = pd.DataFrame(rows)
    t = moce.seed_means_table(df)
    for (v, s, d), g in t.set_index(["variant", "seed", "domain"]).iterrows():
        sel = [r["score"] for r in rows if r["variant"] == v and r["seed"] == s and r["metric"] == "bpb"
               and (d == "pooled" or r["task"] == f"nll_{d}")]
        assert g["mean"] == pytest.approx(sum(sel) / len(sel)) and g["n_items"] == len(sel)
    assert len(t) == 2 * 3 * 4
    with pytest.raises(ValueError, match="no 'acc' scores"):
        moce.seed_means_table(df[df.metric == "bpb"], metric="acc")


def test_dependence_table_reports_the_test_and_the_concentration():
    counts = pd.DataFrame([[30, 0, 2], [1, 25, 4], [20, 2, 0]], index=["code", "gsm", "math_qa"], columns=[0, 1, 2])
    t = moce.dependence_table(counts, "task x cluster", n_shuffles=300).iloc[0]
    r = moce.report.independence_test(counts.to_numpy(), n_shuffles=300)
    assert t.cramers_v == pytest.approx(nb01_moce.cramers_v(counts.to_numpy()))
    assert t.v_minus_null == pytest.approx(r["ours"]) and t.p_permutation == pytest.approx(r["p"])
    shares = [30 / 32, 25 / 30, 20 / 22]                                  # naive: each row's share in its top column
    assert t.median_top_share == pytest.approx(np.median(shares)) and t.distinct_top_clusters == 2
    assert t.ci_low > 0 and t.p_permutation < 0.01                       # strongly dependent


# ---------------------------------------------------------------------------------------------------- claims
def _folder(tmp_path, tables: dict) -> Tables:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "provenance.json").write_text(json.dumps({"notebook": "01_moce", "profile": "default"}))
    for stem, df in tables.items():
        df.to_csv(tmp_path / f"{stem}.csv", index=False)
    return Tables(tmp_path)


def _scores(offsets: dict, n_items=20, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame([dict(variant=v, seed=s, task="nll_code", item_id=f"i{i}", metric="bpb",
                              score=1.0 + off + 0.01 * rng.normal() + 0.005 * s)
                         for v, (seeds, off) in offsets.items() for s in seeds for i in range(n_items)])


def test_a_a_claim_is_a_welch_equivalence_over_seeds(tmp_path):
    claim = {c.id: c for c in nb01_moce.CLAIMS}["aa_pesc_seed_noise"]
    assert claim.equivalence and claim.expected_sign == 0 and claim.compare == ("pesc_aa", "pesc")
    df = _scores({"pesc": ([0, 1, 2], 0.0), "pesc_aa": ([3, 4, 5], 0.0), "moce": ([0, 1, 2], 0.0)})
    r = evaluate(claim, _folder(tmp_path, {"table1_per-item-scores": df}))
    a = df[df.variant == "pesc_aa"].groupby("seed").score.mean()
    b = df[df.variant == "pesc"].groupby("seed").score.mean()
    assert r["ours"] == pytest.approx(a.mean() - b.mean(), rel=1e-5) and r["n_seeds"] == 3
    assert "Welch" in r["method"] and r["mde"] is not None and r["n_items"] == 20
    assert r["verdict"] == "extension" and "as a test it would read" in r["reason"]   # not a paper claim


def test_a_a_claim_refuses_shared_seeds_and_names_a_missing_arm(tmp_path):
    claim = {c.id: c for c in nb01_moce.CLAIMS}["aa_pesc_seed_noise"]
    r = evaluate(claim, _folder(tmp_path / "a", {"table1_per-item-scores": _scores({"pesc": ([0, 1, 2], 0.0)})}))
    assert r["verdict"] == "extension" and "pesc_aa" in r["reason"]
    shared = _scores({"pesc": ([0, 1, 2], 0.0), "pesc_aa": ([2, 3, 4], 0.0)})
    with pytest.raises(ValueError, match="share seeds"):
        evaluate(claim, _folder(tmp_path / "b", {"table1_per-item-scores": shared}))


def test_accuracy_claim_is_not_testable_without_accuracy_rows(tmp_path):
    claim = {c.id: c for c in nb01_moce.CLAIMS}["moce_vs_pesc_acc"]
    df = _scores({"pesc": ([0, 1, 2], 0.0), "moce": ([0, 1, 2], -0.1)})
    r = evaluate(claim, _folder(tmp_path, {"table1_per-item-scores": df}))
    assert r["verdict"] == "outside the regime" and "scorecard" in r["reason"]
    bpb = evaluate({c.id: c for c in nb01_moce.CLAIMS}["moce_vs_pesc_bpb"], Tables(tmp_path))
    assert bpb["ours"] < 0 and bpb["mde"] is not None   # MoCE lower bpb; undecided without the regime table
    assert bpb["verdict"] == "inconclusive" and "table1_main.csv" in bpb["reason"]


def test_group_context_keeps_a_batch_tensor_on_its_device():
    """The trainer's batch carries ``group_ids`` on the training device (Accelerate moved it to the GPU), and
    ``group_context`` must not copy it through numpy ("can't convert cuda:0 device type tensor to numpy"). A tensor on
    the ``meta`` device stands in for the GPU one here: numpy refuses it the same way."""
    model = tiny_llama()
    (layer,) = moce.install(model, moce.variant_spec("moce", 2, 2, rank=4), [2])
    gid = torch.tensor([1, 0], dtype=torch.int32, device="meta")
    with moce.group_context(model, gid, token_mask=None):
        assert layer.group_ids.device.type == "meta" and layer.group_ids.dtype == torch.long
    assert layer.group_ids is None
    moce.method.set_group_ids(model, gid)
    assert layer.group_ids.device.type == "meta"
    x = torch.randn(2, 3, 32)
    outs = []
    for g in (torch.tensor([1, 0]), [1, 0], np.array([1, 0])):                # a tensor routes like a list or array
        with moce.group_context(model, g):
            outs.append(layer(x))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_moce_training_step_under_bf16_autocast():
    """Under the trainer's bf16 autocast on CUDA the frozen dense FFN hands bf16 hidden states to the fp32
    adapters (this raised "x dtype torch.bfloat16 != expert parameter dtype torch.float32"). CPU autocast stands in for
    CUDA's: the step runs, its loss is the fp32 loss within bf16 rounding, and the adapters get fp32 gradients."""
    model = tiny_llama()
    spec = moce.variant_spec("moce", 2, 2, rank=4)
    (layer,) = moce.install(model, spec, [2])
    with torch.no_grad():
        layer.experts.w_up.normal_(0, 0.3)
    batch = moce.data.collate(cached_examples(model, groups=np.array([0, 1] * 6))[:4])
    stack = moce.TopStack(model, 2)
    ref, _ = moce.experiment.make_loss_fn(spec)(stack, batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = moce.experiment.make_loss_fn(spec)(stack, batch)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=0.05)
    assert layer.experts.w_down.grad.dtype == torch.float32 and layer.experts.w_down.grad.abs().sum() > 0
    assert layer.router.weight.grad.abs().sum() > 0


@pytest.mark.cuda
def test_cuda_early_stopping_carries_the_optimiser_and_restores_the_best(monkeypatch):
    """The trainer's CUDA path: AdamW state carried across rounds on the device, the best checkpoint (kept on the
    CPU) loaded back into the device model."""
    model = tiny_llama()
    ex = cached_examples(model)
    curve = [2.0, 1.8, 1.5, 1.52, 1.55, 1.51, 1.6, 1.7, 1.9, 2.0]
    states = _curve_and_states(monkeypatch, curve)
    res = moce.experiment.train_variant(model, moce.variant_spec("pesc", 1, 2, rank=4), ex, ex[:3], layers=[2], steps=4,
                             batch_size=4, lr=1e-2, eval_every=2, max_rounds=5, patience=3, device="cuda")
    assert res.stop_reason == "patience" and res.best_step == 6 and res.steps == 12
    assert all(torch.equal(res.state[k], states[2][k].cpu()) for k in res.state)
    live = {k: v.detach().cpu() for k, v in model.named_parameters() if v.requires_grad}
    assert all(torch.equal(live[k], res.state[k]) for k in res.state)
