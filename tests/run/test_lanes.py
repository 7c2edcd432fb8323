"""Lanes (issue 49): ``python -m moelab.runner run --jobs N`` runs notebooks side by side, longest first by the wall
times their folders recorded, one torch thread each, a log per notebook; a failing notebook does not stop the other
lane; Ctrl-C during a two-lane publish leaves ``figures/`` as it was and no kernel running; ``--jobs 1`` is the
single-lane runner as before. The lane tests run tiny notebooks with the real runner (papermill, real kernels); their
claim definitions are an empty list registered by the notebook itself, so that publishing needs no paper's claims."""
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moelab.runner import cli, lanes
from moelab.runner.notebook_run import _pid_alive

from helpers import ROOT
from helpers.runner import point_runner, tree

A, B = "00_moe_primer", "01_moce"


def _write_nb(nbdir: Path, name: str, body: str) -> Path:
    """A tiny notebook ``name`` whose claims are an empty list (registered in its first cell), then ``body``."""
    nbdir.mkdir(parents=True, exist_ok=True)
    src = nbdir / f"{name}.py"
    src.write_text('# %% tags=["parameters"]\nPROFILE = "default"\nSEED = 0\n\n'
                   "# %%\nimport sys, time, types\nimport pandas as pd\nfrom moelab.claims import registry\n"
                   'sys.modules["lane_test_claims"] = types.ModuleType("lane_test_claims")\n'
                   'sys.modules["lane_test_claims"].CLAIMS = []\n'
                   f'registry.CLAIM_DEFS["{name}"] = "lane_test_claims"\n'
                   f'import moelab\nrun = moelab.start_run("{name}", profile=PROFILE, seed=SEED)\n\n# %%\n' + body)
    return src


_tree = tree


@pytest.fixture
def runner(tmp_path, tmp_figures, monkeypatch):
    return point_runner(tmp_path, monkeypatch)


def test_longest_first_by_the_recorded_wall_times(runner, monkeypatch):
    """Notebooks without a recorded time go first (series order), then by decreasing recorded time; the runner reads
    the times from each folder's provenance.json (a scratch run from the published one's) and hands the lanes that
    order, each lane on one torch thread with the lane count in its specification."""
    assert lanes.longest_first(["00", "01", "02", "03", "04"], {"00": 93.0, "01": 1093.0, "02": None, "03": 638.0,
                                                                "04": 1093.0}) == ["02", "01", "04", "03", "00"]
    walls = {"00_a": 93.0, "01_b": 1093.0, "02_c": None, "03_d": 638.0}
    for name, wall in walls.items():
        (runner / "nbs").mkdir(exist_ok=True)
        (runner / "nbs" / f"{name}.py").write_text('# %% tags=["parameters"]\nPROFILE = "default"\nSEED = 0\n')
        if wall is not None:
            (runner / "figures" / name).mkdir(parents=True)
            (runner / "figures" / name / "provenance.json").write_text(json.dumps({"wall_time_s": wall}))
    seen = []
    monkeypatch.setattr(lanes, "run_lanes", lambda tasks, jobs, **kw: (seen.append((tasks, jobs)), ([], False))[1])
    for extra in ([], ["--scratch"]):
        seen.clear()
        assert cli.main(["run", "--force", "--no-progress", "--jobs", "2", *extra]) == 0
        tasks, jobs = seen[0]
        assert jobs == 2 and [t.name for t in tasks] == ["02_c", "01_b", "03_d", "00_a"]
        assert [t.expected_s for t in tasks] == [None, 1093.0, 638.0, 93.0]
        spec = json.loads(tasks[0].argv[-1])
        assert tasks[0].argv[1:4] == ["-m", "moelab.runner", "_lane"] and spec["jobs"] == 2
        assert spec["publish"] is not bool(extra) and tasks[0].log == runner / "runs" / "default" / "02_c.log"
    env = lanes.lane_env({"OMP_NUM_THREADS": "8"})
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"


