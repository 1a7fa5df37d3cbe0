#!/usr/bin/env bash
# dilocox-train under faults and bad input (issue 13), one case per ctest test:
#   faults_test.sh CASE TRAIN SHARDS WORKDIR [MPIEXEC]
# CASE: refusals | diverge | resume_refusals | metrics | first_save | agreement | watchdog | stop,
# and what an operator meets: pause | stuck_io | folder_lock | resume_nothing | metrics_lost |
# startup_stop | folder_checks.
# Multi-rank cases give ranks different flags with a two-part launch (mpirun A : B) and
# put a deadline on every launch (a hang fails the case instead of the ctest timeout).
# Each prints what it checks and how long each exit took, and fails on the first mismatch.
set -euo pipefail
trap 'echo "FAIL: line $LINENO: \`$BASH_COMMAND\` exited $?" >&2' ERR
source "$(dirname "$0")/process_helpers.sh"  # before the cd: $0 may be relative
case_name=$1 train=$2 shards=$3 work=$4 mpiexec=${5:-}
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$shards" data
tiny=(--model tiny --vocab 64 --data-dir data --batch 4 --seq-len 32 --eval-every 0 --eval-sequences 8 --quiet)
# 2 clusters x 2 stages of tiny, as in the issue.
grid=("${tiny[@]}" --clusters 2 --stages 2 --micro-batches 2 --local-steps 3 --lr 3e-3)
mpi=("${mpiexec:-mpiexec}" --oversubscribe --allow-run-as-root)
need_mpi() { [[ -n $mpiexec ]] || fail "$case_name needs MPIEXEC"; }
wait_lines() {  # wait_lines FILE N: until FILE holds N lines (60 s at most)
  for _ in $(seq 1 600); do [[ -s $1 && $(wc -l <"$1") -ge $2 ]] && return 0; sleep 0.1; done
  fail "$1 never reached $2 lines"
}

# expect_refusal CODE PATTERN CMD...: exits CODE within 20 s, stderr's first line starts
# "dilocox-train: " and holds PATTERN; a run of one prints exactly one line.
expect_refusal() {
  local code=$1 pattern=$2 rc=0 t0
  shift 2
  t0=$(now)
  timeout -k 5 20 "$@" >out.txt 2>err.txt || rc=$?
  local took
  took=$(since "$t0")
  [[ $rc == "$code" ]] || fail "'$*' exited $rc (expected $code) after $took s: $(head -3 err.txt)"
  if [[ $1 == "$train" && $(wc -l <err.txt) != 1 ]]; then fail "'$*' printed $(wc -l <err.txt) lines: $(cat err.txt)"; fi
  local line
  line=$(grep -m1 '^dilocox-train: ' err.txt || true)
  [[ -n $line ]] || fail "'$*': no 'dilocox-train: ' line: $(head -3 err.txt)"
  grep -q -- "$pattern" <<<"$line" || fail "'$*': message lacks '$pattern': $line"
  echo "ok ($took s, exit $rc): ${line#dilocox-train: }"
}

case $case_name in
refusals)  # item 6 and 4: bad numbers, faults, links and folders refused at once, one line, exit 2
  b=("${tiny[@]}" --tokens 1024)
  expect_refusal 2 'finite' "$train" "${b[@]}" --lr inf
  expect_refusal 2 'finite' "$train" "${b[@]}" --lr nan
  expect_refusal 2 'at most' "$train" "${b[@]}" --lr 1e39
  expect_refusal 2 'finite' "$train" "${b[@]}" --weight-decay inf
  expect_refusal 2 'finite' "$train" "${b[@]}" --grad-clip inf
  expect_refusal 2 'finite' "$train" "${b[@]}" --outer-lr inf
  expect_refusal 2 'finite' "$train" "${b[@]}" --outer-momentum nan
  expect_refusal 2 'finite' "$train" "${b[@]}" --step-seconds inf
  expect_refusal 2 'replica 5 does not exist' "$train" "${b[@]}" --inject-nan 7:5
  expect_refusal 2 'past the run' "$train" "${b[@]}" --inject-nan 9:0
  expect_refusal 2 'below --rank 8' "$train" "${b[@]}" --max-rank 2 --rank 8
  expect_refusal 2 'below --local-steps' "$train" "${b[@]}" --max-local-steps 5 --local-steps 20
  expect_refusal 2 'below 1kbps' "$train" "${b[@]}" --wan-bandwidth 1bps
  expect_refusal 2 'below 1kbps' "$train" "${b[@]}" --wan-bandwidth 999bps
  expect_refusal 2 'over 60s' "$train" "${b[@]}" --wan-latency 61s
  expect_refusal 2 'collective-timeout' "$train" "${b[@]}" --collective-timeout 0
  expect_refusal 2 'max-nonfinite-steps' "$train" "${b[@]}" --max-nonfinite-steps 0
  expect_refusal 2 'checkpoint-minutes' "$train" "${b[@]}" --checkpoint-minutes -1
  expect_refusal 2 "--knob 'k': expected NAME=VALUE" "$train" "${b[@]}" --knob k
  expect_refusal 2 "'abc' is not a finite number" "$train" "${b[@]}" --knob error_decay=abc
  expect_refusal 2 "--knob: dilocox: has no knob 'k' (its knobs: " "$train" "${b[@]}" --knob k=32
  expect_refusal 2 '--knob: bits has its own flag, --bits' "$train" "${b[@]}" --knob bits=8
  expect_refusal 2 '--knob k given twice' "$train" "${b[@]}" --sync sparseloco --knob k=16 --knob k=32
  expect_refusal 2 'error_feedback 2 is not one of 0, 1' "$train" "${b[@]}" --knob error_feedback=2
  # item 4: an unusable --checkpoint-dir is found before the first step, not at the first save
  touch afile
  expect_refusal 2 'afile/x: cannot create' "$train" "${tiny[@]}" --tokens 100000000 --checkpoint-dir afile/x --metrics m.jsonl
  [[ ! -s m.jsonl ]] || fail "steps were trained before the folder was refused: $(wc -l <m.jsonl) metrics lines"
  mkdir -p ro && chmod 500 ro
  if [[ $(id -u) != 0 ]]; then
    expect_refusal 2 'ro: cannot write' "$train" "${b[@]}" --checkpoint-dir ro
  fi
  ;;
