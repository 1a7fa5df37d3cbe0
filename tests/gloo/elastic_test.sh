#!/usr/bin/env bash
# Elastic membership on loopback (dilocox/comm/elastic.hpp, driven by elastic_site): three
# founding sites train 30 rounds; site 1 is killed (kill -9) after round 3 and started
# again after round 5; a new site 3 joins after round 4; a site with another
# configuration (--dim) asks to join after round 7 and is refused with the difference
# named, and a second site 0 after round 8 (a member already); site 2 is sent SIGTERM
# after round 10 and leaves at a round boundary; site 3 is stopped (SIGSTOP) after round
# 14 until the others have gone on without it (their operation's 5 s timeout), then
# continued: it is told it was left out. Passes when the sites that finish hold identical
# global parameters, each event happened, and the survivors' wait after the kill stayed
# within the settle time plus 5 s. Then a second run: site 2 dies at the boundary that
# admits a new site 3, before the state is shared; site 3, holding no snapshot yet, takes
# a holder's copy when the survivors roll back, and sites 0, 1 and 3 finish identical.
# Usage: elastic_test.sh path/to/elastic_site [rounds]
set -euo pipefail
site_bin=$1
rounds=${2:-30}
dir=$(mktemp -d /tmp/dilocox_elastic_XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  [[ -n ${KEEP:-} ]] && echo "elastic_test: logs in $dir" || rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "elastic_test: FAIL: $*"; for f in "$dir"/*.log; do echo "--- $f"; tail -5 "$f"; done; exit 1; }

settle_ms=2000
run=elastic
start_site() {  # start_site NAME SITE [extra flags]: background, logs in $dir/NAME.{out,err}.log
  local name=$1 site=$2
  shift 2
  "$site_bin" --store "file://$dir" --run $run --site "$site" --founders 3 --rounds "$rounds" --steps 5 \
    --pace-ms 25 --timeout-ms 5000 --settle-ms $settle_ms "$@" >"$dir/$name.out.log" 2>"$dir/$name.err.log" &
  pids+=($!)
  eval "pid_$name=$!"
}
expect_exit() {  # expect_exit CODE NAME...: each site NAME ends with exit status CODE
  local want=$1 name p code
  shift
  for name in "$@"; do
    p=pid_$name code=0
    wait "${!p}" || code=$?
    [[ $code == "$want" ]] || fail "site $name exited $code, not $want"
  done
}
one_checksum() {  # one_checksum DONE_LINES: the sites that finished hold the same global parameters
  [[ $(echo "$1" | grep -o '"checksum":"[0-9a-f]*"' | sort -u | wc -l) == 1 ]] ||
    fail "the sites end with different global parameters: $1"
}
# The last round site 0 completed (its log: $dir/$log0.out.log).
log0=s0
round_of_0() { grep -o '"event":"round","site":0,"round":[0-9]*' "$dir/$log0.out.log" 2>/dev/null | tail -1 | grep -o '[0-9]*$' || echo 0; }
wait_round() {  # wait_round N: until site 0 has completed round N (60 s at most)
  for _ in $(seq 600); do
    (($(round_of_0) >= $1)) && return 0
    sleep 0.1
  done
  fail "site 0 never reached round $1"
}

start_site s0 0
start_site s1 1
start_site s2 2
wait_round 3
kill -9 "$pid_s1"
echo "elastic_test: killed site 1 after round $(round_of_0)"
wait_round 4
start_site s3 3
echo "elastic_test: site 3 asks to join after round $(round_of_0)"
wait_round 5
start_site s1b 1
echo "elastic_test: site 1 restarted after round $(round_of_0)"
wait_round 7
start_site bad 4 --dim 16
wait_round 8
start_site dup 0
wait_round 10
kill -TERM "$pid_s2"
echo "elastic_test: SIGTERM to site 2 after round $(round_of_0)"
wait_round 14
kill -STOP "$pid_s3"
echo "elastic_test: site 3 stopped after round $(round_of_0)"
for _ in $(seq 300); do
  grep -q '"event":"recovered","site":0,"epoch":[0-9]*,"sites":\[0,1\]' "$dir/s0.out.log" && break
  sleep 0.1
done
kill -CONT "$pid_s3"

expect_exit 0 s0 s1b s2
expect_exit 1 s3 bad dup

grep -q 'refused by the run.s sites: its configuration differs from the run.s: dim .16. (the run.s: .24.)' "$dir/bad.err.log" ||
  fail "the refusal does not name the differing flag: $(cat "$dir/bad.err.log")"
grep -q 'refused by the run.s sites: site 0 is a member already' "$dir/dup.err.log" ||
  fail "a second site 0 was not refused: $(cat "$dir/dup.err.log")"
grep -q 'answered after the others had formed epoch [0-9]* without it: restart it to rejoin' "$dir/s3.err.log" ||
  fail "the stopped site 3 was not told it was left out: $(cat "$dir/s3.err.log")"
grep -q '"event":"left","site":2' "$dir/s2.out.log" || fail "site 2 did not leave at a boundary"
grep -q '"event":"joined","site":3' "$dir/s3.out.log" || fail "site 3 did not join"
grep -q '"event":"joined","site":1' "$dir/s1b.out.log" || fail "site 1 did not rejoin"
done_lines=$(cat "$dir"/s0.out.log "$dir"/s1b.out.log | grep '"event":"done"')
[[ $(echo "$done_lines" | wc -l) == 2 ]] || fail "not every remaining site finished: $done_lines"
echo "$done_lines" | grep -q "\"round\":$rounds" || fail "the run did not reach round $rounds"
one_checksum "$done_lines"
echo "$done_lines" | grep -q '"sites":\[0,1\]' || fail "the final membership is not sites 0 and 1: $done_lines"
waits=$(grep -ho '"event":"recovered".*"sites":\[0,2\].*' "$dir"/s0.out.log "$dir"/s2.out.log | grep -o '"waited_s":[0-9.]*' | cut -d: -f2)
[[ -n $waits ]] || fail "no survivor recovered from the kill"
for w in $waits; do
  awk -v w="$w" -v s=$settle_ms 'BEGIN { exit !(w <= s / 1000 + 5) }' || fail "a survivor waited $w s after the kill"
done
echo "elastic_test: survivors waited $(echo $waits | tr '\n' ' ')s after the kill (settle ${settle_ms} ms)"
echo "elastic_test: final $(echo "$done_lines" | head -1)"

run=elastic_join log0=j0 rounds=12
start_site j0 0
start_site j1 1
start_site j2 2 --exit-at-join 1
wait_round 2
start_site j3 3
expect_exit 0 j0 j1 j3
expect_exit 9 j2
grep -q '"event":"recovered","site":3,.*"from":"holder"' "$dir/j3.out.log" ||
  fail "the joining site 3 did not take a holder's state: $(cat "$dir/j3.out.log" "$dir/j3.err.log")"
done_lines=$(cat "$dir"/j0.out.log "$dir"/j1.out.log "$dir"/j3.out.log | grep '"event":"done"')
[[ $(echo "$done_lines" | grep -c "\"round\":$rounds,.*\"sites\":\[0,1,3\]") == 3 ]] ||
  fail "sites 0, 1 and 3 did not all finish round $rounds together: $done_lines"
one_checksum "$done_lines"
echo "elastic_test: a site died while site 3 joined; site 3 took a holder's state: $(grep -o '"event":"recovered".*"waited_s":[0-9.]*' "$dir/j3.out.log")"
echo "elastic_test: PASS"
