"""Tests for moelab.sba (geometry of expert outputs; SBA paper §III, §IV-B, §VI-B; notebook 02_sba)."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from moelab.core.similarity import expert_similarity
from moelab.sba.data import PairCollate, load_allnli_triplets, load_mteb_local, wordnet_subject_texts
from moelab.sba.items import evaluate_mteb_with_items
from moelab.sba.experiment import mnrl_loss
from moelab.sba.geometry import collect_geometry, geometry_frame, moe_specialisation, pair_geometry, routing_jsd, st_forward_fn, summarize_geometry
from moelab.sba.method import set_aggregation
from moelab.sba.report import table_one
from moelab.sba.standin import build_moe_minilm


def _naive_geometry(eo, w):
    """Per-token loop with the paper's formulas (Eqs. 1-3, r̄ = (r1 + r2)/2)."""
    rows = []
    for t in range(eo.shape[0]):
        e1, e2 = eo[t, 0].double(), eo[t, 1].double()
        w1, w2 = float(w[t, 0]), float(w[t, 1])
        r1, r2 = float(e1.norm()), float(e2.norm())
        cos = float(e1 @ e2) / (r1 * r2)
        y = w1 * e1 + w2 * e2
        rows.append(dict(r1=r1, r2=r2, norm_ratio=r1 / r2, angle_deg=math.degrees(math.acos(max(-1, min(1, cos)))),
                         ratio_linear=float(y.norm()) / ((r1 + r2) / 2), weight_sum=w1 + w2))
    return pd.DataFrame(rows)


@pytest.fixture
def sample():
    g = torch.Generator().manual_seed(0)
    eo = torch.randn(50, 2, 16, generator=g) * (1 + torch.rand(50, 2, 1, generator=g))
    w = torch.softmax(torch.randn(50, 8, generator=g), -1).topk(2).values  # nomic-style: sum < 1
    return eo, w


def test_pair_geometry_matches_naive_loop(sample):
    eo, w = sample
    g = pair_geometry(eo, w)
    ref = _naive_geometry(eo, w)
    for c in ref.columns:
        np.testing.assert_allclose(g[c], ref[c].to_numpy(), rtol=1e-5, atol=1e-6, err_msg=c)
    assert g["n_zero_norm"] == 0 and g["n_tokens"] == 50


def test_shrinkage_decomposition_is_exact(sample):
    eo, w = sample
    g = pair_geometry(eo, w)
    np.testing.assert_allclose(g["f_weight_sum"] * g["f_angular"] * g["f_radius_mix"], g["ratio_linear"], rtol=1e-6)
    assert (g["f_angular"] <= 1 + 1e-9).all()
    # core SBA: radius Σ w_i r_i with the raw weights, direction on the sphere -> no angular cancellation:
    # ||y_sba|| / r̄ = s · Σ ŵ_i r_i / r̄ exactly
    np.testing.assert_allclose(g["ratio_sba"], g["f_weight_sum"] * g["f_radius_mix"], rtol=1e-5)
    np.testing.assert_allclose(g["ratio_sba_normfree"], g["ratio_sba"], rtol=1e-5)
    np.testing.assert_allclose(g["ratio_sba_unit"] * ((g["r1"] + g["r2"]) / 2), 1.0, rtol=1e-5)


def test_orthogonal_equal_norms_textbook_case():
    eo = torch.tensor([[[2.0, 0.0], [0.0, 2.0]]])
    w = torch.tensor([[0.5, 0.5]])
    g = pair_geometry(eo, w)
    assert g["angle_deg"][0] == pytest.approx(90.0)
    assert g["norm_ratio"][0] == pytest.approx(1.0)
    assert g["ratio_linear"][0] == pytest.approx(math.sqrt(0.5))  # inward collapse (Eq. 3)
    assert g["ratio_sba"][0] == pytest.approx(1.0)  # stays on the sphere
    g2 = pair_geometry(eo, torch.tensor([[0.3, 0.2]]))  # unnormalised weights: both shrink by s = 0.5
    assert g2["ratio_linear"][0] == pytest.approx(math.hypot(0.3 * 2, 0.2 * 2) / 2, rel=1e-6)
    assert g2["ratio_sba"][0] == pytest.approx(0.5)


