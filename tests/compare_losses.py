#!/usr/bin/env python3
"""Two runs' metrics files agree step by step: every loss within 1e-5 relative.

Usage: compare_losses.py REFERENCE.jsonl RUN.jsonl STEPS WHAT OK-LINE
  STEPS    the number of steps both must hold
  WHAT     names the run in the failure ("the mpi run")
  OK-LINE  printed when they agree (the tests' pass expression)
"""
import json
import sys

ref_path, run_path, steps, what, ok = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
a = [json.loads(l)["loss"] for l in open(ref_path)]
b = [json.loads(l)["loss"] for l in open(run_path)]
assert len(a) == len(b) == steps, (len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"steps {len(a)}, first loss {a[0]:.4f}, last {a[-1]:.4f}, worst relative difference {worst:.2e}")
assert a[-1] < a[0] - 0.5, "the curve did not move"
assert worst < 1e-5, f"{what} differs from the reference run"
print(ok)
