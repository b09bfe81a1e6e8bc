#pragma once
// The kernels behind cuda::cluster_flags (contract in cluster_flags.hpp, scratch in cluster_flags_plan.hpp):
//   1. one thread per block of a row: its maximum and argmax -> the block's centre (or -1), and a
//      count of the row's centres (integer atomics: the count is exact whatever the order);
//   2. one thread per token: flagged when a centre within the radius exists (looks only at the
//      blocks that can reach it).

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

// A template, so the header-only definition is inline across translation units.
template <class Unused = void>
__global__ void cluster_centres_kernel(ClusterFlagsLaunch launch) {
  const StridedView2D<const float>& scores = launch.scores;
  const ClusterParams& p = launch.params;
  const std::int64_t r = blockIdx.y;
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  const int n = clamp_row_length(launch.row_lengths, r, scores.cols);
  if (n == 0) return;
  const int block = cluster_block_size(p, n);
  if (k >= (n + block - 1) / block) return;
  float m;
  const int arg = block_argmax(scores.row(r), n, block, k, &m);
  const bool centre = arg >= 0 && m > p.theta;
  launch.scratch.centres[r * scores.cols + k] = centre ? arg : -1;
  if (centre) atomicAdd(launch.scratch.counts + r, 1);
}

// A template, so the header-only definition is inline across translation units.
template <class Unused = void>
__global__ void cluster_flags_kernel(ClusterFlagsLaunch launch) {
  const std::int64_t cols = launch.scores.cols;
  const ClusterParams& p = launch.params;
  const std::int64_t r = blockIdx.y;
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  const int n = clamp_row_length(launch.row_lengths, r, cols);
  if (j >= n) return;
  const int block = cluster_block_size(p, n);
  const int radius = cluster_radius(p, block, launch.scratch.counts[r]);
  const std::int32_t* centres = launch.scratch.centres + r * cols;
  launch.flags(r, j) = near_centre(centres, (n + block - 1) / block, block, j, p, radius) ? 1 : 0;
}

}  // namespace detail
}  // namespace kvsift
