"""Embedding suite: MTEB metric definitions on hand-checked cases, WordNet reader, disjointness."""
import numpy as np
import pytest

from moelab.suite import embed, wordnet

DOG = ("02084071 05 n 03 dog 0 domestic_dog 0 Canis_familiaris 0 003 @ 02083346 n 0000 @ 01317541 n 0000 "
       "~ 01322604 n 0000 | a member of the genus Canis; \"the dog barked all night\"")


def test_parse_wordnet_line():
    s = wordnet.parse_line(DOG, "n")
    assert s.lemmas == ("dog", "domestic dog", "Canis familiaris")
    assert s.hypernyms == ("02083346", "01317541") and s.lexname == "noun.animal"
    assert s.definition == "a member of the genus Canis" and s.examples == ("the dog barked all night",)
    with pytest.raises(ValueError, match="malformed WordNet line"):
        wordnet.parse_line("0001 xx n", "n")


def test_path_similarity_hand_checked():
    S = lambda o, h: wordnet.Synset(o, "n", "noun.Tops", (o,), tuple(h), "", ())  # noqa: E731
    syn = {"root": S("root", []), "b": S("b", ["root"]), "a": S("a", ["b"]), "c": S("c", ["root"]), "x": S("x", [])}
    assert wordnet.path_similarity("a", "a", syn) == 1.0
    assert wordnet.path_similarity("a", "b", syn) == 0.5
    assert wordnet.path_similarity("a", "c", syn) == pytest.approx(1 / 4)  # a-b-root-c: 3 edges
    assert wordnet.path_similarity("a", "x", syn) == 0.0


def test_sts_spearman():
    gold = np.array([0.1, 0.5, 0.9])
    ea = np.array([[1.0, 0.0]] * 3)
    eb = np.array([[0.0, 1.0], [1.0, 1.0], [1.0, 0.1]])  # cosines increase with gold
    assert embed.sts_spearman(ea, eb, gold) == pytest.approx(1.0)
    assert embed.sts_spearman(ea, eb[::-1], gold) == pytest.approx(-1.0)


def test_cosine_ap_hand_computed():
    ea = np.array([[1.0, 0.0]] * 3)
    eb = np.array([[0.9, np.sqrt(1 - 0.81)], [0.8, 0.6], [0.7, np.sqrt(1 - 0.49)]])  # cos 0.9, 0.8, 0.7
    # ranking: pos, neg, pos -> AP = (1/1 + 2/3) / 2
    assert embed.cosine_ap(ea, eb, np.array([1, 0, 1])) == pytest.approx((1 + 2 / 3) / 2)


def test_recall_at_1_both_directions():
    q = np.eye(3)
    c = np.array([[1.0, 0, 0], [0, 0, 1.0], [0, 1.0, 0]])  # items 1 and 2 swapped
    a2b, b2a = embed.recall_at_1(q, c)
    assert a2b.tolist() == [1, 0, 0] and b2a.tolist() == [1, 0, 0]
    c2 = np.array([[1.0, 0, 0], [1.0, 0.1, 0], [0, 0, 1.0]])  # query 1 -> corpus 0 wins? no: cos(q1, c1) > cos(q1, c0)
    a2b, b2a = embed.recall_at_1(q, c2)
    assert a2b.tolist() == [1, 1, 1] and b2a.tolist() == [1, 0, 1]  # corpus 1 is closest to query 0


def test_v_measure_perfect_and_bad_encoder():
    rng = np.random.default_rng(0)
    labels = [0] * 20 + [1] * 20 + [2] * 20
    emb = np.eye(3)[labels] * 10 + rng.normal(0, 0.01, (60, 3))
    assert embed.v_measure(emb, labels) == pytest.approx(1.0)
    b = embed.Benchmark("t", "sts", ["a", "b"], ["c", "d"], np.array([0.1, 0.2]))
    with pytest.raises(ValueError, match="shape"):
        embed.evaluate(lambda t: np.zeros(3), {"t": b})
    with pytest.raises(ValueError, match="non-finite"):
        embed.evaluate(lambda t: np.full((len(t), 2), np.nan), {"t": b})


def test_smoke_benchmarks_and_pairs_are_disjoint():
    bms = embed.benchmarks("smoke")
    assert {b.kind for b in bms.values()} == {"sts", "clustering", "pairclass", "retrieval"}
    g = bms["wordnet_sts"].gold
    assert len(g) == 60 and 0 < g.min() and g.max() <= 1 and len(set(np.round(g, 3))) >= 4
    eval_texts = {t for b in bms.values() for t in b.all_texts()}
    prs = embed.pairs("smoke")
    assert all(prs[s] for s in ("train", "validation", "test"))
    train_texts = {t for a, p in prs["train"] for t in (a, p)}
    # definitions of evaluation synsets and held-out code never appear as training text
    assert not (train_texts & set(bms["wordnet_retrieval"].texts_b))
    assert not (train_texts & set(bms["code_retrieval"].texts_b))
    assert not (train_texts & set(bms["wordnet_sts"].texts_a))
    res = embed.evaluate(embed.random_encoder(), bms, n_boot=100)
    assert set(res.metric) == {"cosine_spearman", "v_measure", "cosine_ap", "recall@1_a2b", "recall@1_b2a"}


def test_committed_embedding_validation():
    import pandas as pd

    from pathlib import Path

    p = Path(embed.__file__).resolve().parents[3] / "data" / "embedding_validation.csv"
    df = pd.read_csv(p)
    assert set(df.encoder) == {"all-MiniLM-L6-v2", "bag-of-words (tf-idf)", "random"}
    assert set(df.profile) == {"default", "full"}
    mini = df[df.encoder == "all-MiniLM-L6-v2"]
    assert (mini.groupby("profile").size() == 8).all()
    assert (mini.ci_low <= mini.score).all() and (mini.score <= mini.ci_high).all()
    # the flag is recomputed from the table: MiniLM's CI lower end above every baseline's upper end
    base_hi = df[df.encoder != "all-MiniLM-L6-v2"].groupby(["profile", "benchmark", "metric"]).ci_high.max()
    flag = mini.ci_low.to_numpy() > base_hi.loc[list(zip(mini.profile, mini.benchmark, mini.metric))].to_numpy()
    assert (flag == mini.above_baselines.to_numpy()).all()
    # at full size every benchmark metric separates MiniLM from both baselines
    assert mini[mini.profile == "full"].above_baselines.all()
