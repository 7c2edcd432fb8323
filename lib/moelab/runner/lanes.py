"""Lanes: notebooks side by side, ``python -m moelab.runner run --jobs N`` (issue 49; ``make figures`` has ``JOBS=2``).

The reference machine has two cores and most notebooks run on one torch thread, so one notebook at a time leaves half
the machine idle. With ``--jobs N`` (N > 1) the runner (:func:`moelab.runner.cli.cmd_run`) starts each notebook in a
process of its own, a *lane* (``python -m moelab.runner _lane SPEC``, :func:`moelab.runner.cli.cmd_lane`), at most N at
a time:

- **One torch thread per kernel** (``OMP_NUM_THREADS=MKL_NUM_THREADS=1``), so N lanes use N cores and a published
  run's numbers do not depend on the lane count (``provenance.json`` records ``jobs`` and ``hardware.torch_threads``).
- **Order** (:func:`lane_order`): by the wall time each notebook's folder recorded in ``provenance.json``, the queue
  whose simulated finish is soonest (longest first unless another order ends sooner); a notebook with none recorded
  goes first (it may be the longest).
- **A readable terminal** (:class:`Board`): one status line per running notebook (name, cell i/n, elapsed, time left
  from the last recorded run) redrawn in place on a terminal, printed every :data:`LOG_EVERY_S` seconds into a log;
  each notebook's own output (progress bars as plain lines) goes to ``runs/<profile>/<nb>.log``; at the end a table of
  what ran, in which lane, how long, its peak memory and where it failed (:func:`summary_table`).
- **Faults**: a failing notebook does not stop the other lanes (``--fail-fast`` only stops new ones from starting); the
  run exits non-zero naming each failed notebook, the cell it failed in and its log. Ctrl-C stops every lane
  (:func:`stop_lanes`): each lane's kernel is shut down and an unfinished publish is undone by the lane itself
  (:func:`moelab.runner.notebook_run.recover_published` in ``run_one``'s ``finally``), so ``figures/`` stays as it was.

``--jobs 1`` (the runner's default) is the single-lane runner as before: notebooks in series order, in the runner's
own process, on torch's default thread count, with the kernel's output on this terminal.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
LOG_EVERY_S = 60.0      # status lines into a log (not a terminal): one block per minute
STOP_GRACE_S = 30.0     # Ctrl-C: how long a lane gets to stop its kernel before it is killed
ENGINE = "moelab-lane"  # the papermill engine a lane runs its notebook with (writes the cell it starts)


# ---------------------------------------------------------------- order
def recorded_wall(prov_path: Path) -> float | None:
    """The wall time a ``provenance.json`` recorded (None when there is none or it is unreadable)."""
    try:
        w = json.loads(Path(prov_path).read_text()).get("wall_time_s")
    except (OSError, ValueError):
        return None
    return float(w) if isinstance(w, (int, float)) else None


def longest_first(names: list[str], walls: dict[str, float | None]) -> list[str]:
    """``names`` ordered for the lanes: notebooks without a recorded time first (in the given order: they may be the
    longest), then the others by decreasing recorded wall time (ties keep the given order)."""
    pos = {n: i for i, n in enumerate(names)}
    return sorted(names, key=lambda n: (walls.get(n) is not None, -(walls.get(n) or 0.0), pos[n]))


def makespan(order: list[str], walls: dict[str, float], jobs: int) -> float:
    """When the last of ``order`` finishes if each notebook, in turn, starts in the lane that frees first and takes
    its recorded time (the lanes' dynamic queue, :func:`run_lanes`)."""
    free = [0.0] * max(1, jobs)
    for n in order:
        i = free.index(min(free))
        free[i] += walls[n]
    return max(free)


def lane_order(names: list[str], walls: dict[str, float | None], jobs: int, exhaustive_up_to: int = 8) -> list[str]:
    """The queue for ``jobs`` lanes: notebooks without a recorded time first (:func:`longest_first`), then the timed
    ones in the order whose :func:`makespan` is shortest. Longest first is the start; with at most
    ``exhaustive_up_to`` timed notebooks every order is tried (8! = 40,320 short simulations) and one is taken only if
    it ends strictly sooner: for the six default notebooks (recorded 1,284 / 1,225 / 1,060 / 1,001 / 829 / 251 s) longest
    first ends at 3,115 s and the best order at 2,891 s. Hand-written: a two-machine scheduling search this small needs no
    solver library."""
    lpt = longest_first(names, walls)
    untimed = [n for n in lpt if walls.get(n) is None]
    timed = [n for n in lpt if walls.get(n) is not None]
    if jobs < 2 or len(timed) < 3 or len(timed) > exhaustive_up_to:
        return lpt
    w = {n: float(walls[n]) for n in timed}
    best, best_t = timed, makespan(timed, w, jobs)
    for perm in itertools.permutations(timed):
        t = makespan(list(perm), w, jobs)
        if t < best_t - 1e-9:
            best, best_t = list(perm), t
    return untimed + best


# ---------------------------------------------------------------- a lane's status file
def write_status(path: Path, **fields) -> None:
    """Merge ``fields`` into the lane's status file (JSON), replacing it whole so that a reader never sees half."""
    path = Path(path)
    data = {**read_status(path), **fields}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


def read_status(path: Path) -> dict:
    """A lane's status (``{}`` before it wrote one): ``state``, the code ``cell`` it started of ``cells``, ``wall``,
    ``error`` (the failure's last lines)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def status_engine(status: Path) -> dict:
    """The papermill arguments that run a notebook under the lane engine: papermill's own (nbclient) engine, which
    also writes the code cell it starts (``cell`` of ``cells``) into ``status``, for the runner's status line."""
    from papermill.engines import NBClientEngine, papermill_engines

    class LaneEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, status_file=None, **kwargs):
            code = [i for i, c in enumerate(nb_man.nb.cells) if c.cell_type == "code"]
            start = nb_man.cell_start

            def cell_start(cell, cell_index=None, **kw):
                if status_file and cell_index in code:
                    write_status(Path(status_file), cell=code.index(cell_index) + 1, cells=len(code))
                return start(cell, cell_index, **kw)

            nb_man.cell_start = cell_start
            return super().execute_managed_notebook(nb_man, kernel_name, **kwargs)

    papermill_engines.register(ENGINE, LaneEngine)
    return {"engine_name": ENGINE, "status_file": str(status)}


