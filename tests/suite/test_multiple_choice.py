"""Multiple-choice items without a position shortcut: seeded option shuffle, baselines,
usability rule."""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from sklearn.feature_extraction.text import TfidfVectorizer

from moelab.suite import baselines, bigbench, lmeval, scorecard

DEMO = {"task_prefix": "Pick.", "examples": [
    {"input": f"question {i}?", "target_scores": {f"gold {i}": 1, f"a{i}": 0, f"b{i}": 0, f"c{i}": 0, f"d{i}": 0}}
    for i in range(40)]}


# ------------------------------------------------------------------ shuffle
def test_option_shuffle_is_seeded_per_item_and_keeps_gold():
    a = bigbench.items_from_task("demo", DEMO)
    b = bigbench.items_from_task("demo", json.loads(json.dumps(DEMO)))
    src = bigbench.items_from_task("demo", DEMO, shuffle=False)
    assert [it["choices"] for it in a] == [it["choices"] for it in b]  # deterministic
    for it, s in zip(a, src):
        # naive seed: first 8 bytes of sha256, little-endian
        digest = hashlib.sha256(f"{bigbench.OPTION_SHUFFLE_VERSION}|demo|{it['id']}".encode()).digest()
        assert it["option_seed"] == int.from_bytes(digest[:8], "little")
        assert it["option_order"] == list(np.random.default_rng(it["option_seed"]).permutation(5))
        assert it["choices"] == [s["choices"][j] for j in it["option_order"]]
        assert it["choices"][it["gold"]] == s["choices"][s["gold"]] == f"gold {it['id'].split('-')[1]}"
        assert s["gold"] == it["source_gold"] == 0 and s["option_order"] == list(range(5))
        assert it["prompt"].endswith("\n".join(f"- {c}" for c in it["choices"]) + "\nAnswer:")
    assert len({tuple(it["option_order"]) for it in a}) > 10  # each item has its own order
    golds = [it["gold"] for it in a]
    assert golds.count(0) < 20  # no longer always first (binomial(40, 0.2): P(>=20) ~ 1e-5)
    with pytest.raises(ValueError, match="item id"):
        bigbench.option_seed("demo", "")


