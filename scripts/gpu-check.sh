#!/usr/bin/env bash
# One call on a GPU machine checks everything: builds the GPU preset, runs all tests (GPU ones must
# pass, not skip), runs compute-sanitizer memcheck, racecheck, initcheck and synccheck over every GPU
# test binary (scripts/gpu-sanitize.sh), and runs the benchmarks. Logs go to $LOG_DIR (default
# build/gpu-check-logs; $OUT when that is set). Only the sanitizers, over an existing build dir:
#   scripts/gpu-check.sh sanitize [BUILD_DIR]    (TOOLS, ONLY, TIMEOUT, SPLIT: see gpu-sanitize.sh)
#
#   scripts/gpu-check.sh                      everything
#   SKIP_BENCH=1 scripts/gpu-check.sh         no benchmarks
#   SKIP_SANITIZER=1 scripts/gpu-check.sh     no compute-sanitizer
#   ONLY=topk scripts/gpu-check.sh            only GPU tests / benchmarks whose name contains "topk"
#   BENCH_ARGS="--benchmark_min_time=0.2" scripts/gpu-check.sh
#   SANITIZER_TIMEOUT=300                     seconds per sanitizer run (default 600)
#   SANITIZER_TOOLS="memcheck initcheck"      a subset of the four tools
#   PRESET=gpu-sm90 scripts/gpu-check.sh      another configure preset (build/<preset>): gpu-sm90 is the
#                                             portable sm_90 build (window scores on mma.sync, not wgmma)
set -uo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-gpu}
if [ "${1:-}" = sanitize ]; then exec scripts/gpu-sanitize.sh "${2:-build/$PRESET}"; fi
LOG_DIR=${LOG_DIR:-${OUT:-build/gpu-check-logs}}
mkdir -p "$LOG_DIR"
ONLY=${ONLY:-}
status=0
summary=()
note() { summary+=("$1"); echo "== $1"; }

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$LOG_DIR/gpu.txt"

cmake --preset "$PRESET" >"$LOG_DIR/configure.log" 2>&1 || { tail -30 "$LOG_DIR/configure.log"; exit 1; }
if ! cmake --build --preset "$PRESET" --parallel "$(nproc)" >"$LOG_DIR/build.log" 2>&1; then
  grep -E "error|Error" "$LOG_DIR/build.log" | head -40; exit 1
fi
note "build: ok"

# Every GPU test must run (a skip on a GPU machine is a failure here) and pass.
ctest_args=(--test-dir "build/$PRESET" --output-on-failure --parallel 4)
[ -n "$ONLY" ] && ctest_args+=(-R "$ONLY")
ctest "${ctest_args[@]}" -LE consumer >"$LOG_DIR/ctest.log" 2>&1; rc=$?
grep -E "tests passed|Skipped|Failed|\*\*\*" "$LOG_DIR/ctest.log"
if [ $rc -ne 0 ] || grep -q "Skipped" "$LOG_DIR/ctest.log"; then status=1; note "tests: FAILED or skipped (see ctest.log)"; else note "tests: all passed"; fi

# compute-sanitizer, all four tools by default, through scripts/gpu-sanitize.sh (its table is printed).
if [ -z "${SKIP_SANITIZER:-}" ]; then
  ONLY="${ONLY:-.}" TIMEOUT="${SANITIZER_TIMEOUT:-600}" TOOLS="${SANITIZER_TOOLS:-memcheck racecheck initcheck synccheck}" \
    LOG_DIR="$LOG_DIR/sanitizer" scripts/gpu-sanitize.sh "build/$PRESET"
  if [ $? -ne 0 ]; then status=1; note "sanitizers: FAILED (table above, logs in $LOG_DIR/sanitizer)"; else note "sanitizers: clean"; fi
fi

if [ -z "${SKIP_BENCH:-}" ]; then
  for b in $(ls "build/$PRESET"/benchmarks/bench_* 2>/dev/null | grep -- "${ONLY}"); do
    name=$(basename "$b")
    "$b" --benchmark_counters_tabular=true ${BENCH_ARGS:-} --benchmark_out="$LOG_DIR/$name.json" \
      --benchmark_out_format=json >"$LOG_DIR/$name.txt" 2>&1 || { status=1; note "$name: FAILED"; }
    cat "$LOG_DIR/$name.txt"
  done
fi

echo; echo "==== gpu-check summary"; printf '%s\n' "${summary[@]}"
exit $status
