#pragma once
// What the two register kernels of cuda::topk share (ops/detail/topk_register_select.cuh for a few
// long rows, ops/detail/topk_short_row_select.cuh for rows of up to 4096 positions): CTAs of 256 or
// 512 threads whose keys sit in registers, every warp owning a contiguous run of positions; block scans over
// 2048-bin histograms that find where a rank falls; and the ordered output, which places the keys
// above the k-th key and the lowest-positioned keys equal to it with ballot prefix sums.

#include <cstdint>
#include <cstring>

#include "kvsift/ops/detail/topk_bracket.hpp"
#include "kvsift/ops/topk.hpp"
#include "kvsift/ops/topk_plan.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kTopkRegWarps = kTopkRegThreads / 32;
inline constexpr int kTopkRegBins = 2048;                 // 11-bit digits
inline constexpr int kTopkRegHistStride = kTopkRegBins + 4;  // + a bin that takes masked-off atomics
// The helpers below take the CTA size as a template argument (kTopkRegThreads by default, the
// short-row select's): 256 or 512 threads (kTopkRegWideThreads), 8 or 4 of a histogram's bins a thread.
template <int kThreads>
inline constexpr bool kTopkRegCtaSize = kThreads == kTopkRegThreads || kThreads == kTopkRegWideThreads;

// Where a 1-based descending rank falls in a histogram: its bin and the count in the bins above it.
struct TopkRankHit {
  int bin;
  int above;
};

// Inclusive sum over the warp's lanes, in lane order.
__device__ __forceinline__ int topk_reg_warp_scan(int v) {
  const int lane = int(threadIdx.x) % 32;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int u = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += u;
  }
  return v;
}

// Exclusive sum over the block in thread order, and the block's total (warp shuffles, one barrier;
// `scratch` holds kThreads / 32 ints, 16-byte aligned, and is free again after the next barrier).
template <int kThreads = kTopkRegThreads>
__device__ __forceinline__ int topk_reg_scan(int v, int* scratch, int* total) {
  static_assert(kTopkRegCtaSize<kThreads>, "256 or 512 threads");
  constexpr int kWarps = kThreads / 32;
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int incl = topk_reg_warp_scan(v);
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  int w[kWarps];  // the warps' sums as broadcast 16-byte reads, all issued before the first use
#pragma unroll
  for (int q = 0; q < kWarps / 4; ++q) {
    const int4 w4 = reinterpret_cast<const int4*>(scratch)[q];
    w[4 * q] = w4.x, w[4 * q + 1] = w4.y, w[4 * q + 2] = w4.z, w[4 * q + 3] = w4.w;
  }
  int before = incl - v, all = 0;
#pragma unroll
  for (int i = 0; i < kWarps; ++i) {
    before += i < warp ? w[i] : 0;
    all += w[i];
  }
  *total = all;
  return before;
}

