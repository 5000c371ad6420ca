#!/usr/bin/env python3
"""Markdown tables from Google Benchmark JSON outputs of bench_gemm and bench_kernels.

Usage:
  bench_table.py gemm DIR      DIR holds <library>-<rep>.json from
                               bench_gemm --benchmark_out=DIR/<library>-<rep>.json
                                          --benchmark_out_format=json
  bench_table.py kernels DIR   DIR holds <anything>-<rep>.json from bench_kernels
Each cell is the best of the repetitions: the machine is shared, interference only ever
slows a run down, so the fastest run is the least disturbed one.
gemm: GFLOP/s per product x library x threads, then per model the effective rate of one
step's GEMMs (each layer product x layers + the lm_head products).
kernels: milliseconds per call at 1 and 2 threads, with the kernel's rate counter, and the
least thread CPU time at 1 thread (what a quiet machine's wall time would be).
"""
import collections
import glob
import json
import os
import sys

LAYERS = {"gpt-tiny": 4, "gpt-small": 6, "gpt2-124m": 12}
UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def load(d):
    """name -> source -> best run (dict with seconds and counters)."""
    best = collections.defaultdict(dict)
    sources = []
    for path in sorted(glob.glob(os.path.join(d, "*.json"))):
        src = os.path.basename(path).rsplit("-", 1)[0]
        if src not in sources:
            sources.append(src)
        for b in json.load(open(path))["benchmarks"]:
            if b.get("run_type") == "aggregate":
                continue
            name = b["name"].replace("/real_time", "")
            secs = b["real_time"] * UNIT[b["time_unit"]]
            if src not in best[name] or secs < best[name][src]["secs"]:
                best[name][src] = dict(b, secs=secs)
    return best, sources


def split(name):
    base, t = name.rsplit("/threads:", 1)
    return base, int(t)


def gemm(d):
    best, libs = load(d)
    cols = [(lib, t) for t in (1, 2) for lib in libs]
    print("| product | " + " | ".join(f"{l} {t}t" for l, t in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    shapes = sorted({split(n)[0] for n in best}, key=lambda s: (not s.startswith("square"), s))
    for s in shapes:
        cells = []
        for lib, t in cols:
            r = best.get(f"{s}/threads:{t}", {}).get(lib)
            cells.append(f"{r['GFLOPs']:.0f}" if r else "-")
        print(f"| {s} | " + " | ".join(cells) + " |")
    print()
    print("| one step's GEMMs, effective GFLOP/s | " + " | ".join(f"{l} {t}t" for l, t in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for model, layers in LAYERS.items():
        cells = []
        for lib, t in cols:
            flops = secs = 0.0
            for s in shapes:
                r = best.get(f"{s}/threads:{t}", {}).get(lib)
                if s.startswith(model + "/") and r:
                    k = 1 if "/lm_head/" in s else layers
                    flops += k * r["GFLOPs"] * r["secs"]
                    secs += k * r["secs"]
            cells.append(f"{flops / secs:.0f}" if secs else "-")
        print(f"| {model} | " + " | ".join(cells) + " |")


def best_cpu(d):
    """name -> least thread CPU seconds over the repetitions (robust to other load at 1 thread)."""
    cpu = {}
    for path in glob.glob(os.path.join(d, "*.json")):
        for b in json.load(open(path))["benchmarks"]:
            if b.get("run_type") == "aggregate":
                continue
            name = b["name"].replace("/real_time", "")
            secs = b["cpu_time"] * UNIT[b["time_unit"]]
            cpu[name] = min(cpu.get(name, secs), secs)
    return cpu


def kernels(d):
    best, _ = load(d)
    cpu = best_cpu(d)
    print("| kernel | 1 thread ms | 2 threads ms | 1 thread rate | 2 threads rate "
          "| 1 thread CPU ms |")
    print("|---|---:|---:|---:|---:|---:|")
    bases = []
    for n in best:
        b = split(n)[0]
        if b not in bases:
            bases.append(b)
    for b in bases:
        row = []
        rates = []
        for t in (1, 2):
            r = next(iter(best.get(f"{b}/threads:{t}", {}).values()), None)
            row.append(f"{r['secs'] * 1e3:.3f}" if r else "-")
            if r and "GFLOPs" in r:
                rates.append(f"{r['GFLOPs']:.1f} GFLOP/s")
            elif r and "GB/s" in r:
                rates.append(f"{r['GB/s']:.1f} GB/s")
            else:
                rates.append("-")
        c = cpu.get(f"{b}/threads:1")
        print(f"| {b} | " + " | ".join(row + rates + [f"{c * 1e3:.3f}" if c else "-"]) + " |")


if __name__ == "__main__":
    {"gemm": gemm, "kernels": kernels}[sys.argv[1]](sys.argv[2])
