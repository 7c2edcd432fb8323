"""Screenshot of a notebook open in JupyterLab, taken in headless Chromium (issue 16, closing note).

    .venv/bin/python scripts/lab_screenshot.py notebooks/00_moe_primer.py --out lab.png --wait 20
    .venv/bin/python scripts/lab_screenshot.py notebooks/04_mass.py --out lab.png --run-all --wait 120

Starts ``jupyter lab`` on 127.0.0.1 with a fresh token, rooted at the repository, and Debian's ``chromium``
headless with its DevTools port on loopback. It opens ``/lab/tree/<notebook>``, optionally runs every cell
(``--run-all``: the same command as Run > Run All Cells, so the outputs, progress bars included, show in the page),
waits ``--wait`` seconds of real time and saves a PNG. Chromium's own ``--screenshot`` flag shoots as soon as the page
has loaded, before JupyterLab has drawn the notebook, so the page is driven through the DevTools protocol instead
(over tornado's websocket client, which jupyter_server already depends on). Both processes are stopped at the end.
Install Chromium with ``apt-get install chromium``.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tornado.websocket import websocket_connect

REPO_ROOT = Path(__file__).resolve().parents[1]
JUPYTER = Path(sys.executable).parent / "jupyter"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, what: str, proc: subprocess.Popen, timeout_s: float = 120.0, headers=None):
    """GET ``url`` until it answers; returns the decoded JSON. Raises RuntimeError if ``proc`` exits or time runs out."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with code {proc.returncode} before answering at {url}")
            time.sleep(0.5)
    raise RuntimeError(f"{what} did not answer at {url} within {timeout_s:.0f} s")


def start_lab(root: Path, port: int, token: str, tmp: Path, log) -> subprocess.Popen:
    """JupyterLab on loopback; MPLBACKEND unset so the kernel shows figures inline; the app object exposed to the
    page so that --run-all can call Lab's own command. Its user settings and workspaces live in ``tmp``, with
    autosave off (taking a screenshot never writes the notebook) and no news pop-up."""
    for plugin, values in {"docmanager-extension/plugin": {"autosave": False},
                           "apputils-extension/notification": {"fetchNews": "false"}}.items():
        f = tmp / "lab-settings" / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values))
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    cmd = [str(JUPYTER), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
           f"--LabApp.user_settings_dir={tmp / 'lab-settings'}", f"--LabApp.workspaces_dir={tmp / 'workspaces'}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def start_chromium(binary: str, port: int, width: int, height: int, profile: str, log) -> subprocess.Popen:
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={width},{height}",
           f"--remote-debugging-port={port}", "--remote-debugging-address=127.0.0.1", f"--user-data-dir={profile}",
           "--no-first-run", "--no-default-browser-check", "about:blank"]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


class DevTools:
    """The few DevTools-protocol calls needed: navigate, evaluate JavaScript, capture a screenshot."""

    def __init__(self, ws):
        self.ws, self.next_id = ws, 0

    async def call(self, method: str, **params):
        self.next_id += 1
        msg_id = self.next_id
        await self.ws.write_message(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            raw = await self.ws.read_message()
            if raw is None:
                raise RuntimeError(f"Chromium closed the DevTools connection during {method}")
            reply = json.loads(raw)
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"DevTools {method} failed: {reply['error']}")
                return reply.get("result", {})

    async def evaluate(self, expression: str):
        res = await self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"page script failed: {res['exceptionDetails'].get('text')} in {expression!r}")
        return res.get("result", {}).get("value")


# the notebook panel in Lab's main area (headless Chromium has no focus, so shell.currentWidget stays empty)
PANEL_JS = ("(() => { const a = window.jupyterapp; if (!a) return null;"
            " return Array.from(a.shell.widgets('main')).find(w => w.content && w.content.widgets"
            " && w.content.widgets.length > 0 && w.sessionContext) || null; })()")
READY_JS = (f"(() => {{ const w = {PANEL_JS}; const k = w && w.sessionContext.session"
            " && w.sessionContext.session.kernel; return !!(k && k.status === 'idle'); })()")
# scroll the running cell (prompt "[*]") into view, its output (progress bars) in the middle of the page
SCROLL_RUNNING_JS = ("(() => { const p = Array.from(document.querySelectorAll('.jp-Cell .jp-InputPrompt'))"
                     ".find(e => e.textContent.includes('[*]')); if (!p) return false;"
                     " const c = p.closest('.jp-Cell'); const o = c.querySelector('.jp-OutputArea') || c;"
                     " o.scrollIntoView({block: 'center'}); return true; })()")
RUN_ALL_JS = (f"(() => {{ const w = {PANEL_JS}; window.jupyterapp.shell.activateById(w.id);"
              " return window.jupyterapp.commands.execute('notebook:run-all-cells').then(() => true); })()")


