"""Notebooks 00, 01 and 03 read as method sections (STYLE.md): no ``def``, no ``lambda``, no ``cache.memo``, no loop
longer than 3 lines, code cells of at most 10 lines; each shows its profile table printed from its configuration (so
the table is what runs), read in the derived-settings cell right after the ``parameters`` cell."""
from __future__ import annotations

import ast
import re

import pytest

from helpers import ROOT

NOTEBOOKS = ["00_moe_primer", "01_moce", "03_cluster_upcycling"]
MAX_CELL_LINES = 10
MAX_LOOP_LINES = 3


def code_cells(text: str) -> list[tuple[int, str]]:
    """(first line number, source) of every code cell of a jupytext percent notebook (markdown cells skipped)."""
    cells, start, buf, is_code = [], None, [], False
    for i, line in enumerate(text.splitlines() + ["# %%"], 1):
        if line.startswith("# %%"):
            if is_code and start is not None:
                cells.append((start, "\n".join(buf).strip("\n")))
            start, buf, is_code = i + 1, [], "[markdown]" not in line
        else:
            buf.append(line)
    return cells


def style_problems(text: str) -> list[str]:
    """Every breach of the notebook rules, as 'line N: what' (empty when the notebook follows them)."""
    bad = []
    for start, src in code_cells(text):
        n = len([ln for ln in src.splitlines() if ln.strip()])
        if n > MAX_CELL_LINES:
            bad.append(f"line {start}: code cell of {n} lines (> {MAX_CELL_LINES})")
        if re.search(r"\bmemo\s*\(", src):
            bad.append(f"line {start}: cache.memo in a notebook")
        for node in ast.walk(ast.parse(src)):
            where = f"line {start + getattr(node, 'lineno', 1) - 1}"
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                bad.append(f"{where}: def {node.name}")
            elif isinstance(node, ast.Lambda):
                bad.append(f"{where}: lambda")
            elif isinstance(node, (ast.For, ast.While)) and node.end_lineno - node.lineno + 1 > MAX_LOOP_LINES:
                bad.append(f"{where}: loop of {node.end_lineno - node.lineno + 1} lines (> {MAX_LOOP_LINES})")
    return bad


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_notebook_is_method_sections(nb):
    assert style_problems((ROOT / "notebooks" / f"{nb}.py").read_text()) == []


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_profile_table_printed_from_the_config_after_the_parameters_cell(nb):
    text = (ROOT / "notebooks" / f"{nb}.py").read_text()
    cells = code_cells(text)
    params = text.index('# %% tags=["parameters"]')
    derived = next(src for start, src in cells if text.count("\n", 0, params) < start - 1 and "start_run" in src)
    assert "profile_table(PROFILE)" in derived
    assert re.search(r"(config_for|profile)\(PROFILE[,)]", derived)
    assert "PROFILE ==" not in text and "PROFILE !=" not in text and "PROFILE in" not in text   # sizes, not names
    assert "profiles.select" not in text


def test_the_check_can_fail():
    nb = "# %%\nx = 1\n# %%\nf = lambda y: y\ndef g():\n    pass\nr = cache.memo('k', {}, g)\n" \
         "for i in range(3):\n    a = i\n    b = i\n    c = i\n# %% [markdown]\n" + "# prose\n" * 20 + \
         "# %%\n" + "z = 0\n" * 11
    got = style_problems(nb)
    assert any("lambda" in g for g in got) and any("def g" in g for g in got)
    assert any("memo" in g for g in got) and any("loop of 4 lines" in g for g in got)
    assert any("code cell of 11 lines" in g for g in got)
    assert style_problems("# %% [markdown]\n" + "# prose\n" * 30) == []
