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
#   FUZZ_CASES=<n>                                  KVSIFT_FUZZ_CASES under the sanitizer (default 300)
#   LOG_DIR=<dir>                                   logs (default $OUT or BUILD_DIR/sanitizer-logs)
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
LOG_DIR=${LOG_DIR:-${OUT:-$BUILD_DIR/sanitizer-logs}}
export KVSIFT_FUZZ_CASES=${FUZZ_CASES:-300}
mkdir -p "$LOG_DIR"
command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer not on PATH"; exit 2; }
bins=$(find "$BUILD_DIR/tests" -maxdepth 1 -type f -perm -u+x -name 'test_*_gpu*' 2>/dev/null | sort | grep -E -- "$ONLY" || true)
[ -n "$bins" ] || { echo "no GPU test binaries matching '$ONLY' in $BUILD_DIR/tests"; exit 2; }

status=0
rows=()
# The test cases of a binary, one name per line (doctest's listing, minus its banner lines).
test_cases() { "$1" --list-test-cases --no-intro 2>/dev/null | grep -vE '^\[doctest\]|^=+$|^GPU tests on|^kvsift|^$' ; }

run_one() {  # binary tool label [doctest filter]
  local bin=$1 tool=$2 label=$3 filter=${4:-}
  local log="$LOG_DIR/$(basename "$bin")-$tool-${label//[^A-Za-z0-9_.-]/_}.log"
  local extra=()
  [ "$tool" = racecheck ] && extra+=(--racecheck-report hazard)
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
  local verdict=ok
  if [ $rc -eq 124 ]; then verdict="TIMEOUT (${TIMEOUT}s)"; status=1
  elif [ $rc -eq 77 ]; then verdict="SKIPPED (no device)"; status=1
  elif [ $rc -ne 0 ]; then verdict="FAILED rc=$rc"; status=1
  elif [ -n "$n" ] && [ "$n" != 0 ]; then verdict="FAILED"; status=1
  fi
  rows+=("$(printf '%-32s %-10s %-48s %8s %6ss  %s' "$(basename "$bin")" "$tool" "${label:0:48}" "${n:-?}" "$dt" "$verdict")")
  echo "${rows[-1]}"
}

printf '%-32s %-10s %-48s %8s %7s  %s\n' binary tool "run" "errors" time status
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
        run_one "$bin" "$tool" "$tc" "$f"
      done < <(test_cases "$bin")
    else
      run_one "$bin" "$tool" "whole binary"
    fi
  done
done

echo; echo "==== compute-sanitizer summary ($BUILD_DIR; logs in $LOG_DIR)"
printf '%-32s %-10s %-48s %8s %7s  %s\n' binary tool "run" "errors" time status
printf '%s\n' "${rows[@]}"
exit $status
