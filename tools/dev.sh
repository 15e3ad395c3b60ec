#!/usr/bin/env bash
# tools/dev.sh: the one entry point on a fresh Debian machine. Installs what the build needs (only
# what is missing), builds build/, runs rltrain, runs the test suite plainly and under ASan+UBSan,
# and runs the libFuzzer targets (tests/fuzz/) for a bounded time.
# Usage: bash tools/dev.sh {setup | rltrain ARGS... | test | asan | fuzz [SECONDS] | help}
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

# libclang-rt-dev: clang's sanitizer and libFuzzer runtimes (only recommended by clang on Debian)
PACKAGES=(build-essential cmake clang libclang-rt-dev pkg-config libcriterion-dev libsdl2-dev
          libsdl2-image-dev libpng-dev ocl-icd-opencl-dev opencl-headers pocl-opencl-icd clinfo xvfb xauth
          openmpi-bin libopenmpi-dev python3-venv)
JOBS=$(nproc 2>/dev/null || echo 2)

# Tests found and failed across every ctest run of this invocation (for the final summary).
PASSED=0
FAILED=0

log() { printf 'dev.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
  cat <<'TXT'
usage: bash tools/dev.sh COMMAND

  setup          install missing Debian packages, configure and build build/ (the library
                 and the CLIs; no tests)
  rltrain ARGS   setup, then run build/rltrain ARGS (e.g. rltrain cartpole, rltrain list)
  test           setup, build build/ with its tests (-DLUMEN_BUILD_TESTS=ON) and run every
                 ctest test there (slow ones included), then build build-asan/ with
                 ASan+UBSan and run its tests, then build build-fuzz/ (clang, libFuzzer) and
                 run each fuzz target for $LUMEN_FUZZ_SECONDS (default 60) seconds, one test
                 each; ends with "N passed, N failed"
  asan           only the sanitizer build and its tests
  fuzz [SECONDS] only the fuzz targets (tests/fuzz/fuzz_*.c), each for SECONDS (default
                 $LUMEN_FUZZ_SECONDS, else 60) on a copy of its seed corpus
  help           show this help
TXT
}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "need root for: $* (not root and no sudo)"
  fi
}

install_packages() {
  if ! command -v dpkg-query >/dev/null 2>&1; then
    log "not a Debian system: skipping package installation (needs: ${PACKAGES[*]})"
    return 0
  fi
  local p missing=()
  for p in "${PACKAGES[@]}"; do
    if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]; then
      missing+=("$p")
    fi
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  log "installing missing packages: ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}

# build_main TESTS: configures and builds build/ with LUMEN_BUILD_TESTS=TESTS (ON or OFF). The
# option is passed every time, so a build/ configured by `test` builds only the library and the
# CLIs for `setup` and `rltrain`, and `test` builds its test programs again.
build_main() {
  local tests=$1
  case "$tests" in
    ON | OFF) ;;
    *) die "build_main: TESTS must be ON or OFF, got '$tests'" ;;
  esac
  cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLUMEN_BUILD_TESTS="$tests" &&
    cmake --build build -j"$JOBS"
}

setup() {
  install_packages || die "package installation failed"
  build_main OFF || die "build failed (build/)"
}

# first_cc FLAG PROGRAM RUNARG CC...: the first CC that compiles and links PROGRAM with FLAG and
# whose result runs (given RUNARG, when not empty).
first_cc() {
  local flag=$1 program=$2 runarg=$3 cc dir
  shift 3
  dir=$(mktemp -d)
  printf '%s\n' "$program" >"$dir/t.c"
  for cc in "$@"; do
    if command -v "$cc" >/dev/null 2>&1 &&
       "$cc" "$flag" "$dir/t.c" -o "$dir/t" >/dev/null 2>&1 &&
       "$dir/t" ${runarg:+"$runarg"} >/dev/null 2>&1; then
      rm -rf "$dir"
      command -v "$cc"
      return 0
    fi
  done
  rm -rf "$dir"
  return 1
}

