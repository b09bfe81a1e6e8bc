#pragma once
// CUDA backend of the gate optimizer step (contract in gate_optimizer.hpp).

#include <cstdint>

#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/cuda_status.cuh"
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

// As host::adamw_step; params, grads, m and v are device memory. lr and step are launch arguments, so
// a captured graph replays them unchanged: re-capture (or update the node) when the schedule moves.
template <class T>
Status adamw_step(Exec exec, const AdamWConfig& config, double lr, std::int64_t step, T* params, const T* grads, T* m,
                  T* v, std::int64_t n) {
  KVSIFT_TRY(detail::validate_adamw(config, lr, step));
  KVSIFT_TRY(detail::validate_adamw_arrays(params, grads, m, v, n));
  if (n == 0) return Status();
  constexpr int kThreads = 256;
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  detail::adamw_kernel<<<unsigned(blocks < 4096 ? blocks : 4096), kThreads, 0, exec.stream>>>(
      detail::adamw_coefficients(config, lr, step), params, grads, m, v, n);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
