"""One training loop for every notebook (Accelerate-based).

Introduced in ``notebooks/00_moe_primer.py`` (balancing-loss run) and used by every paper notebook
(MoCE 01, SBA 02, cluster-aware upcycling 03, MASS 04, Free-MoE 05) and by ``python -m moelab.launch``.

What it does (and what it leaves to Accelerate):

* Accelerate does device placement, DDP wrapping and gradient all-reduce, mixed-precision autocast (bf16 on a
  CUDA device that supports it, none on CPU), data sharding across processes (``split_batches=True``: the
  loader's batch size is the *global* batch, so a config means the same thing on 1 or N processes), the
  seedable shuffling sampler (the data order is a function of ``(seed, epoch)`` only) and the checkpoint files
  (model, optimiser, registered objects).
* Written here, each for a one-line reason:
  - gradient accumulation by hand (``no_sync`` + ``loss / grad_accum``): Accelerate's ``accumulate`` forces a
    sync at every epoch end, which would make an optimiser step depend on where the epoch boundary falls;
  - the learning-rate schedule as a plain function of the step written into every param group:
    ``LambdaLR`` fixes the number of param groups when built, and MASS adds groups while training;
  - exact resume: Accelerate restores RNG states at load time, but the data loader draws from the global RNG
    when an epoch's iterator is created, so the RNG state is captured *after* fetching the next micro-batch
    and restored after re-fetching it on resume (the resumed run then matches the uninterrupted one bit for bit
    on CPU, see ``tests/train/test_train.py``).

Per step: ``loss_fn`` on ``grad_accum`` micro-batches -> ``after_backward`` hook (gradients editable; MASS) ->
gradient clipping -> ``optimizer.step()`` -> ``after_step`` hook (EMA teachers) -> metrics row ->
optional evaluation (``eval_fn`` every ``eval_every`` steps, RNG forked so evaluation never changes training) ->
optional checkpoint.

Router gradient: at the logged steps (the first, every ``log_every``-th and the last) the gradient
of the *task* loss w.r.t. every router (``moelab.core.diagnostics``) is taken with ``torch.autograd.grad`` before the
step's backward pass, summed over micro-batches like the step's gradient and averaged over processes; its norm per
router goes to the history as ``router_grad_norm/<router module>`` and the largest as ``router_grad_norm`` (NaN at the
other steps). The task loss is ``metrics["task_loss"]`` when ``loss_fn`` returns it (a tensor attached to the graph:
the loss without balancing or other router regularisers), else the loss itself. A run whose router gradient is zero
at every logged step raises RuntimeError unless ``TrainConfig.router_frozen`` (recorded in the history).

Progress: a bar over the steps from :func:`moelab.progress.bar` (time left; ``progress=None``
follows ``MOELAB_PROGRESS``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd
import torch
from torch import nn

from moelab import progress as mprogress
from moelab.core import diagnostics

__all__ = ["TrainConfig", "TrainResult", "Hooks", "train", "flattened", "EMA", "lr_factor", "latest_checkpoint",
           "unwrap", "resolve_device"]

HOOK_NAMES = ("after_backward", "after_step", "on_eval", "on_save", "before_resume")
MIXED_PRECISION = ("auto", "no", "bf16", "fp16")
DECAYS = ("linear", "constant", "cosine")
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class TrainConfig:
    """Settings of one training run (the contract's ``TrainConfig``; extra fields have defaults).

    ``steps`` counts optimiser steps; each consumes ``grad_accum`` micro-batches from the loader (whose batch size
    is the global micro-batch across processes). ``warmup_frac`` of the steps warm the learning rate up linearly
    from ``lr/warmup_steps`` to ``lr``; afterwards ``decay`` ("linear" to 0, "constant", "cosine" to 0).
    ``mixed_precision="auto"`` = bf16 on a CUDA device that supports it, else none.
    ``progress``: a bar over the steps (None: follow ``moelab.progress.enabled()``, i.e. ``MOELAB_PROGRESS``).
    ``router_frozen``: the model's routers are frozen on purpose; a run whose routers get no task-loss gradient
    then does not fail (see the module docstring).
    ``ckpt_dir`` + ``ckpt_every`` > 0 write ``step_XXXXXXX`` checkpoints (the last ``keep_checkpoints`` kept);
    with ``resume=True`` a later call with the same ``ckpt_dir`` continues from the newest one.
    Weight decay applies to tensors with >= 2 dimensions only (not to biases and norms).
    """

    lr: float = 1e-3
    steps: int = 100
    grad_accum: int = 1
    warmup_frac: float = 0.0
    weight_decay: float = 0.0
    mixed_precision: str = "auto"
    seed: int = 0
    ckpt_dir: str | Path | None = None
    ckpt_every: int = 0
    log_every: int = 10
    max_grad_norm: float | None = None
    eval_every: int = 0
    decay: str = "constant"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    device: str = "auto"
    resume: bool = True
    keep_checkpoints: int = 2
    progress: bool | None = None
    desc: str = "train"
    router_frozen: bool = False

    def __post_init__(self):
        for name in ("steps", "grad_accum"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"TrainConfig.{name} must be an integer >= 1, got {v!r}")
        for name in ("ckpt_every", "log_every", "eval_every", "keep_checkpoints"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise ValueError(f"TrainConfig.{name} must be an integer >= 0, got {v!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"TrainConfig.lr must be a positive finite number, got {self.lr!r}")
        if not (0.0 <= self.warmup_frac < 1.0):
            raise ValueError(f"TrainConfig.warmup_frac must be in [0, 1), got {self.warmup_frac!r}")
        if not (self.weight_decay >= 0):
            raise ValueError(f"TrainConfig.weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"TrainConfig.mixed_precision must be one of {MIXED_PRECISION}, got {self.mixed_precision!r}")
        if self.decay not in DECAYS:
            raise ValueError(f"TrainConfig.decay must be one of {DECAYS}, got {self.decay!r}")
        if self.device not in DEVICES:
            raise ValueError(f"TrainConfig.device must be one of {DEVICES}, got {self.device!r}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"TrainConfig.max_grad_norm must be > 0 or None, got {self.max_grad_norm!r}")
        if self.progress is not None and not isinstance(self.progress, bool):
            raise ValueError(f"TrainConfig.progress must be True, False or None (follow MOELAB_PROGRESS), "
                             f"got {self.progress!r}")
        if not isinstance(self.router_frozen, bool):
            raise ValueError(f"TrainConfig.router_frozen must be True or False, got {self.router_frozen!r}")
        if self.ckpt_every and self.ckpt_dir is None:
            raise ValueError(f"TrainConfig.ckpt_every={self.ckpt_every} needs a ckpt_dir")
        self.betas = tuple(self.betas)

    @property
    def warmup_steps(self) -> int:
        return int(round(self.warmup_frac * self.steps))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TrainConfig":
        """Build from a (JSON) dict; unknown keys -> ValueError naming them."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown TrainConfig keys {unknown}; known: {sorted(names)}")
        return cls(**dict(d))


