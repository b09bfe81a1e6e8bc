#pragma once
// CUDA-core path of window_scores (contract in window_scores.hpp): any Q/K dtype and head_dim.
//
// Logits come from 64 x 64 tiles (rows x keys) computed by 256 threads, 4 x 4 each, over head_dim in
// chunks of 32 staged in shared memory as fp32.
//   pass 1 (skipped when the caller gives lse): each block takes 64 rows and one chunk of keys and
//          writes the chunk's online-softmax (max, sum) per row; lse_merge_kernel folds the chunks in
//          order into each row's log-sum-exp.
//   pass 2: each block takes 64 prefix keys and walks all rows that can see them, summing
//          exp(logit - lse) per key (per head, or over the group for the KV-head mean).
// Every sum runs in a fixed order without atomics, so results are bitwise reproducible, which the
// deterministic top-k downstream relies on.

#include <cstdint>

#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/core/online_softmax.hpp"
#include "kvsift/ops/detail/window_scores_common.cuh"

namespace kvsift {
namespace detail {

// logits[a][c] for rows row0 + ty + 16a and keys key0 + tx + 16c (a, c in [0, 4)); masked or absent
// entries are -inf. All threads of the block must call it (it synchronises).
// key_ok is the block's shared flag per staged key (score_key_readable), for views whose rows can be off
// the pool; keys that fail it are never read and come out -inf like keys past the sequence.
template <class View, class QT>
__device__ void score_tile(const View& kv, const QueryRows<QT>& q, const ScoreProblem& sp, const WindowScoresLaunch& launch,
                           int b, int hk, int row0, int key0, float (&logits)[4][4], float (*qs)[kScoreDimChunk + 1],
                           float (*ks)[kScoreDimChunk + 1], bool* key_ok) {
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const float scale = launch.plan.scale;
  float acc[4][4] = {};
  constexpr bool kAlwaysInPool = kv_rows_always_in_pool<View>;
  if constexpr (!kAlwaysInPool) {
    if (tid < kScoreTile) key_ok[tid] = score_key_readable(kv, launch, b, hk, sp.len, key0 + tid);
    __syncthreads();
  }
  // This thread's four keys, read before the chunk loop's barriers: the next call rewrites key_ok
  // without a barrier of its own in between.
  bool my_keys_ok[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) my_keys_ok[c] = kAlwaysInPool ? key0 + tx + 16 * c < sp.len : key_ok[tx + 16 * c];
  for (int d0 = 0; d0 < kv.head_dim; d0 += kScoreDimChunk) {
    for (int e = tid; e < kScoreTile * kScoreDimChunk; e += kScoreThreads) {
      const int r = e / kScoreDimChunk, dd = e % kScoreDimChunk, d = d0 + dd;
      const int row = row0 + r, key = key0 + r;
      float qv = 0.f, kval = 0.f;
      if (d < kv.head_dim) {
        if (row < sp.rows()) qv = to_float(q.row(b, row / sp.group, hk * sp.group + row % sp.group)[d]);
        if (kAlwaysInPool ? key < sp.len : key_ok[r]) {
          kval = to_float(kv.k_row(b, hk, key)[d]);
          // fp8: dequantized as the host reference does, code x scale in float, before the product.
          if constexpr (is_fp8_view_v<View>) kval *= kv.k_scale(b, hk, key);
        }
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
      const bool visible = row < sp.rows() && my_keys_ok[c] && key <= sp.last_key(row);
      logits[a][c] = visible ? acc[a][c] * scale : -INFINITY;
    }
}

// Pass 1: per (row tile, key chunk, b * Hkv): the chunk's (max, sum of exp) per row.
template <class View, class QT>
__global__ void __launch_bounds__(kScoreThreads) lse_partials_kernel(View kv, QueryRows<QT> q,
                                                                     WindowScoresLaunch launch) {
  const int num_chunks = launch.plan.chunks, row_capacity = launch.plan.row_capacity;
  float2* partials = reinterpret_cast<float2*>(launch.scratch.partials);
  __shared__ float qs[kScoreTile][kScoreDimChunk + 1], ks[kScoreTile][kScoreDimChunk + 1];
  __shared__ float red_m[kScoreTile][17], red_d[kScoreTile][17];
  __shared__ bool key_ok[kScoreTile];
  const int bh = blockIdx.z, b = bh / kv.num_kv_heads, hk = bh % kv.num_kv_heads;
  const ScoreProblem sp = score_problem(kv, q, launch, b);
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
    score_tile(kv, q, sp, launch, b, hk, row0, key0, logits, qs, ks, key_ok);
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

// Pass 2: per (key tile, b * Hkv): column sums of exp(logit - lse) over every row that sees the keys.
// `lse_given` uses the caller's [batch, Hq, q.capacity] layout; otherwise `lse_rows` ([bh, rows]).
template <class View, class QT>
__global__ void __launch_bounds__(kScoreThreads) column_sums_kernel(View kv, QueryRows<QT> q,
                                                                    WindowScoresLaunch launch) {
  const WindowScoreParams& p = launch.params;
  const float* lse_rows = launch.scratch.lse_rows;
  const StridedView2D<float>& out = launch.scores;
  __shared__ float qs[kScoreTile][kScoreDimChunk + 1], ks[kScoreTile][kScoreDimChunk + 1];
  __shared__ float lse_tile[kScoreTile];
  __shared__ bool key_ok[kScoreTile];
  __shared__ float col[16][kScoreTile];  // per thread row (ty) partial sums, folded in order at the end
  const int bh = blockIdx.y, b = bh / kv.num_kv_heads, hk = bh % kv.num_kv_heads;
  const ScoreProblem sp = score_problem(kv, q, launch, b);
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
                    : lse_rows[std::int64_t(bh) * launch.plan.row_capacity + row];
        }
        lse_tile[threadIdx.x] = l;
      }
      float logits[4][4];
      score_tile(kv, q, sp, launch, b, hk, row0, key0, logits, qs, ks, key_ok);  // syncs before lse_tile is read
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
