#pragma once
// The register select's path over a row's score candidates (ops/score_candidates.hpp): when the pass
// that wrote the scores also listed the positions at or above the row's threshold, and the list
// holds the budget, one CTA of the row's group selects from the list (a few thousand positions in
// shared memory) while its peers leave; the full search over the row runs otherwise.
//
// Every CTA of the group reads the list's header and segment counts and takes the same decision
// (topk_candidates_suffice); the group barrier after it orders those reads before rank 0 clears the
// header's tag. The decision counts only segments that lie wholly inside the scored region, so the
// list is known to hold `budget` region positions before any position is read (the edge segments'
// positions are read and filtered too, so nothing the full search would select is missed). Rank 0
// then (topk_select_listed):
//  1. copies the list's positions to shared memory, a warp per segment batch, loads in flight together;
//  2. keys each listed region position by its score (the row was just written: L2 reads);
//  3. finds the budget-th key with the register select's list radix (topk_reg_list_kth);
//  4. marks the keys above it, and those equal to it, in two position bitmaps, and writes the
//     selection in position order: the lowest-positioned equal keys the budget still takes, then
//     every marked position at its prefix count;
//  5. writes the row's next threshold (next_candidate_threshold) and clears the tag.

#include <cmath>
#include <cstdint>

#include "kvsift/ops/detail/topk_register_common.cuh"
#include "kvsift/ops/score_candidates.hpp"
#include "kvsift/ops/topk.hpp"

namespace kvsift {
namespace detail {

/// Segment counts a CTA reads: 2048 (a row of 128K positions in the shortest segments, 64 tokens).
inline constexpr int kTopkListedMaxSegments = 2048;

/// Listed positions the register select's dynamic shared memory holds for a row of `cols` positions:
/// a key and a position each, after two position bitmaps of ceil(cols / 32) words.
KVSIFT_HD inline int topk_listed_capacity(std::size_t smem_bytes, int cols) {
  const std::int64_t left = std::int64_t(smem_bytes) - 2 * std::int64_t((cols + 31) / 32) * 4;
  return left > 0 ? int(left / 8 / 4 * 4) : 0;  // a key and a position each, whole 16-byte vectors of keys
}

/// What the header and counts say, the same in every CTA of a group.
struct TopkListed {
  bool usable = false;  ///< the list holds the budget: select from it
  int segment = 0;      ///< positions a segment spans
  int segments = 0;     ///< segments the row's length covers
  int total = 0;        ///< listed positions in those segments
};

/// This thread's share of the header and counts, loaded with the row's first loads (the length is
/// not known yet): thread t holds the counts of segments [t m, t m + m), m = 2048 / kThreads.
template <int kThreads>
struct TopkListedLoad {
  static constexpr int kPer = kTopkListedMaxSegments / kThreads;
  int4 header;
  int4 counts[kPer / 4];

  // The count of this thread's i-th segment (segment t kPer + i) of `segment` positions, clamped to
  // what its span of a row of `len` can hold (a count is never trusted further); 0 from `segments` on.
  __device__ __forceinline__ int count(int i, int segments, int segment, int len) const {
    const int j = int(threadIdx.x) * kPer + i;
    const int4 q = counts[i / 4];
    const int raw = i % 4 == 0 ? q.x : i % 4 == 1 ? q.y : i % 4 == 2 ? q.z : q.w;
    const int span = min(segment, len - j * segment);
    return j < segments ? min(max(raw, 0), max(span, 0)) : 0;
  }
};

template <int kThreads>
__device__ __forceinline__ TopkListedLoad<kThreads> topk_listed_load(const ScoreCandidates& c, std::int64_t row) {
  TopkListedLoad<kThreads> l;
  const std::int32_t* counts = c.counts + row * c.count_stride;
  l.header = *reinterpret_cast<const int4*>(counts);
#pragma unroll
  for (int q = 0; q < TopkListedLoad<kThreads>::kPer / 4; ++q) {
    const int first = kScoreCandidateHeader + (int(threadIdx.x) * (TopkListedLoad<kThreads>::kPer / 4) + q) * 4;
    l.counts[q] = first + 4 <= c.count_stride ? *reinterpret_cast<const int4*>(counts + first) : make_int4(0, 0, 0, 0);
  }
  return l;
}

/// The decision, identical in every CTA (the same memory, read before anyone writes it). Holds block
/// barriers; s_sum holds two ints a warp.
template <int kThreads>
__device__ __forceinline__ TopkListed topk_candidates_suffice(const TopkListedLoad<kThreads>& l, const ScoreCandidates& c,
                                                              const TopKRowPlan& plan, int capacity, int* s_sum) {
  constexpr int kPer = TopkListedLoad<kThreads>::kPer;
  TopkListed d;
  const int segment = l.header.z;
  const bool tagged = std::uint32_t(l.header.x) == kScoreCandidateTagLo && std::uint32_t(l.header.y) == kScoreCandidateTagHi;
  if (!tagged || segment < 1) return d;  // uniform: the same header everywhere
  const int segments = (plan.len + segment - 1) / segment;
  if (segments > l.header.w || segments > c.count_stride - kScoreCandidateHeader || segments > kTopkListedMaxSegments)
    return d;
  int all = 0, inner = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = int(threadIdx.x) * kPer + i;
    const int n = l.count(i, segments, segment, plan.len);
    all += n;
    // Wholly inside the scored region: every listed position there is a region position.
    inner += (j * segment >= plan.sink_end && (j + 1) * segment <= plan.recent_begin) ? n : 0;
  }
  all = __reduce_add_sync(0xffffffffu, all);
  inner = __reduce_add_sync(0xffffffffu, inner);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (lane == 0) {
    s_sum[2 * warp] = all;
    s_sum[2 * warp + 1] = inner;
  }
  __syncthreads();
  all = 0;
  inner = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) {
    all += s_sum[2 * w];
    inner += s_sum[2 * w + 1];
  }
  __syncthreads();  // s_sum is free again
  d.segment = segment;
  d.segments = segments;
  d.total = all;
  d.usable = all <= capacity && inner >= plan.budget;
  return d;
}

