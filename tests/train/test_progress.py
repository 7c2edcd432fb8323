"""Progress bars through one helper: ``moelab.progress``, switched by ``MOELAB_PROGRESS``.

A trainer run with progress enabled writes a tqdm bar with a time estimate (``elapsed<remaining``) to stderr; with
``MOELAB_PROGRESS=0`` (what the runner sets for ``--no-progress`` and smoke runs) it writes none."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from moelab import progress
from moelab.train import TrainConfig, train

torch.set_num_threads(1)

BAR = re.compile(r"\d+/\d+ \[\d\d:\d\d<\d\d:\d\d")    # "3/5 [00:01<00:00": done/total [elapsed<time left


@pytest.mark.parametrize("value, on", [(None, True), ("1", True), ("text", True), ("0", False)])
def test_enabled_follows_env(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv(progress.ENV, raising=False)
    else:
        monkeypatch.setenv(progress.ENV, value)
    assert progress.enabled() is on
    b = progress.bar(range(3), desc="x")
    assert b.disable is (not on) and b.total == 3
    b.close()


def test_bad_env_and_arguments(monkeypatch):
    monkeypatch.setenv(progress.ENV, "yes please")
    with pytest.raises(ValueError, match="MOELAB_PROGRESS='yes please'"):
        progress.enabled()
    monkeypatch.setenv(progress.ENV, "1")
    with pytest.raises(ValueError, match="total"):
        progress.bar(total=-1)
    with pytest.raises(ValueError, match="disable"):
        progress.bar(range(2), disable="no")


def test_bar_writes_time_left_and_nothing_when_off(monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV, "1")
    assert list(progress.bar(range(4), desc="grid", unit="cell", mininterval=0)) == [0, 1, 2, 3]
    err = capsys.readouterr().err
    assert "grid" in err and BAR.search(err) and "cell/s" in err
    monkeypatch.setenv(progress.ENV, "0")
    assert list(progress.bar(range(4), desc="grid")) == [0, 1, 2, 3]
    assert capsys.readouterr().err == ""


def test_logged_bars_are_plain_lines(monkeypatch, capsys):
    """A bar written to a log (the runner's ``log`` mode when its stderr is not a terminal, or ``auto`` in a
    script whose stderr is a file) carries no escape codes and no carriage returns, nested bars included."""
    monkeypatch.setenv(progress.ENV, "log")
    for _ in progress.bar(range(3), desc="outer", mininterval=0):
        for _ in progress.bar(range(2), desc="inner", mininterval=0):
            pass
    err = capsys.readouterr().err
    assert "outer" in err and "inner" in err and BAR.search(err)
    assert "\x1b" not in err and "\r" not in err and "" not in err.splitlines()
    monkeypatch.setenv(progress.ENV, "1")     # auto, stderr captured (not a terminal), not in a kernel
    assert progress.mode() == "log"


def _tiny_run(progress_arg=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    return train(model, loader, loss_fn=lambda m, b: (nn.functional.cross_entropy(m(b[0]), b[1]), {}),
                 cfg=TrainConfig(steps=5, device="cpu", desc="tinyrun", progress=progress_arg))


def test_trainer_bar_follows_env(monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV, "1")
    _tiny_run()
    err = capsys.readouterr().err
    assert "tinyrun" in err and BAR.search(err) and "5/5" in err
    monkeypatch.setenv(progress.ENV, "0")
    _tiny_run()
    err = capsys.readouterr().err
    assert "tinyrun" not in err and not BAR.search(err)
    _tiny_run(progress_arg=True)                    # an explicit argument overrides the environment
    assert BAR.search(capsys.readouterr().err)
