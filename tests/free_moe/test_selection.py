"""Notebook 05's configuration per profile (frozen, the paper's band grid, >= 40 reference items per
cluster), clusters that drop to fewer K rather than select on too few items, routing restricted to the request's
task type, ablations judged against the dense model at their purified share, and the notebook as a method section
(no def / lambda / cache.memo, short cells and loops)."""
import ast
import math
import re
from dataclasses import FrozenInstanceError

import numpy as np
import pandas as pd
import pytest
from scipy.stats import t as t_dist

from moelab import free_moe as fm

from helpers import ROOT
from helpers.free_moe import TEXTS, batches

NB = ROOT / "notebooks" / "05_free_moe.py"


# ---------------------------------------------------------------- configuration
def test_configs_are_frozen_and_on_the_paper_grid():
    for p in ("smoke", "default", "full", "paper"):
        c = fm.config_for(p)
        assert c.profile == p and set(c.bands) <= set(fm.method.APPENDIX_BANDS) and fm.method.WANDA_BAND not in c.bands
        assert c.n_ref_cluster >= c.min_ref
        with pytest.raises(FrozenInstanceError):
            c.n_test = 1
    for p in ("default", "full", "paper"):
        assert fm.config_for(p).min_ref >= fm.config.MIN_REF == 40
    assert fm.config_for("full").bands == fm.method.APPENDIX_BANDS and fm.config_for("paper").device == "auto"
    assert fm.config_for("default").device == "cpu"
    with pytest.raises(ValueError, match="paper's 50-100% grid"):
        fm.config_for("default", bands=(fm.method.WANDA_BAND,))
    with pytest.raises(ValueError, match="at least 40"):
        fm.config_for("default", n_ref_cluster=10)
    with pytest.raises(ValueError, match="unknown PROFILE"):
        fm.config_for("fast")
    t = fm.profile_table({"K": "12"})
    assert list(t.columns) == ["setting", "paper (004)", "smoke", "default", "full", "paper"]
    assert t.set_index("setting").loc["n_ref_cluster", "default"] == str(fm.config_for("default").n_ref_cluster)


# ---------------------------------------------------------------- clusters with enough reference items
def _items(texts, group="code-gen"):
    dom, kind = group.split("-")
    return [dict(id=i, task="t", domain=dom, kind=kind, group=group, prompt=t, answer=" x")
            for i, t in enumerate(texts)]


def test_reference_clusters_use_fewer_clusters_rather_than_too_few_items(model, tok):
    pool = _items(TEXTS * 3)                                                     # 24 items
    cl = fm.reference_clusters(model, tok, {"code-gen": pool}, {"code-gen": 2}, n_per_cluster=5, min_ref=5)
    t = cl.table
    F = fm.method.embedding_features(model, tok, [it["prompt"] for it in pool])
    k = int(t.K_used.iloc[0])
    labels = fm.method.fit_subdomains(F, k, 0).labels_
    assert (t.reference <= 5).all() and (t.pool >= 5).all() and t.K_requested.iloc[0] == 2
    for c in range(k):                                                          # first pool items of each cluster
        assert [it["id"] for it in cl.ref[f"code-gen_{c}"]] == [pool[i]["id"] for i in np.flatnonzero(labels == c)[:5]]
    big = fm.reference_clusters(model, tok, {"code-gen": pool}, {"code-gen": 8}, n_per_cluster=12, min_ref=12)
    assert big.table.K_used.iloc[0] < 8 and (big.table.reference >= 12).all() and big.table.why.iloc[0]
    with pytest.raises(ValueError, match="fewer than min_ref"):
        fm.reference_clusters(model, tok, {"code-gen": pool[:3]}, {"code-gen": 1}, n_per_cluster=5, min_ref=5)


def test_router_routes_within_the_request_type():
    rng = np.random.default_rng(0)
    F = rng.normal(size=(60, 4))
    F[:20, 0] += 4
    F[20:40, 1] += 4
    grp = np.array(["a-mc"] * 20 + ["b-gen"] * 20 + ["c-mc"] * 20)
    r = fm.method.MultiLevelRouter().fit(F, grp, np.char.add(grp, "_0"))
    free, _ = r.predict(F)
    assert (free[:40] == grp[:40]).mean() > 0.9
    only_mc = [["a-mc", "c-mc"]] * 60
    dom, sub = r.predict(F, only_mc)
    assert set(dom) <= {"a-mc", "c-mc"}                               # an MC request never reaches a generative expert
    p = r.main.predict_proba(F)
    cls = list(r.main.classes_)
    naive = [cls[max((cls.index("a-mc"), cls.index("c-mc")), key=lambda j: p[i, j])] for i in range(60)]
    assert list(dom) == naive and all(s == d + "_0" for s, d in zip(sub, dom))
    with pytest.raises(ValueError, match="allows none"):
        r.predict(F[:1], [["z"]])