// Finds, in descending bin order, the bin of rank ra (1-based) in histogram ha and of rank rb in hb
// (2048 bins each; hb null: ha again), both counts packed in one int (every total stays below 2^16).
// `ranks(total_a)` gives (ra, rb) once the first histogram's total is known; a rank outside [1, total]
// leaves its hit as it was. Thread t scans the 2048 / kThreads bins just below bin 2048 - t * that
// (one or two 16-byte reads a histogram). Ends with a barrier.
template <int kThreads = kTopkRegThreads, class Ranks>
__device__ __forceinline__ void topk_reg_find(const int* ha, const int* hb, Ranks&& ranks, int* scratch,
                                              TopkRankHit* hits) {
  constexpr int kPer = kTopkRegBins / kThreads;
  const int base = kTopkRegBins - kPer * (int(threadIdx.x) + 1);
  static_assert(kTopkRegCtaSize<kThreads>, "256 or 512 threads");
  int4 a4[kPer / 4], b4[kPer / 4];  // ascending bins base .. base + kPer - 1; ha's reads first
#pragma unroll
  for (int q = 0; q < kPer / 4; ++q) a4[q] = reinterpret_cast<const int4*>(ha + base)[q];
#pragma unroll
  for (int q = 0; q < kPer / 4; ++q) b4[q] = hb ? reinterpret_cast<const int4*>(hb + base)[q] : a4[q];
  int a[kPer], b[kPer];
#pragma unroll
  for (int q = 0; q < kPer / 4; ++q) {
    a[4 * q] = a4[q].x, a[4 * q + 1] = a4[q].y, a[4 * q + 2] = a4[q].z, a[4 * q + 3] = a4[q].w;
    b[4 * q] = b4[q].x, b[4 * q + 1] = b4[q].y, b[4 * q + 2] = b4[q].z, b[4 * q + 3] = b4[q].w;
  }
  int c[kPer], sum = 0;  // descending: index j is bin base + kPer - 1 - j
#pragma unroll
  for (int j = 0; j < kPer; ++j) c[j] = a[kPer - 1 - j] | b[kPer - 1 - j] << 16;
#pragma unroll
  for (int j = 0; j < kPer; ++j) sum += c[j];
  int total = 0;
  int p = topk_reg_scan<kThreads>(sum, scratch, &total);
  const int2 r = ranks(total & 0xffff);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int pa = p & 0xffff, pb = p >> 16, ca = c[j] & 0xffff, cb = c[j] >> 16;
    if (pa < r.x && pa + ca >= r.x) hits[0] = TopkRankHit{base + kPer - 1 - j, pa};
    if (pb < r.y && pb + cb >= r.y) hits[1] = TopkRankHit{base + kPer - 1 - j, pb};
    p += c[j];
  }
  __syncthreads();
}

// The key of rank r (1-based, descending) among the keys of `list` (`vectors` 16-byte vectors of
// 32-bit keys) that lie in [bottom, top]; others (the padding above top) are never counted. 11-bit
// digits of the keys relative to bottom, one zeroed histogram of `hist` a round (three: 32 bits take
// three rounds), block barriers only. *gt counts the list's keys in [bottom, top] above the result.
// Used by the register select on the copy of its group's lists and on a row's score candidates.
template <int kThreads, class K>
__device__ __forceinline__ K topk_reg_list_kth(const uint4* list, int vectors, K bottom, K top, int r,
                                               int (*hist)[kTopkRegHistStride], int* s_scan, TopkRankHit* s_hit,
                                               int* gt) {
  static_assert(sizeof(K) == 4, "32-bit keys");
  const int tid = int(threadIdx.x);
  K prefix = 0;
  int hi = topk_bit_width(K(top - bottom));  // bits above hi are known (prefix)
  int above = 0;
  int buffer = 0;
  while (hi > 0) {  // uniform: hi and the hits are the same in every thread
    const int shift = hi > 11 ? hi - 11 : 0;
    const int mask = (1 << (hi - shift)) - 1;
    int* h = hist[buffer];
#pragma unroll 1
    for (int v = tid; v < vectors; v += kThreads) {
      const uint4 q = list[v];
      const K k4[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const K rel = k4[e] - bottom;
        const bool match = k4[e] <= top && (hi >= 32 ? K(0) : rel >> hi) == prefix;
        atomicAdd(&h[match ? int(rel >> shift) & mask : kTopkRegBins], 1);
      }
    }
    if (tid == 0) s_hit[0] = TopkRankHit{-1, 0};
    __syncthreads();
    topk_reg_find<kThreads>(h, nullptr, [&](int) { return make_int2(r, 0); }, s_scan, s_hit);
    const TopkRankHit found = s_hit[0];
    prefix = (prefix << (hi - shift)) | K(found.bin);
    r -= found.above;
    above += found.above;
    hi = shift;
    buffer = buffer == 2 ? 0 : buffer + 1;
    __syncthreads();  // s_hit is read by everyone before the next round writes it
  }
  *gt = above;
  return bottom + prefix;
}

// Exclusive prefix over the warp's lanes of a count c in [0, 2^kBits) (kBits ballots, no shuffles).
template <int kBits>
__device__ __forceinline__ int topk_reg_lane_prefix(int c, unsigned lanes_below) {
  int p = 0;
#pragma unroll
  for (int b = 0; b < kBits; ++b) p += __popc(__ballot_sync(0xffffffffu, (c >> b) & 1) & lanes_below) << b;
  return p;
}

