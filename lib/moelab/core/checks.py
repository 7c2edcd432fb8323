"""Value checks that cost no host sync on a GPU (issue 50).

A check such as ``bool((idx < E).all())`` copies one value to the host, which on CUDA waits for every kernel queued
before it: the CPU stops running ahead of the GPU, once per check, per layer, per step. :func:`require` keeps the CPU
behaviour (``ValueError`` at once, what the tests check) and drops the wait on CUDA.
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["require"]


def require(ok: torch.Tensor, message: str | Callable[[], str]) -> None:
    """Raise ``ValueError(message)`` unless the bool scalar ``ok`` is True; on CUDA a device-side assert instead.

    On CUDA: ``torch._assert_async``, no host sync; a failure stops the next synchronising call and ends the
    process's CUDA context, as an out-of-range index in torch's own kernels does. So: for programming errors such as
    indices out of range, not for data-dependent conditions (NaN values: check those on the CPU only, and let the
    trainer's loss check report them on CUDA). ``message`` may be a callable, called only when the check fails on the
    CPU (a message that reads tensor values costs nothing when the check passes)."""
    if ok.device.type == "cuda":
        torch._assert_async(ok, message if isinstance(message, str) else "moelab: value check failed")
        return
    if not bool(ok):
        raise ValueError(message() if callable(message) else message)