@dataclass
class Hooks:
    """Callbacks of :func:`train` (all optional).

    * ``after_backward(step, model, optimizer)``: gradients of the step are complete (summed over micro-batches,
      all-reduced across processes) and may be edited; the model and ``optimizer.param_groups`` may be changed
      (MASS duplicates experts here). ``model`` is the unwrapped model.
    * ``after_step(step, model)``: after ``optimizer.step()`` (EMA teachers).
    * ``on_eval(step, metrics)``: after each evaluation.
    * ``on_save(step, ckpt_path, model, optimizer)``: a checkpoint was written to ``ckpt_path`` (save extra files).
    * ``before_resume(step, ckpt_path, model, optimizer)``: before weights are loaded on resume (re-grow a model).
    ``step`` is 1-based: the number of optimiser steps done including the current one.
    """

    after_backward: Callable | None = None
    after_step: Callable | None = None
    on_eval: Callable | None = None
    on_save: Callable | None = None
    before_resume: Callable | None = None

    @classmethod
    def coerce(cls, hooks) -> "Hooks":
        if hooks is None:
            return cls()
        if isinstance(hooks, cls):
            return hooks
        if isinstance(hooks, Mapping):
            unknown = sorted(set(hooks) - set(HOOK_NAMES))
            if unknown:
                raise ValueError(f"unknown hook names {unknown}; known: {list(HOOK_NAMES)}")
            for k, v in hooks.items():
                if v is not None and not callable(v):
                    raise ValueError(f"hook {k!r} is not callable: {v!r}")
            return cls(**hooks)
        raise ValueError(f"hooks must be a dict or Hooks, got {type(hooks).__name__}")


