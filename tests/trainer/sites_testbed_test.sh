#!/usr/bin/env bash
# dilocox-train's sites in the WAN testbed (scripts/wan_testbed.sh): K = 3 sites of `tiny`,
# DiLoCoX, each its own mpirun in its own network namespace (uplink shaped by tbf), meeting
# through redis-server in another. (a) No fault: the final eval loss of one mpirun of the
# same flags. (d) redis-server restarted (empty) mid-run: the run goes on to the same end,
# since the store is used only to meet. (b, c) Elastic sites (--elastic 3 of 4): site 1's
# mpirun killed mid-run and started again, a fourth site joining, then the store
# restarted: the sites that finish hold identical global parameters; the final loss beside
# the same run's without faults.
# Exit 77 (ctest: skipped) with the reason where namespaces are not permitted.
#   sites_testbed_test.sh TRAIN SHARDS WORKDIR MPIEXEC
set -euo pipefail
train=$1 shards=$2 work=$3 mpiexec=$4
testbed="$(cd "$(dirname "$0")/../.." && pwd)/scripts/wan_testbed.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }
if [[ $(id -u) -ne 0 ]] || ! ip netns add "sbt-try" 2>/dev/null; then
  echo "SKIP: network namespaces are not permitted here (needs root and iproute2)"; exit 77
fi
ip netns del sbt-try
command -v redis-server >/dev/null || { echo "SKIP: redis-server not installed (scripts/install_deps.sh --sites)"; exit 77; }
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$shards" data
name="s$((RANDOM % 10000))"
trap '"$testbed" down --name "$name"' EXIT
"$testbed" up --sites 4 --rate 100mbit --name "$name"
field() { grep -m1 -o "\"$1\":[^,}]*" "$2" | sed -n '1s/^[^:]*://p'; }
flags=(--model tiny --vocab 64 --data-dir "$work/data" --batch 4 --seq-len 32 --eval-every 0 --eval-sequences 8
       --quiet --clusters 3 --sync dilocox --local-steps 3 --lr 3e-3 --collective-timeout 20 --wan-bandwidth 1Tbps)
# The 3 sites of run ID in the testbed, each mpirun -np 1 (no binding: 3 sites share the
# cores); OUT.I.txt, OUT.I.err; waits for them, exit codes in `codes`.
start_site() {  # start_site I ID OUT FLAGS...: site I in the background, its pid in `pid`
  local s=$1 id=$2 out=$3
  shift 3
  "$testbed" run "$s" --name "$name" -- bash -c 'exec "$0" -np 1 --bind-to none --allow-run-as-root "$@" \
    --site $DILOCOX_SITE --rendezvous $DILOCOX_RENDEZVOUS --gloo-interface eth0' \
    "$mpiexec" "$train" "${flags[@]}" "$@" --run-id "$id" >"$out.$s.txt" 2>"$out.$s.err" &
  pid=$!
}
start_sites() {
  local id=$1 out=$2
  shift 2
  pids=()
  for s in 0 1 2; do
    start_site $s "$id" "$out" "$@"
    pids+=("$pid")
  done
}
wait_sites() {
  codes=()
  for p in "${pids[@]}"; do
    local r=0
    wait "$p" || r=$?
    codes+=("$r")
  done
}

# (a) Three sites against one mpirun.
"$mpiexec" -n 3 --oversubscribe --allow-run-as-root "$train" "${flags[@]}" --tokens 6144 >one.txt
start_sites a-$name a --tokens 6144
wait_sites
[[ ${codes[*]} == "0 0 0" ]] || fail "(a) the sites exited ${codes[*]}: $(cat a.*.err)"
want=$(field final_eval_loss one.txt)
for s in 0 1 2; do
  got=$(field final_eval_loss a.$s.txt)
  [[ $got == "$want" ]] || fail "(a) site $s final eval loss $got, one mpirun $want"
  [[ $(field replicas_identical a.$s.txt) == true ]] || fail "(a) site $s: replicas differ"
done
echo "ok: (a) 3 sites in the testbed = one mpirun: final eval loss $want on every site"

# (d) The store restarted while the sites train: once site 0 has logged its first steps, and
# with every site still running after the restart.
"$mpiexec" -n 3 --oversubscribe --allow-run-as-root "$train" "${flags[@]}" --tokens 300000 >one_long.txt
start_sites d-$name d --tokens 300000 --metrics "$work/d.metrics"
for _ in $(seq 200); do
  [[ $(grep -c '"type":"step"' "$work/d.metrics" 2>/dev/null) -ge 5 ]] && break
  sleep 0.1
done
"$testbed" restart-store --name "$name"
for p in "${pids[@]}"; do kill -0 "$p" || fail "(d) a site ended before the store had restarted: $(cat d.*.err)"; done
wait_sites
[[ ${codes[*]} == "0 0 0" ]] || fail "(d) after the store restarted the sites exited ${codes[*]}: $(cat d.*.err)"
want=$(field final_eval_loss one_long.txt)
for s in 0 1 2; do
  [[ $(field final_eval_loss d.$s.txt) == "$want" ]] || fail "(d) site $s: $(field final_eval_loss d.$s.txt), not $want"
done
echo "ok: (d) redis-server restarted mid-run: every site finished, final eval loss $want as one mpirun's"

# (b, c) Elastic sites: site 1 killed once site 0 has logged 40 steps, started again once
# site 0 has logged the loss; site 3 joins after that; then redis-server is restarted
# (empty), which the run goes on through. Rounds paced by a modelled 4 Mbit/s.
elastic=(--clusters 4 --elastic 3 --no-overlap --wan-bandwidth 4Mbps --tokens 150000)
wait_for() {  # wait_for FILE PATTERN: 60 s at most
  for _ in $(seq 600); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "(b) no '$2' in $1: $(cat ./*.err)"
}
start_sites r-$name r "${elastic[@]}"
wait_sites
[[ ${codes[*]} == "0 0 0" ]] || fail "(b) the fault-free elastic sites exited ${codes[*]}: $(cat r.*.err)"
start_sites b-$name b "${elastic[@]}" --metrics "$work/b.metrics"
wait_for "$work/b.metrics" '"step":40,'
pkill -KILL -f -- "--run-id b-$name --site 1 " || true
wait_for "$work/b.metrics" '"event":"lost"'
start_site 1 b-$name back "${elastic[@]}"
back=$pid
start_site 3 b-$name new "${elastic[@]}"
new=$pid
wait_for "$work/b.metrics" '"event":"change".*"sites":\[0,1,2,3\]'
"$testbed" restart-store --name "$name"  # the membership's history is gone: the run goes on
for p in "${pids[@]::1}" "${pids[@]:2}" "$back" "$new"; do wait "$p" || fail "(b) a site exited $?: $(cat b.*.err back.*.err new.*.err)"; done
want=$(field final_eval_loss b.0.txt)
for out in b.2.txt back.1.txt new.3.txt; do
  [[ $(field final_eval_loss $out) == "$want" && $(field replicas_identical $out) == true ]] || fail "(b) $out: $(cat $out)"
done
echo "ok: (b, c) elastic: site 1 killed and rejoined, site 3 joined, the store restarted:" \
     "final eval loss $want on sites 0, 1, 2, 3" \
     "(without faults: $(field final_eval_loss r.0.txt)); site 0 waited" \
     "$(grep -m1 -o '"waited_seconds":[0-9.]*' "$work/b.metrics" | cut -d: -f2) s after the kill"
"$testbed" down --name "$name"
"$testbed" check --name "$name"
trap - EXIT
echo "ok: the testbed is gone"
