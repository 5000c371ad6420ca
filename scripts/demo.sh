#!/usr/bin/env bash
# Quick start, part one: set up, build, and train gpt-tiny on the bundled corpus, printing loss
# and tokens/s per step and the validation loss at the end. Extra arguments go to
# `meshtrain train` and override the defaults below (e.g. scripts/demo.sh --steps 100).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
defaults=(--model gpt-tiny --data data/corpus.txt --steps 500)
args=()
i=0
while [ $i -lt ${#defaults[@]} ]; do
  flag=${defaults[$i]} value=${defaults[$((i + 1))]}
  given=no
  for a in "$@"; do
    case "$a" in "$flag" | "$flag"=*) given=yes ;; esac
  done
  # --config replaces --model
  if [ "$flag" = --model ]; then
    for a in "$@"; do case "$a" in --config | --config=*) given=yes ;; esac; done
  fi
  [ $given = yes ] || args+=("$flag" "$value")
  i=$((i + 2))
done
exec build/meshtrain train "${args[@]}" "$@"
