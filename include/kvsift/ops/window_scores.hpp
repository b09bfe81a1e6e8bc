#pragma once
// window_scores: how much attention the last queries of a prompt pay to each earlier token.
//
// Stage 1 of prompt-cache compression (SnapKV, ClusterAttn, H2O-prefill). For sequence b of prompt
// length L = kv.length(b), the scored queries are the last nq positions (nq = params.num_queries, or
// all L when params.num_queries == kAllQueries), query i sitting at absolute position L - nq + i and
// attending causally to keys [0, L - nq + i]. With logits l_ij = sm_scale * q_i . k_j and each
// query's softmax taken over every key it sees (fp32, natural log),
//
//   P[h][j] = sum_i exp(l_ij - lse_i)          for prefix columns j in [0, L - window)
//
// i.e. the column sums of the softmax over the scored queries, restricted to the prefix that
// compression may drop (the last `window` tokens are always kept). Nothing of size nq x L is
// materialised: a first pass computes each query's log-sum-exp (skipped when the engine passes the
// ones its prefill attention already produced), a second accumulates exp(l - lse) per column.
//
// Heads: ScoreHeads::kKvHeadMean (default) writes one row per KV head, the mean of its G query heads'
// rows, so a selection serves the whole group; kQueryHead writes one row per query head, the layout of
// the SnapKV reference (whose cache becomes query-head granular).
// Output row r = b * H + h (H = kv heads or query heads), columns [0, min(L - window, scores.cols));
// other columns are left untouched. Cost: nq * L * head_dim multiply-adds per query head per pass; for H2O-prefill
// (all queries) that is O(L^2 * head_dim).

#include <cmath>
#include <cstdint>
#include <vector>

#include "kvsift/core/exec.hpp"
#include "kvsift/core/check.hpp"
#include "kvsift/core/dtype.hpp"
#include "kvsift/core/query_rows.hpp"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/kv_view.hpp"

