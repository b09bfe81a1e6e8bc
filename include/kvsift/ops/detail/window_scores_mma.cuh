#pragma once
// Tensor-core path of window_scores for 16-bit Q and K (bf16 or fp16, the same type) and head_dim 64,
// 128 or 256. Same two passes, same results layout and the same fixed summation order as the CUDA-core
// path in window_scores_simt.cuh; only the logits tiles come from mma.sync m16n8k16 (fp32 accumulation).
//
// A block is 8 warps. Warp w owns 16 query rows (rows 16w.. of a 128-row tile) and computes their
// logits against 64 keys at a time: 8 n-tiles of 8 keys x head_dim / 16 k-steps. The warp's Q
// fragments stay in registers for the whole block when the rows fit one tile (the window case: W x G
// <= 128). The block stages each 64-key tile of K in shared memory with 16-byte loads (one HBM read
// per key per pass), rows padded by 16 bytes so the warps' 32-bit fragment reads hit 32 distinct
// banks. Needs 16-byte aligned K rows (check_rows_16byte_aligned); otherwise the CUDA-core path runs.

#include <cstdint>

#include <type_traits>

#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/core/online_softmax.hpp"
#include "kvsift/ops/detail/window_scores_common.cuh"

namespace kvsift {
namespace detail {

inline constexpr int kMmaRowTile = 128;     // rows per block: 8 warps x 16
inline constexpr int kMmaKeyTile = 64;      // keys per warp step: 8 n-tiles of 8
inline constexpr int kMmaKeysPerBlock = 256;  // keys per column-sum block (4 key tiles)
inline constexpr int kMmaThreads = 256;

template <class T>
struct is_bf16_storage
    : std::integral_constant<bool, dtype_traits<T>::dtype == DType::kBFloat16> {};

// Two 16-bit elements as one 32-bit register, the lower index in the lower half (mma's packing).
template <class T>
__device__ __forceinline__ std::uint32_t pack_pair(const T* p) {
  const auto* bits = reinterpret_cast<const std::uint16_t*>(p);
  return std::uint32_t(bits[0]) | (std::uint32_t(bits[1]) << 16);
}

template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                          std::uint32_t b1) {
  if constexpr (is_bf16_storage<T>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// The A fragments (Q) of a warp's 16 rows starting at row0: for k-step s, registers hold
// (row g, cols 16s + 2t..+1), (row g+8, same), (row g, cols 16s + 8 + 2t..+1), (row g+8, same), with
// g = lane / 4 and t = lane % 4. Rows past the end are zeros.
template <int D, class View, class QT>
__device__ __forceinline__ void load_q_fragments(const View& kv, const QueryRows<QT>& q, const ScoreProblem& sp, int b,
                                                 int hk, int row0, std::uint32_t (&a)[D / 16][4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const QT* rows[2] = {nullptr, nullptr};
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + g + 8 * half;
    if (row < sp.rows()) rows[half] = q.row(b, row / sp.group, hk * sp.group + row % sp.group);
  }
  (void)kv;
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
    const int c = 16 * s + 2 * t;
    a[s][0] = rows[0] ? pack_pair(rows[0] + c) : 0u;
    a[s][1] = rows[1] ? pack_pair(rows[1] + c) : 0u;
    a[s][2] = rows[0] ? pack_pair(rows[0] + c + 8) : 0u;
    a[s][3] = rows[1] ? pack_pair(rows[1] + c + 8) : 0u;
  }
}

template <int D>
struct KeyTile {
  static constexpr int kStride = D + 8;  // 16-bit elements per row: D plus 16 bytes of padding
  std::uint16_t rows[kMmaKeyTile][kStride];
  bool ok[kMmaKeyTile];  // the staged key can be read (score_key_staged); false keys are zeros, masked
};

// All threads of the block: stage keys key0 .. key0 + 63 into shared memory, zeros for keys past len
// or off the page pool (tile.ok false). The caller synchronises before and after. A bad key is noted
// and recorded after the loads, so the unrolled loads hold no call (measured on the H200 against the
// record inside the loop: within 1%; paged compress_prompt still costs 6-8% more than unguarded).
template <int D, class View>
__device__ __forceinline__ void load_key_tile(const View& kv, const WindowScoresLaunch& launch, int b, int hk, int len,
                                              int key0, KeyTile<D>& tile) {
  constexpr int kVectorsPerRow = D / 8;  // 16 bytes = 8 elements
  int bad_key = -1;
  for (int v = threadIdx.x; v < kMmaKeyTile * kVectorsPerRow; v += kMmaThreads) {
    const int r = v / kVectorsPerRow, part = v % kVectorsPerRow, key = key0 + r;
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    const bool ok = score_key_staged(kv, b, len, key);
    if (ok) x = __ldg(reinterpret_cast<const uint4*>(kv.k_row(b, hk, key)) + part);
    *reinterpret_cast<uint4*>(&tile.rows[r][part * 8]) = x;
    if constexpr (!kv_rows_always_in_pool<View>) {
      if (!ok && key < len) bad_key = key;
      if (part == 0) tile.ok[r] = ok;
    }
  }
  if constexpr (!kv_rows_always_in_pool<View>)
    if (bad_key >= 0) record_bad_score_key(kv, launch, b, hk, bad_key);
}

// After the barrier that follows load_key_tile: bit 2n + c says whether the key of acc[n][c] (and of
// acc[n][c + 2]), key0 + 8n + 2t + c, was staged (tile.ok), so the masking loops test a register.
template <int D>
__device__ __forceinline__ std::uint32_t staged_key_mask(const KeyTile<D>& tile) {
  const int t = threadIdx.x % 4;
  std::uint32_t mask = 0;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int c = 0; c < 2; ++c) mask |= std::uint32_t(tile.ok[8 * n + 2 * t + c]) << (2 * n + c);
  return mask;
}

// Logits of the warp's 16 rows against the staged 64 keys: acc[n][0..1] are (row g, keys
// key0 + 8n + 2t..+1), acc[n][2..3] the same keys for row g + 8. Keys not staged (tile.ok) are zeros
// (the caller masks them).
template <int D, class QT>
__device__ __forceinline__ void logits_tile_mma(const KeyTile<D>& tile, const std::uint32_t (&a)[D / 16][4],
                                                float (&acc)[8][4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    const std::uint16_t* k = tile.rows[8 * n + g];
#pragma unroll
    for (int s = 0; s < D / 16; ++s) {
      const std::uint32_t b0 = *reinterpret_cast<const std::uint32_t*>(k + 16 * s + 2 * t);
      const std::uint32_t b1 = *reinterpret_cast<const std::uint32_t*>(k + 16 * s + 8 + 2 * t);
      mma_16816<QT>(acc[n], a[s], b0, b1);
    }
  }
}

// Pass 1 on tensor cores: per (128-row tile, key chunk, b * Hkv) the chunk's (max, sum) per row, in the
// layout of lse_partials_kernel, so lse_merge_kernel folds both.
template <int D, class View, class QT>
__global__ void __launch_bounds__(kMmaThreads) lse_partials_mma_kernel(View kv, QueryRows<QT> q,
                                                                       WindowScoresLaunch launch) {
  const float scale = launch.plan.scale;
  const int num_chunks = launch.plan.chunks, row_capacity = launch.plan.row_capacity;
  float2* partials = reinterpret_cast<float2*>(launch.scratch.partials);
  __shared__ __align__(16) KeyTile<D> tile;
  const int bh = blockIdx.z, b = bh / kv.num_kv_heads, hk = bh % kv.num_kv_heads;
  const ScoreProblem sp = score_problem(kv, q, launch, b);
  const int block_row0 = blockIdx.x * kMmaRowTile;
  if (block_row0 >= sp.rows() || sp.prefix <= 0) return;  // block-uniform
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row0 = block_row0 + warp * 16;
  const bool active = row0 < sp.rows();  // warp-uniform; idle warps still help load and sync
  const int chunk = blockIdx.y, key_begin = chunk * kLseKeyChunk;
  // Keys past the position of the block's last row are invisible to all of its rows.
  const int block_last_row = min(block_row0 + kMmaRowTile, sp.rows()) - 1;
  const int key_end = min(key_begin + kLseKeyChunk, sp.last_key(block_last_row) + 1);
  std::uint32_t a[D / 16][4];
  load_q_fragments<D>(kv, q, sp, b, hk, row0, a);
  const int my_rows[2] = {row0 + g, row0 + g + 8};
  float m[2] = {-INFINITY, -INFINITY}, d[2] = {0.f, 0.f};
  for (int key0 = key_begin; key0 < key_end; key0 += kMmaKeyTile) {
    __syncthreads();  // the previous tile is no longer read
    load_key_tile<D>(kv, launch, b, hk, sp.len, key0, tile);
    __syncthreads();
    if (!active) continue;
    // Views whose rows can be off the pool: which of this thread's keys were staged (else all < len).
    const std::uint32_t staged = kv_rows_always_in_pool<View> ? ~0u : staged_key_mask<D>(tile);
    float acc[8][4];
    logits_tile_mma<D, QT>(tile, a, acc);
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = my_rows[e / 2], key = key0 + 8 * n + 2 * t + (e % 2);
        if (r >= sp.rows() || key >= sp.len || key > sp.last_key(r)) continue;
        if constexpr (!kv_rows_always_in_pool<View>)
          if (!((staged >> (2 * n + e % 2)) & 1u)) continue;
        const float x = acc[n][e] * scale;
        if (x > m[e / 2]) {
          d[e / 2] = d[e / 2] * expf(m[e / 2] - x) + 1.f;
          m[e / 2] = x;
        } else {
          d[e / 2] += expf(x - m[e / 2]);
        }
      }
  }
  if (!active) return;
  // The 4 lanes of a row group hold disjoint keys of the same two rows: merge them in a fixed order.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    SoftmaxState st;
    st.m = m[h];
    st.d = d[h];
    st = merge_lanes_in_order<4>(st);
    if (t == 0 && my_rows[h] < sp.rows())
      partials[(std::int64_t(bh) * row_capacity + my_rows[h]) * num_chunks + chunk] = make_float2(st.m, st.d);
  }
}

