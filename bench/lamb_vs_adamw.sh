#!/usr/bin/env bash
# LAMB against AdamW at a large global batch: resnet-small on Fashion-MNIST at dp 4 x 1024 images
# (global batch 4096), the same number of epochs, the same warm-up and cosine schedule; the test
# accuracy each reaches (docs/benchmarks.md, "LAMB against AdamW at a large batch").
#
#   bench/lamb_vs_adamw.sh [--epochs E] [--model M] [--adamw-lr X] [--lamb-lr Y]
#
# Defaults: 3 epochs (44 steps of 4096 = 180,224 images), AdamW lr 0.004 with decoupled weight
# decay 0.05, LAMB lr 0.02 with weight decay 0.01, 10 warm-up steps, cosine to 1% of the rate;
# 4 micro-batches per step (each dp rank's 1024 images in 4 x 256). Prints one line per
# optimizer: final test loss and accuracy, wall time. About 7 minutes per optimizer on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
MESHTRAIN=${MESHTRAIN:-build/meshtrain}
EPOCHS=3 MODEL=resnet-small ADAMW_LR=0.004 LAMB_LR=0.02
while [[ $# -gt 0 ]]; do
  case $1 in
    --epochs) EPOCHS=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --adamw-lr) ADAMW_LR=$2; shift 2 ;;
    --lamb-lr) LAMB_LR=$2; shift 2 ;;
    *) echo "unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
B=4096
STEPS=$(( (EPOCHS * 60000 + B - 1) / B ))
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; $MODEL, dp 4 x 1024, $EPOCHS epochs = $STEPS steps"
for opt in adamw lamb; do
  if [[ $opt == adamw ]]; then flags=(--optimizer adamw --lr "$ADAMW_LR" --weight-decay 0.05)
  else flags=(--optimizer lamb --lr "$LAMB_LR" --weight-decay 0.01); fi
  start=$(date +%s)
  "$MESHTRAIN" train --model "$MODEL" --data fashion-mnist --dp 4 --batch $B --microbatches 4 --steps "$STEPS" \
    --warmup 10 --min-lr "$(python3 -c "print(${flags[3]} / 100)")" "${flags[@]}" --eval-every "$STEPS" --eval-batches 3 \
    --threads 1 --log-every 5 --metrics "$dir/$opt.jsonl" > "$dir/$opt.log" 2>&1
  end=$(date +%s)
  python3 - "$dir/$opt.jsonl" "$opt" "${flags[3]}" $((end - start)) <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
last = lines[-1]
print(f"{sys.argv[2]:6s} lr {sys.argv[3]:6s} | train loss {lines[0]['loss']:.3f} -> {last['loss']:.3f} | "
      f"test loss {last['val_loss']:.4f} | test accuracy {100 * last['val_accuracy']:.2f}% | {sys.argv[4]} s")
PY
done