# The first of clang, gcc, cc that compiles, links and runs a program with ASan+UBSan.
sanitizer_cc() {
  first_cc -fsanitize=address,undefined 'int main(void) { return 0; }' "" clang gcc cc
}

# clang, if it links and runs a libFuzzer target with ASan+UBSan.
fuzzer_cc() {
  first_cc -fsanitize=fuzzer,address,undefined '#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }' -runs=1 clang
}

build_asan() {
  local args=(-S . -B build-asan -DLUMEN_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug -DLUMEN_BUILD_TESTS=ON) cc
  if [ ! -f build-asan/CMakeCache.txt ]; then
    cc=$(sanitizer_cc) || { log "no compiler here links ASan+UBSan"; return 1; }
    args+=(-DCMAKE_C_COMPILER="$cc")
  fi
  cmake "${args[@]}" && cmake --build build-asan -j"$JOBS"
}

# run_ctest DIR [ctest args...]: runs the tests (under Xvfb when there is no display, for the
# SDL viewer), adds their counts to PASSED/FAILED, returns non-zero if any failed or none ran.
run_ctest() {
  local dir=$1 out rc=0 counts total failed
  shift
  local run=(ctest --test-dir "$dir" --output-on-failure --no-tests=error "$@")
  if [ -z "${DISPLAY:-}" ] && command -v xvfb-run >/dev/null 2>&1; then
    run=(xvfb-run -a -s "-screen 0 1280x1024x24" "${run[@]}")
  fi
  out=$(mktemp)
  "${run[@]}" 2>&1 | tee "$out" || rc=$?
  counts=$(grep -Eo '[0-9]+ tests? failed out of [0-9]+' "$out" | tail -n 1 || true)
  rm -f "$out"
  if [ -n "$counts" ]; then
    failed=${counts%% *}
    total=${counts##* }
    PASSED=$((PASSED + total - failed))
    FAILED=$((FAILED + failed))
  fi
  return "$rc"
}

# Sanitizer settings; anything already in the environment wins.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# third-party libraries loaded at run time (NVRTC, PoCL, D-Bus under SDL) keep allocations
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$ROOT/tools/lsan.supp:print_suppressions=0}

# Sanitizer part. Tests labelled "slow" (end-to-end training) are left out here: under ASan at -O0
# they take several times their 600 s budget, and the plain run in build/ covers them.
asan_suite() {
  if ! build_asan; then
    log "sanitizer build failed (build-asan/)"
    return 1
  fi
  run_ctest build-asan -LE slow
}

# Fuzz part: build-fuzz/ holds the library with ASan+UBSan and fuzzer coverage and one libFuzzer
# executable per tests/fuzz/fuzz_<name>.c (CMake's LUMEN_FUZZ); only the fuzz targets are built.
build_fuzz() {
  local args=(-S . -B build-fuzz -DLUMEN_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
              -DLUMEN_CUDA=OFF -DLUMEN_SDL=OFF -DLUMEN_OPENCL=OFF -DLUMEN_BUILD_TESTS=OFF) cc
  if [ ! -f build-fuzz/CMakeCache.txt ]; then
    cc=$(fuzzer_cc) || return 1
    args+=(-DCMAKE_C_COMPILER="$cc")
  fi
  cmake "${args[@]}" && cmake --build build-fuzz -j"$JOBS" --target fuzz
}

