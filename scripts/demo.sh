#!/usr/bin/env bash
# Build and run the quickstart: on the GPU when this machine has one (and nvcc), otherwise on the CPU
# through the host backend.  Usage: scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="$PATH:/usr/local/cuda/bin"; fi
cmake --preset demo
cmake --build --preset demo --parallel "$(nproc)"
./build/demo/examples/quickstart/quickstart
