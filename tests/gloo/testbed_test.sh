#!/usr/bin/env bash
# The WAN testbed (scripts/wan_testbed.sh) with GlooCommunicator: 2 sites in their own
# network namespaces, uplinks shaped to 20 Mbit/s, meeting through redis-server in a
# third. (1) A 4 MB allreduce takes the link model's time within -10%/+35% (measured
# +12% to +23%: Ethernet framing and the acknowledgements share the uplink); (2) a site
# killed mid-run is an error at the other naming the operation within 5 s, far inside its
# 60 s timeout; (3) `down` leaves nothing.
# Exit 77 (ctest: skipped) with the reason where namespaces are not permitted.
#   tests/gloo/testbed_test.sh PROBE
set -euo pipefail
probe=$1
testbed="$(cd "$(dirname "$0")/../.." && pwd)/scripts/wan_testbed.sh"
name="t$((RANDOM % 10000))"
out=$(mktemp -d)

if [[ $(id -u) -ne 0 ]] || ! ip netns add "$name-try" 2>/dev/null; then
  echo "SKIP: network namespaces are not permitted here (needs root and iproute2)"; exit 77
fi
ip netns del "$name-try"
command -v redis-server >/dev/null || { echo "SKIP: redis-server not installed (scripts/install_deps.sh --sites)"; exit 77; }
trap '"$testbed" down --name "$name"; rm -rf "$out"' EXIT

"$testbed" up --sites 2 --rate 20mbit --name "$name"

# (1) Shaped allreduce against the model.
for i in 0 1; do
  "$testbed" run "$i" --name "$name" -- "$probe" --prefix rate --bytes 4000000 --repeats 3 --rate-bps 20e6 \
    > "$out/rate$i" 2>&1 &
done
wait
cat "$out/rate0" "$out/rate1"
for i in 0 1; do
  read -r measured model < <(sed -n 's/.*median_s=\([0-9.]*\).*model_s=\([0-9.]*\).*/\1 \2/p' "$out/rate$i")
  [[ -n ${measured:-} ]] || { echo "FAIL: site $i printed no measurement"; exit 1; }
  awk -v m="$measured" -v p="$model" 'BEGIN { r = m / p; printf "site ratio measured/model %.3f\n", r; exit !(r >= 0.9 && r <= 1.35) }' ||
    { echo "FAIL: site $i measured ${measured} s against the model's ${model} s"; exit 1; }
done

# (2) Site 1 killed mid-run: site 0 fails with an Error, not a hang.
"$testbed" run 0 --name "$name" -- "$probe" --prefix kill --bytes 4000000 --repeats 50 --timeout-ms 60000 \
  > "$out/kill0" 2>&1 &
survivor=$!
"$testbed" run 1 --name "$name" -- "$probe" --prefix kill --bytes 4000000 --repeats 50 --timeout-ms 60000 \
  > "$out/kill1" 2>&1 &
victim=$!
sleep 3
kill -9 "$victim"
start=$SECONDS
rc=0
wait "$survivor" || rc=$?
cat "$out/kill0"
((rc != 0)) || { echo "FAIL: site 0 finished although site 1 died"; exit 1; }
grep -q "GlooCommunicator::allreduce_sum" "$out/kill0" || { echo "FAIL: site 0's error does not name the operation"; exit 1; }
((SECONDS - start <= 5)) || { echo "FAIL: site 0 took $((SECONDS - start)) s to notice (timeout 60 s)"; exit 1; }
echo "site 0 noticed after $((SECONDS - start)) s"

# (3) Nothing left behind.
"$testbed" down --name "$name"
"$testbed" check --name "$name"
echo "PASS testbed"
