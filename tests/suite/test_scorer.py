"""The one log-likelihood scorer: equal to lm-eval's HFLM on every project log-likelihood task type, for
SmolLM2 and a tiny random Gemma-3; MoCE's TopStack through the scorer equals the full model; the thin wrappers in
free_moe / moce / lmeval equal their earlier implementations (naive full-forward loops written here)."""
import math

import lm_eval
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model
from lm_eval.models.huggingface import HFLM

from moelab import assets, free_moe, moce
from helpers.suite import loglikelihood_requests
from moelab.suite import lmeval, scorer

TOL_PER_TOKEN = 1e-4   # nats per continuation token (float32)
# task type -> (task data name, items); options: date 11 tokens, math_mc 2-4, hyperbaton 1
TASK_TYPES = {"multiple_choice_multi_token": ("bb_date_understanding", 2), "multiple_choice_mixed": ("math_mc", 2),
              "multiple_choice_single_token": ("bb_hyperbaton", 3), "answer_likelihood": ("nll_maths", 3)}


@pytest.fixture(scope="module")
def smollm2():
    return assets.load_smollm2()


@pytest.fixture(scope="module")
def tiny_gemma(smollm2):
    """A random 4-block Gemma-3 (sliding window 3 alternating with global attention) on SmolLM2's tokenizer."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tok = smollm2[1]
    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=3,
                           layer_types=["sliding_attention", "full_attention"] * 2, max_position_embeddings=256,
                           pad_token_id=0)
    return Gemma3ForCausalLM(cfg).eval(), tok




def _compare(ref_lm, fast_lm, reqs):
    """Max |Δ log-likelihood| per continuation token; asserts is_greedy identical."""
    a = ref_lm.loglikelihood(reqs, disable_tqdm=True)
    b = fast_lm.loglikelihood(reqs, disable_tqdm=True)
    ntok = [len(fast_lm._encode_pair(*r.args)[1]) for r in reqs]
    assert [g for _, g in a] == [g for _, g in b]
    return max(abs(x - y) / n for (x, _), (y, _), n in zip(a, b, ntok))


@pytest.mark.parametrize("which", ["smollm2", "tiny_gemma"])
def test_equals_hflm_on_every_task_type(which, request):
    model, tok = request.getfixturevalue(which)
    ref = HFLM(pretrained=model, tokenizer=tok, batch_size=4)
    fast = lmeval.FastHFLM(pretrained=model, tokenizer=tok, batch_size=4)
    diffs = {kind: _compare(ref, fast, loglikelihood_requests(task, n)) for kind, (task, n) in TASK_TYPES.items()}
    # rolling bits per byte: documents longer than the tiny Gemma's 256-token window span several windows
    docs = [Instance("loglikelihood_rolling", {}, (d["continuation"] * 3,), 0) for d in lmeval.task_docs("nll_code")[:2]]
    a = ref.loglikelihood_rolling(docs, disable_tqdm=True)
    b = fast.loglikelihood_rolling(docs, disable_tqdm=True)
    diffs["bits_per_byte"] = max(abs(scorer.bits_per_byte(x, d.args[0]) - scorer.bits_per_byte(y, d.args[0]))
                                 for x, y, d in zip(a, b, docs))
    print(f"\n{which}: max |Δ| nats per continuation token (bpb for rolling): {diffs}")
    assert all(v <= TOL_PER_TOKEN for v in diffs.values()), diffs


def test_left_truncation_equals_hflm(smollm2):
    model, tok = smollm2   # date prompts are ~120 tokens: every option's context is cut, differently per option
    ref = HFLM(pretrained=model, tokenizer=tok, batch_size=4, max_length=64)
    fast = lmeval.FastHFLM(pretrained=model, tokenizer=tok, batch_size=4, max_length=64)
    assert _compare(ref, fast, loglikelihood_requests("bb_date_understanding", 1)) <= TOL_PER_TOKEN


def test_shared_context_equals_plain_path_and_greedy_flag(tiny_gemma):
    model, tok = tiny_gemma
    ctx = tok("The quick brown fox jumps over the lazy dog and")["input_ids"]
    conts = [tok(" runs far away")["input_ids"], tok(" sleeps")["input_ids"], tok(" is happy today, yes")["input_ids"]]
    reqs = [(ctx, c) for c in conts]
    shared = scorer.loglikelihood_tokens(model, reqs, batch_size=2)
    plain = scorer.loglikelihood_tokens(model, reqs, batch_size=2, share_context=False)
    np.testing.assert_allclose([x for x, _ in shared], [x for x, _ in plain], atol=1e-4)
    generic = scorer.loglikelihood_tokens(scorer.LogitsModel(lambda ids, attention_mask=None: model(ids).logits), reqs)
    np.testing.assert_allclose([x for x, _ in generic], [x for x, _ in plain], atol=1e-4)
    with torch.no_grad():   # the greedy continuation is greedy; the naive log-likelihood matches
        logits = model(torch.tensor([ctx])).logits[0, -1]
    g = [int(logits.argmax())]
    (lp, greedy), = scorer.loglikelihood_tokens(model, [(ctx, g)])
    assert greedy and lp == pytest.approx(float(F.log_softmax(logits.float(), -1)[g[0]]), abs=1e-5)
    assert not scorer.loglikelihood_tokens(model, [(ctx, [(g[0] + 1) % len(tok)])])[0][1]


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_packed_rows_equal_plain_path(family, monkeypatch):
    """Several multiple-choice items per forward pass (context once, options in the same row under a mask) give the
    plain path's numbers; with sliding-window layers the mask mapping carries the window (tiny Gemma's is 3, far
    shorter than the rows); a decoder that cannot take the mapping falls back to the KV-cache path."""
    model = _tiny(family)
    g = torch.Generator().manual_seed(1)
    reqs = []
    for n_ctx in (9, 4, 13):   # three items, options of 1-5 tokens (some single-token, so rows mix both kinds)
        ctx = torch.randint(2, 64, (n_ctx,), generator=g).tolist()
        reqs += [(ctx, torch.randint(2, 64, (k,), generator=g).tolist()) for k in (3, 1, 5)]
    plain = scorer.loglikelihood_tokens(model, reqs, share_context=False)
    monkeypatch.setattr(scorer, "_run_shared", lambda *a: pytest.fail("the packed path should have served"))
    packed = scorer.loglikelihood_tokens(model, reqs, batch_size=2)
    np.testing.assert_allclose([x for x, _ in packed], [x for x, _ in plain], atol=1e-5)
    assert [g for _, g in packed] == [g for _, g in plain]
    monkeypatch.undo()
    if family == "gemma3":
        sm = scorer.as_scoring_model(model)
        assert sm.sliding_window == 3 and sm.takes_mask_mapping
        sm.takes_mask_mapping = False          # a decoder without the mapping: rows longer than the window fall back
        monkeypatch.setattr(scorer, "_run_packed", lambda sm, items, *a: items and pytest.fail("must not pack"))
        fallback = scorer.loglikelihood_tokens(sm, reqs, batch_size=2)
        np.testing.assert_allclose([x for x, _ in fallback], [x for x, _ in plain], atol=1e-5)


def test_bad_requests(tiny_gemma):
    model, _ = tiny_gemma
    with pytest.raises(ValueError, match="empty continuation"):
        scorer.loglikelihood_tokens(model, [([1, 2], [])])
    with pytest.raises(ValueError, match="empty context"):
        scorer.loglikelihood_tokens(model, [([], [3])])
    with pytest.raises(ValueError, match="batch_size"):
        scorer.loglikelihood_tokens(model, [([1], [3])], batch_size=0)
    with pytest.raises(ValueError, match="exceeds max_length"):
        scorer.loglikelihood_tokens(model, [([1], [3, 4, 5])], max_length=2)
    with pytest.raises(ValueError, match="cannot score"):
        scorer.as_scoring_model(3)


# ------------------------------------------------------------------ MoCE's cached-trunk model
class CharTok:
    eos_token_id = 1

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [2 + (ord(c) % 60) for c in text]}


def _tiny(family):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if family == "llama":
        return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                            num_attention_heads=4, num_key_value_heads=2,
                                            max_position_embeddings=128)).eval()
    return Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                              num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                              sliding_window=3, layer_types=["sliding_attention", "full_attention"] * 2,
                                              max_position_embeddings=128, pad_token_id=0)).eval()


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_top_stack_through_scorer_equals_full_model(family):
    model = _tiny(family)
    items = [{"instruction": "add 2 and 3", "answer": "5"}, {"instruction": "hi", "answer": "hello there"},
             {"instruction": "a much longer instruction text", "answer": "ok"}]
    moce.install(model, moce.variant_spec("moce", 2, 2, rank=4), [2, 3])
    for m in moce.moce_layers(model):
        torch.nn.init.normal_(m.experts.w_up, std=0.2)
    groups = [0, 1, 1]
    ex = moce.build_cache(model, CharTok(), items, groups=groups, start=2, max_len=64)
    stack = moce.TopStack(model, 2)
    got = moce.per_item_nll(stack, ex, batch_size=3)
    for i, e in enumerate(ex):   # old per_item_nll / naive reference: the full model, one sequence at a time
        with torch.no_grad(), moce.group_context(model, [e["group"]]):
            logits = model(e["input_ids"][None]).logits[0, :-1]
        lab = e["labels"][1:]
        assert got[i] == pytest.approx(F.cross_entropy(logits[lab != -100], lab[lab != -100]).item(), abs=1e-5)
    # TopStack requests == full-model token requests through the scorer (sum and greedy flag)
    c = [int((e["labels"] != -100).nonzero()[0]) for e in ex]
    emb = scorer.loglikelihood_embeddings(stack, [(e["h"], e["labels"][k:].tolist()) for e, k in zip(ex, c)],
                                          batch_context=lambda rows, m: moce.group_context(model, [groups[r] for r in rows]))
    for i, (e, k) in enumerate(zip(ex, c)):
        with moce.group_context(model, [groups[i]]):
            (lp, gr), = scorer.loglikelihood_tokens(model, [(e["input_ids"][:k].tolist(), e["input_ids"][k:].tolist())])
        assert emb[i][0] == pytest.approx(lp, abs=1e-4) and emb[i][1] == gr
    moce.uninstall(model)


# ------------------------------------------------------------------ thin wrappers == their earlier implementations
def _naive_sum(model, ctx_ids, cont_ids):
    with torch.no_grad():
        lp = F.log_softmax(model(torch.tensor([ctx_ids + cont_ids])).logits[0].float(), -1)
    return sum(lp[len(ctx_ids) + t - 1, cont_ids[t]].item() for t in range(len(cont_ids)))


def test_free_moe_and_domain_nll_wrappers_equal_old_loops(smollm2):
    model, tok = smollm2
    enc = lambda s, sp=False: tok(s, add_special_tokens=sp)["input_ids"]
    mc = [dict(prompt=d["prompt"][-160:], choices=[" " + c for c in d["choices"]], label=d["gold"])
          for d in lmeval.task_docs("math_mc")[:2]]
    free = [dict(prompt=d["context"][-120:], answer=d["continuation"][:80]) for d in lmeval.task_docs("nll_maths")[:3]]
    lp, n = free_moe.scoring.continuation_logprobs(model, tok, [f["prompt"] for f in free], [f["answer"] for f in free], 2)
    old = [_naive_sum(model, enc(f["prompt"]), enc(f["answer"])) for f in free]
    assert np.max(np.abs(lp - old) / n) <= TOL_PER_TOKEN
    np.testing.assert_allclose(free_moe.scoring.answer_logprob(model, tok, free, 2), np.array(old) / n, atol=TOL_PER_TOKEN)
    old_acc = [float(np.argmax([_naive_sum(model, enc(it["prompt"]), enc(c)) for c in it["choices"]]) == it["label"])
               for it in mc]
    assert free_moe.scoring.choice_accuracy(model, tok, mc).tolist() == old_acc
    got = free_moe.scoring.choice_logprobs(model, tok, mc[0]["prompt"], mc[0]["choices"])
    ref = [_naive_sum(model, enc(mc[0]["prompt"]), enc(c)) for c in mc[0]["choices"]]
    np.testing.assert_allclose(got, ref, atol=1e-3)
    # lmeval.domain_nll: context with special tokens, answer with a leading space, tokenised apart
    pairs = [(f["prompt"], f["answer"].strip()) for f in free]
    df = lmeval.domain_nll(model, tok, pairs, batch_size=2)
    for (ctx, ans), row in zip(pairs, df.itertuples()):
        ll = _naive_sum(model, enc(ctx, True), enc(" " + ans))
        assert row.nll == pytest.approx(-ll, abs=TOL_PER_TOKEN * row.n_tokens)
        assert row.bpb == pytest.approx(-ll / math.log(2) / len(ans.encode()), abs=1e-4)


# ------------------------------------------------------------------ lm-eval registration and hooks
def test_registered_model_runs_simple_evaluate_and_equals_hf():
    assert get_model(lmeval.MODEL_NAME) is lmeval.FastHFLM
    kw = dict(tasks=["moelab_bb_hyperbaton"], limit=2, task_manager=lmeval._task_manager(), log_samples=True,
              bootstrap_iters=0, verbosity="ERROR", batch_size=4)
    args = f"pretrained={assets.smollm2_path()},device=cpu,dtype=float32"
    fast = lm_eval.simple_evaluate(model=lmeval.MODEL_NAME, model_args=args, **kw)
    ref = lm_eval.simple_evaluate(model="hf", model_args=args, **kw)
    fs, rs = fast["samples"]["moelab_bb_hyperbaton"], ref["samples"]["moelab_bb_hyperbaton"]
    for a, b in zip(fs, rs):
        assert a["acc"] == b["acc"]
        np.testing.assert_allclose([x[0] for x in a["filtered_resps"]], [x[0] for x in b["filtered_resps"]], atol=1e-3)


def test_request_hooks(smollm2):
    model, tok = smollm2
    reqs = loglikelihood_requests("bb_sports_understanding", 2)
    plain_seen, batch_seen = [], []

    class BatchHook:
        def __call__(self, context):
            raise AssertionError("a for_batch hook is entered, not called")

        def for_batch(self, contexts):
            batch_seen.append(list(contexts))
            return torch.no_grad()

    base = lmeval.FastHFLM(pretrained=model, tokenizer=tok, batch_size=4).loglikelihood(reqs)
    plain = lmeval.FastHFLM(pretrained=model, tokenizer=tok, batch_size=4, request_hook=plain_seen.append)
    batched = lmeval.FastHFLM(pretrained=model, tokenizer=tok, batch_size=4, request_hook=BatchHook())
    np.testing.assert_allclose([x for x, _ in plain.loglikelihood(reqs)], [x for x, _ in base], atol=1e-4)
    np.testing.assert_allclose([x for x, _ in batched.loglikelihood(reqs)], [x for x, _ in base], atol=1e-4)
    assert plain_seen == [r.args[0] for r in reqs]
    assert {c for b in batch_seen for c in b} == {r.args[0] for r in reqs}
    with pytest.raises(ValueError, match="request_hook"):
        lmeval.FastHFLM(pretrained=model, tokenizer=tok, request_hook=3)


# ------------------------------------------------------------------ choice-normalised scores
def _naive_choice(lls, gold, lengths):
    """Python loop: p(gold) / Σ p(options), plain and per-character; argmax with the first option on ties."""
    def norm(vals):
        m = max(vals)
        ex = [math.exp(v - m) for v in vals]
        return ex[gold] / sum(ex)

    def first_max(vals):
        best = 0
        for i, v in enumerate(vals):
            if v > vals[best]:
                best = i
        return best
    per = [l / n for l, n in zip(lls, lengths)]
    return dict(acc=float(first_max(lls) == gold), p_gold=norm(lls), acc_norm=float(first_max(per) == gold),
                p_gold_norm=norm(per))


@pytest.mark.parametrize("seed", range(5))
def test_choice_scores_match_naive_loop(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 6))
    lls = (-rng.gamma(2.0, 8.0, k)).tolist()
    lengths = rng.integers(1, 40, k).tolist()
    gold = int(rng.integers(0, k))
    got = scorer.choice_scores(lls, gold, lengths)
    ref = _naive_choice(lls, gold, lengths)
    assert got.keys() == ref.keys()
    for key in ref:
        assert got[key] == pytest.approx(ref[key], abs=1e-12), key


def test_choice_scores_track_accuracy_not_raw_likelihood():
    # every option's likelihood falls by the same amount: the raw gold likelihood drops, accuracy and p_gold do not
    a = scorer.choice_scores([-3.0, -5.0, -4.0], 0)
    b = scorer.choice_scores([-13.0, -15.0, -14.0], 0)
    assert a["acc"] == b["acc"] == 1.0 and a["p_gold"] == pytest.approx(b["p_gold"])
    assert scorer.choice_scores([-2.0, -2.0], 1)["acc"] == 0.0            # tie -> first option, as numpy/lm-eval
    assert "acc_norm" not in a


def test_choice_scores_on_real_items_agree_with_lm_eval_acc(smollm2):
    model, tok = smollm2
    docs = lmeval.task_docs("math_mc")[:3]
    for d in docs:
        ctx = tok(d["prompt"], add_special_tokens=False)["input_ids"]
        reqs = [(ctx, tok(" " + c, add_special_tokens=False)["input_ids"]) for c in d["choices"]]
        lls = [lp for lp, _ in scorer.loglikelihood_tokens(model, reqs)]
        got = scorer.choice_scores(lls, d["gold"], [len(c) for c in d["choices"]])
        assert got["acc"] == float(int(np.argmax(lls)) == d["gold"])
        assert got["acc_norm"] == float(int(np.argmax(np.array(lls) / [len(c) for c in d["choices"]])) == d["gold"])
        assert 0.0 < got["p_gold"] < 1.0


def test_choice_scores_reject_bad_input():
    with pytest.raises(ValueError, match="at least two"):
        scorer.choice_scores([-1.0], 0)
    with pytest.raises(ValueError, match="gold=3"):
        scorer.choice_scores([-1.0, -2.0], 3)
    with pytest.raises(ValueError, match="positive"):
        scorer.choice_scores([-1.0, -2.0], 0, [3, 0])
