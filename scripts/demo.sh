#!/usr/bin/env bash
# Build and run the demos: on the GPU when this machine has one (and nvcc), otherwise on the CPU
# through the host backend.  Usage: scripts/demo.sh
#   1. examples/quickstart: kvsift's views, every prompt-compression policy and one LycheeDecode step
#      on synthetic data.
#   2. examples/minimal_decoder on the random `tiny` model: every policy side by side against dense
#      (top-1 agreement, KL, decode speed, KV memory) on a ragged batch of two prompts.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-packages.sh
ensure_package nlohmann-json3-dev nlohmann/json.hpp optional  # the minimal decoder's JSON parser
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="$PATH:/usr/local/cuda/bin"; fi
cmake --preset demo
cmake --build --preset demo --parallel "$(nproc)"
./build/demo/examples/quickstart/quickstart
if [ -x build/demo/examples/minimal_decoder/minimal_decoder ]; then
  echo
  echo "== minimal decoder, random tiny model: every policy against dense =="
  ./build/demo/examples/minimal_decoder/minimal_decoder --random tiny --random-prompts 600,400 --new-tokens 16 --compare \
    --cp 128 --window 16 --theta 0.05 --num-block 32 --lychee-budget 128 --lychee-sink 16 --lychee-recent 32
else
  echo "(minimal decoder skipped: nlohmann-json is not installed)"
fi
