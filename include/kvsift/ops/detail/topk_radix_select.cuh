#pragma once
// The per-row radix select behind cuda::topk (contract in ops/topk.hpp, design in docs/ops/topk.md).
//
// One row is handled by one CTA group of `ctas_per_row` CTAs (1 for short rows), launched as a hardware
// thread-block cluster so its CTAs share distributed shared memory ("CTA group" in kvsift's names:
// "cluster" is ClusterAttn's density cluster). CTA c of the group owns the slice
// [c * slice, (c + 1) * slice) of the row. The row is read from global
// memory once: each CTA turns its slice into order keys, keeps them in shared memory and histograms
// the top digit on the way. Each radix pass then sums the CTAs' histograms through distributed shared
// memory (DSMEM), finds the digit holding the budget-th key, and narrows the prefix; later passes and
// the output compaction read only shared memory. A slice too large for shared memory is re-read from
// global memory (L2) on every pass instead: slower, same result.
//
// Output is written in position order with no sort: every warp owns a contiguous run of the slice, so
// warp and CTA prefix counts of "key > kth" and "key == kth" give each selected position its offset,
// and the equal keys taken are the lowest-positioned ones (the tie rule).

#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>

#include <climits>
#include <cstdint>

#include "kvsift/core/dependent_launch.cuh"
#include "kvsift/ops/topk.hpp"
#include "kvsift/ops/topk_plan.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kTopkThreads = 512;
inline constexpr int kTopkWarps = kTopkThreads / 32;
inline constexpr int kTopkDigitBits = 11;
inline constexpr int kTopkBins = 1 << kTopkDigitBits;
inline constexpr int kTopkBinsPerThread = kTopkBins / kTopkThreads;  // 4: one int4 per thread
inline constexpr int kTopkLoadUnroll = 8;                            // 16-byte loads in flight per thread
static_assert(kTopkBinsPerThread == 4, "the digit search reads one int4 of bins per thread");

// Everything one launch needs: the contract's views and params and the plan. The kernel receives the
// members as separate parameters, each under 128 bytes, and rebuilds this bundle locally: nvcc reads
// a larger struct parameter through its address, which here cost registers' worth of uniform values
// and about 8% of top-k's time on the H200 (measured against the code before the split).
template <class T, class Key>
struct TopkLaunch {
  StridedView2D<const T> scores;
  TopKParams params;
  IndexSet out;
  T* values;  // optional, out.row_stride apart
  Key key;
  TopkPlan plan;
};

// The CTA group view the kernel needs. Hardware clusters exist from sm_90; a group of one CTA degenerates to
// block barriers and local pointers, which is all older GPUs are launched with.
struct TopkCtaGroup {
  int size;
  __device__ __forceinline__ void sync() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (size > 1) {
      cooperative_groups::this_cluster().sync();
      return;
    }
#endif
    __syncthreads();
  }
  template <class P>
  __device__ __forceinline__ P* peer(P* local, int rank) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (size > 1) return cooperative_groups::this_cluster().map_shared_rank(local, rank);
#endif
    (void)rank;
    return local;
  }
};

// Every kernel's forced output: the row's sink positions at the front, its recent window after the
// budget's picks (forced indices first, first + step, ... are this thread's), and the row's count from
// the one thread that has `counter`. The picks by key are each kernel's own.
template <class Emit>
__device__ __forceinline__ void topk_write_forced(const TopKRowPlan& plan, int first, int step, bool counter,
                                                  std::int32_t* count, Emit&& emit) {
  for (int f = first; f < plan.forced(); f += step) {
    if (f < plan.sink_end) emit(f, f);
    else emit(plan.sink_end + plan.budget + (f - plan.sink_end), plan.recent_begin + (f - plan.sink_end));
  }
  if (counter) *count = plan.count();
}

// Keys per thread loaded from shared memory before any is used, so a scan is not one long chain of
// dependent load -> compare -> atomic steps.
inline constexpr int kTopkScanBatch = 8;