// 16 bytes of scores from position p0 (16 / sizeof(T) of them); zeros past the columns. One vector
// load where every row starts 16-byte aligned and the vector lies inside the columns, else scalars.
template <class T>
__device__ __forceinline__ uint4 topk_reg_load_vector(const T* row_scores, int cols, bool vector_loads, int p0) {
  constexpr int kPerVector = 16 / int(sizeof(T));
  if (vector_loads && p0 + kPerVector <= cols) return __ldg(reinterpret_cast<const uint4*>(row_scores + p0));
  T e[kPerVector];
#pragma unroll
  for (int i = 0; i < kPerVector; ++i) e[i] = p0 + i < cols ? row_scores[p0 + i] : T{};
  uint4 v;
  memcpy(&v, e, 16);
  return v;
}

// The position of this lane's key i in the warp run that starts at run_lo: vector j of the run is
// 32 lanes' 16-byte vectors side by side, so every load of a warp reads 512 contiguous bytes.
template <int kPerVector>
__device__ __forceinline__ int topk_reg_position(int run_lo, int i) {
  return run_lo + ((i / kPerVector) * 32 + int(threadIdx.x) % 32) * kPerVector + i % kPerVector;
}

// Bit i set where this lane's key i lies in the scored region [plan.sink_end, plan.recent_begin):
// per 16-byte vector, the run of its keys inside the region from two clamps (every key's own two
// compares, and the bit set under a predicate, cost 3-4 instructions a key).
template <int kKeys, int kPerVector>
__device__ __forceinline__ std::uint32_t topk_reg_valid_mask(const TopKRowPlan& plan, int run_lo) {
  std::uint32_t valid = 0;
#pragma unroll
  for (int j = 0; j < kKeys / kPerVector; ++j) {
    const int p0 = topk_reg_position<kPerVector>(run_lo, j * kPerVector);
    const int lo = min(max(plan.sink_end - p0, 0), kPerVector), hi = min(max(plan.recent_begin - p0, 0), kPerVector);
    valid |= (((1u << hi) - 1u) & ~((1u << lo) - 1u)) << (j * kPerVector);
  }
  return valid;
}

// This lane's kKeys keys from its loaded vectors, computed once (a key policy may read memory of its
// own, such as ClusterAttn's flags, so only positions inside the scored region are keyed); bit i of
// the result says key i lies in the scored region [plan.sink_end, plan.recent_begin) (key 0
// otherwise).
template <int kKeys, class T, class Key>
__device__ __forceinline__ std::uint32_t topk_reg_keys(const Key& key, std::int64_t row, const TopKRowPlan& plan,
                                                       const uint4* raw, int run_lo,
                                                       typename Key::key_type (&keys)[kKeys]) {
  constexpr int kPerVector = 16 / int(sizeof(T));
  const std::uint32_t valid = topk_reg_valid_mask<kKeys, kPerVector>(plan, run_lo);
#pragma unroll
  for (int i = 0; i < kKeys; ++i) {
    const int pos = topk_reg_position<kPerVector>(run_lo, i);
    keys[i] = valid >> i & 1 ? key(reinterpret_cast<const T*>(&raw[i / kPerVector])[i % kPerVector], row, pos)
                             : typename Key::key_type(0);
  }
  return valid;
}

// Bit i set where key i compares true: each key one compare and one predicated bit, no chain of
// counts (a running count's add under a predicate makes every key wait for the one before).
template <int kKeys, class K, class Pred>
__device__ __forceinline__ std::uint32_t topk_reg_key_mask(const K (&keys)[kKeys], Pred&& pred) {
  std::uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < kKeys; ++i) m |= std::uint32_t(pred(keys[i])) << i;
  return m;
}

// A budget that takes the whole scored region: every position of this lane's run inside it, at its
// own offset (the output is the region in order).
template <int kKeys, int kPerVector, class Emit>
__device__ __forceinline__ void topk_reg_emit_region(const TopKRowPlan& plan, int run_lo, Emit&& emit) {
#pragma unroll
  for (int i = 0; i < kKeys; ++i) {
    const int pos = topk_reg_position<kPerVector>(run_lo, i);
    if (pos >= plan.sink_end && pos < plan.recent_begin) emit(pos, pos);
  }
}

