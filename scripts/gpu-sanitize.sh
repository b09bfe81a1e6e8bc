#!/usr/bin/env bash
# compute-sanitizer over GPU test binaries: every binary x tool, one run per test case where a binary
# is split (SPLIT), each run under a timeout; prints a table (binary, tool, errors or hazards, time,
# status) and exits non-zero on any error, hazard, crash or timeout. Parametrized so a subset fits
# one 10-minute GPU call:
#
#   scripts/gpu-sanitize.sh [BUILD_DIR]             default build/gpu; binaries BUILD_DIR/tests/test_*_gpu*
#                                                   (test_*_gpu and the split ones: *_gpu_fp8, *_gpu_paths, ...)
#   TOOLS="memcheck racecheck initcheck synccheck"  the tools (default: all four)
#   ONLY=<regex>                                    binaries whose name matches (grep -E)
#   TIMEOUT=<s>                                     seconds per run (default 300)
#   SPLIT=<regex>                                   binaries run one doctest test case per run (-tc=);
#                                                   default: the slow ones under racecheck (topk, decode, fuzz)
#   SPLIT_TOOLS="racecheck"                         tools that split (default racecheck; "all" for every tool)
#   CASES=<regex>                                   split binaries: only the test cases whose name matches
#   FUZZ_CASES=<n>                                  KVSIFT_FUZZ_CASES under the sanitizer (default 300)
#   CONCURRENCY_ROUNDS=<n> CONCURRENCY_LAUNCHES=<n> test_concurrency_gpu's repetitions (default 2 and 60)
#   FULL=1                                          the tests' repeats of one path too (KVSIFT_UNDER_TOOL
#                                                   unset: tests/support/tool_scale.hpp)
#   LOG_DIR=<dir>                                   logs (default $OUT or BUILD_DIR/sanitizer-logs)
#   JOBS=<n>                                        runs at once (default 1). The sanitizers are mostly
#                                                   host-bound and one test leaves the GPU idle, so several
#                                                   processes share it well; times then include the sharing
#   RACECHECK_WORKERS=<n>                           racecheck's CPU worker threads a run (default cores / JOBS;
#                                                   set it when several invocations run at once)
#   SUPPRESSIONS=<file>                             compute-sanitizer --suppressions (default
#                                                   scripts/sanitizer-suppressions.xml; empty: none)
#
# Examples (each within a 10-minute call):
#   TOOLS=initcheck scripts/gpu-sanitize.sh build/gpu
#   TOOLS=racecheck ONLY=topk TIMEOUT=240 scripts/gpu-sanitize.sh build/gpu
set -uo pipefail
BUILD_DIR=${1:-build/gpu}
TOOLS=${TOOLS:-memcheck racecheck initcheck synccheck}
ONLY=${ONLY:-.}
TIMEOUT=${TIMEOUT:-300}
SPLIT=${SPLIT:-topk|decode_attention|fuzz|minimal_decoder}
SPLIT_TOOLS=${SPLIT_TOOLS:-racecheck}
CASES=${CASES:-.}
LOG_DIR=${LOG_DIR:-${OUT:-$BUILD_DIR/sanitizer-logs}}
JOBS=${JOBS:-1}
# racecheck analyses its events on CPU worker threads (--racecheck-num-workers; unset, every process
# picks its own number), so JOBS racecheck runs at once get the cores split between them instead
# (RACECHECK_WORKERS overrides).
RACECHECK_WORKERS=${RACECHECK_WORKERS:-$(( $(nproc) / JOBS > 0 ? $(nproc) / JOBS : 1 ))}
# One report is not kvsift's and is suppressed: NCCL's communicator set-up asks cudaFuncGetAttributes
# about kernels of its own that have no image for the device and carries on without them; memcheck
# reports each such return as an API error (test_tensor_parallel_gpu: 8, all under ncclCommInitAll).
# kvsift's own code never calls it; where CUB does (its PTX-version probe), a missing image would fail
# every launch after it, which the tests report. The file is matched by kind, API and error code only.
SUPPRESSIONS=${SUPPRESSIONS-$(cd "$(dirname "$0")" && pwd)/sanitizer-suppressions.xml}
export KVSIFT_FUZZ_CASES=${FUZZ_CASES:-300}
# A tool checks each kernel's own accesses, which one run of a path covers as well as many: the GPU
# tests drop their repeats of one path (tests/support/tool_scale.hpp; FULL=1 runs them whole), and
# test_concurrency_gpu runs fewer rounds and launches (8 and 3000 a thread unsanitized).
[ "${FULL:-0}" = 1 ] || export KVSIFT_UNDER_TOOL=1
export KVSIFT_CONCURRENCY_ROUNDS=${CONCURRENCY_ROUNDS:-2} KVSIFT_CONCURRENCY_LAUNCHES=${CONCURRENCY_LAUNCHES:-60}
mkdir -p "$LOG_DIR"
rows_dir=$(mktemp -d)
trap 'rm -rf "$rows_dir"' EXIT
command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer not on PATH"; exit 2; }
bins=$(find "$BUILD_DIR/tests" -maxdepth 1 -type f -perm -u+x -name 'test_*_gpu*' 2>/dev/null | sort | grep -E -- "$ONLY" || true)
[ -n "$bins" ] || { echo "no GPU test binaries matching '$ONLY' in $BUILD_DIR/tests"; exit 2; }