// Calls visit(valid, position, key) for the positions [lo, hi) of a row read from global memory, with
// warp-uniform trip counts (visit may use warp collectives). With vector loads, kTopkLoadUnroll
// 16-byte loads are issued per thread before any is used, which keeps enough bytes in flight to
// stream the row at HBM speed.
template <class T, class Key, class Visit>
__device__ __forceinline__ void for_each_global_key(const TopkLaunch<T, Key>& a, const T* row_scores,
                                                    std::int64_t row, int lo, int hi, Visit&& visit) {
  constexpr int kPerVector = 16 / int(sizeof(T));
  int scalar_from = lo;
  if (a.plan.vector_loads) {
    const int first_vector = lo / kPerVector;
    const int end_vector = hi / kPerVector;  // vectors wholly below hi
    const uint4* vectors = reinterpret_cast<const uint4*>(row_scores);
    for (int base = first_vector; base < end_vector; base += kTopkThreads * kTopkLoadUnroll) {
      uint4 loaded[kTopkLoadUnroll];
#pragma unroll
      for (int u = 0; u < kTopkLoadUnroll; ++u) {
        const int v = base + u * kTopkThreads + int(threadIdx.x);
        loaded[u] = v < end_vector ? __ldg(vectors + v) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int u = 0; u < kTopkLoadUnroll; ++u) {
        const int v = base + u * kTopkThreads + int(threadIdx.x);
        const T* elems = reinterpret_cast<const T*>(&loaded[u]);
#pragma unroll
        for (int e = 0; e < kPerVector; ++e) {
          const int pos = v * kPerVector + e;
          const bool valid = v < end_vector && pos >= lo;
          visit(valid, pos, valid ? a.key(elems[e], row, pos) : typename Key::key_type(0));
        }
      }
    }
    scalar_from = end_vector * kPerVector > lo ? end_vector * kPerVector : lo;
  }
  for (int base = scalar_from; base < hi; base += kTopkThreads) {
    const int pos = base + int(threadIdx.x);
    const bool valid = pos < hi;
    visit(valid, pos, valid ? a.key(row_scores[pos], row, pos) : typename Key::key_type(0));
  }
}