def test_zero_norm_expert_outputs_are_dropped_and_counted(sample):
    eo, w = sample
    eo = eo.clone()
    eo[3, 1] = 0.0
    eo[7, 0] = 0.0
    with pytest.warns(UserWarning, match="2 of 50 token"):
        g = pair_geometry(eo, w)
    assert g["n_zero_norm"] == 2 and g["n_tokens"] == 48 and len(g["angle_deg"]) == 48
    assert all(np.isfinite(v).all() for k, v in g.items() if isinstance(v, np.ndarray))


def test_bad_shapes():
    with pytest.raises(ValueError, match="top-2"):
        pair_geometry(torch.randn(4, 3, 8), torch.rand(4, 3))
    with pytest.raises(ValueError, match="weights shape"):
        pair_geometry(torch.randn(4, 2, 8), torch.rand(4, 3))


def test_geometry_frame_and_summary(sample):
    eo, w = sample
    recs = {"layer1": {"expert_outputs": eo, "weights": w, "indices": torch.zeros(50, 2, dtype=torch.long)},
            "layer3": {"expert_outputs": eo * 2, "weights": w, "indices": torch.zeros(50, 2, dtype=torch.long)}}
    df = geometry_frame(recs, domain="x")
    assert len(df) == 100 and set(df.layer) == {"layer1", "layer3"}
    s = summarize_geometry(df)
    assert list(s.layer) == ["layer1", "layer3", "pooled"]
    assert s.set_index("layer").loc["pooled", "n_tokens"] == 100
    share = s.set_index("layer").loc["pooled", "share_angle_above_40deg"]
    assert share == pytest.approx((df.angle_deg > 40).mean())
    with pytest.raises(ValueError, match="empty"):
        summarize_geometry(df.iloc[:0])
    with pytest.raises(ValueError, match="no captured tokens"):
        geometry_frame({})


def test_routing_jsd():
    rows = []
    for dom, usage in {"a": [5, 5, 0, 0], "b": [0, 0, 5, 5]}.items():
        rows += [dict(domain=dom, layer="L", expert=e, count=c) for e, c in enumerate(usage)]
    for dom in ("a", "b"):
        rows += [dict(domain=dom, layer="M", expert=e, count=3) for e in range(4)]
    j = routing_jsd(pd.DataFrame(rows)).set_index("layer").jsd_bits
    assert j["L"] == pytest.approx(1.0)  # disjoint usage over 2 domains: log2(2) bits
    assert j["M"] == pytest.approx(0.0)  # identical usage
    assert j["mean"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="empty"):
        routing_jsd(pd.DataFrame(columns=["domain", "layer", "expert", "count"]))


