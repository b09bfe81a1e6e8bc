#pragma once
// What the device random weights (cuda/random_device_weights.cpp) are made of: for every random
// matrix, its generator stream, its scale and the block of the full matrix that one tensor-parallel
// rank owns. Element i of a block is the hashed normal draw (cuda/cuda_kernels.cuh, fill_normal_block)
// of (stream, block.global_index(i)) times the scale, so a rank's shard holds the values the
// unsharded model has at those positions: `--tp N` with `--random llama3-8b` runs the model TP=1 runs,
// and no rank needs the full tensors (16 GB on the host). Host code, so that a CPU test can check
// the blocks against shard_weights (tensor_parallel.hpp), the slicing of host weights.
//
// Streams: seed * 0x100000001b3, then one more per matrix in the order embed, lm_head (none of its
// own when tied: the embedding's, at the embedding's scale), then per layer wq, wk, wv, wo, w_gate,
// w_up, w_down. Scales: 1 for the embedding, 1 / sqrt(fan_in) of the FULL matrix for the others (a
// row-parallel rank's slice keeps the unsharded scale). The norms are ones and not listed here.

#include <cstdint>
#include <vector>

#include "engine/model_config.hpp"
#include "engine/tensor_block.hpp"
#include "engine/tensor_parallel.hpp"

namespace minimal_decoder {

// One random matrix of a rank: element i is N(0, scale^2) drawn from (seed, block.global_index(i)).
struct RandomTensor {
  std::uint64_t seed = 0;
  float scale = 1.f;
  TensorBlock block;
};

struct RandomDeviceLayout {
  struct Layer {
    RandomTensor wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  RandomTensor embed, lm_head;
  std::vector<Layer> layers;
};

// The random matrices of shard `s` of model `full` (tensor_parallel_shard(full, 1, 0): the whole model).
RandomDeviceLayout random_device_layout(const ModelConfig& full, std::uint64_t seed, const TensorParallelShard& s);

}  // namespace minimal_decoder
