#pragma once
// Pieces shared by the decode-attention kernels: the launch arguments, the map from a block to its
// (batch, KV head, split), the token source of a split (a retrieval head's token range or a sparse head's index entries), row
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
#include "kvsift/ops/decode_attention_plan.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kDecodeWarps = 4;
inline constexpr int kDecodeThreads = kDecodeWarps * 32;

// Everything a launch reads, passed once by value (graph capture records it): the contract's view
// and params, the host-side plan, and the carved workspace. The split and merge kernels take the same.
template <class View, class QT>
struct DecodeLaunch {
  View kv;
  DecodeAttentionParams<QT> p;
  DecodePlan plan;
  float* partial_out;  // [batch, row_tiles, ctas_per_tile, row_tile, head_dim]
  float* partial_lse;  // [batch, row_tiles, ctas_per_tile, row_tile], base 2
};

// What one block works on.
struct DecodeWork {
  int b, tile, h, split;
  bool sparse;    // a sparse head: the split walks index entries; otherwise a token range
  int len;        // visible sequence length (clamped to max_len)
  int base;       // retrieval head: first token of the split
  int positions;  // token positions the split covers: tokens, or entries * block size
  const std::int32_t* entries;  // sparse head: the split's first index entry
  int block_shift;              // sparse head: log2(block size); 0 for tokens
  std::size_t partial;          // index of this block's partial in the workspace

  // Token at position p of the split, or -1 when p is past the end or the entry is out of range.
  __device__ __forceinline__ int token(int p) const {
    if (p >= positions) return -1;
    if (!sparse) return base + p;
    const std::int64_t e = __ldg(entries + (p >> block_shift));
    const std::int64_t t = (e << block_shift) + (p & ((1 << block_shift) - 1));
    return (e >= 0 && t < len) ? int(t) : -1;
  }
};

