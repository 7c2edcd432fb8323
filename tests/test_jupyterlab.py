"""The jupytext .py sources open as notebooks in JupyterLab (foundation issue, item 5).

Starts a real `jupyter lab` on loopback and checks through its REST API that (1) the contents API serves each
notebook source as a notebook, and (2) the lab settings make a double-click open .py files with the Jupytext
Notebook viewer (set by jupyter/overrides.json, which `make setup` installs into the venv).
"""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url, token):
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    jupyter = Path(sys.executable).parent / "jupyter"
    if not jupyter.exists():
        pytest.skip("jupyter not installed in this interpreter's environment")
    port, token = _free_port(), "moelab-test"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path_factory.mktemp("jcfg")),
           "JUPYTER_RUNTIME_DIR": str(tmp_path_factory.mktemp("jrt"))}
    proc = subprocess.Popen([str(jupyter), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
                             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={ROOT}"]
                            + (["--allow-root"] if os.geteuid() == 0 else []),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    base = f"http://127.0.0.1:{port}"
    for _ in range(360):
        try:
            _get(f"{base}/api/status", token)
            break
        except Exception:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("jupyter lab did not start in 180 s")
    yield base, token
    proc.terminate()
    proc.wait(timeout=20)


def test_sources_are_served_as_notebooks(lab):
    base, token = lab
    sources = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    if not sources:
        pytest.skip("no notebooks yet")
    for src in sources:
        model = _get(f"{base}/api/contents/notebooks/{src.name}?type=notebook&content=1", token)
        assert model["type"] == "notebook", src.name
        cells = model["content"]["cells"]
        assert any("parameters" in c.get("metadata", {}).get("tags", []) for c in cells), src.name


def test_double_click_opens_py_as_notebook(lab):
    base, token = lab
    s = _get(f"{base}/lab/api/settings/@jupyterlab/docmanager-extension:plugin", token)
    # overrides.json changes the schema's default (what a user without own settings gets)
    default = s["schema"]["properties"]["defaultViewers"].get("default", {})
    viewers = {**default, **s.get("settings", {}).get("defaultViewers", {})}
    assert viewers.get("python") == "Jupytext Notebook", default
