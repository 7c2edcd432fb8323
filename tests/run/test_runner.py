"""The notebook runner and where outputs go.

Interactive runs write to a scratch folder; publishing swaps a finished run into ``figures/`` with renames, so a
failed or killed run (tested with real papermill runs, one of them SIGKILLed mid-cell) never leaves a mixed folder
and never an empty ``paper/``; publishing ``default`` keeps ``full/`` and ``paper/``.
"""
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from helpers.runner import point_runner, tree

from moelab.runner import cli, notebook_run
from moelab.runner.notebook_run import NotebookRun

# the tiny notebooks below are named after the primer so that its claim definitions apply (every table they need is
# missing here, so every claim comes out inconclusive / not testable, which is all these tests need)
NB = "00_moe_primer"
HEADER = '# %% tags=["parameters"]\nPROFILE = "default"\nSEED = 0\nTAG = "a"\n\n'


def _write_nb(nbdir: Path, body: str) -> Path:
    nbdir.mkdir(parents=True, exist_ok=True)
    src = nbdir / f"{NB}.py"
    src.write_text(HEADER + "# %%\nimport pandas as pd\nimport moelab\n"
                   f'run = moelab.start_run("{NB}", profile=PROFILE, seed=SEED)\n' + body)
    return src


_tree = tree


@pytest.fixture
def runner(tmp_path, tmp_figures, monkeypatch):
    return point_runner(tmp_path, monkeypatch)


def test_params_parse_and_only_needs_a_value(runner):
    assert cli.parse_params(["MODEL_PATH=/m/x", "STEPS=50", "LR=1e-3", "NAME=a=b", "FLAG=True"]) == {
        "MODEL_PATH": "/m/x", "STEPS": 50, "LR": 1e-3, "NAME": "a=b", "FLAG": True}
    with pytest.raises(ValueError, match="NAME=VALUE"):
        cli.parse_params(["MODEL_PATH"])
    with pytest.raises(ValueError, match="--profile"):
        cli.parse_params(["PROFILE=full"])
    r = subprocess.run([sys.executable, "-m", "moelab.runner", "run", "--only"], capture_output=True, text=True)
    assert r.returncode == 2 and "--only" in r.stderr


def test_interactive_runs_go_to_scratch(runner, tmp_figures, monkeypatch):
    monkeypatch.delenv("MOELAB_PUBLISH", raising=False)
    run = NotebookRun(NB, "default")
    assert run.out_dir == runner / "scratch" / "default" / NB
    run.save_table(pd.DataFrame({"a": [1]}), "table1", "x")
    run.finish()
    assert (run.out_dir / "claims.json").exists() and not (tmp_figures / "figures" / NB).exists()
    with pytest.raises(ValueError, match="never published"):
        NotebookRun(NB, "smoke", publish=True)


def test_publish_replaces_atomically_and_keeps_other_profiles(runner, tmp_figures):
    fig = tmp_figures / "figures" / NB
    full = NotebookRun(NB, "full", publish=True)
    full.save_table(pd.DataFrame({"a": [1]}), "table1", "full")
    full.finish()
    first = NotebookRun(NB, "default", publish=True)
    assert first.out_dir.name.startswith(f".{NB}.staging-")
    assert sorted(p.name for p in fig.iterdir()) == ["full"]               # nothing visible until finish
    first.save_table(pd.DataFrame({"a": [1]}), "table1", "old")
    assert sorted(p.name for p in fig.iterdir()) == ["full"]
    first.save_table(pd.DataFrame({"a": [1]}), "table2", "dropped-later")
    first.finish()
    assert (fig / "table2_dropped-later.csv").exists() and (fig / "full" / "table1_full.csv").exists()
    second = NotebookRun(NB, "default", publish=True)
    second.save_table(pd.DataFrame({"a": [2]}), "table1", "old")
    second.finish()
    assert not (fig / "table2_dropped-later.csv").exists()           # no stale file of the earlier run survives
    assert (fig / "full" / "table1_full.csv").exists()                # full/ kept
    assert "table2_dropped-later" not in (tmp_figures / "figures" / "INDEX.md").read_text()
    assert not [p for p in fig.parent.iterdir() if p.name.startswith(".")]
    # publishing full leaves the default files alone
    before = {k: v for k, v in _tree(fig).items() if not k.startswith("full/")}
    NotebookRun(NB, "full", publish=True).finish()
    assert {k: v for k, v in _tree(fig).items() if not k.startswith("full/")} == before


