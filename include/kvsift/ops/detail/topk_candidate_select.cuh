#pragma once
// The candidate radix select behind cuda::topk (contract in ops/topk.hpp, plan in ops/topk_plan.hpp,
// design and latency estimate in docs/ops/topk.md, section "The candidate select").
//
// Same CTA groups as the radix select (topk_radix_select.cuh): one row per group of `ctas_per_row`
// CTAs, a hardware thread-block cluster on sm_90, CTA c owning the slice [c * slice, (c + 1) * slice).
// What differs is the length of the serial chain inside each CTA, which is what the radix select's
// time was made of (docs/performance.md):
//
// 1. The slice's score loads are issued before the row's length and budget arrive (both are loads
//    too), so the two DRAM round trips overlap; nothing outside [0, len) is ever used.
// 2. While the loaded scores are turned into keys and stored in shared memory, the top 11 bits are
//    histogrammed (pass 0). One barrier pair per pass finds the digit holding the budget-th key.
// 3. One sweep over the slice compacts the keys of that digit (the candidates, a few percent of a
//    typical row) into a short list of 16-bit offsets and histograms their next digit (pass 1).
//    Later passes read only the list. Keys above the digit are selected, keys below are not: they
//    are never looked at again until the output.
// 4. Each digit search also counts, from the peers' histograms it already read, how many keys above
//    the threshold and equal to it sit in lower-ranked CTAs. So the output offsets need no extra
//    exchange between CTAs: one count sweep, one barrier and one emit sweep write the row in order.
//
// Per pass: one group barrier (the histogram is complete), one DSMEM read of every peer's bins
// (all issued before any is summed), one block scan, one barrier to broadcast the digit. The two
// histograms ping-pong: pass p + 2 reuses pass p's buffer, which every peer finished reading before
// it arrived at the barrier of pass p + 1. A CTA leaves only after every peer has read its last
// histogram (a split cluster barrier: arrive after the last read, wait before exit).

#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "kvsift/core/dependent_launch.cuh"
#include "kvsift/ops/detail/topk_bracket.hpp"
#include "kvsift/ops/detail/topk_radix_select.cuh"
#include "kvsift/ops/topk.hpp"
#include "kvsift/ops/topk_plan.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kTopkCandDigitBits = 11;  // 2048 bins: 3 passes over 32-bit keys (11 + 11 + 10)
inline constexpr int kTopkCandBins = 1 << kTopkCandDigitBits;
inline constexpr int kTopkCandBatch = 8;       // shared-memory keys loaded per thread before any is used
static_assert(kTopkCandBins == 2048, "the plan's shared-memory estimate assumes 2048 bins");

// Largest CTA group a configuration is launched with: the 256-thread configuration serves short rows
// with one CTA per row only (the plan guarantees it), so its peer loop is not unrolled eight times.
template <int Threads>
inline constexpr int kTopkCandMaxGroup = Threads >= 512 ? kTopkMaxCtasPerRow : 1;

// Sum over the warp (one redux instruction from sm_80, a shuffle tree before).
__device__ __forceinline__ int topk_warp_sum(int v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_add_sync(0xffffffffu, v);
#else
  for (int d = 16; d > 0; d /= 2) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
#endif
}

