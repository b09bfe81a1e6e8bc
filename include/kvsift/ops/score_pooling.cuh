#pragma once
// CUDA backend of pool_scores (contract in score_pooling.hpp): one thread per output element; the
// kernel-wide window is read from L1/L2, which is cheap next to the scores pass that precedes it.

#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/cuda_status.cuh"
#include "kvsift/ops/score_pooling.hpp"

namespace kvsift {
namespace detail {

// A template, so the header-only definition is inline across translation units.
template <class Unused = void>
__global__ void pool_scores_kernel(StridedView2D<const float> in, const std::int32_t* row_lengths, PoolParams p,
                                          StridedView2D<float> out) {
  const std::int64_t r = blockIdx.y;
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  const int n = clamp_row_length(row_lengths, r, in.cols);
  if (j < n) out(r, j) = pool_at(in.row(r), n, j, p);
}

}  // namespace detail

namespace cuda {

inline Status pool_scores(Exec exec, StridedView2D<const float> in, const std::int32_t* row_lengths,
                          PoolParams params, StridedView2D<float> out) {
  KVSIFT_TRY(detail::validate_pool_scores(in, params, out));
  if (in.rows == 0 || in.cols == 0) return Status();
  KVSIFT_REQUIRE(in.rows <= 65535, kUnsupported, "scores.rows = ", in.rows, " must be <= 65535");
  const dim3 grid(unsigned((in.cols + 255) / 256), unsigned(in.rows));
  detail::pool_scores_kernel<><<<grid, 256, 0, exec.stream>>>(in, row_lengths, params, out);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