template <class View, class QT>
__device__ __forceinline__ DecodeWork locate_work(const DecodeLaunch<View, QT>& a) {
  DecodeWork w;
  const int x = blockIdx.x;
  w.tile = blockIdx.y;
  w.b = blockIdx.z;
  const int retrieval_ctas = a.plan.num_retrieval * a.plan.retrieval_splits;
  int rank;
  if (x < retrieval_ctas) {
    w.sparse = false;
    rank = x / a.plan.retrieval_splits;
    w.split = x - rank * a.plan.retrieval_splits;
    w.h = a.plan.head_at[rank];
  } else {
    w.sparse = true;
    rank = (x - retrieval_ctas) / a.plan.sparse_splits;
    w.split = x - retrieval_ctas - rank * a.plan.sparse_splits;
    w.h = a.plan.head_at[a.plan.num_retrieval + rank];
  }
  const int n = a.kv.length(w.b);
  w.len = n < a.plan.max_len ? n : a.plan.max_len;
  w.base = w.split * a.plan.chunk;
  if (!w.sparse) {
    const int left = w.len - w.base;
    w.positions = left <= 0 ? 0 : (left < a.plan.chunk ? left : a.plan.chunk);
    w.entries = nullptr;
    w.block_shift = 0;
  } else {
    const int row = w.b * a.kv.num_kv_heads + w.h;
    w.block_shift = __ffs(a.p.index_set.block_size) - 1;
    const int per_split = a.plan.chunk >> w.block_shift;
    const int first = w.split * per_split;
    const int left = a.p.index_set.count(row) - first;
    const int entries = left <= 0 ? 0 : (left < per_split ? left : per_split);
    w.positions = entries << w.block_shift;
    w.entries = a.p.index_set.row(row) + first;
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
__device__ void finish_scores(const DecodeLaunch<View, QT>& a, const DecodeWork& w, SplitSmem<D, R>& s) {
  float* row = a.p.scores + (std::int64_t(w.b) * a.kv.num_kv_heads + w.h) * a.p.score_row_stride;
  if (a.p.score_block_size == 1) {
    const int from = w.len > w.base ? w.len : w.base;
    const int to = min(w.base + a.plan.chunk, a.plan.score_cols);
    for (int t = from + threadIdx.x; t < to; t += blockDim.x) row[t] = -INFINITY;
  } else {
    const int blocks = a.plan.chunk / a.p.score_block_size;
    const int first = w.base / a.p.score_block_size;
    const unsigned* scratch = block_max_scratch(s);
    for (int i = threadIdx.x; i < blocks && first + i < a.plan.score_cols; i += blockDim.x)
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

inline constexpr int kMergeWarps = 4;
inline constexpr int kDecodeMaxHeadDim = 256;

template <class View, class QT>
__global__ void __launch_bounds__(kMergeWarps * 32) decode_merge_kernel(const __grid_constant__ DecodeLaunch<View, QT> a) {
  const int lane = threadIdx.x % 32;
  const std::int64_t orow = std::int64_t(blockIdx.x) * kMergeWarps + threadIdx.x / 32;
  if (orow >= std::int64_t(a.plan.batch) * a.p.q_len * a.p.num_q_heads) return;
  const int hq = int(orow % a.p.num_q_heads);
  const int qpos = int((orow / a.p.num_q_heads) % a.p.q_len);
  const int b = int(orow / (std::int64_t(a.p.num_q_heads) * a.p.q_len));
  const int h = hq / a.plan.group;
  const int r = qpos * a.plan.group + hq % a.plan.group;
  const int tile = r / a.plan.row_tile, rr = r % a.plan.row_tile;
  int first, count;
  if (!a.p.roles.is_sparse(h)) {
    first = a.plan.rank_of[h] * a.plan.retrieval_splits;
    count = a.plan.retrieval_splits;
  } else {
    first = a.plan.num_retrieval * a.plan.retrieval_splits + a.plan.rank_of[h] * a.plan.sparse_splits;
    count = a.plan.sparse_splits;
  }
  const std::size_t p0 = (std::size_t(b) * a.plan.row_tiles + tile) * a.plan.ctas_per_tile + first;
  float m = -INFINITY;
  for (int x = lane; x < count; x += 32) m = fmaxf(m, a.partial_lse[(p0 + x) * a.plan.row_tile + rr]);
  m = warp_max(m);
  float sum = 0.f;
  if (m != -INFINITY)
    for (int x = lane; x < count; x += 32) {
      const float v = a.partial_lse[(p0 + x) * a.plan.row_tile + rr];
      sum += v == -INFINITY ? 0.f : exp2f(v - m);
    }
  sum = warp_sum(sum);
  const float total = sum > 0.f ? m + log2f(sum) : -INFINITY;
  QT* o = a.p.io.out.row(b, qpos, hq);
  // Weighted sum over the splits. Each lane owns columns lane, lane + 32, ...; the weights of 32
  // splits at a time sit one per lane and are broadcast, so the loads of consecutive splits are
  // independent and many are in flight (a split-serial loop here costs ~0.3 us per split).
  constexpr int kMaxCols = kDecodeMaxHeadDim / 32;
  float acc[kMaxCols];
#pragma unroll
  for (int k = 0; k < kMaxCols; ++k) acc[k] = 0.f;
  for (int x0 = 0; x0 < count; x0 += 32) {
    const int x = x0 + lane;
    const float v = x < count ? a.partial_lse[(p0 + x) * a.plan.row_tile + rr] : -INFINITY;
    const float weight = (v == -INFINITY || total == -INFINITY) ? 0.f : exp2f(v - total);
    const int n = count - x0 < 32 ? count - x0 : 32;
#pragma unroll 4
    for (int i = 0; i < n; ++i) {
      const float wi = __shfl_sync(0xffffffffu, weight, i);
      // Empty splits store zeros, so a zero weight never meets a NaN.
      const float* src = a.partial_out + ((p0 + x0 + i) * a.plan.row_tile + rr) * a.p.head_dim;
#pragma unroll
      for (int k = 0; k < kMaxCols; ++k)
        if (lane + 32 * k < a.p.head_dim) acc[k] = fmaf(wi, src[lane + 32 * k], acc[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < kMaxCols; ++k)
    if (lane + 32 * k < a.p.head_dim) o[lane + 32 * k] = from_float<QT>(acc[k]);
  if (a.p.io.lse && lane == 0) a.p.io.lse[orow] = total == -INFINITY ? -INFINITY : total * kLn2;
}

}  // namespace detail
}  // namespace kvsift
