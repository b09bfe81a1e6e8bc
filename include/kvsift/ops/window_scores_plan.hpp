#pragma once
/// \file
/// \brief The launch plan of window_scores and the workspace queries of window_scores and
/// scored_prefix_lengths (contract in window_scores.hpp).
///
/// The CUDA passes are sized from shapes alone: the query rows a (sequence, KV head) can have (the
/// window queries of its G query heads, or every prompt position for H2O-prefill), the key chunks of
/// the log-sum-exp pass, both from params.max_length (or the view's capacity), never from the lengths
/// in device memory, so a call can be captured in a CUDA graph. The workspace holds the log-sum-exp
/// pass's per-(row, chunk) softmax partials and per-row results; nothing when the caller gives lse,
/// nothing for the host reference.

#include <cstddef>
#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/query_rows.hpp"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/ops/window_scores.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kLseKeyChunk = 2048;  // keys per block of the CUDA log-sum-exp pass

inline int window_rows_capacity(const WindowScoreParams& p, int max_length, int q_capacity, int group) {
  const int nq = p.num_queries == kAllQueries ? max_length : p.num_queries;
  return (nq < q_capacity ? nq : q_capacity) * group;
}

template <class View>
int window_max_length(const View& kv, const WindowScoreParams& p) {
  return p.max_length > 0 ? p.max_length : kv_capacity(kv);
}

// What the CUDA passes need besides the contract's views and params.
struct WindowScorePlan {
  std::int64_t cols = 0;  // scores.cols
  float scale = 0.f;      // resolved sm_scale
  int max_length = 0;     // launch bound on the prompt length
  int row_capacity = 0;   // query rows per (sequence, KV head): nq * G
  int chunks = 0;         // key chunks of the log-sum-exp pass
};

template <class View, class QT>
WindowScorePlan plan_window_scores(const View& kv, const QueryRows<QT>& q, const WindowScoreParams& p,
                                   const StridedView2D<float>& scores) {
  WindowScorePlan plan;
  plan.cols = scores.cols;
  plan.scale = resolve_sm_scale(p.sm_scale, kv.head_dim);
  plan.max_length = window_max_length(kv, p);
  plan.row_capacity = window_rows_capacity(p, plan.max_length, q.capacity, q.num_heads / kv.num_kv_heads);
  plan.chunks = (plan.max_length + kLseKeyChunk - 1) / kLseKeyChunk;
  return plan;
}

// Scratch of the CUDA path: per (row, key chunk) softmax partials (max, sum) and per row the merged
// log-sum-exp. Nothing when the caller supplies lse.
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

}  // namespace detail

/// Scratch memory window_scores needs, from shapes alone (no device memory touched): 0 when
/// params.lse is given and for the host reference; otherwise the log-sum-exp pass's partials, sized
/// from params.max_length (or the view's capacity), q.capacity and the head counts. kNullPointer for a
/// null `bytes`.
template <class Exec, class View, class QT>
Status window_scores_workspace_bytes(const Exec& exec, const View& kv, const QueryRows<QT>& q,
                                     const WindowScoreParams& params, const StridedView2D<float>& scores,
                                     std::size_t* bytes) {
  (void)exec;
  (void)kv;
  (void)q;
  (void)params;
  (void)scores;
  KVSIFT_REQUIRE_NOT_NULL(bytes, "bytes");
  *bytes = 0;
  if constexpr (!is_host_exec<Exec>::value) {
    WorkspaceCarver ws(nullptr, 0);
    detail::carve_window_scores(ws, kv, q, params);
    *bytes = ws.required_bytes();
  }
  return Status();
}

/// scored_prefix_lengths needs no scratch on either backend: `*bytes` = 0 (kNullPointer for a null
/// `bytes`).
template <class Exec, class View>
Status scored_prefix_lengths_workspace_bytes(const Exec&, const View&, int /*window*/, int /*heads_per_sequence*/,
                                             std::int64_t /*cols*/, const std::int32_t* /*row_lengths*/,
                                             std::size_t* bytes) {
  KVSIFT_REQUIRE_NOT_NULL(bytes, "bytes");
  *bytes = 0;
  return Status();
}

}  // namespace kvsift
