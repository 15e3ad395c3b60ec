#!/usr/bin/env bash
# tests/mpi/solve.sh RLTRAIN MPIRUN... — `mpirun -np 2 rltrain cartpole` with lumen's defaults (16
# envs per rank) solves CartPole-v1 (mean of the last 100 episodes >= 475) within its step budget.
set -u
RLTRAIN=$1; shift
dir=$(mktemp -d /tmp/lumen-mpi-solve-XXXXXX)
trap 'rm -rf "$dir"' EXIT
export LUMEN_THREADS=1
"$@" -np 2 "$RLTRAIN" cartpole --seed 1 --quiet --out "$dir/run" || { echo "FAIL: the run failed" >&2; exit 1; }
grep -q '"solved": true' "$dir/run/summary.json" || { echo "FAIL: not solved: $(cat "$dir/run/summary.json")" >&2; exit 1; }
echo ok
