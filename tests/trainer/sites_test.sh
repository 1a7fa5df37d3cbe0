#!/usr/bin/env bash
# dilocox-train with one mpirun per site (--site), the sites meeting through a file store
# on this machine and talking over Gloo on loopback:
#   sites_test.sh CASE TRAIN SHARDS WORKDIR MPIEXEC
# same:    K = 2 sites x 2 stages, AllReduce and DiLoCoX: the same summary numbers as one
#          mpirun of the same flags, on both sites.
# faults:  a site killed mid-run ends the other within seconds, naming Gloo's failure; a
#          site with another --lr is refused before any work (both sites say which flag);
#          sites with different rank counts are refused; --site without its flags is refused.
# resume:  K = 2 sites of DiLoCoX stopped at step 10 (--stop-after) and resumed under a new
#          --run-id: the summary of one uninterrupted mpirun, on both sites; a relaunch under
#          the run id the store already holds is refused by both sites, saying so.
# elastic: 3 founding sites of 4 (--elastic 3): site 1's mpirun killed mid-run and started
#          again, a site 3 with another --lr refused, a new site 3 admitted, site 2's mpirun
#          sent SIGUSR1 (it leaves at a round boundary): the sites that finish hold identical
#          global parameters (with DILOCOX_ELASTIC_REFERENCE set, the fault-free run first, for
#          its loss beside).
set -euo pipefail
trap 'echo "FAIL: line $LINENO: \`$BASH_COMMAND\` exited $?" >&2' ERR
case_name=$1 train=$2 shards=$3 work=$4 mpiexec=$5
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$shards" data
fail() { echo "FAIL: $*" >&2; exit 1; }
field() { grep -m1 -o "\"$1\":[^,}]*" "$2" | sed -n '1s/^[^:]*://p'; }
mpi() { "$mpiexec" -n "$1" --oversubscribe --allow-run-as-root "${@:2}"; }
common=(--model tiny --vocab 64 --data-dir data --batch 4 --seq-len 32 --eval-every 0 --eval-sequences 8 --quiet
        --clusters 2 --tokens 6144 --local-steps 3 --lr 3e-3 --collective-timeout 10)
run=0
# A new run's store and site flags (site_flags).
new_run() {
  run=$((run + 1))
  mkdir -p "$work/store$run"
  site_flags=(--rendezvous "file://$work/store$run" --run-id "t$run" --gloo-interface lo)
}
# Starts site S of the current run in the background, NP ranks: site NP S OUT FLAGS...
# (stdout OUT.S.txt, stderr OUT.S.err; its pid in `pid`).
site() {
  local np=$1 s=$2 out=$3
  shift 3
  mpi "$np" "$train" "$@" --site "$s" "${site_flags[@]}" >"$out.$s.txt" 2>"$out.$s.err" &
  pid=$!
}
# Waits for the sites P0 and P1; their exit codes in r0 and r1.
both_end() {
  r0=0 r1=0
  wait "$1" || r0=$?
  wait "$2" || r1=$?
}
# Both sites of a new run, NP ranks each, the same flags: sites NP OUT FLAGS...
sites() {
  local np=$1 out=$2 p0
  shift 2
  new_run
  site "$np" 0 "$out" "$@"
  p0=$pid
  site "$np" 1 "$out" "$@"
  both_end $p0 $pid
}

case $case_name in
same)
  for mode in allreduce dilocox; do
    flags=("${common[@]}" --stages 2 --micro-batches 2 --sync "$mode")
    mpi 4 "$train" "${flags[@]}" >one_$mode.txt
    sites 2 sites_$mode "${flags[@]}"
    [[ $r0 == 0 && $r1 == 0 ]] || fail "$mode: the sites exited $r0 $r1: $(cat sites_$mode.*.err)"
    for key in final_eval_loss wire_bytes syncs replicas_identical steps; do
      want=$(field $key one_$mode.txt)
      [[ -n $want ]] || fail "$mode: no $key in one mpirun's summary: $(cat one_$mode.txt)"
      for s in 0 1; do
        got=$(field $key sites_$mode.$s.txt)
        [[ $got == "$want" ]] || fail "$mode: site $s $key $got, one mpirun $want"
      done
    done
    echo "ok: $mode: 2 sites x 2 stages = one mpirun: final eval loss $(field final_eval_loss one_$mode.txt)," \
         "wire $(field wire_bytes one_$mode.txt) bytes, replicas identical"
  done
  ;;
