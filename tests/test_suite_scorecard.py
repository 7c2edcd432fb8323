"""Scorecard (issue 4, item 4): chance levels, usable rule, committed table."""
import pandas as pd
import pytest

from moelab.suite import lmeval, scorecard


def test_chance_levels():
    docs = lmeval.task_docs("bb_hyperbaton")[:4]
    assert scorecard.chance_level("moelab_bb_hyperbaton", [d["id"] for d in docs]) == pytest.approx(0.5)
    docs = lmeval.task_docs("math_mc")[:3]
    assert scorecard.chance_level("moelab_math_mc", [d["id"] for d in docs]) == pytest.approx(0.2)
    assert scorecard.chance_level("moelab_gsm", ["x"]) == 0.0
    assert scorecard.chance_level("moelab_nll_code", ["x"]) == 8.0
    with pytest.raises(ValueError, match="not in task"):
        scorecard.chance_level("moelab_bb_hyperbaton", ["nope"])


def test_summarize_usable_rule():
    ids = [d["id"] for d in lmeval.task_docs("bb_hyperbaton")[:40]]
    good = pd.DataFrame(dict(task="moelab_bb_hyperbaton", item_id=ids, metric="acc", score=[1.0] * 36 + [0.0] * 4))
    coin = good.assign(score=[1.0, 0.0] * 20)
    nll = pd.DataFrame(dict(task="moelab_nll_code", item_id=range(10), metric="bpb", score=[0.5] * 10))
    good, coin = scorecard.with_option_order(good), scorecard.with_option_order(coin)  # scored in today's order
    t = scorecard.summarize(pd.concat([good, nll]), "m")
    assert t.set_index("task").usable.to_dict() == {"moelab_bb_hyperbaton": True, "moelab_nll_code": True}
    assert not scorecard.summarize(coin, "m").usable.item()
    assert scorecard.summarize(good, "m").acc.item() == pytest.approx(0.9)


def test_committed_scorecard_loads():
    if not scorecard.CSV.exists():
        pytest.skip("data/scorecard.csv not committed yet")
    df = scorecard.load()
    assert {"model", "task", "acc", "ci_low", "ci_high", "chance", "usable"} <= set(df.columns)
    assert set(df.task) <= set(lmeval.TASKS)
    assert (df.ci_low <= df.acc + 1e-9).all() and (df.acc <= df.ci_high + 1e-9).all()
    assert isinstance(scorecard.usable_tasks(df.model.iloc[0]), list)
    with pytest.raises(ValueError, match="nope"):
        scorecard.usable_tasks("nope")


def test_build_is_resumable(tmp_path, monkeypatch):
    """build() measures only tasks missing from the per-model file and merges what it has into the CSVs."""
    calls = []
    monkeypatch.setattr(scorecard, "partial_path", lambda name: tmp_path / "part" / f"{name}.csv")

    def fake_eval(model, tok, tasks, limit, batch_size=8):
        (t,) = tasks
        calls.append(t)
        ids = [d["id"] for d in lmeval.task_docs(t[len("moelab_"):])[:limit]]
        return pd.DataFrame(dict(task=t, item_id=ids, metric="acc", score=1.0))

    monkeypatch.setattr(lmeval, "evaluate", fake_eval)
    monkeypatch.setattr(scorecard, "load_model", lambda name: (object(), object()))
    out, items = tmp_path / "sc.csv", tmp_path / "items.csv"
    tasks = ["moelab_bb_hyperbaton", "moelab_bb_penguins_in_a_table"]
    t1 = scorecard.build(("smollm2-135m-instruct",), out, items, tasks=tasks)
    assert calls == tasks and list(t1.n) == [scorecard._limit_n(t) for t in tasks]
    assert scorecard._limit_n("moelab_bb_penguins_in_a_table") == 89   # whole pool: smaller than the limit
    t2 = scorecard.build(("smollm2-135m-instruct",), out, items, tasks=tasks, max_items=50)  # nothing to do
    assert calls == tasks and t2.equals(t1)
    assert set(pd.read_csv(items).model) == {"smollm2-135m-instruct"}
    with pytest.raises(ValueError, match="unknown scorecard model"):
        scorecard.build(("nope",), out, items, tasks=tasks)
