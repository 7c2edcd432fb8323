"""The instruction mix notebook 01 trains on has balanced domains in every profile.

Rule, per profile and for the training and validation splits: every domain (maths, code, reasoning) has at least the
profile's stated minimum (``MIN_PER_DOMAIN``: smoke 40 / 5, default 250 / 40, full and paper 750 / 90 training /
validation records) and at least 0.8 x the largest domain (``instruct.BALANCE_RULE``). The unbalanced pools of
``instruct.build`` (kept for notebook 05) fail the same rule, so the test can fail. The notebook's selection
(``moce.subsample(..., by="domain")``) keeps the balance in every prefix."""
import collections

import pytest

from moelab import moce
from moelab.suite import instruct

MIN_PER_DOMAIN = {"smoke": (40, 5), "default": (250, 40), "full": (750, 90), "paper": (750, 90)}


def _check(counts, split, minimum):
    c = counts[counts.split == split].set_index("domain").n
    assert set(c.index) == set(instruct.DOMAINS)
    assert c.min() >= minimum, f"{split}: a domain has {c.min()} < {minimum} records ({c.to_dict()})"
    assert c.min() >= instruct.BALANCE_RULE["min_ratio"] * c.max(), f"{split}: unbalanced {c.to_dict()}"


@pytest.mark.parametrize("profile", ["smoke", "default", "full", "paper"])
def test_balanced_mix_meets_the_rule(profile):
    mix = instruct.build_balanced(profile)
    counts = instruct.domain_counts(mix)
    n_train, n_val = MIN_PER_DOMAIN[profile]
    _check(counts, "train", n_train)
    _check(counts, "validation", n_val)
    assert len(mix["test"]) == len(instruct.build(profile)["test"])      # the evaluation pool is kept whole
    # spread within a domain: maths half BIG-bench MC, half GSM-style; every reasoning training task contributes
    maths = collections.Counter(r["source"] for r in mix["train"] if r["domain"] == "maths")
    assert abs(maths["bigbench"] - maths["generated-gsm"]) <= 1
    tasks = {r["task"] for r in mix["train"] if r["domain"] == "reasoning"}
    assert tasks == set(instruct.REASONING_TRAIN_TASKS)


def test_the_rule_fails_on_the_unbalanced_pools():
    counts = instruct.domain_counts(instruct.build("default"))
    with pytest.raises(AssertionError, match="unbalanced"):
        _check(counts, "train", 1)


def test_balance_spreads_and_refuses_an_empty_domain():
    recs = ([dict(domain="maths", task="a", i=i) for i in range(10)] + [dict(domain="maths", task="gsm:t1", i=i)
                                                                         for i in range(3)]
            + [dict(domain="code", task="stdlib:x", i=i) for i in range(5)]
            + [dict(domain="reasoning", task=t, i=i) for t in "pq" for i in range(6)])
    mix = instruct.balance(dict(train=recs, validation=recs, test=[]), n_train=4, n_validation=100)
    c = instruct.domain_counts(mix).set_index(["split", "domain"]).n
    assert [c["train", d] for d in instruct.DOMAINS] == [4, 4, 4]
    assert [c["validation", d] for d in instruct.DOMAINS] == [5, 5, 5]          # bounded by the smallest pool (code)
    assert collections.Counter(r["task"] for r in mix["train"] if r["domain"] == "maths") == {"a": 2, "gsm:t1": 2}
    with pytest.raises(ValueError, match=r"no \['code'\] records"):
        instruct.balance(dict(train=[r for r in recs if r["domain"] != "code"], validation=recs, test=[]), 4, 4)


def test_stratified_subsample_keeps_every_prefix_balanced():
    items = [dict(domain=d, i=i) for d, n in (("maths", 50), ("code", 20), ("reasoning", 40)) for i in range(n)]
    sub = moce.subsample(items, 30, seed=0, by="domain")
    assert len(sub) == 30 and len({id(x) for x in sub}) == 30
    for n in (3, 9, 16, 30):
        c = collections.Counter(x["domain"] for x in sub[:n])
        assert max(c.values()) - min(c.values()) <= 1 and len(c) == 3
    short = moce.subsample(items, 90, seed=0, by="domain")                       # code has only 20
    assert collections.Counter(x["domain"] for x in short) == {"maths": 30, "code": 20, "reasoning": 30}
    assert moce.subsample(items, 30, seed=0, by="domain") == sub                  # seeded
