"""Tests of moelab.train: exact resume, gradient accumulation, hooks, schedule, EMA, flattened, bad input.

Tiny model on a real tiny data set (scikit-learn's bundled digits, 1797 x 64), one torch thread."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from moelab.train import EMA, Hooks, TrainConfig, flattened, latest_checkpoint, lr_factor, resolve_device, train

torch.set_num_threads(1)  # shared 2-core machine (conftest may do the same)


def digits_loader(n=256, batch_size=16, shuffle=True):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data[:n] / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target[:n], dtype=torch.long)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle)


def make_model(seed=0, dropout=0.1):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 32), nn.GELU(), nn.Dropout(dropout), nn.Linear(32, 10))


def ce_loss(model, batch):
    x, y = batch
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y)
    acc = (logits.argmax(-1) == y).float().mean()
    return loss, {"acc": acc, "class_frac": torch.bincount(y, minlength=10).float() / len(y)}


def weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def cfg(**kw):
    base = dict(lr=3e-3, steps=12, grad_accum=2, warmup_frac=0.25, weight_decay=0.01, decay="linear",
                max_grad_norm=1.0, progress=False, seed=3)
    base.update(kw)
    return TrainConfig(**base)


class Interrupt(Exception):
    pass


def test_interrupted_then_resumed_equals_uninterrupted(tmp_path):
    # 256 samples / 16 = 16 batches per epoch, 2 per step -> epoch boundary at step 8; checkpoints at 5 and 10
    ref = train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=cfg())

    def boom(step, model):
        if step == 7:
            raise Interrupt

    with pytest.raises(Interrupt):
        train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=cfg(ckpt_dir=tmp_path, ckpt_every=5),
              hooks={"after_step": boom})
    assert latest_checkpoint(tmp_path).name == "step_0000005"
    # a fresh model object (different init, so loading really happens), resumed from step 5
    res = train(make_model(seed=99), digits_loader(), loss_fn=ce_loss, cfg=cfg(ckpt_dir=tmp_path, ckpt_every=5))
    assert res.resumed_from == 5
    assert torch.equal(weights(res.model), weights(ref.model))  # bit-identical on CPU
    pd.testing.assert_frame_equal(res.history.reset_index(drop=True), ref.history.reset_index(drop=True))


def test_resume_across_epoch_boundary_checkpoint(tmp_path):
    # checkpoint exactly at the end of an epoch (step 8 of 2 micro-batches x 16 batches/epoch)
    ref = train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=cfg())

    def boom(step, model):
        if step == 9:
            raise Interrupt

    with pytest.raises(Interrupt):
        train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=cfg(ckpt_dir=tmp_path, ckpt_every=4),
              hooks={"after_step": boom})
    res = train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=cfg(ckpt_dir=tmp_path, ckpt_every=4))
    assert res.resumed_from == 8
    assert torch.equal(weights(res.model), weights(ref.model))


def test_resumed_finished_run_returns_history(tmp_path):
    a = train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=cfg(steps=4, ckpt_dir=tmp_path, ckpt_every=2))
    b = train(make_model(seed=5), digits_loader(), loss_fn=ce_loss, cfg=cfg(steps=4, ckpt_dir=tmp_path, ckpt_every=2))
    assert b.resumed_from == 4 and len(b.history) == 4
    assert torch.equal(weights(a.model), weights(b.model))
    assert len(list(tmp_path.glob("step_*"))) == 2  # keep_checkpoints=2


def test_deterministic_and_seed_matters():
    a = train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=cfg(steps=4))
    b = train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=cfg(steps=4))
    c = train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=cfg(steps=4, seed=4))
    assert torch.equal(weights(a.model), weights(b.model))
    assert not torch.equal(weights(a.model), weights(c.model))


# The accumulation arithmetic is compared in fp32 on every device: under CUDA's default bf16 autocast two batches of
# 16 and one of 32 round differently ("not close on CUDA"), which says nothing about accumulation.
ACCUM_KW = dict(steps=5, max_grad_norm=None, weight_decay=0.0, mixed_precision="no")
ACCUM_ATOL = 1e-5 if torch.cuda.is_available() else 1e-6   # cuBLAS picks its kernel by batch size (fp32 reordering)


def test_grad_accum_equals_big_batch():
    # no dropout, no shuffle: 2 micro-batches of 16 == one batch of 32 (mean losses of equal-size batches)
    a = train(make_model(dropout=0.0), digits_loader(batch_size=16, shuffle=False), loss_fn=ce_loss,
              cfg=cfg(grad_accum=2, **ACCUM_KW))
    b = train(make_model(dropout=0.0), digits_loader(batch_size=32, shuffle=False), loss_fn=ce_loss,
              cfg=cfg(grad_accum=1, **ACCUM_KW))
    assert torch.allclose(weights(a.model).cpu(), weights(b.model).cpu(), atol=ACCUM_ATOL)
    assert np.allclose(a.history["loss"], b.history["loss"], atol=ACCUM_ATOL)


def test_grad_accum_comparison_runs_in_fp32_on_a_bf16_gpu():
    """On a bf16-capable CUDA device the comparison above must not run under bf16 autocast."""
    c = cfg(**ACCUM_KW)
    assert resolve_device(c.device, c.mixed_precision, cuda_available=True, bf16_supported=True) == ("cuda", "no")


def test_resolve_device_picks_the_gpu_and_bf16_where_there_is_one():
    """``device="auto"`` (every training entry point's default) trains on CUDA with bf16 autocast where the card
    supports it, fp32 where it does not, and on the CPU in fp32 without a GPU; explicit choices are kept or refused."""
    assert resolve_device(cuda_available=True, bf16_supported=True) == ("cuda", "bf16")
    assert resolve_device(cuda_available=True, bf16_supported=False) == ("cuda", "no")
    assert resolve_device(cuda_available=False) == ("cpu", "no")
    assert resolve_device("cpu", cuda_available=True, bf16_supported=True) == ("cpu", "no")
    assert resolve_device("cuda", "fp16", cuda_available=True) == ("cuda", "fp16")
    with pytest.raises(ValueError, match="no CUDA device"):
        resolve_device("cuda", cuda_available=False)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_device("auto", "bf16", cuda_available=False)
    with pytest.raises(ValueError, match="'gpu'"):
        resolve_device("gpu")
    assert TrainConfig().device == "auto" and TrainConfig().mixed_precision == "auto"


def test_trained_model_computes_outside_the_trainers_autocast(monkeypatch):
    """On CUDA the trainer runs under bf16 autocast, and Accelerate does it by wrapping the model's forward.
    The model it returns computes in its own precision again (evaluations after training are fp32, as on the CPU),
    and a second run does not stack a second wrapper. CPU bf16 autocast stands in for CUDA's here."""
    monkeypatch.setattr("moelab.train.resolve_device", lambda *a, **kw: ("cpu", "bf16"))
    seen = []

    def loss_fn(m, b):
        seen.append(torch.is_autocast_enabled("cpu"))
        return ce_loss(m, b)

    model = make_model(dropout=0.0)
    for _ in range(2):
        r = train(model, digits_loader(), loss_fn=loss_fn, cfg=cfg(steps=2, grad_accum=1))
    assert seen == [True] * 4 and r.model is model
    x = next(iter(digits_loader()))[0]
    ref = make_model(dropout=0.0)
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))                                # fp32, not bf16 rounded
    assert "_original_forward" not in model.__dict__ and "forward" not in model.__dict__

    def stop(step, m):                                                        # a hook ending the run early
        raise Interrupt

    with pytest.raises(Interrupt):
        train(model, digits_loader(), loss_fn=ce_loss, cfg=cfg(steps=2, grad_accum=1), hooks=Hooks(after_step=stop))
    assert "_original_forward" not in model.__dict__ and "forward" not in model.__dict__


