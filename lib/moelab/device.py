"""Where a model runs for inference, and in which precision: the GPU when there is one.

The rule is :func:`moelab.train.resolve_device`'s (CUDA when a device is visible, bf16 where it supports it), applied
to a model that only scores: on CUDA the weights are held in bf16 (fp16 on a GPU without bf16), on the CPU in fp32
with every core's thread. Notebook 05's ``paper`` profile loads its local checkpoint through it
(``moelab.free_moe.load_model(..., device="auto")`` calls)::

    model, tok = moelab.device.load_for_inference(load_local_model, MODEL_PATH)

which prints what it uses, e.g. "model on cuda:0 (NVIDIA H100 80GB HBM3) in torch.bfloat16".
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

from moelab.train import resolve_device


@dataclass(frozen=True)
class Placement:
    """A device, the dtype the weights are held in there, and the CPU threads torch uses."""
    device: str
    dtype: torch.dtype
    threads: int
    name: str

    def describe(self) -> str:
        where = f"{self.device} ({self.name})" if self.device.startswith("cuda") else "cpu"
        return f"model on {where} in {self.dtype}, {self.threads} CPU thread(s)"

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move ``model`` to this device and dtype (and set torch's CPU threads); returns it."""
        torch.set_num_threads(self.threads)
        return model.to(device=self.device, dtype=self.dtype)


def inference_placement(device: str = "auto", *, cuda_available: bool | None = None,
                        bf16_supported: bool | None = None) -> Placement:
    """The placement for inference: CUDA device 0 in bf16 (fp16 without bf16 support) when CUDA is visible (or
    ``device="cuda"``), else the CPU in fp32 with :func:`cpu_threads` threads (one per core unless ``OMP_NUM_THREADS`` pins it). ``cuda_available``/``bf16_supported`` replace
    the probes of this machine (tests)."""
    dev, mixed = resolve_device(device, "auto", cuda_available=cuda_available, bf16_supported=bf16_supported)
    if dev == "cuda":
        has = torch.cuda.is_available() if cuda_available is None else cuda_available
        name = torch.cuda.get_device_name(0) if has and torch.cuda.is_available() else "CUDA device"
        return Placement("cuda:0", torch.bfloat16 if mixed == "bf16" else torch.float16,
                         torch.get_num_threads(), name)
    return Placement("cpu", torch.float32, cpu_threads(), "cpu")


def cpu_threads() -> int:
    """Torch CPU threads for inference: ``OMP_NUM_THREADS`` when set (a runner lane pins its kernel to one thread,
    issue 49, and ``make verify`` to the committed run's count), else one per core."""
    raw = os.environ.get("OMP_NUM_THREADS", "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            raise ValueError(f"OMP_NUM_THREADS={raw!r} is not a whole number of threads: unset it or set e.g. 1") from None
        if n >= 1:
            return n
    return os.cpu_count() or 1


def load_for_inference(loader: Callable, *args, device: str = "auto", log: Callable | None = print, **kwargs):
    """Call ``loader(*args, dtype=<placement dtype>, **kwargs)`` (it returns a model, or a tuple whose first item is
    the model), move the model to :func:`inference_placement`'s device, say where it runs, and return what the loader
    returned."""
    where = inference_placement(device)
    loaded = loader(*args, dtype=where.dtype, **kwargs)
    model = loaded[0] if isinstance(loaded, tuple) else loaded
    where.place(model)
    if log is not None:
        log(where.describe())
    return loaded
