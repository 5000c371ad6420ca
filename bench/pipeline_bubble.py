#!/usr/bin/env python3
"""Pipeline bubble, measured against theory and against the simulator.

For each schedule and micro-batch count it trains gpt-small at --pp 2 (threads, one kernel
thread per rank: one core each on a 2-core machine) with --trace, and prints per run:
  theory     (p-1)/(m+p-1) for GPipe and 1F1B (ZB-H1, interleaved: the simulator's unit-cost figure)
  predicted  the bubble `meshtrain schedule` simulates from this run's measured mean F, B
             (and I, W) times per action (steps after the first)
  measured   the executor's idle share of the step ((step - compute) / step), mean over ranks
             and over the steps after the first, from the metrics file

Usage (from the repository root, after scripts/build.sh):
  python3 bench/pipeline_bubble.py [--steps 6] [--schedules gpipe,1f1b] [--m 1,2,4,8,16]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default="build/meshtrain")
ap.add_argument("--data", default="data/corpus.txt")
ap.add_argument("--model", default="gpt-small")
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--pp", type=int, default=2)
ap.add_argument("--schedules", default="gpipe,1f1b")
ap.add_argument("--m", default="1,2,4,8,16")
ap.add_argument("--chunks", type=int, default=3, help="model chunks per rank for interleaved (gpt-small: 6 blocks = 2 x 3)")
args = ap.parse_args()
if args.steps < 2:
    sys.exit("--steps must be at least 2 (the first step is left out)")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def action_times(trace_path, first_step_end_us):
    """Mean duration (ms) of F and B (or I, W) spans after the first step, over all ranks."""
    doc = json.load(open(trace_path))
    spans = {}
    for e in doc["traceEvents"]:
        if e.get("ph") != "X" or e["ts"] < first_step_end_us:
            continue
        kind = {"forward": "F", "backward": "B", "input-grad": "I", "weight-grad": "W"}.get(e.get("cat"))
        if kind:
            spans.setdefault(kind, []).append(e["dur"] / 1e3)
    return {k: statistics.mean(v) for k, v in spans.items()}


def first_step_end(trace_path):
    doc = json.load(open(trace_path))
    ends = sorted(e["ts"] + e["dur"] for e in doc["traceEvents"]
                  if e.get("ph") == "X" and e.get("cat") == "optimizer" and e.get("pid") == 0)
    return ends[0]


print(f"pipeline bubble: {args.model}, pp {args.pp}, threads backend, {args.steps} steps per run "
      f"(the first left out), machine: {os.cpu_count()} cores")
print(f"{'schedule':10} {'m':>3} {'theory':>8} {'predicted':>10} {'measured':>9} {'meas-pred':>10} "
      f"{'F ms':>7} {'B ms':>7}")
tmp = tempfile.mkdtemp()
for sched in args.schedules.split(","):
    for m in [int(x) for x in args.m.split(",")]:
        p = args.pp
        metrics, trace = f"{tmp}/{sched}{m}.jsonl", f"{tmp}/{sched}{m}.json"
        batch = max(8, m)
        v = args.chunks if sched == "interleaved" else 1
        run([args.bin, "train", "--model", args.model, "--data", args.data, "--pp", str(p),
             "--schedule", sched, "--microbatches", str(m), "--batch", str(batch), "--steps", str(args.steps),
             "--eval-every", "0", "--eval-batches", "1", "--quiet", "--metrics", metrics, "--trace", trace]
            + (["--chunks", str(v)] if v > 1 else []))
        lines = [json.loads(l) for l in open(metrics)][1:]
        measured = statistics.mean(statistics.mean(l["bubble"]) for l in lines)
        t = action_times(trace, first_step_end(trace))
        # The simulator's costs are a rank's whole share: v chunks' actions of 1/v each.
        costs = ",".join(f"{k}={v * t[k]:.4f}" for k in ("F", "B", "I", "W") if k in t)
        if "I" in t and "B" not in t:
            costs += ",B=" + f"{v * (t['I'] + t['W']):.4f}"
        out = run([args.bin, "schedule", "--pp", str(p), "--microbatches", str(m),
                   "--schedule", "zb-h1" if sched == "zb" else sched, "--costs", costs]
                  + (["--chunks", str(v)] if v > 1 else []))
        predicted = float(re.search(r"bubble fraction ([0-9.]+)", out).group(1))
        theory = (p - 1) / (v * m + p - 1)  # GPipe, 1F1B; interleaved with v chunks
        if sched in ("zb", "zb-h1"):  # the paper's unit costs F = I = W = 1
            unit = run([args.bin, "schedule", "--pp", str(p), "--microbatches", str(m),
                        "--schedule", "zb-h1", "--costs", "F=1,B=2,I=1,W=1"])
            theory = float(re.search(r"bubble fraction ([0-9.]+)", unit).group(1))
        print(f"{sched:10} {m:>3} {theory:8.3f} {predicted:10.3f} {measured:9.3f} "
              f"{100 * (measured - predicted):+9.1f}p {t.get('F', 0):7.2f} {t.get('B', t.get('I', 0)):7.2f}")
        sys.stdout.flush()
