#!/usr/bin/env bash
# A layout across MPI processes reproduces the single-rank loss curve: the same run on one rank
# (threads) and under mpirun -np NP with the layout flags given (e.g. --dp 2 --zero 2, or
# --pp 2 --microbatches 4), compared step by step to 1e-5 relative.
# Usage: mpi_parity.sh MESHTRAIN MPIRUN NP [--image MODEL [--exact N] [--lr LR]] LAYOUT-FLAGS...
#   --image MODEL  an image model on Fashion-MNIST (the set-up installs it), 30 steps of SGD with
#                  momentum; otherwise gpt-tiny on a small text, 20 steps.
#   --exact N      both runs with --exact-sums N (docs/architecture.md).
#   --lr LR        the learning rate of both runs (image models; 0.02 otherwise).
set -euo pipefail
bin=$1 mpirun=$2 np=$3
shift 3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
if [[ ${1:-} == --image ]]; then
  model=$2
  shift 2
  exact=() lr=0.02
  while [[ ${1:-} == --exact || ${1:-} == --lr ]]; do
    if [[ $1 == --exact ]]; then exact=(--exact-sums "$2"); else lr=$2; fi
    shift 2
  done
  images=/usr/share/datasets/fashion-mnist
  [[ -f $images/train-images-idx3-ubyte.gz ]] || { echo "no Fashion-MNIST at $images: run scripts/setup.sh"; exit 1; }
  common=(train --model "$model" --data "$images" --batch 16 --microbatches 2 --steps 30 --warmup 2
          --optimizer sgd --momentum 0.9 --lr "$lr" --eval-every 0 --eval-batches 1 --threads 1 --quiet
          "${exact[@]}")
  "$bin" "${common[@]}" --metrics "$dir/one.jsonl"
  "$mpirun" --allow-run-as-root --oversubscribe --mca btl vader,self --bind-to none -np "$np" \
    "$bin" "${common[@]}" "$@" --backend mpi --metrics "$dir/two.jsonl"
  exec python3 "$(dirname "$0")/../compare_losses.py" "$dir/one.jsonl" "$dir/two.jsonl" 30 "the mpi run" "MPI PARITY OK"
fi
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
