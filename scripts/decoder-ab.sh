#!/usr/bin/env bash
# A/B of the minimal decoder's decode step between two source trees, on one machine in one go: builds
# minimal_decoder in each tree (Release, both builds at once), then for every cell (policy x context x
# batch) runs the two binaries in turn ROUNDS times and prints each run's median step (ms, graph replay)
# with the ratio of the medians (B / A). The decoder-level twin of scripts/bench-ab.sh.
#
# The A side of a change is the commit before it. A knob inside the new tree (new path off / on in one
# binary) is not a before: the tile claims of the twenty-seventh session were timed that way, against
# fixed shares that the change itself had slowed, and cost every batch-1 step ~0.5 ms for four sessions
# (docs/performance.md, thirty-first session).
#
#   scripts/decoder-ab.sh TREE_A TREE_B [ROUNDS]
#
#   TREE_A/B    source trees; `git archive REV | tar -x -C DIR` makes one of a commit (made here, in a
#               folder .git/info/exclude ignores, and carried to the GPU machine)
#   ROUNDS      default 2
#   POLICIES    default "clusterattn lycheedecode dense" (benchmarks/minimal_decoder_policies.sh)
#   CONTEXTS    tokens per sequence, default 131072 (the prompt is CONTEXT - NEW_TOKENS)
#   BATCHES     default 1
#   LAYOUT      contiguous (default) or paged
#   NEW_TOKENS  default 16
#   MODEL       --random shape, default llama3-8b (tiny: a CPU check of the script itself)
#   DEVICE      gpu (default: synthetic prefill, CUDA build) or cpu (real prefill, CPU build)
#   ENV_A/ENV_B extra environment of one side's runs, e.g. ENV_B="MINIMAL_DECODER_GEMV_GRID=balanced"
#               (with TREE_A = TREE_B: a knob's two settings, for a knob that is not a before)
#   JOBS        build parallelism per tree (default half the cores)
#   NO_BUILD    1: run the binaries an earlier call built (TREE/build/decoder-ab), without building
#   ARCH        CMAKE_CUDA_ARCHITECTURES of both builds (default 90a)
#   CUDAFLAGS_B extra nvcc flags of B's build only (a measurement build, e.g. -DKVSIFT_DECODE_DEEP_RING on a
#               branch that has it; a build folder keeps the flags of its first configure)
#
# Example: git archive HEAD~1 | (mkdir -p .ab/a && tar -x -C .ab/a), then on the GPU machine
#   BATCHES="1 4" scripts/decoder-ab.sh .ab/a . 2
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,30p' "$0"; exit 2; }
tree_a=$1 tree_b=$2 rounds=${3:-2}
policies=${POLICIES:-clusterattn lycheedecode dense}
contexts=${CONTEXTS:-131072}
batches=${BATCHES:-1}
layout=${LAYOUT:-contiguous}
new_tokens=${NEW_TOKENS:-16}
model=${MODEL:-llama3-8b}
device=${DEVICE:-gpu}
jobs=${JOBS:-$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))}
[[ $device == gpu || $device == cpu ]] || { echo "decoder-ab.sh: DEVICE is gpu or cpu, not '$device'" >&2; exit 2; }
source "$(cd "$(dirname "$0")/.." && pwd)/benchmarks/minimal_decoder_policies.sh"  # policy_args
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

build() {  # tree label
  local dir="$1/build/decoder-ab" cuda=ON flags=${CUDAFLAGS:-}
  [[ $2 == B ]] && flags="$flags ${CUDAFLAGS_B:-}"
  [[ $device == cpu ]] && cuda=OFF
  local arch=()
  [[ $cuda == ON ]] && arch=(-DCMAKE_CUDA_ARCHITECTURES="${ARCH:-90a}")
  CUDAFLAGS="$flags" cmake -S "$1" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DKVSIFT_ENABLE_CUDA=$cuda "${arch[@]}" \
    -DKVSIFT_BUILD_TESTS=OFF -DKVSIFT_BUILD_BENCHMARKS=OFF -DKVSIFT_BUILD_EXAMPLES=ON >"$out/$2-configure.log" 2>&1 &&
    cmake --build "$dir" --target minimal_decoder --parallel "$jobs" >"$out/$2-build.log" 2>&1 ||
    { echo "decoder-ab.sh: the build of $2 ($1) failed:"; grep -E "error" "$out/$2-build.log" "$out/$2-configure.log" | head -20; return 1; }
}
if [ "${NO_BUILD:-0}" != 1 ]; then
  build "$tree_a" A & pa=$!
  build "$tree_b" B & pb=$!
  wait $pa && wait $pb
fi

step() {  # side tree policy context batch: the median step in ms, or "failed"
  local side=$1 tree=$2 policy=$3 context=$4 batch=$5
  local env_side=${ENV_A:-}
  [[ $side == B ]] && env_side=${ENV_B:-}
  local lengths
  lengths=$(printf "$((context - new_tokens))%.0s," $(seq "$batch"))
  local args=(--random "$model" --random-prompts "${lengths%,}" --new-tokens "$new_tokens" --quiet --device "$device"
              --kv-layout "$layout" --no-attention-timing)
  [[ $device == gpu ]] && args+=(--synthetic-prefill)
  # The median step is read from the roofline line, which the CPU prints only with a bandwidth given.
  [[ $device == cpu ]] && args+=(--roofline-tbps 1)
  local log
  # shellcheck disable=SC2086,SC2046  # ENV_x and policy_args are word lists
  log=$(env $env_side "$tree/build/decoder-ab/examples/minimal_decoder/minimal_decoder" "${args[@]}" \
        $(policy_args "$policy" "$tree") 2>&1) ||
    { grep -m1 -i -E 'error|out of memory' <<<"$log" >"$out/failure" || tail -n1 <<<"$log" >"$out/failure"; echo failed; return; }
  sed -n 's/.*median step \([0-9.]*\) ms.*/\1/p' <<<"$(grep '^roofline:' <<<"$log")"
}

printf '%-12s %-8s %-5s %-5s %10s %10s\n' policy context batch round "A ms" "B ms"
for context in $contexts; do
  for batch in $batches; do
    for policy in $policies; do
      a=() b=()
      for r in $(seq 1 "$rounds"); do
        a+=("$(step A "$tree_a" "$policy" "$context" "$batch")")
        b+=("$(step B "$tree_b" "$policy" "$context" "$batch")")
        printf '%-12s %-8s %-5s %-5s %10s %10s\n' "$policy" "$context" "$batch" "$r" "${a[-1]}" "${b[-1]}"
      done
      python3 - "${a[*]}" "${b[*]}" <<'PY'
import statistics, sys
def med(s):
    v = [float(x) for x in s.split() if x != "failed"]
    return statistics.median(v) if v else None
a, b = med(sys.argv[1]), med(sys.argv[2])
print(f"{'':12} {'':8} {'':5} {'med':5} {a:10.3f} {b:10.3f}   B/A {b / a:.3f}" if a and b else "   (a side failed)")
PY
      [[ " ${a[*]} ${b[*]} " == *" failed "* && -s $out/failure ]] && echo "   first failure: $(cat "$out/failure")"
    done
  done
done
