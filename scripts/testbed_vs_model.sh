#!/usr/bin/env bash
# testbed_vs_model.sh: the same training runs over a real shaped link and over the link
# model. For each mode: two sites of dilocox-train, each its own mpirun in a network
# namespace of the WAN testbed (scripts/wan_testbed.sh, uplinks shaped by tc tbf to RATE,
# Gloo over TCP, no modelled link), then one mpirun of the same flags with ThrottledLink at
# the same bandwidth and latency 0. Prints the table of docs/RESULTS.md "The trainer on the
# testbed"; keeps each run's summary and metrics in OUT. Root; scripts/install_deps.sh --sites.
#
#   scripts/testbed_vs_model.sh [--rate 20mbit] [--repeats 3] [--train BIN] [--data-dir DIR] [--out DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rate=20mbit repeats=3 train=build/reference_trainer/dilocox-train data=data/brown out=out/testbed_vs_model
while [[ $# -gt 0 ]]; do
  case $1 in
    --rate) rate=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --train) train=$2; shift 2 ;;
    --data-dir) data=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) sed -n '9p' "$0" | sed 's/^#   //' >&2; exit 2 ;;
  esac
done
[[ $rate =~ ^([0-9]+)mbit$ ]] || { echo "testbed_vs_model: --rate must be N mbit (e.g. 20mbit)" >&2; exit 2; }
mbps=${BASH_REMATCH[1]}
[[ $repeats =~ ^[1-9][0-9]?$ ]] || { echo "testbed_vs_model: --repeats must be 1-99" >&2; exit 2; }
[[ -x $train ]] || { echo "testbed_vs_model: no dilocox-train at $train" >&2; exit 2; }
train=$(realpath "$train") data=$(realpath "$data")
mkdir -p "$out" && out=$(realpath "$out")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
name=tvm
"$here/wan_testbed.sh" up --sites 2 --rate "$rate" --name $name
trap '"$here/wan_testbed.sh" down --name $name' EXIT

# The study's model; AllReduce 6 steps, the outer modes 3 rounds of H 10 (no H floor from
# the modelled link, which differs between the runs: --step-seconds 0).
common=(--model small --layers 1 --data-dir "$data" --clusters 2 --batch 16 --seq-len 128 --lr 1e-3
        --eval-every 0 --eval-sequences 16 --quiet --checkpoint-minutes 0 --local-steps 10 --step-seconds 0)
declare -A steps=([allreduce]=6 [diloco]=30 [dilocox]=30)
for ((r = 0; r < repeats; r++)); do for mode in allreduce diloco dilocox; do
  flags=("${common[@]}" --sync $mode --tokens $((steps[$mode] * 16 * 128 * 2)))
  for s in 0 1; do
    # Each site's rank on a core of its own, as one mpirun binds them (two mpiruns would
    # both bind theirs to core 0).
    "$here/wan_testbed.sh" run $s --name $name -- bash -c 'exec mpirun -np 1 --cpu-set $DILOCOX_SITE --bind-to core \
      "$@" --site $DILOCOX_SITE \
      --rendezvous $DILOCOX_RENDEZVOUS --run-id "tvm-$0" --gloo-interface eth0 --wan-bandwidth 1Tbps' \
      "$mode-$r-$$" "$train" "${flags[@]}" --metrics "$out/testbed-$mode-site$s-r$r.jsonl" \
      >"$out/testbed-$mode-site$s-r$r.txt" 2>"$out/testbed-$mode-site$s-r$r.err" &
  done
  wait
  mpirun -np 2 --oversubscribe "$train" "${flags[@]}" --wan-bandwidth "${mbps}Mbps" --wan-latency 0 \
    --metrics "$out/model-$mode-r$r.jsonl" >"$out/model-$mode-r$r.txt"
  mpirun -np 2 --oversubscribe "$train" "${flags[@]}" --wan-bandwidth 1Tbps --wan-latency 0 \
    --metrics "$out/free-$mode-r$r.jsonl" >"$out/free-$mode-r$r.txt"
done; done
/usr/bin/python3 - "$out" "$rate" "$repeats" <<'EOF'
import json, statistics, sys
out, rate, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
def summary(name):
    with open(f"{out}/{name}.txt") as f:
        return json.loads([l for l in f if l.startswith("{")][-1])
def syncs(name):
    with open(f"{out}/{name}.jsonl") as f:
        return [json.loads(l) for l in f if '"type":"sync"' in l]
def step_seconds(s):
    return s["tokens"] / s["steps"] / s["tokens_per_second"]
print(f"Medians of {repeats} repeat(s).")
print(f"| mode | link | tokens/s | vs unthrottled | wire time per round (s) | testbed / model |")
print("|---|---|---|---|---|---|")
for mode in ("allreduce", "diloco", "dilocox"):
    free_step = statistics.median(step_seconds(summary(f"free-{mode}-r{r}")) for r in range(repeats))
    rows = {}
    for link, name in (("testbed", f"testbed-{mode}-site0"), ("model", f"model-{mode}"), ("unthrottled", f"free-{mode}")):
        runs = [summary(f"{name}-r{r}") for r in range(repeats)]
        if mode == "allreduce":  # per step: the step's time beyond the unthrottled step
            wire = statistics.median(step_seconds(s) for s in runs) - free_step
        else:
            wire = statistics.median(e["comm_seconds"] for r in range(repeats) for e in syncs(f"{name}-r{r}"))
        losses = {s["final_eval_loss"] for s in runs}
        rows[link] = (statistics.median(s["tokens_per_second"] for s in runs), wire,
                      losses.pop() if len(losses) == 1 else None)
    for link in ("testbed", "model"):
        tps, wire, _ = rows[link]
        ratio = "" if link == "model" else f"{rows['testbed'][0] / rows['model'][0]:.2f} (tokens/s), {rows['testbed'][1] / max(rows['model'][1], 1e-9):.2f} (wire)"
        print(f"| {mode} | {link} {rate} | {tps:,.0f} | {tps / rows['unthrottled'][0]:.2f} | {wire:.3f} | {ratio} |")
    same = rows["testbed"][2] is not None and rows["testbed"][2] == rows["model"][2] == rows["unthrottled"][2]
    print(f"| {mode} | final eval loss {'the same on every link' if same else 'DIFFERS: ' + str([r[2] for r in rows.values()])} | | | | |")
EOF