async def shoot(devtools_port: int, url: str, out: Path, size: tuple[int, int], wait_s: float, run_all: bool,
                ready_timeout_s: float, again_s: float = 0.0):
    pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{devtools_port}/json/list", timeout=10).read())
    page = next(p for p in pages if p.get("type") == "page")
    dt = DevTools(await websocket_connect(page["webSocketDebuggerUrl"], max_message_size=256 * 2**20))
    await dt.call("Page.enable")
    await dt.call("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1,
                  mobile=False)
    await dt.call("Page.navigate", url=url)
    # the notebook is drawn once its panel with cells exists and its kernel is idle
    deadline = time.time() + ready_timeout_s
    while not await dt.evaluate(READY_JS):
        if time.time() > deadline:
            raise RuntimeError(f"JupyterLab did not show the notebook with an idle kernel within {ready_timeout_s:.0f} s "
                               "(a notebook without a kernelspec in its header makes Lab ask for a kernel instead)")
        await asyncio.sleep(1.0)
    if run_all:   # not awaited to completion: the command's promise resolves when every cell has run
        await dt.call("Runtime.evaluate", expression=RUN_ALL_JS)
    await asyncio.sleep(wait_s)
    for i in range(1 + int(again_s > 0)):   # with again_s, a second shot that long after the first (bars moving)
        if i:
            await asyncio.sleep(again_s)
        if run_all:
            await dt.evaluate(SCROLL_RUNNING_JS)
            await asyncio.sleep(1.0)
        shot = await dt.call("Page.captureScreenshot", format="png")
        target = out if i == 0 else out.with_name(f"{out.stem}-after{out.suffix}")
        target.write_bytes(base64.b64decode(shot["data"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebook", help="path relative to the repository root, e.g. notebooks/00_moe_primer.py")
    ap.add_argument("--out", default="lab_screenshot.png", help="PNG to write")
    ap.add_argument("--wait", type=float, default=10.0, help="seconds to wait after the notebook is shown (and run)")
    ap.add_argument("--run-all", action="store_true", help="run every cell (Run > Run All Cells) before waiting; the "
                    "running cell is scrolled into view before each shot")
    ap.add_argument("--again", type=float, default=0.0, help="take a second shot (<out>-after.png) this many seconds "
                    "after the first")
    ap.add_argument("--size", default="1400x900", help="window size WIDTHxHEIGHT")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "chromium", help="Chromium binary")
    ap.add_argument("--ready-timeout", type=float, default=180.0, help="seconds to wait for Lab to show the notebook")
    a = ap.parse_args(argv)

    nb = (REPO_ROOT / a.notebook).resolve()
    if not nb.is_file() or not nb.is_relative_to(REPO_ROOT):
        raise SystemExit(f"error: notebook {a.notebook!r} is not a file under {REPO_ROOT}; pass e.g. notebooks/00_moe_primer.py")
    if shutil.which(a.chromium) is None:
        raise SystemExit(f"error: Chromium not found ({a.chromium!r}); install it with: apt-get install chromium")
    try:
        width, height = (int(v) for v in a.size.lower().split("x"))
    except ValueError:
        raise SystemExit(f"error: --size {a.size!r} is not WIDTHxHEIGHT; pass e.g. --size 1400x900")
    if a.wait < 0:
        raise SystemExit(f"error: --wait {a.wait} is negative; pass seconds >= 0")

    token, lab_port, dt_port = secrets.token_hex(16), free_port(), free_port()
    url = f"http://127.0.0.1:{lab_port}/lab/tree/{nb.relative_to(REPO_ROOT).as_posix()}?token={token}"
    with tempfile.TemporaryDirectory(prefix="lab-shot-") as tmp:
        log = open(Path(tmp) / "processes.log", "w")
        lab = start_lab(REPO_ROOT, lab_port, token, Path(tmp), log)
        chrome = None
        try:
            wait_for(f"http://127.0.0.1:{lab_port}/api/status", "jupyter lab", lab,
                     headers={"Authorization": f"token {token}"})
            chrome = start_chromium(a.chromium, dt_port, width, height, str(Path(tmp) / "profile"), log)
            wait_for(f"http://127.0.0.1:{dt_port}/json/version", "chromium", chrome)
            print(f"JupyterLab: {url}", flush=True)
            asyncio.run(shoot(dt_port, url, Path(a.out), (width, height), a.wait, a.run_all, a.ready_timeout,
                              a.again))
            print(f"screenshot: {a.out}")
        except RuntimeError as e:
            log.flush()
            print(f"error: {e}\n--- last log lines ---\n{(Path(tmp) / 'processes.log').read_text()[-3000:]}",
                  file=sys.stderr)
            return 1
        finally:
            for proc in (chrome, lab):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
            log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