@dataclass
class TrainResult:
    """What :func:`train` returns: the unwrapped ``model``, the per-step ``history`` (one row per optimiser step:
    ``step, loss, lr`` (of the first param group), ``grad_norm`` (before clipping) and every metric ``loss_fn`` returned; vectors as ``name_0, name_1, ...``;
    models with routers add ``router_grad_norm``, ``router_grad_norm/<router>`` and ``router_frozen``),
    ``eval_history`` (one row per evaluation), ``resumed_from`` (step, or 0) and ``wall_s`` (this call)."""

    model: nn.Module
    history: pd.DataFrame
    eval_history: pd.DataFrame
    resumed_from: int = 0
    wall_s: float = 0.0
    optimizer: Any = None
    num_processes: int = 1

    def flattened(self, **kw) -> tuple[bool, float]:
        return flattened(self.history["loss"].to_numpy(), **kw)


# ----------------------------------------------------------------------------------------------------------
# schedule, criteria, EMA


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Learning-rate multiplier of optimiser step ``step`` (0-based): linear warmup, then ``cfg.decay``."""
    w = cfg.warmup_steps
    if w and step < w:
        return (step + 1) / w  # lr_t = lr * (t+1)/W  during warmup
    if cfg.decay == "constant":
        return 1.0
    progress = (step - w) / max(1, cfg.steps - w)  # in [0, 1)
    if cfg.decay == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def flattened(losses, window_frac: float = 0.2, tol: float = 0.02) -> tuple[bool, float]:
    """The suite's "trained until flattened" criterion.

    The loss is smoothed by a trailing mean over ``s = max(1, m // 2)`` steps, ``m = round(window_frac * n)``;
    ``relative_fall = (L̄_start - L̄_end) / |L̄_start|`` between the smoothed loss where the last ``m`` steps begin
    and at the end. Flattened when ``0 <= relative_fall < tol`` (e.g. the smoothed loss fell by less than 2 % over
    the last 20 % of the steps); a loss that went up (``relative_fall < 0``: over-fitting or instability) is never
    "flattened". Returns ``(flattened, relative_fall)``.
    """
    x = np.asarray(losses, dtype=float).ravel()
    if not (0 < window_frac < 1):
        raise ValueError(f"window_frac must be in (0, 1), got {window_frac!r}")
    if not tol >= 0:
        raise ValueError(f"tol must be >= 0, got {tol!r}")
    m = max(1, int(round(window_frac * len(x))))
    s = max(1, m // 2)
    if len(x) < m + s:
        raise ValueError(f"need at least {m + s} losses for window_frac={window_frac}, got {len(x)}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"losses contain non-finite values (first at index {int(np.argmin(np.isfinite(x)))})")
    start = x[len(x) - m - s: len(x) - m].mean()
    end = x[len(x) - s:].mean()
    fall = float((start - end) / max(abs(start), 1e-12))
    return bool(0 <= fall < tol), fall


class EMA:
    """Exponential moving average of a model's weights (an EMA teacher).

    ``θ_ema ← decay · θ_ema + (1 - decay) · θ`` for floating-point parameters; buffers are copied.
    ``ema.module`` is a frozen copy in eval mode; ``ema(x)`` calls it. Use it from the ``after_step`` hook:
    ``train(..., hooks={"after_step": lambda step, m: ema.update(m)}, checkpoint_objects=[ema])``.
    """

    def __init__(self, model: nn.Module, decay: float = 0.999):
        if not (0.0 <= decay < 1.0):
            raise ValueError(f"EMA decay must be in [0, 1), got {decay!r}")
        self.decay = float(decay)
        self.module = copy.deepcopy(_unwrap(model)).eval()
        self.module.requires_grad_(False)
        self.num_updates = 0

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        src = dict(_unwrap(model).named_parameters())
        first = next(iter(src.values()), None)
        if first is not None and next(self.module.parameters()).device != first.device:
            self.module.to(first.device)  # the trained model moved (accelerate.prepare put it on the GPU)
        for name, p in self.module.named_parameters():
            if name not in src:
                raise ValueError(f"EMA.update: parameter {name!r} missing from the model")
            q = src[name].detach()
            if q.shape != p.shape:
                raise ValueError(f"EMA.update: parameter {name!r} has shape {tuple(q.shape)}, EMA has {tuple(p.shape)}")
            if p.is_floating_point():
                p.lerp_(q.to(p.dtype), 1.0 - self.decay)
            else:
                p.copy_(q)
        src_b = dict(_unwrap(model).named_buffers())
        for name, b in self.module.named_buffers():
            if name in src_b:
                b.copy_(src_b[name])
        self.num_updates += 1

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "num_updates": self.num_updates, "module": self.module.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.decay = state["decay"]
        self.num_updates = state["num_updates"]
        self.module.load_state_dict(state["module"])


# ----------------------------------------------------------------------------------------------------------
# helpers


def _unwrap(model: nn.Module) -> nn.Module:
    while hasattr(model, "module") and isinstance(model.module, nn.Module) and type(model).__name__ in (
        "DistributedDataParallel", "DataParallel", "OptimizedModule"
    ):
        model = model.module
    return model


unwrap = _unwrap  # public name: the module inside a DDP / compiled wrapper


def _rng_state() -> dict:
    s = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def _set_rng_state(s: dict) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def _flat_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in (metrics or {}).items():
        if not isinstance(k, str):
            raise ValueError(f"metric names must be strings, got {k!r}")
        if isinstance(v, torch.Tensor):
            v = v.detach().float().cpu()
            if v.ndim == 0:
                out[k] = float(v)
            elif v.ndim == 1:
                out.update({f"{k}_{i}": float(x) for i, x in enumerate(v)})
            else:
                raise ValueError(f"metric {k!r} has shape {tuple(v.shape)}; return scalars or 1-D vectors")
        elif isinstance(v, (np.ndarray, list, tuple)):
            a = np.asarray(v, dtype=float)
            if a.ndim > 1:
                raise ValueError(f"metric {k!r} has shape {a.shape}; return scalars or 1-D vectors")
            out.update({f"{k}_{i}": float(x) for i, x in enumerate(a.ravel())} if a.ndim == 1 else {k: float(a)})
        elif isinstance(v, (int, float, np.number, bool)):
            out[k] = float(v)
        else:
            raise ValueError(f"metric {k!r} has unsupported type {type(v).__name__}")
    return out


def _default_param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    if not decay and not no_decay:
        raise ValueError("the model has no trainable parameters (requires_grad=False everywhere)")
    groups = [g for g in ({"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0})
              if g["params"]]
    return groups


def latest_checkpoint(ckpt_dir) -> Path | None:
    """Newest complete ``step_XXXXXXX`` checkpoint in ``ckpt_dir`` (None if there is none)."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return None
    done = sorted(p for p in d.glob("step_*") if p.is_dir() and (p / "trainer_state.json").is_file()
                  and not p.name.endswith(".tmp"))
    return done[-1] if done else None


class _BatchStream:
    """Endless micro-batch stream over epochs with a position ``(epoch, index)`` that survives a restart.

    The order of epoch ``e`` is fixed by the seedable sampler (seed, e); resuming re-creates epoch ``e``'s iterator
    and skips ``index`` batches. ``peek()`` fetches the next batch early (used before capturing RNG states)."""

    def __init__(self, loader, epoch: int = 0, index: int = 0):
        self.loader, self.epoch, self.index = loader, epoch, index
        self._it = None
        self._buf = None
        try:
            self._len = len(loader)
        except TypeError:
            self._len = None
        if self._len == 0:
            raise ValueError("train_loader is empty (len 0)")

    def _start_epoch(self):
        if hasattr(self.loader, "set_epoch"):
            self.loader.set_epoch(self.epoch)
        self._it = iter(self.loader)
        for _ in range(self.index):  # skip consumed batches of this epoch (resume)
            next(self._it)

    def _fetch(self):
        while True:
            if self._it is None:
                self._start_epoch()
            try:
                return next(self._it)
            except StopIteration:
                if self.index == 0:
                    raise ValueError("train_loader yielded no batches")
                self._it, self.epoch, self.index = None, self.epoch + 1, 0

    def peek(self):
        if self._buf is None:
            self._buf = (self._fetch(),)
        return self._buf[0]

    def next(self):
        b = self.peek()
        self._buf = None
        self.index += 1
        return b

    def position(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}


def resolve_device(device: str = "auto", mixed_precision: str = "auto", *, cuda_available: bool | None = None,
                   bf16_supported: bool | None = None) -> tuple[str, str]:
    """Where a run with these :class:`TrainConfig` settings trains and in which autocast precision: ``(device,
    mixed_precision)`` with device "cpu" or "cuda" and precision "no", "bf16" or "fp16".

    ``device="auto"``: CUDA when a device is visible, else the CPU. ``mixed_precision="auto"``: bf16 autocast on a
    CUDA device that supports it, else none (fp32); an explicit "bf16"/"fp16" needs CUDA. ``cuda_available`` /
    ``bf16_supported`` replace the probes of this machine (tests of the CUDA decisions on a CPU machine).
    """
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if mixed_precision not in MIXED_PRECISION:
        raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION}, got {mixed_precision!r}")
    has_cuda = torch.cuda.is_available() if cuda_available is None else bool(cuda_available)
    if device == "cuda" and not has_cuda:
        raise ValueError("TrainConfig.device='cuda' but no CUDA device is available; use device='auto' or 'cpu'")
    dev = "cuda" if (device == "cuda" or (device == "auto" and has_cuda)) else "cpu"
    mp = mixed_precision
    if mp == "auto":
        supported = torch.cuda.is_bf16_supported() if (dev == "cuda" and bf16_supported is None) else bf16_supported
        mp = "bf16" if (dev == "cuda" and supported) else "no"
    elif mp != "no" and dev == "cpu":
        raise ValueError(f"mixed_precision={mp!r} needs a CUDA device; use 'auto' or 'no' on CPU")
    return dev, mp


