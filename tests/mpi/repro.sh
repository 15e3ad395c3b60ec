#!/usr/bin/env bash
# tests/mpi/repro.sh RLTRAIN MPIRUN... — `mpirun -np 2 rltrain cartpole`: twice with one seed gives
# byte-identical checkpoints; the first iteration's episode statistics equal a one-process run with
# twice the envs; a resumed 2-rank run ends on the uninterrupted run's checkpoint, byte for byte;
# the 2-rank checkpoint resumes in one process (K = 1 divides its 8 envs) and refuses 3 ranks.
set -u
RLTRAIN=$1; shift
MPIRUN=("$@")
dir=$(mktemp -d /tmp/lumen-mpi-repro-XXXXXX)
trap 'rm -rf "$dir"' EXIT
export LUMEN_THREADS=1
fail() { echo "FAIL: $*" >&2; exit 1; }
opts=(cartpole --steps 32 --minibatches 2 --epochs 2 --total-steps 2048 --seed 5 --quiet --checkpoint-every 4)
"${MPIRUN[@]}" -np 2 "$RLTRAIN" "${opts[@]}" --envs 4 --out "$dir/a" || fail "the first 2-rank run"
"${MPIRUN[@]}" -np 2 "$RLTRAIN" "${opts[@]}" --envs 4 --out "$dir/b" || fail "the second 2-rank run"
cmp "$dir/a/latest.ckpt" "$dir/b/latest.ckpt" || fail "two 2-rank runs with one seed wrote different checkpoints"
cmp "$dir/a/checkpoints/step-1024.ckpt" "$dir/b/checkpoints/step-1024.ckpt" || fail "step-1024.ckpt differs"
# the gradients cross between the programs' buffers (MPI's allgather, a rank-sum kernel) by
# default on cpu; copied through the host they give the same bits
LUMEN_DIST_EXCHANGE=host "${MPIRUN[@]}" -np 2 "$RLTRAIN" "${opts[@]}" --envs 4 --out "$dir/h" || fail "the host-exchange run"
cmp "$dir/a/latest.ckpt" "$dir/h/latest.ckpt" || fail "the exchange between buffers and the one through the host differ"
out=$("${MPIRUN[@]}" -np 2 "$RLTRAIN" cartpole --steps 32 --envs 4 --total-steps 256 --out "$dir/w" 2>&1) || fail "a 2-rank run: $out"
grep -q "gradients by MPI allgather between the programs' buffers" <<<"$out" || fail "the run does not say how gradients cross: $out"
out=$(LUMEN_DIST_EXCHANGE=nccl "${MPIRUN[@]}" -np 2 "$RLTRAIN" "${opts[@]}" --envs 4 --out "$dir/n" 2>&1) &&
  fail "LUMEN_DIST_EXCHANGE=nccl ran on cpu"
grep -q "NCCL runs on the cuda backend, not on cpu" <<<"$out" || fail "nccl on cpu: $out"
"$RLTRAIN" "${opts[@]}" --envs 8 --out "$dir/one" || fail "the one-process run"
# iteration, env_steps, episodes, mean_return, mean_length of the first iteration
first() { sed -n 2p "$1/log.csv" | cut -d, -f1,2,4,5,6; }
[ -n "$(first "$dir/a")" ] && [ "$(first "$dir/a")" = "$(first "$dir/one")" ] ||
  fail "first iteration: 2 ranks x 4 envs '$(first "$dir/a")', one process x 8 envs '$(first "$dir/one")'"
grep -q "^envs = 8$" "$dir/a/settings.txt" || fail "settings.txt does not hold the run's 8 envs"
# resume from the middle: the same end, byte for byte, and the same log (clock columns aside)
cp -r "$dir/a" "$dir/r"
cp "$dir/r/checkpoints/step-1024.ckpt" "$dir/r/latest.ckpt"
"${MPIRUN[@]}" -np 2 "$RLTRAIN" cartpole --resume "$dir/r" --quiet || fail "the 2-rank resume"
cmp "$dir/a/latest.ckpt" "$dir/r/latest.ckpt" || fail "the resumed 2-rank run ended elsewhere"
diff <(cut -d, -f1,2,4-13 "$dir/a/log.csv") <(cut -d, -f1,2,4-13 "$dir/r/log.csv") || fail "the resumed log differs"
cp -r "$dir/a" "$dir/k1"
cp "$dir/k1/checkpoints/step-1024.ckpt" "$dir/k1/latest.ckpt"
"$RLTRAIN" cartpole --resume "$dir/k1" --quiet || fail "one process cannot resume the 2-rank checkpoint"
[ "$(sed -n 9p "$dir/k1/log.csv" | cut -d, -f1,2)" = "8,2048" ] || fail "the one-process resume did not reach iteration 8"
out=$("${MPIRUN[@]}" -np 3 "$RLTRAIN" cartpole --resume "$dir/a" --quiet 2>&1) && fail "3 ranks resumed 8 envs"
grep -q "which 3 ranks cannot share evenly" <<<"$out" || fail "3 ranks on 8 envs: $out"
echo ok
