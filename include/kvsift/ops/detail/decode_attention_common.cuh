#pragma once
// Pieces shared by the decode-attention kernels: the launch arguments, the map from a block to its
// (batch, KV head, split), the token source of a split (a retrieval head's token range or a sparse
// head's index entries), and the epilogue: the in-block merge of the warps' softmax states, then either
// the final output (a head with one split) or a partial and its log-sum-exp, which the merge kernel
// (decode_attention_merge.cuh) combines. Row addresses come from KvRows (kv_rows.cuh).

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kvsift/core/data_error.cuh"
#include "kvsift/core/dependent_launch.cuh"
#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/core/online_softmax.hpp"
#include "kvsift/core/reduce.cuh"
#include "kvsift/kv/contiguous_kv.hpp"
#include "kvsift/kv/index_set.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/kv/paged_kv.hpp"
#include "kvsift/ops/decode_attention.hpp"
#include "kvsift/ops/decode_attention_plan.hpp"
#include "kvsift/ops/detail/kv_rows.cuh"

namespace kvsift {
namespace detail {

inline constexpr int kDecodeWarps = 4;
inline constexpr int kDecodeThreads = kDecodeWarps * 32;

// Everything a launch reads, passed once by value (graph capture records it): the contract's view
// and params, the host-side plan, and the carved workspace (the partials).
template <class View, class QT>
struct DecodeLaunch {
  View kv;
  DecodeAttentionParams<QT> p;
  DecodePlan plan;
  float* partial_out;  // [batch, row_tiles, ctas_per_tile, row_tile, head_dim]
  float* partial_lse;  // [batch, row_tiles, ctas_per_tile, row_tile], base 2
  DataError* data_error;  // the engine's record of bad engine data (cuda::Exec::data_error), or null
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
  int first_entry;              // sparse head: the split's first entry's index in the row (for the record)