def test_option_order_is_the_same_in_another_process():
    """The seed must not depend on Python's salted hash(): another interpreter with another hash seed agrees."""
    code = ("from moelab.suite import bigbench; "
            "print([bigbench.option_order('date_understanding', f'date_understanding-{i}', 6) for i in range(5)])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout
    here = [bigbench.option_order("date_understanding", f"date_understanding-{i}", 6) for i in range(5)]
    assert out.strip() == str(here)


def test_date_understanding_gold_position_falls_to_chance():
    items = bigbench.load_items("date_understanding")
    dist = bigbench.gold_position_distribution("date_understanding", items)
    assert dist.frac_before[0] > 0.95                           # BIG-bench lists the gold first (98%)
    n = len(items)
    expected = np.mean([1 / len(it["choices"]) for it in items])  # P(gold at 0) after a uniform shuffle
    assert abs(dist.frac_after[0] - expected) < 3 * np.sqrt(expected * (1 - expected) / n)
    assert dist.n_after.sum() == dist.n_before.sum() == n
    temporal = bigbench.gold_position_distribution("temporal_sequences")
    assert temporal.frac_before[0] == 1.0 and temporal.frac_after.max() < 0.35
    # the gold text and the option set are unchanged by the shuffle
    src = {it["id"]: it for it in bigbench.load_items("date_understanding", shuffle=False)}
    for it in items:
        s = src[it["id"]]
        assert it["choices"][it["gold"]] == s["choices"][s["gold"]] and sorted(it["choices"]) == sorted(s["choices"])
    # the lm-eval documents carry the shuffled options and their order
    docs = lmeval.task_docs("bb_date_understanding")
    by_id = {it["id"]: it for it in items}
    for d in docs[:20]:
        assert d["choices"] == by_id[d["id"]]["choices"] and d["gold"] == by_id[d["id"]]["gold"]
        assert d["option_order"] == lmeval.option_order_text(by_id[d["id"]])


# ------------------------------------------------------------------ baselines
def _toy_items(rng, n=60, k=4):
    out = []
    for i in range(n):
        choices = ["".join(rng.choice(list("abcdefghij"), size=int(rng.integers(3, 9)))) for _ in range(k)]
        out.append(dict(id=f"t-{i}", choices=choices, gold=int(rng.integers(k))))
    return out


def test_position_and_heuristic_baselines_match_naive_loops():
    items = _toy_items(np.random.default_rng(0))
    items.append(dict(id="short", choices=["x", "yy"], gold=1))
    pos = baselines.position_correct(items)
    for p in range(4):
        assert list(pos[f"pos_{p}"]) == [float(it["gold"] == p) for it in items]
    p_best, c_best = baselines.best_position(items)
    assert c_best.mean() == max(np.mean([it["gold"] == p for it in items]) for p in range(4))
    assert list(baselines.chance(items)) == [1 / len(it["choices"]) for it in items]
    for it in items[:10]:
        vec = TfidfVectorizer(analyzer="char_wb", ngram_range=baselines.NGRAMS).fit(it["choices"])
        X = [vec.transform([c]).toarray()[0] for c in it["choices"]]
        naive = [np.mean([X[i] @ X[j] / np.linalg.norm(X[i]) / np.linalg.norm(X[j])
                          for j in range(len(X)) if j != i]) for i in range(len(X))]
        assert np.allclose(baselines.option_similarity(it["choices"]), naive)
        lens = [len(c) for c in it["choices"]]
        top = [j for j, L in enumerate(lens) if L == max(lens)]
        assert baselines.heuristic_correct([it], "longest")[0] == (it["gold"] in top) / len(top)
    # the centre of the options is found: gold = the date the distractors were edited from
    centre = dict(choices=["05/01/2021", "05/01/2027", "06/01/2021", "05/11/2021", "09/21/1984"], gold=0)
    assert baselines.heuristic_correct([centre], "most_similar")[0] == 1.0
    assert baselines.pick_correct([1.0, 1.0, 0.0], 0) == 0.5
    with pytest.raises(ValueError, match="heuristic"):
        baselines.heuristic_correct(items, "nope")
    with pytest.raises(ValueError, match="gold"):
        baselines.chance([dict(choices=["a", "b"], gold=2)])


def test_question_blind_cv_learns_priors_and_never_sees_the_test_item():
    rng = np.random.default_rng(1)
    # label prior: "No" is gold in 80% of the items, options shown in random order -> the model learns it
    prior = [dict(id=i, choices=["Yes", "No"] if rng.random() < 0.5 else ["No", "Yes"]) for i in range(100)]
    for it in prior:
        it["gold"] = it["choices"].index("No" if rng.random() < 0.8 else "Yes")
    acc = baselines.question_blind_cv(prior).mean()
    assert acc == pytest.approx(np.mean([it["choices"][it["gold"]] == "No" for it in prior]), abs=0.05)
    # every option is a fresh random string: only a model that saw the test item could beat chance
    letters = list("abcdefghijklmnopqrstuvwxyz")
    fresh = [dict(id=i, choices=["".join(rng.choice(letters, 8)) for _ in range(4)], gold=int(rng.integers(4)))
             for i in range(120)]
    assert baselines.question_blind_cv(fresh).mean() < 0.25 + 0.15
    # the gold always listed first, all options of one length: position must not leak into the blind model
    first = [dict(it, gold=0) for it in fresh]
    assert baselines.question_blind_cv(first).mean() < 0.25 + 0.15
    shuffled = [dict(it, choices=it["choices"][::-1], gold=len(it["choices"]) - 1 - it["gold"]) for it in prior]
    assert np.allclose(baselines.question_blind_cv(shuffled), baselines.question_blind_cv(prior))
    table = baselines.per_item(prior)
    assert list(table.columns[:2]) == ["item_id", "chance"] and "cv_logreg" in table and len(table) == 100
    with pytest.raises(ValueError, match="n_folds"):
        baselines.question_blind_cv(prior[:3])


# ------------------------------------------------------------------ usability rule
def test_beats_is_a_one_sided_paired_bootstrap():
    rng = np.random.default_rng(2)
    a, b = (rng.random(80) < 0.6).astype(float), (rng.random(80) < 0.5).astype(float)
    est, lo, ok = scorecard.beats(a, b, alpha=0.05, n_boot=500)
    d = a - b
    idx = np.random.default_rng(0).integers(0, 80, size=(500, 80))
    naive = np.quantile([d[i].mean() for i in idx], 0.05)       # 5th percentile of resampled mean differences
    assert est == pytest.approx(d.mean()) and lo == pytest.approx(naive) and ok == (naive > 0)


def _hand_made_baselines(n=200, seed=3):
    rng = np.random.default_rng(seed)
    gold_first = (rng.random(n) < 0.6).astype(float)          # the gold sits at position 0 in 60% of items
    return pd.DataFrame(dict(chance=0.25, pos_0=gold_first, pos_1=(1 - gold_first) / 3, pos_2=(1 - gold_first) / 3,
                             pos_3=(1 - gold_first) / 3, longest=(rng.random(n) < 0.3).astype(float),
                             cv_logreg=(rng.random(n) < 0.35).astype(float)))


def test_usability_rule_on_hand_made_items():
    base = _hand_made_baselines()
    rng = np.random.default_rng(4)
    # a model that always answers position 0: far above chance, exactly the position baseline -> unusable
    r = scorecard.mc_usability(base.pos_0.to_numpy(), base)
    assert r["diff_low_chance"] > 0 and not r["usable"] and r["best_position"] == 0
    # a model at the position baseline's level on other items: still unusable
    same_level = (rng.random(len(base)) < base.pos_0.mean()).astype(float)
    assert not scorecard.mc_usability(same_level, base)["usable"]
    # clearly better than every baseline -> usable
    strong = np.maximum(base.pos_0.to_numpy(), (rng.random(len(base)) < 0.8).astype(float))
    r = scorecard.mc_usability(strong, base)
    assert r["usable"] and min(r["diff_low_chance"], r["diff_low_position"], r["diff_low_blind"]) > 0
    # above chance and position, but no better than the question-blind model -> unusable
    base2 = base.assign(cv_logreg=strong)
    assert not scorecard.mc_usability(strong, base2)["usable"]
    with pytest.raises(ValueError, match="same items"):
        scorecard.mc_usability(strong[:-1], base)


def test_summarize_marks_unshuffled_scores_needs_rebuild_and_applies_the_rule(tmp_path):
    task = "moelab_bb_date_understanding"
    ids = [d["id"] for d in lmeval.task_docs("bb_date_understanding")[:100]]
    base = scorecard.task_baselines(task).loc[ids]
    # a question-blind "model": picks the option most similar to the others (about 80% on dates)
    blind = pd.DataFrame(dict(task=task, item_id=ids, metric="acc", score=base["most_similar"].to_numpy()))
    blind = blind.assign(score=(blind.score > 0.5).astype(float))
    old = scorecard.summarize(blind, "m").iloc[0]                     # no option order: scored before the fix
    assert old.status == "needs rebuild" and not old.usable
    row = scorecard.summarize(scorecard.with_option_order(blind), "m").iloc[0]
    assert row.acc > row.chance + 0.4 and row.status == "not usable" and row.diff_low_blind <= 0
    items = pd.concat([scorecard.with_option_order(blind.assign(score=1.0)),
                       pd.DataFrame(dict(task="moelab_nll_code", item_id=range(10), metric="bpb", score=0.5))])
    path = tmp_path / "items.csv"
    items.assign(model="m").to_csv(path, index=False)
    assert scorecard.usable_tasks("m", items_path=path) == ["moelab_bb_date_understanding", "moelab_nll_code"]
    blind.assign(model="m").to_csv(path, index=False)
    assert scorecard.usable_tasks("m", items_path=path) == []


def test_shortcut_doc_is_generated_from_a_table(tmp_path):
    t = pd.DataFrame([dict(set="s", task="t", n=3, gold_pos_before="100 / 0", gold_pos_after="50 / 50",
                           best_pos_before=1.0, best_pos_after="0.500 (pos 0)", blind="0.800 (most_similar)",
                           chance=0.5, blind_all="")])
    baselines.write_shortcut_doc(tmp_path / "x.md", table=t)
    text = (tmp_path / "x.md").read_text()
    assert "| s | t | 3 | 100 / 0 | 50 / 50 | 1.000 | 0.500 (pos 0) | 0.800 (most_similar) | 0.500 |" in text
