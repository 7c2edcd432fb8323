"""An executed notebook as Markdown beside its published figures.

Every run of the runner (``moelab.runner.cli``) writes ``notebook.md`` into the run's output folder, and a published run
does so inside the staging folder, so the Markdown is swapped into ``figures/<nb>/`` (or ``full/``, ``paper/``) in the
same renames as the figures. GitHub then shows the narrative, tables, plots and computed sentences of the committed
run. Figures appear through the figure helper: under the runner ``run.savefig`` displays a link to the PNG it wrote
(same folder); any other image output lands in ``notebook_files/`` beside the Markdown.

What is left out as noise: papermill's injected-parameters cell (its values replace the parameters cell's, so the
Markdown shows what the run used), stderr (progress bars, warnings), widget outputs, terminal escape codes, and
carriage-return redraws (only the last state of a line is kept).
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import nbformat
from nbconvert import MarkdownExporter

MD_NAME = "notebook.md"
FILES_DIR = "notebook_files"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_STYLE = re.compile(r"<style[^>]*>.*?</style>\n?", re.S)
_WIDGETS = ("application/vnd.jupyter.widget-view+json", "application/vnd.jupyter.widget-state+json")


def clean_text(text: str) -> str:
    """Terminal output as a reader sees it: escape codes removed, each line's carriage-return redraws reduced to the
    last one."""
    lines = _ANSI.sub("", text).split("\n")
    return "\n".join(line.rstrip("\r").split("\r")[-1] for line in lines)


def _clean_outputs(outputs: list) -> list:
    kept = []
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            if out.get("name") != "stdout":
                continue
            out["text"] = clean_text(out["text"])
            if not out["text"].strip():
                continue
        elif kind == "error":
            out["traceback"] = [clean_text(t) for t in out.get("traceback", [])]
        elif kind in ("display_data", "execute_result"):
            if any(k in out.get("data", {}) for k in _WIDGETS):   # a widget (a progress bar): its text is "HBox(...)"
                continue
            data = dict(out.get("data", {}))
            if isinstance(data.get("text/plain"), str):
                data["text/plain"] = clean_text(data["text/plain"])
            out["data"] = data
        kept.append(out)
    return kept


def clean_notebook(nb):
    """The executed notebook without papermill's noise (see the module docstring); returns a new notebook."""
    nb = nbformat.from_dict(nb)
    injected = [c for c in nb.cells if "injected-parameters" in c.get("metadata", {}).get("tags", [])]
    cells = []
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if "injected-parameters" in tags:
            continue
        if "parameters" in tags and injected:   # show the values the run used
            src = "".join(c.source for c in injected)
            cell.source = "\n".join(line for line in src.splitlines() if line.strip() != "# Parameters").strip()
        cell.metadata = {k: v for k, v in cell.metadata.items() if k not in ("papermill", "execution")}
        if cell.cell_type == "code":
            cell.outputs = _clean_outputs(cell.get("outputs", []))
        cells.append(cell)
    nb.cells = cells
    nb.metadata.pop("papermill", None)
    return nb


def write_notebook_md(ipynb: Path, folder: Path) -> Path:
    """Write ``folder/notebook.md`` (and ``folder/notebook_files/`` when the notebook has image outputs) from the
    executed notebook ``ipynb``, replacing earlier ones by renames. Returns the Markdown's path."""
    folder = Path(folder)
    nb = clean_notebook(nbformat.read(str(ipynb), as_version=4))
    body, resources = MarkdownExporter().from_notebook_node(
        nb, resources={"output_files_dir": FILES_DIR, "unique_key": "notebook"})
    files = folder / FILES_DIR
    tmp_files = folder / f".{FILES_DIR}.tmp-{os.getpid()}"
    shutil.rmtree(tmp_files, ignore_errors=True)
    for name, data in (resources.get("outputs") or {}).items():
        dest = tmp_files / Path(name).relative_to(FILES_DIR)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    old = folder / f".{FILES_DIR}.old-{os.getpid()}"
    if files.exists():
        os.replace(files, old)
    if tmp_files.exists():
        os.replace(tmp_files, files)
    shutil.rmtree(old, ignore_errors=True)
    body = _STYLE.sub("", body)   # pandas' scoped <style> blocks: GitHub shows their text
    md = folder / MD_NAME
    tmp = folder / f".{MD_NAME}.tmp-{os.getpid()}"
    tmp.write_text(body.rstrip() + "\n")
    os.replace(tmp, md)
    return md
