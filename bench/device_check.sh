#!/usr/bin/env bash
# bench/device_check.sh — the one check to run on a machine with an NVIDIA GPU (docs/GPU.md):
# configures and builds lumen with CUDA, runs the whole test suite (tests/test_cuda_gpu.c runs the
# device suite with cuda as the device under test; it fails here, rather than skipping, if the GPU
# does not answer), prints the rollout kernels' registers and spills for the device's own sm_XX,
# trains every env briefly on the cuda backend, searches CartPole's programs on the GPU (15 s a
# program), runs the search benchmark on the GPU, trains CartPole with 2 ranks on the one GPU
# (mpirun, when the machine has one; docs/SCALE.md), runs rlbench --quick, and prints a short table
# last. Every step has a time-out and the whole run stays under DEADLINE seconds (default 540).
#
#   bash bench/device_check.sh                 # build in build-device/, logs in $OUT or build-device/check
#   BUILD=dir DEADLINE=480 JOBS=8 bash bench/device_check.sh
#
# Exit status: 0 when every step passed, 1 otherwise (the table says which), 2 when the machine
# lacks a prerequisite (cmake, a C compiler, pkg-config + Criterion, an NVIDIA driver).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD=${BUILD:-build-device}
LOGS=${OUT:-$BUILD/check}
DEADLINE=${DEADLINE:-540}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
START=$(date +%s)
mkdir -p "$LOGS"

ROWS=()
FAILED=0
say() { printf 'device_check: %s\n' "$*" >&2; }
left() { echo $((DEADLINE - ($(date +%s) - START))); }

# step NAME LIMIT_S COMMAND...: runs COMMAND with its output in $LOGS/NAME.log under a time-out
# (LIMIT_S or what is left of the deadline, whichever is less); records a row for the table.
step() {
  local name=$1 limit=$2
  shift 2
  local remain
  remain=$(($(left) - 10))
  if [ "$remain" -lt 15 ]; then
    ROWS+=("$(printf '%-30s %-8s %6s  %s' "$name" "skipped" "-" "out of time (DEADLINE=$DEADLINE)")")
    FAILED=1
    return 1
  fi
  [ "$limit" -gt "$remain" ] && limit=$remain
  local t0 rc=0 t
  t0=$(date +%s)
  say "$name (at most ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
  t=$(($(date +%s) - t0))
  local status=ok note=""
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    status=TIMEOUT
  elif [ "$rc" -ne 0 ]; then
    status=FAIL
  fi
  [ "$status" != ok ] && FAILED=1 && note="rc=$rc; see $LOGS/$name.log" && tail -n 25 "$LOGS/$name.log" >&2
  ROWS+=("$(printf '%-30s %-8s %6s  %s' "$name" "$status" "${t}s" "$note")")
  [ "$status" = ok ]
}

# ---------------------------------------------------------------- prerequisites
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || command -v clang >/dev/null 2>&1 || missing+=("a C compiler")
if command -v pkg-config >/dev/null 2>&1; then
  pkg-config --exists criterion || missing+=("Criterion (libcriterion-dev)")
else
  missing+=(pkg-config)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  say "missing: ${missing[*]} (bash tools/dev.sh setup installs them on Debian)"
  exit 2
fi
GPU="none"
SM=""
if command -v nvidia-smi >/dev/null 2>&1; then
  GPU=$(timeout 30 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)
  cap=$(timeout 30 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 || true)
  [ -n "$cap" ] && SM="sm_${cap/./}"
fi
if [ -z "$GPU" ] || [ "$GPU" = none ]; then
  say "no NVIDIA GPU answers (nvidia-smi): this script is for a machine with one"
  exit 2
fi
say "GPU: $GPU ${SM:+($SM)}; deadline ${DEADLINE}s; $JOBS jobs; logs in $LOGS"

# ---------------------------------------------------------------- build
CUDA_OPT=()
for root in "${CUDA_PATH:-}" /usr/local/cuda; do
  if [ -n "$root" ] && [ -f "$root/include/cuda.h" ] && [ -f "$root/include/nvrtc.h" ]; then
    CUDA_OPT=(-DLUMEN_CUDA=ON "-DCUDAToolkit_ROOT=$root")
    break
  fi
done
step configure 120 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${CUDA_OPT[@]}" || {
  printf '%s\n' "${ROWS[@]}"
  exit 1
}
step build 240 cmake --build "$BUILD" -j"$JOBS" || {
  printf '%s\n' "${ROWS[@]}"
  exit 1
}

# ---------------------------------------------------------------- tests
# The cuda suite first, verbose: a GPU machine must run these tests, not skip them.
if step test_cuda_gpu 240 "$BUILD/tests/test_cuda_gpu" --jobs 1 --short-filename --verbose; then
  skips=$(grep -c '^\[SKIP\]' "$LOGS/test_cuda_gpu.log" || true)
  passes=$(grep -c '^\[PASS\]' "$LOGS/test_cuda_gpu.log" || true)
  if [ "$skips" -gt 0 ]; then
    FAILED=1
    ROWS[-1]="$(printf '%-30s %-8s %6s  %s' test_cuda_gpu FAIL - "$skips tests skipped on a GPU machine: $(grep -m1 '^\[SKIP\]' "$LOGS/test_cuda_gpu.log" | cut -c1-90)")"
  else
    ROWS[-1]="${ROWS[-1]}$passes tests passed"
  fi
fi
step ctest 300 ctest --test-dir "$BUILD" -LE slow -E test_cuda_gpu -j"$JOBS" --output-on-failure --timeout 240 &&
  ROWS[-1]="${ROWS[-1]}$(grep -Eo '[0-9]+% tests passed.*' "$LOGS/ctest.log" | head -n 1)"

