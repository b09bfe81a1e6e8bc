#pragma once
// The stream select behind cuda::topk for many long rows (contract in ops/topk.hpp, plan in
// ops/topk_plan.hpp, design and measurements in docs/ops/topk.md, section "The stream select").
//
// One CTA per row, no CTA group, no copy of the row in shared memory. Where the candidate select
// needs more than one wave of CTA groups (256 rows of 128K fp32 scores are 134 MB of keys against
// 30 MB of shared memory on the whole GPU), the late groups wait for the early ones and every wave
// pays the whole serial chain again (327 us on the H200 against a 30 us one-read floor). This kernel
// instead streams the row from global memory at full rate and keeps only what the selection needs on
// chip:
//
// 1. Sample: one 32-byte sector of every `sample_period` (the plan's 16: a sixteenth of the keys and
//    of the bytes) is histogrammed on the top 13 bits of the key (8192 bins). The bin holding the
//    sample's r-th key, r a few standard deviations above the budget's share of the sample, gives a
//    threshold that almost surely lies below the k-th key and above most of the row.
// 2. Filter: stream the whole row; every key at or above the threshold is appended, with its
//    position, to a candidate list in shared memory and histogrammed (exactly) on its top 13 bits.
//    Keys below it take no shared-memory atomic, which is what the full histogram of a
//    first pass spent most of its time on (same-bin conflicts: uniform scores put half the row in 32
//    of the 8192 bins).
// 3. The k-th key's digits are then found from the list alone (13 + 13 + 6 bits for 32-bit keys),
//    and one sweep over the list marks the keys above the k-th key in a bitmap of the row's
//    positions and the keys equal to it in a second, tie bitmap (the histogram's memory, when the
//    row has at most 262144 positions).
// 4. Ordered output from the bitmaps: each thread owns a run of bitmap words; one scan ranks the ties
//    (the lowest positions are taken first), a second gives each thread its output offset; each
//    thread writes its selected positions in ascending order or, where one position in 8 or more is
//    selected, each warp writes its threads' positions together, lane i to consecutive slot i.
//
// Fallbacks, slower but never wrong: if fewer than budget keys pass the threshold (the sample
// misled), the row is streamed again for the exact histogram of its top digit; if more pass than the
// list holds (mostly-equal rows), the digit found from the exact histogram of step 2 is kept and the
// row is streamed once per further digit, keys above the known prefix marked as selected and keys
// matching it listed (or, once every bit is known, marked as ties) directly.

#include <cub/block/block_scan.cuh>

#include <cstdint>
#include <type_traits>

#include "kvsift/core/dependent_launch.cuh"
#include "kvsift/ops/detail/topk_radix_select.cuh"
#include "kvsift/ops/topk.hpp"
#include "kvsift/ops/topk_plan.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kTopkStreamDigitBits = 13;  // 8192 bins: 3 levels over 32-bit keys (13 + 13 + 6)
inline constexpr int kTopkStreamBins = 1 << kTopkStreamDigitBits;
static_assert(kTopkStreamBins == kTopkStreamHistWords, "the plan counts the histogram's shared memory");
inline constexpr int kTopkStreamBinsPerThread = kTopkStreamBins / kTopkThreads;  // 16: four int4 per thread
static_assert(kTopkStreamBinsPerThread % 4 == 0, "the digit search reads its bins as int4");