def test_status_lines_redraw_in_place_on_a_terminal_and_print_once_a_minute_into_a_log(monkeypatch):
    """One line per running notebook (name, cell i/n, elapsed, time left from the last recorded run); on a terminal
    the block is redrawn in place (events print above it), into a log it is printed every LOG_EVERY_S seconds."""
    line = lanes.status_line("02_sba", {"cell": 12, "cells": 40}, 303, 915)
    assert line.split() == ["02_sba", "cell", "12/40", "5:03", "elapsed", "~10:12", "left", "(last", "run", "15:15)"]
    assert "starting" in lanes.status_line("02_sba", {}, 3, None) and "unknown" in lanes.status_line("x", {}, 3, None)
    assert "past the last run's 1:00" in lanes.status_line("x", {"cell": 1, "cells": 2}, 75, 60)
    assert lanes.clock(3723) == "1:02:03"
    out = io.StringIO()
    board = lanes.Board(out, tty=True)
    board.show(["a 1", "b 1"])
    board.show(["a 2", "b 2"])
    board.event("a: ok")
    assert out.getvalue() == "a 1\nb 1\n\x1b[2F\x1b[Ja 2\nb 2\n\x1b[2F\x1b[Ja: ok\n"
    log = io.StringIO()
    board = lanes.Board(log, tty=False)
    board.show(["a 1"])
    assert log.getvalue() == ""
    monkeypatch.setattr(lanes, "LOG_EVERY_S", 0.0)
    board.show(["a 2"])
    assert log.getvalue() == "  .. a 2\n"
    quiet = io.StringIO()
    lanes.Board(quiet, live=False, tty=True).show(["a 1"])
    assert quiet.getvalue() == ""


def test_jobs_1_is_the_single_lane_runner_as_before(runner, monkeypatch, capsys):
    """Without --jobs (and with --jobs 1) the runner runs each notebook in its own process, in series order, with
    run_one called as before (no lane, no thread pinning) and the same lines and table as before."""
    for name in ("00_a", "01_b"):
        (runner / "nbs").mkdir(exist_ok=True)
        (runner / "nbs" / f"{name}.py").write_text('# %% tags=["parameters"]\nPROFILE = "default"\nSEED = 0\n')
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    calls = []

    def fake_run_one(src, profile, **kw):
        calls.append((src.stem, profile, kw, os.environ.get("OMP_NUM_THREADS")))
        if src.stem == "01_b":
            raise RuntimeError("boom")
        return 2.0

    monkeypatch.setattr(cli, "run_one", fake_run_one)
    monkeypatch.setattr(lanes, "run_lanes", lambda *a, **k: pytest.fail("--jobs 1 must not start lanes"))
    outs = []
    for extra in ([], ["--jobs", "1"]):
        calls.clear()
        assert cli.main(["run", "--force", "--no-progress", *extra]) == 1
        outs.append(capsys.readouterr().out)
        assert [c[0] for c in calls] == ["00_a", "01_b"] and {c[3] for c in calls} == {None}
        assert calls[0][2] == {"seed": 0, "progress": False, "timeout": None, "publish": True, "params": {}}
    assert outs[0] == outs[1] == (
        "profile default: publishing into figures/\n"
        "[1/2] 00_a: running profile default ...\n[1/2] 00_a: ok in 2 s\n"
        "[2/2] 01_b: running profile default ...\n[2/2] 01_b: FAILED after 0 s\n    boom\n\n"
        "notebook                         status    wall time\n"
        "00_a                             ok              2 s\n"
        "01_b                             FAILED          0 s\n"
        f"executed notebooks: {runner / 'runs' / 'default'}\n")
    assert cli.main(["run", "--jobs", "0"]) == 2
    recipe = (ROOT / "Makefile").read_text().split("\nfigures:", 1)[1].split("\n\n", 1)[0]
    assert "--jobs $(JOBS)" in recipe


