// Random weights generated on the GPU, for benchmark shapes (llama3-8b: 8B parameters) whose host
// generation (random_weights in checkpoint.hpp) would take minutes and 32 GB of host memory. Same
// distributions as random_weights (unit-scale embedding, 1/sqrt(fan_in) matrices, unit norms), but
// not the same numbers: the CPU and GPU paths share weights only through host_weights.

#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/cuda/cuda_engine.hpp"

namespace minimal_decoder {

BackendWeights<CudaBackend> random_device_weights(const CudaBackend& be, const ModelConfig& c, std::uint64_t seed) {
  BackendWeights<CudaBackend> w;
  std::uint64_t stream = seed * 0x100000001b3ull;  // one generator stream per tensor
  auto matrix = [&](std::int64_t rows, std::int64_t cols) {
    return be.random_matrix(int(rows), int(cols), 1.f / std::sqrt(float(cols)), ++stream);
  };
  auto ones = [&](std::int64_t n) {
    DeviceBuffer<float> v(std::size_t(n) > 0 ? std::size_t(n) : 1);
    const std::vector<float> host(v.size(), 1.f);
    be.upload(v.data(), host.data(), host.size());
    be.synchronize();  // `host` goes out of scope; uploads from pageable memory are staged anyway
    return v;
  };
  const std::int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  w.embed = be.random_matrix(int(V), int(H), 1.f, ++stream);
  w.lm_head = c.tie_word_embeddings ? be.random_matrix(int(V), int(H), 1.f, stream) : matrix(V, H);
  w.final_norm = ones(H);
  w.layers.resize(std::size_t(c.num_layers));
  for (auto& l : w.layers) {
    l.attn_norm = ones(H);
    l.mlp_norm = ones(H);
    if (c.qk_norm) l.q_norm = ones(c.head_dim), l.k_norm = ones(c.head_dim);
    l.wq = matrix(c.q_dim(), H);
    l.wk = matrix(c.kv_dim(), H);
    l.wv = matrix(c.kv_dim(), H);
    l.wo = matrix(H, c.q_dim());
    l.w_gate = matrix(I, H);
    l.w_up = matrix(I, H);
    l.w_down = matrix(H, I);
  }
  be.synchronize();
  return w;
}

}  // namespace minimal_decoder
