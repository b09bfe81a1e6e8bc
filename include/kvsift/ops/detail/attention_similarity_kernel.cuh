#pragma once
// The kernel behind cuda::attention_cosine (contract in attention_similarity.hpp, plan in
// attention_similarity_plan.hpp). One block per (query, query head, sequence); three passes over the
// keys recompute the logits (max, then normalisers, then the dot product and norms), so nothing of
// size L is stored. Kept membership is a binary search in the row's kept positions, which must be
// ascending with any negative (unused) entries at the end, as compact_kv writes them.

#include <cstdint>

#include "kvsift/core/data_error.cuh"
#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/core/query_rows.hpp"
#include "kvsift/core/reduce.cuh"
#include "kvsift/ops/attention_similarity.hpp"
#include "kvsift/ops/attention_similarity_plan.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kCosineThreads = 256;

__device__ inline bool kept_contains(const std::int32_t* row, int count, int j) {
  // Valid entries are the leading non-negative ones.
  int lo = 0, hi = count;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (row[mid] >= 0) lo = mid + 1; else hi = mid;
  }
  int a = 0, b = lo;
  while (a < b) {
    const int mid = (a + b) / 2;
    if (row[mid] < j) a = mid + 1; else b = mid;
  }
  return a < lo && row[a] == j;
}

// What the kernel needs besides the views, passed with them by value (each kernel parameter within
// 128 bytes: detail/window_scores_common.cuh says why; with the views inside one 192-byte struct this
// kernel took 47 registers instead of 40, 5 blocks per SM instead of 6).
struct AttentionCosineLaunch {
  int num_queries;
  KeptPositions kept;
  float* cosine;
  AttentionCosinePlan plan;
  DataError* data_error;  // cuda::Exec::data_error, or null
};
static_assert(sizeof(AttentionCosineLaunch) <= 128, "kernel parameter structs stay within 128 bytes");

template <class View, class QT>
__global__ void __launch_bounds__(kCosineThreads) attention_cosine_kernel(View kv, QueryRows<QT> q,
                                                                           AttentionCosineLaunch launch) {
  const KeptPositions& kept = launch.kept;
  const int num_queries = launch.num_queries;
  const float scale = launch.plan.scale;
  extern __shared__ float q_shared[];
  using Reduce = BlockAllReduce<float, kCosineThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const int t = blockIdx.x, bh = blockIdx.y, b = bh / q.num_heads, h = bh % q.num_heads;
  const int G = q.num_heads / kv.num_kv_heads, kh = h / G;
  const int L = kv.length(b);
  const std::int32_t* kept_row = kept.data + (b * kept.heads + (kept.heads == q.num_heads ? h : kh)) * kept.stride;
  for (int e = threadIdx.x; e < kv.head_dim; e += blockDim.x) q_shared[e] = to_float(q.row(b, t, h)[e]) * scale;
  __syncthreads();
  // A key whose page lies outside the pool (kv_row_in_pool) is never read: its logit is -inf, so it
  // takes no attention in either distribution, and the first pass records the first one a thread met.
  auto logit = [&](int j) {
    if (!kv_row_in_pool(kv, b, j)) return -INFINITY;
    const auto* k = kv.k_row(b, kh, j);
    // fp8: each element dequantized as the host reference does (code x scale in float); 1 otherwise.
    float k_scale = 1.f;
    if constexpr (is_fp8_view_v<View>) k_scale = kv.k_scale(b, kh, j);
    float s = 0.f;
    for (int e = 0; e < kv.head_dim; ++e) s = fmaf(q_shared[e], to_float(k[e]) * k_scale, s);
    return s;
  };
  float m_full = -INFINITY, m_kept = -INFINITY;
  int bad_key = -1;
  for (int j = threadIdx.x; j < L; j += blockDim.x) {
    const float x = logit(j);
    if (x == -INFINITY && bad_key < 0 && !kv_row_in_pool(kv, b, j)) bad_key = j;
    m_full = fmaxf(m_full, x);
    if (kept_contains(kept_row, kept.count, j)) m_kept = fmaxf(m_kept, x);
  }
  if (bad_key >= 0)
    record_data_error(launch.data_error, DataErrorOp::kAttentionCosine, DataErrorKind::kPageOutOfPool, b, kh, bad_key,
                      kv_page_of(kv, b, bad_key));
  m_full = Reduce::max(tmp, m_full);
  m_kept = Reduce::max(tmp, m_kept);
  // A skipped key adds exp(-inf) = 0, except where every key of a distribution was skipped (m -inf):
  // then the distribution is empty and the cosine 0, as for an empty kept set.
  auto weight = [](float x, float m) { return x == -INFINITY ? 0.f : expf(x - m); };
  float z_full = 0.f, z_kept = 0.f;
  for (int j = threadIdx.x; j < L; j += blockDim.x) {
    const float x = logit(j);
    z_full += weight(x, m_full);
    if (kept_contains(kept_row, kept.count, j)) z_kept += weight(x, m_kept);
  }
  z_full = Reduce::sum(tmp, z_full);
  z_kept = Reduce::sum(tmp, z_kept);
  float dot = 0.f, n_full = 0.f, n_kept = 0.f;
  for (int j = threadIdx.x; j < L; j += blockDim.x) {
    const float x = logit(j);
    const float af = z_full > 0.f ? weight(x, m_full) / z_full : 0.f;
    const float ak = kept_contains(kept_row, kept.count, j) && z_kept > 0.f ? weight(x, m_kept) / z_kept : 0.f;
    dot += af * ak;
    n_full += af * af;
    n_kept += ak * ak;
  }
  dot = Reduce::sum(tmp, dot);
  n_full = Reduce::sum(tmp, n_full);
  n_kept = Reduce::sum(tmp, n_kept);
  if (threadIdx.x == 0)
    launch.cosine[(std::int64_t(b) * q.num_heads + h) * num_queries + t] =
        (n_full > 0.f && n_kept > 0.f) ? dot * rsqrtf(n_full * n_kept) : 0.f;
}

}  // namespace detail
}  // namespace kvsift
