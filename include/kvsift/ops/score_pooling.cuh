#pragma once
/// \file
/// \brief CUDA backend of pool_scores (contract in score_pooling.hpp, workspace query in
/// score_pooling_plan.hpp, kernel in detail/score_pooling_kernel.cuh).

#include <cstdint>

#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/workspace.hpp"
#include "kvsift/ops/detail/score_pooling_kernel.cuh"
#include "kvsift/ops/score_pooling.hpp"
#include "kvsift/ops/score_pooling_plan.hpp"

namespace kvsift {
namespace cuda {

/// Same contract as host::pool_scores; pointers are device pointers. Asynchronous on exec.stream;
/// needs no workspace. kUnsupported for more than 65535 rows.
inline Status pool_scores(const Exec& exec, StridedView2D<const float> in, const std::int32_t* row_lengths,
                          PoolParams params, StridedView2D<float> out, Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_pool_scores(in, params, out));
  if (in.rows == 0 || in.cols == 0) return Status();
  KVSIFT_REQUIRE(in.rows <= 65535, kUnsupported, "scores.rows = ", in.rows, " must be <= 65535");
  const dim3 grid(unsigned((in.cols + 255) / 256), unsigned(in.rows));
  KVSIFT_CUDA_TRY(detail::launch_with_pdl(exec.launches_dependent(), detail::pool_scores_kernel<>, grid,
                                          dim3(256), 0, exec.stream, detail::PoolScoresLaunch{in, row_lengths, params, out}));
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
