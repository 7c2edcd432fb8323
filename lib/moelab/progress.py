"""One progress-bar helper for every long loop in moelab ("progress a user can see").

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
* ``log``: plain lines, no carriage returns or terminal escape codes (a log file): one line per update, at most every
  :data:`LOG_MININTERVAL_S` seconds. The runner sets it when its own stderr is not a terminal; ``auto`` outside a
  Jupyter kernel behaves so too when stderr is not a terminal;
* ``0``: no bars (``make test``, the smoke profile, ``--no-progress``).

Inner bars (a training run inside a grid cell) are transient (``leave=False`` when another bar is open), so a grid
cell ends with one line per grid bar. Introduced for every notebook (00-05) by the runner and the trainers.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Iterable

from tqdm import tqdm as text_tqdm
from tqdm.auto import tqdm as auto_tqdm

__all__ = ["ENV", "MODES", "mode", "enabled", "bar", "TEXT_MININTERVAL_S", "LOG_MININTERVAL_S", "LineWriter"]

ENV = "MOELAB_PROGRESS"
MODES = {"": "auto", "1": "auto", "auto": "auto", "text": "text", "log": "log", "0": "off"}
TEXT_MININTERVAL_S = 2.0
LOG_MININTERVAL_S = 30.0
_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class LineWriter:
    """A file for tqdm that writes each redraw as its own plain line: terminal escape codes (cursor moves) are
    removed, carriage returns end a line, blank lines are dropped. For logs, where a redraw cannot overwrite."""

    def __init__(self, stream=None):
        self.stream = stream

    def write(self, s: str) -> int:
        out = sys.stderr if self.stream is None else self.stream
        for line in re.split(r"[\r\n]", _ESCAPE.sub("", s)):
            if line.strip():
                out.write(line.rstrip() + "\n")
        return len(s)

    def flush(self) -> None:
        (sys.stderr if self.stream is None else self.stream).flush()


def mode() -> str:
    """``"auto"``, ``"text"`` or ``"off"`` from ``$MOELAB_PROGRESS``; another value raises ValueError naming it."""
    raw = os.environ.get(ENV, "").strip().lower()
    if raw not in MODES:
        raise ValueError(f"{ENV}={os.environ[ENV]!r} is not understood; use 0 (no bars), 1 (bars: widgets in "
                         f"JupyterLab, text in a terminal), text (text bars on stderr everywhere) or log (plain lines)")
    m = MODES[raw]
    if m == "auto" and not _in_kernel() and not _isatty(sys.stderr):
        return "log"     # a script whose stderr goes to a file: no redraws there
    return m


def _in_kernel() -> bool:
    """Whether this runs inside a Jupyter kernel (where ``auto`` shows widgets)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


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
    cls = text_tqdm if m in ("text", "log") else auto_tqdm
    if m == "text":
        kwargs.setdefault("mininterval", TEXT_MININTERVAL_S)
    if m == "log":   # fixed width, ASCII, every redraw a line of its own
        kwargs.setdefault("mininterval", LOG_MININTERVAL_S)
        kwargs.setdefault("file", LineWriter())
        kwargs.setdefault("ascii", True)
        kwargs.setdefault("ncols", 100)
    else:
        kwargs.setdefault("dynamic_ncols", True)
    return cls(iterable, total=total, desc=desc, unit=unit, disable=off, leave=leave, **kwargs)
