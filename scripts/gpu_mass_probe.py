"""Time notebook 04's `paper` profile on one device (issue: 04 MASS, item 4): the naive models of the given expert
counts (seed 0, top-k 2) trained with the `paper` SynthSetup through ``moelab.mass.run_from_config`` -- the path
``python -m moelab.launch moelab.mass:run_from_config`` takes -- and their test score beside the n-gram baselines.

    python scripts/gpu_mass_probe.py --out runs/mass_probe.json [--steps N] [--counts 1 4]

``--refs`` writes the reference levels instead (Bayes floor, within-example Bayes, 3- and 4-grams fitted on the
same training draw). ``--steps`` shortens the schedule (a CPU check of the script); the default is the profile's. Writes the runs table,
the setup, the device and the wall time as JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch

from moelab.mass import config as mass_config
from moelab.mass.experiment import SynthSetup, reference_levels, run_from_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--counts", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--profile", default="paper")
    ap.add_argument("--refs", action="store_true", help="only the reference levels (Bayes, 3- and 4-grams) on the "
                    "same training draw, fitted on the CPU (moelab.mass.experiment.reference_levels)")
    a = ap.parse_args()
    setup = dataclasses.asdict(mass_config.profile(a.profile).synth)
    if a.steps is not None:
        setup["steps"] = a.steps
    if a.refs:
        t0 = time.perf_counter()
        refs = reference_levels(SynthSetup(**setup), orders=(3, 4))
        out = {"profile": a.profile, "wall_s": round(time.perf_counter() - t0, 1), "setup": setup,
               "refs": json.loads(refs.to_json(orient="records"))}
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1, default=str)
        print(refs.to_string())
        return
    cfg = {"kind": "naive", "setup": setup, "configs": [[e, min(2, e), 0] for e in a.counts]}
    t0 = time.perf_counter()
    table = run_from_config(cfg)
    wall = time.perf_counter() - t0
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    out = {"profile": a.profile, "device": dev, "wall_s": round(wall, 1), "setup": setup,
           "runs": json.loads(table.to_json(orient="records"))}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1, default=str)
    print(json.dumps({k: out[k] for k in ("profile", "device", "wall_s")}))
    print(table.to_string())


if __name__ == "__main__":
    main()