def test_history_columns_and_training_reduces_loss():
    r = train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=cfg(steps=30, lr=1e-2, grad_accum=1))
    h = r.history
    assert list(h["step"]) == list(range(1, 31))
    assert {"loss", "acc", "lr", "grad_norm", "class_frac_0", "class_frac_9"} <= set(h.columns)
    assert np.allclose(h.filter(like="class_frac_").sum(axis=1), 1.0)
    assert np.isfinite(h["grad_norm"]).all() and (h["grad_norm"] > 0).all()
    assert h["loss"].iloc[-5:].mean() < h["loss"].iloc[:5].mean()
    assert not r.model.training


def test_lr_schedule_warmup_then_linear_decay():
    c = cfg(steps=10, warmup_frac=0.2, decay="linear", lr=1.0)
    f = [lr_factor(s, c) for s in range(10)]
    assert f[:2] == [0.5, 1.0]
    assert f[2] == 1.0 and f[-1] == pytest.approx(1 - 7 / 8)
    assert all(a >= b for a, b in zip(f[1:], f[2:]))
    r = train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=c.__class__(**{**c.__dict__, "lr": 1e-3}))
    assert np.allclose(r.history["lr"], np.array(f) * 1e-3)
    cos = cfg(steps=10, warmup_frac=0.0, decay="cosine")
    assert lr_factor(0, cos) == 1.0 and lr_factor(5, cos) == pytest.approx(0.5)


def test_after_backward_can_edit_gradients_and_add_param_groups():
    model = make_model(dropout=0.0)
    extra = nn.Parameter(torch.zeros(3))
    seen = {}

    def after_backward(step, m, opt):
        assert m is model
        m[0].weight.grad.zero_()  # frozen by gradient surgery
        if step == 2:  # MASS-style: a new parameter group appears mid-training
            opt.add_param_group({"params": [extra], "weight_decay": 0.0})
        if step >= 2:
            extra.grad = torch.ones(3)
        seen[step] = [g["lr"] for g in opt.param_groups]

    w0 = model[0].weight.detach().clone()
    c = cfg(steps=4, weight_decay=0.0, warmup_frac=0.0, decay="constant")
    r = train(model, digits_loader(), loss_fn=ce_loss, cfg=c, hooks=Hooks(after_backward=after_backward))
    # the trainer returns the model on its training device (the GPU under device="auto"): compare on the CPU
    assert torch.equal(r.model[0].weight.detach().cpu(), w0)
    assert not torch.equal(r.model[3].weight.detach().cpu(), make_model(dropout=0.0)[3].weight.detach())
    assert (extra.detach() < 0).all()  # AdamW moved it against the constant gradient
    assert len(seen[4]) == len(seen[1]) + 1 and len(set(seen[4])) == 1  # the schedule drives the new group too