faults)
  flags=("${common[@]}" --sync dilocox --tokens 4000000)
  # Site 1 killed (SIGKILL to its mpirun) once both train: site 0 ends with Gloo's reason.
  new_run
  site 1 0 k "${flags[@]}"
  p0=$pid
  site 1 1 k "${flags[@]}"
  p1=$pid
  sleep 4
  kill -0 $p0 && kill -0 $p1 || fail "a site ended early: $(cat k.*.err)"
  t0=$(date +%s.%N)
  pkill -KILL -P $p1 || true
  kill -KILL $p1 || true
  rc=0
  wait $p0 || rc=$?
  took=$(echo "$(date +%s.%N) - $t0" | bc)
  [[ $rc != 0 ]] || fail "site 0 exited 0 after site 1 died"
  grep -q 'GlooCommunicator' k.0.err || fail "site 0's message does not name Gloo: $(cat k.0.err)"
  awk -v t="$took" 'BEGIN { exit !(t < 15) }' || fail "site 0 took $took s to end"
  echo "ok: site 1 killed: site 0 exited $rc after ${took% *} s: $(grep -m1 Gloo k.0.err | cut -c1-160)"
  # Another --lr on site 1: both sites refuse, naming the flag.
  new_run
  site 1 0 d "${common[@]}" --sync dilocox
  p0=$pid
  site 1 1 d "${common[@]}" --sync dilocox --lr 1e-3
  both_end $p0 $pid
  [[ $r0 == 2 && $r1 == 2 ]] || fail "another --lr on site 1: exits $r0 $r1: $(cat d.*.err)"
  for s in 0 1; do grep -q 'flags differ.*--lr' d.$s.err || fail "site $s: $(cat d.$s.err)"; done
  echo "ok: another --lr on site 1: both exit 2: $(cut -c1-140 d.0.err)"
  # Sites with different rank counts: refused by both.
  new_run
  site 1 0 n "${common[@]}" --sync allreduce
  p0=$pid
  site 2 1 n "${common[@]}" --sync allreduce --stages 2 --micro-batches 2
  both_end $p0 $pid
  [[ $r0 != 0 && $r1 != 0 ]] || fail "1 and 2 ranks: exits $r0 $r1"
  grep -q 'same ranks' n.0.err || fail "site 0: $(cat n.0.err)"
  echo "ok: sites of 1 and 2 ranks: exits $r0 $r1: $(cut -c1-140 n.0.err)"
  # The site flags among themselves.
  el="--site 0 --run-id x --rendezvous file://$work"
  for bad in "--site 2" "--site 0 --clusters 1" "--site 0 --run-id x" "--site 0 --rendezvous file://$work" "--rendezvous file://$work" \
             "--elastic 2" "$el --elastic 3" "$el --elastic 2 --stages 2" "$el --elastic 2 --sync allreduce"; do
    rc=0
    "$train" "${common[@]}" $bad >b.txt 2>b.err || rc=$?
    [[ $rc == 2 && $(wc -l <b.err) == 1 ]] || fail "'$bad': exit $rc, $(cat b.err)"
    echo "ok: $bad -> $(cat b.err)"
  done
  ;;
resume)
  flags=("${common[@]}" --sync dilocox)
  mpi 2 "$train" "${flags[@]}" >one.txt
  sites 1 a "${flags[@]}" --checkpoint-dir ck --stop-after 10
  [[ $r0 == 0 && $r1 == 0 ]] || fail "the stopped sites exited $r0 $r1: $(cat a.*.err)"
  [[ $(field steps a.0.txt) == 10 ]] || fail "the stopped run did not stop at step 10: $(cat a.0.txt)"
  sites 1 b "${flags[@]}" --checkpoint-dir ck --resume
  [[ $r0 == 0 && $r1 == 0 ]] || fail "the resumed sites exited $r0 $r1: $(cat b.*.err)"
  for key in final_eval_loss wire_bytes syncs replicas_identical steps; do
    want=$(field $key one.txt)
    for s in 0 1; do
      got=$(field $key b.$s.txt)
      [[ $got == "$want" ]] || fail "resumed site $s $key $got, one uninterrupted mpirun $want"
    done
  done
  echo "ok: 2 sites stopped at step 10 and resumed = one uninterrupted mpirun: final eval loss" \
       "$(field final_eval_loss one.txt), wire $(field wire_bytes one.txt) bytes"
  # The same run id again: the store holds its keys; both sites refuse, saying so.
  site_flags=(--rendezvous "file://$work/store$run" --run-id "t$run" --gloo-interface lo)
  site 1 0 c "${flags[@]}" --checkpoint-dir ck2
  p0=$pid
  site 1 1 c "${flags[@]}" --checkpoint-dir ck2
  both_end $p0 $pid
  [[ $r0 != 0 && $r1 != 0 ]] || fail "a relaunch under the same run id: exits $r0 $r1"
  for s in 0 1; do grep -q 'needs a new --run-id' c.$s.err || fail "site $s: $(cat c.$s.err)"; done
  echo "ok: a relaunch under the same --run-id: exits $r0 $r1: $(head -1 c.0.err | cut -c1-160)"
  ;;
