#pragma once
// Pieces shared by the decode-attention kernels: the kernel arguments, the map from a block to its
// (batch, KV head, split), the token source of a split (dense range or index-set entries), row
// locators for the shipped views, the in-block merge of the warps' partial softmax states, and the
// log-sum-exp merge of the splits.

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/core/online_softmax.hpp"
#include "kvsift/core/reduce.cuh"
#include "kvsift/kv/contiguous_kv.hpp"
#include "kvsift/kv/index_set.hpp"
#include "kvsift/kv/paged_kv.hpp"
#include "kvsift/ops/decode_attention.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kDecodeWarps = 4;
inline constexpr int kDecodeThreads = kDecodeWarps * 32;

// Everything a split kernel reads, passed by value (graph capture records it).
template <class View, class QT>
struct DecodeArgs {
  View kv;
  const QT* q;
  std::int64_t q_batch_stride, q_token_stride, q_head_stride;
  int q_len, group, rows, row_tile, max_len, chunk;
  int dense_splits, gathered_splits, ctas_per_tile, num_dense;
  float scale_log2;  // sm_scale * log2(e): the kernels run the softmax in base 2
  ConstIndexSet gather;
  float* scores;
  std::int64_t score_row_stride;
  int score_block_size, score_cols;
  float* partial_out;  // [batch, row_tiles, ctas_per_tile, row_tile, head_dim]
  float* partial_lse;  // [batch, row_tiles, ctas_per_tile, row_tile], base 2
  std::uint8_t head_at[kMaxKvHeads];
};

// What one block works on.
struct DecodeWork {
  int b, tile, h, split;
  bool gathered;
  int len;        // visible sequence length (clamped to max_len)
  int base;       // dense: first token of the split
  int positions;  // token positions the split covers: dense tokens, or entries * block size
  const std::int32_t* entries;  // gathered: the split's first index entry
  int block_shift;              // gathered: log2(block size); 0 for tokens
  std::size_t partial;          // index of this block's partial in the workspace

  // Token at position p of the split, or -1 when p is past the end or the entry is out of range.
  __device__ __forceinline__ int token(int p) const {
    if (p >= positions) return -1;
    if (!gathered) return base + p;
    const std::int64_t e = __ldg(entries + (p >> block_shift));
    const std::int64_t t = (e << block_shift) + (p & ((1 << block_shift) - 1));
    return (e >= 0 && t < len) ? int(t) : -1;
  }
};

template <class View, class QT>
__device__ __forceinline__ DecodeWork locate_work(const DecodeArgs<View, QT>& a) {
  DecodeWork w;
  const int x = blockIdx.x;
  w.tile = blockIdx.y;
  w.b = blockIdx.z;
  const int dense_ctas = a.num_dense * a.dense_splits;
  int rank;
  if (x < dense_ctas) {
    w.gathered = false;
    rank = x / a.dense_splits;
    w.split = x - rank * a.dense_splits;
    w.h = a.head_at[rank];
  } else {
    w.gathered = true;
    rank = (x - dense_ctas) / a.gathered_splits;
    w.split = x - dense_ctas - rank * a.gathered_splits;
    w.h = a.head_at[a.num_dense + rank];
  }
  const int n = a.kv.length(w.b);
  w.len = n < a.max_len ? n : a.max_len;
  w.base = w.split * a.chunk;
  if (!w.gathered) {
    const int left = w.len - w.base;
    w.positions = left <= 0 ? 0 : (left < a.chunk ? left : a.chunk);
    w.entries = nullptr;
    w.block_shift = 0;
  } else {
    const int row = w.b * a.kv.num_kv_heads + w.h;
    w.block_shift = __ffs(a.gather.block_size) - 1;
    const int per_split = a.chunk >> w.block_shift;
    const int first = w.split * per_split;
    const int left = a.gather.count(row) - first;
    const int entries = left <= 0 ? 0 : (left < per_split ? left : per_split);
    w.positions = entries << w.block_shift;
    w.entries = a.gather.row(row) + first;
  }
  w.partial = (std::size_t(w.b) * gridDim.y + w.tile) * gridDim.x + x;
  return w;
}

// Row addresses of one (batch, KV head): the generic form asks the view per token; the shipped
// views hoist the per-head part and, for power-of-two pages, replace the division by a shift.
template <class View>
struct KvRows {
  using T = std::remove_const_t<typename View::value_type>;
  View kv;
  int b, h;
  __device__ KvRows(const View& v, int b_, int h_) : kv(v), b(b_), h(h_) {}
  __device__ __forceinline__ const T* k(int t) const { return kv.k_row(b, h, t); }
  __device__ __forceinline__ const T* v(int t) const { return kv.v_row(b, h, t); }
};

