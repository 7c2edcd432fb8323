"""Forward+backward time of moelab's MoELayer vs transformers' Mixtral sparse block (same weights) vs the dense limit.

Config A: 8 experts, top-2, d 512, d_ff 1024 (SwiGLU), 4096 tokens. Candidates:
  moelab impl="auto" (= the fused per-expert loop on CPU, grouped_mm on CUDA), impl="grouped_mm", impl="loop", Mixtral block experts_implementation="eager" and "grouped_mm",
  dense limit = one SwiGLU FFN of intermediate top_k*d_ff over the same tokens (same FLOPs as the routed experts).
Config B (PESC): frozen SwiGLU FFN of SmolLM2's shape (d 576, d_ff 1536; random weights: timing does not depend on
  values), 4 adapter experts of width 64, top-2 (softmax over the kept logits) vs frozen FFN + one adapter of width 128.

Every candidate: y = f(x) with x requiring grad, then y.backward(g) with a fixed gradient g; interleaved repeats in a
shuffled order each round; medians with bootstrap 95% CIs over repeats, ratios to the dense limit with bootstrap CIs of
the ratio of medians. Writes benchmarks/results/moe_layer.json and prints a markdown table.

Run: .venv/bin/python benchmarks/bench_moe_layer.py [--repeats 15] [--tokens 4096] [--threads 2]

--device cuda (issue 33; run by scripts/gpu_check.sh): bf16, forward+backward timed with CUDA events, for the three
shapes of :data:`CUDA_SHAPES` (d_model, d_ff, experts, top_k, tokens): moelab's MoELayer (impl "auto" = grouped_mm on
CUDA) vs transformers' MixtralSparseMoeBlock with ``experts_implementation="grouped_mm"`` (same weights, checked equal,
and outputs checked against it and against moelab's per-expert loop before timing) vs the dense limit (one SwiGLU of
width top_k*d_ff over the same tokens). Interleaved shuffled repeats; writes
benchmarks/results/moe_layer_cuda_<card>.json (the card's name in the file name and in ``meta``).
``--shapes "d,f,E,k,T;..."`` runs that comparison on other shapes (and on the CPU, in fp32, with --device cpu).
``--profile --device cuda`` (issue 50; also run by scripts/gpu_check.sh): torch.profiler tables of moelab's layer and
transformers' block on the Mixtral-like shape, with the host syncs per call (see :func:`profile_shape`).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from moelab.core import MoELayer
from moelab.core.experts import AdapterExperts

HERE = Path(__file__).resolve().parent


class SwiGLU(nn.Module):
    """LlamaMLP-shaped dense FFN: down(silu(gate x) * up x)."""

    def __init__(self, d, f):
        super().__init__()
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DenseAdapter(nn.Module):
    """Frozen FFN + one adapter: h + W_up gelu(W_down h), h = FFN(x)."""

    def __init__(self, ffn, d, r):
        super().__init__()
        self.ffn = ffn
        self.down = nn.Linear(d, r, bias=False)
        self.up = nn.Linear(r, d, bias=False)

    def forward(self, x):
        h = self.ffn(x)
        return h + self.up(F.gelu(self.down(h)))


def mixtral_block(layer: MoELayer):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    cfg = MixtralConfig(hidden_size=layer.d_model, intermediate_size=layer.d_ff, num_local_experts=layer.num_experts,
                        num_experts_per_tok=layer.top_k, router_jitter_noise=0.0)
    blk = MixtralSparseMoeBlock(cfg)
    with torch.no_grad():
        blk.gate.weight.copy_(layer.router.weight)
        blk.experts.gate_up_proj.copy_(layer.experts.w_in)                   # [E, 2f, d], [gate | up]
        blk.experts.down_proj.copy_(layer.experts.w_out)                     # [E, d, f]
    return blk


def bootstrap_median(a, n_boot=2000, seed=0):
    rng = np.random.default_rng(seed)
    a = np.asarray(a)
    meds = np.median(a[rng.integers(0, len(a), (n_boot, len(a)))], axis=1)
    return float(np.median(a)), float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def bootstrap_ratio(a, b, n_boot=2000, seed=0):
    rng = np.random.default_rng(seed)
    a, b = np.asarray(a), np.asarray(b)
    ra = np.median(a[rng.integers(0, len(a), (n_boot, len(a)))], axis=1)
    rb = np.median(b[rng.integers(0, len(b), (n_boot, len(b)))], axis=1)
    r = ra / rb
    return float(np.median(a) / np.median(b)), float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))


def run_candidates(cands: dict, x: torch.Tensor, repeats: int, warmup: int = 2, seed: int = 0):
    """Seconds per forward+backward of each candidate, interleaved in a shuffled order each round; on CUDA timed with
    CUDA events around the call (the stream drained first), else with ``time.perf_counter``."""
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(x.device, x.dtype)
    times = {k: [] for k in cands}
    cuda = x.device.type == "cuda"

    def once(name):
        fn = cands[name]
        xx = x.detach().requires_grad_(True)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn(xx).backward(g)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        t0 = time.perf_counter()
        y = fn(xx)
        y.backward(g)
        t = time.perf_counter() - t0
        return t

    for name in cands:
        for _ in range(warmup):
            once(name)
    rng = random.Random(seed)
    order = list(cands)
    for _ in range(repeats):
        rng.shuffle(order)
        for name in order:
            times[name].append(once(name))
        for fn in cands.values():                                              # drop accumulated grads
            for p in getattr(fn, "parameters", lambda: [])():
                p.grad = None
    return times


def summarize(times: dict, dense_key: str):
    rows = {}
    for k, ts in times.items():
        med, lo, hi = bootstrap_median(ts)
        r, rlo, rhi = bootstrap_ratio(ts, times[dense_key])
        rows[k] = dict(median_s=med, ci95=[lo, hi], ratio_to_dense=r, ratio_ci95=[rlo, rhi], times_s=ts)
    return rows


def config_a(args):
    torch.manual_seed(0)
    d, f, E, k, T = 512, 1024, 8, 2, args.tokens
    layer = MoELayer(d, f, E, k, act="swiglu", renormalize=True)
    with torch.no_grad():
        layer.router.weight.normal_(0, 1.0 / d ** 0.5)
    blk = mixtral_block(layer)
    x = torch.randn(1, T, d)
    # same weights -> same outputs (checked before timing)
    blk.experts.config._experts_implementation = "eager"
    with torch.no_grad():
        y_ref = blk(x)
        for impl in ("auto", "grouped_mm", "loop"):
            layer.experts.impl = impl
            assert torch.allclose(layer(x), y_ref, atol=1e-4), impl
        blk.experts.config._experts_implementation = "grouped_mm"
        assert torch.allclose(blk(x), y_ref, atol=1e-4)
    dense = SwiGLU(d, k * f)

    def moelab(impl):
        def fn(xx):
            layer.experts.impl = impl
            return layer(xx)
        fn.parameters = layer.parameters
        return fn

    def mixtral(impl):
        def fn(xx):
            blk.experts.config._experts_implementation = impl
            return blk(xx)
        fn.parameters = blk.parameters
        return fn

    cands = {"moelab_auto_fused": moelab("auto"), "moelab_grouped_mm": moelab("grouped_mm"), "moelab_loop": moelab("loop"),
             "mixtral_eager": mixtral("eager"), "mixtral_grouped_mm": mixtral("grouped_mm"), "dense_limit": dense}
    return summarize(run_candidates(cands, x, args.repeats), "dense_limit"), dict(
        d_model=d, d_ff=f, num_experts=E, top_k=k, tokens=T, dense_limit=f"SwiGLU FFN d_ff={k * f}")


def config_b(args):
    torch.manual_seed(0)
    d, f, E, k, r, T = 576, 1536, 4, 2, 64, args.tokens
    ffn = SwiGLU(d, f).requires_grad_(False)
    experts = AdapterExperts(ffn, E, rank=r, scale=1.0, act="gelu", d_model=d)
    with torch.no_grad():
        experts.w_up.normal_(0, 0.02)                                          # non-zero so the adapters matter
    layer = MoELayer(d, f, E, k, router="topk", softmax_over="topk", experts=experts)
    dense = DenseAdapter(ffn, d, 2 * r)
    x = torch.randn(1, T, d)

    def moelab(impl):
        def fn(xx):
            layer.experts.impl = impl
            return layer(xx)
        fn.parameters = layer.parameters
        return fn

    cands = {"moelab_pesc_auto_fused": moelab("auto"), "moelab_pesc_grouped_mm": moelab("grouped_mm"),
             "moelab_pesc_loop": moelab("loop"),
             "dense_limit": dense}
    return summarize(run_candidates(cands, x, args.repeats), "dense_limit"), dict(
        d_model=d, d_ff=f, num_adapters=E, adapter_width=r, top_k=k, tokens=T,
        dense_limit=f"frozen SwiGLU FFN + one adapter of width {2 * r}")


# (d_model, d_ff, experts, top_k, tokens) of issue 33, with its targets: moelab (auto) at most this many times
# transformers' grouped_mm block and (where given) the dense limit
CUDA_SHAPES = {
    "mixtral_like": ((1024, 2816, 8, 2, 16384), {"transformers": 1.0, "dense": 1.6}),
    "olmoe_like": ((2048, 1024, 64, 8, 16384), {"transformers": 1.0}),
    "small": ((512, 1024, 8, 2, 4096), {"transformers": 1.0}),
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def parse_shapes(text: str) -> dict:
    """ "d,f,E,k,T;d,f,E,k,T" -> {label: (shape, {})}; a bad entry raises ValueError naming it."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        try:
            shape = tuple(int(v) for v in part.split(","))
        except ValueError:
            shape = ()
        if len(shape) != 5 or min(shape) < 1 or shape[3] > shape[2]:
            raise ValueError(f"shape {part!r}: expected d_model,d_ff,experts,top_k,tokens (positive, top_k <= experts)")
        out["x".join(map(str, shape))] = (shape, {})
    if not out:
        raise ValueError(f"--shapes {text!r} names no shape")
    return out


