"""Items per second of moelab's one log-likelihood scorer (``moelab.suite.lmeval.FastHFLM``, issue 17) vs lm-eval's HFLM.

The same requests (built from the suite's task data exactly as the task YAMLs build them) go to both LMs, wrapped
around the same in-memory model; in each repeat the two run in a shuffled order (interleaved, so machine load hits
both alike). Task types:

- ``multiple_choice_multi_token``: date_understanding, temporal_sequences, logical_deduction_three_objects,
  tracking_shuffled_objects_three_objects, math_mc (options of 2-11 tokens);
- ``multiple_choice_single_token``: hyperbaton, navigate, winowhy (one-token options: HFLM already shares the context);
- ``bits_per_byte``: rolling log-likelihood of the reference answers of nll_maths / nll_code / nll_reasoning;
- ``answer_likelihood``: log-likelihood of those answers given their instruction (the suite's bpb tasks).

Before timing, scores are checked equal (max |Δ| per continuation token, is_greedy identical). Per model and type:
median items/s of each LM, median of the per-repeat speed ratios (HFLM time / scorer time). A cProfile summary of one
scorer pass on the multi-token type says where the remaining time goes. Writes ``benchmarks/results/scorer.json``
(top-level ``speedup_vs_hflm``: model -> task type -> median ratio).

Run (quiet machine): .venv/bin/python benchmarks/bench_scorer.py [--items 20] [--repeats 5] [--threads 1]
Smoke: .venv/bin/python benchmarks/bench_scorer.py --items 1 --repeats 1 --out /tmp/scorer.json
Gemma-3-270M needs ``make assets-gemma``; without it the model is reported missing.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import random
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM

from moelab import assets
from moelab.suite import lmeval

os.environ.setdefault("MOELAB_PROGRESS", "0")
HERE = Path(__file__).resolve().parent
TASK_TYPES = {
    "multiple_choice_multi_token": ["bb_date_understanding", "bb_temporal_sequences", "bb_logical_deduction_three_objects",
                                    "bb_tracking_shuffled_objects_three_objects", "math_mc"],
    "multiple_choice_single_token": ["bb_hyperbaton", "bb_navigate", "bb_winowhy"],
    "bits_per_byte": ["nll_maths", "nll_code", "nll_reasoning"],
    "answer_likelihood": ["nll_maths", "nll_code", "nll_reasoning"],
}
LOADERS = {"smollm2": assets.load_smollm2, "gemma3": assets.load_gemma3}


def requests_for(kind: str, n_items: int) -> tuple[str, list[Instance], int]:
    """(lm method, requests, number of items) of one task type, ``n_items`` items per task."""
    reqs, n = [], 0
    for task in TASK_TYPES[kind]:
        for d in lmeval.task_docs(task)[:n_items]:
            n += 1
            if kind.startswith("multiple_choice"):
                reqs += [Instance("loglikelihood", d, (d["prompt"], " " + c), i) for i, c in enumerate(d["choices"])]
            elif kind == "bits_per_byte":
                reqs.append(Instance("loglikelihood_rolling", d, (d["continuation"],), 0))
            else:
                reqs.append(Instance("loglikelihood", d, (d["context"], d["continuation"]), 0))
    return ("loglikelihood_rolling" if kind == "bits_per_byte" else "loglikelihood"), reqs, n


def max_diff_per_token(fast: HFLM, method: str, reqs, a, b) -> tuple[float, bool]:
    if method == "loglikelihood_rolling":
        ntok = [max(1, len(fast.tok_encode(r.args[0]))) for r in reqs]
        return max(abs(x - y) / k for x, y, k in zip(a, b, ntok)), True
    ntok = [len(fast._encode_pair(*r.args)[1]) for r in reqs]
    return max(abs(x[0] - y[0]) / k for x, y, k in zip(a, b, ntok)), all(x[1] == y[1] for x, y in zip(a, b))


def profile_summary(fn, top: int = 12) -> list[dict]:
    """cProfile of one call: the functions with the most cumulative time (share of the total)."""
    pr = cProfile.Profile()
    t0 = time.perf_counter()
    pr.enable()
    fn()
    pr.disable()
    total = time.perf_counter() - t0
    st = pstats.Stats(pr, stream=io.StringIO())
    rows = []
    for (file, line, name), (_, ncalls, tt, ct, _) in st.stats.items():
        rows.append(dict(function=f"{Path(file).name}:{line}({name})", calls=ncalls, self_s=round(tt, 4),
                         cumulative_s=round(ct, 4), cumulative_share=round(ct / total, 3)))
    rows.sort(key=lambda r: -r["self_s"])
    return rows[:top]


def bench_model(name: str, n_items: int, repeats: int, batch_size: int, seed: int) -> dict:
    model, tok = LOADERS[name]()
    ref = HFLM(pretrained=model, tokenizer=tok, batch_size=batch_size)
    fast = lmeval.FastHFLM(pretrained=model, tokenizer=tok, batch_size=batch_size)
    rng = random.Random(seed)
    out = {}
    for kind in TASK_TYPES:
        method, reqs, n = requests_for(kind, n_items)
        lms = {"hflm": ref, "scorer": fast}
        a = getattr(ref, method)(reqs, disable_tqdm=True)                 # warm-up + equality check
        b = getattr(fast, method)(reqs, disable_tqdm=True)
        diff, greedy_equal = max_diff_per_token(fast, method, reqs, a, b)
        times = {k: [] for k in lms}
        for _ in range(repeats):
            order = list(lms)
            rng.shuffle(order)
            for k in order:
                t0 = time.perf_counter()
                getattr(lms[k], method)(reqs, disable_tqdm=True)
                times[k].append(time.perf_counter() - t0)
        ratios = [h / s for h, s in zip(times["hflm"], times["scorer"])]
        out[kind] = dict(tasks=TASK_TYPES[kind], items=n, requests=len(reqs), repeats=repeats,
                         items_per_s={k: float(np.median([n / t for t in v])) for k, v in times.items()},
                         seconds={k: v for k, v in times.items()}, median_ratio=float(np.median(ratios)),
                         max_abs_diff_per_token=diff, is_greedy_identical=greedy_equal)
        print(f"{name:8s} {kind:30s} items {n:4d}  HFLM {out[kind]['items_per_s']['hflm']:7.2f}/s  "
              f"scorer {out[kind]['items_per_s']['scorer']:7.2f}/s  x{out[kind]['median_ratio']:.2f}  "
              f"max|Δ|/tok {diff:.1e}  greedy equal {greedy_equal}", flush=True)
    method, reqs, _ = requests_for("multiple_choice_multi_token", n_items)
    out["profile_scorer_multiple_choice_multi_token"] = profile_summary(lambda: fast.loglikelihood(reqs, True))
    out["profile_hflm_multiple_choice_multi_token"] = profile_summary(lambda: ref.loglikelihood(reqs, True))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--items", type=int, default=20, help="items per task")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=8, help="both LMs (the suite's lmeval.evaluate default)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "results" / "scorer.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    res = dict(machine=dict(platform=platform.platform(), cpus=os.cpu_count(), threads=args.threads,
                            torch=torch.__version__, transformers=transformers.__version__,
                            load_average=list(os.getloadavg())),
               settings=vars(args), speedup_vs_hflm={}, models={}, missing={})
    for name in args.models.split(","):
        try:
            r = bench_model(name, args.items, args.repeats, args.batch_size, args.seed)
        except assets.MissingAsset as e:
            res["missing"][name] = str(e)
            print(f"{name}: missing ({e})")
            continue
        res["models"][name] = r
        res["speedup_vs_hflm"][name] = {k: r[k]["median_ratio"] for k in TASK_TYPES}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res["speedup_vs_hflm"], indent=1))


if __name__ == "__main__":
    main()
