#!/usr/bin/env bash
# Build and run every test on a fresh machine: installs doctest from the system packages if missing,
# configures with the CI preset when a CUDA compiler is present (CUDA code is compiled; GPU tests run
# on a GPU and report skipped without one) or the CPU preset otherwise, builds, and runs ctest
# (host, GPU and consumer tests).  Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if ! [ -f /usr/include/doctest/doctest.h ] && ! [ -f /usr/local/include/doctest/doctest.h ] && [ -z "${CMAKE_PREFIX_PATH:-}" ]; then
  echo "doctest not found: installing doctest-dev"
  if [ "$(id -u)" = 0 ]; then apt-get install -y doctest-dev || { apt-get update && apt-get install -y doctest-dev; }
  else sudo apt-get install -y doctest-dev; fi
fi
# examples/minimal_decoder and its test need nlohmann-json; without it CMake skips them.
if ! [ -f /usr/include/nlohmann/json.hpp ] && [ -z "${CMAKE_PREFIX_PATH:-}" ]; then
  echo "nlohmann-json not found: installing nlohmann-json3-dev"
  if [ "$(id -u)" = 0 ]; then apt-get install -y nlohmann-json3-dev || { apt-get update && apt-get install -y nlohmann-json3-dev; } || true
  else sudo apt-get install -y nlohmann-json3-dev || true; fi
fi

preset=cpu
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  preset=ci
  export PATH="$PATH:/usr/local/cuda/bin"
fi
jobs=$(nproc)
cmake --preset "$preset"
cmake --build --preset "$preset" --parallel "$jobs"
ctest --preset "$preset" --parallel "$jobs"
