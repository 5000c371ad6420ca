#!/usr/bin/env python3
"""Soak: a long training run, watched from outside.

Runs `meshtrain train` with the given options (threads backend: one process) and samples the
process every --every seconds: resident memory (VmRSS), open file descriptors and threads, from
/proc. Prints the first sample after the warm-up and the last, and steps/s over the first and
the last --window steps (from the metrics file's step_ms). Exit 1 when resident memory grew by
more than --rss-growth (default 5%) after the warm-up, or the open files or threads grew.

Usage (from the repository root, after scripts/build.sh):
  python3 bench/soak.py --steps 10000 -- --model gpt-tiny --dp 2 --tp 2
  python3 bench/soak.py --steps 2000 -- --model gpt-tiny --pp 2 --dp 2 --zero 3 --microbatches 2
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default="build/meshtrain")
ap.add_argument("--data", default="data/corpus.txt")
ap.add_argument("--steps", type=int, default=10000)
ap.add_argument("--warmup-steps", type=int, default=200, help="steps before the first counted sample")
ap.add_argument("--window", type=int, default=200, help="steps of the first and last steps/s figure")
ap.add_argument("--every", type=float, default=2.0, help="seconds between samples")
ap.add_argument("--rss-growth", type=float, default=0.05)
ap.add_argument("--print-every", type=int, default=30, help="print every Nth sample")
ap.add_argument("train_args", nargs="*", help="options of meshtrain train (after --)")
args = ap.parse_args()
if args.steps <= args.warmup_steps + args.window:
    sys.exit("--steps must exceed --warmup-steps + --window")

tmp = tempfile.mkdtemp()
metrics = os.path.join(tmp, "metrics.jsonl")
cmd = [args.bin, "train", "--data", args.data, "--steps", str(args.steps), "--eval-every", "0",
       "--eval-batches", "1", "--quiet", "--metrics", metrics] + args.train_args
proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def steps_done():
    try:
        with open(metrics) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def sample(pid):
    status = open(f"/proc/{pid}/status").read()
    rss = next(int(l.split()[1]) for l in status.splitlines() if l.startswith("VmRSS:"))  # kB
    return {"step": steps_done(), "rss_mb": rss / 1024, "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": len(os.listdir(f"/proc/{pid}/task"))}


samples = []
t0 = time.time()
while proc.poll() is None:
    try:
        s = sample(proc.pid)
    except (FileNotFoundError, ProcessLookupError, StopIteration):
        break
    s["t"] = time.time() - t0
    samples.append(s)
    if len(samples) % args.print_every == 1:
        print(f"  {s['t']:7.0f} s  step {s['step']:6d}  rss {s['rss_mb']:7.1f} MiB  fds {s['fds']}  threads {s['threads']}",
              flush=True)
    time.sleep(args.every)
err = proc.stderr.read()
if proc.wait() != 0:
    sys.exit(f"training failed ({proc.returncode}): {' '.join(cmd)}\n{err}")

lines = [json.loads(l) for l in open(metrics)]
counted = [s for s in samples if s["step"] >= args.warmup_steps]
if len(counted) < 2:
    sys.exit("too few samples after the warm-up: lengthen the run or sample more often (--every)")
first, last = counted[0], counted[-1]
rate = lambda ls: 1000.0 / statistics.mean(l["step_ms"] for l in ls)
head = lines[args.warmup_steps:args.warmup_steps + args.window]
tail = lines[-args.window:]
print(f"soak: {' '.join(cmd[1:])}")
print(f"{'':14} {'step':>7} {'rss MiB':>9} {'open fds':>9} {'threads':>8}")
for name, s in (("first sample", first), ("last sample", last)):
    print(f"{name:14} {s['step']:7d} {s['rss_mb']:9.1f} {s['fds']:9d} {s['threads']:8d}")
growth = last["rss_mb"] / first["rss_mb"] - 1
print(f"resident memory {100 * growth:+.1f}% from step {first['step']} to {last['step']} "
      f"(largest sample after the warm-up {max(s['rss_mb'] for s in counted):.1f} MiB)")
print(f"steps/s: {rate(head):.1f} over steps {args.warmup_steps + 1}-{args.warmup_steps + args.window}, "
      f"{rate(tail):.1f} over the last {args.window} ({len(lines)} steps in {samples[-1]['t']:.0f} s)")
bad = []
if growth > args.rss_growth:
    bad.append(f"resident memory grew {100 * growth:.1f}% (more than {100 * args.rss_growth:.0f}%)")
if last["fds"] > first["fds"]:
    bad.append(f"open files grew from {first['fds']} to {last['fds']}")
if last["threads"] > first["threads"]:
    bad.append(f"threads grew from {first['threads']} to {last['threads']}")
if bad:
    sys.exit("SOAK FAILED: " + "; ".join(bad))
print("SOAK OK")