def test_ema_tracks_weights_and_eval_every():
    model = make_model()
    ema = EMA(model, decay=0.5)
    evals = []
    r = train(model, digits_loader(), loss_fn=ce_loss, cfg=cfg(steps=6, eval_every=2),
              hooks={"after_step": lambda s, m: ema.update(m), "on_eval": lambda s, m: evals.append(s)},
              eval_fn=lambda m: {"acc_ema": 0.5, "w": float(ema.module[0].weight.sum())}, checkpoint_objects=[ema])
    assert evals == [2, 4, 6] and list(r.eval_history["step"]) == [2, 4, 6]
    assert ema.num_updates == 6
    # EMA of the final weights with decay 0.5 lies between the last two iterates' weights; check formula on one step
    m2 = make_model()
    e2 = EMA(m2, 0.9)
    before = e2.module[0].weight.detach().clone()
    with torch.no_grad():
        m2[0].weight.add_(1.0)
    e2.update(m2)
    assert torch.allclose(e2.module[0].weight, 0.9 * before + 0.1 * m2[0].weight)
    with pytest.raises(ValueError, match="decay"):
        EMA(m2, 1.5)


def test_eval_does_not_change_training():
    a = train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=cfg(steps=5))
    b = train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=cfg(steps=5, eval_every=1),
              eval_fn=lambda m: {"r": float(torch.rand(()))})  # eval consumes RNG; training must not see it
    assert torch.equal(weights(a.model), weights(b.model))


def test_flattened_criterion():
    n = 100
    falling = 2.0 * np.exp(-np.arange(n) / 20.0) + 1.0
    flat = 2.0 * np.exp(-np.arange(n) / 3.0) + 1.0
    ok, fall = flattened(falling)
    assert not ok and fall > 0.02
    ok, fall = flattened(flat)
    assert ok and abs(fall) < 1e-3
    # reference: smoothed start/end by the definition in the docstring
    m, s = 20, 10
    ref = (falling[n - m - s:n - m].mean() - falling[n - s:].mean()) / falling[n - m - s:n - m].mean()
    assert flattened(falling)[1] == pytest.approx(ref)
    with pytest.raises(ValueError, match="non-finite"):
        flattened([1.0, np.nan, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="window_frac"):
        flattened(falling, window_frac=0.0)
    with pytest.raises(ValueError, match="at least"):
        flattened([1.0])
    assert flattened([2.0, 1.9, 1.89]) == (True, pytest.approx(0.01 / 1.9))
    ok, fall = flattened(1.0 + np.arange(n) / 1000.0)                      # rising: never "flattened"
    assert not ok and -0.02 < fall < 0  # 3 evaluations: last step vs the one before


@pytest.mark.parametrize("kw,match", [
    (dict(steps=0), "steps"), (dict(grad_accum=0), "grad_accum"), (dict(lr=-1.0), "lr"),
    (dict(warmup_frac=1.0), "warmup_frac"), (dict(mixed_precision="fp8"), "mixed_precision"),
    (dict(decay="step"), "decay"), (dict(ckpt_every=5), "ckpt_dir"), (dict(device="tpu"), "device"),
])
def test_bad_config_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        cfg(**kw)


def test_bad_inputs_raise(tmp_path):
    with pytest.raises(ValueError, match="unknown hook"):
        train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=cfg(steps=1), hooks={"after_stepp": print})
    with pytest.raises(ValueError, match="scalar tensor"):
        train(make_model(), digits_loader(), loss_fn=lambda m, b: (m(b[0]), {}), cfg=cfg(steps=1))
    with pytest.raises(ValueError, match="non-finite loss"):
        train(make_model(), digits_loader(), loss_fn=lambda m, b: (m(b[0]).sum() * float("nan"), {}), cfg=cfg(steps=1))
    with pytest.raises(ValueError, match="TrainConfig keys"):
        TrainConfig.from_dict({"lr": 1e-3, "stepz": 3})
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="bf16"):
            train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=cfg(steps=1, mixed_precision="bf16", device="cpu"))
    train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=cfg(steps=2, ckpt_dir=tmp_path, ckpt_every=1))
    with pytest.raises(ValueError, match="steps=2"):
        train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=cfg(steps=3, ckpt_dir=tmp_path, ckpt_every=1))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_auto():
    r = train(make_model(), digits_loader(), loss_fn=ce_loss, cfg=cfg(steps=3))
    assert next(r.model.parameters()).device.type == "cuda"
    assert math.isfinite(r.history["loss"].iloc[-1])
