"""Instruction mix pieces: templates, dedup, BIG-bench parsing, stdlib code, the smoke mix."""
import re

import pytest

from moelab.suite import bigbench, codegen, dedup, instruct, mathgen


def _eval_expr_steps(answer):
    """Every 'a op b = c' step in a worked answer must be arithmetically right (naive reference: Python eval)."""
    for lhs, rhs in re.findall(r"((?:\d+ [-+*/] )+\d+|\d+ \* \(\d+ \+ \d+\)) = (\d+)", answer):
        assert eval(lhs) == pytest.approx(float(rhs)), (lhs, rhs)


@pytest.mark.parametrize("template", [t.__name__ for t in mathgen.TEMPLATES])
def test_templates_worked_answers(template):
    probs = mathgen.generate(template, 20, seed=0)
    assert probs == mathgen.generate(template, 20, seed=0)  # deterministic
    assert len({p["question"] for p in probs}) == len(probs)
    for p in probs:
        assert p["answer"].endswith(f"#### {p['number']}")
        assert mathgen.final_number(p["answer"]) == p["number"]
        assert float(p["number"]) >= 0
        _eval_expr_steps(p["answer"])


def test_template_split():
    assert len(mathgen.TEMPLATES) >= 20 and len(mathgen.HELD_OUT) >= 5
    s = instruct.gsm_splits(per_template=10)
    held = set(mathgen.HELD_OUT)
    assert {p["template"] for p in s["test"]} == held
    assert not held & {p["template"] for p in s["train"] + s["validation"]}
    with pytest.raises(ValueError, match="t_nope"):
        mathgen.generate("t_nope", 3)


def test_final_number():
    assert mathgen.final_number("so 3 + 4 = 7\n#### 7") == "7"
    assert mathgen.final_number("#### 1,200.0") == "1200"
    assert mathgen.final_number("the answer is 12 apples") == "12"
    assert mathgen.final_number("no digits") is None


def test_dedup_exact_and_near():
    ev = ["Alice has 3 apples and buys 4 more. How many now?", "A completely different question about trains."]
    idx = dedup.NearDupIndex(ev, threshold=0.9)
    cands = ["alice has 3 apples, and buys 4 more!  How many now", "Alice has 3 apples and buys 4 more. How many now??",
             "Alice has 3 apples and buys 4 more. How many do you think she has now in total after the trip?",
             "Something unrelated entirely."]
    f = idx.flags(cands)
    assert f[0] == 1  # exact after normalisation
    assert f[1] == 1
    assert f[2] == 0 and f[3] == 0
    near = "Alice has 3 apples and buys 4 more. How many now, Bob?"
    a, b = dedup.shingles(near), dedup.shingles(ev[0])
    assert dedup.jaccard(a, b) == pytest.approx(idx.score(near, 0))  # sparse product == naive set Jaccard
    assert idx.flags([near])[0] == (2 if dedup.jaccard(a, b) >= 0.9 else 0)
    kept, counts = dedup.filter_against([{"instruction": c} for c in cands + cands[-1:]], ev)
    assert [k["instruction"] for k in kept] == cands[2:]
    assert counts == {"exact": 2, "near": 0, "internal": 1}


def test_bigbench_parsing_and_bad_input():
    d = {"task_prefix": "Answer.", "examples": [
        {"input": "2+2?", "target_scores": "{'4': 1, '5': 0}"},
        {"input": "bad", "target_scores": "{'x': 0, 'y': 0}"},
        {"input": "one", "target_scores": {"only": 1}},
        {"nothing": 1}]}
    items = bigbench.items_from_task("demo", d)
    assert len(items) == 1 and sorted(items[0]["choices"]) == ["4", "5"] and items[0]["choices"][items[0]["gold"]] == "4"
    assert items[0]["prompt"].startswith("Answer.\n\n2+2?") and items[0]["prompt"].endswith("Answer:")
    assert sum(items.skipped.values()) == 3
    with pytest.raises(ValueError, match="malformed"):
        bigbench.parse_task_json("{not json", source="x.json")
    with pytest.raises(ValueError, match="not_a_task"):
        bigbench.load_task("not_a_task")


def test_codegen_extracts_functions_and_rejects_malformed():
    src = 'def add(a, b=1):\n    """Return the sum of a and b, with b defaulting to one."""\n    c = a + b\n    return c\n' \
          'def _private(x):\n    """Hidden function that is private."""\n    return x\n'
    fns = codegen.functions_from_source(src, "demo")
    assert [f["name"] for f in fns] == ["add"] and fns[0]["signature"] == "add(a, b=1)"
    rec = codegen.as_instruction(fns[0])
    assert "add(a, b=1)" in rec["instruction"] and rec["answer"].startswith("def add")
    with pytest.raises(ValueError, match="malformed Python source in module 'broken'"):
        codegen.functions_from_source("def f(:\n", "broken")


def test_smoke_mix_is_split_and_deduplicated():
    out = instruct.build("smoke")
    assert set(out) == {"train", "validation", "test"}
    for split, recs in out.items():
        assert recs, split
        assert {"instruction", "answer", "domain", "source", "task"} <= set(recs[0])
        assert {r["domain"] for r in recs} == {"maths", "code", "reasoning"}
    train_tasks = {r["task"] for r in out["train"]}
    assert not set(instruct.REASONING_HELDOUT_TASKS) & train_tasks
    assert not any(t.startswith("gsm:") and t[4:] in mathgen.HELD_OUT for t in train_tasks)
    idx = dedup.NearDupIndex(instruct.evaluation_texts())
    assert not idx.flags([r["instruction"] for r in out["train"]]).any()
    assert instruct.build("smoke") == out  # cached and deterministic
    with pytest.raises(ValueError, match="nope"):
        instruct.build("nope")
