"""Scorecard: chance levels, usable rule, committed table."""
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


def test_mde_table_matches_normal_formula(tmp_path):
    """MDE = (z_{.975} + z_{.80}) · s.d./√n (large df); paired accuracy s.d. = √q; written beside the scorecard."""
    from scipy.stats import norm

    ids = [d["id"] for d in lmeval.task_docs("bb_hyperbaton")[:40]]
    acc = pd.DataFrame(dict(task="moelab_bb_hyperbaton", item_id=ids, metric="acc", score=[1.0, 0.0, 0.0, 0.0] * 10))
    bpb = pd.DataFrame(dict(task="moelab_nll_code", item_id=range(10), metric="bpb", score=[0.2, 0.6] * 5))
    items = pd.concat([acc, bpb]).assign(model="m")
    t = scorecard.mde_table(items, n_items=(100, 400), disagreement=0.25).set_index("task")
    z = norm.ppf(0.975) + norm.ppf(0.8)
    sd = acc.score.std(ddof=1)
    assert t.loc["moelab_bb_hyperbaton", "mde_one_sample_100"] == pytest.approx(z * sd / 10, rel=1e-4)
    assert t.loc["moelab_bb_hyperbaton", "mde_paired_400"] == pytest.approx(z * 0.5 / 20, rel=1e-4)
    assert t.loc["moelab_nll_code", "mde_one_sample_400"] == pytest.approx(z * bpb.score.std(ddof=1) / 20, rel=1e-4)
    assert pd.isna(t.loc["moelab_nll_code", "mde_paired_100"])
    assert t.loc["moelab_bb_hyperbaton", "pool"] == 500
    scorecard.write(scorecard.with_option_order(acc).assign(model="m"), tmp_path / "sc.csv", tmp_path / "items.csv")
    assert (tmp_path / "sc_mde.csv").exists()


def test_merge_keeps_old_rows_of_tasks_not_measured_again(tmp_path, monkeypatch):
    monkeypatch.setattr(scorecard, "partial_path", lambda name: tmp_path / f"{name}.csv")
    ids = [d["id"] for d in lmeval.task_docs("bb_hyperbaton")[:20]]
    old = pd.concat([pd.DataFrame(dict(task="moelab_bb_hyperbaton", item_id=ids, metric="acc", score=0.0)),
                     pd.DataFrame(dict(task="moelab_nll_code", item_id=range(5), metric="bpb", score=0.5))])
    items = tmp_path / "items.csv"
    old.assign(model="gemma-3-270m").to_csv(items, index=False)
    new = scorecard.with_option_order(old[old.task == "moelab_bb_hyperbaton"].assign(score=1.0))
    new.to_csv(tmp_path / "gemma-3-270m.csv", index=False)
    t = scorecard.merge(("gemma-3-270m",), tmp_path / "sc.csv", items).set_index("task")
    assert t.loc["moelab_bb_hyperbaton", "acc"] == 1.0 and t.loc["moelab_nll_code", "acc"] == 0.5
