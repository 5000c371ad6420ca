#!/usr/bin/env python3
"""Is the planner's top choice the fastest layout measured? (docs/benchmarks.md, "The planner")

  python3 bench/plan_choice.py [--model gpt-small] [--global-batch 8] [--top 12] [--steps 10]
                               [--cluster examples/clusters/this-machine.json] [--extra "pp=2 m=4 1f1b;..."]

Runs `meshtrain plan` on the cluster file (this machine's, by default), then trains every
layout of its top K, and the --extra ones (default: a pipeline and a tensor-parallel layout the
plan ranks lower), for --steps steps each with the plan's flags, and prints predicted against
measured step time (median of the steps after the first two) and where the plan's first choice
lands among the measured: the check is that it is the fastest or within 5% of it.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESHTRAIN = os.environ.get("MESHTRAIN", os.path.join(ROOT, "build", "meshtrain"))
ROW = re.compile(r"^\s*(\d+)\s+(dp=\S+ tp=\S+ pp=\S+ m=\S+(?: \S+)*?)\s+([\d.]+) (ms|s)\s")
MEASURED = re.compile(r"predicted against measured: step ([\d.]+) ms vs ([\d.]+) ms")


def flags_of(layout):
    f = []
    for word in layout.split():
        if "=" in word:
            k, v = word.split("=")
            f += {"dp": ["--dp", v], "tp": ["--tp", v], "pp": ["--pp", v], "m": ["--microbatches", v],
                  "zero": ["--zero", v], "v": ["--chunks", v]}[k]
        elif word in ("gpipe", "1f1b", "interleaved", "zb"):
            f += ["--schedule", word]
        elif word == "recompute":
            f += ["--recompute"]
        elif word == "sp":
            f += ["--sequence-parallel"]
    return f


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--global-batch", default="8")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--cluster", default=os.path.join(ROOT, "examples", "clusters", "this-machine.json"))
    ap.add_argument("--extra", default="dp=1 tp=1 pp=2 m=4 1f1b;dp=1 tp=1 pp=2 m=8 gpipe")
    a = ap.parse_args()
    machine = os.path.join(os.path.dirname(a.cluster), "this-machine.machine.json")
    p = subprocess.run([MESHTRAIN, "plan", "--model", a.model, "--cluster", a.cluster, "--global-batch",
                        a.global_batch, "--top", str(a.top)], capture_output=True, text=True)
    if p.returncode:
        sys.exit(p.stderr)
    print(p.stdout)
    rows = [(int(m.group(1)), m.group(2).strip(), float(m.group(3)) * (1 if m.group(4) == "ms" else 1e3))
            for m in map(ROW.match, p.stdout.splitlines()) if m]
    rows += [(0, e.strip(), None) for e in a.extra.split(";") if e.strip()]
    data = next(f for f in (os.path.join(ROOT, "data", "corpus.txt"),) if os.path.exists(f))
    results = []
    for rank, layout, planned in rows:
        cmd = [MESHTRAIN, "train", "--model", a.model, "--batch", a.global_batch, "--data", data, "--steps",
               str(a.steps), "--eval-every", "0", "--eval-batches", "1", "--log-every", "0"] + flags_of(layout)
        if os.path.exists(machine):
            cmd += ["--machine", machine]
        r = subprocess.run(cmd, capture_output=True, text=True)
        m = MEASURED.search(r.stdout)
        if r.returncode or not m:
            print(f"{layout}: failed ({(r.stderr or r.stdout).strip().splitlines()[-1:]})", file=sys.stderr)
            continue
        results.append((rank, layout, float(m.group(1)), float(m.group(2))))
        print(f"| {rank or '-'} | {layout} | {float(m.group(1)):.0f} | {float(m.group(2)):.0f} |", flush=True)
    fastest = min(results, key=lambda x: x[3])
    first = next((x for x in results if x[0] == 1), None)
    print(f"\nfastest measured: {fastest[1]} at {fastest[3]:.0f} ms")
    if first:
        gap = 100 * (first[3] - fastest[3]) / fastest[3]
        print(f"the plan's first choice: {first[1]} at {first[3]:.0f} ms, {gap:+.1f}% from the fastest "
              f"({'within 5%' if gap <= 5 else 'NOT within 5%'})")


if __name__ == "__main__":
    main()