def _make_accelerator(cfg: TrainConfig):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DataLoaderConfiguration, DistributedDataParallelKwargs

    dev, mp = resolve_device(cfg.device, cfg.mixed_precision)
    cpu = dev == "cpu"
    # One process: drop the previous Accelerator's global state so successive calls may differ in precision or
    # device (a notebook trains several models). Multi-process: the state holds the process group; keep it.
    if PartialState._shared_state and PartialState().num_processes == 1:
        AcceleratorState._reset_state(reset_partial_state=True)
    dl_cfg = DataLoaderConfiguration(split_batches=True, use_seedable_sampler=True, data_seed=cfg.seed)
    # MoE: experts that receive no token in a step get no gradient; DDP must not wait for them
    ddp = DistributedDataParallelKwargs(find_unused_parameters=True)
    return Accelerator(cpu=cpu, mixed_precision=mp, dataloader_config=dl_cfg, gradient_accumulation_steps=1,
                       rng_types=[], kwargs_handlers=[ddp])


def _save_checkpoint(acc, path: Path, state: dict, hooks: Hooks, model, optimizer, keep: int):
    tmp = path.with_name(path.name + ".tmp")
    if acc.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    acc.wait_for_everyone()
    acc.save_state(str(tmp), safe_serialization=False)
    torch.save(state["rng"], tmp / f"trainer_rng_{acc.process_index}.pt")
    acc.wait_for_everyone()
    if acc.is_main_process:
        (tmp / "trainer_state.json").write_text(json.dumps({k: v for k, v in state.items() if k != "rng"}))
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
        olds = sorted(p for p in path.parent.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))
        for old in olds[:-keep] if keep else []:
            shutil.rmtree(old, ignore_errors=True)
    acc.wait_for_everyone()
    if hooks.on_save:
        hooks.on_save(state["step"], path, model, optimizer)


