#!/usr/bin/env bash
# Data parallelism across MPI processes reproduces the single-rank loss curve: the same run at
# dp 1 (threads) and at dp 2 under mpirun (ZeRO stage $3), compared step by step to 1e-5
# relative. Usage: mpi_dp_parity.sh MESHTRAIN MPIRUN ZERO
set -euo pipefail
bin=$1 mpirun=$2 zero=${3:-0}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir/corpus.txt" <<'PY'
import sys
lines = ["It is a truth universally acknowledged, that a single man\n",
         "in possession of a good fortune, must be in want of a wife.\n",
         "However little known the feelings or views of such a man\n"]
open(sys.argv[1], "w").write("".join(lines[(i * 7) % 3] for i in range(600)))
PY
common=(train --data "$dir/corpus.txt" --batch 12 --seq 32 --steps 20 --warmup 5 --eval-every 0 --eval-batches 1 --threads 1 --quiet)
"$bin" "${common[@]}" --metrics "$dir/one.jsonl"
"$mpirun" --allow-run-as-root --oversubscribe --mca btl vader,self --bind-to none -np 2 \
  "$bin" "${common[@]}" --dp 2 --zero "$zero" --metrics "$dir/two.jsonl"
python3 - "$dir/one.jsonl" "$dir/two.jsonl" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 20, (len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"steps {len(a)}, first loss {a[0]:.4f}, last {a[-1]:.4f}, worst relative difference {worst:.2e}")
assert a[-1] < a[0] - 0.5, "the curve did not move"
assert worst < 1e-5, "mpi dp 2 differs from the single-rank run"
print("MPI DP PARITY OK")
PY
