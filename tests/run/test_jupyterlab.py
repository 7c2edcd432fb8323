"""The jupytext .py sources open as notebooks in JupyterLab, and opening one does not rewrite it.

A real `jupyter lab` serves each notebook source as a notebook, and the lab settings make a
double-click open .py files with the Jupytext Notebook viewer (jupyter/overrides.json, installed by `make setup`).

Opening a notebook in Lab and letting autosave write it back must leave the file byte-identical,
whether the server is rooted at the repository (``jupyter lab`` from the root) or at ``notebooks/`` (``make lab``).
Each server serves a copy of the repository's notebooks and jupytext configuration (so a failing save cannot damage
the working tree, and no user-level jupytext configuration is read). A save is what Lab does through the contents
API: PUT the model it was served, after its kernel has set ``kernelspec`` and ``language_info`` in the metadata.

``make lab`` starts as root, binds to loopback and prints how to reach it (checked with ``make -n``,
no server left running).
"""
import difflib
import importlib.util
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import ROOT

JUPYTER = Path(sys.executable).parent / "jupyter"
SOURCES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
TOKEN = "moelab-test"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _call(base, path, body=None):
    """GET (body None) or PUT (body a dict) one REST endpoint of the server; returns the decoded JSON reply."""
    req = urllib.request.Request(f"{base}{path}", method="GET" if body is None else "PUT",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory):
    """The repository's notebooks folder and root-level jupytext configuration, copied with the same layout."""
    if not JUPYTER.exists() or importlib.util.find_spec("jupyterlab") is None:
        pytest.skip("jupyterlab not installed in this interpreter's environment (the GPU check installs no JupyterLab)")
    if not SOURCES:
        pytest.skip("no notebooks yet")
    dest = tmp_path_factory.mktemp("repo")
    for name in ("jupytext.toml", ".jupytext.toml", "jupytext.yml", ".jupytext", "pyproject.toml"):
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "notebooks", dest / "notebooks",
                    ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "*.ipynb"))
    return dest


def _start(tmp_path_factory, root_dir):
    """Start `jupyter lab` on loopback serving root_dir, isolated from the user's Jupyter and jupytext config."""
    port = _free_port()
    cfg = tmp_path_factory.mktemp("jcfg")
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(cfg), "JUPYTER_RUNTIME_DIR": str(tmp_path_factory.mktemp("jrt")),
           "XDG_CONFIG_HOME": str(cfg), "XDG_CONFIG_DIRS": str(cfg)}
    proc = subprocess.Popen([str(JUPYTER), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
                             f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root_dir}"]
                            + (["--allow-root"] if os.geteuid() == 0 else []),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    base = f"http://127.0.0.1:{port}"
    for _ in range(360):
        try:
            _call(base, "/api/status")
            return proc, base
        except Exception:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.5)
    proc.kill()
    pytest.fail("jupyter lab did not start in 180 s")


def _stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def lab_at_repo(repo_copy, tmp_path_factory):
    """A server rooted at the repository (copy): notebooks are at notebooks/NAME."""
    proc, base = _start(tmp_path_factory, repo_copy)
    yield base, "notebooks/", repo_copy / "notebooks"
    _stop(proc)


@pytest.fixture(scope="module")
def lab_at_notebooks(repo_copy, tmp_path_factory):
    """A server rooted at notebooks/ as `make lab` starts it: notebooks are at NAME."""
    proc, base = _start(tmp_path_factory, repo_copy / "notebooks")
    yield base, "", repo_copy / "notebooks"
    _stop(proc)


def _as_lab_with_kernel(base, content):
    """The notebook model as Lab holds it once its kernel runs: Lab sets ``kernelspec`` from the kernel's spec
    (name, display_name, language) and ``language_info`` from the kernel's info reply, then autosave PUTs it."""
    specs = _call(base, "/api/kernelspecs")
    name = content["metadata"].get("kernelspec", {}).get("name", specs["default"])
    spec = specs["kernelspecs"].get(name, specs["kernelspecs"][specs["default"]])["spec"]
    meta = {**content["metadata"],
            "kernelspec": {"name": name, "display_name": spec["display_name"], "language": spec["language"]},
            "language_info": {"name": "python", "version": platform.python_version(), "mimetype": "text/x-python",
                              "file_extension": ".py", "pygments_lexer": "ipython3", "nbconvert_exporter": "python",
                              "codemirror_mode": {"name": "ipython", "version": 3}}}
    return {**content, "metadata": meta}


