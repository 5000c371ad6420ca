#!/usr/bin/env bash
# Records the loss curves of the named models at the layouts the bit-identity test runs
# (tests/model/check_named_curves.py): 20 steps from seed 1337, one kernel thread a rank; the
# image models on Fashion-MNIST, the token models on a text the script writes (words drawn from a
# fixed list by a seeded generator, so the record needs no corpus). A second argument picks the
# runs of one family ("image" or "token"; default both). Run with the binary of the commit whose
# curves are the reference:
#   tests/model/record_named_curves.sh build/meshtrain > tests/model/named_curves.json
set -euo pipefail
bin=${1:?give the meshtrain binary}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
family=${2:-all}
python3 - "$tmp/text.txt" <<'PY'
import random, sys
words = ("the a of to and in that is was he for it with as his on be at by had not are but from or have an "
         "they which one you were her all she there would their we him been has when who will more no if "
         "out so said what up its about into than them can only other new some could time these two may "
         "then do first any my now such like our over man me even most made after also did many before "
         "must through back years where much your way well down should because each just those people "
         "how too little state good very make world still own see men work long get here between both "
         "life being under never day same another know while last might us great old year off come since "
         "against go came right used take three").split()
r = random.Random(7)
open(sys.argv[1], "w").write("".join(r.choice(words) + (".\n" if i % 17 == 16 else " ") for i in range(60000)))
PY
image_runs=(
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
# The larger transformers train a shorter batch than their recommended one, so that the suite stays
# short; the description is what is compared, and it is the same at any batch.
token_runs=(
  "gpt-tiny|1|"
  "gpt-tiny|dp2pp2|--dp 2 --pp 2"
  "gpt-tiny|tp2|--tp 2"
  "gpt-small|1|--batch 4 --seq 32"
  "gpt-small|dp2pp2|--batch 4 --seq 32 --dp 2 --pp 2"
  "gpt2-124m|1|--batch 2 --seq 16"
  "gpt2-124m|dp2pp2|--batch 2 --seq 16 --dp 2 --pp 2"
)
runs=()
[ "$family" = token ] || runs+=("${image_runs[@]}")
[ "$family" = image ] || runs+=("${token_runs[@]}")
isa=$(grep -o -w -E 'avx512_bf16|amx_bf16|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')
echo "{\"cpu_flags\": \"${isa% }\", \"curves\": {"
sep=""
for r in "${runs[@]}"; do
  IFS='|' read -r model name flags <<<"$r"
  data=fashion-mnist
  case $model in gpt*) data=$tmp/text.txt ;; esac
  # shellcheck disable=SC2086
  "$bin" train --model "$model" --data "$data" --steps 20 --threads 1 --eval-every 0 --eval-batches 1 \
    --seed 1337 --quiet --metrics "$tmp/$model-$name.jsonl" $flags >/dev/null
  losses=$(python3 -c 'import json,sys; print(json.dumps([json.loads(l)["loss"] for l in open(sys.argv[1]) if "loss" in json.loads(l)]))' "$tmp/$model-$name.jsonl")
  printf '%s  "%s %s": %s' "$sep" "$model" "$name" "$losses"
  sep=$',\n'
done
printf '\n}}\n'
