#pragma once
/// \file
/// \brief window_scores: how much attention the last queries of a prompt pay to each earlier token.
///
/// Stage 1 of prompt-cache compression (SnapKV, ClusterAttn, H2O-prefill). For sequence b of prompt
/// length L = kv.length(b), the scored queries are the last nq positions (nq = params.num_queries, or
/// all L when params.num_queries == kAllQueries), query i sitting at absolute position L - nq + i and
/// attending causally to keys [0, L - nq + i]. With logits l_ij = sm_scale * q_i . k_j and each
/// query's softmax taken over every key it sees (fp32, natural log),
///
///   P[h][j] = sum_i exp(l_ij - lse_i)          for prefix columns j in [0, L - window)
///
/// i.e. the column sums of the softmax over the scored queries, restricted to the prefix that
/// compression may drop (the last `window` tokens are always kept). Nothing of size nq x L is
/// materialised: a first pass computes each query's log-sum-exp (skipped when the engine passes the
/// ones its prefill attention already produced), a second accumulates exp(l - lse) per column.
///
/// Heads: ScoreHeads::kKvHeadMean (default) writes one row per KV head, the mean of its G query heads'
/// rows, so a selection serves the whole group; kQueryHead writes one row per query head, the layout of
/// the SnapKV reference (whose cache becomes query-head granular).
/// Values: Q and K are finite and the logits fit a float (the GPU computes them and the softmax in
/// fp32, the GPU's exponentials to ~2 ulp); a given lse is each row's finite log-sum-exp. Outside that
/// the results are unspecified.
///
/// Output row r = b * H + h (H = kv heads or query heads), columns [0, min(L - window, scores.cols));
/// other columns are left untouched. Cost: nq * L * head_dim multiply-adds per query head per pass;
/// for H2O-prefill (all queries) that is O(L^2 * head_dim).
///
/// scored_prefix_lengths(exec, kv, window, heads_per_sequence, cols, row_lengths) writes the row
/// lengths of that score matrix, min(L_b - window, cols) for row b * heads_per_sequence + h: the later
/// stages (pooling, clustering, top-k) read them.
///
/// This header is the contract (parameters, validation). The launch plan and workspace queries are in
/// window_scores_plan.hpp, the host reference in window_scores_reference.hpp, the CUDA launcher in
/// window_scores.cuh (kernels in detail/window_scores_*.cuh).

#include <cmath>
#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/dtype.hpp"
#include "kvsift/core/query_rows.hpp"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/kv/kv_view.hpp"

namespace kvsift {

/// What a score row stands for: kKvHeadMean (default) one row per KV head, the mean of its G query
/// heads' rows (the compressed cache keeps num_kv_heads heads); kQueryHead one row per query head, the
/// SnapKV reference layout (the compressed cache keeps num_q_heads heads).
enum class ScoreHeads : int { kKvHeadMean, kQueryHead };

/// WindowScoreParams::num_queries value that scores every prompt position (H2O-prefill).
///
/// The scored queries are QueryRows (core/query_rows.hpp): for SnapKV/ClusterAttn the last W prompt
/// queries ([B, W, Hq, D] by default); for H2O-prefill, all prompt queries ([B, L, Hq, D], query i =
/// position i).
inline constexpr int kAllQueries = -1;

/// Per-call parameters of window_scores (see the file comment for the semantics). Pointers live in
/// the backend's memory space (host memory for host::Exec, device memory for cuda::Exec).
struct WindowScoreParams {
  int window = 32;        ///< W, >= 0: the last W tokens are kept anyway, so only [0, L - W) is scored
  /// Scored queries: the last num_queries positions, >= 1 and <= q.capacity; kAllQueries = every
  /// position.
  int num_queries = 32;
  float sm_scale = 0.f;   ///< logit scale; <= 0 means 1 / sqrt(head_dim)
  ScoreHeads heads = ScoreHeads::kKvHeadMean;  ///< one row per KV head (group mean) or per query head
  /// Optional [batch, num_q_heads, query capacity] natural-log log-sum-exp of each scored query's
  /// scaled logits over the keys it sees, as flash-attention prefill returns it; saves one pass over K
  /// (and the CUDA workspace). Null: computed.
  const float* lse = nullptr;
  /// Upper bound on kv.length(b), used only for the CUDA launch geometry (which must not depend on the
  /// lengths in device memory); 0 takes the view's capacity (a custom view without one must set it).
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

inline Status validate_score_heads(ScoreHeads heads) {
  KVSIFT_REQUIRE(heads == ScoreHeads::kKvHeadMean || heads == ScoreHeads::kQueryHead, kInvalidArgument,
                 "heads = ", static_cast<int>(heads), " is not kKvHeadMean or kQueryHead");
  return Status();
}

template <class View, class QT>
Status validate_window_scores(const View& kv, const QueryRows<QT>& q, const WindowScoreParams& p,
                              const StridedView2D<float>& scores) {
  KVSIFT_TRY(kv.validate());
  KVSIFT_REQUIRE(p.window >= 0, kInvalidArgument, "window = ", p.window, " must be >= 0");
  KVSIFT_REQUIRE(p.num_queries == kAllQueries || p.num_queries >= 1, kInvalidArgument, "num_queries = ",
                 p.num_queries, " must be >= 1 or kAllQueries");
  KVSIFT_TRY(validate_score_heads(p.heads));
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

template <class View>
Status validate_scored_prefix_lengths(const View& kv, int heads_per_sequence, const std::int32_t* row_lengths) {
  KVSIFT_REQUIRE(heads_per_sequence > 0, kInvalidArgument, "heads_per_sequence = ", heads_per_sequence,
                 " must be > 0");
  KVSIFT_REQUIRE(kv.batch == 0 || row_lengths != nullptr, kNullPointer, "row_lengths is null");
  return Status();
}

}  // namespace detail

}  // namespace kvsift