// Calls visit(position, key) for a sample of the positions [lo, hi) of a row in global memory: one
// 32-byte sector of every `period` (two 16-byte vectors of every 2 * period; eight positions of every
// 8 * period without vector loads). Only whole vectors inside [lo, hi) are sampled; the trip counts
// are not warp-uniform (visit must not use warp collectives).
template <class T, class Key, class Visit>
__device__ __forceinline__ void for_each_sampled_key(const TopkLaunch<T, Key>& a, const T* row_scores,
                                                     std::int64_t row, int lo, int hi, Visit&& visit) {
  constexpr int kPerVector = 16 / int(sizeof(T));
  const int tid = int(threadIdx.x);
  const int period = a.plan.sample_period;
  if (a.plan.vector_loads) {
    const int vlo = (lo + kPerVector - 1) / kPerVector, vhi = hi / kPerVector;
    const uint4* vectors = reinterpret_cast<const uint4*>(row_scores);
    // Sample index i reads vector 2 * period * (i / 2) + i % 2.
    const int stride = 2 * period;
    const int i_lo = 2 * (vlo / stride), i_hi = 2 * ((vhi + stride - 1) / stride);
    for (int base = i_lo; base < i_hi; base += kTopkThreads * kTopkLoadUnroll) {
      uint4 loaded[kTopkLoadUnroll];
#pragma unroll
      for (int u = 0; u < kTopkLoadUnroll; ++u) {
        const int i = base + u * kTopkThreads + tid;
        const int v = stride * (i / 2) + i % 2;
        loaded[u] = i < i_hi && v >= vlo && v < vhi ? __ldg(vectors + v) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int u = 0; u < kTopkLoadUnroll; ++u) {
        const int i = base + u * kTopkThreads + tid;
        const int v = stride * (i / 2) + i % 2;
        if (!(i < i_hi && v >= vlo && v < vhi)) continue;
        const T* elems = reinterpret_cast<const T*>(&loaded[u]);
#pragma unroll
        for (int e = 0; e < kPerVector; ++e) {
          const int pos = v * kPerVector + e;
          visit(pos, a.key(elems[e], row, pos));
        }
      }
    }
    return;
  }
  // Sample index i reads position 8 * period * (i / 8) + i % 8.
  const int stride = 8 * period;
  const int i_lo = 8 * (lo / stride), i_hi = 8 * ((hi + stride - 1) / stride);
  for (int i = i_lo + tid; i < i_hi; i += kTopkThreads) {
    const int pos = stride * (i / 8) + i % 8;
    if (pos >= lo && pos < hi) visit(pos, a.key(row_scores[pos], row, pos));
  }
}

