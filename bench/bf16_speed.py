#!/usr/bin/env python3
"""bf16 training speed in one run, side by side on this machine's 2 cores: meshtrain
--precision bf16, meshtrain fp32, PyTorch 1.13 fp32 and PyTorch 1.13 under
torch.autocast("cpu", dtype=torch.bfloat16) (bench/torch_gpt.py --autocast bf16), on the same
model, batch and sequence length:

  gpt2-124m B=4 T=64, gpt2-124m B=8 T=256, gpt-small (B=8 T=256)

Threads: meshtrain runs one rank with 2 kernel threads. PyTorch fp32 runs at its best setting on
2 cores (1 intra-op thread, OpenBLAS 2: docs/benchmarks.md, "Training speed"); under autocast the
bf16 products go to oneDNN, which uses the intra-op threads, so it runs with 2 of them (and
OpenBLAS 2 for what stays float32).

Per rep the four runs of a case go one after another (order reversed on even reps); tokens/s =
B*T / the median step time after the warm-up steps; ratios are taken within each rep and their
median reported, since this machine's speed drifts between runs. meshtrain's MFU is against
the bf16 (or float32) GEMM rate the program measures at start on the same machine, which the
bf16 run prints ("bf16 GEMM rate").

  python3 bench/bf16_speed.py [--reps 2] [--cases gpt2-124m:4:64,gpt2-124m:8:256,gpt-small:8:256]
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
ap.add_argument("--reps", type=int, default=2)
ap.add_argument("--cases", default="gpt2-124m:4:64,gpt2-124m:8:256,gpt-small:8:256",
                help="MODEL:B:T,... (steps per case: see STEPS)")
args = ap.parse_args()
if args.reps < 1:
    sys.exit("bf16_speed.py: --reps must be at least 1")
if not os.path.isfile(args.data):
    print(f"bf16_speed.py: --data {args.data}: no such file (run scripts/setup.sh)", file=sys.stderr)
    sys.exit(2)
CASES = []
for c in args.cases.split(","):
    m = re.fullmatch(r"([\w-]+):(\d+):(\d+)", c)
    if not m:
        print(f"bf16_speed.py: case '{c}' is not MODEL:B:T", file=sys.stderr)
        sys.exit(2)
    CASES.append((m.group(1), int(m.group(2)), int(m.group(3))))
# (warm-up, timed) steps by tokens per step: the big cases take seconds per step.
def steps_for(B, T):
    return (2, 6) if B * T <= 512 else (1, 4)

tmp = tempfile.mkdtemp()
here = os.path.dirname(os.path.abspath(__file__))


def meshtrain(model, B, T, precision):
    warm, timed = steps_for(B, T)
    metrics = f"{tmp}/{model}-{B}-{T}-{precision}.jsonl"
    cmd = [args.bin, "train", "--model", model, "--batch", str(B), "--seq", str(T), "--data", args.data,
           "--steps", str(warm + timed), "--threads", "2", "--precision", precision, "--eval-every", "0",
           "--eval-batches", "1", "--log-every", "0", "--metrics", metrics]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stdout[-1000:]}{r.stderr[-2000:]}")
    lines = [json.loads(l) for l in open(metrics)][warm:]
    rate = re.search(r"bf16 GEMM rate ([\d.]+) GFLOP/s", r.stdout)
    rss = re.search(r"peak RSS (\d+) MiB, ([\d.]+)x the predicted (\d+) MiB", r.stdout)
    return {"tokens_per_s": B * T / (statistics.median(l["step_ms"] for l in lines) / 1e3),
            "mfu": statistics.median(l["mfu"] for l in lines),
            "bf16_gemm_gflops": float(rate.group(1)) if rate else None,
            "loss_last": lines[-1]["loss"],
            "peak_rss_mib": int(rss.group(1)) if rss else None, "analytic_mib": int(rss.group(3)) if rss else None}


def torch(model, B, T, autocast):
    warm, timed = steps_for(B, T)
    cmd = ["/usr/bin/python3", f"{here}/torch_gpt.py", "--model", model, "--batch", str(B), "--seq", str(T),
           "--steps", str(timed), "--warmup", str(warm), "--intra-threads", "2" if autocast else "1",
           "--blas-threads", "2", "--autocast", "bf16" if autocast else "none", "--data", args.data,
           "--json", "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    out = json.loads([l for l in r.stdout.splitlines() if l.startswith("{")][-1])
    return {"tokens_per_s": out["tokens_per_s"], "loss_last": out["loss"]["last"]}


NAMES = ["meshtrain bf16", "meshtrain fp32", "torch fp32", "torch bf16 autocast"]
RUN = {
    "meshtrain bf16": lambda m, B, T: meshtrain(m, B, T, "bf16"),
    "meshtrain fp32": lambda m, B, T: meshtrain(m, B, T, "fp32"),
    "torch fp32": lambda m, B, T: torch(m, B, T, False),
    "torch bf16 autocast": lambda m, B, T: torch(m, B, T, True),
}
with open("/proc/loadavg") as f:
    load = f.read().split()[0]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"== bf16 speed: {cpu}, {os.cpu_count()} cores, 1-min load {load}, {args.reps} rep(s)", flush=True)
results = []
for model, B, T in CASES:
    reps = []
    for rep in range(args.reps):
        order = NAMES if rep % 2 == 0 else list(reversed(NAMES))
        got = {}
        for name in order:
            got[name] = RUN[name](model, B, T)
            print(f"   {model} B={B} T={T} rep {rep + 1}: {name:20s} {got[name]['tokens_per_s']:9.1f} tok/s", flush=True)
        reps.append(got)
    mean = {n: statistics.fmean(r[n]["tokens_per_s"] for r in reps) for n in NAMES}
    ratio = lambda a, b: statistics.median(r[a]["tokens_per_s"] / r[b]["tokens_per_s"] for r in reps)
    row = {"model": model, "batch": B, "seq": T, "tokens_per_s": mean,
           "bf16_over_torch_fp32": ratio("meshtrain bf16", "torch fp32"),
           "bf16_over_torch_autocast": ratio("meshtrain bf16", "torch bf16 autocast"),
           "bf16_over_meshtrain_fp32": ratio("meshtrain bf16", "meshtrain fp32"),
           "fp32_over_torch_fp32": ratio("meshtrain fp32", "torch fp32"),
           "mfu_bf16": statistics.fmean(r["meshtrain bf16"]["mfu"] for r in reps),
           "mfu_fp32": statistics.fmean(r["meshtrain fp32"]["mfu"] for r in reps),
           "bf16_gemm_gflops": reps[0]["meshtrain bf16"]["bf16_gemm_gflops"],
           "bf16_peak_rss_mib": reps[0]["meshtrain bf16"]["peak_rss_mib"],
           "bf16_analytic_mib": reps[0]["meshtrain bf16"]["analytic_mib"]}
    results.append(row)
    print(json.dumps(row), flush=True)

print()
print("| model | B x T | meshtrain bf16 | meshtrain fp32 | PyTorch fp32 | PyTorch bf16 autocast | "
      "bf16 / PyTorch fp32 | bf16 / autocast | bf16 / fp32 | MFU bf16 (fp32) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in results:
    t = r["tokens_per_s"]
    print(f"| {r['model']} | {r['batch']} x {r['seq']} | {t['meshtrain bf16']:.0f} | {t['meshtrain fp32']:.0f} | "
          f"{t['torch fp32']:.0f} | {t['torch bf16 autocast']:.0f} | {r['bf16_over_torch_fp32']:.2f}x | "
          f"{r['bf16_over_torch_autocast']:.2f}x | {r['bf16_over_meshtrain_fp32']:.2f}x | "
          f"{100 * r['mfu_bf16']:.0f}% ({100 * r['mfu_fp32']:.0f}%) |")
for r in results:
    if r["bf16_peak_rss_mib"]:
        print(f"{r['model']} B={r['batch']} T={r['seq']} bf16: peak RSS {r['bf16_peak_rss_mib']} MiB against the "
              f"analytic {r['bf16_analytic_mib']} MiB ({r['bf16_peak_rss_mib'] / r['bf16_analytic_mib']:.2f}x)")
rate = results[0]["bf16_gemm_gflops"] if results else None
if rate:
    print(f"\nbf16 GEMM rate measured by meshtrain at start: {rate:.1f} GFLOP/s per thread (1024^3, 1 thread)")