elastic)
  flags=(--model tiny --vocab 64 --data-dir data --batch 4 --seq-len 32 --eval-every 25 --eval-sequences 8 --quiet
         --local-steps 3 --lr 3e-3 --collective-timeout 10 --clusters 4 --tokens 300000 --sync dilocox --no-overlap
         --wan-bandwidth 4Mbps --elastic 3)
  # wait_for FILE PATTERN SECONDS: until the pattern is in the file.
  wait_for() {
    for _ in $(seq $(($3 * 10))); do
      grep -q "$2" "$1" 2>/dev/null && return 0
      sleep 0.1
    done
    fail "no '$2' in $1 within $3 s: $(cat "$work"/*.err)"
  }
  if [[ -n ${DILOCOX_ELASTIC_REFERENCE:-} ]]; then  # the same sites without faults (scripts/elastic_curve.sh)
    new_run
    for s in 0 1 2; do site 1 $s ref "${flags[@]}" --metrics ref$s.jsonl; eval "ref$s=$pid"; done
    for s in 0 1 2; do ref=ref$s; wait "${!ref}" || fail "fault-free site $s: $(cat ref.$s.err)"; done
  fi
  new_run
  for s in 0 1 2; do site 1 $s el "${flags[@]}" --metrics el$s.jsonl; eval "el$s=$pid"; done
  wait_for el0.jsonl '"step":60,' 60
  pkill -KILL -P "$el1" || true
  kill -KILL "$el1" || true
  wait_for el0.jsonl '"event":"lost"' 30
  echo "ok: site 1 killed: $(grep -m1 -o '"event":"lost".*"waited_seconds":[0-9.]*' el0.jsonl | cut -c1-220)"
  site 1 1 back "${flags[@]}"
  back=$pid
  site 1 3 bad "${flags[@]}" --lr 1e-3
  bad=$pid
  rc=0
  wait "$bad" || rc=$?
  [[ $rc != 0 ]] && grep -q 'refused by the run.s sites: its configuration differs.*--lr' bad.3.err ||
    fail "a site with another --lr: exit $rc: $(cat bad.3.err)"
  echo "ok: another --lr: $(grep -o 'refused.*' bad.3.err | cut -c1-160)"
  site 1 3 new "${flags[@]}"
  new=$pid
  wait_for el0.jsonl '"event":"change".*"sites":\[0,1,2,3\]' 60
  pkill -USR1 -P "$el2"  # to its mpirun, which forwards SIGUSR1 to its rank (stop_signals.hpp)
  for p in el0 back new el2; do wait "${!p}" || fail "$p exited $?: $(cat ./*.err)"; done
  grep -q '"left":true' el.2.txt || fail "site 2 did not leave: $(cat el.2.txt)"
  want=$(field final_eval_loss el.0.txt)
  for out in back.1.txt new.3.txt; do
    [[ $(field final_eval_loss $out) == "$want" && $(field replicas_identical $out) == true ]] ||
      fail "$out: $(cat $out) against site 0's $want"
  done
  waited=$(grep -m1 -o '"waited_seconds":[0-9.]*' el0.jsonl | cut -d: -f2)
  awk -v w="$waited" 'BEGIN { exit !(w < 8) }' || fail "site 0 waited $waited s after the kill"
  echo "ok: sites 0, 1 (rejoined), 3 (new) end identical: final eval loss $want" \
       "${DILOCOX_ELASTIC_REFERENCE:+(fault-free run: $(field final_eval_loss ref.0.txt)) }site 0 waited $waited s" \
       "after the kill; site 2 left on SIGUSR1"
  ;;
*) fail "unknown case $case_name" ;;
esac