def same_weights(layer: MoELayer, blk) -> None:
    """The Mixtral block holds exactly the moelab layer's weights (router, [gate | up], down); else ValueError."""
    pairs = {"router": (layer.router.weight, blk.gate.weight), "gate_up": (layer.experts.w_in, blk.experts.gate_up_proj),
             "down": (layer.experts.w_out, blk.experts.down_proj)}
    bad = [k for k, (a, b) in pairs.items() if a.shape != b.shape or not torch.equal(a.detach(), b.detach())]
    if bad:
        raise ValueError(f"moelab layer and transformers block differ in {bad}: copy the weights with mixtral_block()")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def _layer_and_block(d: int, f: int, E: int, k: int, seed: int):
    """moelab's layer (router drawn at 1/sqrt(d)) and transformers' Mixtral block with the same weights, its experts on
    ``grouped_mm``: the pair every CUDA comparison times."""
    torch.manual_seed(seed)
    layer = MoELayer(d, f, E, k, act="swiglu", renormalize=True)
    with torch.no_grad():
        layer.router.weight.normal_(0, 1.0 / d ** 0.5)
    blk = mixtral_block(layer)
    blk.experts.config._experts_implementation = "grouped_mm"
    return layer, blk


def compare_shape(shape, device: str, dtype: torch.dtype, repeats: int, seed: int = 0) -> dict:
    """One shape of the --device cuda comparison: moelab (auto) vs transformers' Mixtral block (grouped_mm experts)
    vs the dense limit, forward+backward; same weights checked equal, outputs checked close (relative L2 error within
    2e-2 in bf16, 1e-5 in fp32) against the block and against moelab's per-expert loop, before timing."""
    d, f, E, k, T = shape
    layer, blk = _layer_and_block(d, f, E, k, seed)
    dense = SwiGLU(d, k * f)
    layer, blk, dense = (m.to(device=device, dtype=dtype) for m in (layer, blk, dense))
    same_weights(layer, blk)
    x = torch.randn(1, T, d, generator=torch.Generator().manual_seed(seed + 1)).to(device, dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    with torch.no_grad():
        y = layer(x)
        checks = {"rel_err_vs_transformers_grouped_mm": rel_err(y, blk(x))}
        layer.experts.impl = "loop"
        checks["rel_err_vs_moelab_loop"] = rel_err(y, layer(x))
        layer.experts.impl = "auto"
    bad = {k2: v for k2, v in checks.items() if not v <= tol}
    if bad:
        raise RuntimeError(f"shape {shape}: outputs differ before timing ({bad}, tolerance {tol})")

    def moelab(xx):
        return layer(xx)
    moelab.parameters = layer.parameters

    cands = {"moelab_auto": moelab, "transformers_grouped_mm": blk, "dense_limit": dense}
    rows = summarize(run_candidates(cands, x, repeats, warmup=3, seed=seed), "dense_limit")

    def ratio(a, b):
        r = bootstrap_ratio(rows[a]["times_s"], rows[b]["times_s"])
        return dict(ratio=r[0], ci95=[r[1], r[2]])

    return dict(shape=dict(d_model=d, d_ff=f, num_experts=E, top_k=k, tokens=T), checks=checks, results=rows,
                comparisons={"moelab_vs_transformers_grouped_mm": ratio("moelab_auto", "transformers_grouped_mm"),
                             "moelab_vs_dense": ratio("moelab_auto", "dense_limit"),
                             "transformers_grouped_mm_vs_dense": ratio("transformers_grouped_mm", "dense_limit")})


def device_slug(name: str) -> str:
    return "-".join(filter(None, "".join(c if c.isalnum() else " " for c in name.lower()).split()))


def compare_shapes(shapes: dict, device: str, dtype: torch.dtype, repeats: int) -> dict:
    """:func:`compare_shape` for every ``{label: (shape, targets)}``, with each target's verdict and the run's meta."""
    import transformers
    t0 = time.time()
    name = torch.cuda.get_device_name(0) if device == "cuda" else (platform.processor() or platform.machine())
    out = []
    for label, (shape, targets) in shapes.items():
        r = compare_shape(shape, device, dtype, repeats)
        c = r["comparisons"]
        r["targets"] = {t: dict(at_most=v, ratio=c["moelab_vs_transformers_grouped_mm" if t == "transformers"
                                                   else "moelab_vs_dense"]["ratio"]) for t, v in targets.items()}
        for t in r["targets"].values():
            t["met"] = t["ratio"] <= t["at_most"]
        out.append({"label": label, **r})
        print(f"{label} {shape}: moelab/transformers grouped_mm x{c['moelab_vs_transformers_grouped_mm']['ratio']:.3f}, "
              f"moelab/dense x{c['moelab_vs_dense']['ratio']:.3f}, checks {r['checks']}", flush=True)
    meta = {"device": device, "device_name": name, "dtype": str(dtype).replace("torch.", ""), "repeats": repeats,
            "torch": torch.__version__, "cuda_runtime": torch.version.cuda, "transformers": transformers.__version__,
            "wall_s": time.time() - t0,
            "note": "fwd+bwd per call, x requires grad; CUDA events (stream drained before each call) on CUDA; "
                    "interleaved shuffled repeats after 3 warm-ups; ratios = median/median with bootstrap 95% CIs"}
    return {"meta": meta, "shapes": out}


def profile_layer(args):
    """Where the time of one MoELayer forward+backward goes (torch.profiler, CPU, top ops)."""
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    d, f, E, k, T = 512, 1024, 8, 2, args.tokens
    layer = MoELayer(d, f, E, k)
    x = torch.randn(1, T, d, requires_grad=True)
    g = torch.randn(1, T, d)
    layer(x).backward(g)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            layer(x).backward(g)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)


