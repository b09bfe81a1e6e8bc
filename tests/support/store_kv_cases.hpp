#pragma once
// Random store_kv cases shared by the host test (semantics against an independent computation) and the
// GPU test (bytes against the host reference): a cache of some layout and KV dtype, and n new rows of
// some input dtype with ragged magnitudes, outliers, an all-zero row, and rows outside the view.

#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "kvsift/kvsift.hpp"
#include "support/random.hpp"

namespace kvsift_test {

enum class StoreLayout { kBHSD, kBSHD, kPagedNHD, kPagedHND };

struct StoreCase {
  int batch = 2, heads = 2, capacity = 40, head_dim = 64, page_size = 16, n = 5;
  StoreLayout layout = StoreLayout::kBSHD;
  kvsift::ScaleGranularity granularity = kvsift::ScaleGranularity::kPerToken;
  std::vector<std::int32_t> seq, pos, lengths, table;
  int pages_per_seq() const { return (capacity + page_size - 1) / page_size; }
  int num_pages() const { return batch * pages_per_seq(); }
  bool paged() const { return layout == StoreLayout::kPagedNHD || layout == StoreLayout::kPagedHND; }
  std::size_t cache_elements() const {
    return paged() ? std::size_t(num_pages()) * page_size * heads * head_dim : std::size_t(batch) * heads * capacity * head_dim;
  }
  std::size_t scale_count() const {
    if (granularity == kvsift::ScaleGranularity::kPerHead) return std::size_t(heads);
    return paged() ? std::size_t(num_pages()) * page_size * heads : std::size_t(batch) * capacity * heads;
  }
};

// head_dim 0: drawn from the list below.
inline StoreCase random_store_case(std::mt19937_64& rng, StoreLayout layout, kvsift::ScaleGranularity g, int head_dim = 0) {
  StoreCase c;
  c.layout = layout;
  c.granularity = g;
  c.batch = uniform_int(rng, 1, 3);
  c.heads = uniform_int(rng, 1, 4);
  c.capacity = uniform_int(rng, 1, 70);
  // 300: rows longer than a warp's register segment (core/warp_rows.cuh), stored in two, the second
  // with idle lanes.
  const int dims[] = {16, 64, 128, 256, 48, 300};
  c.head_dim = head_dim > 0 ? head_dim : dims[uniform_int(rng, 0, 5)];
  c.page_size = 1 << uniform_int(rng, 0, 5);
  c.n = uniform_int(rng, 1, 12);
  c.lengths.assign(std::size_t(c.batch), 0);
  for (int i = 0; i < c.n; ++i) {
    c.seq.push_back(uniform_int(rng, 0, c.batch - 1));
    c.pos.push_back(uniform_int(rng, 0, c.capacity - 1));
  }
  // Distinct destinations (an engine's append never repeats one): drop repeats by moving them out of range.
  for (int i = 0; i < c.n; ++i)
    for (int j = 0; j < i; ++j)
      if (c.seq[i] == c.seq[j] && c.pos[i] == c.pos[j]) c.pos[i] = (1 << 20) + i;  // beyond any capacity: skipped
  c.seq.push_back(c.batch);  // outside the batch: skipped
  c.pos.push_back(0);
  c.seq.push_back(0);
  c.pos.push_back(-1);  // negative position: skipped
  c.n += 2;
  // Logical page j of sequence b is physical page j * batch + (batch - 1 - b): not the identity.
  for (int b = 0; b < c.batch; ++b)
    for (int j = 0; j < c.pages_per_seq(); ++j) c.table.push_back(j * c.batch + (c.batch - 1 - b));
  return c;
}

// Rows of n * heads * head_dim values: per (row, head) a magnitude from 1e-3 to 1e3, a few outliers, one
// all-zero (row, head), and, when `specials`, an infinity and a NaN in one row.
template <class T>
std::vector<T> random_store_rows(std::mt19937_64& rng, const StoreCase& c, bool specials) {
  std::vector<T> x(std::size_t(c.n) * c.heads * c.head_dim);
  std::uniform_real_distribution<float> u(-1.f, 1.f), mag(-3.f, 3.f);
  for (int r = 0; r < c.n * c.heads; ++r) {
    const float m = std::pow(10.f, mag(rng));
    for (int e = 0; e < c.head_dim; ++e) {
      float val = u(rng) * m;
      if (uniform_int(rng, 0, 40) == 0) val *= 30.f;  // an outlier channel
      x[std::size_t(r) * c.head_dim + e] = kvsift::from_float<T>(val);
    }
  }
  for (int e = 0; e < c.head_dim; ++e) x[std::size_t(c.heads > 1 ? 1 : 0) * c.head_dim + e] = kvsift::from_float<T>(0.f);
  if (specials && c.n > 1) {
    const std::size_t r = std::size_t(1) * c.heads * c.head_dim;  // row 1, head 0
    x[r + 3] = kvsift::from_float<T>(INFINITY);
    x[r + 5] = kvsift::from_float<T>(NAN);
  }
  return x;
}

// The view of the case over caller-owned storage (host or device pointers alike).
template <class KT>
kvsift::ContiguousKV<KT> store_contiguous_view(const StoreCase& c, KT* k, KT* v, float* ks, float* vs,
                                               const std::int32_t* lengths) {
  auto kv = c.layout == StoreLayout::kBHSD ? kvsift::make_bhsd(k, v, c.batch, c.heads, c.capacity, c.head_dim, lengths)
                                           : kvsift::make_bshd(k, v, c.batch, c.heads, c.capacity, c.head_dim, lengths);
  kv.scales = c.granularity == kvsift::ScaleGranularity::kPerHead ? kvsift::make_per_head_scales(ks, vs)
                                                                  : kvsift::make_per_token_scales_for(kv, ks, vs);
  return kv;
}
template <class KT>
kvsift::PagedKV<KT> store_paged_view(const StoreCase& c, KT* k, KT* v, float* ks, float* vs, const std::int32_t* table,
                                     const std::int32_t* lengths) {
  auto kv = kvsift::make_paged(k, v, table, c.batch, c.pages_per_seq(), c.num_pages(), c.heads, c.page_size, c.head_dim,
                               c.layout == StoreLayout::kPagedNHD ? kvsift::PageLayout::kNHD : kvsift::PageLayout::kHND,
                               lengths);
  kv.scales = c.granularity == kvsift::ScaleGranularity::kPerHead ? kvsift::make_per_head_scales(ks, vs)
                                                                  : kvsift::make_per_token_scales_for(kv, ks, vs);
  return kv;
}

// RoPE inputs for a store case (StoreKvRotary): Llama-style inverse frequencies theta^(-2j/r) (theta
// 500000, in double, rounded), rotary positions up to 128K unrelated to the slots, and Q rows of
// more heads than K (random_query_rows).
struct RotaryCase {
  int rotary_dim = 0, q_heads = 0;
  std::vector<float> inv_freq;
  std::vector<std::int32_t> position;
};
inline RotaryCase random_rotary_case(std::mt19937_64& rng, const StoreCase& c, int rotary_dim) {
  RotaryCase r;
  r.rotary_dim = rotary_dim;
  r.q_heads = c.heads * uniform_int(rng, 1, 4);
  for (int j = 0; j < rotary_dim / 2; ++j) r.inv_freq.push_back(float(std::pow(500000.0, -2.0 * j / rotary_dim)));
  for (int i = 0; i < c.n; ++i) r.position.push_back(uniform_int(rng, 0, 131071));
  return r;
}
// The Q rows of a rotary case, [n, q_heads, head_dim], uniform in [-3, 3) and rounded to T.
template <class T>
std::vector<T> random_query_rows(std::mt19937_64& rng, const StoreCase& c, const RotaryCase& r) {
  std::vector<T> q(std::size_t(c.n) * r.q_heads * c.head_dim);
  for (auto& x : q) x = kvsift::from_float<T>(float(std::uniform_real_distribution<double>(-3.0, 3.0)(rng)));
  return q;
}

// The spacing of X's values at 1 (machine epsilon): float 2^-23, half 2^-10, bfloat16 2^-7, fp8 E4M3 2^-3.
// Rounding to X is within half of it, relative.
template <class X>
constexpr double epsilon_of() {
  if constexpr (std::is_same_v<X, float>) return 1.0 / (1 << 23);
  else if constexpr (std::is_same_v<X, kvsift::half_t>) return 1.0 / 1024;
  else if constexpr (std::is_same_v<X, kvsift::bfloat16_t>) return 1.0 / 128;
  else return 1.0 / 8;  // fp8 E4M3
}

// Half the spacing of X's subnormal values: the absolute part of a rounding to X near zero (half 2^-25
// below 2^-14, bfloat16 2^-134; float's 2^-150 is below every tolerance here). A rotated value can
// cancel to far below its inputs, where the relative half-ulp of epsilon_of no longer bounds it.
template <class X>
constexpr double subnormal_half_step() {
  if constexpr (std::is_same_v<X, kvsift::half_t>) return 1.0 / (1 << 25);
  else if constexpr (std::is_same_v<X, kvsift::bfloat16_t>) return 0x1p-134;
  else return 0.0;
}

}  // namespace kvsift_test
