#!/usr/bin/env bash
# tests/mpi/kill.sh RLTRAIN MPIRUN... — a 2-rank run that loses a rank ends, with a message naming
# that rank, and its last checkpoint loads: rank 1 killed (SIGKILL; mpirun names it), then rank 1
# stopped (SIGSTOP; rank 0 names it after the collective timeout, 5 s here). Each job must end
# within 60 s of the loss (bash's timeout ends a hang at 120 s, failing the test).
set -u
RLTRAIN=$1; shift
MPIRUN=("$@")
dir=$(mktemp -d /tmp/lumen-mpi-kill-XXXXXX)
trap 'rm -rf "$dir"' EXIT
export LUMEN_THREADS=1
fail() { echo "FAIL: $*" >&2; exit 1; }
rank_pid() { # the pid of rank $1 among mpirun $2's children
  for p in $(pgrep -P "$2"); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
  done
}
for sig in KILL STOP; do
  run="$dir/$sig"
  timeout 120 "${MPIRUN[@]}" -np 2 "$RLTRAIN" cartpole --envs 4 --steps 32 --total-steps 100000000 --no-stop \
    --checkpoint-every 1 --quiet --dist-timeout 5 --out "$run" > "$dir/$sig.out" 2>&1 &
  job=$!
  for _ in $(seq 600); do [ -s "$run/latest.ckpt" ] && [ -n "$(ls "$run/checkpoints" 2>/dev/null | sed -n 3p)" ] && break; sleep 0.1; done
  [ -s "$run/latest.ckpt" ] || fail "$sig: no checkpoint after 60 s"
  victim=""
  for _ in $(seq 50); do victim=$(rank_pid 1 "$(pgrep -P $job -x mpirun || echo $job)"); [ -n "$victim" ] && break; sleep 0.1; done
  [ -n "$victim" ] || victim=$(for p in $(pgrep -f "rltrain cartpole --envs 4 --steps 32 --total-steps 100000000"); do
    tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && echo $p; done | head -1)
  [ -n "$victim" ] || fail "$sig: rank 1 not found"
  t0=$(date +%s)
  kill -"$sig" "$victim"
  wait "$job"
  rc=$?
  t1=$(date +%s)
  [ "$rc" -ne 0 ] || fail "$sig: the job exited 0 after losing rank 1"
  [ "$rc" -ne 124 ] || fail "$sig: the job hung (ended by timeout 120)"
  [ $((t1 - t0)) -le 60 ] || fail "$sig: the job took $((t1 - t0)) s to end"
  if [ "$sig" = KILL ]; then
    grep -q "rank 1 .*exited on signal 9" "$dir/$sig.out" || fail "KILL: no message naming rank 1: $(cat "$dir/$sig.out")"
  else
    grep -q "heard nothing from rank 1 within 5 s" "$dir/$sig.out" ||
      fail "STOP: no message naming rank 1 (exit status $rc after $((t1 - t0)) s): $(cat "$dir/$sig.out")"
  fi
  kill -CONT "$victim" 2>/dev/null
  "$RLTRAIN" eval "$run" --episodes 1 > "$dir/$sig.eval" 2>&1 || fail "$sig: the last checkpoint does not load: $(cat "$dir/$sig.eval")"
done
echo ok