diverge)  # item 6: a run whose loss is NaN/Inf ends with exit 1, keeps its good checkpoints
  rc=0
  t0=$(now)
  "$train" "${tiny[@]}" --tokens 12800 --lr 1e10 --checkpoint-dir ck --checkpoint-every 5 >out.txt 2>err.txt || rc=$?
  [[ $rc == 1 ]] || fail "--lr 1e10: exit $rc, expected 1: $(cat err.txt)"
  grep -q 'diverged' err.txt || fail "--lr 1e10: no message: $(cat err.txt)"
  [[ $(field diverged out.txt) == true && $(field final_eval_loss out.txt) == null ]] || fail "summary: $(cat out.txt)"
  steps=$(field steps out.txt)
  [[ $steps -le 15 ]] || fail "--lr 1e10 ran $steps of 100 steps before stopping (10 non-finite steps allowed)"
  [[ -z $(ls ck | grep '\.ckpt' || true) ]] || fail "a diverged model was checkpointed: $(ls ck)"
  echo "ok ($(since "$t0") s, exit 1 after step $steps of 100, no checkpoint): $(grep diverged err.txt)"
  # a short run that ends on a NaN evaluation before 10 bad steps: exit 1 too
  rc=0
  "$train" "${tiny[@]}" --tokens 1024 --lr 1e10 >out.txt 2>err.txt || rc=$?
  [[ $rc == 1 ]] || fail "8 steps at --lr 1e10: exit $rc, expected 1"
  grep -q 'final evaluation loss is' err.txt || fail "no final-evaluation message: $(cat err.txt)"
  echo "ok (exit 1): $(grep 'final evaluation' err.txt)"
  # --max-nonfinite-steps 3: stops after the third
  rc=0
  "$train" "${tiny[@]}" --tokens 12800 --lr 1e10 --max-nonfinite-steps 3 >out.txt 2>err.txt || rc=$?
  [[ $rc == 1 && $(field steps out.txt) -le 6 ]] || fail "--max-nonfinite-steps 3: exit $rc, $(field steps out.txt) steps"
  echo "ok: --max-nonfinite-steps 3 stopped at step $(field steps out.txt)"
  ;;
resume_refusals)  # item 5: --resume refuses another layout, model or outcome flag, naming both values
  base=("${tiny[@]}" --tokens 1536)
  "$train" "${base[@]}" --checkpoint-dir ck --stop-after 3 >/dev/null
  expect_refusal 2 'the checkpoint at step 3 in ck is from a run with other flags that change the outcome: --tokens: 1536 in the checkpoint, 2048 now' "$train" "${tiny[@]}" --tokens 2048 --checkpoint-dir ck --resume
  expect_refusal 2 '--lr: 0.001 in the checkpoint, 0.002 now' "$train" "${base[@]}" --lr 2e-3 --checkpoint-dir ck --resume
  expect_refusal 2 '--seed: 1 in the checkpoint, 2 now' "$train" "${base[@]}" --seed 2 --checkpoint-dir ck --resume
  expect_refusal 2 '--layers: 2 in the checkpoint, 3 now' "$train" "${base[@]}" --layers 3 --checkpoint-dir ck --resume
  expect_refusal 2 '--warmup: 20 in the checkpoint, 5 now' "$train" "${base[@]}" --warmup 5 --checkpoint-dir ck --resume
  expect_refusal 2 'pass --resume' "$train" "${base[@]}" --checkpoint-dir ck
  # flags that may change on resume: the run goes on
  "$train" "${base[@]}" --checkpoint-dir ck --resume --eval-every 4 --checkpoint-every 2 --stop-after 2 >out.txt
  [[ $(field steps out.txt) == 5 ]] || fail "resume with other eval/checkpoint cadence: $(cat out.txt)"
  echo "ok: --eval-every, --checkpoint-every, --stop-after may change on resume"
  # 2 clusters x 1 stage: the sync flags, and the layout
  two=("${tiny[@]}" --clusters 2 --local-steps 3 --tokens 3072)
  need_mpi
  "${mpi[@]}" -n 2 "$train" "${two[@]}" --checkpoint-dir ck2 --stop-after 4 >/dev/null
  for change in "--bits 8:--bits: 4 in the checkpoint, 8 now" "--local-steps 4:--local-steps: 3 in the checkpoint, 4 now" \
                "--no-overlap:--overlap: on in the checkpoint, off" "--rank 16:--rank: 8 in the checkpoint, 16 now" \
                "--rank 4:--rank: 8 in the checkpoint, 4 now" "--sync diloco:--sync: dilocox in the checkpoint, diloco now" \
                "--knob error_decay=0.9:--knob: none in the checkpoint, error_decay=0.9 now"; do
    read -r -a flag <<<"${change%%:*}"
    expect_refusal 2 "${change#*:}" "${mpi[@]}" -n 2 "$train" "${two[@]}" "${flag[@]}" --checkpoint-dir ck2 --resume
  done
  expect_refusal 2 'holds checkpoints of 2 clusters x 1 stage' "$train" "${tiny[@]}" --tokens 3072 --checkpoint-dir ck2 --resume
  expect_refusal 2 'holds checkpoints of 2 clusters x 1 stage' "${mpi[@]}" -n 2 "$train" "${tiny[@]}" --tokens 3072 --stages 2 \
    --checkpoint-dir ck2 --resume
  ;;
