#!/usr/bin/env bash
# Saved-activation bytes per pipeline stage as the program reports them (the metrics'
# peak_saved_activation_bytes and microbatches_in_flight, one entry per pp rank): GPipe, 1F1B and
# 1F1B with --recompute and ZB-H1 at pp 2 on gpt-small (micro-batches of 2 rows: B = 2m, T = 256)
# for m = 1, 2, 4, 8, 16.
#   bench/pipeline_memory.sh [MODEL]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-gpt-small}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "| schedule | m | stage 0 MiB | stage 1 MiB | in flight (stage 0, 1) |"
echo "| --- | ---: | ---: | ---: | --- |"
for sched in gpipe 1f1b "1f1b --recompute" "zb"; do
  for m in 1 2 4 8 16; do
    build/meshtrain train --model "$model" --data data/corpus.txt --pp 2 --batch $((2 * m)) --microbatches $m \
      --schedule $sched --steps 1 --eval-every 0 --eval-batches 1 --quiet --metrics "$tmp/m.jsonl"
    python3 - "$tmp/m.jsonl" "$sched" "$m" <<'PY'
import json, sys
l = json.loads(open(sys.argv[1]).readline())
p, f = l["peak_saved_activation_bytes"], l["microbatches_in_flight"]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {p[0] / 2**20:.1f} | {p[1] / 2**20:.1f} | {f[0]}, {f[1]} |")
PY
  done
done
