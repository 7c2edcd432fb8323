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
