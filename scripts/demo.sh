#!/usr/bin/env bash
# Build and run the demos: on the GPU when this machine has one (and nvcc), otherwise on the CPU
# through the host backend.  Usage: scripts/demo.sh
#   1. examples/quickstart: kvsift's views, every prompt-compression policy and one LycheeDecode step
#      on synthetic data.
#   2. examples/minimal_decoder on the random `tiny` model: every policy side by side against dense
#      (top-1 agreement, KL, decode speed, KV memory) on a ragged batch of two prompts. Random weights
#      say nothing about fidelity; with KVSIFT_MODEL_DIR pointing at a passkey checkpoint (a directory
#      with config.json, the safetensors and prompts_shared.txt, e.g. passkey-llama-13m) the demo
#      prints that checkpoint's passkey accuracy table instead (docs/fidelity.md).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-packages.sh
ensure_package nlohmann-json3-dev nlohmann/json.hpp optional  # the minimal decoder's JSON parser
ensure_package libcli11-dev CLI/CLI.hpp optional              # the minimal decoder's command line
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="$PATH:/usr/local/cuda/bin"; fi
cmake --preset demo
cmake --build --preset demo --parallel "$(nproc)"
./build/demo/examples/quickstart/quickstart
decoder=build/demo/examples/minimal_decoder/minimal_decoder
if [ ! -x "$decoder" ]; then
  echo "(minimal decoder skipped: nlohmann-json or CLI11 is not installed)"
  exit 0
fi
model=${KVSIFT_MODEL_DIR:-}
if [ -n "$model" ] && [ -f "$model/prompts_shared.txt" ]; then
  # The settings docs/fidelity.md reports (Cp 128, W 8; ClusterAttn theta 0.5, 128 blocks; LycheeDecode
  # budget 128 with sink 8, recent 16), on 4 prompts of each length; the trained roles when this
  # repository has them for the checkpoint (examples/minimal_decoder/roles/<name>.roles).
  roles=examples/minimal_decoder/roles/$(basename "$model").roles
  roles_args=()
  [ -f "$roles" ] && roles_args=(--roles "$roles")
  echo
  echo "== minimal decoder, $model: passkey accuracy of every policy (4 prompts per length; ~1 minute on a CPU) =="
  "$decoder" --model "$model" --eval-passkey "$model/prompts_shared.txt" --lengths 1024,2048 --limit 4 --eval-batch 4 \
    --cp 128 --window 8 --theta 0.5 --num-block 128 --lycheedecode-budget 128 --lycheedecode-sink 8 --lycheedecode-recent 16 "${roles_args[@]}"
  echo "(accuracy: the prompts whose five answer digits all match; docs/fidelity.md has 16 prompts per length, 8K too)"
else
  [ -n "$model" ] && echo "(KVSIFT_MODEL_DIR=$model has no prompts_shared.txt: showing the random model instead)"
  echo
  echo "== minimal decoder, random tiny model: every policy against dense =="
  "$decoder" --random tiny --random-prompts 600,400 --new-tokens 16 --compare \
    --cp 128 --window 16 --theta 0.05 --num-block 32 --lycheedecode-budget 128 --lycheedecode-sink 16 --lycheedecode-recent 32
fi
