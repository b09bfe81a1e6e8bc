#pragma once
// CUDA backend of window_scores (contract in window_scores.hpp).
//
// Per (sequence, KV head) the scored query rows are the nq window queries of its G query heads,
// row = i * G + g. Logits come from 64 x 64 tiles (rows x keys) computed by 256 threads, 4 x 4 each,
// over head_dim in chunks of 32 staged in shared memory as fp32.
//   pass 1 (skipped when the caller gives lse): each block takes 64 rows and one chunk of keys and
//          writes the chunk's online-softmax (max, sum) per row; a merge kernel folds the chunks in
//          order into each row's log-sum-exp.
//   pass 2: each block takes 64 prefix keys and walks all rows that can see them, summing
//          exp(logit - lse) per key (per head, or over the group for the KV-head mean).
// Every sum runs in a fixed order without atomics, so results are bitwise reproducible, which the
// deterministic top-k downstream relies on.

#include <cstdint>

#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/row_alignment.hpp"
#include "kvsift/ops/window_scores.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kScoreTile = 64;       // rows and keys per tile
inline constexpr int kScoreDimChunk = 32;   // head_dim staged per step
inline constexpr int kScoreThreads = 256;

// Shared geometry of one (b, kv head) problem.
struct ScoreProblem {
  int len, nq, prefix, group;
  KVSIFT_HD int rows() const { return nq * group; }
  // Last key row `row` may see (absolute position of its query).
  KVSIFT_HD int last_key(int row) const { return len - nq + row / group; }
};

template <class View, class QT>
__device__ ScoreProblem score_problem(const View& kv, const QueryRows<QT>& q, const WindowScoreParams& p,
                                      std::int64_t cols, int b) {
  ScoreProblem s;
  s.len = kv.length(b);
  s.nq = scored_queries(p.num_queries, s.len, q.capacity);
  s.prefix = scored_prefix(s.len, p.window, cols);
  s.group = q.num_heads / kv.num_kv_heads;
  return s;
}

// logits[a][c] for rows row0 + ty + 16a and keys key0 + tx + 16c (a, c in [0, 4)); masked or absent
// entries are -inf. All threads of the block must call it (it synchronises).
template <class View, class QT>
__device__ void score_tile(const View& kv, const QueryRows<QT>& q, const ScoreProblem& sp, int b, int hk, int row0,
                           int key0, float scale, float (&logits)[4][4], float (*qs)[kScoreDimChunk + 1],
                           float (*ks)[kScoreDimChunk + 1]) {
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  float acc[4][4] = {};
  for (int d0 = 0; d0 < kv.head_dim; d0 += kScoreDimChunk) {
    for (int e = tid; e < kScoreTile * kScoreDimChunk; e += kScoreThreads) {
      const int r = e / kScoreDimChunk, dd = e % kScoreDimChunk, d = d0 + dd;
      const int row = row0 + r, key = key0 + r;
      float qv = 0.f, kval = 0.f;
      if (d < kv.head_dim) {
        if (row < sp.rows()) qv = to_float(q.row(b, row / sp.group, hk * sp.group + row % sp.group)[d]);
        if (key < sp.len) kval = to_float(kv.k_row(b, hk, key)[d]);
      }
      qs[r][dd] = qv;
      ks[r][dd] = kval;
    }
    __syncthreads();
#pragma unroll 8
    for (int dd = 0; dd < kScoreDimChunk; ++dd) {
      float a_reg[4], c_reg[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) a_reg[a] = qs[ty + 16 * a][dd];
#pragma unroll
      for (int c = 0; c < 4; ++c) c_reg[c] = ks[tx + 16 * c][dd];
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[a][c] = fmaf(a_reg[a], c_reg[c], acc[a][c]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int row = row0 + ty + 16 * a, key = key0 + tx + 16 * c;
      const bool visible = row < sp.rows() && key < sp.len && key <= sp.last_key(row);
      logits[a][c] = visible ? acc[a][c] * scale : -INFINITY;
    }
}

// Pass 1: per (row tile, key chunk, b * Hkv): the chunk's (max, sum of exp) per row.
template <class View, class QT>
__global__ void __launch_bounds__(kScoreThreads) lse_partials_kernel(View kv, QueryRows<QT> q, WindowScoreParams p,
                                                                      std::int64_t cols, float scale, int num_chunks,
                                                                      int row_capacity, float2* partials) {
  __shared__ float qs[kScoreTile][kScoreDimChunk + 1], ks[kScoreTile][kScoreDimChunk + 1];
  __shared__ float red_m[kScoreTile][17], red_d[kScoreTile][17];
  const int bh = blockIdx.z, b = bh / kv.num_kv_heads, hk = bh % kv.num_kv_heads;
  const ScoreProblem sp = score_problem(kv, q, p, cols, b);
  const int row0 = blockIdx.x * kScoreTile, chunk = blockIdx.y;
  if (row0 >= sp.rows() || sp.prefix <= 0) return;
  const int key_begin = chunk * kLseKeyChunk;
  // Keys beyond the last row's position are invisible to every row of the tile.
  const int last_row = min(row0 + kScoreTile, sp.rows()) - 1;
  const int key_end = min(key_begin + kLseKeyChunk, sp.last_key(last_row) + 1);
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  float m[4], d[4];
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    m[a] = -INFINITY;
    d[a] = 0.f;
  }
  for (int key0 = key_begin; key0 < key_end; key0 += kScoreTile) {
    float logits[4][4];
    score_tile(kv, q, sp, b, hk, row0, key0, scale, logits, qs, ks);
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float x = logits[a][c];
        if (x == -INFINITY) continue;
        if (x > m[a]) {
          d[a] = d[a] * expf(m[a] - x) + 1.f;
          m[a] = x;
        } else {
          d[a] += expf(x - m[a]);
        }
      }
  }
  // Combine the 16 threads that share each row, in a fixed order.
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    red_m[ty + 16 * a][tx] = m[a];
    red_d[ty + 16 * a][tx] = d[a];
  }
  __syncthreads();
  if (threadIdx.x < kScoreTile) {
    const int r = threadIdx.x;
    SoftmaxState st;
    for (int t = 0; t < 16; ++t) {
      SoftmaxState o;
      o.m = red_m[r][t];
      o.d = red_d[r][t];
      float fs, fo;
      st.merge(o, &fs, &fo);
    }
    const int row = row0 + r;
    if (row < sp.rows()) partials[(std::int64_t(bh) * row_capacity + row) * num_chunks + chunk] = make_float2(st.m, st.d);
  }
}

