#!/usr/bin/env bash
# The README's main demo, from nothing: installs what is missing, builds, fetches and
# prepares the Brown corpus (scripts/prepare_data.sh), then
#   1. trains the `small` GPT (4.2M parameters, 200k tokens) with dilocox-train, 2 pipeline stages
#      under mpirun, showing the progress line, evaluations and the JSON summary;
#   2. runs the synchronization modes (AllReduce, DiLoCo, CocktailSGD, SparseLoCo, DiLoCoX,
#      DiLoCoX with streaming fragments) on 2 clusters of `tiny` over an emulated 10 Mbit/s
#      link, at the same token budget, and prints the comparison table and writes PNG plots
#      (scripts/compare_sync.sh).
# About 10 minutes on 2 cores once installed (AllReduce alone takes 6.5 on the slow link);
# --quick about 2.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=()
small_tokens=200000
case "${1:-}" in
  "") ;;
  --quick) quick=(--quick) small_tokens=40000 ;;
  *) echo "demo: unknown option '$1' (use --quick)" >&2; exit 2 ;;
esac
scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target dilocox-train dilocox-prepare-data
scripts/prepare_data.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo
echo "=== 1. dilocox-train: the small GPT on the Brown corpus, 2 pipeline stages ==="
mkdir -p out/demo
mpirun -np 2 --oversubscribe build/reference_trainer/dilocox-train --model small --stages 2 \
  --tokens "$small_tokens" --eval-every 40 --metrics out/demo/small.jsonl </dev/null

echo
echo "=== 2. AllReduce vs DiLoCo vs CocktailSGD vs SparseLoCo vs DiLoCoX: 2 clusters over 10 Mbit/s ==="
scripts/compare_sync.sh "${quick[@]}"
