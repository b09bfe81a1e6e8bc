#pragma once
// Random prompts for the compression tests: a BHSD cache with ragged lengths and the queries of its
// last positions, as float host buffers.

#include <cstdint>
#include <vector>

#include "kvsift/kv/contiguous_kv.hpp"
#include "kvsift/core/query_rows.hpp"
#include "support/random.hpp"

namespace kvsift_test {

struct Prompt {
  int batch, kv_heads, q_heads, capacity, head_dim, q_rows;
  std::vector<float> k, v, q;
  std::vector<std::int32_t> lengths;

  Prompt(std::mt19937_64& rng, int batch_, int kv_heads_, int group, int capacity_, int head_dim_, int q_rows_,
         float spread = 2.f)
      : batch(batch_), kv_heads(kv_heads_), q_heads(kv_heads_ * group), capacity(capacity_), head_dim(head_dim_),
        q_rows(q_rows_) {
    k = random_values<float>(rng, std::size_t(batch) * kv_heads * capacity * head_dim, -spread, spread);
    v = random_values<float>(rng, k.size());
    q = random_values<float>(rng, std::size_t(batch) * q_rows * q_heads * head_dim, -spread, spread);
    lengths.assign(batch, capacity);
    for (int b = 1; b < batch; ++b) lengths[b] = uniform_int(rng, 1, capacity);
  }
  kvsift::ContiguousKV<float> view() { return kvsift::make_bhsd(k.data(), v.data(), batch, kv_heads, capacity, head_dim, lengths.data()); }
  kvsift::QueryRows<float> queries() const { return kvsift::make_query_rows<float>(q.data(), q_rows, q_heads, head_dim); }
};

}  // namespace kvsift_test