def _reduce_row(acc, names: list[str], values: list[float]) -> list[float]:
    if acc.num_processes == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=acc.device)
    return acc.reduce(t, reduction="mean").tolist()


# ----------------------------------------------------------------------------------------------------------
# the loop


def train(
    model: nn.Module,
    train_loader: Iterable,
    *,
    loss_fn: Callable[[nn.Module, Any], tuple[torch.Tensor, Mapping[str, Any]]],
    cfg: TrainConfig,
    eval_fn: Callable[[nn.Module], Mapping[str, Any]] | None = None,
    hooks: Hooks | Mapping[str, Callable] | None = None,
    param_groups: list[dict] | None = None,
    checkpoint_objects: list | None = None,
) -> TrainResult:
    """Train ``model`` with AdamW for ``cfg.steps`` optimiser steps; see the module docstring for the order.

    ``loss_fn(model, batch) -> (loss, metrics)``: ``loss`` a scalar tensor (the objective, aux losses included),
    ``metrics`` a dict of scalars or 1-D vectors (aux losses, routing statistics), averaged over micro-batches and
    processes into ``TrainResult.history``. ``model`` there is the prepared (possibly DDP-wrapped) model: call it,
    and reach submodules through ``moelab.train.unwrap(model)`` if needed. ``eval_fn(model) -> dict`` runs every
    ``cfg.eval_every`` steps and at the end, under ``torch.no_grad()`` and ``model.eval()``.
    ``param_groups``: optimiser groups (default: all trainable parameters, weight decay on >= 2-D tensors).
    ``checkpoint_objects``: extra objects with ``state_dict``/``load_state_dict`` saved in checkpoints (an EMA).
    Used by ``notebooks/00_moe_primer.py`` and every paper notebook.
    """
    if not isinstance(cfg, TrainConfig):
        raise ValueError(f"cfg must be a TrainConfig, got {type(cfg).__name__}")
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise ValueError(f"loss_fn must be callable, got {loss_fn!r}")
    hooks = Hooks.coerce(hooks)
    t0 = time.perf_counter()
    from accelerate.utils import set_seed

    acc = _make_accelerator(cfg)
    set_seed(cfg.seed, device_specific=True)  # seed + process index: dropout differs across processes

    groups = param_groups if param_groups is not None else _default_param_groups(model, cfg.weight_decay)
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    for g in optimizer.param_groups:
        g.setdefault("initial_lr", g["lr"])
    model, optimizer, loader = acc.prepare(model, optimizer, train_loader)
    for obj in checkpoint_objects or []:
        acc.register_for_checkpointing(obj)
    raw = _unwrap(acc.unwrap_model(model))
    try:

        rows: list[dict] = []
        eval_rows: list[dict] = []
        start, pos, rng_after_fetch = 0, {"epoch": 0, "index": 0}, None
        ckpt_root = Path(cfg.ckpt_dir) if cfg.ckpt_dir is not None else None
        last = latest_checkpoint(ckpt_root) if (ckpt_root is not None and cfg.resume) else None
        if last is not None:
            st = json.loads((last / "trainer_state.json").read_text())
            if st["steps_total"] != cfg.steps or st["grad_accum"] != cfg.grad_accum:
                raise ValueError(f"checkpoint {last} was written with steps={st['steps_total']}, "
                                 f"grad_accum={st['grad_accum']}; cfg has steps={cfg.steps}, "
                                 f"grad_accum={cfg.grad_accum}")
            if st["num_processes"] != acc.num_processes:
                raise ValueError(f"checkpoint {last} was written by {st['num_processes']} processes, "
                                 f"this run has {acc.num_processes}")
            if hooks.before_resume:
                hooks.before_resume(st["step"], last, raw, optimizer)
            acc.load_state(str(last))
            start, pos, rows, eval_rows = st["step"], st["position"], st["history"], st["eval_history"]
            rng_after_fetch = torch.load(last / f"trainer_rng_{acc.process_index}.pt", weights_only=False)

        stream = _BatchStream(loader, **pos)
        if rng_after_fetch is not None and start < cfg.steps:
            stream.peek()  # re-create the data position first, then the RNG as it was after that fetch
            _set_rng_state(rng_after_fetch)

        show = mprogress.enabled() if cfg.progress is None else cfg.progress
        bar = mprogress.bar(total=cfg.steps, initial=start, desc=cfg.desc, unit="step",
                            disable=not (show and acc.is_local_main_process))
        model.train()
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for step in range(start, cfg.steps):
            f = lr_factor(step, cfg)
            for g in optimizer.param_groups:
                g["lr"] = g.setdefault("initial_lr", cfg.lr) * f
            loss_sum, metric_sum = 0.0, {}
            step1 = step + 1
            # routers found anew at each logged step: a growing pool (MASS) replaces router parameters while training
            routers = diagnostics.find_routers(raw) if _logged(step1, cfg) else {}
            router_grad = {}
            for micro in range(cfg.grad_accum):
                batch = stream.next()
                sync = micro == cfg.grad_accum - 1
                ctx = acc.no_sync(model) if not sync else contextlib.nullcontext()
                with ctx:
                    with acc.autocast():
                        out = loss_fn(model, batch)
                    if not (isinstance(out, tuple) and len(out) == 2):
                        raise ValueError("loss_fn must return (loss, metrics_dict)")
                    loss, metrics = out
                    if not (isinstance(loss, torch.Tensor) and loss.ndim == 0):
                        raise ValueError(f"loss_fn's loss must be a scalar tensor, got {type(loss).__name__} "
                                         f"{tuple(getattr(loss, 'shape', ()))}")
                    if not torch.isfinite(loss.detach()):
                        raise ValueError(f"non-finite loss {loss.item()} at step {step + 1} (micro-batch {micro})")
                    if routers:
                        _add_router_grads(router_grad, _task_loss(loss, metrics) / cfg.grad_accum, routers)
                    acc.backward(loss / cfg.grad_accum)  # ∇ (1/G) Σ_g L_g  over G micro-batches
                loss_sum += float(loss.detach())
                for k, v in _flat_metrics(metrics).items():
                    metric_sum[k] = metric_sum.get(k, 0.0) + v
            if hooks.after_backward:
                hooks.after_backward(step1, raw, optimizer)
                params = [p for g in optimizer.param_groups for p in g["params"]]
            # total gradient norm before clipping (max_norm=inf only measures: the scale factor is exactly 1)
            grad_norm = float(acc.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm else float("inf")))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if hooks.after_step:
                hooks.after_step(step1, raw)

            names = ["loss"] + list(metric_sum)
            vals = _reduce_row(acc, names, [loss_sum / cfg.grad_accum]
                               + [v / cfg.grad_accum for v in metric_sum.values()])
            row = {"step": step1, **dict(zip(names, vals)), "lr": optimizer.param_groups[0]["lr"],
                   "grad_norm": grad_norm, "epoch": stream.epoch}
            if routers:
                norms = _reduce_router_grads(acc, router_grad)
                row.update({"router_grad_norm": max(norms.values()),
                            **{f"router_grad_norm/{k}": v for k, v in norms.items()}})
            rows.append(row)
            bar.update(1)
            if cfg.log_every and (step1 % cfg.log_every == 0 or step1 == cfg.steps):
                bar.set_postfix(loss=f"{row['loss']:.4g}")

            if eval_fn is not None and ((cfg.eval_every and step1 % cfg.eval_every == 0) or step1 == cfg.steps):
                m = _evaluate(eval_fn, model, raw)
                eval_rows.append({"step": step1, **m})
                if hooks.on_eval:
                    hooks.on_eval(step1, m)

            if ckpt_root is not None and cfg.ckpt_every and (step1 % cfg.ckpt_every == 0 or step1 == cfg.steps):
                if step1 < cfg.steps:
                    stream.peek()  # RNG state is captured after the next fetch (see module docstring)
                state = {"step": step1, "steps_total": cfg.steps, "grad_accum": cfg.grad_accum,
                         "num_processes": acc.num_processes, "position": stream.position(), "history": rows,
                         "eval_history": eval_rows, "rng": _rng_state()}
                _save_checkpoint(acc, ckpt_root / f"step_{step1:07d}", state, hooks, raw, optimizer,
                                 cfg.keep_checkpoints)
        bar.close()
        acc.wait_for_everyone()
    finally:  # also when a hook stops the run by raising (SBA phase (b)'s plateau rule)
        _drop_autocast_wrapper(model, acc)
    model.eval()
    history = pd.DataFrame(rows)
    cols = [c for c in history.columns if c.startswith("router_grad_norm/")]
    if cols:
        history["router_frozen"] = cfg.router_frozen   # recorded: a frozen router is exempt from the check below
    diagnostics.check_router_learns({c.split("/", 1)[1]: history[c] for c in cols}, run=cfg.desc,
                                    router_frozen=cfg.router_frozen)
    result = TrainResult(model=raw, history=history, eval_history=pd.DataFrame(eval_rows),
                         resumed_from=start, wall_s=time.perf_counter() - t0, optimizer=optimizer,
                         num_processes=acc.num_processes)
    return result


