#!/usr/bin/env bash
# Quick start, part one: set up, build, and train gpt-tiny on the bundled corpus, printing loss
# and tokens/s per step and the validation loss at the end. Extra arguments go to `meshtrain train`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec build/meshtrain train --model gpt-tiny --data data/corpus.txt --steps 500 "$@"
