#!/usr/bin/env bash
# Chaos test of dilocox-train (issue 13): a 2 clusters x 2 stages `tiny` run takes at
# least FAULTS faults at random moments (a random number of logged steps into each
# attempt; the seed is printed and DILOCOX_CHAOS_SEED replays the order and moments),
# mixed from: kill -9 of a rank, SIGTERM to mpirun, SIGTERM to one rank, kill -9 of a rank
# while a checkpoint is being written (a .ckpt.tmp exists, or some ranks' files of the
# step are written and others not). After each, the run resumes. At the end the
# summary's eval loss equals the uninterrupted run's to the last digit, the metrics hold
# every step once with the uninterrupted losses, and no temporary file is left.
#   chaos_test.sh TRAIN SHARDS WORKDIR MPIEXEC [FAULTS]
set -euo pipefail
trap 'echo "FAIL: line $LINENO: \`$BASH_COMMAND\` exited $?" >&2' ERR
source "$(dirname "$0")/process_helpers.sh"  # before the cd: $0 may be relative
train=$1 shards=$2 work=$3 mpiexec=$4 faults=${5:-6}
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$shards" data
last_step() { grep '"type":"step"' "$1" 2>/dev/null | tail -1 | grep -o '"step":[0-9]*' | cut -d: -f2 || true; }
prefixes=(stage0of2-replica0of2 stage1of2-replica0of2 stage0of2-replica1of2 stage1of2-replica1of2)
# Open MPI's default grace (SIGTERM 1 s after mpirun's, SIGKILL 1 s later): a `tiny` step
# and its save take milliseconds. (A longer grace would let this short run finish first.)
mpi=("$mpiexec" --oversubscribe --allow-run-as-root -n 4)
flags=(--model tiny --vocab 64 --data-dir data --batch 4 --seq-len 32 --eval-sequences 8 --quiet --clusters 2
       --stages 2 --micro-batches 2 --local-steps 3 --lr 3e-3 --tokens 409600 --eval-every 400)
# Long enough for every fault to land before the end: after SIGTERM to mpirun the ranks
# go on until Open MPI forwards it (~150 steps of `tiny` in 2 s), and an attempt that
# resumes near the end finishes before its fault.
total=1600