def _drop_autocast_wrapper(model: nn.Module, acc) -> None:
    """Put the model's own ``forward`` back after training. Under mixed precision (bf16 on CUDA) Accelerate's
    ``prepare`` wraps ``forward`` in autocast for good; the trainer's steps run under ``acc.autocast()`` anyway, and the
    returned model must compute in its own precision (evaluations after training in fp32, as on the CPU), nor stack a
    second wrapper when trained again."""
    for m in {id(x): x for x in (acc.unwrap_model(model), _unwrap(acc.unwrap_model(model)))}.values():
        orig = m.__dict__.pop("_original_forward", None)
        if orig is None:
            continue
        if getattr(orig, "__func__", None) is type(m).forward:
            m.__dict__.pop("forward", None)     # the class's forward again
        else:
            m.forward = orig                    # a forward the caller had set on the instance


def _logged(step1: int, cfg: TrainConfig) -> bool:
    """Steps whose router gradient is measured: the first, every ``log_every``-th and the last (1-based)."""
    return step1 == 1 or step1 == cfg.steps or bool(cfg.log_every and step1 % cfg.log_every == 0)


def _task_loss(loss: torch.Tensor, metrics) -> torch.Tensor:
    """``metrics["task_loss"]`` (the loss without balancing terms) when ``loss_fn`` returns it, else ``loss``."""
    task = (metrics or {}).get("task_loss", loss)
    if not (isinstance(task, torch.Tensor) and task.ndim == 0):
        raise ValueError(f"metrics['task_loss'] must be the scalar task-loss tensor (attached to the graph, not "
                         f"detached), got {type(task).__name__}")
    if loss.requires_grad and not task.requires_grad:
        raise ValueError("metrics['task_loss'] is detached from the graph; return the task-loss tensor itself "
                         "(e.g. ce, not ce.detach()) so its router gradient can be measured")
    return task