metrics)  # item 6: after a crash and --resume the metrics hold every step once, with the uninterrupted losses
  run=("${tiny[@]}" --tokens 12800 --checkpoint-dir ck --checkpoint-every 7 --eval-every 10)
  "$train" "${tiny[@]}" --tokens 12800 --eval-every 10 --metrics straight.jsonl >straight.txt
  "$train" "${run[@]}" --metrics m.jsonl >/dev/null 2>&1 &
  pid=$!
  # Stop it (SIGSTOP) when it has logged steps after its newest checkpoint, then kill -9.
  for _ in $(seq 1 200); do
    sleep 0.05
    kill -STOP $pid
    logged=$(grep -c '"type":"step"' m.jsonl 2>/dev/null || true)
    saved=$(newest_step ck stage0of1)
    [[ -n $saved && $logged -gt $saved ]] && break
    kill -CONT $pid
  done
  kill -9 $pid
  wait $pid 2>/dev/null || true
  echo "killed with $logged steps logged, newest checkpoint at step ${saved:-none}"
  [[ -n $saved && $logged -gt $saved ]] || fail "could not kill between checkpoints"
  "$train" "${run[@]}" --metrics m.jsonl --resume >resumed.txt 2>err.txt
  steps=$(grep '"type":"step"' m.jsonl | grep -o '"step":[0-9]*' | cut -d: -f2)
  [[ $(sort -n <<<"$steps" | uniq -d | wc -l) == 0 ]] || fail "steps logged twice: $(sort -n <<<"$steps" | uniq -d | tr '\n' ' ')"
  total=$(field steps straight.txt)
  [[ $(wc -l <<<"$steps") == "$total" && $(sort -n <<<"$steps" | tail -1) == "$total" ]] ||
    fail "expected steps 1..$total once: $(tr '\n' ' ' <<<"$steps")"
  diff <(grep '"type":"eval"' straight.jsonl | grep -o '"eval_loss":[^,]*') \
       <(grep '"type":"eval"' m.jsonl | grep -o '"eval_loss":[^,]*') >/dev/null || fail "eval lines differ"
  diff <(grep -o '"loss":[^,]*' straight.jsonl) <(grep -o '"loss":[^,]*' m.jsonl) >/dev/null ||
    fail "losses differ from the uninterrupted run's"
  echo "ok: $(grep -o 'dropped [0-9]* line(s) logged after step [0-9]*' err.txt || echo 'nothing dropped'); steps 1..$total once each, losses and evals as uninterrupted"
  ;;
