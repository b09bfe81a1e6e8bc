#pragma once
// The register select behind cuda::topk for a few long rows (contract in ops/topk.hpp, plan in
// ops/topk_plan.hpp, design and measurements in docs/ops/topk.md, "The register select").
//
// The candidate select's few-row time was a chain of group-wide rounds, each waiting for the slowest
// CTA of the group, and block-wide steps over 512 threads that cost their instructions four times
// per scheduler. This kernel keeps one group-wide exchange on ordinary rows:
//
// 1. Every CTA (256 or 512 threads, up to 16 per row: a non-portable cluster size on sm_90) loads its
//    slice into registers (kKeys keys a thread) and, in the same burst, the whole row's sample itself:
//    256 runs of 8 keys spread over the row (kTopkRegSamples keys, one 32-byte sector a run, drawn by
//    threads 0-255), mostly from L2. No CTA waits for a peer to publish its share of the sample.
// 2. From the sample, each CTA finds the same bracket [bottom, top] (two 11-bit rounds of a radix
//    select for the two sample ranks that end it, topk_bracket_ranks), counts its keys above the top
//    and lists the keys inside.
// 3. One group barrier. Each CTA reads the peers' two counts. If the budget-th key lies inside the
//    bracket and the lists fit, it copies the whole group's list (a few thousand keys) and finishes
//    the selection alone: an 11-bit radix select over the copy, with block barriers only. The lower
//    ranks' counts of keys above and at the k-th key, which the ordered output needs, come from the
//    peers' counts and their part of the copy.
// 4. Otherwise (a bracket the row's structure misleads, a row of equal keys) the exact search runs
//    instead: 8-bit digit passes over the keys in registers, one group barrier each, then one more
//    exchange of the lower ranks' counts. Same bits either way; a miss costs time only.
// 5. Ordered output: every warp owns a contiguous run of the slice; ballot prefix sums place the
//    keys above the k-th key and the lowest-positioned equal keys the budget still takes.
//
// A CTA leaves only after every peer has finished reading its shared memory (a split cluster
// barrier: arrive after the last remote read, wait at exit).
//
// With score candidates (ScoreKey<float> rows, ops/score_candidates.hpp), every CTA first reads the
// row's list header and counts with its loads; where the list holds the budget, rank 0 selects from it
// alone (ops/detail/topk_score_candidates.cuh) and the peers leave before step 2. Either way rank 0
// writes the row's next threshold: from the list's search, or from the bracket (its bottom listed
// about the budget and a few thousand more keys), or NaN after the exact search.

#include <cooperative_groups.h>

#include <cstdint>
#include <type_traits>

#include "kvsift/core/dependent_launch.cuh"
#include "kvsift/ops/detail/topk_bracket.hpp"
#include "kvsift/ops/detail/topk_radix_select.cuh"
#include "kvsift/ops/detail/topk_register_common.cuh"
#include "kvsift/ops/detail/topk_score_candidates.cuh"
#include "kvsift/ops/topk.hpp"
#include "kvsift/ops/topk_plan.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kTopkRegExactBits = 8;  // the exact search's digits: threads 0-255 own a bin each
inline constexpr int kTopkRegRunKeys = 8;    // the sample: runs of 8 keys (one 32-byte sector)
inline constexpr int kTopkRegSampleRuns = kTopkRegSamples / kTopkRegRunKeys;  // drawn by threads 0-255
static_assert((1 << kTopkRegExactBits) == kTopkRegSampleRuns && kTopkRegSampleRuns <= kTopkRegThreads,
              "threads 0-255 draw a sample run and own an exact-search bin each");

// The shared::cluster address of `local` (this CTA's shared memory) in the CTA of rank `rank`.
__device__ __forceinline__ std::uint32_t topk_reg_peer_address(const void* local, int rank) {
  std::uint32_t address;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(address)
               : "r"(std::uint32_t(__cvta_generic_to_shared(local))), "r"(rank));
  return address;
}