// Merge the chunks of each row in order; rows of chunks a row never reached hold nothing (the
// chunk loop above skipped them), so only chunks up to the row's last visible key are read.
template <class View, class QT>
__global__ void lse_merge_kernel(View kv, QueryRows<QT> q, WindowScoreParams p, std::int64_t cols, int num_chunks,
                                 int row_capacity, const float2* partials, float* lse) {
  const int bh = blockIdx.y, b = bh / kv.num_kv_heads;
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  const ScoreProblem sp = score_problem(kv, q, p, cols, b);
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
  lse[std::int64_t(bh) * row_capacity + row] = st.lse();
}

// Pass 2: per (key tile, b * Hkv): column sums of exp(logit - lse) over every row that sees the keys.
// `lse_given` uses the caller's [batch, Hq, q.capacity] layout; otherwise `lse_rows` ([bh, rows]).
template <class View, class QT>
__global__ void __launch_bounds__(kScoreThreads) column_sums_kernel(View kv, QueryRows<QT> q, WindowScoreParams p,
                                                                     std::int64_t cols, float scale, int row_capacity,
                                                                     const float* lse_rows, StridedView2D<float> out) {
  __shared__ float qs[kScoreTile][kScoreDimChunk + 1], ks[kScoreTile][kScoreDimChunk + 1];
  __shared__ float lse_tile[kScoreTile];
  __shared__ float col[16][kScoreTile];  // per thread row (ty) partial sums, folded in order at the end
  const int bh = blockIdx.y, b = bh / kv.num_kv_heads, hk = bh % kv.num_kv_heads;
  const ScoreProblem sp = score_problem(kv, q, p, cols, b);
  const int key0 = blockIdx.x * kScoreTile;
  if (key0 >= sp.prefix) return;
  const bool per_head = p.heads == ScoreHeads::kQueryHead;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  // The first row that can see key0: its query position must be >= key0.
  const int first_query = max(0, key0 - (sp.len - sp.nq));
  const int first_tile = first_query * sp.group / kScoreTile * kScoreTile;
  // One head at a time in per-head mode (its rows are every G-th row); all rows at once for the mean.
  const int passes = per_head ? sp.group : 1;
  for (int g = 0; g < passes; ++g) {
    float sum[4] = {0.f, 0.f, 0.f, 0.f};
    for (int row0 = first_tile; row0 < sp.rows(); row0 += kScoreTile) {
      if (threadIdx.x < kScoreTile) {
        const int row = row0 + threadIdx.x;
        float l = INFINITY;  // rows past the end contribute exp(-inf) = 0
        if (row < sp.rows()) {
          const int i = row / sp.group, hq = hk * sp.group + row % sp.group;
          l = p.lse ? p.lse[(std::int64_t(b) * q.num_heads + hq) * q.capacity + i]
                    : lse_rows[std::int64_t(bh) * row_capacity + row];
        }
        lse_tile[threadIdx.x] = l;
      }
      float logits[4][4];
      score_tile(kv, q, sp, b, hk, row0, key0, scale, logits, qs, ks);  // synchronises before lse_tile is read
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const int r = ty + 16 * a;
        if (per_head && (row0 + r) % sp.group != g) continue;
#pragma unroll
        for (int c = 0; c < 4; ++c)
          if (logits[a][c] != -INFINITY) sum[c] += expf(logits[a][c] - lse_tile[r]);
      }
      __syncthreads();  // lse_tile is rewritten by the next tile
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) col[ty][tx + 16 * c] = sum[c];
    __syncthreads();
    if (threadIdx.x < kScoreTile) {
      const int key = key0 + threadIdx.x;
      float total = 0.f;
      for (int t = 0; t < 16; ++t) total += col[t][threadIdx.x];
      if (key < sp.prefix) {
        if (per_head) {
          out(std::int64_t(b) * q.num_heads + hk * sp.group + g, key) = total;
        } else {
          out(std::int64_t(b) * kv.num_kv_heads + hk, key) = total / float(sp.group);
        }
      }
    }
    __syncthreads();
  }
}

}  // namespace detail
}  // namespace kvsift

