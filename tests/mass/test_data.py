"""The paper's in-context format, its Bayes floor, n-gram baselines and entity switching (moelab.mass.data; MASS
Sec. 4.1, notebook 04) against brute-force enumeration and plain counting loops."""
import itertools
from collections import Counter

import numpy as np
import pytest

from moelab.mass import (GINCConfig, NGram, build_ginc, ginc_settings, incontext_bayes, incontext_predictive,
                         ngram_baselines, sample_documents, sample_incontext, top_switch_share)


@pytest.fixture(scope="module")
def g():
    return build_ginc(GINCConfig(seed=0))


def _tiny(**kw):
    return build_ginc(GINCConfig(n_entities=2, n_properties=3, n_symbols=5, n_concepts=3, n_train_concepts=2,
                                 seed=1, **kw))


def test_incontext_format(g):
    d = sample_incontext(g, 40, n_examples=4, example_len=5, seed=0)
    N = 4 * 6 - 1
    assert d["tokens"].shape == d["states"].shape == d["target_mask"].shape == (40, N)
    assert (d["tokens"][:, [5, 11, 17]] == 0).all() and d["delim_mask"][:, [5, 11, 17]].all()
    assert d["target_mask"].sum(1).tolist() == [4] * 40 and d["target_mask"][:, [4, 10, 16, 22]].all()
    st = d["states"]
    for i in range(4):                                   # every example starts at (fresh entity, shared s0)
        first = st[:, i * 6]
        np.testing.assert_array_equal(g.property_of(first), d["start_property"])
        np.testing.assert_array_equal(g.entity_of(first), d["entity"][:, i])
    assert set(np.unique(d["start_property"])) <= set(range(1, 10)) and set(np.unique(d["concept"])) <= set(range(5))
    np.testing.assert_array_equal(d["tokens"], g.memory[g.entity_of(st), g.property_of(st)])
    again = sample_incontext(g, 40, n_examples=4, example_len=5, seed=0)
    np.testing.assert_array_equal(d["tokens"], again["tokens"])
    with pytest.raises(ValueError, match="example_len"):
        sample_incontext(g, 4, n_examples=2, example_len=1, seed=0)


def _brute_force(gt, n_examples, L):
    """Every (concept, s0, entities, hidden paths) with its probability -> (token sequences [M, N], probs [M])."""
    S, V = gt.cfg.n_properties, gt.cfg.n_entities
    H = gt.n_states
    seqs, probs = [], []
    for c in gt.train_concepts:
        for s0 in range(1, S):
            per_example = []                              # (tokens, prob) of one example given (c, s0)
            for v in range(V):
                for rest in itertools.product(range(H), repeat=L - 1):
                    path = (v * S + s0,) + rest
                    p = 1.0 / V
                    for a, b in zip(path[:-1], path[1:]):
                        p *= gt.trans[c, a, b]
                    if p > 0:
                        per_example.append(([int(gt.state_symbol[h]) for h in path], p))
            for combo in itertools.product(per_example, repeat=n_examples):
                toks, p = [], 1.0 / (len(gt.train_concepts) * (S - 1))
                for i, (t, q) in enumerate(combo):
                    toks += t + ([0] if i < n_examples - 1 else [])
                    p *= q
                seqs.append(toks)
                probs.append(p)
    return np.asarray(seqs), np.asarray(probs)


def test_bayes_predictive_equals_brute_force_enumeration():
    gt = _tiny()
    n_ex, L = 2, 3
    all_seqs, all_p = _brute_force(gt, n_ex, L)
    assert all_p.sum() == pytest.approx(1.0)
    d = sample_incontext(gt, 6, n_examples=n_ex, example_len=L, seed=3)
    probs = incontext_predictive(gt, d["tokens"], L)
    K = gt.cfg.n_symbols
    for x, pr in zip(d["tokens"], probs):
        for t in range(len(x)):
            prefix = (all_seqs[:, :t] == x[:t]).all(1)
            ref = np.array([all_p[prefix & (all_seqs[:, t] == k)].sum() for k in range(K)]) / all_p[prefix].sum()
            np.testing.assert_allclose(pr[t], ref, atol=1e-12)
    b = incontext_bayes(gt, d)
    p_tok = np.take_along_axis(probs, d["tokens"][..., None], -1)[..., 0]
    np.testing.assert_allclose(b["target_nll"], -np.log(p_tok[:, [L - 1, 2 * L]]).mean(1))
    np.testing.assert_allclose(b["full_nll"], -np.log(p_tok[:, 1:]).mean(1))