// Loads 16 bytes of a peer CTA's shared memory through its shared::cluster address.
__device__ __forceinline__ uint4 topk_reg_load_peer(std::uint32_t address) {
  uint4 v;
  asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(address)
               : "memory");
  return v;
}

/// Whether a key policy has a value it never produces, which the register select pads its lists
/// with: any key narrower than 32 bits (2^kBits), ScoreKey<float> (all ones: NaN maps to 0, +inf to
/// 0xff800000) and FlagFirstNonNegativeKey (all ones: its largest key is 0xff800001). Other 32-bit
/// policies take the other kernels.
template <class T, class Key>
inline constexpr bool kTopkRegHasSentinel =
    sizeof(typename Key::key_type) == 4 &&
    (Key::kBits < 32 || std::is_same_v<Key, ScoreKey<float>> || std::is_same_v<Key, FlagFirstNonNegativeKey>);

// kListing: the instantiation that reads score candidates (fp32 rows under ScoreKey<float> whose call
// gives them); the others hold none of that code, which cost the full search 1.4-2.7% when compiled in.
template <class T, class Key, int kKeys, int kThreads, bool kListing = false>
__global__ void __launch_bounds__(kThreads, 1)
    topk_register_select_kernel(StridedView2D<const T> scores, TopKParams params, IndexSet out, T* values, Key key,
                                TopkPlan launch_plan) {
  static_assert(sizeof(scores) <= 128 && sizeof(params) <= 128 && sizeof(out) <= 128 && sizeof(key) <= 128 &&
                    sizeof(launch_plan) <= 128,
                "each kernel parameter stays under 128 bytes (see TopkLaunch)");
  wait_for_primary_grid();  // Exec::dependent_launch: the scores and row limits are earlier kernels' output
  using K = typename Key::key_type;
  static_assert(sizeof(K) == 4, "the register select takes 32-bit keys (the plan sends wider ones elsewhere)");
  static_assert(kTopkRegCtaSize<kThreads>, "256 or 512 threads");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // the plan picks this kernel only where clusters exist (sm_90+)
#else
  // Declared past the sm_80 stub, which uses none of them (no unused-variable warnings there).
  constexpr int kWarps = kThreads / 32;
  constexpr int kRuns = kTopkRegSampleRuns;  // sample runs, one for each of threads 0 .. kRuns - 1
  constexpr int kPerVector = 16 / int(sizeof(T));
  static_assert(kKeys % kPerVector == 0 && kPerVector <= 8 && kKeys <= 32, "whole 16-byte vectors, a 32-bit mask");
  using Mask = std::uint32_t;  // one bit per key of a thread
  constexpr int kVectors = kKeys / kPerVector;
  constexpr int kWarpRun = kKeys * 32;  // contiguous positions a warp owns
  constexpr int kRunVectors = kTopkRegRunKeys / kPerVector;  // 16-byte vectors in one sample run
  constexpr int kExactPasses = (Key::kBits + kTopkRegExactBits - 1) / kTopkRegExactBits;
  static_assert(kExactPasses <= 4, "the exact search's four 256-bin buffers");
  static_assert(kTopkRegHasSentinel<T, Key>, "the plan takes the register select only for keys with a sentinel");
  // Pads the lists to whole 16-byte vectors; above every key the bracket can hold (top < kSentinel).
  constexpr K kSentinel = Key::kBits < 32 ? K(1) << Key::kBits : ~K(0);
  constexpr int kDummy = kTopkRegBins;  // the bin masked-off keys count into (never scanned)
  const TopkLaunch<T, Key> a{scores, params, out, values, key, launch_plan};
  namespace cg = cooperative_groups;
  const cg::cluster_group group = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char topk_dynamic_smem[];
  // The group's copied list first (16-byte aligned), then this CTA's own list (read by the peers).
  K* const list_all = reinterpret_cast<K*>(topk_dynamic_smem);
  K* const list_own = list_all + a.plan.bracket_capacity;
  __shared__ __align__(16) int hist[3][kTopkRegHistStride];
  __shared__ __align__(16) int s_scan[kWarps];
  __shared__ TopkRankHit s_hit[2];
  __shared__ int s_listed, s_above;         // published to the peers before the group barrier
  __shared__ int s_gt_local, s_eq_local;    // published by the exact search's last exchange
  __shared__ int s_offsets[kTopkRegMaxGroup + 1];          // each peer's first vector in the copy
  __shared__ std::uint32_t s_peer_list[kTopkRegMaxGroup];  // each peer's list, shared::cluster address
  __shared__ __align__(16) int s_warp_gt[kWarps], s_warp_eq[kWarps];
  __shared__ int s_listed_sums[2 * kWarps];

  const int group_size = a.plan.ctas_per_row;
  const int rank = int(group.block_rank());
  const std::int64_t row = topk_written_row(a.params, blockIdx.x / group_size);
  const int tid = int(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const T* row_scores = a.scores.data + row * a.scores.row_stride;
  std::int32_t* row_out = a.out.indices + row * a.out.row_stride;
  T* row_values = a.values ? a.values + row * a.out.row_stride : nullptr;
  const int cols = a.plan.cols;

  // ---- one burst of loads: length, budget, the slice and the row's sample ----
  const int len_raw = a.params.lengths ? a.params.lengths[row] : cols;
  const int k_raw = a.params.per_row_k ? a.params.per_row_k[row] : a.params.k;
  const int run_lo = rank * a.plan.slice + warp * kWarpRun;  // this warp's positions [run_lo, run_lo + kWarpRun)
  auto load_vector = [&](int p0) { return topk_reg_load_vector(row_scores, cols, a.plan.vector_loads, p0); };
  // Score candidates: the list's header and counts, and the threshold it was made with, in the burst.
  constexpr bool kListed = kListing && std::is_same_v<T, float> && std::is_same_v<Key, ScoreKey<float>>;
  const ScoreCandidates& cand = a.params.candidates;
  const bool listing = kListed && cand.enabled();
  TopkListedLoad<kThreads> listed_load{};
  float listed_used = NAN;
  if (listing) {
    listed_load = topk_listed_load<kThreads>(cand, row);
    const float t = cand.thresholds[row];
    listed_used = t > -INFINITY ? t : NAN;  // as the pass reads it (candidate_segment)
  }
  // The sample: thread t's run of 8 keys at t * run_stride (t < 256), spread over the view's columns
  // and drawn before the length is known (samples outside the scored region are dropped). One 32-byte
  // sector a run: a CTA's 256 runs cost it 256 sector reads, where 2048 single keys cost 2048.
  const bool sampler = kRuns == kThreads || tid < kRuns;
  const int run_stride = (cols + kRuns - 1) / kRuns / kTopkRegRunKeys * kTopkRegRunKeys +
                         ((cols + kRuns - 1) / kRuns % kTopkRegRunKeys ? kTopkRegRunKeys : 0);
  uint4 raw[kVectors];
#pragma unroll
  for (int j = 0; j < kVectors; ++j) raw[j] = load_vector(run_lo + (j * 32 + lane) * kPerVector);
  uint4 sampled[kRunVectors];
#pragma unroll
  for (int j = 0; j < kRunVectors; ++j)
    sampled[j] = sampler ? load_vector(tid * run_stride + j * kPerVector) : make_uint4(0, 0, 0, 0);
  {
    int4* const h4 = reinterpret_cast<int4*>(&hist[0][0]);
    for (int b = tid; b < 3 * kTopkRegHistStride / 4; b += kThreads) h4[b] = make_int4(0, 0, 0, 0);
  }
  if (tid == 0) {
    s_listed = 0;
    s_above = 0;
  }

  const TopKRowPlan plan = plan_topk_row(cols, len_raw, k_raw, a.out.capacity, a.params.sink, a.params.recent);
  auto emit = [&](int offset, int position) {
    row_out[offset] = position;
    if (row_values) row_values[offset] = row_scores[position];
  };
  topk_write_forced(plan, rank * kThreads + tid, group_size * kThreads, rank == 0 && tid == 0, a.out.counts + row, emit);
  // Same decision in every CTA of the group (it depends on the row only), before any group barrier.
  // A list is never left for a later call: its tag is cleared here too (nobody reads the header then).
  if (listing && rank == 0 && tid == 0 && (plan.budget == 0 || plan.budget == plan.region()))
    cand.counts[row * cand.count_stride] = 0;
  if (plan.budget == 0) return;
  auto in_region = [&](int pos) { return pos >= plan.sink_end && pos < plan.recent_begin; };
  if (plan.budget == plan.region()) {  // the whole region: offsets are the positions themselves
    topk_reg_emit_region<kKeys, kPerVector>(plan, run_lo, emit);
    return;
  }
  if constexpr (kListed) {
    if (listing) {
      const int capacity = topk_listed_capacity(a.plan.smem_bytes, cols);
      const TopkListed listed = topk_candidates_suffice<kThreads>(listed_load, cand, plan, capacity, s_listed_sums);
      group.sync();  // every CTA has read the header before rank 0 clears its tag
      if (listed.usable) {
        if (rank == 0) {
          const TopkListedKth f = topk_select_listed<kThreads, T>(
              listed_load, listed, cand.positions + row * a.scores.row_stride, row, row_scores, a.key, plan, cols,
              capacity, topk_dynamic_smem, hist, s_scan, s_hit, &s_listed, emit);
          if (tid == 0) topk_candidates_next(cand, row, f.kth, listed_used, f.listed, plan.budget);
        }
        return;
      }
    }
  }
  K keys[kKeys];
  const Mask valid = topk_reg_keys<kKeys, T>(a.key, row, plan, raw, run_lo, keys);

  // ---- the bracket, from the sample (every CTA finds the same one) ----
  // A short scored region (under half the columns: ragged rows) samples the region itself instead, with
  // single keys at a stride (the positions depend on the length, so these loads wait for it).
  K sample_keys[kTopkRegRunKeys];
  std::uint32_t sample_valid = 0;
  if (!sampler) {
#pragma unroll
    for (int e = 0; e < kTopkRegRunKeys; ++e) sample_keys[e] = K(0);
  } else if (plan.region() * 2 >= cols) {
#pragma unroll
    for (int e = 0; e < kTopkRegRunKeys; ++e) {
      const int pos = tid * run_stride + e;
      const bool in = in_region(pos);
      sample_valid |= std::uint32_t(in) << e;
      sample_keys[e] = in ? a.key(reinterpret_cast<const T*>(sampled)[e], row, pos) : K(0);
    }
  } else {
    const TopkBracketSample sample = topk_bracket_sample(plan, kTopkRegSamples);
#pragma unroll
    for (int e = 0; e < kTopkRegRunKeys; ++e) {
      const int j = e * kRuns + tid;
      const int pos = sample.first + j * sample.stride;
      const bool in = j < sample.count;
      sample_valid |= std::uint32_t(in) << e;
      sample_keys[e] = in ? a.key(row_scores[pos], row, pos) : K(0);
    }
  }
  constexpr int kShift1 = Key::kBits > 11 ? Key::kBits - 11 : 0;
  constexpr int kShift2 = Key::kBits > 22 ? Key::kBits - 22 : 0;
  K top = kSentinel - 1, bottom = 0;  // no end found: every key (the padding stays above the top)
  {
    if (tid == 0) {
      s_hit[0] = TopkRankHit{-1, 0};
      s_hit[1] = TopkRankHit{-1, 0};
    }
    __syncthreads();  // the zeroed histograms and list counters, before the first atomics
    if (sampler) {
#pragma unroll
      for (int e = 0; e < kTopkRegRunKeys; ++e)
        atomicAdd(&hist[0][sample_valid >> e & 1 ? int(sample_keys[e] >> kShift1) : kDummy], 1);
    }
    __syncthreads();
    // The ends' sample ranks come from the sample's size, the histogram's total (0: no end there).
    int ra = 0, rb = 0;
    topk_reg_find<kThreads>(hist[0], nullptr,
                  [&](int count) {
                    const TopkBracketRanks r = topk_bracket_ranks(plan.budget, plan.region(), count);
                    ra = r.above >= 1 ? r.above : 0;
                    rb = r.below <= count ? r.below : 0;
                    return make_int2(ra, rb);
                  },
                  s_scan, s_hit);
    const TopkRankHit ha = s_hit[0], hb = s_hit[1];
    if (kShift1 == 0) {
      if (ha.bin >= 0) top = K(ha.bin);
      if (hb.bin >= 0) bottom = K(hb.bin);
    } else {
      // Second round: the next bits of the samples in each end's bin, each end its own histogram.
      if (sampler) {
#pragma unroll
        for (int e = 0; e < kTopkRegRunKeys; ++e) {
          const int bin = int(sample_keys[e] >> kShift1);
          const int digit = int(sample_keys[e] >> kShift2) & ((1 << (kShift1 - kShift2)) - 1);
          atomicAdd(&hist[1][(sample_valid >> e & 1) && bin == ha.bin ? digit : kDummy], 1);
          atomicAdd(&hist[2][(sample_valid >> e & 1) && bin == hb.bin ? digit : kDummy], 1);
        }
      }
      __syncthreads();  // also: every thread has read s_hit before it is rewritten
      if (tid == 0) {
        s_hit[0] = TopkRankHit{-1, 0};
        s_hit[1] = TopkRankHit{-1, 0};
      }
      __syncthreads();
      const int ra2 = ha.bin >= 0 ? ra - ha.above : 0, rb2 = hb.bin >= 0 ? rb - hb.above : 0;
      topk_reg_find<kThreads>(hist[1], hist[2], [&](int) { return make_int2(ra2, rb2); }, s_scan, s_hit);
      const TopkRankHit ha2 = s_hit[0], hb2 = s_hit[1];
      // The top of the upper end's bin and the bottom of the lower end's, at 22-bit resolution.
      if (ha.bin >= 0 && ha2.bin >= 0) {
        const K prefix = (K(ha.bin) << (kShift1 - kShift2)) | K(ha2.bin);
        top = kShift2 == 0 ? prefix : ((prefix << kShift2) | ((K(1) << kShift2) - 1));
      }
      if (hb.bin >= 0 && hb2.bin >= 0) bottom = ((K(hb.bin) << (kShift1 - kShift2)) | K(hb2.bin)) << kShift2;
    }
  }
  if (top < bottom) top = bottom;  // cannot happen for ranks above < below; keeps the list well formed

  // ---- count above the bracket, list inside it (one shared atomic per warp) ----
  {
    const K span = K(top - bottom);  // inside: bottom <= key <= top, one unsigned compare
    const Mask above_bits = topk_reg_key_mask(keys, [&](K x) { return x > top; }) & valid;
    const Mask inside = topk_reg_key_mask(keys, [&](K x) { return K(x - bottom) <= span; }) & valid;
    const int listed = __popc(inside);
    const int incl = topk_reg_warp_scan(listed);
    int base = 0;
    if (lane == 31) base = atomicAdd(&s_listed, incl);
    base = __shfl_sync(0xffffffffu, base, 31) + incl - listed;
    // A thread whose keys pass the capacity leaves them out: the CTA's count then says the list
    // overflowed, and an overflowing list is never read (the exact search runs instead).
    if (base + listed <= a.plan.list_capacity) {
      K* out_list = list_own + base;
#pragma unroll
      for (int i = 0; i < kKeys; ++i)
        if (inside >> i & 1) *out_list++ = keys[i];
    }
    const int warp_above = __reduce_add_sync(0xffffffffu, __popc(above_bits));
    if (lane == 0 && warp_above) atomicAdd(&s_above, warp_above);
  }
  // The finish's histograms start zeroed: the bracket's rounds are done with them (after a barrier).
  __syncthreads();
  if (tid < 3 && s_listed + tid < a.plan.list_capacity && (s_listed + tid) % 4 != 0)
    list_own[s_listed + tid] = kSentinel;  // whole vectors: the peers copy 16 bytes at a time
  {
    int4* const h4 = reinterpret_cast<int4*>(&hist[0][0]);
    for (int b = tid; b < 3 * kTopkRegHistStride / 4; b += kThreads) h4[b] = make_int4(0, 0, 0, 0);
  }
  group.sync();  // the group barrier: every CTA's counts and list are published

  // ---- every warp reads the peers' counts (lane r: peer r) ----
  const int peer_listed = lane < group_size ? *group.map_shared_rank(&s_listed, lane) : 0;
  const int peer_above = lane < group_size ? *group.map_shared_rank(&s_above, lane) : 0;
  const int peer_vectors = (peer_listed + 3) / 4;  // each peer's list in whole 16-byte vectors
  // Each peer's first vector in the copy: the exclusive prefix over the peers (lanes).
  const int list_offset = topk_reg_warp_scan(peer_vectors) - peer_vectors;
  const int above_total = __reduce_add_sync(0xffffffffu, peer_above);
  const int listed_total = __reduce_add_sync(0xffffffffu, peer_listed);
  const int vectors_total = __reduce_add_sync(0xffffffffu, peer_vectors);
  const int above_lower = __reduce_add_sync(0xffffffffu, lane < rank ? peer_above : 0);
  const bool overflow = __any_sync(0xffffffffu, peer_listed > a.plan.list_capacity - 3);
  const bool hit = !overflow && vectors_total * 4 <= a.plan.bracket_capacity && above_total < plan.budget &&
                   plan.budget <= above_total + listed_total;

  K kth = 0;
  int ties = 0;  // keys equal to kth the budget takes, in position order, across the row
  int gt_lower = 0, eq_lower = 0;
  if (hit) {
    // ---- copy the group's lists (whole vectors, padded), in rank order, then finish alone ----
    const int my_vector = __shfl_sync(0xffffffffu, list_offset, rank);
    if (warp == 0) {
      if (lane <= group_size) s_offsets[lane] = lane < group_size ? list_offset : vectors_total;
      if (lane < group_size)
        s_peer_list[lane] = topk_reg_peer_address(list_own, lane);
    }
    __syncthreads();
    uint4* const all4 = reinterpret_cast<uint4*>(list_all);
    constexpr int kBatch = 4;
#pragma unroll 1
    for (int v0 = 0; v0 < vectors_total; v0 += kThreads * kBatch) {
      uint4 got[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int v = v0 + u * kThreads + tid;
        // The owning peer (offsets ascend; binary search over group_size <= 16 of them).
        int owner = 0;
#pragma unroll
        for (int step = kTopkRegMaxGroup / 2; step > 0; step /= 2)
          if (owner + step < group_size && s_offsets[owner + step] <= v) owner += step;
        if (v < vectors_total) got[u] = topk_reg_load_peer(s_peer_list[owner] + 16u * std::uint32_t(v - s_offsets[owner]));
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (v0 + u * kThreads + tid < vectors_total) all4[v0 + u * kThreads + tid] = got[u];
    }
    __cluster_barrier_arrive();  // done reading the peers' shared memory
    __syncthreads();
    // Radix select of rank r = budget - above_total over the copy, on keys relative to the bracket's
    // bottom; the padding (kSentinel, above the top) is never counted.
    int gt_in_list = 0;
    kth = topk_reg_list_kth<kThreads>(all4, vectors_total, bottom, top, plan.budget - above_total, hist, s_scan, s_hit,
                                      &gt_in_list);
    ties = plan.budget - above_total - gt_in_list;
    // The lower ranks' keys above and at kth: their counts above the bracket and their part of the copy.
    int gl = 0, el = 0;
#pragma unroll 1
    for (int v = tid; v < my_vector; v += kThreads) {
      const uint4 q = all4[v];
      const K k4[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        gl += k4[e] > kth && k4[e] <= top;
        el += k4[e] == kth;
      }
    }
    int packed = 0;
    topk_reg_scan<kThreads>(gl | el << 16, s_scan, &packed);  // under 2^16 keys: no carry
    gt_lower = above_lower + (packed & 0xffff);
    eq_lower = packed >> 16;
  } else {
    // ---- the exact search: 8-bit digit passes over the group's keys in registers ----
    int r = plan.budget;
    K prefix = 0;
    int* const exact = &hist[0][0];  // four 256-bin buffers, one per pass (zeroed before the barrier)
#pragma unroll 1
    for (int pass = 0; pass < kExactPasses; ++pass) {
      const int hi = Key::kBits - pass * kTopkRegExactBits;
      const int shift = hi > kTopkRegExactBits ? hi - kTopkRegExactBits : 0;
      int* h = exact + pass * 256;
#pragma unroll
      for (int i = 0; i < kKeys; ++i) {
        const bool match = (valid >> i & 1) && (hi >= 32 ? K(0) : keys[i] >> hi) == prefix;
        const int bin = match ? int(keys[i] >> shift) & ((1 << (hi - shift)) - 1) : -1;
        // Equal bins of a warp take one atomic (rows of mostly equal keys would serialize on one address).
        const unsigned same = __match_any_sync(0xffffffffu, bin);
        if (bin >= 0 && lane == __ffs(int(same)) - 1) atomicAdd(&h[bin], __popc(same));
      }
      group.sync();
      // Thread t < 256 owns bin 255 - t: descending thread order is descending bin order.
      int count = 0;
      if (kThreads == 256 || tid < 256)  // folds away in 256-thread CTAs
        for (int p = 0; p < group_size; ++p) count += group.map_shared_rank(h, p)[255 - tid];
      int unused = 0;
      const int ex = topk_reg_scan<kThreads>(count, s_scan, &unused);
      if (ex < r && ex + count >= r) s_hit[0] = TopkRankHit{255 - tid, ex};
      __syncthreads();
      const TopkRankHit found = s_hit[0];
      prefix = (prefix << (hi - shift)) | K(found.bin);
      r -= found.above;
      __syncthreads();  // s_hit and s_scan are rewritten by the next pass
    }
    kth = prefix;
    ties = r;
    int gt = 0, eq = 0;
#pragma unroll
    for (int i = 0; i < kKeys; ++i) {
      gt += (valid >> i & 1) && keys[i] > kth;
      eq += (valid >> i & 1) && keys[i] == kth;
    }
    gt = __reduce_add_sync(0xffffffffu, gt);
    eq = __reduce_add_sync(0xffffffffu, eq);
    if (tid == 0) {
      s_gt_local = 0;
      s_eq_local = 0;
    }
    __syncthreads();
    if (lane == 0) {
      atomicAdd(&s_gt_local, gt);
      atomicAdd(&s_eq_local, eq);
    }
    group.sync();
    const int peer_gt = lane < rank ? *group.map_shared_rank(&s_gt_local, lane) : 0;
    const int peer_eq = lane < rank ? *group.map_shared_rank(&s_eq_local, lane) : 0;
    gt_lower = __reduce_add_sync(0xffffffffu, peer_gt);
    eq_lower = __reduce_add_sync(0xffffffffu, peer_eq);
    __cluster_barrier_arrive();  // done reading the peers' shared memory
  }

  if constexpr (kListed) {
    // The next threshold: the bracket's bottom listed above_total + listed_total region keys (a hit);
    // the exact search gives none (NaN: the next pass lists nothing and this search runs again).
    if (listing && rank == 0 && tid == 0)
      topk_candidates_next(cand, row, std::uint32_t(kth), hit ? float_order_threshold(std::uint32_t(bottom)) : NAN,
                           above_total + listed_total, plan.budget);
  }
  // ---- ordered output: warp counts, one barrier, then each warp writes its run in order ----
  topk_reg_write_ordered<kKeys, kPerVector, kThreads>(keys, valid, kth, ties, gt_lower, eq_lower, plan.sink_end, run_lo, s_warp_gt,
                                            s_warp_eq, emit);
  __cluster_barrier_wait();  // no CTA leaves while a peer may still read its shared memory
#endif
}

}  // namespace detail
}  // namespace kvsift