# The test cases of a binary, one name per line (doctest's listing, minus its banner lines).
test_cases() { "$1" --list-test-cases --no-intro 2>/dev/null | grep -vE '^\[doctest\]|^=+$|^GPU tests on|^kvsift|^$' ; }

run_one() {  # binary tool label [doctest filter]: prints the run's row
  local bin=$1 tool=$2 label=$3 filter=${4:-}
  local log="$LOG_DIR/$(basename "$bin")-$tool-${label//[^A-Za-z0-9_.-]/_}.log"
  local extra=()
  [ -n "$SUPPRESSIONS" ] && extra+=(--suppressions "$SUPPRESSIONS")
  [ "$tool" = racecheck ] && extra+=(--racecheck-report hazard --racecheck-num-workers "$RACECHECK_WORKERS")
  local t0=$SECONDS
  if [ -n "$filter" ]; then
    timeout "$TIMEOUT" compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 3 "$bin" "-tc=$filter" >"$log" 2>&1
  else
    timeout "$TIMEOUT" compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 3 "$bin" >"$log" 2>&1
  fi
  local rc=$? dt=$((SECONDS - t0))
  # "ERROR SUMMARY: N errors" (memcheck, initcheck, synccheck) or "RACECHECK SUMMARY: N hazards
  # displayed (E errors, W warnings)": the first count of the line (racecheck's line has three).
  local n
  n=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1 | grep -oE '[0-9]+ (error|hazard)' | head -1 | grep -oE '^[0-9]+' || true)
  # A crash of the test process leaves the frames of tests/support/crash_trace.hpp: name them.
  if grep -q "fatal signal, stack" "$log" && command -v addr2line >/dev/null; then
    grep -oE '^[^ (]+\(\+0x[0-9a-f]+\)' "$log" | while IFS= read -r frame; do
      local obj=${frame%%(*} off=${frame#*(+}; off=${off%)}
      echo "  $frame  $(addr2line -C -f -e "$obj" "$off" 2>/dev/null | head -1)"
    done >>"$log.frames"
    { echo "== crash frames, $(basename "$log"):"; head -20 "$log.frames"; } >&2  # stdout is the row
  fi
  local verdict=ok
  if [ $rc -eq 124 ]; then verdict="TIMEOUT (${TIMEOUT}s)"
  elif [ $rc -eq 77 ]; then verdict="SKIPPED (no device)"
  elif [ $rc -ne 0 ]; then verdict="FAILED rc=$rc"
  elif [ -n "$n" ] && [ "$n" != 0 ]; then verdict="FAILED"
  fi
  printf '%-32s %-10s %-96s %8s %6ss  %s\n' "$(basename "$bin")" "$tool" "${label:0:96}" "${n:-?}" "$dt" "$verdict"
}

# Starts run_one in the background once fewer than JOBS runs are going; its row lands in rows_dir under
# the run's sequence number, so the summary keeps the order of the loops below.
runs=0
launch() {
  runs=$((runs + 1))
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  local row="$rows_dir/$(printf '%05d' "$runs")"
  { run_one "$@" >"$row"; cat "$row"; } </dev/null &
}

printf '%-32s %-10s %-96s %8s %7s  %s\n' binary tool "run" "errors" time status
for bin in $bins; do
  for tool in $TOOLS; do
    split=0
    if echo "$(basename "$bin")" | grep -qE -- "$SPLIT"; then
      if [ "$SPLIT_TOOLS" = all ] || echo " $SPLIT_TOOLS " | grep -q " $tool "; then split=1; fi
    fi
    if [ $split -eq 1 ]; then
      while IFS= read -r tc; do
        [ -n "$tc" ] || continue
        # doctest filters are wildcards: escape the ones a name may hold.
        f=${tc//\*/\\*}; f=${f//\?/\\?}; f=${f//,/\\,}
        launch "$bin" "$tool" "$tc" "$f"
      done < <(test_cases "$bin" | grep -E -- "$CASES")
    else
      launch "$bin" "$tool" "whole binary"
    fi
  done
done

wait
echo; echo "==== compute-sanitizer summary ($BUILD_DIR; logs in $LOG_DIR)"
printf '%-32s %-10s %-96s %8s %7s  %s\n' binary tool "run" "errors" time status
cat "$rows_dir"/*
# Any row whose status is not "ok" (an error, hazard, crash, time-out or skip) fails the sweep.
if grep -qvE ' ok$' "$rows_dir"/*; then exit 1; fi
exit 0