def profile_shape(shape, device: str, dtype: torch.dtype, steps: int = 3, seed: int = 0) -> str:
    """Where one forward+backward's time goes (issue 50: profile on the GPU before changing anything): torch.profiler
    over ``steps`` calls each of moelab's layer (impl "auto": the offsets path on CUDA) and of transformers' grouped_mm
    block (same weights), after 3 warm-ups; per candidate the host syncs per call (``cudaStreamSynchronize``,
    ``cudaDeviceSynchronize``, blocking ``cudaMemcpy``; 0 is the aim) and the top ops by self device time (self CPU
    time on the CPU)."""
    from torch.profiler import ProfilerActivity, profile
    d, f, E, k, T = shape
    layer, blk = _layer_and_block(d, f, E, k, seed)
    layer, blk = (m.to(device=device, dtype=dtype) for m in (layer, blk))
    x = torch.randn(1, T, d, generator=torch.Generator().manual_seed(seed + 1)).to(device, dtype)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 2)).to(device, dtype)
    cuda = device == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    sync_ops = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy")
    out = [f"# profile {'x'.join(map(str, shape))} (d, d_ff, E, k, T), {str(dtype).replace('torch.', '')}, {device}, "
           f"{steps} calls of forward+backward each"]
    for name, mod in (("moelab_auto", layer), ("transformers_grouped_mm", blk)):
        def call():
            mod(x.detach().requires_grad_(True)).backward(g)
            mod.zero_grad(set_to_none=True)
        for _ in range(3):
            call()
        if cuda:
            torch.cuda.synchronize()
        with profile(activities=acts) as prof:
            for _ in range(steps):
                call()
            if cuda:
                torch.cuda.synchronize()
        ev = prof.key_averages()
        counts = {e.key: e.count for e in ev if e.key in sync_ops}
        if cuda and counts.get("cudaDeviceSynchronize"):
            counts["cudaDeviceSynchronize"] -= 1                              # the profile's own, after the loop
        syncs_txt = ", ".join(f"{k2} {v / steps:g}" for k2, v in sorted(counts.items()) if v) or "none"
        out.append(f"\n## {name}: host syncs per call: {syncs_txt}\n" + ev.table(sort_by=sort, row_limit=20))
    return "\n".join(out)


