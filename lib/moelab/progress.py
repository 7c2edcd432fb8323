"""One progress-bar helper for every long loop in moelab (issue 16, item 3: "progress a user can see").

Training steps (``moelab.train.train``, MASS's stacked loop), grid cells (loops over configurations and seeds) and
evaluation items all show a tqdm bar with the rate and an estimate of the time left, made here::

    for seed in progress.bar(seeds, desc="MASS seeds", unit="run"):
        ...
    with progress.bar(total=steps, desc="train", unit="step") as bar:
        ...; bar.update(1)

Where the bar goes is set by the environment variable ``MOELAB_PROGRESS``:

* unset or ``1`` (default): ``tqdm.auto``: a widget in JupyterLab, a text bar on stderr in a terminal;
* ``text``: a text bar on stderr even inside a Jupyter kernel (the notebook runner sets it: papermill forwards the
  kernel's stderr to the runner's terminal, where a widget would show nothing), redrawn at most every
  :data:`TEXT_MININTERVAL_S` seconds so that the executed notebook's stored output stays small;
* ``0``: no bars (``make test``, the smoke profile, ``--no-progress``).

Inner bars (a training run inside a grid cell) are transient (``leave=False`` when another bar is open), so a grid
cell ends with one line per grid bar. Introduced for every notebook (00-05) by the runner and the trainers.
"""
from __future__ import annotations

import os
from typing import Iterable

from tqdm import tqdm as text_tqdm
from tqdm.auto import tqdm as auto_tqdm

__all__ = ["ENV", "MODES", "mode", "enabled", "bar", "TEXT_MININTERVAL_S"]

ENV = "MOELAB_PROGRESS"
MODES = {"": "auto", "1": "auto", "auto": "auto", "text": "text", "0": "off"}
TEXT_MININTERVAL_S = 2.0


def mode() -> str:
    """``"auto"``, ``"text"`` or ``"off"`` from ``$MOELAB_PROGRESS``; another value raises ValueError naming it."""
    raw = os.environ.get(ENV, "").strip().lower()
    if raw not in MODES:
        raise ValueError(f"{ENV}={os.environ[ENV]!r} is not understood; use 0 (no bars), 1 (bars: widgets in "
                         f"JupyterLab, text in a terminal) or text (text bars on stderr everywhere)")
    return MODES[raw]


def enabled() -> bool:
    """Whether progress bars are shown: True unless ``MOELAB_PROGRESS=0``."""
    return mode() != "off"


def _open_bars() -> int:
    """Number of bars open now (tqdm keeps a set of live, enabled bars per class)."""
    live = set()
    for cls in (text_tqdm, auto_tqdm):
        live |= set(getattr(cls, "_instances", ()))
    return sum(1 for b in live if not getattr(b, "disable", True))


def bar(iterable: Iterable | None = None, total: int | float | None = None, desc: str | None = None,
        unit: str = "it", *, disable: bool | None = None, leave: bool | None = None, **kwargs):
    """A tqdm bar over ``iterable`` (or a manual bar of ``total`` units, advanced with ``.update(n)``).

    ``disable=None`` follows :func:`enabled`; ``True``/``False`` override it (a trainer's ``progress`` argument).
    ``total`` defaults to ``len(iterable)`` when it has one, so the bar shows the time left. ``leave=None``: the bar
    stays on screen when it is the outermost open bar and disappears otherwise. Other keyword arguments go to tqdm
    (e.g. ``initial``, ``postfix``). Returns the bar (an iterable and a context manager).
    """
    if total is not None and not (isinstance(total, (int, float)) and total >= 0):
        raise ValueError(f"total must be a number >= 0 or None, got {total!r}")
    if disable is not None and not isinstance(disable, bool):
        raise ValueError(f"disable must be True, False or None (follow {ENV}), got {disable!r}")
    m = mode()
    off = (m == "off") if disable is None else disable
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)
    if leave is None:
        leave = not _open_bars()
    cls = text_tqdm if m == "text" else auto_tqdm
    if m == "text":
        kwargs.setdefault("mininterval", TEXT_MININTERVAL_S)
    kwargs.setdefault("dynamic_ncols", True)
    return cls(iterable, total=total, desc=desc, unit=unit, disable=off, leave=leave, **kwargs)