seed=${DILOCOX_CHAOS_SEED:-$(( $(date +%s) % 100000 ))}
echo "chaos seed $seed (replay: DILOCOX_CHAOS_SEED=$seed)"
RANDOM=$seed
kinds=(kill9_rank term_mpirun term_rank kill_during_write)
plan=("${kinds[@]}")
while [[ ${#plan[@]} -lt $faults ]]; do plan+=("${kinds[RANDOM % 4]}"); done
for ((i = ${#plan[@]} - 1; i > 0; i--)); do j=$((RANDOM % (i + 1))); t=${plan[i]}; plan[i]=${plan[j]}; plan[j]=$t; done

t_all=$(now)
"${mpi[@]}" "$train" "${flags[@]}" --metrics straight.jsonl >straight.txt
want=$(field final_eval_loss straight.txt)
echo "uninterrupted: final_eval_loss $want ($(since "$t_all") s)"

# A save in progress: a temporary file, or the newest step's files on some ranks only.
mid_save() {
  compgen -G 'ck/*.ckpt.tmp' >/dev/null && { echo tmp; return 0; }
  local newest have=0 p
  newest=$({ ls ck 2>/dev/null || true; } | sed -n 's/.*-step\([0-9]*\)\.ckpt$/\1/p' | sort -n | tail -1)
  [[ -n $newest ]] || return 1
  for p in "${prefixes[@]}"; do [[ -e ck/$p-step$newest.ckpt ]] && have=$((have + 1)); done
  [[ $have -lt 4 ]] && { echo "$have/4 files of step $((10#$newest))"; return 0; }
  return 1
}

printf '%-3s %-18s %-10s %-6s %-8s %-10s %s\n' '#' fault at_step rc exit_s ckpt_step note
rm -f m.jsonl
resume=()
done_faults=0
for kind in "${plan[@]}"; do
  every=10
  [[ $kind == kill_during_write ]] && every=1
  before=$(last_step m.jsonl)
  before=${before:-0}
  if [[ $before -ge $((total - 60)) ]]; then  # too few steps left to land a fault
    echo "stopping the faults at step $before of $total"
    break
  fi
  "${mpi[@]}" "$train" "${flags[@]}" --checkpoint-dir ck --checkpoint-every $every --metrics m.jsonl "${resume[@]}" \
    >out.txt 2>err.txt &
  pid=$!
  wait_for=$((before + 3 + RANDOM % 40))
  note=""
  for _ in $(seq 1 3000); do
    s=$(last_step m.jsonl)
    [[ -n $s && $s -ge $wait_for ]] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.02
  done
  # The trainer's own lines first: Open MPI's footer says only which rank exited.
  kill -0 $pid 2>/dev/null ||
    fail "attempt $((done_faults + 1)) ended before its fault: $(grep '^dilocox-train' err.txt || tail -3 err.txt) $(cat out.txt)"
  if [[ $kind == kill_during_write ]]; then
    for _ in $(seq 1 20000); do note=$(mid_save) && break; done
    [[ -n $note ]] || note="no save caught in progress"
  fi
  at=$(last_step m.jsonl)
  victim=$((RANDOM % 4))
  t0=$(now)
  case $kind in
    kill9_rank | kill_during_write) kill -9 "$(rank_pid $pid $victim)"; note="rank $victim; $note" ;;
    term_mpirun) kill -TERM $pid ;;
    term_rank) kill -TERM "$(rank_pid $pid $victim)"; note="rank $victim" ;;
  esac
  wait_gone $pid 30 || fail "$kind: mpirun still running 30 s later"
  rc=0
  wait $pid || rc=$?
  took=$(since "$t0")
  ckpt=$(newest_step ck stage0of2-replica0of2)
  common=$ckpt
  for p in "${prefixes[@]}"; do
    n=$(newest_step ck $p)
    [[ -n $n && -n $common && $n -lt $common ]] && common=$n
    [[ -n $n ]] || common=""
  done
  if [[ $kind == term_mpirun || $kind == term_rank ]]; then
    [[ -n $common && $common -ge $at ]] || fail "$kind at step $at: newest checkpoint on every rank ${common:-none}"
    [[ $kind == term_mpirun || $rc == 0 ]] || fail "$kind: exit $rc: $(tail -3 err.txt)"
  fi
  done_faults=$((done_faults + 1))
  printf '%-3s %-18s %-10s %-6s %-8s %-10s %s\n' $done_faults $kind "$at" $rc "$took" "${common:-none}" "$note"
  resume=(--resume-if-present)  # a fault before the first save leaves nothing: start over, as a scheduler would
done

t0=$(now)
"${mpi[@]}" "$train" "${flags[@]}" --checkpoint-dir ck --checkpoint-every 10 --metrics m.jsonl --resume-if-present >final.txt 2>err.txt
got=$(field final_eval_loss final.txt)
echo "resumed to the end in $(since "$t0") s: final_eval_loss $got"
[[ $got == "$want" ]] || fail "final eval loss $got, uninterrupted $want"
steps=$(grep '"type":"step"' m.jsonl | grep -o '"step":[0-9]*' | cut -d: -f2)
[[ $(sort -n <<<"$steps" | uniq -d | wc -l) == 0 ]] || fail "steps logged twice: $(sort -n <<<"$steps" | uniq -d | head -5)"
[[ $(wc -l <<<"$steps") == $total ]] || fail "$(wc -l <<<"$steps") step lines, expected $total"
diff <(grep -o '"loss":[^,]*' straight.jsonl) <(grep -o '"loss":[^,]*' m.jsonl) >/dev/null ||
  fail "the step losses differ from the uninterrupted run's"
[[ -z $(ls ck | grep '\.tmp$' || true) ]] || fail "temporary files left: $(ls ck | grep '\.tmp$')"
[[ $done_faults -ge 5 ]] || fail "only $done_faults faults"
echo "ok: $done_faults faults (seed $seed), final_eval_loss $got equals the uninterrupted run's; steps 1..$total once each" \
  "with the uninterrupted losses; no temporary file left; $(since "$t_all") s in all"
