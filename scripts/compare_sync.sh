#!/usr/bin/env bash
# The synchronization modes of the registry (include/dilocox/compress/registry.hpp) side by side (the main
# demo's part 2): 2 clusters of the `tiny` GPT on the Brown corpus, 600k tokens (--quick:
# 100k), joined by an emulated 10 Mbit/s link (20 ms latency) on which AllReduce spends
# most of its time communicating, each mode at its defaults; DiLoCoX also with 4 streaming
# fragments, and again on an unthrottled link, to show how much of the slow link it hides. Prints a table and writes PNG plots of eval loss vs
# tokens and vs wall-clock (gnuplot) under out/compare/.
#   scripts/compare_sync.sh [--quick] [extra dilocox-train flags...]
# Expects a build (build/reference_trainer/dilocox-train) and data/brown.
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=600000 eval_every=30
if [[ ${1:-} == --quick ]]; then tokens=100000 eval_every=10; shift; fi
out=out/compare
rm -rf $out && mkdir -p $out
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
common=(--model tiny --clusters 2 --batch 16 --lr 3e-3 --tokens "$tokens" --eval-every "$eval_every"
        --eval-sequences 128 --wan-bandwidth 10Mbps --wan-latency 20ms "$@")
run() {  # name, then flags
  local name=$1; shift
  echo "--- $name: dilocox-train ${common[*]} $*"
  mpirun -np 2 --oversubscribe build/reference_trainer/dilocox-train "${common[@]}" "$@" \
    --metrics $out/$name.jsonl </dev/null | tail -1 >$out/$name.summary.json
}
run allreduce --sync allreduce
run diloco --sync diloco
run cocktail --sync cocktail
run sparseloco --sync sparseloco
run dilocox --sync dilocox
run dilocox_streaming --sync dilocox --fragments 4
run dilocox_unthrottled --sync dilocox --wan-bandwidth 100Gbps --wan-latency 0
/usr/bin/python3 scripts/sync_report.py $out allreduce diloco cocktail sparseloco dilocox dilocox_streaming \
  dilocox_unthrottled