def test_failed_run_leaves_published_folder_untouched(runner, tmp_figures):
    _write_nb(runner / "nbs", 'run.save_table(pd.DataFrame({"a": [1]}), "table1", "x")\nrun.finish()\n')
    args = ["run", "--profile", "default", "--no-progress", "--force", "--only", "00"]
    repo_readme = (cli.REPO_ROOT / "README.md").read_bytes()
    assert cli.main(args) == 0
    assert (cli.REPO_ROOT / "README.md").read_bytes() == repo_readme   # published elsewhere: README untouched
    fig = tmp_figures / "figures" / NB
    before = _tree(fig)
    assert "provenance.json" in before and "claims.json" in before
    _write_nb(runner / "nbs", 'run.save_table(pd.DataFrame({"a": [2]}), "table1", "x")\n'
                              'run.save_table(pd.DataFrame({"a": [2]}), "table2", "y")\n1/0\n')
    assert cli.main(args) == 1
    assert _tree(fig) == before
    assert not [p for p in fig.parent.iterdir() if p.name.startswith(".")]   # staging removed
    # a failed paper run leaves no paper/ folder at all
    assert cli.main(["run", "--profile", "paper", "--no-progress", "--only", "00"]) == 1
    assert not (fig / "paper").exists() and not [p for p in fig.iterdir() if p.name.startswith(".")]


def test_killed_run_leaves_published_folder_untouched(runner, tmp_figures):
    _write_nb(runner / "nbs", 'run.save_table(pd.DataFrame({"a": [1]}), "table1", "x")\nrun.finish()\n')
    assert cli.main(["run", "--profile", "default", "--no-progress", "--force", "--only", "00"]) == 0
    fig = tmp_figures / "figures" / NB
    before = _tree(fig)
    _write_nb(runner / "nbs", 'run.save_table(pd.DataFrame({"a": [3]}), "table1", "x")\n'
                              'import time\ntime.sleep(120)\nrun.finish()\n')
    env = {**os.environ, "MOELAB_FIGURES": str(tmp_figures / "figures"), "MOELAB_SCRATCH": str(runner / "scratch")}
    code = ("import sys; from pathlib import Path; from moelab.runner import cli as n; "
            f"n.NB_DIR = Path({str(runner / 'nbs')!r}); n.RUNS = Path({str(runner / 'runs')!r}); "
            "sys.exit(n.main(['run', '--profile', 'default', '--no-progress', '--force', '--only', '00']))")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:      # wait until the run has written into its staging folder
            staged = [p for p in fig.parent.glob(f".{NB}.staging-*") if (p / "table1_x.csv").exists()]
            if staged:
                break
            time.sleep(0.5)
        assert staged, "the run never wrote its staging folder"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)   # the runner, mid-cell ...
        proc.wait(timeout=30)
        for p in staged:                      # ... and its kernel (jupyter starts kernels in a session of their own)
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(p.name.rsplit("-", 1)[1]), signal.SIGKILL)
    time.sleep(1)
    assert _tree(fig) == before
    # the next start cleans the dead run's staging folder
    NotebookRun(NB, "default", publish=True)
    leftovers = [p.name for p in fig.parent.iterdir() if p.name.startswith(".")]
    assert len(leftovers) == 1 and str(os.getpid()) in leftovers[0]


def test_recover_after_kill_between_renames(runner, tmp_figures):
    """Every intermediate state of the swap is recoverable: final renamed away, subfolders moved, not yet swapped."""
    fig = tmp_figures / "figures" / NB
    (fig / "full").mkdir(parents=True)
    (fig / "table1_x.csv").write_text("a\n1\n")
    (fig / "full" / "f.csv").write_text("b\n")
    before = _tree(fig)
    dead = 2 ** 22 + 12345           # a pid that is not running
    old, staging = fig.parent / f".{NB}.old-{dead}", fig.parent / f".{NB}.staging-{dead}"
    staging.mkdir()
    (staging / "table1_x.csv").write_text("a\n2\n")
    os.replace(fig, old)
    os.replace(old / "full", staging / "full")
    notebook_run.recover_published(fig, "default")
    assert _tree(fig) == before and not old.exists() and not staging.exists()


def test_missing_paper_inputs_say_what_to_pass():
    from moelab import free_moe
    from moelab.assets import MissingAsset

    with pytest.raises(MissingAsset) as e:
        free_moe.experiment.load_local_model(None)
    msg = str(e.value)
    assert "make assets" not in msg and "-p MODEL_PATH=" in msg


def test_verify_catches_a_change_that_flips_a_verdict(runner, tmp_figures, monkeypatch, tmp_path):
    """Publish a tiny notebook whose table gives the primer's top-p claim a 'reproduced' verdict, then change the
    notebook so that the cold rerun gives another verdict: `verify` reports it and exits 1; unchanged, it passes."""
    monkeypatch.setattr(cli, "VERIFY", tmp_path / "verify")
    monkeypatch.setattr(cli, "VERIFY_DOCS", tmp_path / "verify-docs")
    monkeypatch.setenv("MOELAB_CACHE", str(tmp_path / "cache"))
    body = ('import numpy as np\ncfg = {"top_p": [0.5], "top_k": 2}\nrun.save_json(cfg, "config")\n'
            'rng = np.random.default_rng(0)\n'
            'rows = [dict(rule="top-2", layer=0, token=t, active=2) for t in range(300)]\n'
            'rows += [dict(rule="top-p 0.5", layer=0, token=t, active=int(1 + (VARY and rng.random() < 0.4)))\n'
            '         for t in range(300)]\n'
            'run.save_table(pd.DataFrame(rows), "table6", "active_experts")\nrun.finish()\n')
    _write_nb(runner / "nbs", "VARY = True\n" + body)
    assert cli.main(["run", "--profile", "default", "--no-progress", "--force", "--only", "00"]) == 0
    committed = json.loads((tmp_figures / "figures" / NB / "claims.json").read_text())
    # top-p's varying count on a fixed router is a test over tokens: it decides
    assert {c["id"]: c["verdict"] for c in committed["claims"]}["top_p_count_varies"] == "reproduced"
    verify = ["verify", "--profile", "default", "--no-progress", "--only", "00"]
    assert cli.main(verify) == 0                                   # same code: every claim agrees
    _write_nb(runner / "nbs", "VARY = False\n" + body)                  # the deliberate change
    assert cli.main(verify) == 1
    report = (tmp_path / "verify-docs" / f"{NB}.md").read_text()
    assert "| top_p_count_varies | reproduced |" in report and "flipped" in report
    assert json.loads((tmp_figures / "figures" / NB / "claims.json").read_text()) == committed   # never published


