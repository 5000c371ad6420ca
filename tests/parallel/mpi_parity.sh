#!/usr/bin/env bash
# A layout across MPI processes reproduces the single-rank loss curve: the same run on one rank
# (threads) and under mpirun -np NP with the layout flags given (e.g. --dp 2 --zero 2, or
# --pp 2 --microbatches 4), compared step by step to 1e-5 relative.
# Usage: mpi_parity.sh MESHTRAIN MPIRUN NP LAYOUT-FLAGS...
set -euo pipefail
bin=$1 mpirun=$2 np=$3
shift 3
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
"$mpirun" --allow-run-as-root --oversubscribe --mca btl vader,self --bind-to none -np "$np" \
  "$bin" "${common[@]}" "$@" --metrics "$dir/two.jsonl"
python3 - "$dir/one.jsonl" "$dir/two.jsonl" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 20, (len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"steps {len(a)}, first loss {a[0]:.4f}, last {a[-1]:.4f}, worst relative difference {worst:.2e}")
assert a[-1] < a[0] - 0.5, "the curve did not move"
assert worst < 1e-5, "the mpi run differs from the single-rank run"
print("MPI PARITY OK")
PY
