#include "engine/random_device_layout.hpp"

#include <cmath>

namespace minimal_decoder {

RandomDeviceLayout random_device_layout(const ModelConfig& full, std::uint64_t seed, const TensorParallelShard& s) {
  const std::int64_t H = full.hidden_size, D = full.head_dim, I = full.intermediate_size, V = full.vocab_size;
  const std::int64_t Q = full.q_dim();
  const std::int64_t q0 = std::int64_t(s.first_q_head) * D, nq = std::int64_t(s.q_heads) * D;
  const std::int64_t k0 = std::int64_t(s.first_kv_head) * D, nk = std::int64_t(s.kv_heads) * D;
  const std::int64_t i0 = s.first_intermediate, ni = s.intermediate;
  std::uint64_t stream = seed * 0x100000001b3ull;  // one generator stream per matrix
  // The scale is the full matrix's fan-in (its row length), whatever block of it the rank holds.
  auto tensor = [&](const TensorBlock& block) {
    return RandomTensor{++stream, 1.f / std::sqrt(float(block.full_cols)), block};
  };
  RandomDeviceLayout l;
  l.embed = RandomTensor{++stream, 1.f, TensorBlock::whole(V, H)};  // unit scale, replicated
  const TensorBlock lm = TensorBlock::row_range(s.first_vocab, s.vocab, H);  // vocab-parallel
  l.lm_head = full.tie_word_embeddings ? RandomTensor{l.embed.seed, l.embed.scale, lm} : tensor(lm);
  l.layers.resize(std::size_t(full.num_layers));
  for (RandomDeviceLayout::Layer& y : l.layers) {
    y.wq = tensor(TensorBlock::row_range(q0, nq, H));  // column-parallel: the rank's heads' rows
    y.wk = tensor(TensorBlock::row_range(k0, nk, H));
    y.wv = tensor(TensorBlock::row_range(k0, nk, H));
    y.wo = tensor(TensorBlock::col_range(H, Q, q0, nq));  // row-parallel: its heads' columns
    y.w_gate = tensor(TensorBlock::row_range(i0, ni, H));
    y.w_up = tensor(TensorBlock::row_range(i0, ni, H));
    y.w_down = tensor(TensorBlock::col_range(H, I, i0, ni));
  }
  return l;
}

}  // namespace minimal_decoder