def catch_stop() -> None:
    """In a lane's process: the terminal's Ctrl-C is the runner's to handle (SIGINT does nothing here), and the
    runner's SIGTERM raises KeyboardInterrupt once, so that papermill shuts the kernel down and ``run_one`` undoes an
    unfinished publish; a second SIGTERM is ignored so that this clean-up is not cut short. (Handlers, not
    ``SIG_IGN``: the kernel this process starts gets the default dispositions back.)"""
    def stop(signum, frame):
        signal.signal(signal.SIGTERM, lambda *_: None)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, lambda *_: None)
    signal.signal(signal.SIGTERM, stop)


def lane_env(base: dict | None = None) -> dict:
    """The environment of a lane's process (and so of its kernel): one torch / BLAS thread, unbuffered output."""
    env = dict(os.environ if base is None else base)
    env.update({v: "1" for v in THREAD_VARS})
    env["PYTHONUNBUFFERED"] = "1"
    return env


# ---------------------------------------------------------------- the runner's side
@dataclass
class Task:
    """One notebook to run in a lane: the lane process's command line, where its output and status go, the wall time
    its folder recorded last (None: unknown) and its ``provenance.json`` once it has run."""
    name: str
    argv: list[str]
    log: Path
    status: Path
    expected_s: float | None = None
    provenance: Path | None = None


@dataclass
class Result:
    """What became of one notebook: ``status`` is ok, FAILED, interrupted or not run."""
    name: str
    status: str
    wall_s: float = 0.0
    lane: int | None = None
    log: Path | None = None
    where: str = ""                      # "cell 14/40": the code cell it failed (or was stopped) in
    error: list[str] = field(default_factory=list)
    peak_rss_mib: float | None = None


