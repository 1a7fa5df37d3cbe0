#!/usr/bin/env bash
# The method study (docs/RESULTS.md, "The study"): runs scripts/frontier.py (every method tuned
# on one seed, held-out seeds, byte budgets, 4 clusters, two links; resumable: a finished
# run's summary is kept and not run again), then scripts/frontier_report.py (report.md and
# frontier.png in the output folder).
#   scripts/frontier.sh [--quick] [--out DIR] [--train BIN] [--data-dir DIR] [--stages LIST]
# --quick: the `tiny` model and a reduced grid, to check the script end to end in minutes.
# Expects a build (build/reference_trainer/dilocox-train), data/brown and mpirun.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=out/frontier
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  case ${args[i]} in
    --quick) [[ $out == out/frontier ]] && out=out/frontier-quick ;;
    --out) out=${args[i + 1]:?--out needs a folder} ;;
  esac
done
/usr/bin/python3 scripts/frontier.py "${args[@]}" --out "$out"
/usr/bin/python3 scripts/frontier_report.py "$out"