  // Token at position p of the split; -1 when p is past the end (or in the tail of a last block past
  // the length); -2 - j when entry j of the split is out of range (its first token negative or at or
  // past the length): skipped, and the caller records it (record_bad_entry), outside its unrolled loads.
  __device__ __forceinline__ int token(int p) const {
    if (p >= positions) return -1;
    if (!sparse) return base + p;
    return entry_token(p, __ldg(entries + (p >> block_shift)));
  }
  // token(p) of a sparse split (p < positions) given its index entry e = entries[p >> block_shift], for
  // a kernel that staged the entries itself.
  __device__ __forceinline__ int entry_token(int p, std::int64_t e) const {
    const int j = p >> block_shift;
    const std::int64_t t = (e << block_shift) + (p & ((1 << block_shift) - 1));
    if (e >= 0 && t < len) return int(t);
    return (e < 0 || (e << block_shift) >= len) ? -2 - j : -1;
  }
};

// The records of the items a split skipped (cuda::Exec::data_error; nothing when it is null): a page
// outside the pool met at token t, entry j of the split out of range. Called once per thread after its
// loads, on the path that met one.
template <class View, class QT>
__device__ void record_bad_page(const DecodeLaunch<View, QT>& a, const DecodeWork& w, int t, long long page) {
  record_data_error(a.data_error, DataErrorOp::kDecodeAttention, DataErrorKind::kPageOutOfPool, w.b, w.h, t, page);
}
template <class View, class QT>
__device__ void record_bad_entry(const DecodeLaunch<View, QT>& a, const DecodeWork& w, int j) {
  record_data_error(a.data_error, DataErrorOp::kDecodeAttention, DataErrorKind::kIndexOutOfRange, w.b, w.h,
                    w.first_entry + j, w.entries[j]);
}

// A block's place in the call from its index and the plan alone: b, tile, head, role, split, the
// split's first token (retrieval) or first index entry (sparse) and its partial's slot. It reads no
// global memory, so a kernel can address its first copies before the lengths and counts arrive
// (decode_split_mma_kernel's early stage).
template <class View, class QT>
__device__ __forceinline__ DecodeWork locate_split(const DecodeLaunch<View, QT>& a) {
  DecodeWork w;
  int x;
  if (a.plan.backfill) {  // the whole call's retrieval blocks first (DecodePlan::backfill)
    const int linear = int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    const DecodeBlockPlace at = decode_backfill_place(linear, a.plan.ctas_per_tile,
                                                      a.plan.num_retrieval * a.plan.retrieval_splits, a.plan.row_tiles,
                                                      int(gridDim.z));
    x = at.x;
    w.tile = at.tile;
    w.b = at.b;
  } else {
    x = blockIdx.x;
    w.tile = blockIdx.y;
    w.b = blockIdx.z;
  }
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
  w.base = w.split * a.plan.chunk;
  w.partial = (std::size_t(w.b) * a.plan.row_tiles + w.tile) * a.plan.ctas_per_tile + x;
  w.entries = nullptr;
  w.block_shift = 0;
  w.first_entry = 0;
  if (w.sparse) {
    w.block_shift = __ffs(a.p.index_set.block_size) - 1;
    w.first_entry = w.split * (a.plan.sparse_chunk >> w.block_shift);
    w.entries = a.p.index_set.row(w.b * a.kv.num_kv_heads + w.h) + w.first_entry;
  }
  return w;
}

// Views whose length(b) is lengths[b] clamped by clamp_length (ContiguousKV, PagedKV): a kernel can
// load the number early and clamp it where it uses it; other views' length(b) is called there.
template <class View, class = void>
struct SplitLengthLoad : std::false_type {};
template <class View>
struct SplitLengthLoad<View, std::void_t<decltype(std::declval<const View&>().clamp_length(0))>> : std::true_type {};

// What bound_work needs from memory, as loaded: the sequence's length and, for a sparse head, its
// index count, both unclamped. A kernel issues these loads first and uses them later (bound_work), so
// copies it issues in between neither queue ahead of them nor wait for them: a use right after the
// load (a clamp, a branch on the count) would stall the block there.
struct WorkBounds {
  int length, count;
};
template <class View, class QT>
__device__ __forceinline__ WorkBounds load_bounds(const DecodeLaunch<View, QT>& a, const DecodeWork& w) {
  WorkBounds wb;
  if constexpr (SplitLengthLoad<View>::value)
    wb.length = a.kv.lengths[w.b];
  else
    wb.length = a.kv.length(w.b);
  wb.count = w.sparse ? a.p.index_set.counts[w.b * a.kv.num_kv_heads + w.h] : 0;
  return wb;
}

// The rest of the block's work, from its bounds: len, positions, and a sparse split's entries.
template <class View, class QT>
__device__ __forceinline__ void bound_work(const DecodeLaunch<View, QT>& a, DecodeWork& w, const WorkBounds& wb) {
  int n = wb.length;
  if constexpr (SplitLengthLoad<View>::value) n = a.kv.clamp_length(n);
  w.len = n < a.plan.max_len ? n : a.plan.max_len;
  if (!w.sparse) {
    const int left = w.len - w.base;
    w.positions = left <= 0 ? 0 : (left < a.plan.chunk ? left : a.plan.chunk);
  } else {
    const int per_split = a.plan.sparse_chunk >> w.block_shift;
    const int left = a.p.index_set.clamp_count(wb.count) - w.first_entry;
    const int entries = left <= 0 ? 0 : (left < per_split ? left : per_split);
    w.positions = entries << w.block_shift;
    if (w.split == 0 && w.tile == 0 && threadIdx.x == 0) {
      const int raw = wb.count;
      if (raw < 0 || raw > a.p.index_set.capacity)
        record_data_error(a.data_error, DataErrorOp::kDecodeAttention, DataErrorKind::kCountOutOfRange, w.b, w.h, -1,
                          raw);
    }
  }
}

template <class View, class QT>
__device__ __forceinline__ DecodeWork locate_work(const DecodeLaunch<View, QT>& a) {
  DecodeWork w = locate_split(a);
  bound_work(a, w, load_bounds(a, w));
  return w;
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

// The score candidates (ops/score_candidates.hpp) of a block's split: its segment of the row's list
// (positions from w.base on) and the threshold the pass lists at. Without candidates, or off the score
// tile, the threshold is NaN and nothing is ever listed (add's compare fails), so callers need no flag.
struct CandidateSegment {
  float threshold;
  std::int32_t* list;
  // Lists token t if its score reaches the threshold; `listed` counts the split's list in shared memory.
  __device__ __forceinline__ void add(int* listed, int t, float score) const {
    if (score >= threshold) list[atomicAdd(listed, 1)] = t;
  }
};
// Read after dependent_kernel_start: the threshold is the previous step's top-k output. -inf lists
// nothing either (-inf scores mark the positions past the length, which a list must not need).
template <class View, class QT>
__device__ __forceinline__ CandidateSegment candidate_segment(const DecodeLaunch<View, QT>& a, const DecodeWork& w,
                                                              bool score_tile) {
  CandidateSegment c{NAN, nullptr};
  if (score_tile && a.p.score_block_size == 1 && a.p.candidates.enabled()) {
    const std::int64_t r = std::int64_t(w.b) * a.kv.num_kv_heads + w.h;
    const float t = a.p.candidates.thresholds[r];
    c.threshold = t > -INFINITY ? t : NAN;
    c.list = a.p.candidates.positions + r * a.p.score_row_stride + w.base;
  }
  return c;
}

// Scores of the split's tokens past the sequence (and of blocks nothing wrote) become -inf; for
// block maxima, the scratch of the whole split is flushed. With candidates, the split's count (and,
// from split 0, the row's header) is published: `listed` is final, every add was before the barrier.
// Called by every thread after a barrier.
template <class View, class QT>
__device__ void finish_scores(const DecodeLaunch<View, QT>& a, const DecodeWork& w, const unsigned* scratch, int listed) {
  const std::int64_t r = std::int64_t(w.b) * a.kv.num_kv_heads + w.h;
  float* row = a.p.scores + r * a.p.score_row_stride;
  if (a.p.score_block_size == 1) {
    const int from = w.len > w.base ? w.len : w.base;
    const int to = min(w.base + a.plan.chunk, a.plan.score_cols);
    for (int t = from + threadIdx.x; t < to; t += blockDim.x) row[t] = -INFINITY;
    // The row's segments are the splits that cover its columns: a cluster plan may give a retrieval
    // head more splits than that (the count of the sparse heads'), and those empty splits have no
    // count slot (the row holds ceil(max_kv_length / 64) of them; a write past it would land in the
    // next row's header).
    const int segments = (a.plan.score_cols + a.plan.chunk - 1) / a.plan.chunk;
    if (a.p.candidates.enabled() && threadIdx.x == 0 && w.split < segments) {
      std::int32_t* counts = a.p.candidates.counts + r * a.p.candidates.count_stride;
      counts[kScoreCandidateHeader + w.split] = listed;
      if (w.split == 0) {
        counts[0] = std::int32_t(kScoreCandidateTagLo);
        counts[1] = std::int32_t(kScoreCandidateTagHi);
        counts[2] = a.plan.chunk;
        counts[3] = segments;
      }
    }
  } else {
    const int blocks = a.plan.chunk / a.p.score_block_size;
    const int first = w.base / a.p.score_block_size;
    for (int i = threadIdx.x; i < blocks && first + i < a.plan.score_cols; i += blockDim.x)
      row[first + i] = ordered_value(scratch[i]);
  }
}

inline constexpr int kDecodeMaxHeadDim = 256;

// Final results of one output row of a head: `row` counts the head's q_len x group query rows
// (position-major), c4 is a float4 column; the LSE is stored in base e, as the contract says.
template <class View, class QT>
__device__ __forceinline__ void store_out4(const DecodeLaunch<View, QT>& a, int b, int h, int row, int c4, float4 v) {
  QT* o = a.p.io.out.row(b, row / a.plan.group, h * a.plan.group + row % a.plan.group) + 4 * c4;
  o[0] = from_float<QT>(v.x);
  o[1] = from_float<QT>(v.y);
  o[2] = from_float<QT>(v.z);
  o[3] = from_float<QT>(v.w);
}
template <class View, class QT>
__device__ __forceinline__ void store_out_lse(const DecodeLaunch<View, QT>& a, int b, int h, int row, float lse2) {
  if (a.p.io.lse)
    a.p.io.lse[(std::int64_t(b) * a.p.q_len + row / a.plan.group) * a.p.num_q_heads + h * a.plan.group + row % a.plan.group] =
        lse2 == -INFINITY ? -INFINITY : lse2 * kLn2;
}

// A softmax state in base 2: the maximum, the sum of 2^(lse - m), and the output weighted alike.
struct MergedState {
  float m, l;
  float4 o;
};

// The merged state of N splits' normalised partials `o` and base-2 LSEs `lse2` (-inf: an empty split,
// or a slot past the splits, which weighs nothing), summed in slot order. Both merges use it, so a
// cluster's merge and the merge kernel give the same bits on the same splits.
template <int N>
__device__ __forceinline__ MergedState merge_splits(const float (&lse2)[N], const float4 (&o)[N]) {
  MergedState s{-INFINITY, 0.f, make_float4(0.f, 0.f, 0.f, 0.f)};
  float m = -INFINITY;
#pragma unroll
  for (int q = 0; q < N; ++q) m = fmaxf(m, lse2[q]);
  if (m == -INFINITY) return s;
  s.m = m;
#pragma unroll
  for (int q = 0; q < N; ++q) {
    const float f = lse2[q] == -INFINITY ? 0.f : exp2f(lse2[q] - m);
    s.l += f;
    s.o.x = fmaf(f, o[q].x, s.o.x);
    s.o.y = fmaf(f, o[q].y, s.o.y);
    s.o.z = fmaf(f, o[q].z, s.o.z);
    s.o.w = fmaf(f, o[q].w, s.o.w);
  }
  return s;
}

// Output float4 c4 of row `row` (and, at c4 0, the row's LSE) from its merged state.
template <class View, class QT>
__device__ __forceinline__ void store_merged(const DecodeLaunch<View, QT>& a, int b, int h, int row, int c4, const MergedState& s) {
  const float inv = s.l > 0.f ? 1.f / s.l : 0.f;
  store_out4(a, b, h, row, c4, make_float4(s.o.x * inv, s.o.y * inv, s.o.z * inv, s.o.w * inv));
  if (c4 == 0) store_out_lse(a, b, h, row, s.l > 0.f ? s.m + log2f(s.l) : -INFINITY);
}

// The merge of a head's splits inside their thread-block cluster (DecodePlan::cluster): each block has
// its normalised partial in `part` ([R][D] floats of its shared memory) and its base-2 LSE in `lse2`;
// the cluster's ranks are its splits, in order. Rank c finishes the output float4s c * blockDim.x +
// threadIdx.x, + cluster size * blockDim.x, ... reading every rank's partial through distributed shared
// memory: merge_splits, as decode_merge_kernel with all splits in one part (the same order, so the same
// bits), with no partials written to global memory, no second launch and no wait for the whole grid.
template <int D, class View, class QT>
__device__ void merge_in_cluster(const DecodeLaunch<View, QT>& a, const DecodeWork& w, float* part, float* lse2,
                                 int first_row, int out_rows) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr int kVec = D / 4;
  const cg::cluster_group cluster = cg::this_cluster();
  const int splits = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  cluster.sync();  // every split's partial is written and visible to the cluster
  for (int i = rank * int(blockDim.x) + int(threadIdx.x); i < out_rows * kVec; i += splits * int(blockDim.x)) {
    const int r = i / kVec, c4 = i % kVec;
    float lv[kDecodeMaxClusterSplits];
    float4 po[kDecodeMaxClusterSplits];
#pragma unroll
    for (int q = 0; q < kDecodeMaxClusterSplits; ++q) {
      lv[q] = -INFINITY;
      po[q] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (q < splits) {
        lv[q] = *cluster.map_shared_rank(lse2 + r, q);
        po[q] = *reinterpret_cast<const float4*>(cluster.map_shared_rank(part + r * D + 4 * c4, q));
      }
    }
    store_merged(a, w.b, w.h, first_row + r, c4, merge_splits(lv, po));
  }
  cluster.sync();  // no block leaves while another still reads its shared memory
#else
  // Clusters exist from sm_90 on, and the plan asks for them only there (DeviceFacts::cc_major).
  (void)a, (void)w, (void)part, (void)lse2, (void)first_row, (void)out_rows;
  __trap();
#endif
}

// The block's epilogue, called by every thread once its warps' states are in `s`: s.o holds each
// warp's output scaled by 2^-m, s.m / s.l its row maxima and sums (base 2).
//  1. Merge the warps: per row the base-2 LSE and, in place of s.l, each warp's weight.
//  2. A head with one split writes its final rows. Otherwise the block stores its normalised partial
//     and its LSE for the merge kernel, which runs after this grid has completed (no ordering between
//     the blocks of this grid is needed).
template <int D, int R, class View, class QT>
__device__ void finish_split(const DecodeLaunch<View, QT>& a, const DecodeWork& w, SplitSmem<D, R>& s) {
  constexpr int kVec = D / 4;  // float4 columns per row
  __shared__ float lse2[R];
  __syncthreads();
  if (threadIdx.x < R) {
    const int r = threadIdx.x;
    float m = -INFINITY;
#pragma unroll
    for (int wp = 0; wp < kDecodeWarps; ++wp) m = fmaxf(m, s.m[wp][r]);
    float f[kDecodeWarps], l = 0.f;
#pragma unroll
    for (int wp = 0; wp < kDecodeWarps; ++wp) {
      f[wp] = (m == -INFINITY || s.m[wp][r] == -INFINITY) ? 0.f : exp2f(s.m[wp][r] - m);
      l += s.l[wp][r] * f[wp];
    }
#pragma unroll
    for (int wp = 0; wp < kDecodeWarps; ++wp) s.l[wp][r] = l > 0.f ? f[wp] / l : 0.f;
    lse2[r] = l > 0.f ? m + log2f(l) : -INFINITY;
  }
  __syncthreads();

  const int q_rows = a.p.q_len * a.plan.group;
  const int first_row = w.tile * R;
  const int out_rows = min(R, q_rows - first_row);  // the score row, if in this tile, has no output
  const int splits = w.sparse ? a.plan.sparse_splits : a.plan.retrieval_splits;

  const bool in_cluster = splits > 1 && a.plan.cluster > 1;
  for (int i = threadIdx.x; i < R * kVec; i += blockDim.x) {
    const int r = i / kVec, c4 = i % kVec;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int wp = 0; wp < kDecodeWarps; ++wp) {
      const float f = s.l[wp][r];
      if (f == 0.f) continue;  // an empty warp's s.o may hold nothing meaningful
      const float4 v = *reinterpret_cast<const float4*>(&s.o[wp][r][4 * c4]);
      o.x = fmaf(f, v.x, o.x);
      o.y = fmaf(f, v.y, o.y);
      o.z = fmaf(f, v.z, o.z);
      o.w = fmaf(f, v.w, o.w);
    }
    if (splits == 1) {
      if (r < out_rows) store_out4(a, w.b, w.h, first_row + r, c4, o);
    } else if (in_cluster) {
      // In place: this thread alone reads and writes element (r, 4 c4) of the warps' outputs.
      *reinterpret_cast<float4*>(&s.o[0][r][4 * c4]) = o;
    } else {
      *reinterpret_cast<float4*>(a.partial_out + (w.partial * R + r) * D + 4 * c4) = o;
    }
  }
  if (in_cluster) {
    merge_in_cluster<D>(a, w, &s.o[0][0][0], lse2, first_row, out_rows);
    return;
  }
  if (splits == 1) {
    if (threadIdx.x < out_rows) store_out_lse(a, w.b, w.h, first_row + int(threadIdx.x), lse2[threadIdx.x]);
    return;
  }
  if (threadIdx.x < R) a.partial_lse[w.partial * R + threadIdx.x] = lse2[threadIdx.x];
}

}  // namespace detail
}  // namespace kvsift
