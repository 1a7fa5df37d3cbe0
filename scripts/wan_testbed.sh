#!/usr/bin/env bash
# wan_testbed.sh: sites as separate hosts on one machine. One network namespace per site
# and one for the rendezvous store (redis-server), each joined by a veth pair to a bridge
# in a hub namespace; each site's uplink (its veth's egress) is shaped with tc tbf, so
# the rate is the site's link, shared by every process of the site. Needs root (network
# namespaces), iproute2 and redis-server (scripts/install_deps.sh --sites).
#
#   scripts/wan_testbed.sh up --sites K [--rate 10mbit] [--name dx]
#   scripts/wan_testbed.sh run SITE [--name dx] -- COMMAND...   (in site SITE's namespace)
#   scripts/wan_testbed.sh down [--name dx]                      (also after a failure)
#   scripts/wan_testbed.sh check [--name dx]                     (exit 0 when nothing is left)
#   scripts/wan_testbed.sh restart-store [--name dx]             (redis-server stopped, started empty)
#
# Addresses: the store 10.88.0.2, site i 10.88.0.(10 + i). `run` exports DILOCOX_SITE,
# DILOCOX_SITES, DILOCOX_RENDEZVOUS (redis://10.88.0.2:6379) and DILOCOX_SITE_ADDR. `up`
# tears down what it built when a step fails; `down` kills every process left in the
# namespaces, deletes them and leaves nothing behind (`check` verifies).
set -euo pipefail

usage() { sed -n '8,12p' "$0" | sed 's/^#   //' >&2; exit 2; }
die() { echo "wan_testbed: $*" >&2; exit 1; }

cmd=${1:-}; [[ -n $cmd ]] || usage; shift
name=dx sites=0 rate=10mbit site=""
[[ $cmd == run ]] && { site=${1:-}; [[ -n $site ]] || usage; shift; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --sites) sites=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
[[ $name =~ ^[a-z][a-z0-9]{0,5}$ ]] || die "--name must be 1-6 lowercase letters or digits, starting with a letter"
state=/run/dilocox-testbed-$name
store_addr=10.88.0.2 port=6379

namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$name-(hub|store|site[0-9]+)$" || true; }

down() {
  local ns
  for ns in $(namespaces); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  done
  for ns in $(namespaces); do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$state"
}

check() {
  local left
  left=$(namespaces)
  [[ -z $left ]] || die "namespaces left: $(echo $left)"
  [[ ! -e $state ]] || die "state left: $state"
}

up() {
  [[ $sites =~ ^[0-9]+$ && $sites -ge 1 && $sites -le 50 ]] || die "--sites must be 1-50"
  [[ $rate =~ ^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit)$ ]] || die "--rate must look like 10mbit (tc units: bit, kbit, mbit, gbit)"
  command -v redis-server >/dev/null || die "redis-server not found (scripts/install_deps.sh --sites)"
  [[ -z $(namespaces) ]] || die "a testbed named '$name' is up already ('$0 down --name $name')"
  trap 'echo "wan_testbed: setup failed; tearing down" >&2; down' ERR
  mkdir -p "$state"
  echo "$sites" > "$state/sites"
  ip netns add "$name-hub"
  ip -n "$name-hub" link add br0 type bridge
  ip -n "$name-hub" link set br0 up
  join "$name-store" "$store_addr" v0
  local i
  for ((i = 0; i < sites; i++)); do
    join "$name-site$i" "10.88.0.$((10 + i))" "v$((i + 1))"
    # The uplink: what the site sends, all its processes together.
    ip netns exec "$name-site$i" tc qdisc add dev eth0 root tbf rate "$rate" burst 32kbit latency 400ms
  done
  start_store
  trap - ERR
  echo "wan_testbed: $sites sites up ('$name'), uplinks $rate, store redis://$store_addr:$port"
}

# redis-server in the store's namespace, empty; returns once site 0 reaches it.
start_store() {
  ip netns exec "$name-store" redis-server --bind "$store_addr" --port "$port" --save "" --appendonly no \
    --protected-mode no --daemonize yes --pidfile "$state/redis.pid" --logfile "$state/redis.log" >/dev/null
  local i
  for ((i = 0; i < 100; i++)); do
    ip netns exec "$name-site0" bash -c "exec 3<>/dev/tcp/$store_addr/$port" 2>/dev/null && return 0
    sleep 0.05
  done
  cat "$state/redis.log" >&2 || true
  false
}

restart_store() {
  [[ -f $state/sites ]] || die "no testbed named '$name' is up"
  local pid
  pid=$(cat "$state/redis.pid")
  kill "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  start_store || die "redis-server did not come back"
  echo "wan_testbed: store restarted (empty)"
}

# join NS ADDR HUBSIDE: namespace NS with eth0 at ADDR/24, its veth peer HUBSIDE on the bridge.
join() {
  ip netns add "$1"
  ip -n "$1" link set lo up
  ip link add "$name$3" netns "$name-hub" type veth peer name eth0 netns "$1"
  ip -n "$1" addr add "$2/24" dev eth0
  ip -n "$1" link set eth0 up
  ip -n "$name-hub" link set "$name$3" master br0
  ip -n "$name-hub" link set "$name$3" up
}

run() {
  [[ -f $state/sites ]] || die "no testbed named '$name' is up"
  local k; k=$(cat "$state/sites")
  [[ $site =~ ^[0-9]+$ && $site -lt $k ]] || die "site must be 0..$((k - 1)), got '$site'"
  [[ $# -gt 0 ]] || usage
  exec ip netns exec "$name-site$site" env DILOCOX_SITE="$site" DILOCOX_SITES="$k" \
    DILOCOX_RENDEZVOUS="redis://$store_addr:$port" DILOCOX_SITE_ADDR="10.88.0.$((10 + site))" "$@"
}

case $cmd in
  up) up ;;
  down) down ;;
  check) check ;;
  run) run "$@" ;;
  restart-store) restart_store ;;
  *) usage ;;
esac
