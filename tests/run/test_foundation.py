"""Foundation: profiles, cache atomicity, assets errors/checksums, figures/index, claims verdicts, runner, env pins."""
import json
import re
import subprocess
import sys
import types

import numpy as np
import pytest

import moelab
from moelab import assets, cache, claims, profiles, stats
from moelab.runner.notebook_run import CLAIM_DEFS, NotebookRun, write_index

from helpers import ROOT



# ---------------------------------------------------------------- profiles
def test_profiles_select_and_errors():
    assert profiles.select("full", smoke=1, default=2, full=3, paper=4) == 3
    with pytest.raises(ValueError, match="'fast'"):
        profiles.check_profile("fast")
    with pytest.raises(ValueError, match="missing"):
        profiles.select("smoke", smoke=1, default=2)
    with pytest.raises(ValueError, match="unknown profile"):
        profiles.select("smoke", smoke=1, default=2, full=3, paper=4, huge=5)


def test_start_run_rejects_bad_profile(tmp_figures):
    with pytest.raises(ValueError, match="'quick'"):
        moelab.start_run("01_moce", profile="quick")
    with pytest.raises(ValueError, match="SEED"):
        moelab.start_run("01_moce", profile="smoke", seed=-1)


# ---------------------------------------------------------------- cache
def test_atomic_dir_interrupted_write_leaves_no_valid_entry(tmp_cache):
    target = cache.cache_root() / "x" / "entry"
    with pytest.raises(KeyboardInterrupt):
        with cache.atomic_dir(target) as tmp:
            (tmp / "half.bin").write_bytes(b"123")
            raise KeyboardInterrupt  # interrupted mid-write
    assert not target.exists() and not cache.is_complete(target)
    assert list(target.parent.iterdir()) == []  # no temp debris either
    with cache.atomic_dir(target) as tmp:
        (tmp / "full.bin").write_bytes(b"ok")
    assert cache.is_complete(target) and (target / "full.bin").read_bytes() == b"ok"


def test_artifact_builds_once_and_keys_by_config(tmp_cache):
    calls = []

    def build(d):
        calls.append(1)
        (d / "v.txt").write_text("hi")

    p1 = cache.artifact("demo", {"a": 1, "b": 2}, build)
    p2 = cache.artifact("demo", {"b": 2, "a": 1}, build)
    p3 = cache.artifact("demo", {"a": 2, "b": 2}, build)
    assert p1 == p2 != p3 and len(calls) == 2
    assert cache.memo("m", {"k": 1}, lambda: {"x": np.arange(3)})["x"].tolist() == [0, 1, 2]


def test_artifact_failed_build_is_retried(tmp_cache):
    def bad(d):
        (d / "partial").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        cache.artifact("demo", {"a": 1}, bad)
    p = cache.artifact("demo", {"a": 1}, lambda d: (d / "ok").write_text("y"))
    assert (p / "ok").exists() and not (p / "partial").exists()


# ---------------------------------------------------------------- assets
def test_checksum_mismatch_is_clear(tmp_cache, tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"not the real weights")
    with pytest.raises(assets.ChecksumMismatch, match="minilm.*expected 53aa5117"):
        assets.verify("minilm", f)


def test_missing_asset_names_asset_and_command(tmp_cache, monkeypatch):
    with pytest.raises(assets.MissingAsset, match=r"'bigbench'.*make assets"):
        assets.bigbench_sdist()
    monkeypatch.setenv("MOELAB_WORDNET_DIR", "/nonexistent")
    with pytest.raises(assets.MissingAsset, match="wordnet"):
        assets.wordnet_dir()
    with pytest.raises(assets.MissingAsset, match="config.json"):
        assets.load_causal_lm("/nonexistent/llama-2-7b")


def test_interrupted_bigbench_download_is_not_used(tmp_cache, monkeypatch):
    d = cache.cache_root() / "downloads"
    d.mkdir(parents=True)
    (d / ".bigbench-1.0.0.tar.gz.part").write_bytes(b"half")  # a crashed download
    with pytest.raises(assets.MissingAsset):
        assets.bigbench_sdist()  # only a verified file at the final path counts


def test_download_failure_is_clear_and_leaves_nothing(tmp_cache, monkeypatch):
    monkeypatch.setenv("MOELAB_PYPI_INDEX", "http://127.0.0.1:9/simple")  # nothing listens there
    with pytest.raises(assets.MissingAsset, match="bigbench.*download from http://127.0.0.1:9"):
        assets.download_bigbench()
    assert not (cache.cache_root() / "downloads" / "bigbench-1.0.0.tar.gz").exists()
    assert not list((cache.cache_root() / "downloads").glob("*.part"))


def test_real_assets_load():
    """The installed real assets (make assets) are found and verified."""
    assert (assets.minilm_path() / "config.json").exists()
    fm = assets.fashion_mnist()
    assert fm["train_x"].shape == (60000, 28, 28) and fm["test_y"].max() == 9
    assert (assets.wordnet_dir() / "data.noun").exists()
    assert len(assets.humaneval_problems()) == 164
    t = assets.bigbench_task("elementary_math_qa")
    assert "examples" in t or "subtasks" in t or t
    with pytest.raises(ValueError, match="no subtask"):
        assets.bigbench_task("elementary_math_qa", "nope")
    with pytest.raises(ValueError, match="kind"):
        assets.e5_embed(["x"], kind="doc")


