"""JupyterLab's contents manager for the notebook sources: jupytext's, serving the kernel's ``language_info``
(without it every ``.py`` notebook is marked unsaved as soon as it opens).

Why a notebook opened dirty: once its kernel starts, Lab writes the kernel's ``language_info`` into the notebook's
metadata, and the ``.py`` header does not carry it (it holds the interpreter's version, which the committed sources must
not depend on), so the value changed from nothing to something: a modification. This manager adds, when it serves a
text notebook whose kernel is this interpreter's ``python3``, exactly the ``language_info`` that kernel will report;
Lab's update then changes nothing. A save still writes the header without it (``notebooks/jupytext.toml``'s filter),
so the file stays byte-identical.

Installed by ``make setup`` (``jupyter/jupyter_server_config.json`` as the venv's
``etc/jupyter/jupyter_server_config.json``; the ``.d`` folder there is read only for extension names) and named on
``make lab``'s command line.
"""
from __future__ import annotations

import copy

from jupytext.async_contentsmanager import AsyncTextFileContentsManager

KERNEL = "python3"


def kernel_language_info() -> dict:
    """The ``language_info`` ipykernel reports for this interpreter (``IPythonKernel.language_info``)."""
    from ipykernel.ipkernel import IPythonKernel   # the server's own kernel package; imported only when serving

    return copy.deepcopy(IPythonKernel.language_info)


class ContentsManager(AsyncTextFileContentsManager):
    """jupytext's contents manager; a served text notebook for this interpreter's kernel carries its language_info."""

    async def get(self, path, content=True, type=None, format=None, **kwargs):
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        nb = model.get("content") if model.get("type") == "notebook" else None
        if nb and not path.endswith(".ipynb") and nb["metadata"].get("kernelspec", {}).get("name") == KERNEL:
            nb["metadata"].setdefault("language_info", kernel_language_info())
        return model


