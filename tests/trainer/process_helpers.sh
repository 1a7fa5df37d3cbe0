# tests/trainer/process_helpers.sh: shell helpers of the fault tests (sourced by
# faults_test.sh and chaos_test.sh): failing, reading summary fields, timing, waiting for
# a process, finding a rank's process under mpirun, waiting for its ranks' signal handlers,
# and the newest checkpoint step.
fail() { echo "FAIL: $*" >&2; exit 1; }
# field NAME FILE: the value of "NAME" in the first JSON line of FILE that has it.
field() { grep -m1 -o "\"$1\":[^,}]*" "$2" | sed -n '1s/^[^:]*://p'; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
# wait_gone PID SECONDS: until the process is gone (polled every 50 ms); 1 if it is not.
wait_gone() {
  local i
  for ((i = 0; i < $2 * 20; i++)); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.05; done
  return 1
}
# ranks MPIRUN_PID: mpirun's children, the processes of its ranks.
ranks() { pgrep -P "$1" || true; }
# rank_pid MPIRUN_PID RANK: the pid of that world rank among mpirun's children.
rank_pid() {
  local p
  for p in $(ranks "$1"); do grep -qz "^OMPI_COMM_WORLD_RANK=$2\$" "/proc/$p/environ" 2>/dev/null && echo "$p"; done
  return 0
}
# wait_handlers MPIRUN_PID N SIGNAL SECONDS: until N of mpirun's children catch SIGNAL (a
# number; the SigCgt mask of /proc/PID/status), i.e. their programs have reached main;
# 1 if not within SECONDS.
wait_handlers() {
  local i p mask caught
  for ((i = 0; i < $4 * 20; i++)); do
    caught=0
    for p in $(ranks "$1"); do
      mask=$(sed -n 's/^SigCgt:\s*//p' "/proc/$p/status" 2>/dev/null || true)
      [[ -n $mask ]] && (((0x$mask >> ($3 - 1)) & 1)) && caught=$((caught + 1))
    done
    ((caught >= $2)) && return 0
    sleep 0.05
  done
  return 1
}
# newest_step DIR PREFIX: the step of the newest complete checkpoint of PREFIX in DIR.
newest_step() { { ls "$1" 2>/dev/null || true; } | sed -n "s/^$2-step0*\([0-9][0-9]*\)\.ckpt\$/\1/p" | sort -n | tail -1; }
