#!/usr/bin/env bash
# The elastic run's loss curve beside the fault-free one: runs ctest sites.elastic in
# BUILD (3 sites of 4, site 1 killed and restarted, a new site 3, site 2 leaving; and the
# same 3 sites without faults), then plots site 0's eval loss of both runs with the
# membership events marked, to OUT (default docs/img/elastic_loss.png), and prints them.
#   scripts/elastic_curve.sh [BUILD] [OUT]
set -euo pipefail
build=${1:-build}
out=${2:-docs/img/elastic_loss.png}
DILOCOX_ELASTIC_REFERENCE=1 ctest --test-dir "$build" -R '^sites\.elastic$' --output-on-failure |
  grep -E '^ok|Passed|Failed' || true
work=$build/tests/trainer/sites_elastic
[[ -s $work/el0.jsonl && -s $work/ref0.jsonl ]] || { echo "elastic_curve: no metrics in $work" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 - "$work" "$tmp" <<'PY'
import json, sys
work, tmp = sys.argv[1], sys.argv[2]
for name in ("ref0", "el0"):
    with open(f"{work}/{name}.jsonl") as f, open(f"{tmp}/{name}.dat", "w") as d, open(f"{tmp}/{name}.events", "w") as e:
        for line in f:
            m = json.loads(line)
            if m.get("type") == "eval":
                d.write(f"{m['step']} {m['eval_loss']}\n")
            if m.get("type") == "membership":
                sites = ",".join(str(s) for s in m["sites"])
                e.write(f"{m['step']} {m['event']} {{{sites}}} {m['waited_seconds']:.2f}\n")
PY
echo "membership events at site 0 (step, event, sites after it, seconds waited):"
cat "$tmp/el0.events"
echo "eval loss at site 0 (step, fault-free, elastic):"
join "$tmp/ref0.dat" "$tmp/el0.dat"
if command -v gnuplot >/dev/null; then
  arrows=$(awk '{ printf "set arrow from %d, graph 0 to %d, graph 1 nohead dt 2 lc rgb \"gray\"; set label \"%s %s\" at %d, graph 0.95 rotate by 90 right font \",8\";\n", $1, $1, $2, $3, $1 + 3 }' "$tmp/el0.events")
  gnuplot <<GP
set terminal pngcairo size 900,500 noenhanced
set output "$out"
set xlabel "step"
set ylabel "eval loss (site 0, global model)"
set yrange [:0.8]
set title "dilocox-train --elastic: 3 sites of tiny, DiLoCoX without overlap"
$arrows
plot "$tmp/ref0.dat" with linespoints title "fault-free", "$tmp/el0.dat" with linespoints title "elastic (events dashed)"
GP
  echo "elastic_curve: $out"
fi
