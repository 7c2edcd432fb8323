import sys, time, json, torch
torch.set_num_threads(1)
from moelab.mass.config import profile
from dataclasses import replace
from moelab.mass.experiment import run_naive, reference_levels
T = int(sys.argv[1]); d = int(sys.argv[2])
p = profile("full")
s = replace(p.setup(0, eval_split="validation"), steps=T, d_model=d, device="cpu")
t0 = time.time()
r = run_naive(s, [(2, 2, 0), (4, 2, 0)])
t1 = time.time()
print(r["table"].to_string(), flush=True)
print("train s", t1 - t0, flush=True)
if len(sys.argv) > 3:
    ref = reference_levels(s)
    print(ref.to_string())