// Writes this CTA's part of a row's selection in ascending position order. The CTA's keys are kKeys
// a thread (bit i of `valid`: key i lies in the scored region); warp w owns positions
// [run_lo, run_lo + 32 kKeys) of the CTA (run_lo is the warp's), key i of a lane sitting at
// run_lo + ((i / kPerVector) * 32 + lane) * kPerVector + i % kPerVector. `kth` is the row's k-th key,
// `ties` how many keys equal to it the row takes (the lowest-positioned), `gt_lower` / `eq_lower` the
// keys above / equal to kth at lower positions in other CTAs of the row, `first` the output offset of
// the row's first selected key (after the forced sink). emit(offset, position) writes one entry.
// Holds one block barrier; s_warp_gt / s_warp_eq hold kThreads / 32 ints each.
template <int kKeys, int kPerVector, int kThreads = kTopkRegThreads, class K, class Mask, class Emit>
__device__ __forceinline__ void topk_reg_write_ordered(const K (&keys)[kKeys], Mask valid, K kth, int ties,
                                                       int gt_lower, int eq_lower, int first, int run_lo,
                                                       int* s_warp_gt, int* s_warp_eq, Emit&& emit) {
  constexpr int kVectors = kKeys / kPerVector;
  constexpr int kCountBits = kPerVector == 8 ? 4 : 3;  // bits of a count of one vector's keys
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const unsigned lanes_below = (1u << lane) - 1u;
  const int ties_here = ties - eq_lower;  // equal keys this CTA may still take (<= 0: none)
  const Mask gt_bits = Mask(topk_reg_key_mask(keys, [&](K x) { return x > kth; })) & valid;
  const Mask eq_bits = Mask(topk_reg_key_mask(keys, [&](K x) { return x == kth; })) & valid;
  {
    const int gt = __reduce_add_sync(0xffffffffu, __popc(gt_bits));
    const int eq = __reduce_add_sync(0xffffffffu, __popc(eq_bits));
    if (lane == 0) {
      s_warp_gt[warp] = gt;
      s_warp_eq[warp] = eq;
    }
  }
  __syncthreads();
  int gt_before = 0, eq_before = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) {
    gt_before += w < warp ? s_warp_gt[w] : 0;
    eq_before += w < warp ? s_warp_eq[w] : 0;
  }
  const int taken_lower = eq_lower < ties ? eq_lower : ties;
  const int taken_before = eq_before < ties_here ? eq_before : (ties_here > 0 ? ties_here : 0);
  int eq_run = eq_before;  // equal keys at lower positions in this CTA
  int out_run = first + gt_lower + taken_lower + gt_before + taken_before;
  constexpr std::uint32_t kVectorMask = (1u << kPerVector) - 1u;
#pragma unroll 1
  for (int j = 0; j < kVectors; ++j) {  // rolled: a short loop body stays in the instruction cache
    const std::uint32_t gt = std::uint32_t(gt_bits >> (j * kPerVector)) & kVectorMask;
    const std::uint32_t eq = std::uint32_t(eq_bits >> (j * kPerVector)) & kVectorMask;
    std::uint32_t sel = gt;
    if (__any_sync(0xffffffffu, eq != 0)) {  // ties in this vector round: take the lowest positions
      int q = eq_run + topk_reg_lane_prefix<kCountBits>(__popc(eq), lanes_below);
#pragma unroll
      for (int e = 0; e < kPerVector; ++e)
        if (eq >> e & 1) sel |= std::uint32_t(q++ < ties_here) << e;
      eq_run += __reduce_add_sync(0xffffffffu, __popc(eq));
    }
    int o = out_run + topk_reg_lane_prefix<kCountBits>(__popc(sel), lanes_below);
    const int p0 = run_lo + (j * 32 + lane) * kPerVector;
#pragma unroll
    for (int e = 0; e < kPerVector; ++e)
      if (sel >> e & 1) emit(o++, p0 + e);
    out_run += __reduce_add_sync(0xffffffffu, __popc(sel));
  }
}

}  // namespace detail
}  // namespace kvsift
