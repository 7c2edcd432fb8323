"""Choose notebook 02's phase-(b) schedule (learning rate, steps, batch) on the VALIDATION split only.

The notebook's stand-in (all-MiniLM-L6-v2 upcycled in nomic's layout with the cluster-aware initialiser and the
kept-mass compensation, calibrated on the first 256 training anchors) is trained with linear aggregation (MNRL +
0.01 x balancing loss, AdamW, 5% warm-up then a constant rate), one seed per candidate, for the candidate's full step
budget (the plateau rule is reported, not applied). At the start and at every evaluation it is read by
``moelab.sba.regime.RegimeProbe``: expert similarity (parameters), routing JSD across the WordNet subject prompts,
router top-1 / top-k-set agreement with the initialisation on validation texts, and the validation MNRL (64
validation pairs in batches of 16, the same for every candidate). The benchmark sets are never read.

The regime targets were fixed before this screen ran (docs/sba-settings.md, ``moelab.sba.regime.REGIME_TARGETS``);
``--stage choose`` picks, among the (candidate, step) readings that meet them, the cheapest (fewest pairs seen =
steps x batch; then the largest similarity fall), and writes the choice with its provenance.

Stages (a candidate already in the CSV is skipped, so the screen resumes candidate by candidate):
  screen:  every candidate (or --only NAME,NAME)
  choose:  no training; tuning_summary.json gets the per-candidate readings, the choice (or "none reached") and the
           provenance (commit, command, threads, CPU seconds, date)

Cost, measured on the shared 2-core machine at 1 thread beside a notebook run: about 1.0-1.5 CPU s per step at
batch 16 (2x at 32), about 35 s to build and calibrate the model, about 6 s per evaluation.

Run:
    OMP_NUM_THREADS=1 .venv/bin/python scripts/tune_02.py --stage screen [--only NAME,NAME]
    .venv/bin/python scripts/tune_02.py --stage choose
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

from moelab.assets import load_minilm
from moelab.sba.data import short_pairs, wordnet_subject_texts
from moelab.sba.experiment import train_until_plateau, validation_mnrl
from moelab.sba.regime import REGIME_TARGETS, RegimeProbe, regime_reached
from moelab.sba.standin import build_nomic_layout_moe
from moelab.suite import embed as suite_embed

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "tuning" / "02_sba"  # not under figures/02_sba/: publishing a run replaces that folder
DATA = dict(pairs="default", max_pair_tokens=32, n_calib=256, n_val=64, val_batch=16, n_probe=128, n_subjects=24,
            per_subject=6, max_tokens=100, seed=0)
FIXED = dict(warmup_frac=0.05, aux_coef=0.01, window=3, min_rel_improvement=0.01)
CANDIDATES = {  # in the order run
    # stopped at step 55 of 120 (not in the CSV): training MNRL 2.28 against ~0.9 at the start, the model broken
    # "lr1e-3_b16_T120": dict(lr=1e-3, batch_size=16, max_steps=120, eval_every=30),
    "lr2e-5_moe1e-3_b16_T90": dict(lr=2e-5, moe_lr=1e-3, batch_size=16, max_steps=90, eval_every=30),
    # stopped at step ~25 to give the CPU budget to the expert learning rate (not in the CSV)
    # "lr3e-4_b16_T90": dict(lr=3e-4, batch_size=16, max_steps=90, eval_every=30),
    "lr2e-5_moe3e-3_b16_T60": dict(lr=2e-5, moe_lr=3e-3, batch_size=16, max_steps=60, eval_every=20),
    # after the two above: 1e-3 moved the similarity 0.040 in 90 steps with the validation loss falling, 3e-3 moved
    # it 0.10 in 20 steps with the validation loss rising from the first evaluation; in between:
    "lr2e-5_moe2e-3_b16_T60": dict(lr=2e-5, moe_lr=2e-3, batch_size=16, max_steps=60, eval_every=20),
    # 2e-3 moved the similarity 0.079 in 40 steps but the validation loss never fell below the init's: the one rate
    # that trains is 1e-3; does it reach the 0.05 fall within the full profile's budget?
    "lr2e-5_moe1e-3_b16_T150": dict(lr=2e-5, moe_lr=1e-3, batch_size=16, max_steps=150, eval_every=30),
}


def data():
    dense = load_minilm()
    dense.max_seq_length = 128
    pairs = suite_embed.pairs(DATA["pairs"])
    n = DATA["max_pair_tokens"]
    tok = lambda t: dense.tokenizer(t, truncation=True, max_length=n + 1)["input_ids"]  # noqa: E731
    train, val = short_pairs(pairs["train"], tok, n), short_pairs(pairs["validation"], tok, n)
    probe = [t for p in val[DATA["n_val"]:DATA["n_val"] + DATA["n_probe"] // 2] for t in p]
    subjects = wordnet_subject_texts(DATA["n_subjects"], DATA["per_subject"], seed=DATA["seed"])
    return dense, train, val[:DATA["n_val"]], probe, subjects


def run_candidate(name, cand, dense, train, val, probe_texts, subjects) -> list[dict]:
    t0, c0 = time.time(), time.process_time()
    calib = [a for a, _ in train[:DATA["n_calib"]]]
    model = build_nomic_layout_moe(dense, init="cluster", calib_texts=calib, seed=DATA["seed"], compensate=True)
    probe = RegimeProbe(model, probe_texts, subjects, DATA["max_tokens"])
    vb = dict(batch_size=DATA["val_batch"], val_batches=DATA["n_val"] // DATA["val_batch"])
    init = dict(step=0, val_mnrl=validation_mnrl(model, val, **vb), **probe(model))
    build_s = time.time() - t0
    res = train_until_plateau(model, train, val, seed=DATA["seed"], stop_on_plateau=False, keep="last", probe=probe,
                              val_batch_size=DATA["val_batch"], val_batches=vb["val_batches"], device="cpu",
                              **FIXED, **cand)
    rows = [init] + res["val"].to_dict("records")
    out = []
    for r in rows:
        ok, why = regime_reached(init, r)
        out.append(dict(candidate=name, **{"moe_lr": None, **cand}, seed=DATA["seed"], pairs_seen=int(r["step"]) * cand["batch_size"],
                        **r, similarity_fall=init["expert_similarity"] - r["expert_similarity"],
                        reached=bool(ok and r["step"] > 0), reasons="; ".join(why)))
    for o in out:
        o.update(build_s=round(build_s, 1), wall_s=round(time.time() - t0, 1),
                 cpu_s=round(time.process_time() - c0, 1), plateau_rule_fired_at=None)
    return out


def provenance(cmd) -> dict:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return dict(commit=commit, command=" ".join(cmd), threads=torch.get_num_threads(), python=platform.python_version(),
                torch=torch.__version__, date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", choices=["screen", "choose"], required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    csv = out / "tuning_runs.csv"
    done = pd.read_csv(csv) if csv.exists() else pd.DataFrame()
    if a.stage == "screen":
        warnings.filterwarnings("ignore", message=".*tokenize.*deprecated.*")
        names = [n for n in (a.only.split(",") if a.only else CANDIDATES) if n]
        unknown = [n for n in names if n not in CANDIDATES]
        if unknown:
            raise SystemExit(f"unknown candidate(s) {unknown}; known: {list(CANDIDATES)}")
        todo = [n for n in names if done.empty or n not in set(done.candidate)]
        if not todo:
            print("every candidate is in", csv)
            return
        d = data()
        for n in todo:
            print(f"[tune_02] {n} {CANDIDATES[n]}", flush=True)
            rows = run_candidate(n, CANDIDATES[n], *d)
            done = pd.concat([done, pd.DataFrame(rows)], ignore_index=True)
            done.to_csv(csv, index=False)
            print(pd.DataFrame(rows)[["step", "val_mnrl", "expert_similarity", "routing_jsd_bits", "top1_agreement",
                                      "reached"]].round(4).to_string(index=False), f"\n  wall {rows[-1]['wall_s']} s",
                  flush=True)
        return
    if done.empty:
        raise SystemExit(f"{csv} is empty: run --stage screen first")
    ok = done[done.reached].sort_values(["pairs_seen", "similarity_fall"], ascending=[True, False])
    choice = None if ok.empty else ok.iloc[0][["candidate", "lr", "batch_size", "step", "pairs_seen"]].to_dict()
    last = done.sort_values("step").groupby("candidate").tail(1).set_index("candidate")
    summary = dict(data=DATA, fixed=FIXED, targets=REGIME_TARGETS.text(), choice=choice,
                   choice_rule="fewest pairs seen (steps x batch) among readings meeting every target; then largest "
                               "similarity fall",
                   end_readings=json.loads(last[["lr", "batch_size", "step", "val_mnrl", "expert_similarity",
                                                 "similarity_fall", "routing_jsd_bits", "top1_agreement", "reached",
                                                 "wall_s", "cpu_s"]].to_json(orient="index")),
                   screen_cpu_s=float(done.groupby("candidate").cpu_s.max().sum()),
                   provenance=provenance([sys.executable, *sys.argv]))
    (out / "tuning_summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(json.dumps(dict(choice=choice, screen_cpu_s=summary["screen_cpu_s"]), indent=1, default=str))


if __name__ == "__main__":
    main()
