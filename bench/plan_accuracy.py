#!/usr/bin/env python3
"""The cost model's step time and the memory model's peak tensor memory per rank, predicted
against measured, over the layouts the tests run (docs/benchmarks.md, "The planner").

  python3 bench/plan_accuracy.py [--models gpt-tiny,gpt-small] [--steps-tiny 30] [--steps-small 10]
                                 [--machine FILE] [--layouts "dp 2;tp 2;..."] [--out table.md]
  python3 bench/plan_accuracy.py --suite all [--steps-cnn 16] [--machine FILE] [--out table.md] [--reps N]

--reps N runs every layout N times, in rounds (every layout once, then again), so that a slow
or a fast minute of a shared VM falls on one run of several layouts rather than on every run of
one. The run that counts is the one with the median measured step (--keep median, as calibrate
keeps each kernel's median repetition), or the fastest (--keep fastest); the summary gives the
error both ways. The prediction is the same in every run.

--recalibrate-after, a diagnostic, makes a second machine file after the runs and reports how
far its predictions of the same layouts lie from the first file's, and their error against the
measured steps: on a shared VM whose speed drifts over minutes, a table whose two files differ
by much was measured on a machine that changed under it.

--suite all runs the mixed set (SUITE below): transformers (gpt-tiny, gpt-small), the named CNNs
(resnet-small, inception-small, cnn-small) and user-written graphs (examples/models/vgg-mini.json,
resnet-cut.json, branchy.json) at dp, tp (filters/channels), spatial (row bands), branch, pp and
mixes, a few steps each (about ten minutes on two cores; the CNNs 16 steps, so that the median of
steps 3-16 is the steady state: with 8, a data-parallel layout's slower early steps filled half
the median's window; in one run of vgg-mini.json at dp 2, steps 2-7 took 19, 15, 5.9, 15, 3.9 and
8.9 ms where the steps after the tenth took 3.3-4.2 ms, with single spikes); the CNNs train on
Fashion-MNIST (/usr/share/datasets/fashion-mnist, or $FASHION_MNIST). It reports the same table, with the mean
absolute error over all layouts, the worst layout, and the largest memory error.

The script first measures this machine (`meshtrain calibrate --rounds 6`, or --calibrate-rounds,
into a temporary machine file, unless --machine names one), then trains each model at each
layout with `meshtrain train --machine FILE`, which prints the prediction at the start and, at
the end, "predicted against measured" for the step time (the median of the steps after the first
two) and for every rank's peak tensor memory (its largest error). It prints a markdown table and
the mean absolute percentage error (MAPE) of the step time, and the largest memory error. A last
line, a diagnostic and not the target, gives the overall shift (the median of predicted /
measured over the layouts: a shared VM that runs everything slower or faster than when it was
calibrated moves every prediction alike) and the MAPE left once that shift is divided out.

Every layout runs the model's default global batch (gpt-tiny 12 x 64, gpt-small 8 x 256),
AdamW, on data/corpus.txt (the set-up's corpus). Ranks are threads of one process; each gets
cores / ranks kernel threads (at least 1), so a layout of more ranks than cores shares the cores,
which the cost model knows (machine file: cores and the measured efficiency of ranks that take
turns on them).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESHTRAIN = os.environ.get("MESHTRAIN", os.path.join(ROOT, "build", "meshtrain"))

LAYOUTS = [
    "",
    "--dp 2",
    "--dp 4",
    "--dp 2 --zero 1",
    "--dp 2 --zero 2",
    "--dp 2 --zero 3",
    "--dp 4 --zero 3",
    "--tp 2",
    "--tp 4",
    "--dp 2 --tp 2",
    "--pp 2 --microbatches 4 --schedule gpipe",
    "--pp 2 --microbatches 4 --schedule 1f1b",
    "--pp 4 --microbatches 4 --schedule gpipe",
    "--pp 4 --microbatches 4 --schedule 1f1b",
    "--dp 2 --pp 2 --microbatches 2 --schedule 1f1b",
    "--tp 2 --pp 2 --microbatches 4 --schedule 1f1b",
    "--microbatches 4",
]

# (model, layout) pairs of --suite all: every split and schedule the planner predicts.
SUITE = [
    ("gpt-tiny", ""),
    ("gpt-tiny", "--dp 2"),
    ("gpt-tiny", "--tp 2 --pp 2 --microbatches 4 --schedule 1f1b"),
    ("gpt-small", ""),
    ("gpt-small", "--tp 2"),
    ("gpt-small", "--pp 2 --microbatches 4 --schedule 1f1b"),
    ("cnn-small", ""),
    ("cnn-small", "--dp 2"),
    ("cnn-small", "--tp 2"),
    ("cnn-small", "--spatial 2"),
    ("resnet-small", ""),
    ("resnet-small", "--dp 2"),
    ("resnet-small", "--tp 2"),
    ("resnet-small", "--spatial 2"),
    ("resnet-small", "--pp 2 --microbatches 4 --schedule 1f1b"),
    ("resnet-small", "--dp 2 --pp 2 --microbatches 2 --schedule 1f1b"),
    ("inception-small", ""),
    ("inception-small", "--branch-parallel 2"),
    ("inception-small", "--tp 2"),
    ("inception-small", "--dp 2"),
    ("examples/models/vgg-mini.json", ""),
    ("examples/models/vgg-mini.json", "--dp 2"),
    ("examples/models/resnet-cut.json", ""),
    ("examples/models/resnet-cut.json", "--spatial 2"),
    ("examples/models/resnet-cut.json", "--pp 2 --microbatches 4 --schedule gpipe"),
    ("examples/models/branchy.json", "--branch-parallel 2"),
]

LINE = re.compile(r"predicted against measured: step ([\d.]+) ms vs ([\d.]+) ms .*?error ([+-][\d.]+)%"
                  r"(?: \| peak tensor memory of rank (\d+) ([\d.]+) MiB vs ([\d.]+) MiB, error ([+-][\d.]+)%)?")

# The prediction a run prints at its start (the machine file's name may hold parentheses).
PREDICTED = re.compile(r"^predicted \(cost model.*?\): step ([\d.]+) ms", re.M)


def data_file():
    for f in (os.path.join(ROOT, "data", "corpus.txt"), os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare.txt")):
        if os.path.exists(f):
            return f
    sys.exit("plan_accuracy.py: no data/corpus.txt (run scripts/setup.sh)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt-tiny,gpt-small")
    ap.add_argument("--steps-tiny", type=int, default=30)
    ap.add_argument("--steps-small", type=int, default=10)
    ap.add_argument("--machine", default="")
    ap.add_argument("--layouts", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--suite", default="gpt", choices=["gpt", "all"])
    ap.add_argument("--steps-cnn", type=int, default=16)
    ap.add_argument("--reps", type=int, default=1,
                    help="runs per layout, in rounds; --keep says which counts (the prediction is the same)")
    ap.add_argument("--calibrate-rounds", type=int, default=6,
                    help="calibrate's --rounds when the script measures the machine itself (without --machine)")
    ap.add_argument("--recalibrate-after", action="store_true",
                    help="a diagnostic: calibrate again after the runs and report that file's predictions")
    ap.add_argument("--keep", default="median", choices=["median", "fastest"],
                    help="the run of a layout that counts: the median measured step (as calibrate keeps the "
                         "median repetition) or the fastest")
    a = ap.parse_args()
    layouts = [l.strip() for l in a.layouts.split(";")] if a.layouts else LAYOUTS
    if a.suite == "all":
        runs = SUITE
    else:
        runs = [(model, layout) for model in a.models.split(",") for layout in layouts]
    data = data_file()
    images = os.environ.get("FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
    tmp = tempfile.mkdtemp(prefix="plan_accuracy_")
    if a.calibrate_rounds < 1:
        sys.exit("plan_accuracy.py: --calibrate-rounds must be at least 1")
    machine = a.machine
    if not machine:
        machine = os.path.join(tmp, "machine.json")
        print(f"measuring this machine (meshtrain calibrate --rounds {a.calibrate_rounds}) ...", file=sys.stderr,
              flush=True)
        subprocess.run([MESHTRAIN, "calibrate", "--rounds", str(a.calibrate_rounds), "--out", machine], check=True,
                       stdout=subprocess.DEVNULL)
    rows, step_errors, mem_errors = [], [], []
    # --reps: the whole list is run in rounds (every layout once per round), so that a minute in
    # which the VM runs slower falls on one run of many layouts, not on every run of one.
    runs_of, dropped = {}, set()
    def train_cmd(model, layout, steps, machine_file):
        gpt = model.startswith("gpt")
        path = os.path.join(ROOT, model) if model.startswith("examples/") else model
        return [MESHTRAIN, "train", "--model", path, "--data", data if gpt else images, "--steps", str(steps),
                "--eval-every", "0", "--eval-batches", "1", "--log-every", "0", "--machine", machine_file] + layout.split()

    for rnd in range(max(1, a.reps)):
        for idx, (model, layout) in enumerate(runs):
            if idx in dropped:
                continue
            gpt = model.startswith("gpt")
            steps = a.steps_tiny if model == "gpt-tiny" else a.steps_small if gpt else a.steps_cnn
            cmd = train_cmd(model, layout, steps, machine)
            name = f"{os.path.basename(model)} {layout or '(one rank)'}"
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                last = (p.stderr.strip() or p.stdout.strip()).splitlines()[-1:]
                print(f"{name}: skipped ({' '.join(last)})", file=sys.stderr)
                dropped.add(idx)
                continue
            rep = LINE.search(p.stdout)
            if not rep:
                print(f"{name}: no prediction line", file=sys.stderr)
                dropped.add(idx)
                continue
            runs_of.setdefault(idx, []).append(rep)
        if a.reps > 1:
            print(f"round {rnd + 1} of {a.reps} done", file=sys.stderr, flush=True)
    fastest_errors, ratios, kept = [], [], []
    for idx, (model, layout) in enumerate(runs):
        if idx not in runs_of or idx in dropped:
            continue
        reps = sorted(runs_of[idx], key=lambda r: float(r.group(2)))
        m = reps[(len(reps) - 1) // 2] if a.keep == "median" else reps[0]
        fastest_errors.append(abs(float(reps[0].group(3))))
        model = os.path.basename(model)
        name = layout or "(one rank)"
        pred, meas, err = float(m.group(1)), float(m.group(2)), float(m.group(3))
        kept.append((runs[idx], pred, meas))
        step_errors.append(abs(err))
        ratios.append(pred / meas)
        row = f"| {model} | {name} | {pred:.2f} | {meas:.2f} | {err:+.1f}% |"
        if m.group(4):
            mem_errors.append(abs(float(m.group(7))))
            row += f" {m.group(5)} | {m.group(6)} | {float(m.group(7)):+.1f}% (rank {m.group(4)}) |"
        rows.append(row)
        print(row, flush=True)
    head = ("| model | layout | predicted step ms | measured step ms | error | predicted peak MiB | "
            "measured peak MiB | error (worst rank) |\n|---|---|---|---|---|---|---|---|")
    mape = sum(step_errors) / len(step_errors) if step_errors else float("nan")
    summary = (f"\nstep time: MAPE {mape:.1f}% over {len(step_errors)} runs (largest {max(step_errors, default=0):.1f}%, "
               f"{sum(e > 20 for e in step_errors)} over 20%; each layout's {a.keep} run); "
               f"peak tensor memory: largest error {max(mem_errors, default=0):.1f}%")
    if a.reps > 1 and fastest_errors:
        summary += (f"\nthe same with each layout's fastest run: MAPE {sum(fastest_errors) / len(fastest_errors):.1f}% "
                    f"(largest {max(fastest_errors):.1f}%, {sum(e > 20 for e in fastest_errors)} over 20%)")
    if ratios:
        # A diagnostic, not the target: the machine's state at the runs against its state at the
        # calibration moves every prediction alike; what is left after dividing that out is the
        # model's own error.
        shift = statistics.median(ratios)
        rest = [abs(r / shift - 1) * 100 for r in ratios]
        summary += (f"\noverall shift (median predicted / measured): {(shift - 1) * 100:+.1f}%; with it divided out "
                    f"(diagnostic only): MAPE {sum(rest) / len(rest):.1f}%, largest {max(rest):.1f}%, "
                    f"{sum(e > 20 for e in rest)} over 20%")
    if a.recalibrate_after and kept:
        # A diagnostic: a second machine file made after the runs, and its predictions of the same
        # layouts. Far from the first file's, the machine itself changed during the table.
        after = os.path.join(tmp, "machine_after.json")
        print(f"measuring this machine again (meshtrain calibrate --rounds {a.calibrate_rounds}) ...", file=sys.stderr,
              flush=True)
        subprocess.run([MESHTRAIN, "calibrate", "--rounds", str(a.calibrate_rounds), "--out", after], check=True,
                       stdout=subprocess.DEVNULL)
        moved, errs = [], []
        for (model, layout), pred, meas in kept:
            p = subprocess.run(train_cmd(model, layout, 1, after), capture_output=True, text=True)
            got = PREDICTED.search(p.stdout)
            if not got:
                continue
            moved.append(float(got.group(1)) / pred)
            errs.append(abs(float(got.group(1)) / meas - 1) * 100)
        if errs:
            summary += (f"\na machine file made after the runs (diagnostic only): its predictions "
                        f"{(statistics.median(moved) - 1) * 100:+.1f}% from the first file's (median; "
                        f"{min(moved):.2f}-{max(moved):.2f}x); against the measured steps MAPE "
                        f"{sum(errs) / len(errs):.1f}%, largest {max(errs):.1f}%, {sum(e > 20 for e in errs)} over 20%")
    try:
        load = open("/proc/loadavg").read().split()[:3]
        summary += f"\nload average at the end: {' '.join(load)}"
    except OSError:
        pass
    text = head + "\n" + "\n".join(rows) + "\n" + summary + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
