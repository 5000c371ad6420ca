#!/usr/bin/env bash
# Configures and builds meshtrain into build/ (Release). Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
werror=OFF
[ "${CI:-}" = "true" ] && werror=ON
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_WERROR=$werror "$@" > build.log 2>&1 \
  || { cat build.log; exit 1; }
cmake --build build -j "$(nproc)" 2>&1 | grep -E 'error|warning|Error|\[100%\]' || true
test "${PIPESTATUS[0]}" -eq 0
