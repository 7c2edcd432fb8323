"""Sandbox: hostile programs give bounded, recorded failures; pass@k against combinatorics."""
import itertools
from math import comb

import numpy as np
import pytest

from moelab.suite.sandbox import humaneval_program, pass_at_k, pass_at_k_exact, run_code


def test_passing_and_failing_programs():
    assert run_code("def f(x):\n    return x + 1\nassert f(1) == 2\nprint('ok')").passed
    r = run_code("assert 1 == 2, 'nope'")
    assert not r.passed and "AssertionError" in r.error and "nope" in r.error
    r = run_code("def f(:\n  pass")
    assert not r.passed and "SyntaxError" in r.error


@pytest.mark.parametrize("code, expect", [
    ("while True:\n    pass", "timeout"),
    ("import time\nwhile True:\n    time.sleep(0.5)", "timeout"),
    ("x = bytearray(10**10)", "MemoryError"),
    ("open('/etc/passwd').read()", "PermissionError"),
    ("open('out.txt', 'w').write('x')", "PermissionError"),
    ("import os\nos._exit(0)", "exited early"),
    ("import sys\nsys.exit(0)", "SystemExit"),
    ("import faulthandler\nfaulthandler._sigsegv()", "SIGSEGV"),
    ("import subprocess\nsubprocess.run(['ls'])", "PermissionError"),
])
def test_hostile_programs_fail_bounded(code, expect):
    r = run_code(code, timeout=1, memory_mb=256)
    assert not r.passed
    assert expect in r.error, r.error
    assert r.wall_s < 5


def test_bad_arguments():
    with pytest.raises(ValueError, match="timeout"):
        run_code("pass", timeout=0)
    with pytest.raises(ValueError, match="memory_mb"):
        run_code("pass", memory_mb=1)
    with pytest.raises(ValueError, match="code"):
        run_code(None)


def test_humaneval_program_checks_completion():
    prob = dict(prompt="def add(a, b):\n", test="def check(f):\n    assert f(2, 3) == 5\n", entry_point="add")
    assert run_code(humaneval_program(prob, "    return a + b\n")).passed
    assert not run_code(humaneval_program(prob, "    return a - b\n")).passed


def brute_force_pass_at_k(n, c, k):
    """Fraction of k-subsets of n samples (c correct) containing at least one correct sample."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n, c, k", [(5, 0, 1), (5, 1, 1), (5, 2, 2), (6, 3, 4), (7, 1, 7), (8, 5, 3), (4, 4, 2)])
def test_pass_at_k_matches_brute_force_and_closed_form(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(pass_at_k_exact(n, c, k), abs=1e-12)


def test_pass_at_k_large_n_and_pass_at_1():
    assert pass_at_k(200, 37, 1) == pytest.approx(37 / 200)
    assert pass_at_k(200, 37, 10) == pytest.approx(1 - comb(163, 10) / comb(200, 10))
    with pytest.raises(ValueError, match="k=3"):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError, match="c=4"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(np.float64(3), 1, 1)
