#!/usr/bin/env bash
# The C++ API as a user meets it: install the built package into a scratch prefix, build
# examples/cpp (its own CMake project) against it with find_package(meshtrain), and run it: it
# trains a network defined in code at one rank and at dp 2 x pp 2 and fails if the curves part.
# Usage: example.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/meshtrain-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" | tail -n 2
test -f "$tmp/prefix/lib/cmake/meshtrain/meshtrainConfig.cmake"
test -f "$tmp/prefix/include/meshtrain/model/builder.h"
# Headers in sub-folders (parallel/ by strategy) and of the libraries below train/.
test -f "$tmp/prefix/include/meshtrain/parallel/tensor/tp_layout.h"
test -f "$tmp/prefix/include/meshtrain/checkpoint/checkpoint.h"
test -f "$tmp/prefix/include/meshtrain/data/data.h"
test -f "$tmp/prefix/include/meshtrain/optim/optimizer.h"
cmake -S "$src/examples/cpp" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release
cmake --build "$tmp/build" -j 2
"$tmp/build/train_my_net" fashion-mnist
