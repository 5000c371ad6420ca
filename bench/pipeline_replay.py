#!/usr/bin/env python3
"""Pipeline bubble at p = 4 and 8 on a 2-core machine: the simulator replaying measured
per-block action times, checked against real p = 2 runs.

More pipeline ranks than cores would time the operating system's scheduler, not the schedule.
So instead:
  1. One run at --pp 2 with interleaved 1F1B and one block per chunk (gpt-small's shapes with 8
     blocks, bench/configs/gpt-small-8l.json; --chunks 4 gives 8 stages of one block) measures,
     step by step, the forward and backward time of every block for every micro-batch
     (the embedding counts with block 0, the head and loss with block 7).
  2. A pipeline of p stages of 8/p blocks each is given, for each step, the sum of its blocks'
     measured times per micro-batch, and `meshtrain schedule --action-costs` replays GPipe and
     1F1B with those times (communication free).
  3. Check: at p = 2 the same composition is compared with real --pp 2 GPipe and 1F1B runs of
     the same model and micro-batches (their metrics' measured bubble).

Usage (from the repository root, after scripts/build.sh):
  python3 bench/pipeline_replay.py [--steps 5] [--m 2,4,8,16]
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
ap.add_argument("--config", default="bench/configs/gpt-small-8l.json")
ap.add_argument("--blocks", type=int, default=8, help="blocks of --model")
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--m", default="2,4,8,16")
ap.add_argument("--p", default="2,4,8")
ap.add_argument("--keep", default="", help="directory to keep the traces, metrics and action-cost files in")
args = ap.parse_args()
if args.steps < 2:
    sys.exit("--steps must be at least 2 (the first step is left out)")

KIND = {"forward": "F", "backward": "B"}
NAME = re.compile(r"^\S+ (\d+) \(stage (\d+)\)$")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def train(tag, m, sched, extra):
    metrics, trace = f"{tmp}/{tag}.jsonl", f"{tmp}/{tag}.json"
    run([args.bin, "train", "--config", args.config, "--data", args.data, "--pp", "2", "--schedule", sched,
         "--microbatches", str(m), "--batch", str(max(8, m)), "--steps", str(args.steps), "--eval-every", "0",
         "--eval-batches", "1", "--quiet", "--metrics", metrics, "--trace", trace] + extra)
    return metrics, trace


def block_times(trace_path, per_rank):
    """Per step (after the first): {(kind, block, mb): ms}."""
    by_rank = {}
    for e in json.load(open(trace_path))["traceEvents"]:
        kind = KIND.get(e.get("cat"))
        if e.get("ph") != "X" or not kind:
            continue
        mb, stage = NAME.match(e["name"]).groups()
        by_rank.setdefault(e["pid"], []).append((e["ts"], (kind, int(stage), int(mb)), e["dur"] / 1e3))
    steps = []
    for rank, evs in sorted(by_rank.items()):
        evs.sort()
        for i in range(len(evs) // per_rank):
            if len(steps) <= i:
                steps.append({})
            steps[i].update({k: d for _, k, d in evs[i * per_rank:(i + 1) * per_rank]})
    return steps[1:]


def replay(p, m, sched, steps, tag):
    per = args.blocks // p
    out = []
    for i, st in enumerate(steps):
        path = f"{tmp}/{tag}-p{p}-{sched}-step{i + 1}.txt"
        with open(path, "w") as f:
            for s in range(p):
                for mb in range(m):
                    for k in ("F", "B"):
                        f.write(f"{s}{k}{mb} {sum(st[(k, b, mb)] for b in range(s * per, (s + 1) * per)):.4f}\n")
        o = run([args.bin, "schedule", "--pp", str(p), "--microbatches", str(m), "--schedule", sched,
                 "--action-costs", path])
        out.append(float(re.search(r"bubble fraction ([0-9.]+)", o).group(1)))
    return statistics.mean(out)


def measured(metrics):
    lines = [json.loads(l) for l in open(metrics)][1:]
    return statistics.mean(statistics.mean(l["bubble"]) for l in lines)


tmp = args.keep or tempfile.mkdtemp()
os.makedirs(tmp, exist_ok=True)
print(f"pipeline replay: {args.config} ({args.blocks} blocks), per-block times from --pp 2 interleaved "
      f"--chunks {args.blocks // 2}, {args.steps} steps per run (the first left out), machine: {os.cpu_count()} cores")
print(f"{'schedule':9} {'p':>2} {'m':>3} {'theory':>7} {'replay':>7} {'measured (p=2)':>15} {'meas-replay':>11}")
for m in [int(x) for x in args.m.split(",")]:
    _, trace = train(f"blocks{m}", m, "interleaved", ["--chunks", str(args.blocks // 2)])
    steps = block_times(trace, m * (args.blocks // 2) * 2)
    for sched in ("gpipe", "1f1b"):
        meas = measured(train(f"{sched}{m}", m, sched, [])[0]) if "2" in args.p.split(",") else None
        for p in [int(x) for x in args.p.split(",")]:
            r = replay(p, m, sched, steps, f"m{m}")
            theory = (p - 1) / (m + p - 1)
            tail = f"{meas:15.3f} {100 * (meas - r):+10.1f}p" if p == 2 and meas is not None else f"{'':15} {'':11}"
            print(f"{sched:9} {p:>2} {m:>3} {theory:7.3f} {r:7.3f} {tail}")
            sys.stdout.flush()
