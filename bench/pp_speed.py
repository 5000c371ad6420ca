#!/usr/bin/env python3
"""Pipeline speed on this machine's 2 cores, in one run: meshtrain --pp 2 (1F1B and GPipe, one
kernel thread per stage) against PyTorch 1.13's GPipe (torch.distributed.pipeline.sync.Pipe,
bench/torch_pipe.py, 2 intra-op threads) on the same model, batch and micro-batch count, and
against meshtrain's own single rank at 2 threads with the same micro-batches.

Per rep the four runs go one after another (order reversed on even reps); tokens/s = B*T / the
median step time of the steps after the first two; the ratios are taken within each rep and
their median is reported, since this machine's speed drifts between runs.

  python3 bench/pp_speed.py [--reps 3] [--steps 8] [--model gpt-small] [--microbatches 8]
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
ap.add_argument("--data", default="data/corpus.txt")
ap.add_argument("--model", default="gpt-small")
ap.add_argument("--microbatches", type=int, default=8)
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--reps", type=int, default=3)
args = ap.parse_args()
if args.steps < 4 or args.reps < 1 or args.microbatches < 1:
    sys.exit("pp_speed.py: --steps must be at least 4, --reps and --microbatches at least 1")
WARMUP = 2
tmp = tempfile.mkdtemp()
here = os.path.dirname(os.path.abspath(__file__))


def meshtrain(name, extra):
    metrics = f"{tmp}/{name}.jsonl"
    cmd = [args.bin, "train", "--model", args.model, "--data", args.data, "--steps", str(args.steps),
           "--microbatches", str(args.microbatches), "--eval-every", "0", "--eval-batches", "1", "--quiet",
           "--metrics", metrics] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    ms = [json.loads(l)["step_ms"] for l in open(metrics)][WARMUP:]
    lines = [json.loads(l) for l in open(metrics)]
    return lines[0], statistics.median(ms)


def torch_pipe():
    cmd = ["/usr/bin/python3", f"{here}/torch_pipe.py", "--model", args.model, "--microbatches",
           str(args.microbatches), "--steps", str(args.steps - WARMUP), "--warmup", str(WARMUP),
           "--intra-threads", "2", "--data", args.data, "--json", "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    out = json.loads([l for l in r.stdout.splitlines() if l.startswith("{")][-1])
    return out["step_ms"]["median"]


runs = {
    "mt_pp2_1f1b": lambda: meshtrain("pp1f1b", ["--pp", "2", "--schedule", "1f1b"]),
    "mt_pp2_gpipe": lambda: meshtrain("ppgpipe", ["--pp", "2", "--schedule", "gpipe"]),
    "mt_single_2t": lambda: meshtrain("single", ["--threads", "2"]),
    "torch_pipe": lambda: (None, torch_pipe()),
}
rows = []
print(f"pipeline speed: {args.model}, {args.microbatches} micro-batches, {args.steps} steps per run "
      f"({WARMUP} untimed), {os.cpu_count()} cores")
print(f"{'rep':>3} {'pp2 1f1b':>10} {'pp2 gpipe':>10} {'single 2t':>10} {'torch Pipe':>11}   tokens/s;  "
      f"1f1b/Pipe gpipe/Pipe 1f1b/single")
for rep in range(args.reps):
    order = list(runs) if rep % 2 == 0 else list(reversed(list(runs)))
    ms = {}
    for name in order:
        line, step_ms = runs[name]()
        ms[name] = step_ms
    # tokens per step: the same batch for all four (the model's benchmark batch and context)
    cfg_tokens = {"gpt-tiny": 12 * 64, "gpt-small": 8 * 256, "gpt2-124m": 4 * 64}[args.model]
    tps = {k: cfg_tokens / (v / 1e3) for k, v in ms.items()}
    r = (tps["mt_pp2_1f1b"] / tps["torch_pipe"], tps["mt_pp2_gpipe"] / tps["torch_pipe"],
         tps["mt_pp2_1f1b"] / tps["mt_single_2t"])
    rows.append(r)
    print(f"{rep + 1:>3} {tps['mt_pp2_1f1b']:10.0f} {tps['mt_pp2_gpipe']:10.0f} {tps['mt_single_2t']:10.0f} "
          f"{tps['torch_pipe']:11.0f}   {r[0]:10.2f} {r[1]:10.2f} {r[2]:11.2f}", flush=True)
med = [statistics.median(c) for c in zip(*rows)]
print(f"median ratios: meshtrain pp2 1f1b / torch Pipe {med[0]:.2f}, pp2 gpipe / torch Pipe {med[1]:.2f}, "
      f"pp2 1f1b / meshtrain single rank at 2 threads {med[2]:.2f}")