first_save)  # a first save cut short (one stage's files only): --resume starts over; a refused file still stops it
  need_mpi
  two=("${tiny[@]}" --stages 2 --micro-batches 2 --tokens 1536)
  "${mpi[@]}" -n 2 "$train" "${two[@]}" --metrics straight.jsonl >straight.txt
  "${mpi[@]}" -n 2 "$train" "${two[@]}" --checkpoint-dir ck --checkpoint-every 2 --stop-after 2 --metrics m.jsonl >/dev/null
  [[ $(newest_step ck stage0of2) == 2 && $(newest_step ck stage1of2) == 2 ]] || fail "expected step 2 of both stages: $(ls ck)"
  rm ck/stage1of2-*  # stage 1 was killed before its first save ended; stage 0's files are all there is
  timeout -k 5 60 "${mpi[@]}" -n 2 "$train" "${two[@]}" --checkpoint-dir ck --checkpoint-every 2 --resume \
    --metrics m.jsonl >out.txt 2>err.txt || fail "resume after a first save cut short: $(head -3 err.txt)"
  grep -q "the first save was cut short, starting at step 0" err.txt || fail "message: $(cat err.txt)"
  [[ $(field final_eval_loss out.txt) == $(field final_eval_loss straight.txt) ]] ||
    fail "final eval loss $(field final_eval_loss out.txt), uninterrupted $(field final_eval_loss straight.txt)"
  diff <(grep -o '"loss":[^,]*' straight.jsonl) <(grep -o '"loss":[^,]*' m.jsonl) >/dev/null ||
    fail "the metrics differ from the uninterrupted run's"
  echo "ok: $(grep -m1 -o 'no step saved.*' err.txt); steps and losses as uninterrupted"
  rm ck/stage1of2-*
  for f in ck/stage0of2-*.ckpt; do printf 'garbage' >"$f"; done
  rc=0
  timeout -k 5 30 "${mpi[@]}" -n 2 "$train" "${two[@]}" --checkpoint-dir ck --resume >out.txt 2>err.txt || rc=$?
  [[ $rc == 1 ]] || fail "stage 0's files refused, stage 1's gone: exit $rc, expected 1: $(head -3 err.txt)"
  grep -q "no intact checkpoint for every rank in ck at a common step (rank 0 (stage 0): all refused; rank 1 (stage 1): none)" \
    err.txt || fail "message: $(cat err.txt)"
  echo "ok: with stage 0's files refused the run still refuses to start (exit 1)"
  ;;
agreement)  # items 2 and 3: one rank's bad input or different flags end every rank within 10 s, naming it
  a_extra=()
  probe() {  # probe PATTERN FLAGS_B...: ranks 0-1 run the grid (+ a_extra), ranks 2-3 the grid with FLAGS_B
    local pattern=$1 t0 rc=0
    shift
    t0=$(now)
    timeout -k 5 30 "${mpi[@]}" -n 2 "$train" "${grid[@]}" --tokens 6144 "${a_extra[@]}" : \
      -n 2 "$train" "${grid[@]}" --tokens 6144 "$@" >out.txt 2>err.txt || rc=$?
    local took
    took=$(since "$t0")
    [[ $rc != 0 && $rc != 124 && $rc != 137 ]] || fail "'$*' on replica 1: exit $rc after $took s: $(head -3 err.txt)"
    awk -v t="$took" 'BEGIN { exit !(t <= 10) }' || fail "'$*' on replica 1: $took s to exit"
    local line
    line=$(grep -m1 '^dilocox-train: ' err.txt || true)
    grep -q -- "$pattern" <<<"$line" || fail "'$*' on replica 1: message lacks '$pattern': $line"
    echo "ok ($took s, exit $rc): $*: ${line#dilocox-train: }"
  }
  need_mpi
  probe 'rank 2 (stage 0, replica 1): nodata/train.bin not found' --data-dir nodata
  touch afile
  a_extra=(--checkpoint-dir ck)
  probe 'rank 2 (stage 0, replica 1): --checkpoint-dir: afile/x' --checkpoint-dir afile/x
  a_extra=()
  probe '--sync: dilocox on ranks 0-1, allreduce on ranks 2-3' --sync allreduce
  probe '--tokens: 6144 on ranks 0-1, 8192 on ranks 2-3' --tokens 8192
  probe '--batch: 4 on ranks 0-1, 8 on ranks 2-3' --batch 8
  probe '--clusters: 2 on ranks 0-1, 1 on ranks 2-3' --clusters 1
  probe '--lr: 0.003 on ranks 0-1, 0.001 on ranks 2-3' --lr 1e-3
  probe 'rank 2: The following argument was not expected: --bogus \[also rank 3\]' --bogus
  ;;
watchdog)  # no collective waits forever: kill -STOP one rank; the others exit non-zero naming it
  need_mpi
  timeout_s=5
  for victim in 2 0; do
    rm -f m.jsonl
    "${mpi[@]}" -n 4 "$train" "${grid[@]}" --tokens 100000000 --collective-timeout $timeout_s --metrics m.jsonl \
      >out.txt 2>err.txt &
    pid=$!
    wait_lines m.jsonl 10
    sleep 1.5  # a heartbeat or two from the training loop
    vpid=$(rank_pid $pid $victim)
    [[ -n $vpid ]] || fail "no pid for rank $victim"
    t0=$(now)
    kill -STOP "$vpid"
    rc=0
    wait_gone $pid $((timeout_s + 10)) || rc=$?
    took=$(since "$t0")
    if [[ $rc != 0 ]]; then
      kill -9 "$vpid" $pid 2>/dev/null || true
      fail "rank $victim stopped: the run still hangs after $took s"
    fi
    rc=0
    wait $pid || rc=$?
    kill -9 "$vpid" 2>/dev/null || true
    [[ $rc != 0 ]] || fail "rank $victim stopped: exit 0"
    who="rank $victim (stage $((victim % 2)), replica $((victim / 2))) stopped answering"
    lines=$(grep -c -- "$who" err.txt || true)
    [[ $lines == 3 ]] || fail "expected the 3 live ranks to name $who, got $lines lines: $(cat err.txt)"
    grep -q -- "$who.*last heard at step [1-9][0-9]*, training" err.txt || fail "no step and activity: $(cat err.txt)"
    echo "ok ($took s, exit $rc, timeout $timeout_s s): $(grep -m1 -- "$who" err.txt)"
  done
  ;;
