#!/usr/bin/env python3
"""Images/s of the CNN layouts at 2 ranks against one rank, in one run, with the communication
share each run's trace shows (docs/benchmarks.md, "CNN layouts").

  python3 bench/cnn_layouts.py [--models cnn-small,resnet-small,inception-small] [--batch 128]
                               [--steps 10] [--reps 1] [--layouts "dp 2;tp 2;spatial 2"] [--scale K]

--scale K trains the models on the images upsampled K times each way (a config file with
"scale": K; 4 gives 112 x 112), where splitting feature maps pays. A layout of more ranks than
the machine's cores runs them oversubscribed (1 kernel thread each), which the table says.

Every run trains the same global batch on Fashion-MNIST (the set-up installs it) with SGD. One
rank runs with 2 kernel threads (the machine's 2 cores), each rank of a 2-rank layout with 1.
Images/s = batch / median step time of the steps after the first two; per layout the best rep
counts. "speed" = images/s of the layout / images/s of one rank. The communication share is rank
0's intra-layer (tp) collectives over its compute-track time (the run's --trace line); for dp,
the dp collectives' time and the part hidden behind backward. Layouts a model does not take
(branches on a model without Inception blocks) are skipped with the reason.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESHTRAIN = os.environ.get("MESHTRAIN", os.path.join(ROOT, "build", "meshtrain"))
DATA = "/usr/share/datasets/fashion-mnist"


def run(model, layout, batch, steps, tmp, scale=1):
    flags = layout.split()
    ranks = 1
    for i in range(0, len(flags), 2):
        ranks *= int(flags[i + 1])
    metrics = os.path.join(tmp, "m.jsonl")
    trace = os.path.join(tmp, "t.json")
    for f in (metrics, trace, trace[:-5] + ".svg"):
        if os.path.exists(f):
            os.remove(f)
    which = ["--model", model]
    if scale > 1:
        config = os.path.join(tmp, f"{model}-x{scale}.json")
        with open(config, "w") as f:
            json.dump({"family": "cnn", "name": model, "scale": scale}, f)
        which = ["--config", config]
    cmd = [MESHTRAIN, "train", *which, "--data", DATA, "--batch", str(batch), "--steps", str(steps),
           "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.02", "--warmup", "1", "--eval-every", "0",
           "--threads", "2" if ranks == 1 else "1", "--metrics", metrics, "--trace", trace, "--log-every", "0"]
    cmd += ["--" + f if i % 2 == 0 else f for i, f in enumerate(flags)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode == 2:
        return None, p.stderr.strip().splitlines()[-1]
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    ms = [json.loads(l)["step_ms"] for l in open(metrics)][2:]
    ips = batch / (statistics.median(ms) / 1e3)
    share = ""
    m = re.search(r"tp communication ([\d.]+) ms = (\d+)% of its", p.stdout)
    if m:
        share = f"intra-layer collectives {m.group(2)}% of rank 0's compute time"
    m = re.search(r"dp communication ([\d.]+) ms, (\d+)% of it hidden", p.stdout)
    if m:
        share = f"dp collectives {m.group(1)} ms, {m.group(2)}% hidden behind backward"
    return ips, share


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="cnn-small,resnet-small,inception-small")
    ap.add_argument("--layouts", default="dp 2;tp 2;spatial 2;branch-parallel 2")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--scale", type=int, default=1)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        sys.exit(f"no Fashion-MNIST at {DATA}: run scripts/setup.sh")
    cpu = "unknown CPU"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    side = 28 * a.scale
    print(f"{cpu}, {os.cpu_count()} cores; images {side} x {side}; batch {a.batch}, {a.steps} steps "
          f"(median of steps 3..), best of {a.reps}")
    print("| model | layout | images/s | speed vs one rank | communication |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models.split(","):
            layouts = ["dp 1"] + a.layouts.split(";")
            best = {}
            notes = {}
            for rep in range(a.reps):
                for layout in layouts:
                    ips, share = run(model, layout, a.batch, a.steps, tmp, a.scale)
                    if ips is None:
                        notes[layout] = share
                        continue
                    if ips > best.get(layout, (0, ""))[0]:
                        best[layout] = (ips, share)
            base = best["dp 1"][0]
            for layout in layouts:
                name = "one rank, 2 threads" if layout == "dp 1" else layout.replace("branch-parallel", "branch")
                ranks = 1
                for i in range(1, len(layout.split()), 2):
                    ranks *= int(layout.split()[i])
                if ranks > (os.cpu_count() or 1):
                    name += f" ({ranks} ranks on {os.cpu_count()} cores)"
                if layout in notes:
                    print(f"| {model} | {name} | - | - | refused: {notes[layout]} |")
                    continue
                ips, share = best[layout]
                print(f"| {model} | {name} | {ips:.0f} | {ips / base:.2f}x | {share} |")


if __name__ == "__main__":
    main()
