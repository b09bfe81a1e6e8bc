#!/usr/bin/env bash
# Build and run every test on a fresh machine: installs doctest from the system packages if missing,
# configures with the CI preset when a CUDA compiler is present (CUDA code is compiled; GPU tests run
# on a GPU and report skipped without one) or the CPU preset otherwise, builds, and runs ctest
# (host, GPU, consumer and docs tests). The last lines count passed, skipped and failed tests (ctest's own
# "100% tests passed" counts a skipped GPU test as not failed); the exit status is ctest's.
# Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/ensure-packages.sh
ensure_package doctest-dev doctest/doctest.h required
# examples/minimal_decoder and its tests need nlohmann-json and CLI11; without them CMake skips them.
ensure_package nlohmann-json3-dev nlohmann/json.hpp optional
ensure_package libcli11-dev CLI/CLI.hpp optional

preset=cpu
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  preset=ci
  export PATH="$PATH:/usr/local/cuda/bin"
fi
jobs=$(nproc)
cmake --preset "$preset"
cmake --build --preset "$preset" --parallel "$jobs"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
set +e
ctest --preset "$preset" --parallel "$jobs" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
# One line per test in ctest's progress output: "  3/41 Test  #7: gpu.test_topk_gpu ....***Skipped  0.01 sec".
awk '
  /^ *[0-9]+\/[0-9]+ +Test +#[0-9]+: / {
    total++; name = $4
    if ($0 ~ /\*\*\*Skipped/) {
      skipped++
      why = ""
      if (name ~ /fidelity/) why = ": no checkpoint in KVSIFT_TEST_MODEL_DIR"
      else if (name ~ /^docs\./) why = ": no doxygen"
      if (name ~ /^gpu\./) gpu++
      else other = other (other != "" ? "; " : "") name why
    } else if ($0 ~ / Passed /) passed++
    else { failed++; failures = failures " " name }
  }
  END {
    if (total == 0) exit
    why = ""
    if (gpu) why = gpu " GPU test" (gpu > 1 ? "s" : "") " need a GPU"
    if (other != "") why = why (why != "" ? "; " : "") other
    printf "\nkvsift: %d tests passed, %d skipped%s, %d failed, of %d\n", passed, skipped,
           (skipped ? " (" why ")" : ""), failed, total
    if (failed) printf "kvsift: failed:%s\n", failures
  }' "$log"
exit "$rc"
