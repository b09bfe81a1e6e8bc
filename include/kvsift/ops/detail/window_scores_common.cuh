#pragma once
// What both CUDA paths of window_scores share (contract in window_scores.hpp, plan in
// window_scores_plan.hpp): the launch struct every kernel takes by value, the geometry of one
// (sequence, KV head) problem, the merge of the log-sum-exp partials, and scored_prefix_lengths.
//
// Per (sequence, KV head) the scored query rows are the nq window queries of its G query heads,
// row = i * G + g. The CUDA-core kernels are in window_scores_simt.cuh, the tensor-core ones in
// window_scores_mma.cuh.

#include <cstdint>

#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/core/online_softmax.hpp"
#include "kvsift/core/query_rows.hpp"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/ops/window_scores.hpp"
#include "kvsift/ops/window_scores_plan.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kScoreTile = 64;       // rows and keys per tile
inline constexpr int kScoreDimChunk = 32;   // head_dim staged per step
inline constexpr int kScoreThreads = 256;

// Everything one launch needs, passed once by value: the contract's views and params, the plan and
// the carved scratch (partials are (max, sum) pairs).
template <class View, class QT>
struct WindowScoresLaunch {
  View kv;
  QueryRows<QT> q;
  WindowScoreParams params;
  StridedView2D<float> scores;
  WindowScorePlan plan;
  WindowScoreScratch scratch;
};

// Shared geometry of one (b, kv head) problem.
struct ScoreProblem {
  int len, nq, prefix, group;
  KVSIFT_HD int rows() const { return nq * group; }
  // Last key row `row` may see (absolute position of its query).
  KVSIFT_HD int last_key(int row) const { return len - nq + row / group; }
};

template <class View, class QT>
__device__ ScoreProblem score_problem(const WindowScoresLaunch<View, QT>& launch, int b) {
  ScoreProblem s;
  s.len = launch.kv.length(b);
  s.nq = scored_queries(launch.params.num_queries, s.len, launch.q.capacity);
  s.prefix = scored_prefix(s.len, launch.params.window, launch.plan.cols);
  s.group = launch.q.num_heads / launch.kv.num_kv_heads;
  return s;
}

// Merge the chunks of each row in order; rows of chunks a row never reached hold nothing (the
// chunk loop of the partials kernels skipped them), so only chunks up to the row's last visible key
// are read. Folds the partials of both paths (same layout).
template <class View, class QT>
__global__ void lse_merge_kernel(WindowScoresLaunch<View, QT> launch) {
  const int num_chunks = launch.plan.chunks, row_capacity = launch.plan.row_capacity;
  const float2* partials = reinterpret_cast<const float2*>(launch.scratch.partials);
  const int bh = blockIdx.y;
  const int b = bh / launch.kv.num_kv_heads;
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  const ScoreProblem sp = score_problem(launch, b);
  if (row >= sp.rows() || sp.prefix <= 0) return;
  const int row0 = row / kScoreTile * kScoreTile;
  const int last_row = min(row0 + kScoreTile, sp.rows()) - 1;
  const int chunks = (sp.last_key(last_row) + 1 + kLseKeyChunk - 1) / kLseKeyChunk;
  SoftmaxState st;
  for (int c = 0; c < chunks && c < num_chunks; ++c) {
    const float2 md = partials[(std::int64_t(bh) * row_capacity + row) * num_chunks + c];
    SoftmaxState o;
    o.m = md.x;
    o.d = md.y;
    float fs, fo;
    st.merge(o, &fs, &fo);
  }
  launch.scratch.lse_rows[std::int64_t(bh) * row_capacity + row] = st.lse();
}

template <class View>
struct ScoredPrefixLengthsLaunch {
  View kv;
  int window;
  int heads_per_sequence;
  std::int64_t cols;
  std::int32_t* row_lengths;
};

template <class View>
__global__ void scored_prefix_lengths_kernel(ScoredPrefixLengthsLaunch<View> launch) {
  const int heads = launch.heads_per_sequence;
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < launch.kv.batch * heads)
    launch.row_lengths[r] = scored_prefix(launch.kv.length(r / heads), launch.window, launch.cols);
}

}  // namespace detail
}  // namespace kvsift
