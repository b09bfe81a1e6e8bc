#!/usr/bin/env bash
# A/B of one benchmark between two source trees, on one machine in one go: builds the benchmark in
# each tree (Release, sm_90 or $ARCH, that target only, both builds at once), runs the two binaries in turn
# ROUNDS times with the same filter, and prints every row's us_median per run with the ratio of the
# medians (B / A). Alternating the binaries spreads clock and thermal drift over both; every quoted
# "before / after" in docs/performance.md is meant to come from such a run.
#
#   scripts/bench-ab.sh BENCH FILTER TREE_A TREE_B [ROUNDS]
#
#   BENCH     a benchmark target (bench_topk, bench_decode_attention, bench_lycheedecode, ...)
#   FILTER    --benchmark_filter regex
#   TREE_A/B  source trees; `git archive REV | tar -x -C DIR` makes one of a commit (on the GPU
#             machine there is no .git: make it here, in a folder .git/info/exclude ignores, and carry it)
#   ROUNDS    default 2
#   MIN_TIME  --benchmark_min_time (default 0.05: Google Benchmark 1.7 wants a bare number)
#   JOBS      build parallelism per tree (default half the cores)
#   NO_BUILD  1: run the binaries an earlier call built (TREE/build/bench-ab), without building
#   ARCH      CMAKE_CUDA_ARCHITECTURES of both builds (default 90a)
#   CUDAFLAGS extra nvcc flags of both builds (CMake reads them), e.g. -DKVSIFT_NO_WGMMA (the mma.sync
#             window scores on sm_90a)
#   CUDAFLAGS_B  extra nvcc flags of B's build only (a measurement build of one tree against itself: give
#             B a copy of A's tree, since a build folder keeps the flags of its first configure)
#
# Example: git archive HEAD~1 | (mkdir -p .ab/a && tar -x -C .ab/a), then on the GPU machine
#   scripts/bench-ab.sh bench_topk 'BM_TopK/rows:8/' .ab/a . 2
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,25p' "$0"; exit 2; }
bench=$1 filter=$2 tree_a=$3 tree_b=$4 rounds=${5:-2}
min_time=${MIN_TIME:-0.05}
jobs=${JOBS:-$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))}
out=$(mktemp -d)

build() {  # tree label
  local dir="$1/build/bench-ab" flags=${CUDAFLAGS:-}
  [ "$2" = B ] && flags="$flags ${CUDAFLAGS_B:-}"
  CUDAFLAGS="$flags" cmake -S "$1" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DKVSIFT_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${ARCH:-90a} \
    -DKVSIFT_BUILD_TESTS=OFF -DKVSIFT_BUILD_BENCHMARKS=ON -DKVSIFT_BUILD_EXAMPLES=OFF >"$out/$2-configure.log" 2>&1 &&
    cmake --build "$dir" --target "$bench" --parallel "$jobs" >"$out/$2-build.log" 2>&1 ||
    { echo "bench-ab.sh: the build of $2 ($1) failed:"; grep -E "error" "$out/$2-build.log" "$out/$2-configure.log" | head -20; return 1; }
}
if [ "${NO_BUILD:-0}" != 1 ]; then
  build "$tree_a" A & pa=$!
  build "$tree_b" B & pb=$!
  wait $pa && wait $pb
fi

for r in $(seq 1 "$rounds"); do
  for side in A B; do
    if [ $side = A ]; then tree=$tree_a; else tree=$tree_b; fi
    "$tree/build/bench-ab/benchmarks/$bench" --benchmark_filter="$filter" --benchmark_min_time="$min_time" \
      --benchmark_out="$out/$side-$r.json" --benchmark_out_format=json >"$out/$side-$r.txt" 2>&1 ||
      { echo "bench-ab.sh: $side run $r failed:"; tail -20 "$out/$side-$r.txt"; exit 1; }
  done
done

python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {s: [json.load(open(f"{out}/{s}-{r}.json"))["benchmarks"] for r in range(1, rounds + 1)] for s in "AB"}
def value(b):  # the harness's us_median counter, else Google Benchmark's own real time in us
    return b.get("us_median", b["real_time"] * {"ns": 1e-3, "us": 1, "ms": 1e3, "s": 1e6}[b.get("time_unit", "ns")])
def rows(side):  # the iteration rows' names of a side's first run, in order
    return [b["name"] for b in runs[side][0] if b.get("run_type", "iteration") == "iteration"]
names = rows("A") + [n for n in rows("B") if n not in rows("A")]  # a benchmark only one tree has: its own line
width = max([len(n) for n in names] + [9])
print(f"{'benchmark':<{width}}  " + "  ".join(f"A{r}".rjust(9) for r in range(1, rounds + 1)) + "  " +
      "  ".join(f"B{r}".rjust(9) for r in range(1, rounds + 1)) + "      B/A")
def values(side, n):  # the row's value per run, or None where the side has no such row
    found = [[value(b) for b in run if b["name"] == n] for run in runs[side]]
    return None if not all(found) else [f[0] for f in found]
blank = "  ".join(" " * 9 for _ in range(rounds))
for n in names:
    a, b = values("A", n), values("B", n)
    cells = lambda v: "  ".join(f"{x:9.2f}" for x in v) if v else blank
    if a and b and statistics.median(a) > 0:
        ratio = f"{statistics.median(b) / statistics.median(a):7.3f}"
    else:
        ratio = "(only " + ("A" if a else "B") + ")"
    print(f"{n:<{width}}  {cells(a)}  {cells(b)}  {ratio}")
PY