// The filter stream of step 2 over the 16-byte vectors wholly inside [lo, hi) (the caller takes the
// scalar head and tail): every key >= threshold is appended to the list (list_keys / list_pos, room
// for `capacity`; past it a key is counted, not stored) and histogrammed on its top digit (>> shift0).
// Per thread and batch of 32 keys the passing keys become bits of a mask; one warp scan and one
// shared atomic per warp reserve the batch's slots, and only the passing keys are read again (from L1),
// converted and written. On uniform scores 80% of a warp's 32-key steps hold a candidate, so a per-key ballot and
// branch (about 45 instructions a key) cost more than the stream itself; here a key that does not
// pass is its conversion and one compare.
// passes(score, position) says whether a key reaches the threshold (the key compare, or for plain
// scores the equivalent float compare of float_order_threshold, ops/topk.hpp).
template <class T, class Key, class Passes>
__device__ __forceinline__ void topk_stream_filter(const TopkLaunch<T, Key>& a, const T* row_scores, std::int64_t row,
                                                   int lo, int hi, Passes&& passes, int shift0,
                                                   typename Key::key_type* list_keys, std::int32_t* list_pos,
                                                   int capacity, int* s_count, int* hist) {
  using K = typename Key::key_type;
  constexpr int kPerVector = 16 / int(sizeof(T));
  // 32 keys per thread and batch, one bit each: eight vectors of fp32, four of 16-bit scores (eight
  // of those, with 64-bit flag-first keys, spill registers).
  constexpr int kBatch = 32 / kPerVector;
  using Mask = std::uint32_t;
  const int tid = int(threadIdx.x);
  const int lane = tid % 32;
  const int first_vector = (lo + kPerVector - 1) / kPerVector, end_vector = hi / kPerVector;
  const uint4* vectors = reinterpret_cast<const uint4*>(row_scores);
  // Trip counts are block-uniform: every lane of a warp takes part in the scan.
  for (int base = first_vector; base < end_vector; base += kTopkThreads * kBatch) {
    uint4 loaded[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int v = base + u * kTopkThreads + tid;
      loaded[u] = v < end_vector ? __ldg(vectors + v) : make_uint4(0u, 0u, 0u, 0u);
    }
    Mask mask = 0;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int v = base + u * kTopkThreads + tid;
      if (v >= end_vector) continue;  // one test per vector (a key policy may read memory at pos)
      const T* elems = reinterpret_cast<const T*>(&loaded[u]);
#pragma unroll
      for (int e = 0; e < kPerVector; ++e) {
        const bool pass = passes(elems[e], v * kPerVector + e);
        mask |= Mask(pass) << (u * kPerVector + e);
      }
    }
    const int count = __popc(mask);
    int inclusive = count;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int t = __shfl_up_sync(0xffffffffu, inclusive, d);
      if (lane >= d) inclusive += t;
    }
    int slot = 0;
    if (lane == 31 && inclusive > 0) slot = atomicAdd(s_count, inclusive);
    slot = __shfl_sync(0xffffffffu, slot, 31) + inclusive - count;
    // Rare: a few passing keys per thread and batch, re-read from L1 (the batch's registers are not
    // kept live across the scan).
    while (mask != 0) {
      const int j = __ffs(int(mask)) - 1;
      mask &= mask - 1;
      const int pos = (base + (j / kPerVector) * kTopkThreads + tid) * kPerVector + j % kPerVector;
      const K key_bits = a.key(row_scores[pos], row, pos);
      if (slot < capacity) {
        list_keys[slot] = key_bits;
        list_pos[slot] = pos;
      }
      ++slot;
      atomicAdd(&hist[int(key_bits >> shift0)], 1);
    }
  }
}

// The position of the j-th lowest set bit of `word` (j from 0; j < popc(word)).
__device__ __forceinline__ int topk_nth_set_bit(std::uint32_t word, int j) {
  int position = 0;
#pragma unroll
  for (int width = 16; width > 0; width /= 2) {
    const int low = __popc(word & ((1u << width) - 1u));
    if (j >= low) {
      j -= low;
      word >>= width;
      position += width;
    }
  }
  return position;
}

// The digit of `hist` (descending bin order) that holds the need-th key, how many keys lie in the
// bins above it, and the histogram's total (no digit is found when need > total). Each thread reads
// and then zeroes its own 16 bins, so the histogram is clean for the next level once the barrier at
// the end has passed; no other thread touches those bins in between.
template <class BlockScan>
__device__ __forceinline__ void topk_stream_search(int* hist, int need, typename BlockScan::TempStorage& storage,
                                                   int* s_digit, int* s_above, int& digit, int& above_digit,
                                                   int& total_keys) {
  const int q = kTopkThreads - 1 - int(threadIdx.x);  // thread order is descending bin order
  int4* mine = reinterpret_cast<int4*>(hist) + q * (kTopkStreamBinsPerThread / 4);
  int c[kTopkStreamBinsPerThread];
#pragma unroll
  for (int v = 0; v < kTopkStreamBinsPerThread / 4; ++v) {
    const int4 b = mine[v];
    c[4 * v] = b.x;
    c[4 * v + 1] = b.y;
    c[4 * v + 2] = b.z;
    c[4 * v + 3] = b.w;
    mine[v] = make_int4(0, 0, 0, 0);
  }
  int total = 0;
#pragma unroll
  for (int j = 0; j < kTopkStreamBinsPerThread; ++j) total += c[j];
  int above = 0;
  BlockScan(storage).ExclusiveSum(total, above, total_keys);
#pragma unroll
  for (int j = kTopkStreamBinsPerThread - 1; j >= 0; --j) {
    // Exactly one bin holds the need-th key: 1 <= need <= the bucket's size.
    if (above < need && above + c[j] >= need) {
      *s_digit = kTopkStreamBinsPerThread * q + j;
      *s_above = above;
    }
    above += c[j];
  }
  __syncthreads();
  digit = *s_digit;
  above_digit = *s_above;
}