template <class T, class Key>
__global__ void __launch_bounds__(kTopkThreads, 2)
    topk_radix_select_kernel(StridedView2D<const T> scores, TopKParams params, IndexSet out, T* values, Key key,
                             TopkPlan launch_plan) {
  static_assert(sizeof(scores) <= 128 && sizeof(params) <= 128 && sizeof(out) <= 128 && sizeof(key) <= 128 &&
                    sizeof(launch_plan) <= 128,
                "each kernel parameter stays under 128 bytes (see TopkLaunch)");
  wait_for_primary_grid();  // Exec::dependent_launch: the scores and row limits are earlier kernels' output
  const TopkLaunch<T, Key> a{scores, params, out, values, key, launch_plan};
  using K = typename Key::key_type;
  using BlockScan = cub::BlockScan<int, kTopkThreads>;
  extern __shared__ __align__(16) unsigned char topk_dynamic_smem[];
  K* cache = reinterpret_cast<K*>(topk_dynamic_smem);
  __shared__ __align__(16) int hist[2][kTopkBins];  // ping-pong: peers may still read the last pass's
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ int found_digit, found_above;
  __shared__ int warp_gt[kTopkWarps], warp_eq[kTopkWarps];
  __shared__ int cta_gt, cta_eq;            // read by peers through DSMEM
  __shared__ int out_base, eq_still_needed; // this CTA's first output offset; equal keys left to take
  __shared__ int peer_gt[kTopkMaxCtasPerRow], peer_eq[kTopkMaxCtasPerRow];

  const TopkCtaGroup group{a.plan.ctas_per_row};
  const int rank = int(blockIdx.x) % a.plan.ctas_per_row;
  const std::int64_t row = topk_written_row(a.params, blockIdx.x / a.plan.ctas_per_row);  // filtered rows only
  const int tid = int(threadIdx.x);
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

  // Forced ranges, spread over the whole group.
  topk_write_forced(plan, rank * kTopkThreads + tid, a.plan.ctas_per_row * kTopkThreads, rank == 0 && tid == 0,
                    a.out.counts + row, emit);

  // This CTA's part of the scored region.
  const int slice_lo = rank * a.plan.slice;
  const int lo = slice_lo > plan.sink_end ? slice_lo : plan.sink_end;
  const int slice_hi = slice_lo + a.plan.slice;
  const int hi_raw = slice_hi < plan.recent_begin ? slice_hi : plan.recent_begin;
  const int hi = hi_raw > lo ? hi_raw : lo;

  if (plan.budget == 0) return;  // the same decision in every CTA of the group: no barrier is skipped
  if (plan.budget == plan.region()) {
    for (int i = lo + tid; i < hi; i += kTopkThreads) emit(i, i);  // take the whole region, in place
    return;
  }

  // ---- radix select: find kth (the budget-th largest key) and how many keys equal to it to take ----
  constexpr int kPasses = (Key::kBits + kTopkDigitBits - 1) / kTopkDigitBits;
  K prefix = 0;  // the known top bits of kth, i.e. kth >> prev_shift
  int prev_shift = Key::kBits;
  int need = plan.budget;
#pragma unroll 1
  for (int pass = 0; pass < kPasses; ++pass) {
    const int shift = Key::kBits - kTopkDigitBits * (pass + 1) > 0 ? Key::kBits - kTopkDigitBits * (pass + 1) : 0;
    const K digit_mask = (K(1) << (prev_shift - shift)) - 1;
    int* h = hist[pass & 1];
    for (int b = tid; b < kTopkBins; b += kTopkThreads) h[b] = 0;
    __syncthreads();

    auto count = [&](bool valid, int /*pos*/, K key) {
      // Plain shared atomics: warp aggregation (ballot + reductions per element) cost more on typical
      // data than it saved on all-equal rows, where conflicting atomics merely serialize.
      if (valid && (pass == 0 || (key >> prev_shift) == prefix)) atomicAdd(h + int((key >> shift) & digit_mask), 1);
    };
    if (pass == 0 && a.plan.cached) {
      for_each_global_key(a, row_scores, row, lo, hi, [&](bool valid, int pos, K key) {
        if (valid) cache[pos - slice_lo] = key;
        count(valid, pos, key);
      });
    } else if (a.plan.cached) {
      for (int base = lo; base < hi; base += kTopkThreads * kTopkScanBatch) {
        K keys[kTopkScanBatch];
#pragma unroll
        for (int j = 0; j < kTopkScanBatch; ++j) {
          const int pos = base + j * kTopkThreads + tid;
          keys[j] = pos < hi ? cache[pos - slice_lo] : K(0);
        }
#pragma unroll
        for (int j = 0; j < kTopkScanBatch; ++j) {
          const int pos = base + j * kTopkThreads + tid;
          count(pos < hi, pos, keys[j]);
        }
      }
    } else {
      for_each_global_key(a, row_scores, row, lo, hi, count);
    }
    group.sync();

    // Sum the group's histograms. Thread t owns bins [4q, 4q + 4) with q = last - t, so an exclusive
    // scan in thread order counts the keys in higher digits.
    const int q = kTopkThreads - 1 - tid;
    // All peers' loads are issued before any is summed: one DSMEM round trip, not ctas_per_row.
    int4 peer_bins[kTopkMaxCtasPerRow];
#pragma unroll
    for (int r = 0; r < kTopkMaxCtasPerRow; ++r)
      peer_bins[r] = r < a.plan.ctas_per_row ? group.peer(reinterpret_cast<int4*>(h), r)[q] : make_int4(0, 0, 0, 0);
    int4 bins = make_int4(0, 0, 0, 0);
#pragma unroll
    for (int r = 0; r < kTopkMaxCtasPerRow; ++r) {
      bins.x += peer_bins[r].x;
      bins.y += peer_bins[r].y;
      bins.z += peer_bins[r].z;
      bins.w += peer_bins[r].w;
    }
    int above = 0;
    BlockScan(scan_storage).ExclusiveSum(bins.x + bins.y + bins.z + bins.w, above);
    const int counts[4] = {bins.w, bins.z, bins.y, bins.x};  // descending digits 4q+3 .. 4q
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (above < need && above + counts[j] >= need) {
        found_digit = 4 * q + 3 - j;
        found_above = above;
      }
      above += counts[j];
    }
    __syncthreads();
    prefix = (prefix << (prev_shift - shift)) | K(found_digit);
    need -= found_above;
    prev_shift = shift;
  }
  const K kth = prefix;  // all kBits known

  // ---- ordered compaction: warp w owns a contiguous run of [lo, hi) ----
  const int warp = tid / 32;
  const int lane = tid % 32;
  const unsigned lanes_below = (1u << lane) - 1u;
  const int per_warp = ((hi - lo + kTopkWarps - 1) / kTopkWarps + 31) / 32 * 32;
  const int warp_lo = lo + warp * per_warp < hi ? lo + warp * per_warp : hi;
  const int warp_hi = warp_lo + per_warp < hi ? warp_lo + per_warp : hi;
  auto key_at = [&](int pos) {
    return a.plan.cached ? cache[pos - slice_lo] : a.key(row_scores[pos], row, pos);
  };

  // A warp's keys of one batch, all loaded before any is compared (see kTopkScanBatch).
  auto load_batch = [&](int chunk, K (&keys)[kTopkScanBatch]) {
#pragma unroll
    for (int j = 0; j < kTopkScanBatch; ++j) {
      const int pos = chunk + 32 * j + lane;
      keys[j] = pos < warp_hi ? key_at(pos) : K(0);
    }
  };

  int gt = 0, eq = 0;
  for (int chunk = warp_lo; chunk < warp_hi; chunk += 32 * kTopkScanBatch) {
    K keys[kTopkScanBatch];
    load_batch(chunk, keys);
#pragma unroll
    for (int j = 0; j < kTopkScanBatch; ++j) {
      const bool valid = chunk + 32 * j + lane < warp_hi;
      gt += __popc(__ballot_sync(0xffffffffu, valid && keys[j] > kth));
      eq += __popc(__ballot_sync(0xffffffffu, valid && keys[j] == kth));
    }
  }
  if (lane == 0) {
    warp_gt[warp] = gt;
    warp_eq[warp] = eq;
  }
  __syncthreads();
  if (tid == 0) {
    int g = 0, e = 0;
    for (int w = 0; w < kTopkWarps; ++w) {
      const int wg = warp_gt[w], we = warp_eq[w];
      warp_gt[w] = g;  // now exclusive prefixes
      warp_eq[w] = e;
      g += wg;
      e += we;
    }
    cta_gt = g;
    cta_eq = e;
  }
  group.sync();
  if (tid < rank) {  // one thread per lower rank: the DSMEM reads overlap
    peer_gt[tid] = *group.peer(&cta_gt, tid);
    peer_eq[tid] = *group.peer(&cta_eq, tid);
  }
  __syncthreads();
  if (tid == 0) {
    // Lower ranks hold lower positions: their selections come first, their equal keys are taken first.
    int selected_before = 0, eq_before = 0;
    for (int r = 0; r < rank; ++r) {
      const int peer_take = need - eq_before;
      selected_before += peer_gt[r] + (peer_take < 0 ? 0 : (peer_take > peer_eq[r] ? peer_eq[r] : peer_take));
      eq_before += peer_eq[r];
    }
    out_base = plan.sink_end + selected_before;
    eq_still_needed = need - eq_before;
  }
  group.sync();  // publishes out_base; no CTA leaves while a peer may still read its counters

  const int eq_budget = eq_still_needed > 0 ? eq_still_needed : 0;
  int offset = out_base + warp_gt[warp] + (warp_eq[warp] < eq_budget ? warp_eq[warp] : eq_budget);
  int eq_seen = warp_eq[warp];
  for (int chunk = warp_lo; chunk < warp_hi; chunk += 32 * kTopkScanBatch) {
    K keys[kTopkScanBatch];
    load_batch(chunk, keys);
#pragma unroll
    for (int j = 0; j < kTopkScanBatch; ++j) {
      const int pos = chunk + 32 * j + lane;
      const bool valid = pos < warp_hi;
      const bool is_eq = valid && keys[j] == kth;
      const unsigned eq_lanes = __ballot_sync(0xffffffffu, is_eq);
      const bool take =
          (valid && keys[j] > kth) || (is_eq && eq_seen + __popc(eq_lanes & lanes_below) < eq_budget);
      const unsigned take_lanes = __ballot_sync(0xffffffffu, take);
      if (take) emit(offset + __popc(take_lanes & lanes_below), pos);
      offset += __popc(take_lanes);
      eq_seen += __popc(eq_lanes);
    }
  }
}

}  // namespace detail
}  // namespace kvsift