template <class E>
struct KvRows<ContiguousKV<E>> {
  using T = std::remove_const_t<E>;
  const T* k_base;
  const T* v_base;
  std::int64_t k_stride, v_stride;
  __device__ KvRows(const ContiguousKV<E>& kv, int b, int h)
      : k_base(kv.k_row(b, h, 0)), v_base(kv.v_row(b, h, 0)), k_stride(kv.k_token_stride), v_stride(kv.v_token_stride) {}
  __device__ __forceinline__ const T* k(int t) const { return k_base + t * k_stride; }
  __device__ __forceinline__ const T* v(int t) const { return v_base + t * v_stride; }
};

template <class E>
struct KvRows<PagedKV<E>> {
  using T = std::remove_const_t<E>;
  const T* k_pages;
  const T* v_pages;
  const std::int32_t* table;
  std::int64_t page_stride, slot_stride, head_offset;
  int page_size, page_shift;  // page_shift < 0: page_size is not a power of two
  __device__ KvRows(const PagedKV<E>& kv, int b, int h)
      : k_pages(kv.k_pages), v_pages(kv.v_pages), table(kv.block_table + b * kv.block_table_stride),
        page_stride(kv.page_stride) {
    const bool nhd = kv.layout == PageLayout::kNHD;
    slot_stride = nhd ? std::int64_t(kv.num_kv_heads) * kv.head_dim : kv.head_dim;
    head_offset = nhd ? std::int64_t(h) * kv.head_dim : std::int64_t(h) * kv.page_size * kv.head_dim;
    page_size = kv.page_size;
    page_shift = (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
  }
  __device__ __forceinline__ std::int64_t offset(int t) const {
    int page, slot;
    if (page_shift >= 0) {
      page = t >> page_shift;
      slot = t & (page_size - 1);
    } else {
      page = t / page_size;
      slot = t - page * page_size;
    }
    return std::int64_t(__ldg(table + page)) * page_stride + slot * slot_stride + head_offset;
  }
  __device__ __forceinline__ const T* k(int t) const { return k_pages + offset(t); }
  __device__ __forceinline__ const T* v(int t) const { return v_pages + offset(t); }
};

// 16-byte streaming load: K/V are read once, so they skip L1; the L2 hint fetches whole 256-byte
// lines, which is one K or V row at head_dim 128.
__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

// Floats ordered as unsigned integers, so block maxima use integer atomics in shared memory.
__device__ __forceinline__ unsigned ordered_key(float f) {
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float ordered_value(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Shared memory of a split block: the warps' unnormalised outputs and softmax states, then the
// block-max scratch for score emission.
template <int D, int R>
struct SplitSmem {
  float o[kDecodeWarps][R][D];
  float m[kDecodeWarps][R];
  float l[kDecodeWarps][R];
  static constexpr std::size_t bytes(int score_blocks) {
    return sizeof(SplitSmem) + std::size_t(score_blocks) * sizeof(unsigned);
  }
};

template <int D, int R>
__device__ __forceinline__ unsigned* block_max_scratch(SplitSmem<D, R>& s) {
  return reinterpret_cast<unsigned*>(&s + 1);
}

// Scores of the split's tokens past the sequence (and of blocks nothing wrote) become -inf; for
// block maxima, the scratch of the whole split is flushed. Called by every thread after a barrier.
template <int D, int R, class View, class QT>
__device__ void finish_scores(const DecodeArgs<View, QT>& a, const DecodeWork& w, SplitSmem<D, R>& s) {
  float* row = a.scores + (std::int64_t(w.b) * a.kv.num_kv_heads + w.h) * a.score_row_stride;
  if (a.score_block_size == 1) {
    const int from = w.len > w.base ? w.len : w.base;
    const int to = min(w.base + a.chunk, a.score_cols);
    for (int t = from + threadIdx.x; t < to; t += blockDim.x) row[t] = -INFINITY;
  } else {
    const int blocks = a.chunk / a.score_block_size;
    const int first = w.base / a.score_block_size;
    const unsigned* scratch = block_max_scratch(s);
    for (int i = threadIdx.x; i < blocks && first + i < a.score_cols; i += blockDim.x)
      row[first + i] = ordered_value(scratch[i]);
  }
}

// Merge the warps' softmax states of one block and store the normalised partial and its base-2 LSE.
// s.o holds each warp's output scaled by 2^-m; s.m / s.l its row maxima and sums.
template <int D, int R>
__device__ void store_block_partial(SplitSmem<D, R>& s, float* partial_out, float* partial_lse, std::size_t partial) {
  __syncthreads();
  for (int i = threadIdx.x; i < R * D; i += blockDim.x) {
    const int r = i / D, c = i % D;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) m = fmaxf(m, s.m[w][r]);
    float l = 0.f, o = 0.f;
    if (m != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) {
        const float f = s.m[w][r] == -INFINITY ? 0.f : exp2f(s.m[w][r] - m);
        l += s.l[w][r] * f;
        o += s.o[w][r][c] * f;
      }
    }
    partial_out[(partial * R + r) * D + c] = l > 0.f ? o / l : 0.f;
    if (c == 0) partial_lse[partial * R + r] = l > 0.f ? m + log2f(l) : -INFINITY;
  }
}

// ---- merge of the splits: one warp per output row (batch, query position, query head) ----

template <class QT>
struct MergeArgs {
  QT* out;
  std::int64_t out_batch_stride, out_token_stride, out_head_stride;
  float* lse;
  const float* partial_out;
  const float* partial_lse;
  int batch, q_len, num_q_heads, group, head_dim, row_tile, row_tiles, ctas_per_tile;
  int num_dense, dense_splits, gathered_splits;
  HeadRoleMask roles;
  std::uint8_t rank_of[kMaxKvHeads];
};

inline constexpr int kMergeWarps = 4;
inline constexpr int kDecodeMaxHeadDim = 256;

template <class QT>
__global__ void __launch_bounds__(kMergeWarps * 32) decode_merge_kernel(MergeArgs<QT> a) {
  const int lane = threadIdx.x % 32;
  const std::int64_t orow = std::int64_t(blockIdx.x) * kMergeWarps + threadIdx.x / 32;
  if (orow >= std::int64_t(a.batch) * a.q_len * a.num_q_heads) return;
  const int hq = int(orow % a.num_q_heads);
  const int qpos = int((orow / a.num_q_heads) % a.q_len);
  const int b = int(orow / (std::int64_t(a.num_q_heads) * a.q_len));
  const int h = hq / a.group;
  const int r = qpos * a.group + hq % a.group;
  const int tile = r / a.row_tile, rr = r % a.row_tile;
  int first, count;
  if (!a.roles.is_sparse(h)) {
    first = a.rank_of[h] * a.dense_splits;
    count = a.dense_splits;
  } else {
    first = a.num_dense * a.dense_splits + a.rank_of[h] * a.gathered_splits;
    count = a.gathered_splits;
  }
  const std::size_t p0 = (std::size_t(b) * a.row_tiles + tile) * a.ctas_per_tile + first;
  float m = -INFINITY;
  for (int x = lane; x < count; x += 32) m = fmaxf(m, a.partial_lse[(p0 + x) * a.row_tile + rr]);
  m = warp_max(m);
  float sum = 0.f;
  if (m != -INFINITY)
    for (int x = lane; x < count; x += 32) {
      const float v = a.partial_lse[(p0 + x) * a.row_tile + rr];
      sum += v == -INFINITY ? 0.f : exp2f(v - m);
    }
  sum = warp_sum(sum);
  const float total = sum > 0.f ? m + log2f(sum) : -INFINITY;
  QT* o = a.out + b * a.out_batch_stride + qpos * a.out_token_stride + hq * a.out_head_stride;
  // Weighted sum over the splits. Each lane owns columns lane, lane + 32, ...; the weights of 32
  // splits at a time sit one per lane and are broadcast, so the loads of consecutive splits are
  // independent and many are in flight (a split-serial loop here costs ~0.3 us per split).
  constexpr int kMaxCols = kDecodeMaxHeadDim / 32;
  float acc[kMaxCols];
#pragma unroll
  for (int k = 0; k < kMaxCols; ++k) acc[k] = 0.f;
  for (int x0 = 0; x0 < count; x0 += 32) {
    const int x = x0 + lane;
    const float v = x < count ? a.partial_lse[(p0 + x) * a.row_tile + rr] : -INFINITY;
    const float weight = (v == -INFINITY || total == -INFINITY) ? 0.f : exp2f(v - total);
    const int n = count - x0 < 32 ? count - x0 : 32;
#pragma unroll 4
    for (int i = 0; i < n; ++i) {
      const float wi = __shfl_sync(0xffffffffu, weight, i);
      // Empty splits store zeros, so a zero weight never meets a NaN.
      const float* src = a.partial_out + ((p0 + x0 + i) * a.row_tile + rr) * a.head_dim;
#pragma unroll
      for (int k = 0; k < kMaxCols; ++k)
        if (lane + 32 * k < a.head_dim) acc[k] = fmaf(wi, src[lane + 32 * k], acc[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < kMaxCols; ++k)
    if (lane + 32 * k < a.head_dim) o[lane + 32 * k] = from_float<QT>(acc[k]);
  if (a.lse && lane == 0) a.lse[orow] = total == -INFINITY ? -INFINITY : total * kLn2;
}

}  // namespace detail
}  // namespace kvsift
