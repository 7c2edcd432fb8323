"""``moelab.cluster_upcycling`` exports the names notebook 03 calls and nothing else but its submodules and the few
names files outside the package still read through it (listed in ``OUTSIDE_USERS``); every ``cu.X`` the notebook,
the tests and scripts/tune_03.py use resolves; imports sit at the top of each file."""
import ast
import re

import pytest

from moelab import cluster_upcycling as cu

from helpers import ROOT

PKG = ROOT / "lib" / "moelab" / "cluster_upcycling"
SUBMODULES = ("config", "method", "data", "analysis", "experiment", "report", "claims", "clip", "standins")
FILES = ["__init__.py", "config.py", "method.py", "data.py", "analysis.py", "experiment.py", "report.py", "clip.py",
         "standins.py"]


def _notebook_names() -> set[str]:
    nb = (ROOT / "notebooks" / "03_cluster_upcycling.py").read_text()
    return set(re.findall(r"\bcu\.([A-Za-z_]\w*)", nb)) - set(SUBMODULES)


def test_the_package_exports_the_notebooks_names_only():
    assert set(cu.__all__) == _notebook_names()


def test_names_read_from_outside_the_package_are_listed():
    public = {n for n in vars(cu) if not n.startswith("_") and n != "OUTSIDE_USERS"}
    assert public - set(cu.__all__) - set(cu.OUTSIDE_USERS) <= set(SUBMODULES)
    assert not set(cu.OUTSIDE_USERS) & set(cu.__all__)


def test_all_is_complete_and_unique():
    assert len(cu.__all__) == len(set(cu.__all__))
    assert all(hasattr(cu, n) for n in cu.__all__)


def test_every_submodule_name_resolves():
    for mod in ("method", "data", "analysis", "experiment", "report", "config", "clip"):
        sub = getattr(cu, mod)
        assert sub.__all__ and all(hasattr(sub, n) for n in sub.__all__), mod


@pytest.mark.parametrize("user", ["notebooks/03_cluster_upcycling.py", "tests/cluster_upcycling/test_method.py",
                                  "tests/cluster_upcycling/test_analysis.py", "tests/cluster_upcycling/test_phase_b.py",
                                  "tests/cluster_upcycling/test_vision.py", "scripts/tune_03.py"])
def test_every_cu_name_used_resolves(user):
    used = set(re.findall(r"\bcu\.([A-Za-z_]\w*)", (ROOT / user).read_text())) - set(SUBMODULES)
    assert not [n for n in sorted(used) if not hasattr(cu, n)]


@pytest.mark.parametrize("fname", FILES)
def test_imports_at_the_top(fname):
    tree = ast.parse((PKG / fname).read_text())
    inner = [f"line {n.lineno}" for top in tree.body if not isinstance(top, (ast.Import, ast.ImportFrom))
             for n in ast.walk(top) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert inner == [], f"{fname}: imports inside functions or classes at {inner}"