def test_a_failing_notebook_does_not_stop_the_other_lane(runner, capfd):
    """B fails while A runs (A waits until B's lane has recorded the failure): A still finishes and publishes (with
    the lane count, one torch thread and its peak memory in its provenance), B's published folder stays as it was,
    and the run exits 1 naming B, the cell it failed in and its log."""
    status_b = runner / "runs" / "default" / f"{B}.status.json"
    _write_nb(runner / "nbs", A, f"from pathlib import Path\nstatus_b = Path({str(status_b)!r})\n"
                                 "deadline = time.time() + 120\n"
                                 "while time.time() < deadline and not (status_b.exists() and "
                                 "'failed' in status_b.read_text()):\n    time.sleep(0.5)\n"
                                 'run.save_table(pd.DataFrame({"a": [1]}), "table1", "x")\nrun.finish()\n')
    _write_nb(runner / "nbs", B, "1/0\n")
    published_b = runner / "figures" / B
    published_b.mkdir(parents=True)
    (published_b / "table1_x.csv").write_text("a\n0\n")
    rc = cli.main(["run", "--force", "--no-progress", "--jobs", "2"])
    out = capfd.readouterr().out
    assert rc == 1, out
    log_b = runner / "runs" / "default" / f"{B}.log"
    assert f"FAILED: {B} at cell 4/4; log {log_b}" in out and "ZeroDivisionError" in log_b.read_text()
    assert out.index(f"{B}: FAILED after") < out.index(f"{A}: ok in")          # A finished after B had failed
    assert (runner / "runs" / "default" / f"{A}.log").exists()
    prov = json.loads((runner / "figures" / A / "provenance.json").read_text())
    assert prov["jobs"] == 2 and prov["hardware"]["torch_threads"] == 1 and prov["memory"]["peak_rss_mib"] > 0
    assert _tree(published_b) == {"table1_x.csv": b"a\n0\n"}
    assert not [p for p in (runner / "figures").iterdir() if p.name.startswith(".")]
    table = out[out.index("notebook  "):]
    assert re.search(rf"^{A} +ok +1 ", table, re.M) and re.search(rf"^{B} +FAILED +2 .*cell 4/4; log {log_b}$", table,
                                                                  re.M)


# In the runner's processes (PAUSE_PUBLISH set): the lane publishing A stops right after its first rename (A's
# published folder moved aside, the new one not yet in place), says so in a file, and waits there.
PAUSE_HOOK = f'''import os
import time

if os.environ.get("PAUSE_PUBLISH"):
    _replace = os.replace

    def replace(src, dst, *a, **k):
        _replace(src, dst, *a, **k)
        if os.path.basename(str(dst)).startswith(".{A}.old-"):
            open(os.environ["PAUSE_PUBLISH"], "w").close()
            time.sleep(300)

    os.replace = replace
'''


