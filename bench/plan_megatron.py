#!/usr/bin/env python3
"""The planner on paper at scale, against Megatron-LM's PTD-P paper (Narayanan et al., SC'21,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"): for each
row, the paper's layout predicted by the cost model (`meshtrain plan --layout`), the planner's
own best layout (`meshtrain plan`), and the throughput per GPU the paper reports
(docs/benchmarks.md, "The planner").

  python3 bench/plan_megatron.py [--cluster examples/clusters/a100-3072.json]

Throughput per GPU is counted as the paper counts it (its equation 3, activation recomputation
included): F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h)) per step, over the step time and the
GPUs. All models: vocabulary 51,200, sequence 2,048 (examples/models/megatron-*.json). The
paper's layouts use micro-batches of one sample and activation recomputation; its
pipeline schedule here is 1F1B (the paper's interleaved schedule needs the blocks to divide
into pp x chunks, which 1F1B does not).
"""
import argparse
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESHTRAIN = os.environ.get("MESHTRAIN", os.path.join(ROOT, "build", "meshtrain"))
MODELS = os.path.join(ROOT, "examples", "models")

# (what, config, layers, hidden, batch, GPUs, (dp, tp, pp), reported TFLOP/s per GPU)
ROWS = [
    ("175B, PTD-P (Table 2)", "megatron-175b", 96, 12288, 1536, 384, (4, 8, 12), 153),
    ("175B, PTD-P (Table 2)", "megatron-175b", 96, 12288, 1536, 768, (8, 8, 12), 149),
    ("175B, PTD-P (Table 2)", "megatron-175b", 96, 12288, 1536, 1536, (16, 8, 12), 141),
    ("175B, ZeRO-3 (Table 2)", "megatron-175b", 96, 12288, 1536, 384, (384, 1, 1), 144),
    ("175B, ZeRO-3 (Table 2)", "megatron-175b", 96, 12288, 1536, 768, (768, 1, 1), 88),
    ("175B, ZeRO-3 (Table 2)", "megatron-175b", 96, 12288, 1536, 1536, (1536, 1, 1), 44),
    ("39.1B (Table 1)", "megatron-39b", 48, 8192, 1536, 512, (32, 8, 2), 138),
    ("145.6B (Table 1)", "megatron-146b", 80, 12288, 2304, 1536, (24, 8, 8), 148),
    ("1T (Table 1)", "megatron-1t", 128, 25600, 3072, 3072, (6, 8, 64), 163),
    ("GPT-3 175B as 6 x 8 x 64 (the seeds' example)", "megatron-175b", 96, 12288, 3072, 3072, (6, 8, 64), None),
]
V, S = 51200, 2048
STEP = re.compile(r"^(dp=\S+ .*?)\s+([\d.]+) (ms|s)\s+\S+\s+([\d.]+)%\s+([\d.]+ \S+)\s")
FIT = re.compile(r"memory: ([\d.]+ \S+) per device against ([\d.]+ \S+): (fits|does NOT fit)")


def paper_flops(B, l, h):
    return 96 * B * S * l * h * h * (1 + S / (6 * h) + V / (16 * l * h))


def run(args, stderr=True):
    p = subprocess.run([MESHTRAIN, "plan"] + args, capture_output=True, text=True)
    return p.returncode, p.stdout + (p.stderr if stderr or p.returncode else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default=os.path.join(ROOT, "examples", "clusters", "a100-3072.json"))
    a = ap.parse_args()
    print("| row | GPUs | paper's layout (dp x tp x pp) | predicted step | predicted TFLOP/s/GPU | reported | "
          "difference | memory (meshtrain) | plan's best layout | its predicted TFLOP/s/GPU |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for what, cfg, l, h, B, n, (dp, tp, pp), reported in ROWS:
        per_dp = B // dp
        zero = " zero=3" if tp == 1 and pp == 1 else ""
        sched = " 1f1b" if pp > 1 else ""
        layout = f"dp={dp} tp={tp} pp={pp} m={per_dp}{sched}{zero} recompute"
        common = ["--config", os.path.join(MODELS, cfg + ".json"), "--cluster", a.cluster, "--global-batch", str(B),
                  "--devices", str(n)]
        code, out = run(common + ["--layout", layout])
        m = next((STEP.match(line) for line in out.splitlines() if STEP.match(line)), None)
        fit = FIT.search(out)
        if code or not m:
            print(f"| {what} | {n} | {dp} x {tp} x {pp} | refused: {out.strip().splitlines()[-1]} |")
            continue
        step = float(m.group(2)) * (1e-3 if m.group(3) == "ms" else 1)
        tflops = paper_flops(B, l, h) / step / n / 1e12
        diff = f"{100 * (tflops - reported) / reported:+.0f}%" if reported else "-"
        code, best = run(common + ["--top", "1"], stderr=False)
        bm = next((STEP.match(re.sub(r"^\s+1\s+", "", line)) for line in best.splitlines()
                   if re.match(r"^\s+1\s+dp=", line)), None)
        if code or not bm:
            best_text, best_tflops = "none fits: " + best.strip().splitlines()[-1][:300], "-"
        else:
            bstep = float(bm.group(2)) * (1e-3 if bm.group(3) == "ms" else 1)
            best_text = bm.group(1).strip()
            recompute = "recompute" in best_text
            f = paper_flops(B, l, h) if recompute else paper_flops(B, l, h) * 3 / 4 + 6 * B * S * V * h / 4
            best_tflops = f"{f / bstep / n / 1e12:.0f}"
        mem = f"{fit.group(1)} of {fit.group(2)}: {fit.group(3)}" if fit else "-"
        print(f"| {what} | {n} | {dp} x {tp} x {pp} | {step:.2f} s | {tflops:.0f} | {reported or '-'} | {diff} | "
              f"{mem} | {best_text} | {best_tflops} |", flush=True)


if __name__ == "__main__":
    main()
