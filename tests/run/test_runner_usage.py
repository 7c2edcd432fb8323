"""The runner defects a new user hit, each shown on a tiny notebook run by the
real runner (papermill, a real kernel): the seed and every ``-p`` value are part of what "current" means; an unknown
``-p`` name exits 2 naming the notebook's parameters; a skipped run removes a killed run's staging folder; the kernel
does not warn about TCP; a publishing run from a tree with changed sources warns; ``make verify`` rewrites its report
only when it says something new; ``make figures P=...`` keeps a value with spaces whole; a commit is not "+dirty"
because of files runs write; 00's last cell shows the reader's columns of the claims."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from moelab.runner import cli, notebook_run

from helpers import ROOT

NB = "00_moe_primer"


def _write_nb(nbdir: Path) -> Path:
    nbdir.mkdir(parents=True, exist_ok=True)
    src = nbdir / f"{NB}.py"
    src.write_text('# %% tags=["parameters"]\nPROFILE = "default"\nSEED = 0\nTAG = "a"\n\n'
                   "# %%\nimport pandas as pd\nimport moelab\n"
                   f'run = moelab.start_run("{NB}", profile=PROFILE, seed=SEED)\n'
                   'run.save_table(pd.DataFrame({"tag": [TAG], "seed": [SEED]}), "table1", "x")\nrun.finish()\n')
    return src


@pytest.fixture
def runner(tmp_path, tmp_figures, monkeypatch):
    monkeypatch.setattr(cli, "NB_DIR", tmp_path / "nbs")
    monkeypatch.setattr(cli, "RUNS", tmp_path / "runs")
    monkeypatch.setenv("MOELAB_SCRATCH", str(tmp_path / "scratch"))
    _write_nb(tmp_path / "nbs")
    return tmp_path


def _run(capfd, *args):
    rc = cli.main(["run", "--only", "00", "--no-progress", *args])
    out, err = capfd.readouterr()
    return rc, out, err


def test_seed_and_params_decide_current_scratch_and_published(runner, capfd, monkeypatch):
    table = runner / "scratch" / "smoke" / NB / "table1_x.csv"
    assert _run(capfd, "--profile", "smoke")[0] == 0
    rc, out, err = _run(capfd, "--profile", "smoke")
    assert rc == 0 and "up to date" in out
    assert "without encryption" not in err            # the kernel listens on IPC sockets, not TCP
    rc, out, _ = _run(capfd, "--profile", "smoke", "--seed", "1")
    assert rc == 0 and "up to date" not in out and pd.read_csv(table).seed.tolist() == [1]
    rc, out, _ = _run(capfd, "--profile", "smoke", "--seed", "1", "-p", "TAG='b'")
    assert rc == 0 and "up to date" not in out and pd.read_csv(table).tag.tolist() == ["b"]
    assert "up to date" in _run(capfd, "--profile", "smoke", "--seed", "1", "-p", "TAG='b'")[1]
    assert "up to date" not in _run(capfd, "--profile", "smoke", "--seed", "1")[1]   # back to the default TAG
    # published: the same rule, and a publishing run from a tree with changed sources warns loudly
    monkeypatch.setattr(cli, "dirty_sources", lambda: [" M lib/moelab/core/layer.py"])
    rc, out, err = _run(capfd, "--profile", "default")
    assert rc == 0 and "WARNING" in err and "lib/moelab/core/layer.py" in err
    fig = runner / "figures" / NB
    assert json.loads((fig / "provenance.json").read_text())["params"] == {}
    rc, out, _ = _run(capfd, "--profile", "default", "--seed", "2")
    assert rc == 0 and "up to date" not in out and pd.read_csv(fig / "table1_x.csv").seed.tolist() == [2]
    # a killed run's staging folder (dead pid) is removed by the next run even when that run is skipped
    dead = fig.parent / f".{NB}.staging-{2 ** 22 + 4321}"
    dead.mkdir()
    rc, out, _ = _run(capfd, "--profile", "default", "--seed", "2")
    assert rc == 0 and "up to date" in out and not dead.exists()
    # notebook-md rewrites a published folder's Markdown from the executed notebook the runner kept (same run only)
    (fig / "notebook.md").unlink()
    assert cli.main(["notebook-md", str(fig)]) == 0 and "SEED = 2" in (fig / "notebook.md").read_text()
    prov = json.loads((fig / "provenance.json").read_text())
    (fig / "provenance.json").write_text(json.dumps({**prov, "seed": 5}))
    assert cli.main(["notebook-md", str(fig)]) == 2 and "SEED=2" in capfd.readouterr().err


def test_unknown_parameter_exits_2_naming_the_notebooks_parameters(runner, capfd):
    rc, out, err = _run(capfd, "--profile", "smoke", "-p", "TGA=1")
    assert rc == 2 and "TGA" in err and "TAG" in err
    assert not (runner / "runs").exists()                           # nothing ran
    assert cli.notebook_parameters(ROOT / "notebooks" / "05_free_moe.py")[:4] == ["PROFILE", "SEED", "DRY_RUN",
                                                                                      "MODEL_PATH"]
    nbs = [runner / "nbs" / f"{NB}.py", ROOT / "notebooks" / "05_free_moe.py"]
    assert cli.params_for(nbs, {"MODEL_PATH": "/m"}) == {NB: {}, "05_free_moe": {"MODEL_PATH": "/m"}}


def test_make_figures_passes_P_whole(tmp_path):
    """``make figures P="..."``: a value with spaces and quotes reaches the runner as one string and parses whole."""
    if shutil.which("make") is None:
        pytest.skip("make not installed")
    stub = tmp_path / "py"
    stub.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path / 'argv'}\n")
    stub.chmod(0o755)
    p = "DATA_PATHS={'a': '/x', 'b': '/y z'} SEEDS=[1, 2]"
    r = subprocess.run(["make", "-o", "assets-gemma", "figures", f"PY={stub}", f"P={p}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    value = argv[argv.index("--params") + 1]
    assert cli.parse_params(cli.split_params(value)) == {"DATA_PATHS": {"a": "/x", "b": "/y z"},
                                                                     "SEEDS": [1, 2]}


def test_verify_report_rewritten_only_when_it_says_something_new(tmp_path):
    rows = [dict(claim="c1", committed="reproduced", fresh="reproduced", committed_ours=0.5, fresh_ours=0.51,
                 ci=(0.4, 0.6), status="ok")]
    path = tmp_path / "00.md"
    assert cli.write_verify_report(path, cli.verify_report(NB, "default", rows, "aaa"))
    first = path.read_text()
    rows[0]["fresh_ours"] = 0.52                     # another commit, a number still inside its interval
    assert not cli.write_verify_report(path, cli.verify_report(NB, "default", rows, "bbb"))
    assert path.read_text() == first
    assert cli.write_verify_report(path, cli.verify_report(NB, "default", rows, "bbb"), force=True)
    rows[0].update(fresh="contradicted", status="flipped")
    assert cli.write_verify_report(path, cli.verify_report(NB, "default", rows, "bbb"))
    assert "flipped" in path.read_text()


def test_outputs_runs_write_do_not_make_the_commit_dirty(tmp_path, monkeypatch):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    files = ["lib/a.py", "figures/x/claims.json", "docs/verify/00.md", "docs/verdict-changes.md", "README.md",
             "docs/timings.md"]
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("1\n")
    subprocess.run(git + ["init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(git + ["add", "."], cwd=tmp_path, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "x"], cwd=tmp_path, check=True)
    monkeypatch.setattr(notebook_run, "REPO_ROOT", tmp_path)
    for f in files[1:]:
        (tmp_path / f).write_text("2\n")
    assert not notebook_run.git_commit().endswith("+dirty")
    (tmp_path / "lib/a.py").write_text("2\n")
    assert notebook_run.git_commit().endswith("+dirty") and notebook_run.dirty_sources() == [" M lib/a.py"]


def test_primer_shows_the_claims_columns_a_reader_needs():
    records = pd.DataFrame([{c: None for c in ("id", "claim", "paper_ref", "metric", "unit", "paper_value", "kind",
                                               "ours", "ci_low", "ci_high", "n_items", "mde", "verdict", "reason")}])
    view = notebook_run.claims_for_reader(records)
    assert "verdict" in view.columns and len(view.columns) <= 8
    last = (ROOT / "notebooks" / f"{NB}.py").read_text().rstrip().splitlines()[-1]
    assert last.startswith("moelab.runner.notebook_run.claims_for_reader(claims)")
