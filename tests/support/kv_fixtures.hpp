#pragma once
// KV caches with known contents for testing view address math.
//
// Each fixture lays the cache out in host memory by its own explicit formula, independent of the view
// code, and stores at element (b, h, t, i) of K the value encode(b, h, t, i) (V gets the negation).
// Reading through a view and comparing with encode() checks the view's address map by brute force.

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kvsift/kv/contiguous_kv.hpp"
#include "kvsift/kv/paged_kv.hpp"
#include "support/random.hpp"

namespace kvsift_test {

struct KVShape {
  int batch, heads, capacity, head_dim;
};

// Exact in float while the product of the shape stays below 2^24; 1 is added so no value is zero.
inline float encode(const KVShape& s, int b, int h, int t, int i) {
  return float((((std::int64_t(b) * s.heads + h) * s.capacity + t) * s.head_dim + i) + 1);
}

inline std::vector<std::int32_t> random_lengths(std::mt19937_64& rng, int batch, int capacity) {
  std::vector<std::int32_t> len(batch);
  for (auto& l : len) l = uniform_int(rng, 0, capacity);
  if (batch > 0) len[0] = capacity;  // always cover the full range once
  return len;
}

enum class ContiguousLayout { kBHSD, kBSHD, kPadded };

// A contiguous cache; kPadded uses random extra room on every axis and separate K/V strides.
struct ContiguousFixture {
  KVShape shape;
  std::vector<float> k, v;
  std::vector<std::int32_t> lengths;
  std::int64_t kb, kh, kt, vb, vh, vt;  // element strides, chosen independently of the view code

  ContiguousFixture(std::mt19937_64& rng, KVShape s, ContiguousLayout layout) : shape(s) {
    const std::int64_t D = s.head_dim, S = s.capacity, H = s.heads;
    if (layout == ContiguousLayout::kBHSD) {
      kt = vt = D; kh = vh = S * D; kb = vb = H * S * D;
    } else if (layout == ContiguousLayout::kBSHD) {
      kh = vh = D; kt = vt = H * D; kb = vb = S * H * D;
    } else {
      kt = D + uniform_int(rng, 0, 5); kh = kt * S + uniform_int(rng, 0, 7); kb = kh * H + uniform_int(rng, 0, 9);
      vh = D + uniform_int(rng, 0, 3); vt = vh * H + uniform_int(rng, 0, 5); vb = vt * S + uniform_int(rng, 0, 11);
    }
    k.assign(std::size_t(kb * s.batch + 16), -12345.f);
    v.assign(std::size_t(vb * s.batch + 16), -12345.f);
    for (int b = 0; b < s.batch; ++b)
      for (int h = 0; h < s.heads; ++h)
        for (int t = 0; t < s.capacity; ++t)
          for (int i = 0; i < s.head_dim; ++i) {
            k[b * kb + h * kh + t * kt + i] = encode(s, b, h, t, i);
            v[b * vb + h * vh + t * vt + i] = -encode(s, b, h, t, i);
          }
    lengths = random_lengths(rng, s.batch, s.capacity);
  }

  // The view over buffers at the given base pointers (host or device copies of k, v, lengths).
  template <class T>
  kvsift::ContiguousKV<T> view(T* kp, T* vp, const std::int32_t* lp) const {
    kvsift::ContiguousKV<T> kv;
    kv.k = kp; kv.v = vp;
    kv.batch = shape.batch; kv.num_kv_heads = shape.heads; kv.head_dim = shape.head_dim; kv.capacity = shape.capacity;
    kv.k_batch_stride = kb; kv.k_head_stride = kh; kv.k_token_stride = kt;
    kv.v_batch_stride = vb; kv.v_head_stride = vh; kv.v_token_stride = vt;
    kv.lengths = lp;
    return kv;
  }
};

// A paged cache whose pages are scattered through a larger pool by a random permutation.
struct PagedFixture {
  KVShape shape;
  int page_size, max_pages, num_pages;
  std::int64_t page_stride;
  kvsift::PageLayout layout;
  std::vector<float> k, v;
  std::vector<std::int32_t> block_table, lengths;

  PagedFixture(std::mt19937_64& rng, KVShape s, int page_size_, kvsift::PageLayout layout_, int extra_stride = 0)
      : shape(s), page_size(page_size_), layout(layout_) {
    max_pages = (s.capacity + page_size - 1) / page_size;
    shape.capacity = max_pages * page_size;
    num_pages = s.batch * max_pages + uniform_int(rng, 0, 7);  // spare pages never referenced
    page_stride = std::int64_t(page_size) * s.heads * s.head_dim + extra_stride;
    std::vector<std::int32_t> perm(num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    block_table.assign(std::size_t(s.batch) * max_pages, 0);
    for (std::size_t j = 0; j < block_table.size(); ++j) block_table[j] = perm[j];
    k.assign(std::size_t(num_pages * page_stride), -12345.f);
    v.assign(k.size(), -12345.f);
    for (int b = 0; b < s.batch; ++b)
      for (int h = 0; h < s.heads; ++h)
        for (int t = 0; t < shape.capacity; ++t) {
          const std::int64_t page = block_table[b * max_pages + t / page_size];
          const int slot = t % page_size;
          const std::int64_t row = layout == kvsift::PageLayout::kNHD ? std::int64_t(slot) * s.heads + h
                                                                      : std::int64_t(h) * page_size + slot;
          for (int i = 0; i < s.head_dim; ++i) {
            k[page * page_stride + row * s.head_dim + i] = encode(shape, b, h, t, i);
            v[page * page_stride + row * s.head_dim + i] = -encode(shape, b, h, t, i);
          }
        }
    lengths = random_lengths(rng, s.batch, shape.capacity);
  }

  template <class T>
  kvsift::PagedKV<T> view(T* kp, T* vp, const std::int32_t* table, const std::int32_t* lp) const {
    auto kv = kvsift::make_paged(kp, vp, table, shape.batch, max_pages, num_pages, shape.heads, page_size,
                                 shape.head_dim, layout, lp);
    kv.page_stride = page_stride;
    return kv;
  }
};

// Expected dense copy: encode() for live tokens, `fill` elsewhere.
inline std::vector<float> expected_dense(const KVShape& s, const std::vector<std::int32_t>& lengths, int max_tokens,
                                         float sign, float fill) {
  std::vector<float> out(std::size_t(s.batch) * s.heads * max_tokens * s.head_dim, fill);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int t = 0; t < std::min<int>(lengths[b], max_tokens); ++t)
        for (int i = 0; i < s.head_dim; ++i)
          out[((std::size_t(b) * s.heads + h) * max_tokens + t) * s.head_dim + i] = sign * encode(s, b, h, t, i);
  return out;
}

}  // namespace kvsift_test
