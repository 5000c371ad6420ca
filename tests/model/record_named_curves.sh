#!/usr/bin/env bash
# Records the loss curves of the named image models at the layouts the bit-identity test runs
# (tests/model/check_named_curves.py): 20 steps from seed 1337, one kernel thread a rank. Run with
# the binary of the commit whose curves are the reference:
#   tests/model/record_named_curves.sh build/meshtrain > tests/model/named_curves.json
set -euo pipefail
bin=${1:?give the meshtrain binary}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
runs=(
  "cnn-small|1|"
  "cnn-small|dp2pp2|--dp 2 --pp 2"
  "resnet-small|1|"
  "resnet-small|dp2pp2|--dp 2 --pp 2"
  "resnet-small|tp2|--tp 2"
  "resnet-small|spatial2|--spatial 2"
  "inception-small|1|"
  "inception-small|dp2pp2|--dp 2 --pp 2"
  "inception-small|branch2|--branch-parallel 2 --branch-balance flops"
)
isa=$(grep -o -w -E 'avx512_bf16|amx_bf16|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')
echo "{\"cpu_flags\": \"${isa% }\", \"curves\": {"
sep=""
for r in "${runs[@]}"; do
  IFS='|' read -r model name flags <<<"$r"
  # shellcheck disable=SC2086
  "$bin" train --model "$model" --data fashion-mnist --steps 20 --threads 1 --eval-every 0 --eval-batches 1 \
    --seed 1337 --quiet --metrics "$tmp/$model-$name.jsonl" $flags >/dev/null
  losses=$(python3 -c 'import json,sys; print(json.dumps([json.loads(l)["loss"] for l in open(sys.argv[1]) if "loss" in json.loads(l)]))' "$tmp/$model-$name.jsonl")
  printf '%s  "%s %s": %s' "$sep" "$model" "$name" "$losses"
  sep=$',\n'
done
printf '\n}}\n'