def _round_trip(server, edit):
    """GET every notebook as a notebook, PUT the (edited) model back, return {name: unified diff} of changed files."""
    base, prefix, folder = server
    changed = {}
    for src in SOURCES:
        path = folder / src.name
        before = path.read_bytes()
        model = _call(base, f"/api/contents/{prefix}{src.name}?type=notebook&content=1")
        assert model["type"] == "notebook", src.name
        _call(base, f"/api/contents/{prefix}{src.name}",
              {"type": "notebook", "format": "json", "content": edit(base, model["content"])})
        after = path.read_bytes()
        if after != before:
            changed[src.name] = "".join(difflib.unified_diff(before.decode().splitlines(True),
                                                             after.decode().splitlines(True), n=1))[:1500]
            path.write_bytes(before)  # the next check starts from the committed text again
    return changed


@pytest.mark.parametrize("server", ["lab_at_repo", "lab_at_notebooks"])
def test_saving_an_unchanged_notebook_keeps_the_file(server, request):
    """GET as a notebook and PUT the same model back (a save without edits) changes no byte."""
    changed = _round_trip(request.getfixturevalue(server), lambda base, content: content)
    assert not changed, "saving an unchanged notebook rewrote it:\n" + "\n".join(changed.values())


@pytest.mark.parametrize("server", ["lab_at_repo", "lab_at_notebooks"])
def test_lab_autosave_after_kernel_start_keeps_the_file(server, request):
    """The metadata Lab writes back once its kernel started (kernelspec from the kernel's spec,
    language_info) is what the file already says, so autosave leaves it byte-identical."""
    changed = _round_trip(request.getfixturevalue(server), _as_lab_with_kernel)
    assert not changed, "Lab's autosave would rewrite the header:\n" + "\n".join(changed.values())


@pytest.mark.parametrize("server", ["lab_at_repo", "lab_at_notebooks"])
def test_served_metadata_is_what_a_save_writes_back(server, request):
    """The notebook metadata Lab is served equals the metadata served again after Lab saved it: a save adds nothing
    (in particular no jupytext_version/format_version stamps)."""
    base, prefix, folder = request.getfixturevalue(server)
    for src in SOURCES:
        path, before = folder / src.name, (folder / src.name).read_bytes()
        url = f"/api/contents/{prefix}{src.name}"
        served = _call(base, f"{url}?type=notebook&content=1")["content"]
        _call(base, url, {"type": "notebook", "format": "json", "content": served})
        again = _call(base, f"{url}?type=notebook&content=1")["content"]
        path.write_bytes(before)
        rep = again["metadata"].get("jupytext", {}).get("text_representation", {})
        assert "jupytext_version" not in rep and "format_version" not in rep, (src.name, rep)
        assert again["metadata"] == served["metadata"], src.name