CAPTURE_MODES = {
    "none": dict(),                                                    # baseline: same forward, no capture
    "keep_all_fp32": dict(keep_outputs=True),
    "max_tokens_10k": dict(keep_outputs=True, max_tokens=10_000),
    "every_10th_fp16": dict(keep_outputs=True, sample_every=10, store_dtype=torch.float16),
    "stats_only": dict(keep_outputs=False, max_tokens=0),
}


def capture_memory_child(mode: str, tokens: int, d: int, layers: int, batch: int):
    """One process: a 12-layer pre-norm stack x + MoE(LN(x)) of MoELayers (8 experts, top-2), ``tokens`` tokens in
    batches under no_grad, optionally inside capture_moe; prints peak RSS (ru_maxrss) before/after as JSON."""
    import resource
    from moelab.core import capture_moe
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(d)
            self.moe = MoELayer(d, 2 * d, 8, 2, renormalize=False)

        def forward(self, x):
            return x + self.moe(self.norm(x))

    model = nn.Sequential(*[Block() for _ in range(layers)]).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model(torch.randn(batch, d, generator=gen))                    # warm-up: allocator and workspaces
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.time()
    ctx = capture_moe(model, **CAPTURE_MODES[mode]) if mode != "none" else None
    with torch.no_grad():
        if ctx is not None:
            ctx.__enter__()
        for start in range(0, tokens, batch):
            model(torch.randn(min(batch, tokens - start), d, generator=gen))
        if ctx is not None:
            ctx.__exit__(None, None, None)
            recs = ctx.records                                          # materialise (concatenation included)
            stored = sum(sum(v.numel() * v.element_size() for v in r.values() if torch.is_tensor(v))
                         for r in recs.values())
            kept = int(next(iter(recs.values()))["indices"].shape[0])
        else:
            stored, kept = 0, 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(dict(mode=mode, peak_rss_mib=peak, base_rss_mib=base, delta_mib=peak - base,
                          stored_mib=stored / 2 ** 20, kept_tokens_per_layer=kept, wall_s=time.time() - t0)))


