"""Choose the training settings of notebook 03's text runs (issue 21 item 1) on the VALIDATION pairs only.

Sparse upcycling of all-MiniLM-L6-v2 (every other FFN -> 8 experts, top-2: the notebook's model and loss, InfoNCE +
0.01 x balancing loss, only the converted FFN sites trained) is trained for each candidate (learning rate, steps,
batch) and scored by R@1 (mean of both directions) on the first N_VAL validation pairs of the suite's pairs
(``moelab.cluster_upcycling.text_experiment(eval_split="validation")``; the test pairs are never read here). The
held-out analyses (router movement, entropy, expert-output similarity at init and at the end) use the first N_PROBE
validation anchors. The chosen settings are used for every method of the notebook (sparse, Drop, noise,
cluster-aware, the dense model trained as long), as issue 21 asks: the baseline is tuned, not the method.

Stages (a candidate whose seeds are all in the CSV is skipped, and every run is cached by ``moelab.cache``, so an
interrupted screen resumes candidate by candidate and run by run):
  screen:  every candidate of the grid (or --only NAME,NAME) x the grid's seeds
  choose:  no training; writes the choice (``moelab.cluster_upcycling.choose_tuned``: highest seed-mean validation
           R@1; ties go to fewer steps) and its provenance into tuning_summary.json, which notebook 03 reads
           (``moelab.cluster_upcycling.tuned_settings``)

Writes <out>/tuning_runs.csv (one row per run) and <out>/tuning_summary.json (data settings, the untrained dense
model's validation R@1, per-candidate summary, the choice, provenance: commit, command, threads, CPU seconds, date).
``--out`` defaults to data/tuning/03_cluster_upcycling (not under figures/03_cluster_upcycling/: publishing a run
replaces that folder). ``--grid tiny`` is a two-candidate grid of 2-step runs on the suite's smoke pairs, to check
the script in about a minute (give it a scratch --out).

Cost, measured on the shared 2-core project machine (1 thread, other jobs running): about 25 CPU s per run (build,
R@1 at init and at the end on 300 pairs, analyses) plus 1.3 CPU s per step at batch 16, so the default grid
(4 learning rates x 30/60/120 steps x 2 seeds) takes about 2,800 CPU s. The largest step count is what notebook 03's
`default` budget (30 minutes cold, sparse and cluster-aware x 3 seeds) allows.

Run:
    OMP_NUM_THREADS=1 .venv/bin/python scripts/tune_03.py --stage screen [--only NAME,NAME]
    .venv/bin/python scripts/tune_03.py --stage choose
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
import torch

from moelab import assets
from moelab import cluster_upcycling as cu
from moelab.suite import embed

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "tuning" / "03_cluster_upcycling"  # not under figures/: publishing replaces that folder
# What notebook 03's default profile uses (model, loss, data sizes); only lr, steps and batch size vary here.
MODEL = dict(num_experts=8, top_k=2, energy=0.99, aux_coef=0.01, eesd_weight=0.1, eesd_decay=0.9, max_len=24)
GRIDS = {
    "default": dict(
        pairs="default", seeds=(0, 1), n_val=300, n_probe=64, calib_texts=256, calib_tokens=6144,
        candidates={f"lr{lr:.0e}_T{T}_b16": dict(lr=lr, steps=T, batch_size=16)
                    for lr in (1e-4, 3e-4, 1e-3, 3e-3) for T in (30, 60, 120)}),
    "tiny": dict(
        pairs="smoke", seeds=(0,), n_val=10, n_probe=4, calib_texts=24, calib_tokens=300,
        candidates={"tiny_lr1e-4_T2_b4": dict(lr=1e-4, steps=2, batch_size=4),
                    "tiny_lr1e-3_T2_b4": dict(lr=1e-3, steps=2, batch_size=4)}),
}


def data_settings(grid: dict) -> dict:
    """The fixed part of every run of ``grid`` (everything but the candidate's lr, steps, batch)."""
    return dict(calib_texts=grid["calib_texts"], calib_tokens=grid["calib_tokens"], n_test=grid["n_val"],
                n_probe=grid["n_probe"], eval_split="validation", benchmarks=None, **MODEL)


def run_rows(st, pairs, grid: dict, name: str, seed: int) -> pd.DataFrame:
    """One sparse-upcycling run of candidate ``name`` with ``seed``, scored on validation: one row (settings,
    ``val_r1``, ``val_r1_init``, router movement and analyses, training loss, CPU seconds)."""
    t0 = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        res = cu.text_experiment(st, pairs, ["sparse"], [seed], **data_settings(grid), **grid["candidates"][name])
    row = cu.run_summary(res).rename(columns={"r1_avg": "val_r1", "r1_init_avg": "val_r1_init"})
    row.insert(0, "candidate", name)
    for k, v in grid["candidates"][name].items():
        row[k] = v
    row["cpu_s"] = time.process_time() - t0
    return row


def dense_reference(st, pairs, grid: dict) -> float:
    """Validation R@1 (points) of the untrained dense model: the level an upcycling starts from."""
    res = cu.text_experiment(st, pairs, ["dense"], [0], **data_settings(grid), steps=1, batch_size=4, lr=1e-4)
    return float(cu.run_summary(res)["r1_avg"].iloc[0])


def provenance(argv) -> dict:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "lib/moelab/cluster_upcycling", "scripts/tune_03.py"],
                                cwd=ROOT, capture_output=True, text=True).stdout.strip())
    return dict(commit=commit, working_tree_dirty=dirty, command="python scripts/tune_03.py " + " ".join(argv),
                torch_threads=torch.get_num_threads(), python=sys.version.split()[0], torch=torch.__version__,
                machine=platform.machine(), processor=platform.processor() or platform.machine(),
                date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))


