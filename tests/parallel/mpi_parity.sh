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
python3 "$(dirname "$0")/../compare_losses.py" "$dir/one.jsonl" "$dir/two.jsonl" 20 "the mpi run" "MPI PARITY OK"