stop)  # item 1: every way to stop a run keeps the last completed step
  need_mpi
  flags=("${grid[@]}" --tokens 100000000 --checkpoint-dir ck --metrics m.jsonl)
  # stop_with WHAT WANT_RC RESUME: start (or resume), signal once 15 lines are logged, check
  # the checkpoint holds every step completed before the signal and the summary says so.
  # term_mpirun_grace: as documented for steps plus a save longer than 1 s, mpirun given
  # a grace period (it sends SIGTERM after it, then SIGKILL after as long again).
  stop_with() {
    local what=$1 want=$2 extra=() launch=("${mpi[@]}") rc=0 t0 logged took saved lost=0
    [[ $3 == resume ]] && extra=(--resume)
    [[ $what == term_mpirun_grace ]] && launch+=(--mca odls_base_sigkill_timeout 3)
    rm -f m.jsonl
    "${launch[@]}" -n 4 "$train" "${flags[@]}" "${extra[@]}" >out.txt 2>err.txt &
    local pid=$!
    wait_lines m.jsonl 15
    logged=$(grep '"type":"step"' m.jsonl | tail -1 | grep -o '"step":[0-9]*' | cut -d: -f2)
    t0=$(now)
    case $what in
      usr1_mpirun) kill -USR1 $pid ;;
      term_mpirun | term_mpirun_grace) kill -TERM $pid ;;
      term_rank) kill -TERM "$(rank_pid $pid 3)" ;;
    esac
    wait_gone $pid 30 || fail "$what: still running after 30 s"
    wait $pid || rc=$?
    took=$(since "$t0")
    [[ $rc == "$want" ]] || fail "$what: mpirun exit $rc, expected $want: $(tail -3 err.txt)"
    saved=$(newest_step ck stage1of2-replica1of2)
    if [[ $what == term_mpirun && -n $saved && $saved -lt $logged ]]; then
      # Open MPI's default window (SIGTERM, then SIGKILL 1 s later) is a race the ranks can
      # lose on a loaded machine; that is why the README says USR1 or a grace period, which
      # the other cases check strictly. Here: nothing corrupt, and the run resumes.
      echo "note: $what: SIGKILL came before the save (checkpoint step $saved, step $logged logged)"
      lost=1
    else
      [[ -n $saved && $saved -ge $logged ]] || fail "$what: newest checkpoint step ${saved:-none}, step $logged was logged"
    fi
    # (under mpirun's SIGTERM the SIGKILL may come before the summary line: then there is none)
    if [[ $what != term_mpirun || -s out.txt ]]; then
      [[ $(field interrupted out.txt) == true && $(field checkpoint_step out.txt) == "$saved" ]] ||
        fail "$what: summary $(cat out.txt)"
    fi
    # (a save cut short by SIGKILL may leave a .tmp: the next start removes it, checked below)
    [[ $lost == 1 || -z $(ls ck | grep '\.tmp$' || true) ]] || fail "$what: temporary files left: $(ls ck)"
    echo "ok ($took s to exit, mpirun exit $rc, summary: $([[ -s out.txt ]] && echo yes || echo no)): $what after step" \
      "$logged was logged -> checkpoint at step $saved"
  }
  stop_with usr1_mpirun 0 fresh
  stop_with term_rank 0 resume
  stop_with term_mpirun 1 resume
  stop_with term_mpirun_grace 1 resume
  # a temporary file of a save cut short is removed at the next start
  printf 'cut short' >ck/stage0of2-replica0of2-step00000999.ckpt.tmp
  "${mpi[@]}" -n 4 "$train" "${grid[@]}" --tokens 100000000 --checkpoint-dir ck --resume --stop-after 1 >out.txt 2>err.txt
  [[ ! -e ck/stage0of2-replica0of2-step00000999.ckpt.tmp ]] || fail "a stale .ckpt.tmp survived the restart"
  grep -q 'removed 1 temporary file' err.txt || fail "no note about the removed temporary file: $(cat err.txt)"
  echo "ok: the stale .ckpt.tmp was removed at the restart"
  # --checkpoint-minutes alone (no --checkpoint-every): saves by the clock, so a kill -9
  # costs at most that long; the next start resumes from the newest
  "$train" "${tiny[@]}" --tokens 100000000 --checkpoint-dir ckm --checkpoint-minutes 0.01 >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do [[ -n $(newest_step ckm stage0of1) ]] && break; sleep 0.1; done
  sleep 1
  kill -9 $pid
  wait $pid 2>/dev/null || true
  saved=$(newest_step ckm stage0of1)
  [[ -n $saved && $saved -gt 0 ]] || fail "--checkpoint-minutes 0.01: no checkpoint after about 2 s: $(ls ckm)"
  "$train" "${tiny[@]}" --tokens 100000000 --checkpoint-dir ckm --resume --stop-after 1 >out.txt 2>/dev/null
  [[ $(field steps out.txt) == $((saved + 1)) ]] || fail "resume after kill -9: $(cat out.txt)"
  echo "ok: --checkpoint-minutes 0.01 alone: kill -9 at about 2 s, resumed from step $saved"
  # without --checkpoint-dir a stop loses the work: exit 1 and say so
  "$train" "${tiny[@]}" --tokens 100000000 --metrics solo.jsonl >out.txt 2>err.txt &
  pid=$!
  wait_lines solo.jsonl 3
  kill -INT $pid
  rc=0
  wait $pid || rc=$?
  [[ $rc == 1 ]] && grep -q 'work is lost' err.txt || fail "SIGINT without --checkpoint-dir: exit $rc, $(cat err.txt)"
  echo "ok: SIGINT without --checkpoint-dir: exit 1, $(grep 'work is lost' err.txt)"
  ;;
