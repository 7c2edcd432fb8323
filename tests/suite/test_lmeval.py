"""LM evaluation: task YAMLs, task data, scorers, and lm-eval's accuracy vs a naive loop."""
import math
from pathlib import Path

import pytest

from moelab.suite import lmeval, mathgen


def test_task_yamls_match_TASKS_and_index_offline():
    names = sorted(p.stem for p in lmeval.TASK_DIR.glob("moelab_*.yaml"))
    assert names == lmeval.TASKS
    tm = lmeval._task_manager()
    assert set(lmeval.TASKS) <= set(tm.all_tasks)


@pytest.mark.parametrize("task", lmeval.TASKS)
def test_task_docs(task):
    docs = lmeval.task_docs(task[len("moelab_"):])
    assert len(docs) >= 80
    assert len({d["id"] for d in docs}) == len(docs)
    for d in docs[:20]:
        if "choices" in d:
            assert 0 <= d["gold"] < len(d["choices"]) and d["prompt"].endswith("Answer:")


def test_eval_sets_have_200_items_where_source_allows():
    sizes = {t: len(lmeval.task_docs(t[len("moelab_"):])) for t in lmeval.TASKS}
    small = {t: n for t, n in sizes.items() if n < 200}
    # only tasks whose source is small (causal_judgment 190, penguins 149, logical_deduction 3 objects 300, HumanEval 164)
    assert set(small) <= {"moelab_bb_causal_judgment", "moelab_bb_penguins_in_a_table",
                          "moelab_bb_logical_deduction_three_objects", "moelab_humaneval", "moelab_nll_code"}


def test_scorers():
    doc = dict(number="42")
    assert lmeval.score_gsm(doc, [" 40 + 2 = 42.\n#### 42"]) == {"exact_match": 1.0}
    assert lmeval.score_gsm(doc, [" it is 41\n\nQuestion: 42"]) == {"exact_match": 0.0}
    nll = lmeval.score_nll(dict(continuation="abcd"), [(-4 * math.log(2), False)])
    assert nll["bpb"] == pytest.approx(1.0)
    prob = dict(prompt="def add(a, b):\n", test="def check(f):\n    assert f(1, 2) == 3\n", entry_point="add")
    assert lmeval.score_humaneval(prob, ["    return a + b\n"]) == {"pass@1": 1.0}
    assert lmeval.score_humaneval(prob, ["    while True: pass\n"]) == {"pass@1": 0.0}


def test_humaneval_canonical_solutions_pass():
    from moelab import assets

    probs = list(assets.humaneval_problems().values())[:3]
    for p in probs:
        assert lmeval.score_humaneval(p, [p["canonical_solution"]])["pass@1"] == 1.0


def test_bad_arguments():
    with pytest.raises(ValueError, match="moelab_nope"):
        lmeval.evaluate(None, None, ["moelab_nope"])
    with pytest.raises(ValueError, match="limit"):
        lmeval.evaluate(None, None, ["moelab_gsm"], limit=0)
    with pytest.raises(ValueError, match="request_hook"):
        lmeval.evaluate(None, None, ["moelab_gsm"], limit=1, request_hook=3)
    with pytest.raises(ValueError, match="nope"):
        lmeval.task_docs("nope")


@pytest.mark.slow
def test_accuracy_matches_naive_loop_and_hook_sees_requests():
    import torch

    from moelab import assets

    model, tok = assets.load_smollm2()
    seen = []
    df = lmeval.evaluate(model, tok, ["moelab_bb_sports_understanding"], limit=2, request_hook=seen.append)
    docs = lmeval.task_docs("bb_sports_understanding")[:2]
    assert len(seen) == sum(len(d["choices"]) for d in docs)
    assert all(s == docs[0]["prompt"] or s == docs[1]["prompt"] for s in seen)
    acc = df[df.metric == "acc"].set_index("item_id").score
    for d in docs:  # naive reference: sum of log-probabilities of each option's tokens after the prompt
        ctx = tok(d["prompt"])["input_ids"]
        lls = []
        for c in d["choices"]:
            full = tok(d["prompt"] + " " + c)["input_ids"]
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([full])).logits[0, :-1].float(), -1)
            lls.append(sum(logp[i - 1, full[i]].item() for i in range(len(ctx), len(full))))
        assert acc[d["id"]] == float(max(range(len(lls)), key=lls.__getitem__) == d["gold"])


@pytest.mark.slow
def test_domain_nll_matches_lmeval_bpb():
    from moelab import assets

    model, tok = assets.load_smollm2()
    docs = lmeval.task_docs("nll_reasoning")[:2]
    ours = lmeval.domain_nll(model, tok, [(d["context"], d["continuation"]) for d in docs])
    ref = lmeval.evaluate(model, tok, ["moelab_nll_reasoning"], limit=2)
    assert ours.bpb.to_numpy() == pytest.approx(ref.score.to_numpy(), rel=0.05)
    with pytest.raises(ValueError, match="no items"):
        lmeval.domain_nll(model, tok, [])
