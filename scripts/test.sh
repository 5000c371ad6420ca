#!/usr/bin/env bash
# Quick start, part two: set up, build, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
scripts/build.sh
cd build
ctest --output-on-failure -j 2 --timeout 900