pause)  # a whole job paused past --collective-timeout (SIGSTOP, as a scheduler suspends) carries on
  need_mpi
  run=("${grid[@]}" --tokens 150000 --collective-timeout 3)
  "${mpi[@]}" -n 4 "$train" "${run[@]}" >straight.txt
  "${mpi[@]}" -n 4 "$train" "${run[@]}" --metrics m.jsonl >out.txt 2>err.txt &
  pid=$!
  wait_lines m.jsonl 20
  ranks=$(pgrep -P $pid | tr '\n' ' ')
  kill -STOP $pid $ranks
  sleep 6  # twice the timeout
  kill -CONT $ranks $pid
  t0=$(now)
  rc=0
  wait $pid || rc=$?
  [[ $rc == 0 ]] || fail "paused 6 s with --collective-timeout 3: exit $rc: $(grep -m2 '^dilocox-train' err.txt)"
  [[ $(field steps out.txt) -gt $(grep -c '"type":"step"' <<<"$(head -20 m.jsonl)") ]] || fail "summary: $(cat out.txt)"
  want=$(field final_eval_loss straight.txt) got=$(field final_eval_loss out.txt)
  [[ $got == "$want" ]] || fail "paused run: final eval loss $got, uninterrupted $want"
  echo "ok: paused 6 s (timeout 3 s), finished $(since "$t0") s after SIGCONT with the uninterrupted loss $got"
  ;;
stuck_io)  # a rank blocked opening its checkpoint (a hung filesystem: a FIFO) ends every rank, named
  need_mpi
  every=200
  "${mpi[@]}" -n 4 "$train" "${grid[@]}" --tokens 100000000 --checkpoint-dir ck --checkpoint-every $every \
    --progress-timeout 4 --metrics m.jsonl >out.txt 2>err.txt &
  pid=$!
  wait_lines m.jsonl 1  # past the start check, which removes stale temporaries
  mkfifo "ck/stage1of2-replica0of2-step$(printf %08d $every).ckpt.tmp"
  wait_lines m.jsonl $every
  t0=$(now)
  wait_gone $pid 40 || { kill -9 $pid $(pgrep -P $pid) 2>/dev/null; fail "still hanging 40 s after step $every"; }
  took=$(since "$t0")
  rc=0
  wait $pid || rc=$?
  [[ $rc != 0 ]] || fail "a rank stuck in open(): exit 0"
  who="rank 1 (stage 1, replica 0) made no progress"
  lines=$(grep -c -- "$who" err.txt || true)
  [[ $lines == 4 ]] || fail "expected every rank to name $who, got $lines lines: $(grep '^dilocox-train' err.txt)"
  grep -q -- "$who.*still writing a checkpoint at step $every" err.txt || fail "no activity: $(grep -m1 -- "$who" err.txt)"
  echo "ok ($took s after step $every, exit $rc): $(grep -m1 -- "$who" err.txt)"
  ;;
folder_lock)  # a second run into a folder in use is refused, naming the holder; the first is untouched
  "$train" "${tiny[@]}" --tokens 100000000 --checkpoint-dir ck --metrics a.jsonl >a.txt 2>a.err &
  pid=$!
  wait_lines a.jsonl 3
  expect_refusal 2 "in use by another run (host $(hostname), pid $pid, started" "$train" "${tiny[@]}" --tokens 2048 \
    --checkpoint-dir ck --metrics b.jsonl
  [[ ! -s b.jsonl ]] || fail "the refused run wrote its metrics"
  if [[ -n $mpiexec ]]; then  # another layout, every rank: refused all the same
    expect_refusal 2 "in use by another run" "${mpi[@]}" -n 2 "$train" "${tiny[@]}" --stages 2 --tokens 2048 \
      --checkpoint-dir ck
  fi
  kill -USR1 $pid
  rc=0
  wait $pid || rc=$?
  [[ $rc == 0 && $(field interrupted a.txt) == true ]] || fail "the first run: exit $rc, $(cat a.txt a.err)"
  saved=$(field checkpoint_step a.txt)
  [[ -e ck/stage0of1-step$(printf %08d "$saved").ckpt ]] || fail "its checkpoint of step $saved: $(ls ck)"
  "$train" "${tiny[@]}" --tokens 100000000 --checkpoint-dir ck --resume --stop-after 1 >out.txt 2>err.txt ||
    fail "resume after the holder ended: $(cat err.txt)"
  [[ $(field steps out.txt) == $((saved + 1)) ]] || fail "resumed: $(cat out.txt)"
  echo "ok: the holder ended (checkpoint step $saved), the folder is free again, resumed to step $((saved + 1))"
  ;;
