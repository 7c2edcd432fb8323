"""Router gradient from the task loss: ``moelab.core.diagnostics`` and the trainers.

``moelab.train.train`` logs ``router_grad_norm`` (and one column per router) at the first, every ``log_every``-th and
the last step; the value must equal a naive recomputation (``loss.backward()`` on the task loss alone, read
``.grad``); a run whose router gets no task gradient raises, unless the router is marked frozen. Tiny models, CPU."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from moelab.core import MoELayer
from moelab.core import diagnostics as D
from moelab.mass import StackedMoETransformer, _nll, train_stacked
from moelab.train import Hooks, TrainConfig, train, unwrap

torch.set_num_threads(1)


class Net(nn.Module):
    """x [B,8] -> Linear -> MoE (4 experts, top-2) -> Linear -> logits [B,3]. ``cut=True`` detaches the MoE output,
    so the task loss cannot reach the router (only the balancing loss can): the failure the check must catch."""

    def __init__(self, cut: bool = False, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.inp = nn.Linear(8, 16)
        self.moe = MoELayer(16, 32, num_experts=4, top_k=2, act="gelu", renormalize=True)
        self.head = nn.Linear(16, 3)
        self.cut = cut

    def forward(self, x):
        h = self.inp(x)
        y = self.moe(h)
        return self.head(h + (y.detach() if self.cut else y))


def loader(n=64, batch_size=16):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch_size, shuffle=False)


def loss_fn(aux_coef=0.0, with_task=True):
    def fn(model, batch):
        x, y = batch
        ce = nn.functional.cross_entropy(model(x), y)
        loss = ce + aux_coef * _balance(model)
        return loss, ({"task_loss": ce} if with_task else {})
    return fn


def _balance(model):
    """The MoE layer's balancing loss of the last forward (through a DDP/compiled wrapper if any)."""
    return unwrap(model).moe.aux_loss


def cfg(**kw):
    base = dict(lr=1e-2, steps=6, grad_accum=2, log_every=2, device="cpu", progress=False, seed=0, desc="tiny-moe")
    return TrainConfig(**{**base, **kw})


def test_find_routers_and_norms_match_naive_backward():
    model = Net()
    routers = D.find_routers(model)
    assert list(routers) == ["moe.router"] and routers["moe.router"][0] is model.moe.router.proj.weight
    x, y = next(iter(loader()))
    loss = nn.functional.cross_entropy(model(x), y)
    norms = D.router_grad_norms(loss, model)
    loss.backward()
    naive = float(model.moe.router.proj.weight.grad.norm())
    assert naive > 0 and norms["moe.router"] == pytest.approx(naive, rel=1e-6)
    # a mapping of raw tensors works too (MASS's stacked gate); frozen parameters give zero
    model.moe.router.proj.weight.requires_grad_(False)
    out = D.router_grad_norms(nn.functional.cross_entropy(model(x), y), {"g": model.moe.router.proj.weight})
    assert out == {"g": 0.0}
    with pytest.raises(ValueError, match="scalar"):
        D.router_grads(torch.ones(2), model)


def test_trainer_logs_router_grad_equal_to_naive_recomputation():
    # without a balancing loss the task loss is the whole loss, so the step's router .grad (read in after_backward,
    # summed over the 2 micro-batches) is the naive reference at every step
    seen = {}

    def after_backward(step, model, optimizer):
        seen[step] = float(model.moe.router.proj.weight.grad.norm())

    r = train(Net(), loader(), loss_fn=loss_fn(0.0, with_task=False), cfg=cfg(), hooks=Hooks(after_backward=after_backward))
    h = r.history.set_index("step")
    logged = h.router_grad_norm.dropna()
    assert list(logged.index) == [1, 2, 4, 6]                                 # first, every log_every, last
    assert h.router_grad_norm.isna().sum() == 2                               # steps 3 and 5 not measured
    for step, v in logged.items():
        assert v > 0 and v == pytest.approx(seen[step], rel=1e-5), step
    np.testing.assert_allclose(h["router_grad_norm/moe.router"].dropna(), logged)
    assert not h.router_frozen.any()


def test_balancing_loss_excluded_when_task_loss_given():
    # with aux_coef > 0 the logged norm at step 1 must equal the task-only gradient (same init, same first batch),
    # and differ from the gradient of the total loss
    model = Net()
    ref = copy.deepcopy(model)
    r = train(model, loader(), loss_fn=loss_fn(aux_coef=5.0), cfg=cfg(steps=1, grad_accum=1))
    x, y = next(iter(loader()))
    ce = nn.functional.cross_entropy(ref(x), y)
    task = D.router_grad_norms(ce, ref)["moe.router"]
    total = D.router_grad_norms(ce + 5.0 * ref.moe.aux_loss, ref)["moe.router"]
    got = float(r.history.router_grad_norm.iloc[0])
    assert got == pytest.approx(task, rel=1e-5) and abs(total - task) > 1e-3 * task


