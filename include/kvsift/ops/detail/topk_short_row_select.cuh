#pragma once
// The short-row select behind cuda::topk: one 256-thread CTA per row of up to 4096 positions, keys in
// registers (contract in ops/topk.hpp, plan in ops/topk_plan.hpp, measurements in docs/ops/topk.md,
// "The short-row select").
//
// LycheeDecode's block scores are rows of a few thousand block maxima. The candidate select took them
// through its whole machinery (a sample, a bracket, a candidate list in shared memory) for a row that
// fits in the registers of one CTA, and so spent 7 us inside the kernel on 2048 keys. Here:
//
// 1. Each thread loads its 8 or 16 keys with one or two 16-byte loads per 8 keys; warp w owns a
//    contiguous run of positions, so the output below needs no sort.
// 2. An exact radix select over the registers, 11 bits a round from the top (3 rounds for 23- to
//    33-bit keys, such as fp32 scores and LycheeDecode's block key, 2 for 16- to 22-bit ones):
//    shared-memory histogram, one block scan that finds the bin of the remaining rank. Two histograms
//    alternate, so zeroing the next is off the critical path.
// 3. The ordered output every register kernel shares (topk_reg_write_ordered): keys above the k-th
//    key, then the lowest-positioned equal ones the budget still takes.
//
// No sample, no list, no group: three histogram rounds (three block barriers each) and the output, 11
// block barriers in all for 32-bit keys.

#include <cstdint>

#include "kvsift/core/dependent_launch.cuh"
#include "kvsift/ops/detail/topk_radix_select.cuh"
#include "kvsift/ops/detail/topk_register_common.cuh"
#include "kvsift/ops/topk.hpp"
#include "kvsift/ops/topk_plan.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kTopkShortDigitBits = 11;  // one 2048-bin histogram a round
static_assert((1 << kTopkShortDigitBits) == kTopkRegBins, "a round's digit indexes the block scan's bins");