resume_nothing)  # --resume with nothing to resume: exit 2, metrics untouched; --resume-if-present starts
  "$train" "${tiny[@]}" --tokens 4096 --checkpoint-dir ck --metrics m.jsonl >/dev/null
  cp m.jsonl before.jsonl
  mkdir -p empty
  expect_refusal 2 'no checkpoint in empty to resume' "$train" "${tiny[@]}" --tokens 4096 --checkpoint-dir empty \
    --resume --metrics m.jsonl
  cmp -s m.jsonl before.jsonl || fail "--resume into an empty folder changed the metrics file"
  expect_refusal 2 'typo does not exist here' "$train" "${tiny[@]}" --tokens 4096 --checkpoint-dir typo --resume \
    --metrics m.jsonl
  [[ ! -e typo ]] || fail "--resume created the folder it did not find"
  cmp -s m.jsonl before.jsonl || fail "--resume of a missing folder changed the metrics file"
  "$train" "${tiny[@]}" --tokens 4096 --checkpoint-dir fresh --resume-if-present --metrics f.jsonl >out.txt 2>err.txt
  grep -q 'starting at step 0 (--resume-if-present)' err.txt || fail "--resume-if-present: $(cat err.txt)"
  [[ $(field steps out.txt) == 32 ]] || fail "--resume-if-present: $(cat out.txt)"
  "$train" "${tiny[@]}" --tokens 8192 --checkpoint-dir ck2 --checkpoint-every 8 --stop-after 16 --metrics r.jsonl \
    >/dev/null
  "$train" "${tiny[@]}" --tokens 8192 --checkpoint-dir ck2 --resume-if-present --stop-after 4 --metrics r.jsonl \
    >out.txt
  [[ $(field steps out.txt) == 20 && $(grep -c '"type":"step"' r.jsonl) == 20 ]] ||
    fail "--resume-if-present with a checkpoint: $(cat out.txt); $(wc -l <r.jsonl) metrics lines"
  echo "ok: --resume with nothing: exit 2, metrics byte for byte; --resume-if-present: step 0 when empty, step 16 when saved"
  ;;
metrics_lost)  # a full metrics filesystem (or /dev/full) is not silent; a file deleted mid-run is created anew
  "$train" "${tiny[@]}" --tokens 4096 --metrics /dev/full >out.txt 2>err.txt || fail "--metrics /dev/full: $(cat err.txt)"
  grep -q 'warning: writing --metrics /dev/full failed (No space left on device)' err.txt || fail "no warning: $(cat err.txt)"
  grep -q 'warning: 33 line(s) of --metrics /dev/full were lost' err.txt || fail "no final count: $(cat err.txt)"
  [[ $(field metrics_lost_lines out.txt) == 33 ]] || fail "summary: $(cat out.txt)"
  echo "ok: /dev/full: $(head -1 err.txt)"
  if [[ $(id -u) == 0 ]] && mkdir -p small && mount -t tmpfs -o size=16k tmpfs small 2>/dev/null; then
    rc=0
    "$train" "${tiny[@]}" --tokens 100000 --metrics small/m.jsonl >out.txt 2>err.txt || rc=$?
    umount small
    lost=$(field metrics_lost_lines out.txt)
    [[ $rc == 0 && $lost -gt 0 ]] || fail "a 16 KiB metrics filesystem: exit $rc, lost ${lost:-?}: $(cat err.txt)"
    grep -q 'No space left on device' err.txt || fail "no warning: $(cat err.txt)"
    echo "ok: a 16 KiB tmpfs: $lost lines lost, warned, exit 0"
  else
    echo "note: a small tmpfs could not be mounted here (not root, or not permitted): /dev/full only"
  fi
  "$train" "${tiny[@]}" --tokens 100000000 --checkpoint-dir ckd --metrics d.jsonl >out.txt 2>err.txt &
  pid=$!
  wait_lines d.jsonl 5
  rm d.jsonl
  wait_lines d.jsonl 5
  kill -USR1 $pid
  wait $pid || fail "deleted metrics: exit $?"
  grep -q 'removed or replaced during the run' err.txt || fail "no note: $(cat err.txt)"
  echo "ok: deleted mid-run: a new file, $(wc -l <d.jsonl) lines, $(grep -o 'removed or replaced.*' err.txt | head -1)"
  ;;