template <class T, class Key, int Threads>
__global__ void __launch_bounds__(Threads, 2048 / Threads / 2)
    topk_candidate_select_kernel(StridedView2D<const T> scores, TopKParams params, IndexSet out, T* values, Key key,
                                 TopkPlan launch_plan) {
  static_assert(sizeof(scores) <= 128 && sizeof(params) <= 128 && sizeof(out) <= 128 && sizeof(key) <= 128 &&
                    sizeof(launch_plan) <= 128,
                "each kernel parameter stays under 128 bytes (see TopkLaunch)");
  wait_for_primary_grid();  // Exec::dependent_launch: the scores and row limits are earlier kernels' output
  using K = typename Key::key_type;
  constexpr int kWarps = Threads / 32;
  constexpr int kBinsPerThread = kTopkCandBins / Threads;
  constexpr int kVecPerThread = kBinsPerThread / 4;
  constexpr int kMaxGroup = kTopkCandMaxGroup<Threads>;
  constexpr int kPasses = (Key::kBits + kTopkCandDigitBits - 1) / kTopkCandDigitBits;
  constexpr int kPerVector = 16 / int(sizeof(T));
  constexpr int kPreloads = 8;  // 16-byte loads per thread issued before the row's length is known
  static_assert(kBinsPerThread % 4 == 0 && kWarps <= 32, "bins are read as int4; warp counts fit one warp");
  // Warp scans: one barrier per scan and a few hundred bytes of storage (raking needs two and ~2 KiB).
  using BlockScan = cub::BlockScan<int, Threads, cub::BLOCK_SCAN_WARP_SCANS>;

  const TopkLaunch<T, Key> a{scores, params, out, values, key, launch_plan};
  extern __shared__ __align__(16) unsigned char topk_dynamic_smem[];
  K* keys = reinterpret_cast<K*>(topk_dynamic_smem);
  // slice is a multiple of 8, so the list starts 16-byte aligned after the keys.
  std::uint16_t* cand = reinterpret_cast<std::uint16_t*>(topk_dynamic_smem + std::size_t(a.plan.slice) * sizeof(K));
  __shared__ __align__(16) int hist[2][kTopkCandBins];
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ int s_digit, s_above, s_eq_lower, s_cand_count;
  __shared__ int s_warp_gt[kWarps], s_warp_eq[kWarps], s_warp_lower[kWarps];
  // The sampled bracket (topk_bracket.hpp): its two ends, this CTA's count of keys above it (read by
  // the peers after the second group barrier and never written again) and the lower ranks' counts.
  __shared__ K s_bracket_top, s_bracket_bottom, s_warp_min[kWarps], s_warp_max[kWarps];
  __shared__ int s_bracket_above, s_gt_lower_sum, s_eq_lower_sum;

  const TopkCtaGroup group{a.plan.ctas_per_row};
  const int group_size = a.plan.ctas_per_row;
  const int rank = int(blockIdx.x) % group_size;
  // The launch covers the rows the filter writes only (topk_written_row).
  const std::int64_t row = topk_written_row(a.params, blockIdx.x / group_size);
  const int tid = int(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const unsigned lanes_below = (1u << lane) - 1u;
  const T* row_scores = a.scores.data + row * a.scores.row_stride;
  std::int32_t* row_out = a.out.indices + row * a.out.row_stride;
  T* row_values = a.values ? a.values + row * a.out.row_stride : nullptr;

  // The length and budget loads go first, then the slice's score loads, all before any of them is
  // used: the slice is clipped to the view's columns (always readable), not to the length.
  const int len_raw = a.params.lengths ? a.params.lengths[row] : a.plan.cols;
  const int k_raw = a.params.per_row_k ? a.params.per_row_k[row] : a.params.k;
  const int slice_lo = rank * a.plan.slice;
  const int slice_cols_hi = slice_lo + a.plan.slice < a.plan.cols ? slice_lo + a.plan.slice : a.plan.cols;
  const uint4* vectors = reinterpret_cast<const uint4*>(row_scores);
  const int first_vector = slice_lo / kPerVector;  // exact: slice_lo is a multiple of 8
  const int end_vector = a.plan.vector_loads && slice_cols_hi > slice_lo ? slice_cols_hi / kPerVector : first_vector;
  uint4 pre[kPreloads];
#pragma unroll
  for (int u = 0; u < kPreloads; ++u) {
    const int v = first_vector + u * Threads + tid;
    pre[u] = v < end_vector ? __ldg(vectors + v) : make_uint4(0u, 0u, 0u, 0u);
  }
  for (int b = tid; b < 2 * kTopkCandBins; b += Threads) (&hist[0][0])[b] = 0;
  if (tid == 0) {
    s_cand_count = 0;
    s_bracket_above = 0;
    s_gt_lower_sum = 0;
    s_eq_lower_sum = 0;
  }

  const TopKRowPlan plan = plan_topk_row(a.plan.cols, len_raw, k_raw, a.out.capacity, a.params.sink, a.params.recent);
  auto emit = [&](int offset, int position) {
    row_out[offset] = position;
    if (row_values) row_values[offset] = row_scores[position];
  };
  topk_write_forced(plan, rank * Threads + tid, group_size * Threads, rank == 0 && tid == 0, a.out.counts + row, emit);

  const int lo = slice_lo > plan.sink_end ? slice_lo : plan.sink_end;
  const int hi_raw = slice_lo + a.plan.slice < plan.recent_begin ? slice_lo + a.plan.slice : plan.recent_begin;
  const int hi = hi_raw > lo ? hi_raw : lo;
  // Same decision in every CTA of the group (it depends on the row only), before any group barrier.
  if (plan.budget == 0) return;
  if (plan.budget == plan.region()) {
    for (int i = lo + tid; i < hi; i += Threads) emit(i, i);
    return;
  }
  __syncthreads();  // the zeroed histograms and list counter, before the first atomics

  // ---- the sampled bracket's first half, while the slice's loads are in flight ----
  constexpr K kKeyMax = Key::kBits >= int(8 * sizeof(K)) ? ~K(0) : (K(1) << Key::kBits) - 1;
  // Same decision in every CTA of the group (the plan's, for the whole launch).
  const bool bracket = kMaxGroup > 1 && group_size > 1 && a.plan.bracket_capacity > 0;
  // This CTA's sample is published in hist[1], unused until the digit searches (if they run at all).
  K* const sample_keys = reinterpret_cast<K*>(&hist[1][0]);
  constexpr int kSampleCapacity = int(sizeof(hist[1]) / sizeof(K));
  K bracket_top = kKeyMax, bracket_bottom = 0;  // the bracket: keys in [bottom, top] are listed
  TopkBracketSample sample;
  if (bracket) {
    constexpr int kSamplesPerThread = kSampleCapacity / Threads;
    static_assert(kSamplesPerThread >= 1 && kSampleCapacity % Threads == 0, "whole samples per thread");
    sample = topk_bracket_sample(plan, kSampleCapacity);
    const int mine_from = sample.first_at(lo), mine_to = sample.first_at(hi);
    T sampled[kSamplesPerThread];
#pragma unroll
    for (int i = 0; i < kSamplesPerThread; ++i) {
      const int j = mine_from + i * Threads + tid;
      sampled[i] = j < mine_to ? row_scores[sample.first + j * sample.stride] : T{};
    }
#pragma unroll
    for (int i = 0; i < kSamplesPerThread; ++i) {
      const int j = mine_from + i * Threads + tid;
      const int pos = sample.first + j * sample.stride;
      if (j < mine_to) sample_keys[j - mine_from] = a.key(sampled[i], row, pos);
    }
    group.sync();  // group barrier 1: every CTA's sample is published

    // Every CTA reads the whole sample (the same keys in the same order) and finds the same ends.
    // Each peer's first sample, computed once: a division each (inside the loop below, 28 of them
    // per thread cost the H200 about 4 us per call).
    int peer_first[kMaxGroup];
#pragma unroll
    for (int r = 0; r < kMaxGroup; ++r) peer_first[r] = r < group_size ? sample.first_at(r * a.plan.slice) : sample.count;
    K mine[kSamplesPerThread];
    K lowest = kKeyMax, highest = 0;
#pragma unroll
    for (int i = 0; i < kSamplesPerThread; ++i) {
      const int g = i * Threads + tid;
      int owner = 0, from = 0;
#pragma unroll
      for (int r = 1; r < kMaxGroup; ++r)
        if (peer_first[r] <= g) {
          owner = r;
          from = peer_first[r];
        }
      mine[i] = g < sample.count ? group.peer(sample_keys, owner)[g - from] : K(0);
    }
#pragma unroll
    for (int i = 0; i < kSamplesPerThread; ++i)
      if (i * Threads + tid < sample.count) {
        lowest = mine[i] < lowest ? mine[i] : lowest;
        highest = mine[i] > highest ? mine[i] : highest;
      }
#pragma unroll
    for (int d = 16; d > 0; d /= 2) {
      const K l = __shfl_xor_sync(0xffffffffu, lowest, d), h = __shfl_xor_sync(0xffffffffu, highest, d);
      lowest = l < lowest ? l : lowest;
      highest = h > highest ? h : highest;
    }
    if (lane == 0) {
      s_warp_min[warp] = lowest;
      s_warp_max[warp] = highest;
    }
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      lowest = s_warp_min[w] < lowest ? s_warp_min[w] : lowest;
      highest = s_warp_max[w] > highest ? s_warp_max[w] : highest;
    }
    const TopkBracketRanks ranks = topk_bracket_ranks(plan.budget, plan.region(), sample.count);
    // Two rounds over the sample: bins of width 2^shift from the lowest sampled key (1025-2048 of them
    // cover the sample's range), then the same over the range between the two ends' bins alone. One
    // round is too coarse when the range spans many binades: a uniform [-1, 1) sample puts the top
    // eighth of its positive binade in one bin, 6% of the row, which overflows the list at 128K.
    int skipped = 0;  // samples above the range of this round
    int round_above = ranks.above, round_below = ranks.below;
#pragma unroll 1
    for (int round = 0; round < 2; ++round) {
      int* const h = hist[0];  // hist[1] holds the published sample
      const int shift = topk_bit_width(K(highest - lowest)) > kTopkCandDigitBits
                            ? topk_bit_width(K(highest - lowest)) - kTopkCandDigitBits
                            : 0;
      if (round == 1) {
        for (int b = tid; b < kTopkCandBins; b += Threads) h[b] = 0;
        __syncthreads();
      }
#pragma unroll
      for (int i = 0; i < kSamplesPerThread; ++i)
        if (i * Threads + tid < sample.count && mine[i] >= lowest && mine[i] <= highest)
          atomicAdd(&h[int((mine[i] - lowest) >> shift)], 1);
      __syncthreads();
      const int q = Threads - 1 - tid;  // bins [kBinsPerThread * q, ...): descending bin order by thread
      int counts[kBinsPerThread], thread_total = 0;
#pragma unroll
      for (int j = 0; j < kBinsPerThread; ++j) thread_total += counts[j] = h[kBinsPerThread * q + j];
      int above = 0;
      BlockScan(scan_storage).ExclusiveSum(thread_total, above);
      above += skipped;
      // Without an upper end the top bin's top stands in (and is not used); likewise the bottom.
      if (tid == 0) {
        s_bracket_top = highest;
        s_bracket_bottom = lowest;
        s_above = skipped;
      }
      __syncthreads();
#pragma unroll
      for (int j = kBinsPerThread - 1; j >= 0; --j) {
        const int bin = kBinsPerThread * q + j;
        if (above < round_above && above + counts[j] >= round_above) {
          s_bracket_top = topk_bin_top(lowest, bin, shift, highest);
          s_above = above;
        }
        if (above < round_below && above + counts[j] >= round_below) s_bracket_bottom = lowest + (K(bin) << shift);
        above += counts[j];
      }
      __syncthreads();
      highest = s_bracket_top;
      lowest = s_bracket_bottom;
      skipped = s_above;
      __syncthreads();  // s_above and the ends are rewritten in the next round
    }
    if (ranks.above >= 1) bracket_top = highest;
    if (ranks.below <= sample.count) bracket_bottom = lowest;
  }

  // ---- the keys go to shared memory, with the pass-0 histogram or (bracket) the list ----
  constexpr int kShift0 = Key::kBits > kTopkCandDigitBits ? Key::kBits - kTopkCandDigitBits : 0;
  constexpr K kMask0 = (K(1) << (Key::kBits - kShift0)) - 1;  // keys have no bits above kBits; be safe
  K* const list = reinterpret_cast<K*>(cand);  // the bracket's list lives where the offsets would
  const int list_capacity = int(std::size_t(a.plan.slice) * sizeof(std::uint16_t) / sizeof(K));
  int above_bracket = 0;
  // Called with warp-uniform trip counts: the list append is warp-aggregated.
  auto store_key = [&](bool valid, int pos, K k) {
    if (valid) keys[pos - slice_lo] = k;
    if (!bracket) {
      if (valid) atomicAdd(&hist[0][int((k >> kShift0) & kMask0)], 1);
      return;
    }
    above_bracket += valid && k > bracket_top;
    const bool listed = valid && k <= bracket_top && k >= bracket_bottom;
    const unsigned m = __ballot_sync(0xffffffffu, listed);
    if (m == 0u) return;
    const int leader = __ffs(int(m)) - 1;
    int slot = 0;
    if (lane == leader) slot = atomicAdd(&s_cand_count, __popc(m));
    slot = __shfl_sync(0xffffffffu, slot, leader) + __popc(m & lanes_below);
    if (listed && slot < list_capacity) list[slot] = k;
  };
  auto store_vector = [&](int v, const uint4& loaded) {
    const T* elems = reinterpret_cast<const T*>(&loaded);
    if (!bracket) {
#pragma unroll
      for (int e = 0; e < kPerVector; ++e) {
        const int pos = v * kPerVector + e;
        const bool valid = v < end_vector && pos >= lo && pos < hi;
        store_key(valid, pos, valid ? a.key(elems[e], row, pos) : K(0));
      }
      return;
    }
    // The vector's listed keys take one shared atomic per warp, not one per element: the list's
    // counter is the one address every warp of the CTA contends for.
    K k[kPerVector];
    unsigned m[kPerVector];
    int total = 0;
#pragma unroll
    for (int e = 0; e < kPerVector; ++e) {
      const int pos = v * kPerVector + e;
      const bool valid = v < end_vector && pos >= lo && pos < hi;
      k[e] = valid ? a.key(elems[e], row, pos) : K(0);
      if (valid) keys[pos - slice_lo] = k[e];
      above_bracket += valid && k[e] > bracket_top;
      m[e] = __ballot_sync(0xffffffffu, valid && k[e] <= bracket_top && k[e] >= bracket_bottom);
      total += __popc(m[e]);
    }
    if (total == 0) return;  // warp-uniform
    int slot = 0;
    if (lane == 0) slot = atomicAdd(&s_cand_count, total);
    slot = __shfl_sync(0xffffffffu, slot, 0);
#pragma unroll
    for (int e = 0; e < kPerVector; ++e) {
      const int mine = slot + __popc(m[e] & lanes_below);
      if (((m[e] >> lane) & 1u) && mine < list_capacity) list[mine] = k[e];
      slot += __popc(m[e]);
    }
  };
#pragma unroll
  for (int u = 0; u < kPreloads; ++u) store_vector(first_vector + u * Threads + tid, pre[u]);
  // Slices longer than the preloads (fp32 slices over 16K positions): the rest, in the same order.
  for (int base = first_vector + kPreloads * Threads; base < end_vector; base += kPreloads * Threads) {
    uint4 more[kPreloads];
#pragma unroll
    for (int u = 0; u < kPreloads; ++u) {
      const int v = base + u * Threads + tid;
      more[u] = v < end_vector ? __ldg(vectors + v) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < kPreloads; ++u) store_vector(base + u * Threads + tid, more[u]);
  }
  // Scalar tail: the whole slice when rows are not 16-byte aligned, else the part of the last vector
  // past the view's columns.
  {
    const int scalar_from = end_vector * kPerVector > lo ? end_vector * kPerVector : lo;
    for (int base = scalar_from; base < hi; base += Threads * kTopkCandBatch) {
      T loaded[kTopkCandBatch];
#pragma unroll
      for (int j = 0; j < kTopkCandBatch; ++j) {
        const int pos = base + j * Threads + tid;
        loaded[j] = pos < hi ? row_scores[pos] : T{};
      }
#pragma unroll
      for (int j = 0; j < kTopkCandBatch; ++j) {
        const int pos = base + j * Threads + tid;
        store_key(pos < hi, pos, pos < hi ? a.key(loaded[j], row, pos) : K(0));
      }
    }
  }

  const int q = Threads - 1 - tid;  // this thread owns bins [kBinsPerThread * q, ... + kBinsPerThread)
  int need = plan.budget;  // keys still to take from the bucket `prefix` (below: equal to kth)
  int gt_lower = 0;        // this thread's share of "keys > kth in lower-ranked CTAs"
  K kth = 0;
  int eq_lower = 0;        // keys == kth in lower-ranked CTAs
  bool searched = false;   // kth found through the bracket
  if (bracket) {
    // ---- the bracket's second half ----
    const int warp_above = topk_warp_sum(above_bracket);
    if (lane == 0 && warp_above != 0) atomicAdd(&s_bracket_above, warp_above);
    group.sync();  // group barrier 2: every CTA's list and counts are complete
    int list_from[kMaxGroup], above_total = 0, listed_total = 0, above_lower = 0, listed_lower = 0;
    bool fits = true;
#pragma unroll
    for (int r = 0; r < kMaxGroup; ++r) {
      const int n_above = r < group_size ? *group.peer(&s_bracket_above, r) : 0;
      const int n_listed = r < group_size ? *group.peer(&s_cand_count, r) : 0;
      fits = fits && n_listed <= list_capacity;
      list_from[r] = listed_total;
      if (r < rank) {
        above_lower += n_above;
        listed_lower += n_listed;
      }
      above_total += n_above;
      listed_total += n_listed;
    }
    // Exact, and the same in every CTA: the budget-th key is inside the bracket and the lists fit.
    searched = fits && listed_total <= a.plan.bracket_capacity && above_total < need &&
               need <= above_total + listed_total;
    if (searched) {
      K* const gathered = reinterpret_cast<K*>(topk_dynamic_smem + std::size_t(a.plan.slice) *
                                                                         (sizeof(K) + sizeof(std::uint16_t)));
      for (int base = 0; base < listed_total; base += Threads * kTopkCandBatch) {
        K batch[kTopkCandBatch];
#pragma unroll
        for (int j = 0; j < kTopkCandBatch; ++j) {
          const int g = base + j * Threads + tid;
          int owner = 0, from = 0;  // selects, not an indexed array: list_from stays in registers
#pragma unroll
          for (int r = 1; r < kMaxGroup; ++r)
            if (r < group_size && list_from[r] <= g) {
              owner = r;
              from = list_from[r];
            }
          batch[j] = g < listed_total ? group.peer(list, owner)[g - from] : K(0);
        }
#pragma unroll
        for (int j = 0; j < kTopkCandBatch; ++j)
          if (base + j * Threads + tid < listed_total) gathered[base + j * Threads + tid] = batch[j];
      }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      // The last reads of a peer's shared memory: peers may leave once everyone has arrived (the
      // matching wait is at the end of the kernel).
      __cluster_barrier_arrive();
#endif
      for (int b = tid; b < 2 * kTopkCandBins; b += Threads) (&hist[0][0])[b] = 0;
      __syncthreads();  // the copied list and the zeroed histograms
      // Digit passes over the copied list alone, on keys relative to the bracket's bottom.
      const K span = (bracket_top < kKeyMax ? bracket_top : kKeyMax) - bracket_bottom;
      int prev_shift = topk_bit_width(span);
      K prefix = 0;
      need -= above_total;
#pragma unroll 1
      for (int pass = 0; prev_shift > 0; ++pass) {
        const int shift = prev_shift > kTopkCandDigitBits ? prev_shift - kTopkCandDigitBits : 0;
        const K digit_mask = (K(1) << (prev_shift - shift)) - 1;
        int* h = hist[pass & 1];
        for (int g = tid; g < listed_total; g += Threads) {
          const K rel = K(gathered[g] - bracket_bottom);
          // The first pass takes every entry (rel >> prev_shift is 0; a shift by the key width is not defined).
          if (pass == 0 || (rel >> prev_shift) == prefix) atomicAdd(h + int((rel >> shift) & digit_mask), 1);
        }
        __syncthreads();
        int total[kBinsPerThread], thread_total = 0;
#pragma unroll
        for (int j = 0; j < kBinsPerThread; ++j) thread_total += total[j] = h[kBinsPerThread * q + j];
        int above = 0;
        BlockScan(scan_storage).ExclusiveSum(thread_total, above);
#pragma unroll
        for (int j = kBinsPerThread - 1; j >= 0; --j) {
          if (above < need && above + total[j] >= need) {
            s_digit = kBinsPerThread * q + j;
            s_above = above;
          }
          above += total[j];
        }
        // The other buffer was last read in the previous pass's scan, which every thread finished
        // before the barrier above.
        for (int b = tid; b < kTopkCandBins; b += Threads) hist[(pass + 1) & 1][b] = 0;
        __syncthreads();
        need -= s_above;
        prefix = (prefix << (prev_shift - shift)) | K(s_digit);
        prev_shift = shift;
      }
      kth = bracket_bottom + prefix;
      // The lower ranks' keys above kth and equal to it: their listed keys, plus all their keys above
      // the bracket. The list is in rank order.
      int gt = 0, eq = 0;
      for (int g = tid; g < listed_lower; g += Threads) {
        gt += gathered[g] > kth;
        eq += gathered[g] == kth;
      }
      gt = topk_warp_sum(gt);
      eq = topk_warp_sum(eq);
      if (lane == 0 && (gt | eq) != 0) {
        atomicAdd(&s_gt_lower_sum, gt);
        atomicAdd(&s_eq_lower_sum, eq);
      }
      __syncthreads();
      gt_lower = tid == 0 ? above_lower + s_gt_lower_sum : 0;
      eq_lower = s_eq_lower_sum;
    } else {
      // The bracket missed: the exact digit searches below, from a pass-0 histogram of the stored keys.
      // The peers read this CTA's sample and counts before they arrived at barrier 2, and its list is
      // nobody's now; s_cand_count is reset once every peer is past pass 0's group barrier.
      for (int b = tid; b < 2 * kTopkCandBins; b += Threads) (&hist[0][0])[b] = 0;
      __syncthreads();
      for (int i = lo + tid; i < hi; i += Threads) atomicAdd(&hist[0][int((keys[i - slice_lo] >> kShift0) & kMask0)], 1);
    }
  }

  // ---- digit passes (none when the bracket found kth) ----
  K prefix = 0;  // the known top bits of kth
  int prev_shift = Key::kBits;

#pragma unroll 1
  for (int pass = 0; pass < (searched ? 0 : kPasses); ++pass) {
    const int shift = Key::kBits - kTopkCandDigitBits * (pass + 1) > 0 ? Key::kBits - kTopkCandDigitBits * (pass + 1) : 0;
    const K digit_mask = (K(1) << (prev_shift - shift)) - 1;
    int* h = hist[pass & 1];
    if (pass == 1) {
      // Compact the candidates (top digit == the threshold digit) and histogram their next digit.
      for (int base = lo; base < hi; base += Threads * kTopkCandBatch) {
        K batch[kTopkCandBatch];
#pragma unroll
        for (int j = 0; j < kTopkCandBatch; ++j) {
          const int pos = base + j * Threads + tid;
          batch[j] = pos < hi ? keys[pos - slice_lo] : K(0);
        }
#pragma unroll
        for (int j = 0; j < kTopkCandBatch; ++j) {
          const int pos = base + j * Threads + tid;
          const bool match = pos < hi && (batch[j] >> prev_shift) == prefix;
          const unsigned m = __ballot_sync(0xffffffffu, match);
          if (m == 0u) continue;  // warp-uniform
          const int leader = __ffs(int(m)) - 1;
          int slot = 0;
          if (lane == leader) slot = atomicAdd(&s_cand_count, __popc(m));
          slot = __shfl_sync(0xffffffffu, slot, leader);
          if (match) {
            cand[slot + __popc(m & lanes_below)] = std::uint16_t(pos - slice_lo);
            atomicAdd(h + int((batch[j] >> shift) & digit_mask), 1);
          }
        }
      }
    } else if (pass > 1) {
      const int n = s_cand_count;  // complete: the group barrier of pass 1 came after the compaction
      for (int base = 0; base < n; base += Threads * kTopkCandBatch) {
        K batch[kTopkCandBatch];
#pragma unroll
        for (int j = 0; j < kTopkCandBatch; ++j) {
          const int i = base + j * Threads + tid;
          batch[j] = i < n ? keys[cand[i]] : K(0);
        }
#pragma unroll
        for (int j = 0; j < kTopkCandBatch; ++j) {
          const int i = base + j * Threads + tid;
          if (i < n && (batch[j] >> prev_shift) == prefix) atomicAdd(h + int((batch[j] >> shift) & digit_mask), 1);
        }
      }
    }
    group.sync();  // every CTA's histogram of this pass is complete
    if (pass == 0 && bracket && tid == 0) s_cand_count = 0;  // the peers have read it (see above)
    // The other buffer was last read in the previous pass's search, by this CTA and by every peer
    // before it arrived at the barrier above; pass + 1 fills it after the broadcast barrier below.
    if (pass >= 1 && pass + 1 < kPasses)
      for (int b = tid; b < kTopkCandBins; b += Threads) hist[(pass + 1) & 1][b] = 0;

    // Sum the group's bins (all peers' loads in flight at once), and keep the lower ranks' share.
    int4 peer_bins[kMaxGroup][kVecPerThread];
#pragma unroll
    for (int r = 0; r < kMaxGroup; ++r)
#pragma unroll
      for (int v = 0; v < kVecPerThread; ++v)
        peer_bins[r][v] = r < group_size ? group.peer(reinterpret_cast<int4*>(h), r)[q * kVecPerThread + v]
                                         : make_int4(0, 0, 0, 0);
    int total[kBinsPerThread], lower[kBinsPerThread];
#pragma unroll
    for (int j = 0; j < kBinsPerThread; ++j) total[j] = lower[j] = 0;
#pragma unroll
    for (int r = 0; r < kMaxGroup; ++r)
#pragma unroll
      for (int v = 0; v < kVecPerThread; ++v) {
        const int c[4] = {peer_bins[r][v].x, peer_bins[r][v].y, peer_bins[r][v].z, peer_bins[r][v].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          total[4 * v + e] += c[e];
          if (r < rank) lower[4 * v + e] += c[e];
        }
      }
    int thread_total = 0;
#pragma unroll
    for (int j = 0; j < kBinsPerThread; ++j) thread_total += total[j];
    int above = 0;  // keys in bins above this thread's: thread order is descending bin order
    BlockScan(scan_storage).ExclusiveSum(thread_total, above);
#pragma unroll
    for (int j = kBinsPerThread - 1; j >= 0; --j) {
      // Exactly one bin of the group holds the need-th key: 1 <= need <= the bucket's size.
      if (above < need && above + total[j] >= need) {
        s_digit = kBinsPerThread * q + j;
        s_above = above;
        s_eq_lower = lower[j];
      }
      above += total[j];
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Every read of a peer's shared memory is done (its values are summed above): peers may leave
    // once everyone has arrived. The matching wait is at the end of the kernel.
    if (pass == kPasses - 1 && group_size > 1) __cluster_barrier_arrive();
#endif
    __syncthreads();
    const int digit = s_digit;
    need -= s_above;
#pragma unroll
    for (int j = 0; j < kBinsPerThread; ++j)
      if (kBinsPerThread * q + j > digit) gt_lower += lower[j];
    prefix = (prefix << (prev_shift - shift)) | K(digit);
    prev_shift = shift;
  }
  if (!searched) {
    kth = prefix;            // all kBits known
    eq_lower = s_eq_lower;   // the last search's
  }

  // ---- ordered output: warp w owns a contiguous run of [lo, hi) ----
  const int per_warp = ((hi - lo + kWarps - 1) / kWarps + 31) / 32 * 32;
  const int warp_lo = lo + warp * per_warp < hi ? lo + warp * per_warp : hi;
  const int warp_hi = warp_lo + per_warp < hi ? warp_lo + per_warp : hi;
  auto load_batch = [&](int chunk, K (&batch)[kTopkCandBatch]) {
#pragma unroll
    for (int j = 0; j < kTopkCandBatch; ++j) {
      const int pos = chunk + 32 * j + lane;
      batch[j] = pos < warp_hi ? keys[pos - slice_lo] : K(0);
    }
  };
  int gt = 0, eq = 0;
  for (int chunk = warp_lo; chunk < warp_hi; chunk += 32 * kTopkCandBatch) {
    K batch[kTopkCandBatch];
    load_batch(chunk, batch);
#pragma unroll
    for (int j = 0; j < kTopkCandBatch; ++j) {
      const bool valid = chunk + 32 * j + lane < warp_hi;
      gt += __popc(__ballot_sync(0xffffffffu, valid && batch[j] > kth));
      eq += __popc(__ballot_sync(0xffffffffu, valid && batch[j] == kth));
    }
  }
  const int warp_gt_lower = topk_warp_sum(gt_lower);
  if (lane == 0) {
    s_warp_gt[warp] = gt;
    s_warp_eq[warp] = eq;
    s_warp_lower[warp] = warp_gt_lower;
  }
  __syncthreads();
  const int wg = lane < kWarps ? s_warp_gt[lane] : 0;
  const int we = lane < kWarps ? s_warp_eq[lane] : 0;
  const int wl = lane < kWarps ? s_warp_lower[lane] : 0;
  const int gt_before_warp = topk_warp_sum(lane < warp ? wg : 0);
  const int eq_before_warp = topk_warp_sum(lane < warp ? we : 0);
  const int gt_before_cta = topk_warp_sum(wl);
  // Lower ranks hold lower positions: their selections come first and they take equal keys first.
  const int eq_taken_before_cta = eq_lower < need ? eq_lower : need;
  const int eq_budget = need - eq_taken_before_cta;  // equal keys this CTA may take, lowest first
  int offset = plan.sink_end + gt_before_cta + eq_taken_before_cta + gt_before_warp +
               (eq_before_warp < eq_budget ? eq_before_warp : eq_budget);
  int eq_seen = eq_before_warp;
  for (int chunk = warp_lo; chunk < warp_hi; chunk += 32 * kTopkCandBatch) {
    K batch[kTopkCandBatch];
    load_batch(chunk, batch);
#pragma unroll
    for (int j = 0; j < kTopkCandBatch; ++j) {
      const int pos = chunk + 32 * j + lane;
      const bool valid = pos < warp_hi;
      const bool is_eq = valid && batch[j] == kth;
      const unsigned eq_lanes = __ballot_sync(0xffffffffu, is_eq);
      const bool take = (valid && batch[j] > kth) || (is_eq && eq_seen + __popc(eq_lanes & lanes_below) < eq_budget);
      const unsigned take_lanes = __ballot_sync(0xffffffffu, take);
      if (take) emit(offset + __popc(take_lanes & lanes_below), pos);
      offset += __popc(take_lanes);
      eq_seen += __popc(eq_lanes);
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (group_size > 1) __cluster_barrier_wait();  // no CTA leaves while a peer may read its histogram
#endif
}

}  // namespace detail
}  // namespace kvsift