def test_bayes_floor_beats_ngrams_and_bad_input(g):
    tr = sample_incontext(g, 600, n_examples=4, example_len=5, seed=1)
    te = sample_incontext(g, 150, n_examples=4, example_len=5, seed=2)
    b = incontext_bayes(g, te)
    ng = ngram_baselines(tr, te, g.cfg.n_symbols)
    assert ng.name.tolist() == ["unigram", "bigram", "trigram"]
    assert b["target_nll"].mean() < ng.target_nll.min() and b["full_nll"].mean() < ng.full_nll.min()
    assert 0 <= b["target_acc"].mean() <= 1 and b["label"].shape == (150, 4)
    with pytest.raises(ValueError, match="example_len"):
        incontext_predictive(g, te["tokens"][:, :-1], 5)
    bad = te["tokens"].copy()
    bad[:, 5] = 3                                         # no delimiter where the format has one
    with pytest.raises(ValueError, match="delimiter"):
        incontext_predictive(g, bad, 5)


def _naive_ngram(train, mask, order, V, k):
    counts, ctx = Counter(), Counter()
    for seq, m in zip(train, mask):
        pad = [V] * (order - 1) + list(seq)
        for t, tok in enumerate(seq):
            if m[t]:
                u = tuple(pad[t: t + order - 1])
                counts[u + (tok,)] += 1
                ctx[u] += 1

    def prob(seq, t):
        pad = [V] * (order - 1) + list(seq)
        u = tuple(pad[t: t + order - 1])
        return (counts[u + (seq[t],)] + k) / (ctx[u] + k * V)
    return prob


@pytest.mark.parametrize("order", [1, 2, 3])
def test_ngram_matches_counting_loop(order):
    rng = np.random.default_rng(order)
    V, k = 6, 0.5
    train, test = rng.integers(0, V, (30, 9)), rng.integers(0, V, (7, 9))
    mask, tmask = rng.random((30, 9)) < 0.6, rng.random((7, 9)) < 0.5
    tmask[:, 0] = True
    m = NGram(order, V, k).fit(train, mask)
    ref = _naive_ngram(train, mask, order, V, k)
    for i, seq in enumerate(test):
        nll = [-np.log(ref(seq, t)) for t in range(9) if tmask[i, t]]
        assert m.nll(test, tmask)[i] == pytest.approx(np.mean(nll))
    np.testing.assert_allclose(m.probs(test).sum(-1), 1.0)
    with pytest.raises(ValueError, match="order"):
        NGram(0, V)


def test_entity_switching_options_and_top_switch_share():
    base = {s: build_ginc(GINCConfig(seed=0, entity_switch=s)) for s in ("t1", "ginc", "uniform")}
    old = build_ginc(GINCConfig(seed=0))
    np.testing.assert_array_equal(old.trans, base["t1"].trans)          # default unchanged
    for s, gg in base.items():
        np.testing.assert_array_equal(gg.memory, old.memory)
        np.testing.assert_array_equal(gg.property_trans, old.property_trans)
        np.testing.assert_allclose(gg.entity_trans.sum(1), 1.0)
        assert (np.diag(gg.entity_trans) >= 0.9 - 1e-12).all()
    assert top_switch_share(base["uniform"]) == pytest.approx(1 / 9)
    assert top_switch_share(base["ginc"]) > top_switch_share(base["t1"])
    A = base["t1"].entity_trans
    off = A - np.diag(np.diag(A))
    assert top_switch_share(base["t1"]) == pytest.approx(np.mean(off.max(1) / off.sum(1)))
    d = sample_documents(base["ginc"], 3000, 30, seed=0)
    assert abs(top_switch_share(base["ginc"], d["states"]) - top_switch_share(base["ginc"])) < 0.05
    with pytest.raises(ValueError, match="entity_switch"):
        GINCConfig(entity_switch="sticky")


def test_ginc_settings_table():
    s = ginc_settings()
    assert set(s.example_len) == {3, 5, 8, 10} and (s.tokens <= 1024).all()
    assert 256 in set(s[s.example_len == 3].n_examples) and 128 not in set(s[s.example_len == 10].n_examples)
    assert (s.prompts == 2500).all()
