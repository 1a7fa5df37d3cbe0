#!/usr/bin/env bash
# The README's main demo, from nothing: installs what is missing, builds, fetches and
# prepares the Brown corpus (scripts/prepare_data.sh), then trains the `small` GPT
# (4.2M parameters) with dilocox-train for a few minutes, showing the progress line,
# the evaluations and the final JSON summary. With 2+ cores it runs 2 pipeline stages
# under mpirun (one rank per stage). Metrics go to out/demo/metrics.jsonl.
#   scripts/demo.sh            ~400k tokens (about 3 minutes on 2 cores)
#   scripts/demo.sh --quick    ~100k tokens
# The compressor table of the first demo: build/examples/compress_tensors.
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=400000
case "${1:-}" in
  "") ;;
  --quick) tokens=100000 ;;
  *) echo "demo: unknown option '$1' (use --quick)" >&2; exit 2 ;;
esac
scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target dilocox-train dilocox-prepare-data
scripts/prepare_data.sh
mkdir -p out/demo
args=(--model small --tokens "$tokens" --eval-every 50 --metrics out/demo/metrics.jsonl)
if (($(nproc) >= 2)); then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  mpirun -np 2 --oversubscribe build/reference_trainer/dilocox-train "${args[@]}" --stages 2
else
  build/reference_trainer/dilocox-train "${args[@]}"
fi
