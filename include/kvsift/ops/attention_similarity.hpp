#pragma once
// attention_cosine: how close attention over a compressed cache stays to attention over the full one.
//
// For decode query t of sequence b and query head h (query rows q.row(b, t, h)), with logits
// l_j = sm_scale * q . k_j over the full prompt cache [0, L):
//   a_full = softmax over all j < L,   a_kept = softmax over the kept positions, 0 elsewhere,
//   cosine[(b * Hq + h) * T + t] = <a_full, a_kept> / (|a_full| |a_kept|)
// The kept positions of a head are positions.row(r) (r = b * H_kept + h_kept, h_kept = h or h / G as
// the selection was per query head or per KV head), entries < 0 or >= L ignored: exactly what
// compact_kv reports. This is ClusterAttn's criterion for choosing num_block (calibrate_num_block)
// and the fidelity number the benchmarks and the quickstart print.

#include <cmath>
#include <cstdint>
#include <vector>

#include "kvsift/core/exec.hpp"
#include "kvsift/core/check.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/ops/window_scores.hpp"

namespace kvsift {

// Kept original positions per row, as CompactOutputs::positions holds them.
struct KeptPositions {
  const std::int32_t* data = nullptr;
  int rows = 0;
  int heads = 0;       // rows per sequence: kv heads or query heads
  int count = 0;       // entries per row
  std::int64_t stride = 0;
};

namespace detail {

template <class View, class QT>
Status validate_attention_cosine(const View& kv, const QueryRows<QT>& q, int num_queries, const KeptPositions& kept,
                                 const float* cosine) {
  KVSIFT_TRY(kv.validate());
  KVSIFT_REQUIRE(q.num_heads > 0 && q.num_heads % kv.num_kv_heads == 0, kInvalidArgument, "q.num_heads = ",
                 q.num_heads, " must be a positive multiple of kv.num_kv_heads = ", kv.num_kv_heads);
  KVSIFT_REQUIRE(num_queries >= 0 && num_queries <= q.capacity, kInvalidArgument, "num_queries = ", num_queries,
                 " must be in [0, q.capacity = ", q.capacity, "]");
  KVSIFT_REQUIRE(kept.heads == kv.num_kv_heads || kept.heads == q.num_heads, kInvalidArgument, "kept.heads = ",
                 kept.heads, " must be the KV or the query head count");
  KVSIFT_REQUIRE(kept.rows >= kv.batch * kept.heads, kInvalidArgument, "kept.rows = ", kept.rows,
                 " must be >= batch * kept.heads = ", kv.batch * kept.heads);
  KVSIFT_REQUIRE(kept.stride >= kept.count && kept.count >= 0, kInvalidArgument, "kept.stride = ", kept.stride,
                 " must be >= kept.count = ", kept.count, " >= 0");
  if (kv.batch > 0 && num_queries > 0) {
    KVSIFT_REQUIRE_NOT_NULL(q.data, "q.data");
    KVSIFT_REQUIRE_NOT_NULL(cosine, "cosine");
    KVSIFT_REQUIRE(kept.count == 0 || kept.data != nullptr, kNullPointer, "kept.data is null");
  }
  return Status();
}

}  // namespace detail

namespace host {

template <class View, class QT>
Status attention_cosine(Exec, const View& kv, const QueryRows<QT>& q, int num_queries, float sm_scale,
                        const KeptPositions& kept, float* cosine) {
  static_assert(check_kv_view<View>());
  KVSIFT_TRY(detail::validate_attention_cosine(kv, q, num_queries, kept, cosine));
  const int d = kv.head_dim, G = q.num_heads / kv.num_kv_heads;
  const double scale = detail::resolve_sm_scale(sm_scale, d);
  std::vector<double> logits;
  std::vector<char> is_kept;
  for (int b = 0; b < kv.batch; ++b) {
    const int L = kv.length(b);
    for (int h = 0; h < q.num_heads; ++h) {
      const int kh = h / G;
      const int r = b * kept.heads + (kept.heads == q.num_heads ? h : kh);
      is_kept.assign(L, 0);
      for (int s = 0; s < kept.count; ++s) {
        const int p = kept.data[r * kept.stride + s];
        if (p >= 0 && p < L) is_kept[p] = 1;
      }
      for (int t = 0; t < num_queries; ++t) {
        logits.assign(L, 0.0);
        double m_full = -INFINITY, m_kept = -INFINITY;
        for (int j = 0; j < L; ++j) {
          double dot = 0;
          for (int e = 0; e < d; ++e) dot += double(to_float(q.row(b, t, h)[e])) * double(to_float(kv.k_row(b, kh, j)[e]));
          logits[j] = dot * scale;
          m_full = std::max(m_full, logits[j]);
          if (is_kept[j]) m_kept = std::max(m_kept, logits[j]);
        }
        double z_full = 0, z_kept = 0;
        for (int j = 0; j < L; ++j) {
          z_full += std::exp(logits[j] - m_full);
          if (is_kept[j]) z_kept += std::exp(logits[j] - m_kept);
        }
        double dot = 0, n_full = 0, n_kept = 0;
        for (int j = 0; j < L; ++j) {
          const double af = std::exp(logits[j] - m_full) / z_full;
          const double ak = is_kept[j] ? std::exp(logits[j] - m_kept) / z_kept : 0.0;
          dot += af * ak;
          n_full += af * af;
          n_kept += ak * ak;
        }
        cosine[(std::int64_t(b) * q.num_heads + h) * num_queries + t] =
            (n_full > 0 && n_kept > 0) ? float(dot / std::sqrt(n_full * n_kept)) : 0.f;
      }
    }
  }
  return Status();
}

}  // namespace host
}  // namespace kvsift
