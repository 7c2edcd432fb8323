"""moelab.standins.relocated_params: stand-in parameters written in one place run from another (gpu_check --dry-run)."""
import ast
import re

import pytest

from moelab.standins import params_text, relocated_params


def _values(text: str) -> dict:
    out = {}
    # NAME=VALUE pairs, VALUE a Python literal (params_text's format): parse them back
    for m in re.finditer(r"(\w+)=((?:\{[^}]*\})|(?:'[^']*'))", text):
        out[m.group(1)] = ast.literal_eval(m.group(2))
    return out


def test_paths_move_under_the_new_folder(tmp_path):
    old = "/elsewhere/clone/runs/standins"
    params = {"MODEL_PATH": f"{old}/01/llama", "DATA_PATHS": {"slimorca": f"{old}/01/slimorca.jsonl",
                                                                "magicoder": f"{old}/01/magicoder.jsonl"},
              "SEED": 3}
    (tmp_path / "01.params").write_text(params_text(params) + "\n")
    got = relocated_params(tmp_path, "01")
    vals = _values(got)
    assert vals["MODEL_PATH"] == f"{tmp_path.resolve()}/01/llama"
    assert vals["DATA_PATHS"] == {"slimorca": f"{tmp_path.resolve()}/01/slimorca.jsonl",
                                  "magicoder": f"{tmp_path.resolve()}/01/magicoder.jsonl"}
    assert "SEED=3" in got and old not in got


def test_missing_params_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="make_paper_standins.py"):
        relocated_params(tmp_path, "04")
