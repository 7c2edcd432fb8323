"""GINC generator (moelab.mass.data) against its definition and a brute-force Bayes predictor (MASS notebook 04)."""
import itertools

import numpy as np
import pytest

from moelab.mass.data import (GINCConfig, bayes_labels, bayes_nll, build_ginc, predictive_probs, sample_documents,
                              sample_prompts)


@pytest.fixture(scope="module")
def g():
    return build_ginc(GINCConfig(seed=0))


def test_rows_are_stochastic(g):
    np.testing.assert_allclose(g.trans.sum(-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(g.property_trans.sum(-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(g.property_trans.sum(-2), 1.0, atol=1e-12)   # mixture of permutations: doubly stochastic
    np.testing.assert_allclose(g.entity_trans.sum(-1), 1.0, atol=1e-12)
    assert g.start.sum() == pytest.approx(1.0) and g.start.min() > 0
    assert g.start.max() / g.start.min() < 1.2                              # near-uniform (temperature 10)
    assert g.trans.shape == (10, 100, 100) and (g.trans >= 0).all()


def test_joint_is_kronecker_of_entity_and_property(g):
    c, v, s, v2, s2 = 3, 2, 5, 7, 1
    assert g.trans[c, v * 10 + s, v2 * 10 + s2] == pytest.approx(g.entity_trans[v, v2] * g.property_trans[c, s, s2])


def test_persistence(g):
    assert (np.diag(g.entity_trans) >= 0.9 - 1e-12).all()
    d = sample_documents(g, 2000, 40, seed=3)
    ent = g.entity_of(d["states"])
    stay = (ent[:, 1:] == ent[:, :-1]).mean()
    expected = np.diag(g.entity_trans).mean()
    assert abs(stay - expected) < 0.01


def test_deterministic_emissions_and_delimiter(g):
    d = sample_documents(g, 200, 30, seed=4)
    ent, prop = g.entity_of(d["states"]), g.property_of(d["states"])
    np.testing.assert_array_equal(d["tokens"], g.memory[ent, prop])
    assert (d["tokens"][prop == 0] == 0).all() and (d["tokens"][prop != 0] != 0).all()
    assert set(np.unique(d["concept"])) <= set(range(5))                   # only in-distribution concepts


def test_seeded_and_exact():
    a, b = build_ginc(GINCConfig(seed=5)), build_ginc(GINCConfig(seed=5))
    np.testing.assert_array_equal(a.trans, b.trans)
    np.testing.assert_array_equal(a.memory, b.memory)
    assert not np.array_equal(a.trans, build_ginc(GINCConfig(seed=6)).trans)
    np.testing.assert_array_equal(sample_documents(a, 5, 9, seed=1)["tokens"], sample_documents(b, 5, 9, seed=1)["tokens"])


def _brute_force_predictive(g, x):
    """p(x_{t+1} | x_{1:t}) by enumerating every hidden path and concept (uniform prior on in-distribution ones)."""
    H, K, L = g.n_states, g.cfg.n_symbols, len(x)
    out = np.zeros((L, K))
    for t in range(L):
        joint = np.zeros(K)
        for c in g.train_concepts:
            for path in itertools.product(range(H), repeat=t + 2):
                p = g.start[path[0]] * np.prod([g.trans[c, path[i], path[i + 1]] for i in range(t + 1)])
                if p == 0 or any(g.state_symbol[path[i]] != x[i] for i in range(t + 1)):
                    continue
                joint[g.state_symbol[path[t + 1]]] += p
        out[t] = joint / joint.sum()
    return out


def test_bayes_labels_equal_brute_force_posterior_predictive():
    tiny = build_ginc(GINCConfig(n_entities=2, n_properties=3, n_symbols=5, n_concepts=3, n_train_concepts=2,
                                 seed=1))
    docs = sample_documents(tiny, 6, 4, seed=2)["tokens"]
    probs = predictive_probs(tiny, docs)
    labels = bayes_labels(tiny, docs)
    for i in range(len(docs)):
        ref = _brute_force_predictive(tiny, docs[i])
        np.testing.assert_allclose(probs[i], ref, atol=1e-10)
        np.testing.assert_array_equal(labels[i], ref.argmax(-1))


def test_bayes_nll_is_a_floor(g):
    docs = sample_documents(g, 64, 20, seed=7)["tokens"]
    nll = bayes_nll(g, docs)
    assert nll.shape == (64,) and np.isfinite(nll).all()
    assert 0 < nll.mean() < np.log(g.cfg.n_symbols)


def test_prompts_follow_ginc_format(g):
    pr = sample_prompts(g, 20, n_examples=3, example_len=5, seed=0)
    assert pr["tokens"].shape == (20, 3 * 6 - 2)
    assert (pr["tokens"][:, 5] == 0).all() and (pr["tokens"][:, 11] == 0).all()  # delimiters between examples
    np.testing.assert_array_equal(pr["label"], pr["bayes_probs"].argmax(-1))
    np.testing.assert_allclose(pr["bayes_probs"].sum(-1), 1.0)
    again = sample_prompts(g, 20, n_examples=3, example_len=5, seed=0)
    np.testing.assert_array_equal(pr["tokens"], again["tokens"])


def test_bad_input(g):
    with pytest.raises(ValueError, match="n_train_concepts"):
        GINCConfig(n_concepts=3, n_train_concepts=5)
    with pytest.raises(ValueError, match="persistence"):
        GINCConfig(persistence=1.5)
    with pytest.raises(ValueError, match="tokens must lie"):
        predictive_probs(g, np.array([[1, 2, 99]]))
    with pytest.raises(ValueError, match="length"):
        sample_documents(g, 3, 0, seed=0)
    bad = np.array([[0, 0, 0, 0, 0, 0]])      # delimiters only: (v,0)->(v',0) needs A_prop[0,0] > 0
    if all(g.property_trans[c, 0, 0] == 0 for c in range(5)):
        with pytest.raises(ValueError, match="probability zero"):
            predictive_probs(g, bad)
