#pragma once
// The kernels behind cuda::cluster_flags (contract in cluster_flags.hpp, scratch in cluster_flags_plan.hpp):
//   1. a warp per block of a row (a thread per block under 32 tokens): its maximum and argmax -> the
//      block's centre (or -1), and a count of the row's centres (integer atomics: the count is exact
//      whatever the order);
//   2. a run of kClusterFlagRun tokens per thread: each flagged when a centre within the radius
//      exists (looks only at the blocks that can reach it).

#include <cstdint>

#include "kvsift/core/dependent_launch.cuh"
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
inline constexpr int kCentreLoads = 16;  // loads a lane keeps in flight in cluster_centres_kernel

template <class Unused = void>
__global__ void cluster_centres_kernel(ClusterFlagsLaunch launch) {
  dependent_kernel_start();  // Exec::dependent_launch
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
    // kCentreLoads loads a lane in flight before any is used: one lane's positions ascend, as
    // argmax_step needs. (A loop of one load and its step waited out one L2 round trip a 32 scores:
    // 32 in series for the 1,024-token blocks of 128K / 128.)
    for (int base = lo; base < hi; base += 32 * kCentreLoads) {
      float x[kCentreLoads];
#pragma unroll
      for (int i = 0; i < kCentreLoads; ++i) {
        const int t = base + lane + 32 * i;
        x[i] = t < hi ? row[t] : 0.f;
      }
#pragma unroll
      for (int i = 0; i < kCentreLoads; ++i) {
        const int t = base + lane + 32 * i;
        if (t < hi) argmax_step(x[i], t, m, arg);
      }
    }
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
// A run's tokens share their blocks' centres, so one walk over the blocks that can reach any of them
// flags the whole run: two integer divisions a run (near_centre per token took 16, ~500 of the
// kernel's instructions a thread).
inline constexpr int kClusterFlagRun = 8;
inline constexpr int kClusterFlagThreads = 256;

// Bits [lo, hi) of a run's mask, lo and hi clamped to [0, kClusterFlagRun].
__device__ __forceinline__ unsigned cluster_run_bits(std::int64_t lo, std::int64_t hi) {
  const int a = int(lo < 0 ? 0 : lo > kClusterFlagRun ? kClusterFlagRun : lo);
  const int b = int(hi < 0 ? 0 : hi > kClusterFlagRun ? kClusterFlagRun : hi);
  return a < b ? ((1u << b) - 1u) & ~((1u << a) - 1u) : 0u;
}

// Flags of a row, grid (ceil(cols / (kClusterFlagThreads x kClusterFlagRun)), rows): thread i of CTA x
// takes tokens [8 (x kClusterFlagThreads + i), + 8). Token j is flagged when a centre reaches it
// (near_centre's rule): within `radius` tokens of the centre, or (kBudgetBlocks) its block within
// `radius` blocks of the centre's. The run walks the blocks that can hold such a centre for any of its
// tokens (a superset of each token's own range, so the same answer) and ORs in the tokens each centre
// reaches. A template, so the header-only definition is inline across translation units.
template <class Unused = void>
__global__ void cluster_flags_kernel(ClusterFlagsLaunch launch) {
  dependent_kernel_start();  // Exec::dependent_launch
  const std::int64_t cols = launch.scores.cols;
  const ClusterParams& p = launch.params;
  const std::int64_t r = blockIdx.y;
  const int n = clamp_row_length(launch.row_lengths, r, cols);
  const int j0 = (blockIdx.x * kClusterFlagThreads + int(threadIdx.x)) * kClusterFlagRun;
  if (j0 >= n) return;
  const int block = cluster_block_size(p, n), blocks = (n + block - 1) / block;
  const bool in_blocks = p.radius_rule == RadiusRule::kBudgetBlocks;
  const std::int64_t radius = cluster_radius(p, block, in_blocks ? launch.scratch.counts[r] : 0);
  const int run = n - j0 < kClusterFlagRun ? n - j0 : kClusterFlagRun;
  const std::int64_t last = j0 + run - 1;
  const std::int32_t* centres = launch.scratch.centres + r * cols;
  std::int64_t lo = in_blocks ? j0 / block - radius : (j0 - radius) / block;  // j0 - radius < 0: lo <= 0
  std::int64_t hi = in_blocks ? last / block + radius : (last + radius) / block;
  if (lo < 0) lo = 0;
  if (hi > blocks - 1) hi = blocks - 1;
  const unsigned all = (1u << run) - 1u;
  unsigned mask = 0;
  for (std::int64_t k = lo; k <= hi && mask != all; ++k) {
    const int c = centres[k];
    if (c < 0) continue;
    // The tokens centre c reaches, as offsets from j0: [c - radius, c + radius], or the blocks k +- radius.
    const std::int64_t from = in_blocks ? (k - radius) * block : c - radius;
    const std::int64_t to = in_blocks ? (k + radius + 1) * block - 1 : c + radius;
    mask |= cluster_run_bits(from - j0, to - j0 + 1);
  }
  mask &= all;
  std::uint8_t* out = launch.flags.row(r) + j0;
  if (run == kClusterFlagRun && reinterpret_cast<std::uintptr_t>(out) % 8 == 0) {  // one 8-byte store
    std::uint64_t word = 0;
#pragma unroll
    for (int i = 0; i < kClusterFlagRun; ++i) word |= std::uint64_t((mask >> i) & 1u) << (8 * i);
    *reinterpret_cast<std::uint64_t*>(out) = word;
  } else {
#pragma unroll
    for (int i = 0; i < kClusterFlagRun; ++i)
      if (i < run) out[i] = std::uint8_t((mask >> i) & 1u);
  }
}

}  // namespace detail
}  // namespace kvsift