def test_expert_similarity():
    from moelab.core.experts import StackedExperts

    ex = StackedExperts(4, 8, 16, act="gelu")
    with torch.no_grad():
        for e in range(1, 4):
            ex.copy_expert(0, e)

    class L(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = ex

    assert expert_similarity(L()) == pytest.approx(1.0)
    with torch.no_grad():
        ex.w_in.normal_()
        ex.w_out.normal_()
    assert abs(expert_similarity(L())) < 0.2


# ----------------------------------------------------------------------------------------------------------------------
# the embedded MoE embedding model (real all-MiniLM-L6-v2)
# ----------------------------------------------------------------------------------------------------------------------
TEXTS = ["a man is playing a guitar", "the cat sat on the mat", "stock markets fell sharply today", "x"]


@pytest.fixture(scope="module")
def minilm():
    from moelab.assets import load_minilm

    st = load_minilm()
    st.max_seq_length = 128
    return st


def test_sparse_upcycled_minilm_equals_minilm_exactly(minilm):
    ref = minilm.encode(TEXTS, convert_to_tensor=True)
    st = build_moe_minilm(init="sparse", renormalize=True)
    torch.testing.assert_close(st.encode(TEXTS, convert_to_tensor=True), ref, atol=1e-5, rtol=1e-5)
    from moelab.core.layer import moe_layers

    assert len(moe_layers(st)) == 3  # layers 1, 3, 5
    assert moe_specialisation(st).expert_similarity.min() == pytest.approx(1.0, abs=1e-3)
    # identical experts: SBA == linear (the two outputs are aligned)
    set_aggregation(st, "sba")
    torch.testing.assert_close(st.encode(TEXTS, convert_to_tensor=True), ref, atol=1e-5, rtol=1e-5)
    # nomic's unnormalised top-2 shrinks the FFN output by s = w1 + w2 < 1: no longer MiniLM
    st2 = build_moe_minilm(init="sparse", renormalize=False)
    assert (st2.encode(TEXTS, convert_to_tensor=True) - ref).abs().max() > 1e-3
    with pytest.raises(ValueError, match="bogus"):
        set_aggregation(st, "bogus")


def test_geometry_on_copies_and_padding_is_excluded():
    st = build_moe_minilm(init="sparse", renormalize=False)
    texts = {"a": TEXTS[:2], "b": TEXTS[2:]}
    geo, counts = collect_geometry(st, st_forward_fn(st, batch_size=4), texts)
    n_real = {d: int(sum(st.tokenize(t)["attention_mask"].sum() for t in [v])) for d, v in texts.items()}
    per = geo.groupby(["domain", "layer"]).size()
    for (d, _), n in per.items():
        assert n == n_real[d]  # one row per real token, padding left out
    np.testing.assert_allclose(geo.angle_deg, 0.0, atol=0.1)  # copied experts: 0 degrees
    np.testing.assert_allclose(geo.norm_ratio, 1.0, atol=1e-4)
    np.testing.assert_allclose(geo.ratio_linear, geo.weight_sum, rtol=1e-4)  # only the weight sum shrinks
    assert counts.groupby(["domain", "layer"])["count"].sum().eq(
        pd.Series({k: 2 * v for k, v in n_real.items()}).reindex(
            counts.groupby(["domain", "layer"])["count"].sum().index.get_level_values(0)).values).all()
    j = routing_jsd(counts)
    assert (j.jsd_bits >= 0).all() and (j.jsd_bits <= 1 + 1e-9).all()


def test_mnrl_loss_matches_sentence_transformers(minilm):
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    pairs = [("a man plays guitar", "someone is playing music"), ("a cat sleeps", "an animal is resting"),
             ("it rains", "the weather is wet")]
    batch = PairCollate(minilm.tokenize)(pairs)
    minilm.eval()
    for scale in (20.0, 1.0):
        ours, m = mnrl_loss(minilm, batch, scale=scale)
        ref = MultipleNegativesRankingLoss(minilm, scale=scale)([batch["anchor"], batch["positive"]], None)
        assert float(ours.detach()) == pytest.approx(float(ref.detach()), rel=1e-4, abs=1e-6)
    assert m["aux"] == 0.0  # dense model: no balancing loss
    triplets = [p + (n,) for p, n in zip(pairs, ["a dog barks", "nobody plays", "sunny day"])]
    batch = PairCollate(minilm.tokenize)(triplets)
    ours, _ = mnrl_loss(minilm, batch, scale=20.0)
    ref = MultipleNegativesRankingLoss(minilm, scale=20.0)(
        [batch["anchor"], batch["positive"], batch["negative"]], None)
    assert float(ours.detach()) == pytest.approx(float(ref.detach()), rel=1e-4, abs=1e-6)
    with pytest.raises(ValueError, match="lengths"):
        PairCollate(minilm.tokenize)([("a",)])


# ----------------------------------------------------------------------------------------------------------------------
# paper profile readers on tiny data in the upstream formats
# ----------------------------------------------------------------------------------------------------------------------
def _toy_encode(texts):
    """Bag of characters (deterministic, no model)."""
    out = np.zeros((len(texts), 64))
    for i, t in enumerate(texts):
        for ch in t.lower():
            out[i, ord(ch) % 64] += 1
    return out + 1e-3


def test_paper_profile_readers(tmp_path):
    from moelab.assets import MissingAsset

    with pytest.raises(MissingAsset, match="all-nli"):
        load_allnli_triplets(tmp_path / "nope")
    with pytest.raises(MissingAsset, match="STSBenchmark"):
        load_mteb_local(tmp_path / "nope")
    nli = tmp_path / "all-nli" / "triplet"
    nli.mkdir(parents=True)
    pd.DataFrame({"anchor": ["a", "b"], "positive": ["c", "d"], "negative": ["e", "f"]}).to_parquet(
        nli / "train-00000-of-00001.parquet")
    assert load_allnli_triplets(tmp_path / "all-nli") == [("a", "c", "e"), ("b", "d", "f")]
    pd.DataFrame({"anchor": ["a"], "text": ["c"]}).to_parquet(nli / "dev-00000-of-00001.parquet")
    with pytest.raises(ValueError, match="no field 'positive'"):
        load_allnli_triplets(tmp_path / "all-nli", split="dev")

    root = tmp_path / "mteb"
    for t in ("STSBenchmark", "StackExchangeClustering", "SprintDuplicateQuestions"):
        (root / t).mkdir(parents=True)
    pd.DataFrame({"sentence1": ["aaa", "abc", "xyz", "hello"], "sentence2": ["aab", "abd", "qqq", "help"],
                  "score": [5.0, 4.0, 0.0, 3.0]}).to_json(root / "STSBenchmark" / "test.jsonl.gz", orient="records",
                                                          lines=True, compression="gzip")
    pd.DataFrame({"sentences": [["aaaa", "aaab", "zzzz", "zzzy"]], "labels": [["x", "x", "y", "y"]]}).to_json(
        root / "StackExchangeClustering" / "test.jsonl.gz", orient="records", lines=True, compression="gzip")
    pd.DataFrame({"sentence1": [["abc", "hello", "zzz"]], "sentence2": [["abd", "qqqq", "zzy"]],
                  "labels": [[1, 0, 1]]}).to_json(root / "SprintDuplicateQuestions" / "test.jsonl.gz",
                                                  orient="records", lines=True, compression="gzip")
    tasks = load_mteb_local(root)
    res = evaluate_mteb_with_items(_toy_encode, tasks)[0].set_index("benchmark").score
    assert res["STSBenchmark"] > 0.5
    assert res["StackExchangeClustering"] == pytest.approx(1.0)
    assert res["SprintDuplicateQuestions"] == pytest.approx(1.0)


@pytest.mark.slow
def test_wordnet_subjects():
    pytest.importorskip("moelab.assets")
    from moelab.assets import MissingAsset

    try:
        d = wordnet_subject_texts(num_subjects=20, per_subject=3)
    except MissingAsset as e:
        pytest.skip(str(e))
    assert len(d) == 20 and all(len(v) == 3 for v in d.values())
    assert all(":" in t for v in d.values() for t in v)
    with pytest.raises(ValueError, match="num_subjects"):
        wordnet_subject_texts(num_subjects=0)


def test_table_one():
    rows = []
    for agg, shift in (("linear", 0.0), ("sba", 0.05)):
        for seed in range(3):
            rows.append(dict(benchmark="sts", metric="cosine_spearman", score=0.5 + shift + 0.001 * seed,
                             ci_low=0.4, ci_high=0.6, aggregation=agg, seed=seed))
            for m in ("recall@1_a2b", "recall@1_b2a"):
                rows.append(dict(benchmark="ret", metric=m, score=0.3 - shift, ci_low=0.2, ci_high=0.4,
                                 aggregation=agg, seed=seed))
    scores = pd.DataFrame(rows)
    t = table_one(scores).set_index(["aggregation", "benchmark"])
    assert set(t.index.get_level_values(1)) == {"sts", "ret/recall@1_a2b", "ret/recall@1_b2a"}
    assert t.loc[("sba", "sts"), "mean"] == pytest.approx(55.1)