// Pass 2 on tensor cores: per (256 keys, b * Hkv) the column sums of exp(logit - lse) over every row.
// A key off the page pool is staged as zeros, and its logits only ever reach its own column: so the
// inner loop needs no mask, and that column's score is set to 0 when it is written. (Masking each
// logit in the loop took the paged head_dim 128 kernel from 126 to 156 registers, one 256-thread block
// per SM instead of two: 22-33% slower on the H200; capped at 128 registers it still cost 7-10%.)
template <int D, class View, class QT>
__global__ void __launch_bounds__(kMmaThreads) column_sums_mma_kernel(View kv, QueryRows<QT> q, WindowScoresLaunch launch) {
  const WindowScoreParams& p = launch.params;
  const float scale = launch.plan.scale;
  const float* lse_rows = launch.scratch.lse_rows;
  const StridedView2D<float>& out = launch.scores;
  __shared__ float col[kMmaThreads / 32][kMmaKeyTile];
  __shared__ __align__(16) KeyTile<D> tile;
  const int bh = blockIdx.y, b = bh / kv.num_kv_heads, hk = bh % kv.num_kv_heads;
  const ScoreProblem sp = score_problem(kv, q, launch, b);
  const int block_key0 = blockIdx.x * kMmaKeysPerBlock;
  if (block_key0 >= sp.prefix) return;  // block-uniform
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bool per_head = p.heads == ScoreHeads::kQueryHead;
  const int row_tiles = (sp.rows() + kMmaRowTile - 1) / kMmaRowTile;
  std::uint32_t a[D / 16][4];
  if (row_tiles == 1) load_q_fragments<D>(kv, q, sp, b, hk, warp * 16, a);
  auto row_lse = [&](int row) {
    if (row >= sp.rows()) return INFINITY;
    const int i = row / sp.group, hq = hk * sp.group + row % sp.group;
    return p.lse ? p.lse[(std::int64_t(b) * q.num_heads + hq) * q.capacity + i]
                 : lse_rows[std::int64_t(bh) * launch.plan.row_capacity + row];
  };
  const int passes = per_head ? sp.group : 1;
  for (int key0 = block_key0; key0 < block_key0 + kMmaKeysPerBlock && key0 < sp.prefix; key0 += kMmaKeyTile) {
    load_key_tile<D>(kv, launch, b, hk, sp.len, key0, tile);  // the previous tile's last reader passed a barrier
    __syncthreads();
    // The first row that can see key0 sits at query position key0 - (len - nq).
    const int first_row = max(0, key0 - (sp.len - sp.nq)) * sp.group;
    for (int pass = 0; pass < passes; ++pass) {
      float sum[8][2] = {};
      for (int rt = first_row / kMmaRowTile; rt < row_tiles; ++rt) {
        const int row0 = rt * kMmaRowTile + warp * 16;
        if (row0 >= sp.rows()) continue;  // warp-uniform
        if (row_tiles > 1) load_q_fragments<D>(kv, q, sp, b, hk, row0, a);
        float acc[8][4];
        logits_tile_mma<D, QT>(tile, a, acc);
        const int my_rows[2] = {row0 + g, row0 + g + 8};
        const float lse[2] = {row_lse(my_rows[0]), row_lse(my_rows[1])};
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = my_rows[e / 2], key = key0 + 8 * n + 2 * t + (e % 2);
            const bool use = r < sp.rows() && key < sp.prefix && key <= sp.last_key(r) && (!per_head || r % sp.group == pass);
            if (use) sum[n][e % 2] += expf(acc[n][e] * scale - lse[e / 2]);
          }
      }
      // Fold the 8 row groups of the warp (lanes differing in g), then the warps, in a fixed order.
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float v = sum[n][c];
          v += __shfl_xor_sync(0xffffffffu, v, 4);
          v += __shfl_xor_sync(0xffffffffu, v, 8);
          v += __shfl_xor_sync(0xffffffffu, v, 16);
          if (g == 0) col[warp][8 * n + 2 * t + c] = v;
        }
      __syncthreads();
      if (threadIdx.x < kMmaKeyTile) {
        const int key = key0 + threadIdx.x;
        float total = 0.f;
        for (int w = 0; w < kMmaThreads / 32; ++w) total += col[w][threadIdx.x];
        if constexpr (!kv_rows_always_in_pool<View>)
          if (!tile.ok[threadIdx.x]) total = 0.f;  // a skipped key: no attention
        if (key < sp.prefix) {
          if (per_head) out(std::int64_t(b) * q.num_heads + hk * sp.group + pass, key) = total;
          else out(std::int64_t(b) * kv.num_kv_heads + hk, key) = total / float(sp.group);
        }
      }
      __syncthreads();
    }
  }
}

}  // namespace detail
}  // namespace kvsift