def test_verify_reruns_with_the_committed_runs_thread_count(runner, tmp_figures, monkeypatch, tmp_path):
    """The committed provenance says how many torch threads the run used; the cold rerun gets the same count (its
    kernel sees OMP_NUM_THREADS / MKL_NUM_THREADS), and the variables are restored afterwards."""
    monkeypatch.setattr(cli, "VERIFY", tmp_path / "verify")
    monkeypatch.setattr(cli, "VERIFY_DOCS", tmp_path / "verify-docs")
    monkeypatch.setenv("MOELAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    _write_nb(runner / "nbs", 'import torch\nrun.save_json({"threads": torch.get_num_threads()}, "threads")\n'
                              'run.finish()\n')
    assert cli.main(["run", "--profile", "default", "--no-progress", "--force", "--only", "00"]) == 0
    fig = tmp_figures / "figures" / NB
    prov = json.loads((fig / "provenance.json").read_text())
    prov["hardware"]["torch_threads"] = 1
    (fig / "provenance.json").write_text(json.dumps(prov))
    assert cli.committed_threads(fig / "provenance.json") == {"OMP_NUM_THREADS": 1, "MKL_NUM_THREADS": 1}
    cli.main(["verify", "--profile", "default", "--no-progress", "--only", "00"])
    fresh = tmp_path / "verify" / NB / "scratch" / "default" / NB / "threads.json"
    assert json.loads(fresh.read_text()) == {"threads": 1}
    assert os.environ["OMP_NUM_THREADS"] == "7" and "MKL_NUM_THREADS" not in os.environ
    assert cli.committed_threads(tmp_path / "nowhere.json") == {}


def test_resume_skip_recomputes_claims_and_verdict_code_is_not_a_source(runner, tmp_figures):
    """Verdict code is not part of a run's sources (a claims change never reruns a notebook); a skipped, current
    notebook gets its claims recomputed from its saved tables instead."""
    _write_nb(runner / "nbs", 'run.save_table(pd.DataFrame({"a": [1]}), "table1", "x")\nrun.finish()\n')
    args = ["run", "--profile", "default", "--no-progress", "--only", "00"]
    assert cli.main(args + ["--force"]) == 0
    fig = tmp_figures / "figures" / NB
    prov = json.loads((fig / "provenance.json").read_text())
    assert prov["sources"] and not [k for k in prov["sources"] if k.startswith(notebook_run.VERDICT_CODE)]
    good = (fig / "claims.json").read_text()
    data = json.loads(good)
    data["claims"][0]["verdict"] = "reproduced" if data["claims"][0]["verdict"] != "reproduced" else "contradicted"
    (fig / "claims.json").write_text(json.dumps(data))
    # the tiny notebook is not the real 00 source, so the resume check sees a changed source: pretend it is current
    prov["sources"] = {k: v for k, v in prov["sources"].items() if not k.startswith("notebooks/")}
    (fig / "provenance.json").write_text(json.dumps(prov))
    assert cli.main(args) == 0
    assert json.loads((fig / "claims.json").read_text())["claims"] == json.loads(good)["claims"]


def test_publishing_a_default_keeps_a_running_full_staging_folder(tmp_path):
    """A default published while the same notebook's full is running must not delete the full's staging folder (it
    lives inside the default's folder until the full publishes)."""
    final, staging = tmp_path / "05_x", tmp_path / ".05_x.staging-1"
    (final / "full").mkdir(parents=True)
    (final / "full" / "claims.json").write_text("{}")
    (final / ".full.staging-4242").mkdir()
    (final / ".full.staging-4242" / "table.csv").write_text("a\n1\n")
    (final / "old.csv").write_text("old")
    staging.mkdir()
    (staging / "new.csv").write_text("new")
    notebook_run.publish_dir(staging, final, "default")
    assert (final / "new.csv").exists() and not (final / "old.csv").exists()
    assert (final / "full" / "claims.json").exists()
    assert (final / ".full.staging-4242" / "table.csv").read_text() == "a\n1\n"
