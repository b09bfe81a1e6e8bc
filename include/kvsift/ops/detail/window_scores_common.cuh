#pragma once
// What both CUDA paths of window_scores share (contract in window_scores.hpp, plan in
// window_scores_plan.hpp): the launch struct every kernel takes by value with the views, the geometry
// of one (sequence, KV head) problem, the merge of the log-sum-exp partials, scored_prefix_lengths.
//
// Per (sequence, KV head) the scored query rows are the nq window queries of its G query heads,
// row = i * G + g. The CUDA-core kernels are in window_scores_simt.cuh, the tensor-core ones in
// window_scores_mma.cuh.

#include <cstdint>

#include "kvsift/core/dependent_launch.cuh"
#include "kvsift/core/data_error.cuh"
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

// What a kernel needs besides the views it reads: the contract's params and output, the plan and the
// carved scratch (partials are (max, sum) pairs). Every kernel takes (kv, q, launch) by value: the
// views as their own parameters, everything else in this one struct.
//
// Why not the views inside the struct too: nvcc (13.0) reads a struct kernel parameter above 128
// bytes through its address (the PTX takes the parameter's address), and its fields then no longer
// count as uniform across the block. With one 232-byte struct the column-sum kernels stopped
// unswitching their per-head loop (a predicate test per element instead), the cosine kernel took 47
// registers instead of 40. A view alone is 80-88 bytes, an engine's own view may be larger still.
// Keep every kernel parameter within 128 bytes (the static_asserts next to each launch struct).
struct WindowScoresLaunch {
  WindowScoreParams params;
  StridedView2D<float> scores;
  WindowScorePlan plan;
  WindowScoreScratch scratch;
  DataError* data_error;  // cuda::Exec::data_error, or null
};
static_assert(sizeof(WindowScoresLaunch) <= 128, "kernel parameter structs stay within 128 bytes");

// Shared geometry of one (b, kv head) problem.
struct ScoreProblem {
  int len, nq, prefix, group;
  KVSIFT_HD int rows() const { return nq * group; }
  // Last key row `row` may see (absolute position of its query).
  KVSIFT_HD int last_key(int row) const { return len - nq + row / group; }
};

template <class View, class QT>
__device__ ScoreProblem score_problem(const View& kv, const QueryRows<QT>& q, const WindowScoresLaunch& launch, int b) {
  ScoreProblem s;
  s.len = kv.length(b);
  s.nq = scored_queries(launch.params.num_queries, s.len, q.capacity);
  s.prefix = scored_prefix(s.len, launch.params.window, launch.plan.cols);
  s.group = q.num_heads / kv.num_kv_heads;
  return s;
}

// Whether key row `key` of (b, hk) can be read: inside the sequence and, for a paged view, on a page of
// the pool (kv_row_in_pool). A key outside the pool is treated like a key past the sequence: never read,
// masked out of every softmax, scored 0; the first one met is recorded (DataErrorKind::kPageOutOfPool,
// record_bad_score_key). For views whose rows all have an address (kv_rows_always_in_pool: contiguous
// caches) the kernels compile the masking out and run the unguarded code exactly.
template <class View>
__device__ __forceinline__ bool score_key_staged(const View& kv, int b, int len, int key) {
  if (key >= len) return false;
  if constexpr (kv_rows_always_in_pool<View>) return true;
  else return bool(kv_row_in_pool(kv, b, key));
}

// The record of a key whose page is outside the pool (the cold path).
template <class View>
__device__ void record_bad_score_key(const View& kv, const WindowScoresLaunch& launch, int b, int hk, int key) {
  record_data_error(launch.data_error, DataErrorOp::kWindowScores, DataErrorKind::kPageOutOfPool, b, hk, key,
                    kv_page_of(kv, b, key));
}

// score_key_staged, recording a bad key on the spot: for loaders that test one key per thread. Loaders
// that stage several rows per thread note the bad key and record it after their loads (the cold path
// stays out of the unrolled loads).
template <class View>
__device__ __forceinline__ bool score_key_readable(const View& kv, const WindowScoresLaunch& launch, int b, int hk,
                                                   int len, int key) {
  if (score_key_staged(kv, b, len, key)) return true;
  if (key < len) record_bad_score_key(kv, launch, b, hk, key);
  return false;
}

// The softmax partials of each group of kLanes consecutive lanes (a power of two, at most 32), merged
// in lane order, so every lane of a group ends with the same bits. All 32 lanes take part.
template <int kLanes>
__device__ __forceinline__ SoftmaxState merge_lanes_in_order(SoftmaxState st) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int offset = 1; offset < kLanes; offset *= 2) {
    SoftmaxState o;
    o.m = __shfl_xor_sync(0xffffffffu, st.m, offset);
    o.d = __shfl_xor_sync(0xffffffffu, st.d, offset);
    SoftmaxState lo = (lane & offset) ? o : st, hi = (lane & offset) ? st : o;
    float fs, fo;
    lo.merge(hi, &fs, &fo);
    st = lo;
  }
  return st;
}

// Merge the chunks of each row in order; rows of chunks a row never reached hold nothing (the
// chunk loop of the partials kernels skipped them), so only chunks up to the row's last visible key
// are read. Folds the partials of both paths (same layout).
template <class View, class QT>
__global__ void lse_merge_kernel(View kv, QueryRows<QT> q, WindowScoresLaunch launch) {
  const int num_chunks = launch.plan.chunks, row_capacity = launch.plan.row_capacity;
  const float2* partials = reinterpret_cast<const float2*>(launch.scratch.partials);
  const int bh = blockIdx.y;
  const int b = bh / kv.num_kv_heads;
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  const ScoreProblem sp = score_problem(kv, q, launch, b);
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

struct ScoredPrefixLengthsLaunch {
  int window;
  int heads_per_sequence;
  std::int64_t cols;
  std::int32_t* row_lengths;
};
static_assert(sizeof(ScoredPrefixLengthsLaunch) <= 128, "see WindowScoresLaunch");

template <class View>
__global__ void scored_prefix_lengths_kernel(View kv, ScoredPrefixLengthsLaunch launch) {
  dependent_kernel_start();  // Exec::dependent_launch
  const int heads = launch.heads_per_sequence;
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < kv.batch * heads) launch.row_lengths[r] = scored_prefix(kv.length(r / heads), launch.window, launch.cols);
}

}  // namespace detail
}  // namespace kvsift
