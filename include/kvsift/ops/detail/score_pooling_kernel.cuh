#pragma once
// The kernel behind cuda::pool_scores (contract in score_pooling.hpp): one thread per output element;
// the kernel-wide window is read from L1/L2, which is cheap next to the scores pass that precedes it.

#include <cstdint>

#include "kvsift/core/dependent_launch.cuh"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/ops/score_pooling.hpp"

namespace kvsift {
namespace detail {

// Everything one launch needs, passed once by value (within 128 bytes: detail/window_scores_common.cuh
// says why).
struct PoolScoresLaunch {
  StridedView2D<const float> in;
  const std::int32_t* row_lengths;
  PoolParams params;
  StridedView2D<float> out;
};
static_assert(sizeof(PoolScoresLaunch) <= 128, "kernel parameter structs stay within 128 bytes");

// A template, so the header-only definition is inline across translation units.
template <class Unused = void>
__global__ void pool_scores_kernel(PoolScoresLaunch launch) {
  dependent_kernel_start();  // Exec::dependent_launch
  const std::int64_t r = blockIdx.y;
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  const int n = clamp_row_length(launch.row_lengths, r, launch.in.cols);
  if (j < n) launch.out(r, j) = pool_at(launch.in.row(r), n, j, launch.params);
}

}  // namespace detail
}  // namespace kvsift