def capture_memory(args):
    import subprocess
    import sys
    rows = []
    for mode in CAPTURE_MODES:
        cmd = [sys.executable, __file__, "--capture-child", mode, "--tokens", str(args.capture_tokens),
               "--threads", str(args.threads)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        rows.append(json.loads(out))
        print(rows[-1], flush=True)
    res = {"model": "12 x (x + MoELayer(LayerNorm(x))), d_model 128, d_ff 256, 8 experts, top-2, no_grad, "
                    "batches of 4096 tokens", "tokens": args.capture_tokens, "rows": rows,
           "note": "peak_rss = ru_maxrss of the whole process; delta = peak - after warm-up; stored = bytes of the "
                   "returned records"}
    p = Path(args.out).parent / "capture_memory.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(res, indent=1))
    print("wrote", p)


def comparisons(res: dict) -> dict:
    """Ratios of medians with bootstrap CIs: moelab (auto) vs the dense limit and vs transformers' fastest block."""
    a = res["config_a"]["results"]
    hf = min(("mixtral_eager", "mixtral_grouped_mm"), key=lambda k: a[k]["median_s"])
    out = {"a_moelab_vs_dense": bootstrap_ratio(a["moelab_auto_fused"]["times_s"], a["dense_limit"]["times_s"]),
           "a_fastest_transformers": hf,
           "a_moelab_vs_fastest_transformers": bootstrap_ratio(a["moelab_auto_fused"]["times_s"], a[hf]["times_s"]),
           "a_mixtral_eager_vs_dense": bootstrap_ratio(a["mixtral_eager"]["times_s"], a["dense_limit"]["times_s"]),
           "a_mixtral_grouped_mm_vs_dense": bootstrap_ratio(a["mixtral_grouped_mm"]["times_s"],
                                                            a["dense_limit"]["times_s"])}
    if "config_b" in res:
        b = res["config_b"]["results"]
        out["b_moelab_pesc_vs_dense"] = bootstrap_ratio(b["moelab_pesc_auto_fused"]["times_s"],
                                                        b["dense_limit"]["times_s"])
    return {k: (dict(ratio=v[0], ci95=[v[1], v[2]]) if isinstance(v, tuple) else v) for k, v in out.items()}


def table(name, rows):
    lines = [f"| {name} | median s [95% CI] | x dense limit [95% CI] |", "|---|---|---|"]
    for k, r in rows.items():
        lines.append(f"| {k} | {r['median_s']:.4f} [{r['ci95'][0]:.4f}, {r['ci95'][1]:.4f}] | "
                     f"{r['ratio_to_dense']:.3f} [{r['ratio_ci95'][0]:.3f}, {r['ratio_ci95'][1]:.3f}] |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "results" / "moe_layer.json"))
    ap.add_argument("--profile", action="store_true",
                    help="torch.profiler tables instead of timings (with --device cuda or --shapes: moelab vs "
                         "transformers on the Mixtral-like shape or the given shapes, host syncs counted)")
    ap.add_argument("--capture-memory", action="store_true", help="measure capture_moe peak memory instead")
    ap.add_argument("--capture-tokens", type=int, default=100_000)
    ap.add_argument("--capture-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: the three shapes of issue 33 in bf16 (see the module docstring)")
    ap.add_argument("--shapes", default=None, help='"d_model,d_ff,experts,top_k,tokens;..." for the shape comparison')
    ap.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="shape comparison dtype (cuda: bf16, cpu: fp32)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.profile and (args.device == "cuda" or args.shapes):
        if args.device == "cuda" and not torch.cuda.is_available():
            ap.error("--device cuda: no CUDA device is visible (torch.cuda.is_available() is False)")
        shapes = parse_shapes(args.shapes) if args.shapes else {"mixtral_like": CUDA_SHAPES["mixtral_like"]}
        dtype = DTYPES[args.dtype or ("bf16" if args.device == "cuda" else "fp32")]
        for shape, _ in shapes.values():
            print(profile_shape(shape, args.device, dtype), flush=True)
        return
    if args.device == "cuda" or args.shapes:
        if args.device == "cuda" and not torch.cuda.is_available():
            ap.error("--device cuda: no CUDA device is visible (torch.cuda.is_available() is False)")
        try:
            shapes = parse_shapes(args.shapes) if args.shapes else CUDA_SHAPES
        except ValueError as e:
            ap.error(str(e))
        dtype = DTYPES[args.dtype or ("bf16" if args.device == "cuda" else "fp32")]
        res = compare_shapes(shapes, args.device, dtype, args.repeats)
        out = Path(args.out) if args.out != ap.get_default("out") else \
            HERE / "results" / f"moe_layer_{args.device}_{device_slug(res['meta']['device_name'])}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1))
        print("wrote", out)
        return
    if args.capture_child:
        capture_memory_child(args.capture_child, args.tokens, d=128, layers=12, batch=4096)
        return
    if args.capture_memory:
        capture_memory(args)
        return
    if args.profile:
        print(profile_layer(args))
        return
    t0 = time.time()
    a_rows, a_cfg = config_a(args)
    print(table("Config A", a_rows), flush=True)
    b_rows, b_cfg = config_b(args)
    print(table("Config B (PESC)", b_rows), flush=True)
    import transformers
    res = {
        "config_a": {"config": a_cfg, "results": a_rows},
        "config_b": {"config": b_cfg, "results": b_rows},
        "meta": {"repeats": args.repeats, "threads": args.threads, "torch": torch.__version__,
                 "transformers": transformers.__version__, "device": "cpu", "machine": platform.processor() or
                 platform.machine(), "cpu_count": os.cpu_count(), "load_avg_at_start": os.getloadavg(),
                 "wall_s": time.time() - t0,
                 "note": "fwd+bwd per call, x requires grad; interleaved shuffled repeats; ratios = median/median"},
    }
    res["comparisons"] = comparisons(res)
    print(json.dumps(res["comparisons"], indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
