#!/usr/bin/env python3
"""Pipeline schedules (the asynchronous PipeDream-2BW and PipeDream, the bidirectional Chimera)
against 1F1B on this machine, in one run: the same model, pipeline depth and micro-batches, --schedule 1f1b and each of --schedules
one after the other (order rotated from rep to rep). Per run: the median step time of the steps
after the first WARMUP; each ratio (1F1B's step time over the schedule's: the throughput gain)
is taken within a rep and the median over the reps reported. The loss of each at a few steps
shows what the staleness costs; the bubble (the executor's idle share of each rank's step, mean
over ranks, median over the steps) what the schedule leaves idle.

  python3 bench/pipedream_speed.py [--reps 3] [--steps 40] [--pp 2] [--microbatches 4]
                                   [--schedules pipedream-2bw,pipedream]
                                   [--models gpt-tiny,resnet-small] [--data FILE] [--images DIR]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default="build/meshtrain")
ap.add_argument("--data", default="data/corpus.txt", help="text for the transformers")
ap.add_argument("--images", default="/usr/share/datasets/fashion-mnist", help="Fashion-MNIST for the CNNs")
ap.add_argument("--models", default="gpt-tiny,resnet-small")
ap.add_argument("--pp", type=int, default=2)
ap.add_argument("--microbatches", type=int, default=4)
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--schedules", default="pipedream-2bw", help="compared with 1f1b, comma-separated")
args = ap.parse_args()
if args.steps < 8 or args.reps < 1 or args.pp < 2 or args.microbatches < args.pp:
    sys.exit("pipedream_speed.py: --steps at least 8, --reps at least 1, --pp at least 2, --microbatches at least --pp")
WARMUP = 3
tmp = tempfile.mkdtemp()
CNNS = ("cnn-small", "resnet-small", "inception-small")


def run(model, schedule):
    metrics = f"{tmp}/{model}-{schedule}.jsonl"
    data = args.images if model in CNNS else args.data
    batch = 64 if model in CNNS else 16
    cmd = [args.bin, "train", "--model", model, "--data", data, "--steps", str(args.steps), "--batch", str(batch),
           "--pp", str(args.pp), "--microbatches", str(args.microbatches), "--schedule", schedule,
           "--eval-every", "0", "--eval-batches", "1", "--quiet", "--overwrite", "--metrics", metrics]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    lines = [json.loads(l) for l in open(metrics) if '"step_ms"' in l]
    bubble = statistics.median(statistics.mean(l["bubble"]) for l in lines[WARMUP:])
    bubbles.setdefault((model, schedule), []).append(bubble)
    return statistics.median(l["step_ms"] for l in lines[WARMUP:]), [l["loss"] for l in lines]


print(f"# pp {args.pp}, {args.microbatches} micro-batches, {args.steps} steps, {args.reps} reps; "
      f"cpu: {os.cpu_count()} cores")
SCHEDULES = ["1f1b"] + args.schedules.split(",")
bubbles = {}
for model in args.models.split(","):
    ratios = {s: [] for s in SCHEDULES[1:]}
    ms = {s: [] for s in SCHEDULES}
    losses = {}
    for rep in range(args.reps):
        order = SCHEDULES[rep % len(SCHEDULES):] + SCHEDULES[:rep % len(SCHEDULES)]
        got = {}
        for s in order:
            got[s], losses[s] = run(model, s)
            ms[s].append(got[s])
        for s in SCHEDULES[1:]:
            ratios[s].append(got["1f1b"] / got[s])
        print(f"{model} rep {rep}: " + ", ".join(f"{s} {got[s]:.2f} ms" for s in SCHEDULES) + "; ratios " +
              ", ".join(f"{s} {ratios[s][-1]:.3f}" for s in SCHEDULES[1:]), flush=True)
    for s in SCHEDULES[1:]:
        print(f"{model}: step ms median 1f1b {statistics.median(ms['1f1b']):.2f}, {s} "
              f"{statistics.median(ms[s]):.2f}; throughput {s} / 1F1B median {statistics.median(ratios[s]):.3f} "
              f"(reps {', '.join(f'{r:.3f}' for r in ratios[s])})")
    print(f"{model} bubble (median over reps): " +
          ", ".join(f"{s} {statistics.median(bubbles[(model, s)]):.3f}" for s in SCHEDULES))
    at = sorted(s for s in {0, 1, 2, 5, 10, args.steps // 2, args.steps - 1} if s < args.steps)
    print(f"{model} loss by step    " + " ".join(f"{s:>7d}" for s in at))
    for s in SCHEDULES:
        print(f"{model} {s:<15s} " + " ".join(f"{losses[s][i]:7.4f}" for i in at))