/// What the selection from a list found: the budget-th key, and the listed region positions.
struct TopkListedKth {
  std::uint32_t kth;
  int listed;
};

/// The row's next threshold from a search that found key `kth` (a ScoreKey<float> key) with `listed`
/// region positions at or above the threshold `used`, and the list marked used. One thread calls it.
__device__ __forceinline__ void topk_candidates_next(const ScoreCandidates& c, std::int64_t row, std::uint32_t kth,
                                                     float used, int listed, int budget) {
  c.thresholds[row] = next_candidate_threshold(float_order_threshold(kth), used, listed, budget);
  c.counts[row * c.count_stride] = 0;  // the tag's low half: this list is never read again
}

/// Rank 0's selection from the list (see the file comment); every thread of the CTA calls it.
/// `row_positions` is the row's list (the scores' row stride), `smem` the register select's dynamic
/// shared memory (`capacity` keys, then `capacity` positions, then two bitmaps of ceil(cols / 32)
/// words), `hist` its three zeroed histograms, `s_count` one int.
template <int kThreads, class T, class Key, class Emit>
__device__ __forceinline__ TopkListedKth topk_select_listed(const TopkListedLoad<kThreads>& l, const TopkListed& d,
                                                   const std::int32_t* row_positions, std::int64_t row,
                                                   const T* row_scores, const Key& key, const TopKRowPlan& plan,
                                                   int cols, int capacity, unsigned char* smem,
                                                   int (*hist)[kTopkRegHistStride], int* s_scan, TopkRankHit* s_hit,
                                                   int* s_count, Emit&& emit) {
  using K = typename Key::key_type;
  static_assert(sizeof(K) == 4, "32-bit keys");
  constexpr int kPer = TopkListedLoad<kThreads>::kPer;
  constexpr int kWarps = kThreads / 32;
  constexpr K kSentinel = ~K(0);  // above every key a float has (ScoreKey<float>'s largest is 0xff800000)
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  K* const keys = reinterpret_cast<K*>(smem);
  std::int32_t* const positions = reinterpret_cast<std::int32_t*>(smem + std::size_t(capacity) * sizeof(K));
  std::uint32_t* const gt_bits = reinterpret_cast<std::uint32_t*>(smem + std::size_t(capacity) * 8);
  const int words = (cols + 31) / 32;
  std::uint32_t* const eq_bits = gt_bits + words;
  // The segments' first offsets in the copy and their counts, in histograms 1 and 2 until the copy
  // is done (they are zeroed again before the radix).
  int* const seg_first = hist[1];
  int* const seg_count = hist[2];
  static_assert(kTopkListedMaxSegments <= kTopkRegHistStride, "a histogram holds an int per segment");
  for (int i = tid; i < 2 * words; i += kThreads) gt_bits[i] = 0u;
  if (tid == 0) *s_count = 0;

  // ---- 1. offsets, then the copy of the positions ----
  {
    int n[kPer], sum = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      n[i] = l.count(i, d.segments, d.segment, plan.len);
      sum += n[i];
    }
    int unused = 0;
    int first = topk_reg_scan<kThreads>(sum, s_scan, &unused);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = tid * kPer + i;
      if (j < d.segments) {
        seg_first[j] = first;
        seg_count[j] = n[i];
      }
      first += n[i];
    }
  }
  __syncthreads();
  {
    // Warp w copies segments w, w + kWarps, ...: the first 64 entries of eight segments a round, all
    // loads issued before the first store (a segment holds about k / segments entries, a few dozen);
    // longer segments finish in a loop of their own.
    constexpr int kBatch = 8;
#pragma unroll 1
    for (int j0 = warp; j0 < d.segments; j0 += kWarps * kBatch) {
      int got[kBatch][2];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int j = j0 + b * kWarps;
        const int n = j < d.segments ? seg_count[j] : 0;
        const std::int32_t* src = row_positions + std::int64_t(j) * d.segment;
#pragma unroll
        for (int e = 0; e < 2; ++e) got[b][e] = lane + 32 * e < n ? src[lane + 32 * e] : 0;
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int j = j0 + b * kWarps;
        const int n = j < d.segments ? seg_count[j] : 0;
        const int at = j < d.segments ? seg_first[j] : 0;
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (lane + 32 * e < n) positions[at + lane + 32 * e] = got[b][e];
        // Rolled: unrolled inside the batch this tail, which few segments have, was 1,255 instructions
        // (17 KB of code) and took the 16-key instantiations from 100-106 registers to 127-128.
#pragma unroll 1
        for (int i = 64 + lane; i < n; i += 32) positions[at + i] = row_positions[std::int64_t(j) * d.segment + i];
      }
    }
  }
  __syncthreads();
  {
    int4* const h4 = reinterpret_cast<int4*>(&hist[1][0]);  // the radix's histograms start zeroed
    for (int b = tid; b < 2 * kTopkRegHistStride / 4; b += kThreads) h4[b] = make_int4(0, 0, 0, 0);
  }

  // ---- 2. keys: a region position's score key; anything else (a position a list cannot hold) is
  // padding, above every key the radix counts ----
  const int vectors = (d.total + 3) / 4;
  int region = 0;
  {
    constexpr int kLoads = 8;  // scores in flight per thread
#pragma unroll 1
    for (int f0 = 0; f0 < 4 * vectors; f0 += kThreads * kLoads) {
      int pos[kLoads];
      T score[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int f = f0 + u * kThreads + tid;
        const int p = f < d.total ? positions[f] : -1;
        pos[u] = p >= plan.sink_end && p < plan.recent_begin ? p : -1;
        score[u] = pos[u] >= 0 ? row_scores[pos[u]] : T{};
      }
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int f = f0 + u * kThreads + tid;
        if (f < 4 * vectors) keys[f] = pos[u] >= 0 ? key(score[u], row, pos[u]) : kSentinel;
        region += pos[u] >= 0;
      }
    }
  }
  region = __reduce_add_sync(0xffffffffu, region);
  if (lane == 0) atomicAdd(s_count, region);
  __syncthreads();
  region = *s_count;

  // ---- 3. the budget-th key ----
  int gt_listed = 0;
  const K kth = topk_reg_list_kth<kThreads>(reinterpret_cast<const uint4*>(keys), vectors, K(0), K(kSentinel - 1),
                                            plan.budget, hist, s_scan, s_hit, &gt_listed);
  const int ties = plan.budget - gt_listed;  // keys equal to kth the budget takes, lowest positions first

  // ---- 4. the bitmaps, then the selection in position order ----
  for (int f = tid; f < d.total; f += kThreads) {
    const K k = keys[f];
    if (k != kSentinel && k >= kth) {
      const int p = positions[f];
      atomicOr(&(k > kth ? gt_bits : eq_bits)[p >> 5], 1u << (p & 31));
    }
  }
  __syncthreads();
  {
    // Thread t owns words [t m, t m + m): the equal keys first (the lowest `ties` of them are taken),
    // then every taken position at its prefix.
    const int per = (words + kThreads - 1) / kThreads;
    const int w0 = tid * per, w1 = min(w0 + per, words);
    int eq = 0;
    for (int w = w0; w < w1; ++w) eq += __popc(eq_bits[w]);
    int unused = 0;
    int eq_before = topk_reg_scan<kThreads>(eq, s_scan, &unused);
    int taken = 0;
    for (int w = w0; w < w1; ++w) {
      std::uint32_t e = eq_bits[w];
      while (e != 0u && eq_before < ties) {  // the lowest bits first
        gt_bits[w] |= e & (~e + 1u);
        e &= e - 1u;
        ++eq_before;
      }
      taken += __popc(gt_bits[w]);
    }
    __syncthreads();  // s_scan is free again
    int at = plan.sink_end + topk_reg_scan<kThreads>(taken, s_scan, &unused);
    for (int w = w0; w < w1; ++w) {
      std::uint32_t b = gt_bits[w];
      while (b != 0u) {
        emit(at++, w * 32 + __ffs(int(b)) - 1);
        b &= b - 1u;
      }
    }
  }
  return TopkListedKth{std::uint32_t(kth), region};
}

}  // namespace detail
}  // namespace kvsift