@dataclass
class _Lane:
    task: Task
    slot: int
    proc: subprocess.Popen
    t0: float


def clock(s: float | None) -> str:
    """``3723`` -> ``1:02:03``, ``75`` -> ``1:15``."""
    if s is None:
        return "?"
    s = int(round(s))
    h, m, sec = s // 3600, s % 3600 // 60, s % 60
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def status_line(name: str, status: dict, elapsed: float, expected: float | None) -> str:
    """``02_sba  cell 12/40  5:03 elapsed  ~10:12 left``: one running notebook."""
    cell = f"cell {status['cell']}/{status['cells']}" if status.get("cell") else "starting"
    if expected is None:
        left = "time left unknown (no recorded run)"
    elif elapsed <= expected:
        left = f"~{clock(expected - elapsed)} left (last run {clock(expected)})"
    else:
        left = f"past the last run's {clock(expected)}"
    return f"{name:<24} {cell:<12} {clock(elapsed):>8} elapsed   {left}"


class Board:
    """The running notebooks' status lines: redrawn in place on a terminal (events print above them); into a log,
    printed every :data:`LOG_EVERY_S` seconds; none when ``live`` is off (``--no-progress``)."""

    def __init__(self, out=None, live: bool = True, tty: bool | None = None):
        self.out = out or sys.stdout
        self.live = live
        self.tty = self.out.isatty() if tty is None else tty
        self.drawn = 0
        self.last = time.time()

    def _erase(self) -> None:
        if self.drawn:
            self.out.write(f"\x1b[{self.drawn}F\x1b[J")   # up to the first status line, clear to the end
            self.drawn = 0

    def event(self, text: str) -> None:
        self._erase()
        print(text, file=self.out, flush=True)

    def show(self, lines: list[str]) -> None:
        if not self.live or not lines:
            return
        if self.tty:
            width = shutil.get_terminal_size((120, 20)).columns - 1   # a wrapped line would break the redraw
            self._erase()
            self.out.write("".join(f"{line[:width]}\n" for line in lines))
            self.out.flush()
            self.drawn = len(lines)
        elif time.time() - self.last >= LOG_EVERY_S:
            self.last = time.time()
            print("\n".join(f"  .. {line}" for line in lines), file=self.out, flush=True)


