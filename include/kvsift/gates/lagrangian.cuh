#pragma once
/// \file
/// \brief CUDA form of the Lagrangian update op (contract and update rule in lagrangian.hpp): one thread,
/// state and density in device memory, so a training step that keeps everything on the GPU needs no
/// host read and can be captured in a CUDA graph. Needs no workspace (one passed is ignored) and no
/// device facts.

#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/workspace.hpp"
#include "kvsift/gates/lagrangian.hpp"

namespace kvsift {
namespace detail {

template <class T>
__global__ void lagrangian_update_kernel(LagrangianConfig config, LagrangianState* state, const T* density,
                                         T* grad_scale, LagrangianStep* step) {
  const LagrangianStep r = lagrangian_update(config, state, double(*density));
  if (grad_scale) *grad_scale = T(r.grad_scale);
  if (step) *step = r;
}

}  // namespace detail

namespace cuda {

/// state, density, grad_scale and step point to device memory; grad_scale and step may be null.
template <class T>
Status lagrangian_update(const Exec& exec, const LagrangianConfig& config, LagrangianState* state, const T* density,
                         T* grad_scale, LagrangianStep* step = nullptr, Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_lagrangian_update(config, state, density));
  detail::lagrangian_update_kernel<<<1, 1, 0, exec.stream>>>(config, state, density, grad_scale, step);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