# ---------------------------------------------------------------- figures, tables, index, provenance
def _demo_defs(monkeypatch, notebook="09_demo", claims=()):
    """Claim definitions for a demo notebook (a module injected as demo_claims_<notebook>, registered in the run
    layer's table moelab.runner.notebook_run.CLAIM_DEFS)."""
    mod = types.ModuleType(f"demo_claims_{notebook}")
    mod.CLAIMS = list(claims)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(CLAIM_DEFS, notebook, mod.__name__)
    return mod


def test_run_outputs_index_and_provenance(tmp_figures, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from moelab.claims import Claim, Unobtainable

    _demo_defs(monkeypatch, claims=[Claim(id="needs_llama", claim="needs Llama-2", paper_ref="Table 1", paper_quote="Table 1",
                                          paper_metric="acc", paper_unit="points", metric="acc", unit="points",
                                          paper_value=None, determined_by="training",
                                          evidence=lambda T: Unobtainable("no weights here"))])
    commits = iter(["aaa", "bbb"])                      # HEAD moves while the run is in progress
    monkeypatch.setattr("moelab.runner.notebook_run.git_commit", lambda: next(commits, "bbb"))
    run = NotebookRun("09_demo", profile="default", seed=3, publish=True)
    from moelab import cache
    monkeypatch.setenv("MOELAB_CACHE", str(tmp_figures / "cache"))
    cache.memo("demo_step", {"nonce": str(tmp_figures)}, lambda: 1)          # built in this run
    cache.memo("demo_step", {"nonce": str(tmp_figures)}, lambda: 1)          # then reused
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    png = run.savefig(fig, "fig2", "frontier", caption="demo")
    assert png.exists() and png.with_suffix(".pdf").exists()
    final = tmp_figures / "figures" / "09_demo"
    run.save_table(pd.DataFrame({"a": [1, 2]}), "table1", "main")
    df = run.finish()
    assert list(df.verdict) == ["unobtainable"]
    assert (final / "fig2_frontier.png").exists() and run.out_dir == final
    idx = (tmp_figures / "figures" / "INDEX.md").read_text()
    assert "09_demo/fig2_frontier.png" in idx and "table1_main.csv" in idx and "| default |" in idx
    prov = json.loads((final / "provenance.json").read_text())
    assert prov["seed"] == 3 and prov["profile"] == "default" and "torch" in prov["packages"]
    assert prov["hardware"]["cpu_model"]                  # floats of some embedders depend on the CPU model
    assert (prov["commit_at_start"], prov["commit"]) == ("aaa", "bbb")
    c = prov["artifact_cache"]     # counted from the run's start: one built, then reused by the run that built it
    assert (c["built"], c["reused"], c["reused_own"], c["state"]) == (1, 0, 1, "cold") and c["build_s"] >= 0
    with pytest.raises(ValueError, match="slug"):
        run.savefig(fig, "fig2", "Bad Slug")
    with pytest.raises(ValueError, match="Figure"):
        run.savefig(None, "fig2", "x")
    # full goes to full/ when published; unpublished runs (and smoke, always) go to the scratch folder
    assert NotebookRun("09_demo", "full", publish=True).final_dir == final / "full"
    assert NotebookRun("09_demo", "smoke").out_dir == tmp_figures / "smoke" / "smoke" / "09_demo"
    assert NotebookRun("09_demo", "default", publish=False).out_dir == tmp_figures / "smoke" / "default" / "09_demo"


def test_effect_interval_matches_naive_bootstrap():
    rng = np.random.default_rng(1)
    a, b = rng.normal(1, 1, 50), rng.normal(0, 1, 50)
    est, lo, hi = stats.paired_bootstrap(a, b, n_boot=4000, seed=0)
    d = a - b
    naive = [d[rng.integers(0, 50, 50)].mean() for _ in range(4000)]
    assert abs(est - d.mean()) < 1e-12
    assert abs(lo - np.quantile(naive, .025)) < 0.08 and abs(hi - np.quantile(naive, .975)) < 0.08


# ---------------------------------------------------------------- environment pins and runner
def _pins(lines):
    out = {}
    for line in lines:
        line = line.strip().lstrip("- ").strip()
        m = re.match(r"^([A-Za-z0-9_.\-\[\]]+)==([^\s;]+)", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_environment_yml_agrees_with_requirements():
    req = _pins((ROOT / "requirements.txt").read_text().splitlines())
    env_lines = (ROOT / "environment.yml").read_text().split("- pip:", 1)[1].splitlines()
    env = _pins(env_lines)
    assert req == env, set(req.items()) ^ set(env.items())
    assert req["torch"] == "2.13.0"


def test_runner_rejects_unknown_notebook_and_profile():
    from moelab.runner import cli

    with pytest.raises(ValueError, match="no notebook matches"):
        cli.discover(["99"])
    r = subprocess.run([sys.executable, "-m", "moelab.runner", "run", "--profile", "turbo"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "turbo" in r.stderr


def test_runner_executes_and_fails_loudly(tmp_path, tmp_figures, monkeypatch, capfd):
    """A tiny notebook through the real papermill path: success, resume-skip, and a failing cell -> exit 1."""
    from moelab.runner import cli

    nbdir = tmp_path / "nbs"
    nbdir.mkdir()
    (nbdir / "01_ok.py").write_text('# %% tags=["parameters"]\nPROFILE = "default"\nSEED = 0\n\n'
                                    '# %%\nimport sys, types\nimport moelab\nimport moelab.runner.notebook_run\n'
                                    'defs = types.ModuleType("demo_claims_01_ok")\ndefs.CLAIMS = []\n'
                                    'sys.modules[defs.__name__] = defs\n'
                                    'moelab.runner.notebook_run.CLAIM_DEFS["01_ok"] = defs.__name__\n'
                                    'run = moelab.start_run("01_ok", profile=PROFILE, seed=SEED)\n'
                                    'run.finish()\n')
    (nbdir / "02_bad.py").write_text('# %% tags=["parameters"]\nPROFILE = "default"\nSEED = 0\n\n# %%\n1/0\n')
    monkeypatch.setattr(cli, "NB_DIR", nbdir)
    monkeypatch.setattr(cli, "RUNS", tmp_path / "runs")
    args = ["run", "--profile", "smoke", "--no-progress"]
    assert cli.main(args + ["--only", "01"]) == 0
    assert (tmp_path / "runs" / "smoke" / "01_ok.ipynb").exists()
    capfd.readouterr()
    assert cli.main(args + ["--only", "01"]) == 0  # outputs current: skipped (resume)
    assert "up to date" in capfd.readouterr().out
    assert cli.main(args + ["--only", "02"]) == 1


def test_notebook_sources_are_jupytext_percent():
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")):
        text = nb.read_text()
        assert "# %%" in text, nb
        assert 'tags=["parameters"]' in text, f"{nb.name} has no parameters cell"
        assert re.search(r'^PROFILE\s*=', text, re.M), f"{nb.name} has no PROFILE parameter"
        assert "start_run(" in text and "run.finish()" in text, f"{nb.name} does not record claims/provenance"
    assert not list(ROOT.glob("notebooks/*.ipynb"))


def test_results_table_and_stale_report(tmp_figures, monkeypatch):
    """README's results table is generated from claims files; changed sources are reported as stale."""
    from moelab.runner import cli
    from moelab.claims import Claim, Unobtainable

    _demo_defs(monkeypatch, claims=[Claim(id="needs_llama", claim="needs Llama-2", paper_ref="Table 1", paper_quote="Table 1",
                                          paper_metric="acc", paper_unit="points", metric="acc", unit="points",
                                          paper_value=2.1, target=2.1, tolerance=1.0, tolerance_why="demo",
                                          determined_by="training", evidence=lambda T: Unobtainable("no weights here"))])
    run = NotebookRun("09_demo", profile="default", publish=True)
    run.finish()
    (run.out_dir / "notebook.md").write_text("# 09\n")   # the runner writes it (tests/run/test_notebook_md.py)
    table = cli.results_table()
    assert "unobtainable" in table and "| 09_demo | default |" in table and "docs/RESULTS.md" in table
    readme = tmp_figures / "README.md"
    readme.write_text(f"x\n{cli.BEGIN}\nold\n{cli.END}\ny\n")
    assert cli.write_readme_results(readme)
    assert "| 09_demo | default |" in readme.read_text() and "\nold\n" not in readme.read_text()
    assert "needs Llama-2" in cli.results_markdown(tmp_figures / "figures")   # the per-claim rows
    assert cli.stale_report(tmp_figures / "figures") == []
    prov = tmp_figures / "figures" / "09_demo" / "provenance.json"
    data = json.loads(prov.read_text())
    first = next(iter(data["sources"]))
    data["sources"][first] = "0" * 16  # as if the module changed after the figures were made
    prov.write_text(json.dumps(data))
    stale = cli.stale_report(tmp_figures / "figures")
    assert stale and stale[0][0] == "09_demo" and first in stale[0][1]


def test_git_commit_ignores_generated_outputs(tmp_path, monkeypatch):
    """provenance's commit is '+dirty' for source edits, not for regenerated figures or the README table."""
    import subprocess

    from moelab.runner import notebook_run

    def git(*a):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "figures").mkdir()
    for f in ("figures/a.csv", "README.md", "src.py"):
        (tmp_path / f).write_text("0\n")
    git("add", ".")
    git("commit", "-qm", "x")
    monkeypatch.setattr(notebook_run, "REPO_ROOT", tmp_path)
    assert not notebook_run.git_commit().endswith("+dirty")
    (tmp_path / "figures/a.csv").write_text("1\n")
    (tmp_path / "README.md").write_text("1\n")
    assert not notebook_run.git_commit().endswith("+dirty")
    (tmp_path / "src.py").write_text("1\n")
    assert notebook_run.git_commit().endswith("+dirty")
