"""moelab.launch + moelab.train across processes: 2 CPU processes started by `accelerate launch ... -m moelab.launch`
match a single-process run with the same global batch (real tiny data: scikit-learn's digits).

accelerate 1.15: `accelerate launch --cpu --num_processes 2` starts ONE process (its simple launcher ignores
--num_processes without mpirun); `--multi_gpu --num_processes 2` with no visible GPU starts two torchrun processes
that Accelerate runs as MULTI_CPU (gloo). The test checks that two processes really ran."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from moelab import launch
from moelab.train import TrainConfig, train

torch.set_num_threads(1)  # shared 2-core machine (conftest may do the same)

HERE = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent


def fit_digits(config: dict) -> dict:
    """Launch target: train a tiny MLP on digits with ``config['train']``; the main process saves the weights."""
    from sklearn.datasets import load_digits

    torch.set_num_threads(1)
    from moelab.core import MoELayer

    torch.manual_seed(config.get("init_seed", 0))
    # no dropout (processes share nothing random); a top-1 MoE layer of 8 experts leaves some experts without tokens
    # in a process's half-batch: DDP must cope (find_unused_parameters). Not renormalised, so the router's gradient
    # is real (with top-1 renormalised it is exactly 0 in theory, and AdamW would amplify float noise)
    model = nn.Sequential(nn.Linear(64, 32), nn.GELU(),
                          MoELayer(32, 64, num_experts=8, top_k=1, act="gelu", renormalize=False),
                          nn.Linear(32, 10))
    d = load_digits()
    n = config.get("n", 256)
    ds = torch.utils.data.TensorDataset(torch.tensor(d.data[:n] / 16.0, dtype=torch.float32),
                                        torch.tensor(d.target[:n], dtype=torch.long))
    loader = torch.utils.data.DataLoader(ds, batch_size=config["batch_size"], shuffle=True)  # global batch

    def loss_fn(m, batch):
        x, y = batch
        return nn.functional.cross_entropy(m(x), y), {"n": float(len(y))}

    res = train(model, loader, loss_fn=loss_fn, cfg=TrainConfig.from_dict(config["train"]))
    if res.num_processes == 1 or int(os.environ.get("RANK", "0")) == 0:
        torch.save({k: v.detach().cpu() for k, v in res.model.state_dict().items()}, config["out"])
    return {"num_processes": res.num_processes, "loss": res.history["loss"].tolist(),
            "n": res.history["n"].tolist()}


CONFIG = {"batch_size": 32, "train": {"device": "cpu", "lr": 3e-3, "steps": 10, "grad_accum": 2, "warmup_frac": 0.2,
                                      "max_grad_norm": 1.0, "weight_decay": 0.01, "progress": False, "seed": 1}}


def test_two_processes_match_one(tmp_path):
    one = fit_digits({**CONFIG, "out": str(tmp_path / "one.pt")})
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(json.dumps({**CONFIG, "out": str(tmp_path / "two.pt")}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(HERE),
           "CUDA_VISIBLE_DEVICES": ""}
    cmd = [str(VENV_BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "moelab.launch", "test_launch:fit_digits",
           "--config", str(cfg_file), "--out", str(tmp_path / "two.json")]
    proc = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = json.loads((tmp_path / "two.json").read_text())
    assert two["num_processes"] == 2 and one["num_processes"] == 1
    assert two["n"] == [16.0] * 10 and one["n"] == [32.0] * 10  # each process sees half of the global batch
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=0, atol=1e-5)
    w1, w2 = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1 if not w1[k].is_floating_point())
    diff = max(float((w1[k] - w2[k]).abs().max()) for k in w1 if w1[k].is_floating_point())
    per_key = {k: float((w1[k] - w2[k]).abs().max()) for k in w1 if w1[k].is_floating_point()}
    print(f"max |w_1proc - w_2proc| = {diff:.3g}")
    assert diff < 1e-5, per_key


def test_launch_single_process_in_process(tmp_path):
    # this module as pytest imported it (--import-mode=importlib names it after its path: tests.train.test_launch)
    out = launch.main([f"{__name__}:fit_digits", "--config", json.dumps({**CONFIG, "out": str(tmp_path / "w.pt")}),
                       "--set", "train.steps=3", "--set", "batch_size=16", "--out", str(tmp_path / "r.json")])
    assert out["num_processes"] == 1 and len(out["loss"]) == 3 and out["n"] == [16.0] * 3
    assert json.loads((tmp_path / "r.json").read_text())["loss"] == out["loss"]


def test_launch_bad_input(tmp_path):
    with pytest.raises(ValueError, match="package.module:function"):
        launch.resolve("moelab.train.train")
    with pytest.raises(ValueError, match="no attribute"):
        launch.resolve("moelab.train:nope")
    with pytest.raises(ValueError, match="cannot import"):
        launch.resolve("moelab.nonexistent_mod:f")
    with pytest.raises(ValueError, match="neither"):
        launch.load_config(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="JSON object"):
        launch.load_config("[1, 2]" if False else str(_write(tmp_path / "l.json", "[1, 2]")))
    with pytest.raises(ValueError, match="KEY=VALUE"):
        launch.apply_overrides({}, ["steps"])
    assert launch.apply_overrides({"a": {"b": 1}}, ["a.b=2", "c=x", "d=[1]"]) == {"a": {"b": 2}, "c": "x", "d": [1]}


def _write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p
