"""Issue 49: notebook 05 scores a (mask, item list) once. Algorithm 1's Table 1 repeats the gated table's selected
clusters, and Table 2's 5% row repeats Algorithm 1's clusters: both come from the DowpResult's memo
(``evaluate_methods(memo=)``). Checked on a tiny Llama against the straightforward path (a fresh memo per call, and the
mask applied by hand): the tables are equal bit for bit, and the repeated lists are not scored again."""
import dataclasses

import numpy as np
import pandas as pd
import pytest

from moelab import free_moe as fm
from moelab.free_moe import experiment as ex

from helpers.free_moe import TEXTS


def _mc(i, t):
    return dict(id=f"m{i}", task="mc", domain="general", kind="mc", group="general-mc", prompt=t[:9],
                choices=[t[9:], " yes", " no and maybe"], label=i % 3)


@pytest.fixture(scope="module")
def pipeline(model, tok):
    items = [_mc(i, t) for i, t in enumerate(TEXTS)]
    pool, test = items[:4], items[4:]
    clusters = ex.reference_clusters(model, tok, {"general-mc": pool}, {"general-mc": 1}, 4, 2)
    dw = ex.dowp_select(model, tok, clusters.ref, [(50, 55), (95, 100)], calib_tokens=256, ratios=(1.0,),
                        batch_size=3)
    (c, m), = dw.masks.items()
    dw.selected[c], m["selected"] = tuple(dw.selection.best_band.str.rstrip("%").iloc[0].split("-")), m["best"]
    keys = ex.cluster_keys(model, tok, test, clusters)
    routing = pd.DataFrame(dict(eq3_sub=keys, pred_sub=keys))
    return clusters, dw, test, routing


def _count(monkeypatch):
    calls = []

    def counted(model, tok, items, batch_size=16, max_length=512):
        calls.append(len(items))
        return fm.scoring.item_metrics(model, tok, items, batch_size, max_length)
    monkeypatch.setattr(ex, "item_metrics", counted)
    return calls


def test_repeated_mask_item_lists_come_from_the_memo(model, tok, pipeline, monkeypatch):
    clusters, dw, test, routing = pipeline
    fresh = lambda: dataclasses.replace(dw, scored={})              # the straightforward path: nothing remembered
    calls = _count(monkeypatch)
    run = dataclasses.replace(dw, scored={})                        # the notebook's order on one DowpResult
    gated = ex.table1_scores(model, tok, test, [], routing, run, batch_size=3)
    assert calls == [len(test)] * 2                                 # dense, then the selected cluster's mask
    calls.clear()
    alg1 = ex.table1_scores(model, tok, test, [], routing, run, batch_size=3, which="best",
                            methods=("DOWP", "FREE-MOE"))
    assert calls == []                                              # its one mask list: the gated table's
    ratio = ex.ratio_ablation(model, tok, test, clusters, run, (1.0,), batch_size=3)
    assert calls == [len(test)]                                     # 1% only: 5% is Algorithm 1's list, and the
    calls.clear()                                                   # dense one the gated BASELINE's (same list here)
    alg1_f = ex.table1_scores(model, tok, test, [], routing, fresh(), batch_size=3, which="best",
                              methods=("DOWP", "FREE-MOE"))
    ratio_f = ex.ratio_ablation(model, tok, test, clusters, fresh(), (1.0,), batch_size=3)
    assert calls == [len(test)] * 4                                 # without the memo every list runs again
    pd.testing.assert_frame_equal(alg1, alg1_f, check_exact=True)
    pd.testing.assert_frame_equal(ratio, ratio_f, check_exact=True)
    (c, m), = dw.masks.items()
    with fm.method.apply_mask(model, m["best"]):                    # naive: the mask by hand, the same list
        naive = fm.scoring.item_metrics(model, tok, test, 3)
    col = {k: j for j, k in enumerate(fm.scoring.ITEM_METRICS)}
    for method, frame in (("DOWP", alg1), ("5%", ratio)):
        got = frame[(frame.method == method) & (frame.metric == "p_gold")].score.to_numpy()
        np.testing.assert_array_equal(got, naive[:, col["p_gold"]])
    dense = gated[(gated.method == "BASELINE") & (gated.metric == "p_gold")].score.to_numpy()
    assert not np.array_equal(dense, naive[:, col["p_gold"]])       # the mask changed the scores it reuses


def test_memo_needs_a_key_and_an_identical_list(model, tok, pipeline, monkeypatch):
    _, dw, test, _ = pipeline
    with pytest.raises(ValueError, match="memo needs memo_key"):
        ex.evaluate_methods(model, tok, test, {"BASELINE": (None, None)}, memo={})
    calls = _count(monkeypatch)
    memo, fn = {}, lambda m, its: ex.item_metrics(m, tok, its, 3)
    a = ex.evaluate_methods(model, tok, test, {"B": (None, None)}, score_fn=fn, memo=memo, memo_key="k")
    b = ex.evaluate_methods(model, tok, test[::-1], {"B": (None, None)}, score_fn=fn, memo=memo, memo_key="k")
    c = ex.evaluate_methods(model, tok, test, {"B": (None, None)}, score_fn=fn, memo=memo, memo_key="other")
    assert calls == [len(test)] * 3                                 # another order or score function: run again
    pd.testing.assert_frame_equal(a, c, check_exact=True)
    assert sorted(b.id) == sorted(a.id)
