"""Tiny inputs for the cluster-upcycling text experiment (notebook 03); the tiny sentence encoder is the
``tiny_st`` fixture in tests/cluster_upcycling/conftest.py."""
import numpy as np


def tiny_pairs_and_bench(n_train: int = 40):
    """Word-pair train/test splits and a one-benchmark suite (an STS set over the test pairs) for text_experiment."""
    from moelab.suite.embed import Benchmark
    words = "cat dog river music bank money tree house car road rain sun".split()
    pairs = {"train": [(f"{a} {b}", f"{b} {a}") for a in words for b in words][:n_train],
             "test": [(f"{a} and {b}", f"{b} or {a}") for a, b in zip(words, words[1:])]}
    bench = {"tiny_sts": Benchmark("tiny_sts", "sts", [p[0] for p in pairs["test"]], [p[1] for p in pairs["test"]],
                                   gold=np.linspace(0, 1, len(pairs["test"])))}
    return pairs, bench