# fuzz_one NAME SECONDS: runs build-fuzz/fuzz/fuzz_NAME for SECONDS on a copy of its seed corpus
# (tests/fuzz/corpus/NAME/, or that of the name before its first '_': fuzz_checkpoint_body
# shares checkpoint's), with tests/fuzz/NAME.dict if there is one. One test in PASSED/FAILED: a
# crash, a leak, a timeout (25 s for one input) or running out of memory fails it, and the
# reproducer's path and the fuzzer's last lines are shown; its folder is kept, else removed.
fuzz_one() {
  local name=$1 secs=$2 seeds work rc=0 extra=() repro stats
  seeds=tests/fuzz/corpus/$name
  [ -d "$seeds" ] || seeds=tests/fuzz/corpus/${name%%_*}
  [ -d "$seeds" ] || { log "fuzz_$name: no seed corpus (tests/fuzz/corpus/$name/)"; FAILED=$((FAILED + 1)); return 1; }
  [ -f "tests/fuzz/$name.dict" ] && extra+=("-dict=tests/fuzz/$name.dict")
  work=$(mktemp -d "${TMPDIR:-/tmp}/lumen-fuzz-$name.XXXXXX")
  mkdir "$work/corpus" "$work/artifacts"
  cp -R "$seeds/." "$work/corpus/"
  log "fuzz_$name: ${secs} s on a copy of $seeds/"
  "build-fuzz/fuzz/fuzz_$name" "${extra[@]}" -max_total_time="$secs" -timeout=25 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/corpus" >"$work/fuzz.log" 2>&1 || rc=$?
  stats=$(awk '/^stat::number_of_executed_units:/ { n = $2 } /^stat::average_exec_per_sec:/ { r = $2 }
               END { if (n != "") printf "%s executions, %s/s", n, r }' "$work/fuzz.log")
  repro=$(find "$work/artifacts" -type f | head -n 1)
  if [ "$rc" -eq 0 ] && [ -z "$repro" ]; then
    log "fuzz_$name: passed (${stats:-no stats})"
    PASSED=$((PASSED + 1))
    rm -rf "$work"
    return 0
  fi
  tail -n 60 "$work/fuzz.log" >&2
  log "fuzz_$name: FAILED (exit $rc; ${stats:-no stats})"
  log "fuzz_$name: reproducer: ${repro:-none written} (rerun: build-fuzz/fuzz/fuzz_$name ${repro:-FILE}; log: $work/fuzz.log)"
  FAILED=$((FAILED + 1))
  return 1
}

# Builds build-fuzz/ and runs every fuzz target for SECONDS; skipped (with a line saying so) where
# no clang here links libFuzzer.
fuzz_suite() {
  local secs=$1 src name status=0
  if ! fuzzer_cc >/dev/null; then
    log "skipping the fuzz targets: no clang here links and runs -fsanitize=fuzzer (Debian: libclang-rt-dev)"
    return 0
  fi
  if ! build_fuzz; then
    log "fuzz build failed (build-fuzz/)"
    return 1
  fi
  for src in tests/fuzz/fuzz_*.c; do
    name=$(basename "$src" .c)
    fuzz_one "${name#fuzz_}" "$secs" || status=1
  done
  return "$status"
}

fuzz_seconds() {
  local secs=${1:-${LUMEN_FUZZ_SECONDS:-60}}
  case "$secs" in
    '' | *[!0-9]* | 0) die "fuzz seconds must be a whole number of seconds, at least 1 (got '$secs')" ;;
  esac
  echo "$secs"
}

summary_and_exit() {
  local status=$1
  echo
  echo "$PASSED passed, $FAILED failed"
  exit "$status"
}

sub=${1:-help}
if [ $# -gt 0 ]; then shift; fi
case "$sub" in
  setup)
    setup
    ;;
  rltrain)
    setup >&2   # keep stdout for rltrain's own output
    exec build/rltrain "$@"
    ;;
  test)
    secs=$(fuzz_seconds)
    install_packages || die "package installation failed"
    status=0
    if build_main ON; then
      run_ctest build || status=1
    else
      log "build failed (build/)"
      status=1
    fi
    asan_suite || status=1
    fuzz_suite "$secs" || status=1
    summary_and_exit "$status"
    ;;
  asan)
    install_packages || die "package installation failed"
    status=0
    asan_suite || status=1
    summary_and_exit "$status"
    ;;
  fuzz)
    [ $# -le 1 ] || die "fuzz takes at most one argument (seconds per target), got $#"
    secs=$(fuzz_seconds "${1:-}")
    install_packages || die "package installation failed"
    status=0
    fuzz_suite "$secs" || status=1
    summary_and_exit "$status"
    ;;
  help | -h | --help)
    usage
    ;;
  *)
    usage >&2
    die "unknown command '$sub'"
    ;;
esac
