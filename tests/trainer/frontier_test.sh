#!/usr/bin/env bash
# scripts/frontier.sh --quick end to end on synthetic shards: every stage runs, the report
# names every method and DiLoCoX's levers, each method's loss is the same unthrottled and on both shaped links,
# a second invocation runs nothing, and a removed run is made again (and only it).
#   frontier_test.sh REPO TRAIN SHARDS WORKDIR
set -euo pipefail
trap 'echo "FAIL: line $LINENO: \`$BASH_COMMAND\` exited $?" >&2' ERR
repo=$1 train=$2 shards=$3 work=$4
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$shards" data
study() { "$repo/scripts/frontier.sh" --quick --out "$work/q" --train "$train" --data-dir "$work/data" "$@"; }
t0=$(date +%s)
study >first.txt
made=$(grep -o '[0-9]* run(s) made' first.txt | cut -d' ' -f1)
runs=$(ls q/runs/*.json | wc -l)
[[ $made == "$runs" && $runs -gt 40 ]] || fail "made $made runs, $runs files: $(tail -3 first.txt)"
report=q/report.md
for m in allreduce diloco_fp32 diloco_int4 diloco_int4_frag cocktail sparseloco dilocox dilocox_frag; do
  grep -q "^| $m | chosen |" "$report" || fail "no held-out row for $m in $report"
  grep -q "^| $m | [0-9,]* | " "$report" || fail "no throughput row for $m in $report"
done
for l in rank32 fixed_rank fixed_rank32 int8_half_rank decayed_feedback; do
  grep -q "^| $l | " "$report" || fail "no row for DiLoCoX's lever $l in $report"
done
! grep -q '| NO |$' "$report" || fail "a method's loss changed with the link: $(grep '| NO |$' "$report")"
if command -v gnuplot >/dev/null; then [[ -s q/frontier.png ]] || fail "no frontier.png"; fi
study >second.txt
grep -q '^frontier: 0 run(s) made' second.txt || fail "a second invocation ran again: $(tail -1 second.txt)"
rm q/runs/heldout-dilocox-s2.json
study >third.txt
grep -q '^frontier: 1 run(s) made' third.txt || fail "after removing one run: $(tail -1 third.txt)"
echo "ok ($(( $(date +%s) - t0 )) s): $runs runs, report and plot, resumed with 0 then 1 run(s) to make"
