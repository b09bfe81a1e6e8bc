#pragma once
/// \file
/// \brief Host reference of window_scores and scored_prefix_lengths (contract in window_scores.hpp): per
/// query, logits in double, its log-sum-exp (or the given one), then the column sums. Plain and
/// obviously correct: the oracle the CUDA passes are tested against. Host memory for every pointer;
/// no workspace (the queries in window_scores_plan.hpp report 0).

#include <cmath>
#include <cstdint>
#include <vector>

#include "kvsift/core/check.hpp"
#include "kvsift/core/dtype.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/query_rows.hpp"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/ops/window_scores.hpp"
#include "kvsift/ops/window_scores_plan.hpp"

namespace kvsift {
namespace host {

/// Writes the column sums P[h][j] of the file comment of window_scores.hpp into `scores` (row
/// b * H + h, H = KV heads or query heads as params.heads says, columns [0, min(L_b - window,
/// scores.cols)); the rest is untouched). Host memory for every pointer (views, lengths, q,
/// params.lse, scores); no workspace. kInvalidArgument or kNullPointer naming the parameter otherwise.
template <class View, class QT>
Status window_scores(const Exec&, const View& kv, const QueryRows<QT>& q, const WindowScoreParams& params,
                     StridedView2D<float> scores, Workspace /*workspace: the reference needs none*/ = {}) {
  static_assert(check_kv_view<View>());
  KVSIFT_TRY(detail::validate_window_scores(kv, q, params, scores));
  KVSIFT_TRY(validate_view_host(kv));
  const int d = kv.head_dim, G = q.num_heads / kv.num_kv_heads;
  const double scale = detail::resolve_sm_scale(params.sm_scale, d);
  const bool mean = params.heads == ScoreHeads::kKvHeadMean;
  std::vector<double> logits, col;
  for (int b = 0; b < kv.batch; ++b) {
    const int len = kv.length(b);
    const int prefix = detail::scored_prefix(len, params.window, scores.cols);
    if (prefix <= 0) continue;
    const int nq = detail::scored_queries(params.num_queries, len, q.capacity);
    for (int hk = 0; hk < kv.num_kv_heads; ++hk) {
      std::vector<double> group_sum(prefix, 0.0);
      for (int g = 0; g < G; ++g) {
        const int hq = hk * G + g;
        col.assign(prefix, 0.0);
        for (int i = 0; i < nq; ++i) {
          const int pos = len - nq + i;
          const auto* qr = q.row(b, i, hq);
          logits.assign(pos + 1, 0.0);
          double m = -INFINITY;
          for (int j = 0; j <= pos; ++j) {
            const auto* kr = kv.k_row(b, hk, j);
            double dot = 0;
            for (int e = 0; e < d; ++e) dot += double(to_float(qr[e])) * double(to_float(kr[e]));
            dot *= double(kv_k_scale(kv, b, hk, j));  // fp8 views: the row's dequantization scale
            logits[j] = dot * scale;
            m = logits[j] > m ? logits[j] : m;
          }
          double lse;
          if (params.lse) {
            lse = params.lse[(std::int64_t(b) * q.num_heads + hq) * q.capacity + i];
          } else {
            double s = 0;
            for (int j = 0; j <= pos; ++j) s += std::exp(logits[j] - m);
            lse = m + std::log(s);
          }
          for (int j = 0; j < prefix && j <= pos; ++j) col[j] += std::exp(logits[j] - lse);
        }
        if (mean) {
          for (int j = 0; j < prefix; ++j) group_sum[j] += col[j];
        } else {
          float* out = scores.row(std::int64_t(b) * q.num_heads + hq);
          for (int j = 0; j < prefix; ++j) out[j] = float(col[j]);
        }
      }
      if (mean) {
        float* out = scores.row(std::int64_t(b) * kv.num_kv_heads + hk);
        for (int j = 0; j < prefix; ++j) out[j] = float(group_sum[j] / G);
      }
    }
  }
  return Status();
}

/// Row lengths of the score matrix: row_lengths[b * heads_per_sequence + h] = min(L_b - window, cols),
/// clamped at 0 (L_b = kv.length(b)). Host memory; heads_per_sequence > 0 (kInvalidArgument), and
/// row_lengths non-null unless the batch is empty (kNullPointer).
template <class View>
Status scored_prefix_lengths(const Exec&, const View& kv, int window, int heads_per_sequence, std::int64_t cols,
                             std::int32_t* row_lengths, Workspace /*workspace: none needed*/ = {}) {
  static_assert(check_kv_view<View>());
  KVSIFT_TRY(detail::validate_scored_prefix_lengths(kv, heads_per_sequence, row_lengths));
  for (int b = 0; b < kv.batch; ++b)
    for (int h = 0; h < heads_per_sequence; ++h)
      row_lengths[b * heads_per_sequence + h] = detail::scored_prefix(kv.length(b), window, cols);
  return Status();
}

}  // namespace host
}  // namespace kvsift
