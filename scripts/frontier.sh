#!/usr/bin/env bash
# The method study (docs/RESULTS.md, "The method study"): scripts/frontier.py runs every
# method tuned on one seed, held-out seeds, byte budgets, 4 clusters and two links
# (resumable: a finished run's summary is kept and not run again), then summarises the
# runs with scripts/frontier_report.py (report.md and frontier.png in the output folder).
#   scripts/frontier.sh [--quick] [--out DIR] [--train BIN] [--data-dir DIR] [--stages LIST]
# --quick: the `tiny` model and a reduced grid, to check the script end to end in minutes.
# Expects a build (build/reference_trainer/dilocox-train), data/brown and mpirun.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec /usr/bin/python3 scripts/frontier.py "$@"