def _descendants(pid: int) -> list:
    """The processes below ``pid`` (its kernel among them: jupyter starts kernels in a session of their own, so a
    signal to the lane's process group does not reach it)."""
    try:
        import psutil

        return psutil.Process(pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - no psutil, or the lane has exited: nothing to add
        return []


def stop_lanes(lanes: list[_Lane], grace_s: float = STOP_GRACE_S) -> None:
    """Stop every running lane: SIGTERM (KeyboardInterrupt in the lane: its kernel is shut down and an unfinished
    publish undone, :func:`catch_stop`), up to ``grace_s`` seconds to finish that, then SIGKILL for the lane and for
    every process it had started (found before the signal), so no kernel outlives the run."""
    kin = {id(lane): _descendants(lane.proc.pid) for lane in lanes}
    for lane in lanes:
        with contextlib.suppress(ProcessLookupError):
            lane.proc.send_signal(signal.SIGTERM)
    deadline = time.time() + grace_s
    for lane in lanes:
        try:
            lane.proc.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            lane.proc.kill()
            lane.proc.wait()
    left = [p for procs in kin.values() for p in procs if p.is_running()]
    for p in left:
        with contextlib.suppress(Exception):
            p.kill()
    if left:
        import psutil

        psutil.wait_procs(left, timeout=10)


def _result(lane: _Lane, interrupted: bool = False) -> Result:
    st = read_status(lane.task.status)
    rc = lane.proc.returncode
    status = "interrupted" if interrupted else "ok" if rc == 0 else "FAILED"
    where = f"cell {st['cell']}/{st['cells']}" if status != "ok" and st.get("cell") else ""
    error = st.get("error") or ([] if rc == 0 or interrupted else [f"the lane exited with status {rc}; see its log"])
    peak = None
    if status == "ok" and lane.task.provenance is not None:
        with contextlib.suppress(OSError, ValueError):
            peak = json.loads(lane.task.provenance.read_text()).get("memory", {}).get("peak_rss_mib")
    return Result(lane.task.name, status, float(st.get("wall") or time.time() - lane.t0), lane.slot, lane.task.log,
                  where, error, peak)


def _finished_line(label: str, r: Result) -> str:
    if r.status == "ok":
        return f"{label} {r.name}: ok in {r.wall_s:.0f} s (lane {r.lane})"
    return (f"{label} {r.name}: FAILED after {r.wall_s:.0f} s" + (f" at {r.where}" if r.where else "")
            + f"; log {r.log}\n    " + "\n    ".join(r.error[-15:]))


def run_lanes(tasks: list[Task], jobs: int, env: dict | None = None, out=None, live: bool = True,
              fail_fast: bool = False, poll_s: float = 0.5) -> tuple[list[Result], bool]:
    """Run ``tasks`` (in the order given: :func:`lane_order`) in at most ``jobs`` lanes; returns the results in
    the order the notebooks finished (then those stopped or never started) and whether Ctrl-C stopped the run. A
    failure never stops the other lanes; with ``fail_fast`` no new notebook starts after one."""
    board = Board(out, live)
    pending, running, results = deque(tasks), [], []
    free = list(range(1, jobs + 1))
    env = lane_env() if env is None else env
    n = len(tasks)
    labels = {t.name: f"[{i}/{n}]" for i, t in enumerate(tasks, 1)}
    try:
        while pending or running:
            while pending and free and not (fail_fast and any(r.status == "FAILED" for r in results)):
                task = pending.popleft()
                task.log.parent.mkdir(parents=True, exist_ok=True)
                task.status.unlink(missing_ok=True)
                with open(task.log, "w") as log:
                    proc = subprocess.Popen(task.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            env=env)
                running.append(_Lane(task, free.pop(0), proc, time.time()))
                board.event(f"{labels[task.name]} {task.name}: running in lane {running[-1].slot} (log {task.log})")
            for lane in [lane for lane in running if lane.proc.poll() is not None]:
                running.remove(lane)
                free = sorted(free + [lane.slot])
                results.append(_result(lane))
                board.event(_finished_line(labels[lane.task.name], results[-1]))
            if running:
                board.show([status_line(lane.task.name, read_status(lane.task.status), time.time() - lane.t0,
                                        lane.task.expected_s) for lane in running])
                time.sleep(poll_s)
            elif pending and fail_fast and any(r.status == "FAILED" for r in results):
                break
    except KeyboardInterrupt:
        board.event(f"interrupted: stopping {len(running)} running notebook(s) (up to {STOP_GRACE_S:.0f} s); their "
                    f"published folders stay as they were")
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second Ctrl-C must not cut the clean-up short
        try:
            stop_lanes(running)
        finally:
            signal.signal(signal.SIGINT, handler)
        results += [_result(lane, interrupted=True) for lane in running]
        results += [Result(t.name, "not run") for t in pending]
        return results, True
    results += [Result(t.name, "not run") for t in pending]
    return results, False


def summary_table(results: list[Result], skipped: list[str] = ()) -> str:
    """The end-of-run table: every notebook, its status, lane, wall time, peak memory, and for a failure the cell it
    failed in and its log."""
    rows = [("notebook", "status", "lane", "wall time", "peak RSS", "where / log")]
    rows += [(name, "skipped", "", "", "", "up to date") for name in skipped]
    for r in results:
        rows.append((r.name, r.status, str(r.lane or ""), clock(r.wall_s) if r.lane else "",
                     f"{r.peak_rss_mib / 1024:.1f} GiB" if r.peak_rss_mib else "",
                     "" if r.status in ("ok", "not run") else f"{r.where + '; ' if r.where else ''}log {r.log}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in rows)
