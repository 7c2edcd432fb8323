"""``moelab.free_moe`` is a package in the STYLE.md shape (method / data / scoring / experiment /
report); every public name of the former module still imports from ``moelab.free_moe``, including each ``fm.X`` that
notebook 05 uses; imports sit at the top of each file; the only log-likelihood scorer is ``moelab.suite.scorer``."""
import ast
import re

import pytest

from moelab import free_moe as fm

from helpers import ROOT

PKG = ROOT / "lib" / "moelab" / "free_moe"
FILES = ["__init__.py", "method.py", "data.py", "scoring.py", "experiment.py", "report.py"]


def test_package_shape():
    assert not (ROOT / "lib" / "moelab" / "free_moe.py").exists()
    assert set(FILES) <= {p.name for p in PKG.glob("*.py")}


def test_every_former_name_imports_from_its_module():
    """The package exports what notebook 05 calls; every other name stays reachable through the module that defines
    it (``fm.method.patch_importance``), so a reader knows which file to open."""
    for mod in ("config", "method", "data", "scoring", "experiment", "report"):
        sub = getattr(fm, mod)
        assert sub.__all__ and all(hasattr(sub, n) for n in sub.__all__), mod


def test_notebook_names_resolve():
    nb = (ROOT / "notebooks" / "05_free_moe.py").read_text()
    used = set(re.findall(r"\bfm\.([A-Za-z_]\w*)", nb))
    assert used and not [n for n in sorted(used) if not hasattr(fm, n)]


def test_the_package_exports_the_notebooks_names_only():
    nb = (ROOT / "notebooks" / "05_free_moe.py").read_text()
    used = set(re.findall(r"\bfm\.([A-Za-z_]\w*)", nb))
    assert set(fm.__all__) == used - {"config", "method", "data", "scoring", "experiment", "report"}


def test_all_is_complete_and_unique():
    assert len(fm.__all__) == len(set(fm.__all__))
    assert all(hasattr(fm, n) for n in fm.__all__)


@pytest.mark.parametrize("fname", FILES)
def test_imports_at_the_top(fname):
    tree = ast.parse((PKG / fname).read_text())
    inner = [f"line {n.lineno}" for top in tree.body if not isinstance(top, (ast.Import, ast.ImportFrom))
             for n in ast.walk(top) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert inner == [], f"{fname}: imports inside functions or classes at {inner}"


def test_method_is_only_the_method_and_scoring_is_thin():
    method = (PKG / "method.py").read_text()
    for dep in ("moelab.cache", "moelab.suite", "moelab.progress", "matplotlib", "open("):
        assert dep not in method, dep                                     # no I/O, caching, scoring or plots
    src = "\n".join((PKG / f).read_text() for f in FILES)
    assert "log_softmax" not in src                                        # no second scorer
    assert "scorer.loglikelihood_tokens" in (PKG / "scoring.py").read_text()


def test_load_model_places_the_paper_model_by_the_inference_rule(monkeypatch, tmp_path, capsys):
    """05's paper path uses moelab.device's one placement rule (bf16 on a bf16 GPU, and says so); "cpu" keeps fp32."""
    import torch
    import moelab.device as mdev
    from moelab.free_moe import experiment as fx

    calls = []

    def fake_loader(path, dtype=torch.float32):
        calls.append((path, dtype))
        return torch.nn.Linear(2, 2).to(dtype), "tok"

    monkeypatch.setattr(fx, "load_local_model", fake_loader)
    model, tok, name, _ = fx.load_model("paper", tmp_path, device="cpu")
    assert calls[-1] == (tmp_path, torch.float32) and model.weight.dtype == torch.float32 and name == str(tmp_path)
    # a bf16 GPU, as inference_placement would choose it (the device is the CPU so that the test runs anywhere)
    monkeypatch.setattr(mdev, "inference_placement", lambda device="auto": mdev.Placement(
        "cpu", torch.bfloat16, torch.get_num_threads(), "a bf16 GPU"))
    model, *_ = fx.load_model("paper", tmp_path, device="auto")
    assert calls[-1][1] == torch.bfloat16 and model.weight.dtype == torch.bfloat16
    assert "in torch.bfloat16" in capsys.readouterr().out