namespace kvsift {

enum class ScoreHeads : int { kKvHeadMean, kQueryHead };

// The scored queries are QueryRows (core/query_rows.hpp): for SnapKV/ClusterAttn the last W prompt
// queries ([B, W, Hq, D] by default); for H2O-prefill, all prompt queries ([B, L, Hq, D], query i =
// position i).
inline constexpr int kAllQueries = -1;

struct WindowScoreParams {
  int window = 32;        // W: the last W tokens are kept anyway, so only [0, L - W) is scored
  int num_queries = 32;   // scored queries: the last num_queries positions; kAllQueries = every position
  float sm_scale = 0.f;   // logit scale; <= 0 means 1 / sqrt(head_dim)
  ScoreHeads heads = ScoreHeads::kKvHeadMean;
  // Optional [batch, num_q_heads, query capacity] natural-log log-sum-exp of each scored query's
  // scaled logits over the keys it sees, as flash-attention prefill returns it; saves one pass over K.
  const float* lse = nullptr;
  // Upper bound on kv.length(b), used only for the CUDA launch geometry (which must not depend on the
  // lengths in device memory); 0 takes the view's capacity.
  int max_length = 0;
};

namespace detail {

inline float resolve_sm_scale(float sm_scale, int head_dim) {
  return sm_scale > 0.f ? sm_scale : 1.f / std::sqrt(float(head_dim));
}

// Queries scored for a prompt of length len (clamped to the prompt and to the rows provided).
KVSIFT_HD inline int scored_queries(int num_queries, int len, int capacity) {
  int nq = num_queries == kAllQueries ? len : (num_queries < len ? num_queries : len);
  return nq < capacity ? nq : capacity;
}

// Prefix columns scored for a prompt of length len: [0, len - window), clipped to the output width.
KVSIFT_HD inline int scored_prefix(int len, int window, std::int64_t cols) {
  const int prefix = len - window;
  return prefix <= 0 ? 0 : (prefix < cols ? prefix : int(cols));
}

inline constexpr int kLseKeyChunk = 2048;  // keys per block of the CUDA log-sum-exp pass

inline int window_rows_capacity(const WindowScoreParams& p, int max_length, int q_capacity, int group) {
  const int nq = p.num_queries == kAllQueries ? max_length : p.num_queries;
  return (nq < q_capacity ? nq : q_capacity) * group;
}

template <class View>
int window_max_length(const View& kv, const WindowScoreParams& p) {
  return p.max_length > 0 ? p.max_length : kv_capacity(kv);
}

// Scratch of the CUDA path: per (row, key chunk) softmax partials (max, sum) and per row the merged
// log-sum-exp. Nothing when the caller supplies lse; the host reference needs none.
struct WindowScoreScratch {
  float* partials = nullptr;  // pairs
  float* lse_rows = nullptr;
};

template <class View, class QT>
WindowScoreScratch carve_window_scores(WorkspaceCarver& ws, const View& kv, const QueryRows<QT>& q,
                                       const WindowScoreParams& p) {
  WindowScoreScratch s;
  const int max_len = window_max_length(kv, p);
  if (p.lse || max_len <= 0 || kv.num_kv_heads <= 0 || q.num_heads <= 0) return s;
  const int rows = window_rows_capacity(p, max_len, q.capacity, q.num_heads / kv.num_kv_heads);
  const int chunks = (max_len + kLseKeyChunk - 1) / kLseKeyChunk;
  s.partials = ws.take<float>(std::size_t(kv.batch) * kv.num_kv_heads * rows * chunks * 2);
  s.lse_rows = ws.take<float>(std::size_t(kv.batch) * kv.num_kv_heads * rows);
  return s;
}

template <class View, class QT>
Status validate_window_scores(const View& kv, const QueryRows<QT>& q, const WindowScoreParams& p,
                              const StridedView2D<float>& scores) {
  KVSIFT_TRY(kv.validate());
  KVSIFT_REQUIRE(p.window >= 0, kInvalidArgument, "window = ", p.window, " must be >= 0");
  KVSIFT_REQUIRE(p.num_queries == kAllQueries || p.num_queries >= 1, kInvalidArgument, "num_queries = ",
                 p.num_queries, " must be >= 1 or kAllQueries");
  KVSIFT_REQUIRE(p.heads == ScoreHeads::kKvHeadMean || p.heads == ScoreHeads::kQueryHead, kInvalidArgument,
                 "heads = ", static_cast<int>(p.heads), " is not kKvHeadMean or kQueryHead");
  KVSIFT_REQUIRE(q.num_heads > 0 && q.num_heads % kv.num_kv_heads == 0, kInvalidArgument, "q.num_heads = ",
                 q.num_heads, " must be a positive multiple of kv.num_kv_heads = ", kv.num_kv_heads);
  KVSIFT_REQUIRE(q.capacity >= 0, kInvalidArgument, "q.capacity = ", q.capacity, " must be >= 0");
  KVSIFT_REQUIRE(p.num_queries == kAllQueries || p.num_queries <= q.capacity, kInvalidArgument,
                 "num_queries = ", p.num_queries, " exceeds q.capacity = ", q.capacity);
  KVSIFT_REQUIRE(kv.batch == 0 || q.data != nullptr, kNullPointer, "q.data is null");
  KVSIFT_TRY(scores.validate("scores"));
  const int heads = p.heads == ScoreHeads::kKvHeadMean ? kv.num_kv_heads : q.num_heads;
  KVSIFT_REQUIRE(scores.rows >= std::int64_t(kv.batch) * heads, kInvalidArgument, "scores.rows = ", scores.rows,
                 " must be >= batch * heads = ", std::int64_t(kv.batch) * heads);
  return Status();
}

}  // namespace detail

// Workspace for window_scores from shapes alone (0 when params.lse is given).
template <class View, class QT>
std::size_t window_scores_workspace_bytes(const View& kv, const QueryRows<QT>& q, const WindowScoreParams& params) {
  WorkspaceCarver ws(nullptr, 0);
  detail::carve_window_scores(ws, kv, q, params);
  return ws.required_bytes();
}

namespace host {

// Reference: per query, logits in double, its log-sum-exp (or the given one), then the column sums.
// The workspace arguments mirror the CUDA signature; the host needs none.
template <class View, class QT>
Status window_scores(Exec, const View& kv, const QueryRows<QT>& q, const WindowScoreParams& params,
                     StridedView2D<float> scores, void* workspace = nullptr, std::size_t workspace_bytes = 0) {
  static_assert(check_kv_view<View>());
  (void)workspace;
  (void)workspace_bytes;
  KVSIFT_TRY(detail::validate_window_scores(kv, q, params, scores));
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

}  // namespace host
}  // namespace kvsift

namespace kvsift {
namespace host {

// Row lengths of the score matrix: row b * heads_per_sequence + h scores [0, min(L_b - window, cols)).
// The later stages (pooling, clustering, top-k) take these per-row lengths.
template <class View>
Status scored_prefix_lengths(Exec, const View& kv, int window, int heads_per_sequence, std::int64_t cols,
                             std::int32_t* row_lengths) {
  static_assert(check_kv_view<View>());
  KVSIFT_REQUIRE(heads_per_sequence > 0, kInvalidArgument, "heads_per_sequence = ", heads_per_sequence,
                 " must be > 0");
  KVSIFT_REQUIRE(kv.batch == 0 || row_lengths != nullptr, kNullPointer, "row_lengths is null");
  for (int b = 0; b < kv.batch; ++b)
    for (int h = 0; h < heads_per_sequence; ++h)
      row_lengths[b * heads_per_sequence + h] = detail::scored_prefix(kv.length(b), window, cols);
  return Status();
}

}  // namespace host
}  // namespace kvsift