template <class T, class Key, int kKeys>
__global__ void __launch_bounds__(kTopkRegThreads)
    topk_short_row_select_kernel(StridedView2D<const T> scores, TopKParams params, IndexSet out, T* values, Key key,
                                 TopkPlan launch_plan) {
  static_assert(sizeof(scores) <= 128 && sizeof(params) <= 128 && sizeof(out) <= 128 && sizeof(key) <= 128 &&
                    sizeof(launch_plan) <= 128,
                "each kernel parameter stays under 128 bytes (see TopkLaunch)");
  wait_for_primary_grid();  // Exec::dependent_launch: the scores and row limits are earlier kernels' output
  using K = typename Key::key_type;
  static_assert(sizeof(K) == 4 || sizeof(K) == 8, "32- or 64-bit keys");
  constexpr int kKeyBits = 8 * int(sizeof(K));
  constexpr int kThreads = kTopkRegThreads;
  constexpr int kPerVector = 16 / int(sizeof(T));
  static_assert(kKeys % kPerVector == 0 && kKeys <= 32, "whole 16-byte vectors, a 32-bit mask");
  using Mask = std::uint32_t;  // one bit per key of a thread
  constexpr int kVectors = kKeys / kPerVector;
  constexpr int kWarpRun = kKeys * 32;  // contiguous positions a warp owns
  const TopkLaunch<T, Key> a{scores, params, out, values, key, launch_plan};
  __shared__ __align__(16) int hist[2][kTopkRegHistStride];
  __shared__ __align__(16) int s_scan[kTopkRegWarps];
  __shared__ TopkRankHit s_hit[2];
  __shared__ __align__(16) int s_warp_gt[kTopkRegWarps], s_warp_eq[kTopkRegWarps];

  const std::int64_t row = topk_written_row(a.params, blockIdx.x);
  const int tid = int(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const T* row_scores = a.scores.data + row * a.scores.row_stride;
  std::int32_t* row_out = a.out.indices + row * a.out.row_stride;
  T* row_values = a.values ? a.values + row * a.out.row_stride : nullptr;
  const int cols = a.plan.cols;

  // ---- one burst of loads: length, budget and the row ----
  const int len_raw = a.params.lengths ? a.params.lengths[row] : cols;
  const int k_raw = a.params.per_row_k ? a.params.per_row_k[row] : a.params.k;
  const int run_lo = warp * kWarpRun;  // this warp's positions [run_lo, run_lo + kWarpRun)
  auto load_vector = [&](int p0) { return topk_reg_load_vector(row_scores, cols, a.plan.vector_loads, p0); };
  uint4 raw[kVectors];
#pragma unroll
  for (int j = 0; j < kVectors; ++j) raw[j] = load_vector(run_lo + (j * 32 + lane) * kPerVector);
  {
    int4* const h4 = reinterpret_cast<int4*>(&hist[0][0]);
    for (int b = tid; b < kTopkRegHistStride / 4; b += kThreads) h4[b] = make_int4(0, 0, 0, 0);
  }

  const TopKRowPlan plan = plan_topk_row(cols, len_raw, k_raw, a.out.capacity, a.params.sink, a.params.recent);
  auto emit = [&](int offset, int position) {
    row_out[offset] = position;
    if (row_values) row_values[offset] = row_scores[position];
  };
  topk_write_forced(plan, tid, kThreads, tid == 0, a.out.counts + row, emit);
  if (plan.budget == 0) return;  // the whole CTA decides alike: no barrier is skipped by some threads only
  if (plan.budget == plan.region()) {  // the whole region: offsets are the positions themselves
    topk_reg_emit_region<kKeys, kPerVector>(plan, run_lo, emit);
    return;
  }
  K keys[kKeys];
  const Mask valid = topk_reg_keys<kKeys, T>(a.key, row, plan, raw, run_lo, keys);

  // ---- exact radix select of rank `budget`, 11 bits a round from the top ----
  int r = plan.budget;  // the rank still to place among the keys that match the prefix
  K prefix = 0;         // the known top bits of kth (bits above hi)
  int hi = Key::kBits;
  int buffer = 0;
  __syncthreads();  // the zeroed first histogram, before any atomic
#pragma unroll 1
  while (hi > 0) {  // uniform: hi and the hits are the same in every thread
    const int shift = hi > kTopkShortDigitBits ? hi - kTopkShortDigitBits : 0;
    const K digit_mask = (K(1) << (hi - shift)) - 1;
    int* const h = hist[buffer];
#pragma unroll
    for (int i = 0; i < kKeys; ++i) {
      // Keys off the prefix count into the dummy bin past the scanned ones: no branch per key (a
      // branch around each atomic cost ~12 instructions a key, the histogram's address among them).
      const bool match = (valid >> i & 1) && (hi >= kKeyBits ? true : (keys[i] >> hi) == prefix);
      atomicAdd(&h[match ? int((keys[i] >> shift) & digit_mask) : kTopkRegBins], 1);
    }
    // The next round's histogram: its last reader (the previous round's scan) passed a barrier since.
    if (shift > 0) {
      int4* const n4 = reinterpret_cast<int4*>(&hist[buffer ^ 1][0]);
      for (int b = tid; b < kTopkRegHistStride / 4; b += kThreads) n4[b] = make_int4(0, 0, 0, 0);
    }
    __syncthreads();
    // r lies in [1, matching keys], so the hit is always written (no reset of s_hit between rounds).
    topk_reg_find(h, nullptr, [&](int) { return make_int2(r, 0); }, s_scan, s_hit);
    const TopkRankHit found = s_hit[0];
    prefix = (prefix << (hi - shift)) | K(found.bin);
    r -= found.above;
    hi = shift;
    buffer ^= 1;
  }
  // prefix is the k-th key; r of the keys equal to it are taken (the lowest-positioned ones).

  // ---- ordered output ----
  topk_reg_write_ordered<kKeys, kPerVector>(keys, valid, prefix, r, 0, 0, plan.sink_end, run_lo, s_warp_gt, s_warp_eq,
                                            emit);
}

}  // namespace detail
}  // namespace kvsift
