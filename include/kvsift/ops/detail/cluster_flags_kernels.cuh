#pragma once
// The kernels behind cuda::cluster_flags (contract in cluster_flags.hpp, scratch in cluster_flags_plan.hpp):
//   1. a warp per block of a row (a thread per block under 32 tokens): its maximum and argmax -> the
//      block's centre (or -1), and a count of the row's centres (integer atomics: the count is exact
//      whatever the order);
//   2. a run of kClusterFlagRun tokens per thread: each flagged when a centre within the radius
//      exists (looks only at the blocks that can reach it).

#include <cstdint>

#include "kvsift/core/strided_view.hpp"
#include "kvsift/ops/cluster_flags.hpp"
#include "kvsift/ops/cluster_flags_plan.hpp"

namespace kvsift {
namespace detail {

// Everything both launches need, passed once by value: the contract's views and params and the
// carved scratch (within 128 bytes: detail/window_scores_common.cuh says why).
struct ClusterFlagsLaunch {
  StridedView2D<const float> scores;
  const std::int32_t* row_lengths;
  ClusterParams params;
  StridedView2D<std::uint8_t> flags;
  ClusterFlagsScratch scratch;
};
static_assert(sizeof(ClusterFlagsLaunch) <= 128, "kernel parameter structs stay within 128 bytes");

// Whether the radius depends on the row's number of centres (cluster_radius): only then are they
// counted (and the counts zeroed before the centres kernel).
__host__ __device__ __forceinline__ bool cluster_counts_centres(const ClusterParams& p) {
  return p.radius_rule == RadiusRule::kBudgetBlocks;
}

// One block's verdict: its centre (the lowest position of its maximum) when that maximum passes theta,
// else -1; every centre counts once in the row's total when the radius needs it.
__device__ __forceinline__ void write_cluster_centre(const ClusterFlagsLaunch& launch, std::int64_t r, int k, int arg, float m) {
  const bool centre = arg >= 0 && m > launch.params.theta;
  launch.scratch.centres[r * launch.scores.cols + k] = centre ? arg : -1;
  if (centre && cluster_counts_centres(launch.params)) atomicAdd(launch.scratch.counts + r, 1);
}

// Blocks of a row, grid-strided over (gridDim.x, row = blockIdx.y). Blocks of 32 tokens or more take a
// warp each: the lanes read the block coalesced, each scans its stride (argmax_step), and a butterfly
// of argmax_merge over the lanes gives the sequential scan's answer (cluster_flags.hpp; the host test
// replays the butterfly). Shorter blocks take a thread each (the sequential scan itself). Why: a
// thread scanning a block of n / num_block scores (1,024 at 128K) alone, its neighbours a block away,
// read one sector per score and took 83 us of ClusterAttn's 587 (B=1, 128K, H200).
template <class Unused = void>
__global__ void cluster_centres_kernel(ClusterFlagsLaunch launch) {
  const StridedView2D<const float>& scores = launch.scores;
  const std::int64_t r = blockIdx.y;
  const int n = clamp_row_length(launch.row_lengths, r, scores.cols);
  if (n == 0) return;
  const int block = cluster_block_size(launch.params, n), blocks = (n + block - 1) / block;
  const float* row = scores.row(r);
  if (block < 32) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < blocks; k += gridDim.x * blockDim.x) {
      float m;
      const int arg = block_argmax(row, n, block, k, &m);
      write_cluster_centre(launch, r, k, arg, m);
    }
    return;
  }
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int k = blockIdx.x * warps + int(threadIdx.x / 32); k < blocks; k += gridDim.x * warps) {
    const int lo = k * block, hi = min(lo + block, n);
    float m = -INFINITY;
    int arg = -1;
    for (int t = lo + lane; t < hi; t += 32) argmax_step(row[t], t, m, arg);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
      const float om = __shfl_xor_sync(0xffffffffu, m, off);
      const int oa = __shfl_xor_sync(0xffffffffu, arg, off);
      argmax_merge(om, oa, m, arg);
    }
    if (lane == 0) write_cluster_centre(launch, r, k, arg, m);
  }
}

// Tokens one thread flags: a run of consecutive positions. Why: with a thread per token, every thread
// paid the row's length and centre-count loads, then its centres' (one L2 round trip each, in series),
// and 1M tokens (B=1, 128K, 8 heads) took four waves of the GPU: 9.4 us of ClusterAttn's 587 (H200).
// A run's tokens share their blocks' centres, so after the first token's loads the others hit L1, and
// a wave covers 8x the tokens.
inline constexpr int kClusterFlagRun = 8;
inline constexpr int kClusterFlagThreads = 256;

// Flags of a row, grid (ceil(cols / (kClusterFlagThreads x kClusterFlagRun)), rows): thread i of CTA x
// takes tokens [8 (x kClusterFlagThreads + i), + 8). A token is flagged when a centre within the radius
// exists (near_centre looks only at the blocks that can reach it). A template, so the header-only
// definition is inline across translation units.
template <class Unused = void>
__global__ void cluster_flags_kernel(ClusterFlagsLaunch launch) {
  const std::int64_t cols = launch.scores.cols;
  const ClusterParams& p = launch.params;
  const std::int64_t r = blockIdx.y;
  const int n = clamp_row_length(launch.row_lengths, r, cols);
  const int j0 = (blockIdx.x * kClusterFlagThreads + int(threadIdx.x)) * kClusterFlagRun;
  if (j0 >= n) return;
  const int block = cluster_block_size(p, n), blocks = (n + block - 1) / block;
  const int radius = cluster_radius(p, block, cluster_counts_centres(p) ? launch.scratch.counts[r] : 0);
  const std::int32_t* centres = launch.scratch.centres + r * cols;
  std::uint8_t f[kClusterFlagRun];
#pragma unroll
  for (int i = 0; i < kClusterFlagRun; ++i) f[i] = j0 + i < n && near_centre(centres, blocks, block, j0 + i, p, radius);
  std::uint8_t* out = launch.flags.row(r) + j0;
  if (j0 <= n - kClusterFlagRun && reinterpret_cast<std::uintptr_t>(out) % 8 == 0) {  // one 8-byte store
    std::uint64_t word = 0;
#pragma unroll
    for (int i = 0; i < kClusterFlagRun; ++i) word |= std::uint64_t(f[i]) << (8 * i);
    *reinterpret_cast<std::uint64_t*>(out) = word;
  } else {
#pragma unroll
    for (int i = 0; i < kClusterFlagRun; ++i)
      if (j0 + i < n) out[i] = f[i];
  }
}

}  // namespace detail
}  // namespace kvsift