def _add_router_grads(acc_grads: dict, task_loss: torch.Tensor, routers: dict) -> None:
    """acc_grads[name] += d task_loss / d θ_name  (per parameter), summed over micro-batches like the step."""
    for name, gs in diagnostics.router_grads(task_loss, routers).items():
        if name in acc_grads:
            acc_grads[name] = [a + g for a, g in zip(acc_grads[name], gs)]
        else:
            acc_grads[name] = gs


def _reduce_router_grads(acc, router_grad: dict) -> dict[str, float]:
    """Router gradient norms of the step, per router; with several processes the gradients are averaged first
    (as DDP averages the step's gradient), so the norm matches a one-process run on the global batch."""
    if acc.num_processes > 1 and router_grad:
        names = list(router_grad)
        flat = torch.cat([g.reshape(-1) for n in names for g in router_grad[n]]).to(acc.device)
        flat = acc.reduce(flat, reduction="mean").cpu()
        out, i = {}, 0
        for n in names:
            gs = []
            for g in router_grad[n]:
                gs.append(flat[i:i + g.numel()])
                i += g.numel()
            out[n] = diagnostics.grad_norm(gs)
        return out
    return {n: diagnostics.grad_norm(gs) for n, gs in router_grad.items()}


def _evaluate(eval_fn, model, raw) -> dict:
    """Run ``eval_fn(raw)`` without gradients in eval mode, with the RNG forked so training is unaffected."""
    state = _rng_state()
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            m = eval_fn(raw)
    finally:
        _set_rng_state(state)
        model.train(was_training)
    if not isinstance(m, Mapping):
        raise ValueError(f"eval_fn must return a dict of metrics, got {type(m).__name__}")
    return _flat_metrics(m)
