"""Choose the naive model of notebook 04 (MASS synthetic experiment, issue 18 item 2) on the VALIDATION split only.

The in-context GINC data of ``moelab.mass`` (uniform entity switching, GINC's example length 5 and 4 examples per
sequence); every candidate is a set of naive single-layer MoE Transformers (top-2; top-1 at E = 1) trained with
``moelab.mass.run_naive`` and scored on the validation draw (``SynthSetup(eval_split="validation")``, seed
data_seed + 2000; the test draw, data_seed + 1000, is never read here).  For each candidate the script writes one
row per trained model with its validation target NLL (nats per target token y), full-sequence NLL and accuracy, and
the reference levels of the same validation sequences: the exact Bayes floor (``incontext_bayes``) and the add-1
n-gram baselines fitted on the candidate's training sequences (``ngram_baselines``).

Stages (run in this order; a candidate already in the CSV is skipped, so the script resumes):
  screen:   E in {1, 4, 16} x seeds {0, 1}: width, batch, learning rate, steps and the training loss (targets y only
            or every next token; the paper: "trained end-to-end using cross-entropy loss", y evaluated)
  frontier: the chosen candidate over E in {1, 2, 3, 4, 6, 8, 12, 16} x seeds {0, 1, 2}: the spread of the frontier
            (max - min of the per-E seed means) against the seed s.d. (pooled over E)
  choose:   no training; writes the choice and its criteria (gap to the Bayes floor and to the trigram, spread / s.d.)
            into tuning_summary.json

Writes data/tuning/04_mass/tuning_runs.csv (one row per model) and tuning_summary.json (references, per-candidate
summary, the choice and its criterion, provenance: commit, command, threads, CPU seconds, date).

Run (1 thread; about 2-5 CPU minutes per screening candidate on the 2-core project machine):
    OMP_NUM_THREADS=1 .venv/bin/python scripts/tune_04.py --stage screen [--only NAME,NAME]
    OMP_NUM_THREADS=1 .venv/bin/python scripts/tune_04.py --stage frontier --candidate NAME
    .venv/bin/python scripts/tune_04.py --stage choose --candidate NAME
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from moelab import mass as ms

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "tuning" / "04_mass"     # not under figures/04_mass/: publishing a run replaces that folder
DATA = dict(data_format="incontext", n_examples=4, example_len=5, entity_switch="uniform", n_test=512,
            max_experts=16, n_heads=2, eval_split="validation")
# candidate name -> SynthSetup fields (everything not named here: DATA)
CANDIDATES = {
    "d32_b32_lr1e-2_T1000_tgt": dict(d_model=32, batch_size=32, lr=1e-2, steps=1000, loss_on="targets"),
    "d32_b32_lr1e-2_T1000_all": dict(d_model=32, batch_size=32, lr=1e-2, steps=1000, loss_on="all"),
    "d32_b32_lr3e-3_T1000_all": dict(d_model=32, batch_size=32, lr=3e-3, steps=1000, loss_on="all"),
    "d64_b32_lr3e-3_T1000_all": dict(d_model=64, batch_size=32, lr=3e-3, steps=1000, loss_on="all"),
    "d32_b32_lr1e-2_T3000_all": dict(d_model=32, batch_size=32, lr=1e-2, steps=3000, loss_on="all"),
    "d32_b64_lr1e-2_T1000_all": dict(d_model=32, batch_size=64, lr=1e-2, steps=1000, loss_on="all"),
    "d32_b32_lr3e-3_T3000_all": dict(d_model=32, batch_size=32, lr=3e-3, steps=3000, loss_on="all"),
    "d32_b32_lr3e-3_T1000_tgt": dict(d_model=32, batch_size=32, lr=3e-3, steps=1000, loss_on="targets"),
    "d16_b32_lr1e-2_T1000_all": dict(d_model=16, batch_size=32, lr=1e-2, steps=1000, loss_on="all"),
    "d16_b32_lr3e-3_T1000_all": dict(d_model=16, batch_size=32, lr=3e-3, steps=1000, loss_on="all"),
    "d32_b32_lr3e-2_T1000_all": dict(d_model=32, batch_size=32, lr=3e-2, steps=1000, loss_on="all"),
    "d64_b32_lr1e-2_T3000_all": dict(d_model=64, batch_size=32, lr=1e-2, steps=3000, loss_on="all"),
    "d32_b64_lr1e-2_T3000_all": dict(d_model=32, batch_size=64, lr=1e-2, steps=3000, loss_on="all"),
    "d32_b64_lr1e-2_T3000_tgt": dict(d_model=32, batch_size=64, lr=1e-2, steps=3000, loss_on="targets"),
    "d64_b64_lr3e-3_T5000_all": dict(d_model=64, batch_size=64, lr=3e-3, steps=5000, loss_on="all"),
    "d64_b32_lr1e-2_T3000_all_cos_h4": dict(d_model=64, batch_size=32, lr=1e-2, steps=3000, loss_on="all",
                                            lr_decay="cosine", n_heads=4),
    "d64_b32_lr1e-2_T3000_all_cos": dict(d_model=64, batch_size=32, lr=1e-2, steps=3000, loss_on="all",
                                         lr_decay="cosine"),
    "d64_b32_lr3e-2_T3000_all_cos": dict(d_model=64, batch_size=32, lr=3e-2, steps=3000, loss_on="all",
                                         lr_decay="cosine"),
    "d64_b64_lr1e-2_T3000_all_cos": dict(d_model=64, batch_size=64, lr=1e-2, steps=3000, loss_on="all",
                                         lr_decay="cosine"),
    "d64_b32_lr1e-2_T1000_all_cos": dict(d_model=64, batch_size=32, lr=1e-2, steps=1000, loss_on="all",
                                         lr_decay="cosine"),
    "d64_b32_lr1e-2_T3000_tgt_cos": dict(d_model=64, batch_size=32, lr=1e-2, steps=3000, loss_on="targets",
                                         lr_decay="cosine"),
    "d64_b32_lr1e-2_T1000_all_cos_h4": dict(d_model=64, batch_size=32, lr=1e-2, steps=1000, loss_on="all",
                                            lr_decay="cosine", n_heads=4),
    "d128_b32_lr3e-3_T3000_all_cos": dict(d_model=128, batch_size=32, lr=3e-3, steps=3000, loss_on="all",
                                          lr_decay="cosine", n_heads=4),
    # two attention layers (one attention-only block before the MoE block): one layer does not beat the trigram
    "d64_b32_lr1e-2_T1000_all_cos_h4_L2": dict(d_model=64, batch_size=32, lr=1e-2, steps=1000, loss_on="all",
                                               lr_decay="cosine", n_heads=4, attn_layers=2),
    "d64_b32_lr1e-2_T3000_all_cos_h4_L2": dict(d_model=64, batch_size=32, lr=1e-2, steps=3000, loss_on="all",
                                               lr_decay="cosine", n_heads=4, attn_layers=2),
    "d64_b32_lr3e-3_T3000_all_cos_h4_L2": dict(d_model=64, batch_size=32, lr=3e-3, steps=3000, loss_on="all",
                                               lr_decay="cosine", n_heads=4, attn_layers=2),
    "d64_b32_lr1e-2_T3000_all_cos_h4_L3": dict(d_model=64, batch_size=32, lr=1e-2, steps=3000, loss_on="all",
                                               lr_decay="cosine", n_heads=4, attn_layers=3),
    # a longer schedule: one and two layers both stop short of the trigram at T = 3000 (still falling)
    "d64_b32_lr1e-2_T6000_all_cos_h4": dict(d_model=64, batch_size=32, lr=1e-2, steps=6000, loss_on="all",
                                            lr_decay="cosine", n_heads=4),
}
SCREEN = dict(counts=(1, 4, 16), seeds=(0, 1))
FRONTIER = dict(counts=(1, 2, 3, 4, 6, 8, 12, 16), seeds=(0, 1, 2))


def configs(counts, seeds):
    """(num_experts, top_k, seed): top-2, top-1 for a single expert."""
    return [(E, min(2, E), s) for E in counts for s in seeds]


def references(setup: ms.SynthSetup) -> dict:
    """Bayes floor and n-gram baselines of the validation draw (targets y; full sequence)."""
    g, train, val = setup.data()
    b = ms.incontext_bayes(g, val)
    ng = ms.ngram_baselines(train, val, g.cfg.n_symbols)
    out = dict(bayes_target_nll=float(b["target_nll"].mean()), bayes_full_nll=float(b["full_nll"].mean()),
               bayes_target_acc=float(b["target_acc"].mean()))
    for r in ng.itertuples():
        out[f"{r.name}_target_nll"], out[f"{r.name}_full_nll"] = float(r.target_nll), float(r.full_nll)
    return out


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    """Per candidate and stage: best per-E seed mean, spread of the per-E means, pooled seed s.d."""
    rows = []
    for (cand, stage), g in runs.groupby(["candidate", "stage"]):
        per_e = g.groupby("num_experts").val_target_nll
        means = per_e.mean()
        rows.append(dict(candidate=cand, stage=stage, best_E=int(means.idxmin()), best_mean=float(means.min()),
                         E1_mean=float(means.iloc[0]), spread=float(means.max() - means.min()),
                         seed_sd=float(np.sqrt(per_e.var(ddof=1).mean())), models=len(g),
                         cpu_s=float(g.cpu_s.iloc[0])))
    return pd.DataFrame(rows)


def choose(runs: pd.DataFrame, summary: dict, name: str) -> dict:
    """The chosen candidate (its frontier stage) and the criteria of issue 18 item 2 on validation: best seed-mean
    target NLL over E against the Bayes floor and the trigram of the same draws, frontier range against seed s.d.;
    and the best screening candidate (lowest seed-mean at any E) with its gaps."""
    sm = summarise(runs)
    sel = sm[(sm.candidate == name) & (sm.stage == "frontier")]
    if sel.empty:
        raise ValueError(f"candidate {name!r} has no frontier stage yet: run --stage frontier --candidate {name}")
    row = sel.iloc[0]

    def ref(cand):
        c = CANDIDATES[cand]
        return summary["references"][f"steps={c['steps']},batch={c['batch_size']}"]
    best = sm[sm.stage == "screen"].sort_values("best_mean").iloc[0]
    r, rb = ref(name), ref(best.candidate)
    return dict(candidate=name, settings=CANDIDATES[name], frontier_best_E=int(row.best_E),
                frontier_best_val_target_nll=float(row.best_mean), bayes_val_target_nll=r["bayes_target_nll"],
                trigram_val_target_nll=r["trigram_target_nll"], gap_to_bayes=float(row.best_mean - r["bayes_target_nll"]),
                gap_to_trigram=float(row.best_mean - r["trigram_target_nll"]), frontier_spread=float(row.spread),
                seed_sd=float(row.seed_sd), spread_over_sd=float(row.spread / row.seed_sd) if row.seed_sd > 0 else None,
                best_screen_candidate=best.candidate, best_screen_val_target_nll=float(best.best_mean),
                best_screen_gap_to_bayes=float(best.best_mean - rb["bayes_target_nll"]),
                best_screen_gap_to_trigram=float(best.best_mean - rb["trigram_target_nll"]))


def provenance(argv) -> dict:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "lib/moelab/mass", "scripts/tune_04.py"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip())
    return dict(commit=commit, working_tree_dirty=dirty, command="python scripts/tune_04.py " + " ".join(argv),
                torch_threads=torch.get_num_threads(), python=sys.version.split()[0], torch=torch.__version__,
                machine=platform.machine(), processor=platform.processor() or platform.machine(),
                date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", choices=("screen", "frontier", "choose"), required=True)
    ap.add_argument("--only", default="", help="comma-separated candidate names (screen; default: all)")
    ap.add_argument("--candidate", default="", help="the chosen candidate (frontier, choose)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = OUT / "tuning_runs.csv", OUT / "tuning_summary.json"
    runs = pd.read_csv(csv_path) if csv_path.exists() else pd.DataFrame()
    summary = json.loads(json_path.read_text()) if json_path.exists() else dict(references={}, runs=[])
    if args.stage == "choose":            # no training: record the choice from the saved runs
        summary["choice"] = choose(runs, summary, args.candidate)
        summary["choice"]["provenance"] = provenance(argv if argv is not None else sys.argv[1:])
        json_path.write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary["choice"], indent=1))
        return
    if args.stage == "screen":
        names = [n for n in (args.only.split(",") if args.only else CANDIDATES) if n]
        grid = SCREEN
    else:
        names, grid = [args.candidate], FRONTIER
    bad = [n for n in names if n not in CANDIDATES]
    if bad:
        raise ValueError(f"unknown candidate(s) {bad}; known: {sorted(CANDIDATES)}")
    for name in names:
        if len(runs) and ((runs.candidate == name) & (runs.stage == args.stage)).any():
            print(f"{name} ({args.stage}): already in {csv_path.name}, skipped")
            continue
        setup = ms.SynthSetup(**{**DATA, **CANDIDATES[name]})
        ref_key = f"steps={setup.steps},batch={setup.batch_size}"      # the n-gram fit depends on the training draw
        if ref_key not in summary["references"]:
            summary["references"][ref_key] = references(setup)
        t0 = time.process_time()
        res = ms.run_naive(setup, configs(**grid))
        cpu = time.process_time() - t0
        t = res["table"].rename(columns=dict(test_loss="val_target_nll", test_full_loss="val_full_nll",
                                             test_acc="val_target_acc"))
        t.insert(0, "stage", args.stage)
        t.insert(0, "candidate", name)
        for k, v in CANDIDATES[name].items():
            t[k] = v
        t["cpu_s"] = cpu
        last = res["history"].groupby(["num_experts", "top_k", "seed"]).loss.apply(lambda l: float(l.iloc[-5:].mean()))
        t["train_loss_end"] = [last[(r.num_experts, r.top_k, r.seed)] for r in t.itertuples()]
        # re-read before writing: several screening processes may share the files (one candidate each)
        runs = pd.read_csv(csv_path) if csv_path.exists() else pd.DataFrame()
        disk = json.loads(json_path.read_text()) if json_path.exists() else dict(references={}, runs=[])
        summary = {**disk, "references": {**disk.get("references", {}), **summary["references"]},
                   "runs": disk.get("runs", [])}
        runs = pd.concat([runs, t], ignore_index=True)
        runs.to_csv(csv_path, index=False, float_format="%.6g")
        ref = summary["references"][ref_key]
        print(f"{name} ({args.stage}, {cpu:.0f} CPU s): " + "; ".join(
            f"E={E}: {g.val_target_nll.mean():.4f} ± {g.val_target_nll.std():.4f}"
            for E, g in t.groupby("num_experts")) + f" | Bayes {ref['bayes_target_nll']:.4f}, trigram "
              f"{ref['trigram_target_nll']:.4f}", flush=True)
        summary["runs"].append(dict(candidate=name, stage=args.stage, cpu_s=cpu, setup=vars(setup),
                                    provenance=provenance(argv if argv is not None else sys.argv[1:])))
        summary["summary"] = summarise(runs).to_dict(orient="records")
        json_path.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