# ---------------------------------------------------------------- kernels on this GPU
ARCH=${SM:-sm_90}
if step compile_rollout 120 "$BUILD/rltrain" compile cartpole --target cuda --arch "$ARCH"; then
  row=$(awk '$1 == "rollout" { printf "rollout %s: %s regs, %s B stack, %s/%s B spilled", $2, $3, $4, $5, $6; exit }' \
    "$LOGS/compile_rollout.log")
  ROWS[-1]="${ROWS[-1]}$ARCH $row"
fi

# ---------------------------------------------------------------- training on cuda, every env
field() { printf '%s' "$json" | grep -Eo "\"$1\": *\"?[^,}\"]*" | head -n 1 | sed -E 's/.*: *"?//'; }
json=""
envs=$("$BUILD/rltrain" list 2>/dev/null | awk 'NR > 1 { print $1 }')
for env in $envs; do
  dir="$LOGS/train-$env"
  rm -rf "$dir"
  if step "train_$env" 60 "$BUILD/rltrain" "$env" --device cuda --total-steps 65536 --no-stop --quiet --out "$dir"; then
    json=$(cat "$dir/summary.json" 2>/dev/null || true)
    dev=$(field device)
    steps=$(field env_steps)
    wall=$(field wall_s)
    ret=$(field mean_return)
    sps=$(awk -v s="${steps:-0}" -v w="${wall:-0}" 'BEGIN { if (w > 0) printf "%.0f", s / w }')
    ROWS[-1]="${ROWS[-1]}device ${dev:-?}: ${steps:-?} steps, ${sps:-?} steps/s, mean return ${ret:-?}"
    [ "$dev" = cuda ] || { FAILED=1; ROWS[-1]="${ROWS[-1]} (NOT cuda)"; }
  fi
done

# ---------------------------------------------------------------- the schedule search, timed on the GPU
# A training run whose programs are searched on cuda (docs/SEARCH.md, "Timing on a device"): the
# log's per-program lines give the kernels' time before and after.
rm -rf "$LOGS/search-cartpole" "$LOGS/search.log"
if LUMEN_SEARCH_CACHE=0 LUMEN_SEARCH_LOG="$LOGS/search.log" step search_cuda 120 "$BUILD/rltrain" cartpole \
  --device cuda --search-budget 15 --total-steps 16384 --no-stop --quiet --out "$LOGS/search-cartpole"; then
  ROWS[-1]="${ROWS[-1]}$(grep -h '^==== search done' "$LOGS/search.log" 2>/dev/null |
    sed -E 's/.*candidates timed, ([0-9]+) wrong; kernels ([0-9.]+) us -> ([0-9.]+) us/\1 wrong, \2 -> \3 us;/' | tr '\n' ' ')"
fi

# The search benchmark on the GPU: the default plan (what the cuda backend runs without a
# search) vs the searched one, for the 256^3 matmul, the PPO update and a rollout step.
if step search_bench 150 "$BUILD/rlbench" --only search --quick --search-device cuda; then
  ROWS[-1]="${ROWS[-1]}$(awk '/^  (matmul|ppo|rollout)/ { for (i = 3; i <= NF; i++) if ($i ~ /^[0-9.]+x$/) { printf "%s %s %s; ", $1, $2, $i; break } }' "$LOGS/search_bench.log" 2>/dev/null)"
fi

# ---------------------------------------------------------------- 2 ranks on the one GPU (docs/SCALE.md)
# Data-parallel PPO: two ranks share the GPU (an H200 hosts both), gradients summed in rank order.
# NCCL refuses two ranks on one GPU, so the run says it exchanges through the host (its first
# lines, in the log); with a GPU per rank the same command uses ncclAllGather (docs/SCALE.md).
MPIRUN=$(command -v mpirun || true)
if [ -z "$MPIRUN" ]; then
  ROWS+=("$(printf '%-30s %-8s %6s  %s' train_2_ranks skipped - "no mpirun on this machine (openmpi-bin)")")
else
  rm -rf "$LOGS/train-2-ranks"
  if step train_2_ranks 90 "$MPIRUN" --oversubscribe --allow-run-as-root -np 2 "$BUILD/rltrain" cartpole --device cuda \
    --envs 512 --total-steps 1048576 --no-stop --dist-timeout 60 --out "$LOGS/train-2-ranks"; then
    json=$(cat "$LOGS/train-2-ranks/summary.json" 2>/dev/null || true)
    steps=$(field env_steps)
    wall=$(field wall_s)
    sps=$(awk -v s="${steps:-0}" -v w="${wall:-0}" 'BEGIN { if (w > 0) printf "%.0f", s / w }')
    how=$(grep -o "gradients [^;]*" "$LOGS/train_2_ranks.log" | head -1)
    ROWS[-1]="${ROWS[-1]}device $(field device): ${steps:-?} steps, ${sps:-?} steps/s, mean return $(field mean_return); ${how:-?}"
  fi
fi

# ---------------------------------------------------------------- rlbench (cpu baselines of this host)
step rlbench 180 "$BUILD/rlbench" --quick --json "$LOGS/rlbench.json" || true

# ---------------------------------------------------------------- the table
elapsed=$(($(date +%s) - START))
printf '\nlumen device check: %s %s, %ss\n' "$GPU" "${SM:+($SM)}" "$elapsed"
printf '%-30s %-8s %6s  %s\n' step status time note
printf '%s\n' "${ROWS[@]}"
exit "$FAILED"