def test_ctrl_c_during_a_two_lane_publish_leaves_figures_unchanged(runner, tmp_path):
    """Publish A and B in two lanes; rerun them changed, and press Ctrl-C (SIGINT to the runner's process group) while
    A's lane is halfway through its publish (its folder renamed aside) and B's kernel is mid-cell: the run exits 130,
    every file under figures/ is what it was (no staging or old folder left), and neither kernel nor lane runs."""
    _write_nb(runner / "nbs", A, 'run.save_table(pd.DataFrame({"a": [1]}), "table1", "x")\nrun.finish()\n')
    _write_nb(runner / "nbs", B, 'run.save_table(pd.DataFrame({"b": [1]}), "table1", "x")\nrun.finish()\n')
    assert cli.main(["run", "--force", "--no-progress", "--jobs", "2"]) == 0
    figures = runner / "figures"
    before = _tree(figures)
    assert f"{A}/table1_x.csv" in before and f"{B}/table1_x.csv" in before
    _write_nb(runner / "nbs", A, 'run.save_table(pd.DataFrame({"a": [2]}), "table1", "x")\nrun.finish()\n')
    _write_nb(runner / "nbs", B, 'run.save_table(pd.DataFrame({"b": [2]}), "table1", "x")\ntime.sleep(300)\n'
                                 "run.finish()\n")
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(PAUSE_HOOK)
    paused = tmp_path / "paused"
    env = {**os.environ, "PAUSE_PUBLISH": str(paused),
           "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    # a pytest-xdist worker ignores SIGINT and a child inherits SIG_IGN (Python then installs no KeyboardInterrupt):
    # the runner gets a terminal's default disposition back, as when a user starts it
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from pathlib import Path; from moelab.runner import cli as n; "
            f"n.NB_DIR = Path({str(runner / 'nbs')!r}); n.RUNS = Path({str(runner / 'runs')!r}); "
            "sys.exit(n.main(['run', '--force', '--no-progress', '--jobs', '2']))")
    log = tmp_path / "runner.log"   # a file, not a pipe: a wait on a pipe would also wait for any grandchild holding it
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True, text=True,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline, staged = time.time() + 180, []
        while time.time() < deadline and proc.poll() is None:
            staged = [p for p in figures.glob(f".{B}.staging-*") if (p / "table1_x.csv").exists()]
            if paused.exists() and staged:
                break
            time.sleep(0.5)
        assert paused.exists() and staged, "the run never reached A's publish with B mid-cell"
        assert not (figures / A).exists()          # halfway: A's published folder is renamed aside right now
        kernel_b = int(staged[0].name.rsplit("-", 1)[1])
        lane_pids = [json.loads((runner / "runs" / "default" / f"{n}.status.json").read_text())["pid"] for n in (A, B)]
        os.killpg(proc.pid, signal.SIGINT)         # Ctrl-C: the terminal signals the runner's process group
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = log.read_text()
    assert proc.returncode == 130, out
    assert "interrupted" in out
    assert _tree(figures) == before
    time.sleep(0.5)
    assert not _pid_alive(kernel_b) and not any(_pid_alive(p) for p in lane_pids)


def test_provenance_records_the_lane_count_and_peak_memory(runner, monkeypatch):
    """``jobs`` is the runner's lane count (None outside the runner: a JupyterLab run) and ``memory.peak_rss_mib``
    the kernel's own peak resident memory."""
    from moelab.runner.notebook_run import JOBS_ENV, NotebookRun

    monkeypatch.delenv(JOBS_ENV, raising=False)
    prov = NotebookRun(A, "default", publish=False).provenance()
    assert prov["jobs"] is None and prov["memory"]["peak_rss_mib"] > 10
    monkeypatch.setenv(JOBS_ENV, "2")
    assert NotebookRun(A, "default", publish=False).provenance()["jobs"] == 2


def test_lane_order_takes_the_queue_that_ends_soonest():
    """Against a brute force written out: the 2026-11-28 default times in two lanes; longest first ends at 3,115 s, the
    best queue at 2,891 s (02 and 05 with 00 in one lane, 01, 03 and 04 in the other: 2,760 / 2,891 s)."""
    w = {"00": 251.4, "01": 1060.4, "02": 1284.0, "03": 1001.3, "04": 829.3, "05": 1225.0}
    lpt = lanes.longest_first(list(w), w)
    assert lanes.makespan(lpt, w, 2) == pytest.approx(3114.6)
    order = lanes.lane_order(list(w), w, 2)
    assert sorted(order) == sorted(w)
    assert lanes.makespan(order, w, 2) == pytest.approx(2891.0)
    # no split of the six into two sets finishes sooner
    import itertools
    total = sum(w.values())
    best = min(max(sum(w[n] for n in s), total - sum(w[n] for n in s))
               for r in range(7) for s in itertools.combinations(w, r))
    assert lanes.makespan(order, w, 2) == pytest.approx(best)
    # unrecorded notebooks still go first; one lane or few notebooks: longest first
    assert lanes.lane_order(["x", *w], {**w, "x": None}, 2)[0] == "x"
    assert lanes.lane_order(list(w), w, 1) == lpt
    assert lanes.lane_order(["01", "02"], w, 2) == ["02", "01"]


def test_makespan_is_the_dynamic_queue():
    assert lanes.makespan(["a", "b", "c"], {"a": 3.0, "b": 1.0, "c": 1.0}, 2) == 3.0
    assert lanes.makespan(["b", "c", "a"], {"a": 3.0, "b": 1.0, "c": 1.0}, 2) == 4.0
