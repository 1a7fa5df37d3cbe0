#!/usr/bin/env bash
# The README's main demo: installs what is missing, builds, and prints the
# compression-ratio-vs-error table of dilocox's compressors on gradient-like matrices.
# Pass --quick for a smaller table.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target compress_tensors
build/examples/compress_tensors "$@"
