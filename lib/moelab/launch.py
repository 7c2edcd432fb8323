"""Run any notebook's training as a script, on one or several processes, with the notebook's configuration.

Usage::

    # one process
    python -m moelab.launch moelab.mass:train_from_config --config cfg.json
    # data parallel on N GPUs
    accelerate launch --multi_gpu --num_processes N -m moelab.launch moelab.mass:train_from_config --config cfg.json
    # data parallel on 2 CPU processes (gloo): hide the GPUs and ask for the multi-process launcher
    CUDA_VISIBLE_DEVICES= accelerate launch --multi_gpu --num_processes 2 -m moelab.launch moelab.mass:... --config cfg.json

Note (accelerate 1.15): ``accelerate launch --cpu --num_processes 2`` starts only ONE process (its simple launcher
ignores ``--num_processes`` unless mpirun is configured); with ``--multi_gpu`` and no visible GPU, torchrun starts
the processes and Accelerate runs them as MULTI_CPU. The training function should then set ``device="cpu"``.
    # override single keys (values parsed as JSON when they parse, else kept as strings)
    python -m moelab.launch moelab.mass:train_from_config --config cfg.json --set train.steps=50 --set out_dir=/tmp/x

The target ``package.module:function`` is imported and called as ``function(config_dict)``; ``--config`` is a
JSON file or an inline JSON object. A notebook saves the exact dict it trains with (``run.save_json(cfg, "config")``),
so the same training runs as a script from that file. The function does the training through
:func:`moelab.train.train`, which picks up the processes ``accelerate launch`` started; a loader's batch size is
the *global* batch (``split_batches``), so the same config gives the same optimisation on 1 or N processes.
If the function returns a JSON-able value (a dict, or a DataFrame, written as records) and ``--out FILE`` is given,
the main process writes it there. Introduced in ``notebooks/00_moe_primer.py``; tested in
``tests/train/test_launch.py``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable


def resolve(target: str) -> Callable:
    """``"pkg.module:function"`` -> the function (ValueError naming the target if it cannot be found)."""
    if not isinstance(target, str) or target.count(":") != 1:
        raise ValueError(f"target must look like 'package.module:function', got {target!r}")
    mod_name, fn_name = target.split(":")
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        raise ValueError(f"cannot import module {mod_name!r} of target {target!r}: {e}") from e
    obj = mod
    for part in fn_name.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"module {mod_name!r} has no attribute {fn_name!r} (target {target!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"target {target!r} is not callable")
    return obj


def load_config(spec: str | None) -> dict:
    """A JSON file path or an inline JSON object -> dict (ValueError naming the value otherwise)."""
    if spec is None:
        return {}
    text = spec
    if not spec.lstrip().startswith("{"):
        p = Path(spec)
        if not p.is_file():
            raise ValueError(f"--config {spec!r} is neither a JSON object nor an existing file")
        text = p.read_text()
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--config {spec!r} is not valid JSON: {e}") from e
    if not isinstance(cfg, dict):
        raise ValueError(f"--config must hold a JSON object, got {type(cfg).__name__}")
    return cfg


def apply_overrides(cfg: dict, sets: list[str]) -> dict:
    """``["a.b=3", "name=x"]`` -> nested keys set (values parsed as JSON when possible)."""
    for s in sets or []:
        if "=" not in s:
            raise ValueError(f"--set expects KEY=VALUE, got {s!r}")
        key, raw = s.split("=", 1)
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = cfg
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {s!r}: {p!r} is not a dict in the config")
        node[parts[-1]] = value
    return cfg


def _jsonable(x):
    try:
        import pandas as pd

        if isinstance(x, pd.DataFrame):
            return json.loads(x.to_json(orient="records"))
    except ImportError:  # pragma: no cover
        pass
    return x


def main(argv: list[str] | None = None) -> Any:
    ap = argparse.ArgumentParser(prog="python -m moelab.launch", description=__doc__.split("\n\n")[0])
    ap.add_argument("target", help="package.module:function, called as function(config_dict)")
    ap.add_argument("--config", help="JSON file or inline JSON object")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a (dotted) key")
    ap.add_argument("--out", help="write the function's JSON-able return value here (main process)")
    args = ap.parse_args(argv)
    if os.getcwd() not in sys.path:  # `accelerate launch -m` may not put the working directory on the path
        sys.path.insert(0, os.getcwd())
    fn = resolve(args.target)
    cfg = apply_overrides(load_config(args.config), args.set)
    result = fn(cfg)
    if args.out:
        rank = int(os.environ.get("RANK", "0"))
        if rank == 0:
            Path(args.out).write_text(json.dumps(_jsonable(result), indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
