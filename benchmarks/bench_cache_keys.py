"""How long computing a cache key's code part takes (architecture v2, item 1).

Every cached step of a notebook computes :func:`moelab.cache.code_closure` of its builder on every resume check:
the import closure of the moelab modules it can run, each identified by :func:`moelab.cache.source_digest` (the
normalised AST). This times, for each paper package's entry point, the first key of a process (every module parsed
and normalised: the cold cost) and later keys (files re-read and re-hashed, parsing memoised by content), and writes
``benchmarks/results/cache_keys.json``.

    python benchmarks/bench_cache_keys.py [--repeats 20]
"""
from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import time
from pathlib import Path

from moelab import cache

ENTRY_POINTS = {  # one function per notebook whose closure is among the largest of its notebook
    "00_moe_primer": "moelab.primer.method:contrastive_loss_fn",
    "01_moce": "moelab.moce.experiment:train_variant",
    "02_sba": "moelab.sba.experiment:phase_b_run",
    "03_cluster_upcycling": "moelab.cluster_upcycling.experiment:infonce_loss",
    "04_mass": "moelab.mass.experiment:run_mass",
    "05_free_moe": "moelab.free_moe.experiment:band_sweep",
}


def resolve(spec: str):
    mod, _, name = spec.partition(":")
    m = importlib.import_module(mod)
    return getattr(m, name)


def cold_caches() -> None:
    cache._DIGESTS.clear()
    cache._parse_imports.cache_clear()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
    rows = []
    for nb, spec in ENTRY_POINTS.items():
        fn = resolve(spec)
        cold_caches()
        t0 = time.perf_counter()
        closure = cache.code_closure(fn)
        cold = time.perf_counter() - t0
        warm = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            cache.code_closure(fn)
            warm.append(time.perf_counter() - t0)
        rows.append({"notebook": nb, "entry": spec, "modules": len(closure),
                     "source_lines": sum(len((cache.LIB.parent.parent / p).read_text().splitlines())
                                         for p in closure),
                     "cold_ms": round(1e3 * cold, 2), "warm_median_ms": round(1e3 * statistics.median(warm), 2)})
        print(f"{nb:22s} {rows[-1]['modules']:3d} modules  cold {rows[-1]['cold_ms']:7.1f} ms  "
              f"warm {rows[-1]['warm_median_ms']:6.1f} ms")
    out = {"machine": platform.platform(), "python": platform.python_version(), "repeats": a.repeats, "rows": rows}
    path = Path(__file__).parent / "results" / "cache_keys.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