def _read(out: Path):
    csv_path, json_path = out / "tuning_runs.csv", out / "tuning_summary.json"
    runs = pd.read_csv(csv_path) if csv_path.exists() else pd.DataFrame()
    summary = json.loads(json_path.read_text()) if json_path.exists() else {}
    return runs, summary


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", choices=("screen", "choose"), required=True)
    ap.add_argument("--grid", choices=sorted(GRIDS), default="default")
    ap.add_argument("--only", default="", help="comma-separated candidate names (screen; default: all)")
    ap.add_argument("--out", default=str(OUT), help=f"output folder (default {OUT.relative_to(ROOT)})")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    grid, out = GRIDS[args.grid], Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs, summary = _read(out)
    if summary and summary.get("grid_name", args.grid) != args.grid:
        raise ValueError(f"{out} holds the {summary['grid_name']!r} grid's runs; use another --out for "
                         f"--grid {args.grid}")
    if args.stage == "choose":  # no training: record the choice from the saved runs
        if runs.empty:
            raise ValueError(f"no runs in {out / 'tuning_runs.csv'}: run --stage screen first")
        summary["choice"] = {**cu.choose_tuned(runs), "provenance": provenance(argv)}
        (out / "tuning_summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary["choice"], indent=1))
        return
    names = [n for n in (args.only.split(",") if args.only else grid["candidates"]) if n]
    bad = [n for n in names if n not in grid["candidates"]]
    if bad:
        raise ValueError(f"unknown candidate(s) {bad} in the {args.grid!r} grid; known: {sorted(grid['candidates'])}")
    st, pairs = assets.load_minilm(), embed.pairs(grid["pairs"])
    if "dense_val_r1" not in summary.get("references", {}):
        summary = {**summary, "references": {**summary.get("references", {}),
                                             "dense_val_r1": dense_reference(st, pairs, grid)}}
    for name in names:
        for seed in grid["seeds"]:
            if len(runs) and ((runs["candidate"] == name) & (runs["seed"] == seed)).any():
                print(f"{name} seed {seed}: already in tuning_runs.csv, skipped")
                continue
            row = run_rows(st, pairs, grid, name, seed)
            runs, disk = _read(out)  # re-read before writing: several screening processes may share the files
            runs = pd.concat([runs, row], ignore_index=True)
            runs.to_csv(out / "tuning_runs.csv", index=False, float_format="%.6g")
            summary = {**disk, "references": {**disk.get("references", {}), **summary["references"]},
                       "grid_name": args.grid, "data": {"pairs": grid["pairs"], **data_settings(grid)},
                       "summary": json.loads(cu.tuning_summary(runs).to_json(orient="records"))}  # NaN -> null
            summary.setdefault("runs", []).append(dict(candidate=name, seed=seed, cpu_s=float(row["cpu_s"].iloc[0]),
                                                       provenance=provenance(argv)))
            (out / "tuning_summary.json").write_text(json.dumps(summary, indent=1))
            r = row.iloc[0]
            print(f"{name} seed {seed} ({r['cpu_s']:.0f} CPU s): validation R@1 {r['val_r1']:.2f} (init "
                  f"{r['val_r1_init']:.2f}, dense {summary['references']['dense_val_r1']:.2f}); top-1 kept "
                  f"{r['top1_agreement']:.3f}; entropy {r['routing_entropy_init']:.3f} -> "
                  f"{r['routing_entropy_final']:.3f}", flush=True)


if __name__ == "__main__":
    main()
