// Random weights generated on the GPU, for benchmark shapes (llama3-8b: 8B parameters) whose host
// generation (random_weights in checkpoint.hpp) would take minutes and 32 GB of host memory. Same
// distributions as random_weights (unit-scale embedding, 1/sqrt(fan_in) matrices, unit norms), but
// not the same numbers: the CPU and GPU paths share weights only through host_weights. What each
// matrix is drawn from is random_device_layout.hpp's: a tensor-parallel rank generates its own shard,
// the values of that slice of the unsharded model.

#include <cstdint>
#include <vector>

#include "engine/cuda/cuda_engine.hpp"
#include "engine/random_device_layout.hpp"

namespace minimal_decoder {

BackendWeights<CudaBackend> random_device_weights(const CudaBackend& be, const ModelConfig& full, std::uint64_t seed,
                                                  const TensorParallelShard& shard) {
  const RandomDeviceLayout layout = random_device_layout(full, seed, shard);
  auto matrix = [&](const RandomTensor& t) { return be.random_matrix(t.block, t.scale, t.seed); };
  auto ones = [&](std::int64_t n) {
    DeviceBuffer<float> v(std::size_t(n) > 0 ? std::size_t(n) : 1);
    const std::vector<float> host(v.size(), 1.f);
    be.upload(v.data(), host.data(), host.size());
    be.synchronize();  // `host` goes out of scope; uploads from pageable memory are staged anyway
    return v;
  };
  // The norms are replicated: every rank's are the full model's.
  const std::int64_t H = full.hidden_size;
  BackendWeights<CudaBackend> w;
  w.embed = matrix(layout.embed);
  w.lm_head = matrix(layout.lm_head);
  w.final_norm = ones(H);
  w.layers.resize(std::size_t(full.num_layers));
  for (std::size_t i = 0; i < w.layers.size(); ++i) {
    BackendWeights<CudaBackend>::Layer& l = w.layers[i];
    const RandomDeviceLayout::Layer& m = layout.layers[i];
    l.attn_norm = ones(H);
    l.mlp_norm = ones(H);
    if (full.qk_norm) l.q_norm = ones(full.head_dim), l.k_norm = ones(full.head_dim);
    l.wq = matrix(m.wq);
    l.wk = matrix(m.wk);
    l.wv = matrix(m.wv);
    l.wo = matrix(m.wo);
    l.w_gate = matrix(m.w_gate);
    l.w_up = matrix(m.w_up);
    l.w_down = matrix(m.w_down);
  }
  be.synchronize();
  return w;
}

BackendWeights<CudaBackend> random_device_weights(const CudaBackend& be, const ModelConfig& c, std::uint64_t seed) {
  return random_device_weights(be, c, seed, tensor_parallel_shard(c, 1, 0));
}

}  // namespace minimal_decoder