@pytest.fixture(scope="module")
def kernel_language_info():
    """The language_info a real python3 kernel of this environment reports (what Lab writes once it started)."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        return kc.kernel_info(reply=True, timeout=60)["content"]["language_info"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


@pytest.mark.parametrize("server", ["lab_at_repo", "lab_at_notebooks"])
def test_opening_a_notebook_does_not_modify_it(server, request, kernel_language_info):
    """A .py notebook was marked unsaved as soon as it opened. Lab sets ``kernelspec`` (from the kernel's
    spec) and ``language_info`` (from the running kernel) and marks the notebook modified when either differs from
    what it was served (a deep comparison); the served notebook must already hold both (moelab.runner.lab.ContentsManager,
    installed into the venv by `make setup`)."""
    base, prefix, _ = request.getfixturevalue(server)
    specs = _call(base, "/api/kernelspecs")["kernelspecs"]
    for src in SOURCES:
        meta = _call(base, f"/api/contents/{prefix}{src.name}?type=notebook&content=1")["content"]["metadata"]
        spec = specs[meta["kernelspec"]["name"]]["spec"]
        assert meta["kernelspec"] == {"name": meta["kernelspec"]["name"], "display_name": spec["display_name"],
                                      "language": spec["language"]}, src.name
        assert meta.get("language_info") == kernel_language_info, src.name


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Chromium (apt-get install chromium)")
def test_opened_in_a_browser_the_notebook_is_not_modified(tmp_path):
    """In real JupyterLab (headless Chromium, scripts/lab_screenshot.py's helpers): once the notebook is
    shown and its kernel is idle, the document is not marked modified."""
    import asyncio
    import secrets

    sys.path.insert(0, str(ROOT / "scripts"))
    import lab_screenshot as shot
    from tornado.websocket import websocket_connect

    async def dirty(dt_port, url):
        pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{dt_port}/json/list", timeout=10).read())
        page = next(p for p in pages if p.get("type") == "page")
        dt = shot.DevTools(await websocket_connect(page["webSocketDebuggerUrl"], max_message_size=2**26))
        await dt.call("Page.enable")
        await dt.call("Page.navigate", url=url)
        deadline = time.time() + 150
        while not await dt.evaluate(shot.READY_JS):
            assert time.time() < deadline, "Lab did not show the notebook with an idle kernel"
            await asyncio.sleep(1.0)
        await asyncio.sleep(3)   # the kernel's info reply has been applied by now
        return await dt.evaluate(f"(() => {shot.PANEL_JS}.model.dirty)()")

    token, lab_port, dt_port = secrets.token_hex(16), shot.free_port(), shot.free_port()
    with open(tmp_path / "log", "w") as log:
        lab = shot.start_lab(ROOT, lab_port, token, tmp_path, log)
        chrome = None
        try:
            shot.wait_for(f"http://127.0.0.1:{lab_port}/api/status", "lab", lab,
                          headers={"Authorization": f"token {token}"})
            chrome = shot.start_chromium(shutil.which("chromium"), dt_port, 1200, 800, str(tmp_path / "profile"), log)
            shot.wait_for(f"http://127.0.0.1:{dt_port}/json/version", "chromium", chrome)
            url = f"http://127.0.0.1:{lab_port}/lab/tree/notebooks/{SOURCES[0].name}?token={token}"
            assert asyncio.run(dirty(dt_port, url)) is False
        finally:
            for proc in (chrome, lab):
                if proc is not None:
                    _stop(proc)


def test_each_source_round_trips_through_jupytext_byte_identically():
    """Read with the repository's jupytext settings (notebooks/jupytext.toml) and write back: the same bytes."""
    import jupytext
    from jupytext.config import load_jupytext_configuration_file

    cfg = load_jupytext_configuration_file(str(ROOT / "notebooks" / "jupytext.toml"))
    for src in SOURCES:
        nb = jupytext.read(src, fmt="py:percent")
        cfg.set_default_format_options(nb.metadata.setdefault("jupytext", {}), read=True)
        nb.metadata["jupytext"]["notebook_metadata_filter"] = cfg.notebook_metadata_filter
        nb.metadata["jupytext"]["cell_metadata_filter"] = cfg.cell_metadata_filter
        assert jupytext.writes(nb, fmt="py:percent") == src.read_text(), src.name


def test_sources_are_served_as_notebooks(lab_at_repo):
    base, prefix, _ = lab_at_repo
    for src in SOURCES:
        model = _call(base, f"/api/contents/{prefix}{src.name}?type=notebook&content=1")
        assert model["type"] == "notebook", src.name
        cells = model["content"]["cells"]
        assert any("parameters" in c.get("metadata", {}).get("tags", []) for c in cells), src.name


def test_double_click_opens_py_as_notebook(lab_at_repo):
    base = lab_at_repo[0]
    s = _call(base, "/lab/api/settings/@jupyterlab/docmanager-extension:plugin")
    # overrides.json changes the schema's default (what a user without own settings gets)
    default = s["schema"]["properties"]["defaultViewers"].get("default", {})
    viewers = {**default, **s.get("settings", {}).get("defaultViewers", {})}
    assert viewers.get("python") == "Jupytext Notebook", default


def _make_lab_commands(uid):
    """The shell commands `make lab` would run (make -n) for a given effective uid (ID_U overrides `id -u`)."""
    out = subprocess.run(["make", "-n", "lab", f"ID_U={uid}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_lab_as_root_loopback_with_token():
    """As root `make lab` passes --allow-root (and only then); it binds 127.0.0.1, passes the token
    it prints in a ready URL, serves notebooks/, and unsets the Makefile's MPLBACKEND=Agg (the kernel then picks the
    inline backend, so figures show in Lab)."""
    as_root, as_user = _make_lab_commands(0), _make_lab_commands(1000)
    assert "--allow-root" in as_root
    assert "--allow-root" not in as_user
    for cmds in (as_root, as_user):
        assert "jupyter lab" in cmds, cmds
        assert "--ip=127.0.0.1" in cmds, cmds
        assert "--IdentityProvider.token=$token" in cmds and "/lab?token=$token" in cmds, cmds
        assert "--ServerApp.root_dir=notebooks" in cmds, cmds
        assert "env -u MPLBACKEND" in cmds, cmds
        assert "--ServerApp.contents_manager_class=moelab.runner.lab.ContentsManager" in cmds, cmds
