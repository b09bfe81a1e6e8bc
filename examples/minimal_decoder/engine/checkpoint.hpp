#pragma once
// Model weights in host memory as float, from a Hugging Face checkpoint directory or from a seed.
// Matrices keep the checkpoint's nn.Linear layout, [out_features, in_features] row-major, so y = W x
// reads one contiguous row of W per output; the backend uploads them in its own precision.

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model_config.hpp"

namespace minimal_decoder {

struct LayerWeights {
  std::vector<float> attn_norm;              // [hidden]
  std::vector<float> wq, wk, wv, wo;         // [q_dim, hidden], [kv_dim, hidden] x2, [hidden, q_dim]
  std::vector<float> q_norm, k_norm;         // [head_dim], Qwen3 only
  std::vector<float> mlp_norm;               // [hidden]
  std::vector<float> w_gate, w_up, w_down;   // [inter, hidden] x2, [hidden, inter]
};

struct HostWeights {
  std::vector<float> embed;       // [vocab, hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [hidden]
  std::vector<float> lm_head;     // [vocab, hidden] (a copy of embed when tied)
};

struct Checkpoint {
  ModelConfig config;
  HostWeights weights;
};

// config.json and the safetensors weights of a Hugging Face checkpoint directory.
Checkpoint load_checkpoint(const std::string& dir);

// Random weights with the variance of a standard init (1/sqrt(fan_in)), so activations keep their
// scale through the layers and attention is not uniform; norms start at 1.
HostWeights random_weights(const ModelConfig& c, std::uint64_t seed);

}  // namespace minimal_decoder
