#pragma once
/// \file
/// \brief CUDA backend of the gate optimizer step (contract in gate_optimizer.hpp). Asynchronous on
/// exec.stream; the grid is sized from n alone, so the op needs neither the Exec's device facts nor a
/// workspace (one passed is ignored).

#include <cstdint>

#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/workspace.hpp"
#include "kvsift/gates/detail/gate_launch.cuh"
#include "kvsift/gates/gate_optimizer.hpp"

namespace kvsift {
namespace detail {

template <class T>
__global__ void adamw_kernel(AdamWCoefficients k, T* p, const T* g, T* m, T* v, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    adamw_element(k, p, g, m, v, i);
}

}  // namespace detail

namespace cuda {

/// As host::adamw_step; params, grads, m and v are device memory. lr and step are launch arguments, so
/// a captured graph replays them unchanged: re-capture (or update the node) when the schedule moves.
template <class T>
Status adamw_step(const Exec& exec, const AdamWConfig& config, double lr, std::int64_t step, T* params, const T* grads,
                  T* m, T* v, std::int64_t n, Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_adamw_step(config, lr, step, params, grads, m, v, n));
  if (n == 0) return Status();
  detail::adamw_kernel<<<detail::gate_blocks(n), detail::kGateThreads, 0, exec.stream>>>(
      detail::adamw_coefficients(config, lr, step), params, grads, m, v, n);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