startup_stop)  # a stop while the run starts, or during --resume's load, ends every rank with exit 0
  need_mpi
  flags=("${grid[@]}" --tokens 100000000 --checkpoint-dir ck --metrics m.jsonl)
  # (Once every rank catches SIGUSR1, plus 0.1 s: a signal before a rank's program has
  # reached main keeps the default action, which no handler can change; under load that
  # can take longer than any fixed delay.)
  for delay in 0.1; do
    rm -rf ck m.jsonl
    "${mpi[@]}" -n 4 "$train" "${flags[@]}" >out.txt 2>err.txt &
    pid=$!
    wait_handlers $pid 4 10 60 || { kill -9 $pid $(pgrep -P $pid) 2>/dev/null; fail "the ranks never caught SIGUSR1"; }
    sleep $delay
    t0=$(now)
    kill -USR1 $pid
    wait_gone $pid 30 || { kill -9 $pid $(pgrep -P $pid) 2>/dev/null; fail "SIGUSR1 $delay s after the ranks caught it: still running 30 s later"; }
    rc=0
    wait $pid || rc=$?
    [[ $rc == 0 ]] || fail "SIGUSR1 to mpirun $delay s after the ranks caught it: exit $rc: $(grep -m2 . err.txt)"
    steps=$(field steps out.txt || true)
    echo "ok ($(since "$t0") s, exit 0): SIGUSR1 to mpirun $delay s after the ranks caught it:" \
      "$(grep -m1 -o 'SIGUSR1 during start-up.*' err.txt || echo "stopped after step ${steps:-?}")"
  done
  # During --resume's load: SIGTERM to a rank while it holds its checkpoint open (a larger
  # model, so that reading it takes a while); the checkpoints are left as they were.
  big=(--layers 2 --embd 512 --heads 8 --vocab 64 --data-dir data --batch 2 --seq-len 32 --eval-every 0 --quiet
       --clusters 2 --stages 2 --micro-batches 2 --local-steps 3 --tokens 100000000 --checkpoint-dir ckb)
  "${mpi[@]}" -n 4 "$train" "${big[@]}" --stop-after 2 >/dev/null
  sums=$(md5sum ckb/*.ckpt)
  caught=""
  for attempt in 1 2 3 4 5; do
    "${mpi[@]}" -n 4 "$train" "${big[@]}" --resume >out.txt 2>err.txt &
    pid=$!
    victim=""
    for _ in $(seq 1 4000); do
      [[ -n $victim ]] || victim=$(rank_pid $pid 3)
      if [[ -n $victim ]] && ls -l /proc/$victim/fd 2>/dev/null | grep -q '\.ckpt$'; then
        kill -TERM $victim
        caught=$attempt
        break
      fi
      kill -0 $pid 2>/dev/null || break
    done
    [[ -n $caught ]] && break
    kill -USR1 $pid 2>/dev/null || true
    wait $pid || true
    sums=$(md5sum ckb/*.ckpt)  # that attempt trained a step and saved
  done
  [[ -n $caught ]] || fail "never saw rank 3 reading its checkpoint in 5 attempts"
  rc=0
  wait $pid || rc=$?
  [[ $rc == 0 ]] || fail "SIGTERM to a rank during --resume's load: exit $rc: $(grep -m2 . err.txt)"
  grep -q 'SIGTERM during start-up' err.txt || fail "no start-up stop: $(cat err.txt) $(cat out.txt)"
  [[ "$(md5sum ckb/*.ckpt)" == "$sums" ]] || fail "the checkpoints changed: $(ls -l ckb)"
  echo "ok (attempt $caught): SIGTERM to rank 3 while it read its checkpoint: exit 0, $(grep -o 'SIGTERM during start-up.*' err.txt), checkpoints byte for byte"
  ;;
folder_checks)  # refused before step 1: a checkpoint path too long for the run's files, a folder too small
  # The test write's own name fits in PATH_MAX (4096) here, the checkpoint temporaries' do not.
  deep=$PWD
  while [[ $(( ${#deep} + 220 )) -lt 4068 ]]; do deep=$deep/$(printf 'd%.0s' $(seq 1 200)); done
  deep=$deep/$(printf 'e%.0s' $(seq 1 $((4068 - ${#deep} - 1))))
  [[ ${#deep} == 4068 ]] || fail "path of ${#deep} characters"
  expect_refusal 2 'File name too long' "$train" "${tiny[@]}" --tokens 4096 --checkpoint-dir "$deep" --metrics m.jsonl
  [[ ! -s m.jsonl ]] || fail "steps were trained before the long path was refused"
  echo "ok: a --checkpoint-dir of ${#deep} characters refused at start"
  if [[ $(id -u) == 0 ]] && mkdir -p small && mount -t tmpfs -o size=1m tmpfs small 2>/dev/null; then
    rc=0
    "$train" "${tiny[@]}" --tokens 4096 --checkpoint-dir small/ck --metrics m.jsonl >out.txt 2>err.txt || rc=$?
    umount small
    [[ $rc == 2 ]] || fail "a 1 MiB folder for 3 checkpoints of 1.3 MB: exit $rc: $(cat err.txt)"
    grep -q 'MB short; free space or choose another folder' err.txt || fail "message: $(cat err.txt)"
    [[ ! -s m.jsonl ]] || fail "steps were trained before the small folder was refused"
    echo "ok: $(grep -o 'small/ck has.*short' err.txt)"
  else
    echo "note: a small tmpfs could not be mounted here (not root, or not permitted): the room check is not run"
  fi
  ;;
*) fail "unknown case $case_name" ;;
esac
