"""The paper profile's dry run and its shared pieces (issue 51): ``run --dry-run`` (paper only, scratch, always rerun,
``DRY_RUN=True`` to every notebook), ``NotebookRun(dry_run=True)`` (never published; provenance says so; claims say
``dry run``), ``cache.path_identity`` (a changed weight or data row changes the key), the early input checks of
``moelab.inputs`` (parameter, file, field and fix named) and ``profiles.dry_run_table``."""
import argparse
import json
import os
import shutil
from dataclasses import dataclass

import pytest

from moelab import cache, inputs, profiles
from moelab.assets import MissingAsset
from moelab.claims import registry
from moelab.claims.rebuild import evaluate_folder
from moelab.runner import cli
from moelab.runner.notebook_run import NotebookRun, check_dry_run

from helpers import ROOT


# ---------------------------------------------------------------- the flag and the run
def test_check_dry_run_refuses_other_profiles_and_publishing():
    assert check_dry_run(False, "default") is False
    assert check_dry_run(True, "paper") is True
    with pytest.raises(ValueError, match="PROFILE is 'default'.*PROFILE='paper'"):
        check_dry_run(True, "default")
    with pytest.raises(ValueError, match="never published"):
        check_dry_run(True, "paper", publish=True)
    with pytest.raises(ValueError, match="DRY_RUN must be True or False, got 'yes'"):
        check_dry_run("yes", "paper")


def test_runner_dry_run_request():
    a = argparse.Namespace(profile="default", scratch=False, force=False)
    with pytest.raises(ValueError, match="--profile paper"):
        cli.dry_run_request(a, {})
    a.profile = "paper"
    with pytest.raises(ValueError, match="drop one of them"):
        cli.dry_run_request(a, {"DRY_RUN": False})
    params = {"MODEL_PATH": "/x"}
    cli.dry_run_request(a, params)
    assert params == {"MODEL_PATH": "/x", "DRY_RUN": True} and a.scratch and a.force


def test_every_notebook_declares_dry_run():
    """`make figures PROFILE=paper DRY_RUN=1` runs the whole series: every notebook must take the parameter."""
    for src in cli.discover(None):
        assert "DRY_RUN" in cli.notebook_parameters(src), src.name


def test_dry_run_is_scratch_and_its_claims_say_dry_run(tmp_path, monkeypatch):
    monkeypatch.setenv("MOELAB_SCRATCH", str(tmp_path / "scratch"))
    monkeypatch.setenv("MOELAB_PUBLISH", "1")   # even under a publishing runner, a dry run stays in scratch
    run = NotebookRun("00_moe_primer", profile="paper", dry_run=True)
    assert not run.publish and run.out_dir.is_relative_to(tmp_path / "scratch")
    assert run.provenance()["dry_run"] is True
    assert "dry_run" not in NotebookRun("00_moe_primer", profile="paper", publish=False).provenance()


def test_dry_run_folder_rebuilds_every_row_as_dry_run(tmp_path):
    """The committed primer folder, marked as a dry run: every row keeps its numbers and says `dry run`, with the
    label the rules would have given in its reason."""
    folder = tmp_path / "00"
    shutil.copytree(ROOT / "figures" / "00_moe_primer", folder, ignore=shutil.ignore_patterns("full", "paper"))
    _, normal = evaluate_folder(folder, registry.claim_defs)
    prov = json.loads((folder / "provenance.json").read_text())
    (folder / "provenance.json").write_text(json.dumps({**prov, "dry_run": True}))
    _, dry = evaluate_folder(folder, registry.claim_defs)
    assert [r["verdict"] for r in dry] == ["extension" if r["verdict"] == "extension" else "dry run" for r in normal]
    assert sum(r["verdict"] == "dry run" for r in dry) >= 3
    for n, d in zip(normal, dry):
        assert d["ours"] == n["ours"] and d["ci_low"] == n["ci_low"]
        if d["verdict"] == "dry run":
            assert d["reason"].startswith("dry run") and repr(n["verdict"]) in d["reason"]