def test_zero_task_gradient_raises_unless_frozen():
    with pytest.raises(RuntimeError, match=r"tiny-moe.*moe.router.*router_frozen=True"):
        train(Net(cut=True), loader(), loss_fn=loss_fn(aux_coef=0.1), cfg=cfg())
    r = train(Net(cut=True), loader(), loss_fn=loss_fn(aux_coef=0.1), cfg=cfg(router_frozen=True))
    assert r.history.router_grad_norm.max() < D.ZERO_GRAD_TOL and r.history.router_frozen.all()


def test_check_router_learns_and_bad_task_loss():
    D.check_router_learns({"a": [0.0, math.nan, 1e-3]}, run="r")            # learns at one logged step: fine
    with pytest.raises(RuntimeError, match="'r'.*b"):
        D.check_router_learns({"a": [1.0], "b": [0.0, 1e-13]}, run="r")
    with pytest.raises(ValueError, match="task_loss"):
        train(Net(), loader(), loss_fn=lambda m, b: (nn.functional.cross_entropy(m(b[0]), b[1]), {"task_loss": 1.0}),
              cfg=cfg(steps=1))
    with pytest.raises(ValueError, match="detached"):
        train(Net(), loader(), loss_fn=lambda m, b: (lambda ce: (ce, {"task_loss": ce.detach()}))(
            nn.functional.cross_entropy(m(b[0]), b[1])), cfg=cfg(steps=1))


# ------------------------------------------------------------------------------------------ MASS's stacked loop
def _stacked(E=4, top_k=2, M=2):
    return StackedMoETransformer(M, 11, 8, 2, 6, E, num_experts=E, top_k=top_k, seeds=range(M))


def test_stacked_loop_logs_gate_grad_equal_to_naive():
    docs = np.random.default_rng(0).integers(0, 11, (64, 7))
    model = _stacked()
    ref = copy.deepcopy(model)
    h = train_stacked(model, docs, steps=5, batch_size=4, lr=1e-2, seed=3, log_every=2, progress_bar=False,
                      aux_loss=lambda step, m: 10.0 * m.gate.pow(2).sum())   # a gate regulariser: not task loss
    assert sorted(h.step.unique()) == [0, 2, 4] and (h.router_grad_norm > 0).all() and not h.router_frozen.any()
    # naive: the first batch drawn as the loop draws it, CE summed over models, .grad of each model's gate rows
    batch = torch.as_tensor(docs)[np.random.default_rng(3).integers(0, len(docs), 4)]
    _nll(ref(batch[:, :-1]), batch).mean(1).sum().backward()
    naive = ref.gate.grad.flatten(1).norm(dim=1)
    np.testing.assert_allclose(h[h.step == 0].sort_values("model").router_grad_norm, naive.numpy(), rtol=1e-5)


def test_stacked_loop_zero_gate_grad_raises_unless_frozen():
    # routing weights detached from the gate: the gate can get no task gradient (only a regulariser could train it)
    docs = np.random.default_rng(0).integers(0, 11, (32, 7))

    def cut(model):
        model.route = lambda u, active: tuple(t.detach() for t in StackedMoETransformer.route(model, u, active))
        return model

    with pytest.raises(RuntimeError, match=r"'cut-gate'.*model 0"):
        train_stacked(cut(_stacked()), docs, steps=3, batch_size=4, lr=1e-2, progress_bar=False, desc="cut-gate")
    h = train_stacked(cut(_stacked()), docs, steps=3, batch_size=4, lr=1e-2, progress_bar=False,
                      desc="cut-gate", router_frozen=True)
    assert (h.router_grad_norm < D.ZERO_GRAD_TOL).all() and h.router_frozen.all()
    # a single-expert pool has probability 1 under any rule: zero gradient, nothing to route, so not an error
    h1 = train_stacked(_stacked(E=1, top_k=1), docs, steps=3, batch_size=4, lr=1e-2, progress_bar=False)
    assert (h1.router_grad_norm < D.ZERO_GRAD_TOL).all() and (h1.active_experts == 1).all()


def test_router_grad_summary_for_training_tables():
    import math

    import pandas as pd

    from moelab.core.diagnostics import router_grad_summary

    h = pd.DataFrame({"step": [1, 2, 3, 4], "router_grad_norm": [0.5, float("nan"), 0.2, 0.3]})
    assert router_grad_summary(h) == {"router_grad_norm_min": 0.2, "router_grad_norm_last": 0.3}
    none = router_grad_summary(pd.DataFrame({"step": [1], "loss": [1.0]}))    # a dense run: no router logged
    assert all(math.isnan(v) for v in none.values())
    assert all(math.isnan(v) for v in router_grad_summary(None).values())


def test_training_tables_show_router_grad_norm():
    import pandas as pd

    from moelab import sba

    h = pd.DataFrame({"step": [1, 2, 3], "mnrl": [2.0, 1.5, 1.2], "router_grad_norm": [0.4, 0.3, 0.1]})
    v = pd.DataFrame({"step": [1, 3], "val_mnrl": [2.1, 1.4]})
    runs = {("linear", 0): {"history": h, "val": v, "flattened": (False, 0.3), "wall_s": 1.0}}
    row = sba.training_table(runs).iloc[0]
    assert row.router_grad_norm_min == 0.1 and row.router_grad_norm_last == 0.1