#include "kvsift/ops/detail/window_scores_mma.cuh"

namespace kvsift {
namespace detail {

// Launch the two passes on tensor cores (16-bit Q/K, head_dim 64/128/256) or CUDA cores (the rest).
template <int D, class View, class QT>
void launch_window_scores_mma(cudaStream_t stream, const View& kv, const QueryRows<QT>& q, const WindowScoreParams& p,
                              std::int64_t cols, float scale, int rows, int chunks, int max_len, float2* partials,
                              float* lse_rows, StridedView2D<float> out) {
  const int bh = kv.batch * kv.num_kv_heads;
  if (!p.lse) {
    const dim3 grid1((rows + kMmaRowTile - 1) / kMmaRowTile, chunks, bh);
    lse_partials_mma_kernel<D><<<grid1, kMmaThreads, 0, stream>>>(kv, q, p, cols, scale, chunks, rows, partials);
    lse_merge_kernel<<<dim3((rows + 127) / 128, bh), 128, 0, stream>>>(kv, q, p, cols, chunks, rows, partials, lse_rows);
  }
  const int key_blocks = int((std::min<std::int64_t>(cols, max_len) + kMmaKeysPerBlock - 1) / kMmaKeysPerBlock);
  column_sums_mma_kernel<D><<<dim3(key_blocks, bh), kMmaThreads, 0, stream>>>(kv, q, p, cols, scale, rows, lse_rows, out);
}

}  // namespace detail

namespace cuda {

template <class View, class QT>
Status window_scores(Exec exec, const View& kv, const QueryRows<QT>& q, const WindowScoreParams& params,
                     StridedView2D<float> scores, void* workspace = nullptr, std::size_t workspace_bytes = 0) {
  static_assert(check_kv_view<View>());
  KVSIFT_TRY(detail::validate_window_scores(kv, q, params, scores));
  const int max_len = detail::window_max_length(kv, params);
  KVSIFT_REQUIRE(max_len >= 0, kInvalidArgument,
                 "max_length = 0 and the view has no capacity: set WindowScoreParams::max_length");
  if (kv.batch == 0 || max_len <= params.window || scores.cols == 0) return Status();
  KVSIFT_REQUIRE(std::int64_t(kv.batch) * kv.num_kv_heads <= 65535, kUnsupported, "batch * num_kv_heads = ",
                 std::int64_t(kv.batch) * kv.num_kv_heads, " must be <= 65535");
  const float scale = detail::resolve_sm_scale(params.sm_scale, kv.head_dim);
  const int group = q.num_heads / kv.num_kv_heads;
  const int rows = detail::window_rows_capacity(params, max_len, q.capacity, group);
  const int chunks = (max_len + detail::kLseKeyChunk - 1) / detail::kLseKeyChunk;
  const int bh = kv.batch * kv.num_kv_heads;
  const std::int64_t cols = scores.cols;

  WorkspaceCarver ws(workspace, workspace_bytes);
  const detail::WindowScoreScratch scratch = detail::carve_window_scores(ws, kv, q, params);
  auto* partials = reinterpret_cast<float2*>(scratch.partials);
  float* lse_rows = scratch.lse_rows;
  if (!params.lse) {
    KVSIFT_REQUIRE(workspace != nullptr, kNullPointer, "workspace is null (ask window_scores_workspace_bytes)");
    KVSIFT_TRY(ws.status());
  }
  KVSIFT_REQUIRE(chunks <= 65535, kUnsupported, "prompt too long for one launch");
  if constexpr (detail::window_scores_use_mma<View, QT>()) {
    const int d = kv.head_dim;
    // The tensor-core path stages K with 16-byte loads; unaligned rows take the CUDA-core path.
    if ((d == 64 || d == 128 || d == 256) && check_rows_16byte_aligned(kv).ok()) {
      if (d == 64) detail::launch_window_scores_mma<64>(exec.stream, kv, q, params, cols, scale, rows, chunks, max_len, partials, lse_rows, scores);
      if (d == 128) detail::launch_window_scores_mma<128>(exec.stream, kv, q, params, cols, scale, rows, chunks, max_len, partials, lse_rows, scores);
      if (d == 256) detail::launch_window_scores_mma<256>(exec.stream, kv, q, params, cols, scale, rows, chunks, max_len, partials, lse_rows, scores);
      KVSIFT_CHECK_LAUNCH();
      return Status();
    }
  }
  if (!params.lse) {
    const dim3 grid1((rows + detail::kScoreTile - 1) / detail::kScoreTile, chunks, bh);
    KVSIFT_REQUIRE(grid1.x <= 2147483647u && chunks <= 65535, kUnsupported, "prompt too long for one launch");
    detail::lse_partials_kernel<<<grid1, detail::kScoreThreads, 0, exec.stream>>>(kv, q, params, cols, scale, chunks,
                                                                                   rows, partials);
    KVSIFT_CHECK_LAUNCH();
    detail::lse_merge_kernel<<<dim3((rows + 127) / 128, bh), 128, 0, exec.stream>>>(kv, q, params, cols, chunks, rows,
                                                                                   partials, lse_rows);
    KVSIFT_CHECK_LAUNCH();
  }
  const int key_tiles = int((std::min<std::int64_t>(cols, max_len) + detail::kScoreTile - 1) / detail::kScoreTile);
  detail::column_sums_kernel<<<dim3(key_tiles, bh), detail::kScoreThreads, 0, exec.stream>>>(
      kv, q, params, cols, scale, rows, lse_rows, scores);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

template <class View>
__global__ void scored_prefix_lengths_kernel(View kv, int window, int heads, std::int64_t cols, std::int32_t* out) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < kv.batch * heads) out[r] = detail::scored_prefix(kv.length(r / heads), window, cols);
}

template <class View>
Status scored_prefix_lengths(Exec exec, const View& kv, int window, int heads_per_sequence, std::int64_t cols,
                             std::int32_t* row_lengths) {
  static_assert(check_kv_view<View>());
  KVSIFT_REQUIRE(heads_per_sequence > 0, kInvalidArgument, "heads_per_sequence = ", heads_per_sequence,
                 " must be > 0");
  KVSIFT_REQUIRE(kv.batch == 0 || row_lengths != nullptr, kNullPointer, "row_lengths is null");
  const int rows = kv.batch * heads_per_sequence;
  if (rows == 0) return Status();
  scored_prefix_lengths_kernel<<<(rows + 255) / 256, 256, 0, exec.stream>>>(kv, window, heads_per_sequence, cols,
                                                                           row_lengths);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
