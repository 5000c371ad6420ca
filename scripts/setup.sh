#!/usr/bin/env bash
# Installs everything meshtrain needs on Debian 12 (apt-get only) and prepares the bundled text
# corpus; `scripts/setup.sh --tests` adds what only the tests need. Safe to run again: packages
# already present are skipped, nothing else is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake pkg-config git
  libopenblas-openmp-dev libblis-dev libdnnl-dev   # BLAS candidates (docs/benchmarks.md)
  ocl-icd-opencl-dev opencl-c-headers              # oneDNN's CMake package requires OpenCL
  libopenmpi-dev openmpi-bin                       # the mpi backend
  iproute2                                         # tests: two hosts as network namespaces
  libgtest-dev libgmock-dev libbenchmark-dev       # tests and benchmarks
  libxml2-dev                                      # tests read the SVG swimlanes back
  nlohmann-json3-dev libcli11-dev zlib1g-dev
  fortunes                                         # the text corpus of the quick start
  dataset-fashion-mnist                            # images: /usr/share/datasets/fashion-mnist
  python3
  libonnx-dev libprotobuf-dev                      # ONNX in (train --model net.onnx, meshtrain import)
  python3-dev pybind11-dev python3-numpy python3-venv python3-wheel  # the Python module (docs/python.md)
)
# --tests: what the test suite needs besides: PyTorch, which exports the networks of the ONNX
# round trip and replays their training (tests/onnx/round_trip.py).
if [ "${1:-}" = "--tests" ]; then
  PACKAGES+=(python3-torch)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The corpus: Debian's fortune-cookie collection (about 2.4 MB of English text: literature,
# quotes, songs and poems), concatenated once into data/corpus.txt.
mkdir -p data
if [ ! -s data/corpus.txt ]; then
  src=/usr/share/games/fortunes
  find "$src" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' ! -name 'ascii-art' \
    | LC_ALL=C sort | xargs cat > data/corpus.txt.tmp
  mv data/corpus.txt.tmp data/corpus.txt
  echo "setup: wrote data/corpus.txt ($(wc -c < data/corpus.txt) bytes)"
fi
