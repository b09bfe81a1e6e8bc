#pragma once
/// \file
/// \brief Host reference of attention_cosine (contract in attention_similarity.hpp): both softmax
/// distributions in double over every key, then their cosine. Host memory for every pointer; no
/// workspace.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kvsift/core/check.hpp"
#include "kvsift/core/dtype.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/query_rows.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/ops/attention_similarity.hpp"
#include "kvsift/ops/attention_similarity_plan.hpp"

namespace kvsift {
namespace host {

/// Writes cosine[(b * Hq + h) * num_queries + t] for the decode queries t < num_queries (num_queries
/// in [0, q.capacity]) as the file comment of attention_similarity.hpp defines it, in double. Host
/// memory for every pointer; no workspace. kInvalidArgument or kNullPointer naming the parameter
/// otherwise.
template <class View, class QT>
Status attention_cosine(const Exec&, const View& kv, const QueryRows<QT>& q, int num_queries, float sm_scale,
                        const KeptPositions& kept, float* cosine, Workspace /*workspace: none needed*/ = {}) {
  static_assert(check_kv_view<View>());
  KVSIFT_TRY(detail::validate_attention_cosine(kv, q, num_queries, kept, cosine));
  KVSIFT_TRY(validate_view_host(kv));
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
          dot *= double(kv_k_scale(kv, b, kh, j));  // fp8 views: the row's dequantization scale
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