# ---------------------------------------------------------------- cache identity of user paths
def test_path_identity_changes_with_content_file_set_and_large_file_stamp(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text('{"a": 1}')
    (d / "w.bin").write_bytes(b"\0" * 100)
    first = cache.path_identity(d)
    assert first == cache.path_identity(d) and first["files"] == 2 and first["path"] == str(d.resolve())
    (d / "w.bin").write_bytes(b"\1" + b"\0" * 99)       # same size, one weight changed
    second = cache.path_identity(d)
    assert second["digest"] != first["digest"]
    (d / "extra.txt").write_text("x")
    assert cache.path_identity(d)["digest"] != second["digest"]
    # a large file is identified by size and modification time (no read): a rewrite with the same bytes changes it
    big = cache.path_identity(d, content_hash_max=0)
    st = (d / "w.bin").stat()
    os.utime(d / "w.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert cache.path_identity(d, content_hash_max=0)["digest"] != big["digest"]
    assert cache.key({"m": cache.path_identity(d)}) != cache.key({"m": first})
    assert cache.path_identity(None) is None
    with pytest.raises(FileNotFoundError, match="does not exist"):
        cache.path_identity(tmp_path / "nope")


# ---------------------------------------------------------------- early input checks
def test_require_hf_model_names_parameter_file_and_fix(tmp_path):
    with pytest.raises(MissingAsset, match="MODEL_PATH"):
        inputs.require_hf_model("05", "MODEL_PATH", None, "a Llama folder")
    with pytest.raises(MissingAsset, match="--only 05 -p MODEL_PATH="):
        inputs.require_hf_model("05", "MODEL_PATH", tmp_path / "missing", "a Llama folder")
    d = tmp_path / "m"
    d.mkdir()
    with pytest.raises(inputs.InputFormatError, match=r"MODEL_PATH=.*no config.json.*Fix: pass the folder"):
        inputs.require_hf_model("05", "MODEL_PATH", d, "a Llama folder")
    (d / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(inputs.InputFormatError, match=r"'model_type' is 'bert', expected one of \['llama'\]"):
        inputs.require_hf_model("05", "MODEL_PATH", d, "a Llama folder", model_types=("llama",))
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(inputs.InputFormatError, match="no weights"):
        inputs.require_hf_model("05", "MODEL_PATH", d, "a Llama folder", model_types=("llama",))
    (d / "model.safetensors").write_bytes(b"x")
    with pytest.raises(inputs.InputFormatError, match="no tokenizer"):
        inputs.require_hf_model("05", "MODEL_PATH", d, "a Llama folder", model_types=("llama",))
    (d / "tokenizer.json").write_text("{}")
    assert inputs.require_hf_model("05", "MODEL_PATH", d, "a Llama folder", model_types=("llama",)) == {
        "model_type": "llama"}


def test_read_records_names_line_and_field(tmp_path):
    f = tmp_path / "orca.jsonl"
    f.write_text('{"conversations": []}\n\n{"text": "x"}\n')
    with pytest.raises(inputs.InputFormatError, match=r"record 3 has no field 'conversations' \(it has \['text'\]\)"):
        inputs.read_records("01", "DATA_PATHS['slimorca']", f, ["conversations"], "SlimOrca JSONL")
    assert inputs.read_records("01", "D", f, ["conversations"], "x", n=1) == [{"conversations": []}]
    j = tmp_path / "math.json"
    j.write_text(json.dumps([{"query": "q", "response": "r"}, {"query": "q"}]))
    with pytest.raises(inputs.InputFormatError, match=r"record 2 has no field 'response' or 'output'"):
        inputs.read_records("01", "D", j, [("response", "output")], "MetaMathQA JSON")
    j.write_text(json.dumps({"query": "q"}))
    with pytest.raises(inputs.InputFormatError, match="holds a JSON dict, expected a list"):
        inputs.read_records("01", "D", j, ["query"], "x")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{oops\n')
    with pytest.raises(inputs.InputFormatError, match="line 2 is not JSON"):
        inputs.read_records("01", "D", bad, ["a"], "x")


# ---------------------------------------------------------------- the dry run's first table
def test_dry_run_table_lists_cuts_and_kept_settings():
    @dataclass
    class C:
        steps: int
        n: int
        model: str

    t = profiles.dry_run_table(C(31000, 20000, "/m"), C(2, 8, "/m"), keep=("model",))
    assert t.to_dict("records") == [
        {"setting": "steps", "paper": "31000", "dry run": "2", "cut": True},
        {"setting": "n", "paper": "20000", "dry run": "8", "cut": True},
        {"setting": "model", "paper": "/m", "dry run": "/m", "cut": False}]
    with pytest.raises(ValueError, match=r"\['extra'\]"):
        profiles.dry_run_table({"steps": 1}, {"steps": 1, "extra": 2})


def test_standins_script_writes_absolute_parameters(tmp_path, monkeypatch):
    """The notebooks run in a work folder of their own, so a relative OUT (`make dry-run` passes runs/standins) must
    still give parameters that resolve there (03's dry run failed on a relative CLIP_PATH)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_paper_standins", ROOT / "scripts" / "make_paper_standins.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.chdir(tmp_path)
    made = mod.make("rel", only=["05"])
    (path,) = made["05"]["params"].values()
    assert os.path.isabs(path) and os.path.isdir(path)
    assert (tmp_path / "rel" / "05.params").read_text().strip() == f"MODEL_PATH={path!r}"
    assert "| 05 | `MODEL_PATH` |" in (tmp_path / "rel" / "README.md").read_text()