template <class T, class Key>
__global__ void __launch_bounds__(kTopkThreads, 2)
    topk_stream_select_kernel(StridedView2D<const T> scores, TopKParams params, IndexSet out, T* values, Key key,
                              TopkPlan launch_plan) {
  static_assert(sizeof(scores) <= 128 && sizeof(params) <= 128 && sizeof(out) <= 128 && sizeof(key) <= 128 &&
                    sizeof(launch_plan) <= 128,
                "each kernel parameter stays under 128 bytes (see TopkLaunch)");
  wait_for_primary_grid();  // Exec::dependent_launch: the scores and row limits are earlier kernels' output
  using K = typename Key::key_type;
  using BlockScan = cub::BlockScan<int, kTopkThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  constexpr int kWarpSize = 32;
  const TopkLaunch<T, Key> a{scores, params, out, values, key, launch_plan};

  // Dynamic shared memory: the selected bitmap (one bit per column), the tie bitmap where the
  // histogram cannot hold it, then the candidate list's keys and positions. words is even, so the
  // keys start 8-byte aligned. The tie bitmap is only written after the last digit search, which left
  // every bin zero.
  extern __shared__ __align__(16) unsigned char topk_dynamic_smem[];
  __shared__ __align__(16) int hist[kTopkStreamBins];
  const int words = a.plan.bitmap_words;
  const bool ties_in_hist = words <= kTopkStreamBins;
  std::uint32_t* selected = reinterpret_cast<std::uint32_t*>(topk_dynamic_smem);
  std::uint32_t* tied = ties_in_hist ? reinterpret_cast<std::uint32_t*>(hist) : selected + words;
  K* list_keys = reinterpret_cast<K*>(selected + (ties_in_hist ? words : 2 * words));
  std::int32_t* list_pos = reinterpret_cast<std::int32_t*>(list_keys + a.plan.list_capacity);
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ int s_digit, s_above, s_count, s_sampled;

  const std::int64_t row = topk_written_row(a.params, blockIdx.x);  // the launch covers the filtered rows only
  const int tid = int(threadIdx.x);
  const int lane = tid % kWarpSize;
  const unsigned lanes_below = (1u << lane) - 1u;
  const T* row_scores = a.scores.data + row * a.scores.row_stride;
  std::int32_t* row_out = a.out.indices + row * a.out.row_stride;
  T* row_values = a.values ? a.values + row * a.out.row_stride : nullptr;

  const int len = a.params.lengths ? a.params.lengths[row] : a.plan.cols;
  const int k = a.params.per_row_k ? a.params.per_row_k[row] : a.params.k;
  const TopKRowPlan plan = plan_topk_row(a.plan.cols, len, k, a.out.capacity, a.params.sink, a.params.recent);
  auto emit = [&](int offset, int position) {
    row_out[offset] = position;
    if (row_values) row_values[offset] = row_scores[position];
  };
  topk_write_forced(plan, tid, kTopkThreads, tid == 0, a.out.counts + row, emit);
  const int lo = plan.sink_end, hi = plan.recent_begin;
  if (plan.budget == 0) return;
  if (plan.budget == plan.region()) {
    for (int i = lo + tid; i < hi; i += kTopkThreads) emit(plan.sink_end + (i - lo), i);
    return;
  }

  const int word_lo = lo / 32, word_hi = (hi + 31) / 32;  // the bitmap words [lo, hi) touches
  for (int w = word_lo + tid; w < word_hi; w += kTopkThreads) selected[w] = 0u;
  if (!ties_in_hist)
    for (int w = word_lo + tid; w < word_hi; w += kTopkThreads) tied[w] = 0u;
  for (int b = tid; b < kTopkStreamBins; b += kTopkThreads) hist[b] = 0;
  if (tid == 0) s_count = s_sampled = 0;
  __syncthreads();

  constexpr int kShift0 = Key::kBits > kTopkStreamDigitBits ? Key::kBits - kTopkStreamDigitBits : 0;
  int need = plan.budget;  // keys still to take from the bucket `prefix`
  int digit = 0, above = 0, total = 0;
  K prefix = 0;  // the known top bits of the k-th key: Key::kBits - shift of them
  int shift = kShift0;
  bool in_list = false;  // the list holds every key of some earlier bucket that contains `prefix`
  int listed = 0;
  bool exact = true;  // the top digit still needs a histogram of every key

  // Appends the keys of the lanes that `take` to the list (one shared atomic per warp; called with
  // warp-uniform trip counts) and histograms them into `bin`; past the list's capacity a key is
  // counted and histogrammed but not stored.
  auto append = [&](bool take, int pos, K key_bits, int bin) {
    const unsigned m = __ballot_sync(0xffffffffu, take);
    if (m == 0u) return;  // warp-uniform
    const int leader = __ffs(int(m)) - 1;
    int slot = 0;
    if (lane == leader) slot = atomicAdd(&s_count, __popc(m));
    slot = __shfl_sync(0xffffffffu, slot, leader) + __popc(m & lanes_below);
    if (!take) return;
    if (slot < a.plan.list_capacity) {
      list_keys[slot] = key_bits;
      list_pos[slot] = pos;
    }
    atomicAdd(&hist[bin], 1);
  };

  // ---- sample and filter (steps 1 and 2) ----
  {
    int mine = 0;
    for_each_sampled_key(a, row_scores, row, lo, hi, [&](int, K key_bits) {
      atomicAdd(&hist[int(key_bits >> kShift0)], 1);
      ++mine;
    });
    atomicAdd(&s_sampled, mine);
    __syncthreads();
    const int sampled = s_sampled;
    // The budget's expected share of the sample, plus 10% and three standard deviations: the
    // threshold falls above the k-th key only when the sample is badly skewed.
    const float expect = float(plan.budget) * float(sampled) / float(plan.region());
    const int r = int(expect * 1.1f + 3.f * sqrtf(expect)) + 4;
    topk_stream_search<BlockScan>(hist, r, scan_storage, &s_digit, &s_above, digit, above, total);
    if (r <= total) {
      const K threshold = K(digit) << kShift0;
      if (a.plan.vector_loads) {
        // The batched filter over the whole vectors; the per-key append over the scalar head and tail.
        constexpr int kPerVector = 16 / int(sizeof(T));
        const int vec_lo = (lo + kPerVector - 1) / kPerVector * kPerVector, vec_hi = hi / kPerVector * kPerVector;
        auto filter = [&](auto&& passes) {
          topk_stream_filter(a, row_scores, row, lo, hi, passes, kShift0, list_keys, list_pos, a.plan.list_capacity,
                             &s_count, hist);
        };
        bool by_key = true;
        if constexpr (std::is_same_v<Key, ScoreKey<T>>) {
          if (threshold != 0) {  // key 0 (NaN) passes too: only the key compare says so
            by_key = false;
            const float t = float_order_threshold(std::uint32_t(threshold) << (32 - Key::kBits));
            filter([&](T score, int) { return dtype_traits<T>::to_float(score) >= t; });
          }
        }
        if (by_key) filter([&](T score, int pos) { return a.key(score, row, pos) >= threshold; });
        auto scalar = [&](int from, int to) {
          for (int base = from; base < to; base += kTopkThreads) {
            const int pos = base + tid;
            const bool valid = pos < to;
            const K key_bits = valid ? a.key(row_scores[pos], row, pos) : K(0);
            append(valid && key_bits >= threshold, pos, key_bits, int(key_bits >> kShift0));
          }
        };
        const int head_end = vec_lo < hi ? vec_lo : hi;
        scalar(lo, head_end);
        scalar(vec_hi > head_end ? vec_hi : head_end, hi);
      } else {
        for_each_global_key(a, row_scores, row, lo, hi, [&](bool valid, int pos, K key_bits) {
          append(valid && key_bits >= threshold, pos, key_bits, int(key_bits >> kShift0));
        });
      }
      __syncthreads();
      listed = s_count;
      if (listed >= plan.budget) {
        // The k-th key passed: the exact histogram of the passing keys holds its digit.
        exact = false;
        topk_stream_search<BlockScan>(hist, need, scan_storage, &s_digit, &s_above, digit, above, total);
        need -= above;
        prefix = K(digit);
        in_list = listed <= a.plan.list_capacity;
      } else {
        __syncthreads();  // every thread has read s_count (the search's barrier does this above)
        for (int b = tid; b < kTopkStreamBins; b += kTopkThreads) hist[b] = 0;
      }
      // The next stream (if any) appends after this barrier.
      if (tid == 0) s_count = 0;
      __syncthreads();
    }
  }
  // ---- the exact top digit (rows too short to sample, or a misleading sample) ----
  if (exact) {
    for_each_global_key(a, row_scores, row, lo, hi, [&](bool valid, int, K key_bits) {
      if (valid) atomicAdd(&hist[int(key_bits >> kShift0)], 1);
    });
    __syncthreads();
    topk_stream_search<BlockScan>(hist, need, scan_storage, &s_digit, &s_above, digit, above, total);
    need -= above;
    prefix = K(digit);
  }

  auto mark = [](std::uint32_t* bitmap, int pos) { atomicOr(bitmap + pos / 32, 1u << (pos % 32)); };
#pragma unroll 1
  while (shift > 0) {
    const int next_shift = shift > kTopkStreamDigitBits ? shift - kTopkStreamDigitBits : 0;
    const K digit_mask = (K(1) << (shift - next_shift)) - 1;
    if (in_list) {
      for (int i = tid; i < listed; i += kTopkThreads) {
        const K kb = list_keys[i];
        if ((kb >> shift) == prefix) atomicAdd(&hist[int((kb >> next_shift) & digit_mask)], 1);
      }
    } else {
      // Stream the row: above the bucket is selected; in it is listed (while there is room) and
      // histogrammed either way, so the next digit is exact even when the list overflows.
      for_each_global_key(a, row_scores, row, lo, hi, [&](bool valid, int pos, K key_bits) {
        const K top = key_bits >> shift;
        if (valid && top > prefix) mark(selected, pos);
        append(valid && top == prefix, pos, key_bits, int((key_bits >> next_shift) & digit_mask));
      });
    }
    __syncthreads();
    if (!in_list) {
      listed = s_count;
      in_list = listed <= a.plan.list_capacity;
    }
    topk_stream_search<BlockScan>(hist, need, scan_storage, &s_digit, &s_above, digit, above, total);
    need -= above;
    prefix = (prefix << (shift - next_shift)) | K(digit);
    shift = next_shift;
    if (!in_list) {
      // Every thread read s_count before the search's barrier; the next stream appends after this one.
      if (tid == 0) s_count = 0;
      __syncthreads();
    }
  }
  const K kth = prefix;  // every bit known

  if (in_list) {
    for (int i = tid; i < listed; i += kTopkThreads) {
      const K kb = list_keys[i];
      if (kb > kth) mark(selected, list_pos[i]);
      else if (kb == kth) mark(tied, list_pos[i]);
    }
  } else {
    for_each_global_key(a, row_scores, row, lo, hi, [&](bool valid, int pos, K key_bits) {
      if (valid && key_bits > kth) mark(selected, pos);
      else if (valid && key_bits == kth) mark(tied, pos);
    });
  }
  __syncthreads();

  // ---- ordered output: thread t owns the bitmap words [w0, w1) ----
  const int per_thread = (word_hi - word_lo + kTopkThreads - 1) / kTopkThreads;
  const int w0 = word_lo + tid * per_thread < word_hi ? word_lo + tid * per_thread : word_hi;
  const int w1 = w0 + per_thread < word_hi ? w0 + per_thread : word_hi;
  int ties_here = 0;
  for (int w = w0; w < w1; ++w) ties_here += __popc(tied[w]);
  int ties_before = 0;
  BlockScan(scan_storage).ExclusiveSum(ties_here, ties_before);
  int taken_here = 0;
  for (int w = w0; w < w1; ++w) {
    std::uint32_t t = tied[w];
    const int n = __popc(t);
    // The need lowest-positioned ties are taken: drop this word's highest ties past the quota.
    const int quota = need - ties_before;
    if (quota <= 0) t = 0u;
    else
      for (int drop = n - quota; drop > 0; --drop) t &= ~(0x80000000u >> __clz(int(t)));
    ties_before += n;
    const std::uint32_t taken = selected[w] | t;
    selected[w] = taken;  // only this thread reads word w from here on
    taken_here += __popc(taken);
  }
  __syncthreads();  // the scan storage is reused; every word of `selected` is final
  int offset = 0, taken_total = 0;
  BlockScan(scan_storage).ExclusiveSum(taken_here, offset, taken_total);
  offset += plan.sink_end;
  // Sparse selections (under one position in 8 taken: k = 4096 of 128K, 1024 of 32K) are written by
  // each thread from its own words: there the warp's rounds below cost more than the scattered stores
  // they save (writing by warps everywhere, A/B 2026-12-04: +2-5% at one position in 32, -4% at 256
  // rows of 32K with k = 4096).
  if (taken_total * 8 < (word_hi - word_lo) * 32) {
    for (int w = w0; w < w1; ++w)
      for (std::uint32_t taken = selected[w]; taken != 0u; taken &= taken - 1u)
        emit(offset++, 32 * w + __ffs(int(taken)) - 1);
    return;
  }
  // Dense ones: a warp's threads own consecutive words and consecutive output slots, so the warp
  // writes them together: 32 words a round, one a lane, and output slot base + i from lane i (whole
  // 128-byte lines; a thread writing its own words' positions touches one 32-byte sector per position).
  const int warp_w0 = __shfl_sync(0xffffffffu, w0, 0), warp_w1 = __shfl_sync(0xffffffffu, w1, kWarpSize - 1);
  int base = __shfl_sync(0xffffffffu, offset, 0);
  for (int w = warp_w0; w < warp_w1; w += kWarpSize) {  // warp-uniform trip counts
    const std::uint32_t word = w + lane < warp_w1 ? selected[w + lane] : 0u;
    const int n = __popc(word);
    int inclusive = n;
#pragma unroll
    for (int d = 1; d < kWarpSize; d *= 2) {
      const int t = __shfl_up_sync(0xffffffffu, inclusive, d);
      if (lane >= d) inclusive += t;
    }
    const int total = __shfl_sync(0xffffffffu, inclusive, kWarpSize - 1);
    for (int first = 0; first < total; first += kWarpSize) {
      const int t = first + lane;
      // The lane whose word holds the round's t-th position: the first whose inclusive count exceeds t.
      int owner = 0;
#pragma unroll
      for (int step = kWarpSize / 2; step > 0; step /= 2)
        if (__shfl_sync(0xffffffffu, inclusive, owner + step - 1) <= t) owner += step;
      const int before = __shfl_sync(0xffffffffu, inclusive - n, owner);
      const std::uint32_t owner_word = __shfl_sync(0xffffffffu, word, owner);
      if (t < total) emit(base + t, 32 * (w + owner) + topk_nth_set_bit(owner_word, t - before));
    }
    base += total;
  }
}

}  // namespace detail
}  // namespace kvsift
