#!/usr/bin/env python3
"""Pipeline bubble, measured against theory and against the simulator.

For each schedule and micro-batch count it trains gpt-small at --pp 2 (threads, one kernel
thread per rank: one core each on a 2-core machine) with --trace, and prints per run (steps
after the first; each figure the mean over ranks, then over steps):
  theory     (p-1)/(v m+p-1) for GPipe, 1F1B and interleaved; ZB-H1: the simulator with the
             paper's unit costs F = I = W = 1
  kind       `meshtrain schedule` with one time per kind (the run's mean F, B, I, W)
  stage      `meshtrain schedule --action-costs` with one time per (kind, stage): the run's
             uneven stages, without the spread from one micro-batch to the next
  replay     `meshtrain schedule --action-costs` with every action's own measured time, step
             by step: what the schedule gives with exactly the durations the run had, if
             communication and wake-ups cost nothing
  measured   the executor's idle share of the step ((step - compute) / step) from the metrics

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
ap.add_argument("--keep", default="", help="directory to keep the traces, metrics and action-cost files in")
args = ap.parse_args()
if args.steps < 2:
    sys.exit("--steps must be at least 2 (the first step is left out)")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


KIND = {"forward": "F", "backward": "B", "input-grad": "I", "weight-grad": "W"}
NAME = re.compile(r"^\S+(?: gradient)? (\d+) \(stage (\d+)\)$")


def step_actions(trace_path, per_rank):
    """Per step: {action text: measured ms}, from each rank's compute spans in order
    (`per_rank` compute actions per rank and step)."""
    doc = json.load(open(trace_path))
    by_rank = {}
    for e in doc["traceEvents"]:
        kind = KIND.get(e.get("cat"))
        if e.get("ph") != "X" or not kind:
            continue
        mb, stage = NAME.match(e["name"]).groups()
        by_rank.setdefault(e["pid"], []).append((e["ts"], f"{stage}{kind}{mb}", e["dur"] / 1e3))
    steps = []
    for rank, evs in sorted(by_rank.items()):
        evs.sort()
        if len(evs) % per_rank:
            sys.exit(f"{trace_path}: rank {rank} has {len(evs)} compute spans, not a multiple of {per_rank}")
        for i in range(len(evs) // per_rank):
            if len(steps) <= i:
                steps.append({})
            steps[i].update({a: d for _, a, d in evs[i * per_rank:(i + 1) * per_rank]})
    return steps


def simulate(shape_args, times, path):
    with open(path, "w") as f:
        f.writelines(f"{a} {d:.4f}\n" for a, d in sorted(times.items()))
    out = run([args.bin, "schedule"] + shape_args + ["--action-costs", path])
    return float(re.search(r"bubble fraction ([0-9.]+)", out).group(1))


print(f"pipeline bubble: {args.model}, pp {args.pp}, threads backend, {args.steps} steps per run "
      f"(the first left out), machine: {os.cpu_count()} cores")
print(f"{'schedule':12} {'m':>3} {'theory':>7} {'kind':>7} {'stage':>7} {'replay':>7} {'measured':>9} "
      f"{'meas-replay':>11} {'F ms':>6} {'B/I ms':>7} {'W ms':>6}")
tmp = args.keep or tempfile.mkdtemp()
os.makedirs(tmp, exist_ok=True)
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
        split = sched in ("zb", "zb-h1")
        steps = step_actions(trace, m * v * (3 if split else 2))[1:]
        shape = ["--pp", str(p), "--microbatches", str(m), "--schedule", "zb-h1" if split else sched] + \
                (["--chunks", str(v)] if v > 1 else [])
        # replay: each step with its own action times
        replay = statistics.mean(simulate(shape, st, f"{tmp}/{sched}{m}-step{i + 1}.txt")
                                 for i, st in enumerate(steps))
        # stage: the mean per (stage, kind) given to every micro-batch
        per = {}
        for st in steps:
            for a, d in st.items():
                per.setdefault(re.sub(r"\d+$", "", a), []).append(d)
        stage_mean = {k: statistics.mean(d) for k, d in per.items()}
        stage = simulate(shape, {a: stage_mean[re.sub(r"\d+$", "", a)] for a in steps[0]}, f"{tmp}/{sched}{m}-stage.txt")
        # kind: one mean per kind
        kinds = {}
        for st in steps:
            for a, d in st.items():
                kinds.setdefault(re.search(r"[FBIW]", a).group(0), []).append(d)
        t = {k: statistics.mean(d) for k, d in kinds.items()}
        kind = simulate(shape, {a: t[re.search(r"[FBIW]", a).group(0)] for a in steps[0]}, f"{tmp}/{sched}{m}-kind.txt")
        theory = (p - 1) / (v * m + p - 1)  # GPipe, 1F1B; interleaved with v chunks
        if split:  # the paper's unit costs F = I = W = 1
            unit = run([args.bin, "schedule", "--pp", str(p), "--microbatches", str(m),
                        "--schedule", "zb-h1", "--costs", "F=1,B=2,I=1,W=1"])
            theory = float(re.search(r"bubble fraction ([0-9.]+)", unit).group(1))
        label = sched if v == 1 else f"{sched} v{v}"
        print(f"{label:12} {m:>3} {theory:7.3f} {kind:7.3f} {stage:7.3f} {replay:7.3f} {measured:9.3f} "
              f"{100 * (measured - replay):+10.1f}p {t.get('F', 0):6.1f} {t.get('B', t.get('I', 0)):7.1f} "
              f"{t.get('W', 0):6.1f}")
        sys.stdout.flush()