# ---------------------------------------------------------------- ablations at their purified share
def _ablation_items(effects, pct, n=30, seed=3):
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.2, 0.8, n)
    rows = [dict(method="base", task="t", id=i, metric="p_gold", score=b, purified_pct=0.0) for i, b in enumerate(base)]
    for opt, e in effects.items():
        v = np.clip(base + e + rng.normal(0, 0.01, n), 0, 1)
        rows += [dict(method=opt, task="t", id=i, metric="p_gold", score=x, purified_pct=pct[opt])
                 for i, x in enumerate(v)]
    return pd.DataFrame(rows)


def test_ablation_summary_needs_the_winner_above_base():
    items = _ablation_items({"mlp": -0.05, "attn": -0.01, "both": -0.08}, {"mlp": 3.7, "attn": 1.3, "both": 5.0})
    s = fm.ablation_summary(items).set_index("option")
    assert s.loc["attn", "best"] and not s.best_above_base.any()               # "best" = least below base: no claim
    assert s.loc["attn", "purified_pct"] == 1.3 and s.loc["both", "purified_pct"] == 5.0
    w = items.pivot_table(index="id", columns="method", values="score")
    raw = 100 * (w["mlp"] - w["base"]).to_numpy()
    d = np.concatenate([raw, [100.0, -100.0]])                # the claims engine's pseudo-pairs for a bounded score
    h = t_dist.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    assert s.loc["mlp", "lo"] == pytest.approx(d.mean() - h) and s.loc["mlp", "diff"] == pytest.approx(raw.mean())
    up = fm.ablation_summary(_ablation_items({"mlp": 0.3, "attn": 0.01}, {"mlp": 3.7, "attn": 1.3})).set_index("option")
    assert up.loc["mlp", "best"] and up.loc["mlp", "above_base"] and up.best_above_base.all()


def test_ablation_items_report_the_share_of_all_weights(model, tok):
    ranks = fm.method.patch_ranks(model, fm.method.collect_input_norms(model, batches(tok)))
    m = fm.method.band_mask(ranks, (50, 55))
    items = [dict(id=i, task="t", prompt=t[:8], answer=t[8:]) for i, t in enumerate(TEXTS[:4])]
    routes = {"base": (None, None), "attn": (["c"] * 4, {"c": fm.method.restrict_mask(m, "attn")}),
              "both": (["c"] * 4, {"c": m})}
    long = fm.experiment.ablation_items(model, tok, items, routes, batch_size=2)
    total = sum(l.weight.numel() for l in fm.method.target_linears(model).values())
    attn = sum(l.weight.numel() for n, l in fm.method.target_linears(model).items()
               if n.endswith(fm.method.SUBLAYER_PROJECTIONS["attn"]))
    pct = long.groupby("method").purified_pct.first()
    assert pct["base"] == 0 and pct["both"] == pytest.approx(5.0, abs=0.5)
    assert pct["attn"] == pytest.approx(5.0 * attn / total, abs=0.5)           # attention purifies a smaller share


# ---------------------------------------------------------------- the notebook as a method section
def _code_cells():
    cells, cur, code = [], [], False
    for line in NB.read_text().splitlines():
        if line.startswith("# %%"):
            if code:
                cells.append(cur)
            cur, code = [], "[markdown]" not in line
        elif code:
            cur.append(line)
    if code:
        cells.append(cur)
    return [[l for l in c if l.strip()] for c in cells]


def test_notebook_is_a_method_section():
    src = NB.read_text()
    tree = ast.parse(src)
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Lambda, ast.ClassDef))]
    assert "cache.memo" not in src and "plt." not in src and "import matplotlib" not in src
    for cell in _code_cells():
        assert len(cell) <= 10, cell[:2]
    for n in ast.walk(tree):
        if isinstance(n, (ast.For, ast.While)):
            assert n.end_lineno - n.lineno + 1 <= 3, n.lineno
    assert "fm.config_for(PROFILE, dry_run=DRY_RUN)" in src and "fm.profile_table(" in src
    assert not re.search(r"/work/shared|\.\./shared", src)
