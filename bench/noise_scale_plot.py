#!/usr/bin/env python3
"""The gradient noise scale and the loss against the step, one column per run, as an SVG.

Reads metrics files of `meshtrain train --dp 2 (or more) --metrics FILE.jsonl` (the fields
`step`, `loss`, `grad_noise_scale`; train/noise_scale.h) and draws, for each run, the noise
scale on a log axis above the loss on a linear one, sharing the step axis. Needs only the
standard library (matplotlib is not installed on the project's machines): the SVG is written
by hand, polylines with axes, ticks and labels.

Usage (from the repository root):
  /usr/bin/python3 bench/noise_scale_plot.py --out docs/img/noise_scale.svg \
      "gpt-tiny, --dp 2=gpt.jsonl" "resnet-small, --dp 2=resnet.jsonl"
Each run is TITLE=FILE. Prints per run the first and last noise scale and loss it drew.
"""
import argparse
import json
import math
import sys

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("runs", nargs="+", help="TITLE=METRICS.jsonl")
ap.add_argument("--out", required=True, help="the SVG to write")
ap.add_argument("--caption", default="", help="a line under the plots (machine, date, commands)")
args = ap.parse_args()

W_PANEL, H_NOISE, H_LOSS = 420, 220, 160
LEFT, RIGHT, TOP, GAP, BOTTOM = 70, 20, 50, 50, 60
COLOURS = {"noise": "#1f77b4", "loss": "#d62728"}


def read(path):
    steps, loss, noise = [], [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                j = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            if "step" not in j or "loss" not in j:
                continue
            steps.append(j["step"])
            loss.append(j["loss"])
            noise.append(j.get("grad_noise_scale"))
    if not any(n is not None for n in noise):
        sys.exit(f"{path} has no grad_noise_scale: give the metrics of a run at --dp 2 or more")
    return steps, loss, noise


def nice_ticks(lo, hi, n=5):
    span = hi - lo if hi > lo else 1.0
    step = 10 ** math.floor(math.log10(span / n))
    for m in (1, 2, 5, 10):
        if span / (step * m) <= n:
            step *= m
            break
    t = math.ceil(lo / step) * step
    out = []
    while t <= hi + 1e-9 * span:
        out.append(round(t, 10))
        t += step
    return out


def fmt(v):
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v / 1000:g}k"
    return f"{v:g}"


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def panel(out, x0, y0, w, h, xs, ys, x_range, log, colour, ylabel, xlabel, title):
    """One plot: frame, ticks, grid, the polyline of (xs, ys) (None values break the line)."""
    xlo, xhi = x_range
    vals = [y for y in ys if y is not None and (not log or y > 0)]
    lo, hi = min(vals), max(vals)
    if log:
        lo, hi = 10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi))
        tr = lambda v: math.log10(v)
        ticks = [10 ** e for e in range(int(round(math.log10(lo))), int(round(math.log10(hi))) + 1)]
    else:
        pad = 0.05 * (hi - lo if hi > lo else 1)
        lo, hi = lo - pad, hi + pad
        tr = lambda v: v
        ticks = nice_ticks(lo, hi)
    a, b = tr(lo), tr(hi)
    X = lambda v: x0 + (v - xlo) / (xhi - xlo) * w
    Y = lambda v: y0 + h - (tr(v) - a) / (b - a) * h
    out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#444"/>')
    for t in ticks:
        if not (lo <= t <= hi):
            continue
        y = Y(t)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + w}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{fmt(t)}</text>')
    for t in nice_ticks(xlo, xhi):
        x = X(t)
        out.append(f'<line x1="{x:.1f}" y1="{y0 + h}" x2="{x:.1f}" y2="{y0 + h + 4}" stroke="#444"/>')
        out.append(f'<text x="{x:.1f}" y="{y0 + h + 16}" text-anchor="middle" font-size="11">{fmt(t)}</text>')
    segments, cur = [], []
    for x, y in zip(xs, ys):
        if y is None or (log and y <= 0):
            if cur:
                segments.append(cur)
            cur = []
            continue
        cur.append(f"{X(x):.1f},{Y(y):.1f}")
    if cur:
        segments.append(cur)
    for s in segments:
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(s)}"/>')
    out.append(f'<text transform="translate({x0 - 48},{y0 + h / 2}) rotate(-90)" text-anchor="middle" '
               f'font-size="12">{esc(ylabel)}</text>')
    if xlabel:
        out.append(f'<text x="{x0 + w / 2}" y="{y0 + h + 34}" text-anchor="middle" font-size="12">{esc(xlabel)}</text>')
    if title:
        out.append(f'<text x="{x0 + w / 2}" y="{y0 - 10}" text-anchor="middle" font-size="14" '
                   f'font-weight="bold">{esc(title)}</text>')


runs = []
for r in args.runs:
    if "=" not in r:
        sys.exit(f"'{r}': give each run as TITLE=METRICS.jsonl")
    title, path = r.rsplit("=", 1)
    runs.append((title, read(path)))

width = len(runs) * (LEFT + W_PANEL + RIGHT)
height = TOP + H_NOISE + GAP + H_LOSS + BOTTOM + (20 if args.caption else 0)
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
       f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
       f'<rect width="{width}" height="{height}" fill="white"/>']
for i, (title, (steps, loss, noise)) in enumerate(runs):
    x0 = i * (LEFT + W_PANEL + RIGHT) + LEFT
    xr = (min(steps), max(steps))
    panel(out, x0, TOP, W_PANEL, H_NOISE, steps, noise, xr, True, COLOURS["noise"],
          "grad_noise_scale (samples, log)", "", title)
    panel(out, x0, TOP + H_NOISE + GAP, W_PANEL, H_LOSS, steps, loss, xr, False, COLOURS["loss"],
          "training loss", "step", "")
    first = next(k for k, n in enumerate(noise) if n is not None)
    print(f"{title}: steps {steps[0]}-{steps[-1]}; noise scale {noise[first]:.3g} at step {steps[first]} "
          f"-> {noise[-1]:.3g} at step {steps[-1]}; loss {loss[0]:.4g} -> {loss[-1]:.4g}")
if args.caption:
    out.append(f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle" font-size="11" fill="#444">'
               f'{esc(args.caption)}</text>')
out.append("</svg>")
with open(args.out, "w") as f:
    f.write("\n".join(out) + "\n")
print(f"wrote {args.out}")
