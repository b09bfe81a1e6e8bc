#!/usr/bin/env bash
# Build and run every test on a fresh machine: installs doctest from the system packages if missing,
# configures with the CI preset when a CUDA compiler is present (CUDA code is compiled; GPU tests run
# on a GPU and report skipped without one) or the CPU preset otherwise, builds, and runs ctest
# (host, GPU and consumer tests).  Usage: scripts/test.sh
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
ctest --preset "$preset" --parallel "$jobs"
