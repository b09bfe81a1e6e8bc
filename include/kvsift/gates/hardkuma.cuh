#pragma once
/// \file
/// \brief CUDA backend of the batched HardKuma gate ops (contract and numerics in hardkuma.hpp). Every kernel
/// runs the same per-gate function as the host reference (gates/detail/hardkuma_gate.hpp); a draw is a
/// pure function of (seed, offset, gate index), so host and device sample the same uniforms and a CUDA
/// graph replayed with a new offset draws fresh gates without device-side RNG state.
///
/// Asynchronous on exec.stream; no allocation, no synchronization, no read of device data by the host.
/// The grids are sized from the gate count alone, so the ops need neither the Exec's device facts (a
/// default-constructed cuda::Exec on the legacy stream works) nor a workspace (one passed is ignored).

#include <cstdint>

#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/reduce.cuh"
#include "kvsift/core/workspace.hpp"
#include "kvsift/gates/detail/gate_launch.cuh"
#include "kvsift/gates/detail/hardkuma_gate.hpp"
#include "kvsift/gates/hardkuma.hpp"

namespace kvsift {
namespace detail {

template <class T>
__global__ void hardkuma_stats_kernel(HardKumaOptions o, const T* a, const T* b, std::int64_t n,
                                      GateStatsOutputs<T> out) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    hardkuma_stats_gate(o, a, b, out, i);
}

template <class T>
__global__ void hardkuma_sample_kernel(HardKumaOptions o, const T* a, const T* b, std::int64_t n, PhiloxStream stream,
                                       T* h, T* k, T* u) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    hardkuma_sample_gate(o, a, b, stream, h, k, u, i);
}

template <class T>
__global__ void hardkuma_sample_backward_kernel(HardKumaOptions o, const T* a, const T* b, std::int64_t n,
                                                PhiloxStream stream, const T* grad_h, T* grad_a, T* grad_b,
                                                GradientWrite write) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    hardkuma_sample_backward_gate(o, a, b, stream, grad_h, grad_a, grad_b, write, i);
}

/// One block: a gate vector is a few hundred gates, and a single block needs no atomics and no
/// workspace and sums in a fixed order (deterministic). Accumulates in double, like the host.
template <class T>
__global__ void __launch_bounds__(kGateThreads) hardkuma_expected_l0_kernel(HardKumaOptions o, const T* a, const T* b,
                                                                            std::int64_t n, ExpectedL0Outputs<T> out) {
  __shared__ typename BlockAllReduce<double, kGateThreads>::TempStorage tmp;
  const T scale = expected_l0_grad_factor(out, n);
  double partial = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += kGateThreads) partial += hardkuma_expected_l0_gate(o, a, b, out, scale, i);
  const double sum = BlockAllReduce<double, kGateThreads>::sum(tmp, partial);
  if (threadIdx.x == 0) {
    if (out.sum) *out.sum = T(sum);
    if (out.density) *out.density = T(sum / double(n));
  }
}

}  // namespace detail

namespace cuda {

/// As host::hardkuma_stats; a, b and every output are device memory.
template <class T>
Status hardkuma_stats(const Exec& exec, const HardKumaOptions& options, const T* a, const T* b, std::int64_t n,
                      GateStatsOutputs<T> out, Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_gate_arrays(options, a, b, n));
  if (n == 0) return Status();
  detail::hardkuma_stats_kernel<<<detail::gate_blocks(n), detail::kGateThreads, 0, exec.stream>>>(options, a, b, n, out);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

/// As host::hardkuma_sample; a, b, h and the optional k and u are device memory. The same (stream, gate
/// index) draws the same uniform as the host.
template <class T>
Status hardkuma_sample(const Exec& exec, const HardKumaOptions& options, const T* a, const T* b, std::int64_t n,
                       PhiloxStream stream, T* h, detail::non_deduced<T>* k = nullptr,
                       detail::non_deduced<T>* u = nullptr, Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_hardkuma_sample(options, a, b, n, h));
  if (n == 0) return Status();
  detail::hardkuma_sample_kernel<<<detail::gate_blocks(n), detail::kGateThreads, 0, exec.stream>>>(options, a, b, n,
                                                                                                  stream, h, k, u);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

/// As host::hardkuma_sample_backward; a, b, grad_h and the optional grad_a and grad_b are device memory.
template <class T>
Status hardkuma_sample_backward(const Exec& exec, const HardKumaOptions& options, const T* a, const T* b, std::int64_t n,
                                PhiloxStream stream, const T* grad_h, detail::non_deduced<T>* grad_a,
                                detail::non_deduced<T>* grad_b, GradientWrite write = GradientWrite::kOverwrite,
                                Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_hardkuma_sample_backward(options, a, b, n, grad_h));
  if (n == 0) return Status();
  detail::hardkuma_sample_backward_kernel<<<detail::gate_blocks(n), detail::kGateThreads, 0, exec.stream>>>(
      options, a, b, n, stream, grad_h, grad_a, grad_b, write);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

/// out.sum, out.density and out.grad_scale point to device memory.
template <class T>
Status hardkuma_expected_l0(const Exec& exec, const HardKumaOptions& options, const T* a, const T* b, std::int64_t n,
                            ExpectedL0Outputs<T> out, Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_hardkuma_expected_l0(options, a, b, n, out));
  detail::hardkuma_expected_l0_kernel<<<1, detail::kGateThreads, 0, exec.stream>>>(options, a, b, n, out);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
