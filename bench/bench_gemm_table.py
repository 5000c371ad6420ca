#!/usr/bin/env python3
"""Markdown table of GFLOP/s from bench_gemm JSON outputs (one or more runs per library).

Usage: bench_gemm_table.py DIR   (DIR holds <library>-<rep>.json from
       bench_gemm --benchmark_out=DIR/<library>-<rep>.json --benchmark_out_format=json)
Each cell is the best of the repetitions (the machine is shared: interference only ever
slows a run down, so the maximum is the least disturbed one). Also prints, per model and
library, the step's GEMM time (sum over the products of one layer x layers + lm_head) as an
effective GFLOP/s.
"""
import collections
import glob
import json
import os
import sys

LAYERS = {"gpt-tiny": 4, "gpt-small": 6, "gpt2-124m": 12}


def main(d):
    best = collections.defaultdict(dict)  # name -> lib -> (gflops, seconds)
    libs = []
    for path in sorted(glob.glob(os.path.join(d, "*.json"))):
        lib = os.path.basename(path).rsplit("-", 1)[0]
        if lib not in libs:
            libs.append(lib)
        for b in json.load(open(path))["benchmarks"]:
            name = b["name"].replace("/real_time", "")
            g = b["GFLOPs"] / 1e9 if b["GFLOPs"] > 1e6 else b["GFLOPs"]
            secs = b["real_time"] * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]
            if g > best[name].get(lib, (0, 0))[0]:
                best[name][lib] = (g, secs)
    cols = [f"{lib} t{t}" for t in (1, 2) for lib in libs]
    print("| product (M x N x K as run) | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    shapes = sorted({n.rsplit("/threads:", 1)[0] for n in best},
                    key=lambda s: (s.split("/")[0] != "square2048", s))
    for s in shapes:
        cells = []
        for t in (1, 2):
            for lib in libs:
                v = best.get(f"{s}/threads:{t}", {}).get(lib)
                cells.append(f"{v[0]:.0f}" if v else "-")
        print(f"| {s} | " + " | ".join(cells) + " |")
    print()
    print("| step GEMMs (layers x 12 products + lm_head x 3): effective GFLOP/s | "
          + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for model, L in LAYERS.items():
        cells = []
        for t in (1, 2):
            for lib in libs:
                flops = secs = 0.0
                for s in shapes:
                    if not s.startswith(model + "/"):
                        continue
                    v = best[f"{s}/threads:{t}"].get(lib)
                    k = 1 if "/lm_head/" in s else L
                    flops += k * v[0] * v[1]
                    secs += k * v[1]
                cells.append(f"{flops / secs:.0f}")
        print(f"| {model} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
