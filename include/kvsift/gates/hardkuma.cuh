#pragma once
// CUDA backend of the batched HardKuma gate ops (contract and numerics in hardkuma.hpp). Every kernel
// runs the same per-gate function as the host reference; a draw is a pure function of
// (seed, offset, gate index), so host and device sample the same uniforms and a CUDA graph replayed
// with a new offset draws fresh gates without device-side RNG state.

#include <cstdint>

#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/reduce.cuh"
#include "kvsift/gates/hardkuma.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kGateThreads = 256;

// Grid for an elementwise op over n gates with a grid-stride loop.
inline unsigned gate_blocks(std::int64_t n) {
  const std::int64_t blocks = (n + kGateThreads - 1) / kGateThreads;
  return unsigned(blocks < 4096 ? blocks : 4096);
}

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
                                                PhiloxStream stream, const T* grad_h, detail::non_deduced<T>* grad_a,
                                detail::non_deduced<T>* grad_b,
                                                GradientWrite write) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    hardkuma_sample_backward_gate(o, a, b, stream, grad_h, grad_a, grad_b, write, i);
}

// One block: a gate vector is a few hundred gates, and a single block needs no atomics and no
// workspace and sums in a fixed order (deterministic). Accumulates in double, like the host.
template <class T>
__global__ void __launch_bounds__(kGateThreads) hardkuma_expected_l0_kernel(HardKumaOptions o, const T* a, const T* b,
                                                                            std::int64_t n, ExpectedL0Outputs<T> out) {
  __shared__ typename BlockAllReduce<double, kGateThreads>::TempStorage tmp;
  const T scale = (out.grad_scale ? *out.grad_scale : T(1)) / T(n > 0 ? n : 1);
  const bool want_grad = out.grad_a || out.grad_b;
  double partial = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += kGateThreads) {
    ShapeGradient<T> g{};
    partial += double(hardkuma_l0_term(o, a[i], b[i], want_grad ? &g : nullptr));
    if (out.grad_a) write_gradient(out.grad_a + i, scale * g.da, out.write);
    if (out.grad_b) write_gradient(out.grad_b + i, scale * g.db, out.write);
  }
  const double sum = BlockAllReduce<double, kGateThreads>::sum(tmp, partial);
  if (threadIdx.x == 0) {
    if (out.sum) *out.sum = T(sum);
    if (out.density) *out.density = T(sum / double(n));
  }
}

}  // namespace detail

namespace cuda {

template <class T>
Status hardkuma_stats(Exec exec, const HardKumaOptions& options, const T* a, const T* b, std::int64_t n,
                      GateStatsOutputs<T> out) {
  KVSIFT_TRY(detail::validate_gate_arrays(options, a, b, n));
  if (n == 0) return Status();
  detail::hardkuma_stats_kernel<<<detail::gate_blocks(n), detail::kGateThreads, 0, exec.stream>>>(options, a, b, n, out);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

template <class T>
Status hardkuma_sample(Exec exec, const HardKumaOptions& options, const T* a, const T* b, std::int64_t n,
                       PhiloxStream stream, T* h, detail::non_deduced<T>* k = nullptr,
                       detail::non_deduced<T>* u = nullptr) {
  KVSIFT_TRY(detail::validate_gate_arrays(options, a, b, n));
  if (n == 0) return Status();
  KVSIFT_REQUIRE_NOT_NULL(h, "h");
  detail::hardkuma_sample_kernel<<<detail::gate_blocks(n), detail::kGateThreads, 0, exec.stream>>>(options, a, b, n,
                                                                                                  stream, h, k, u);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

template <class T>
Status hardkuma_sample_backward(Exec exec, const HardKumaOptions& options, const T* a, const T* b, std::int64_t n,
                                PhiloxStream stream, const T* grad_h, detail::non_deduced<T>* grad_a,
                                detail::non_deduced<T>* grad_b,
                                GradientWrite write = GradientWrite::kOverwrite) {
  KVSIFT_TRY(detail::validate_gate_arrays(options, a, b, n));
  if (n == 0) return Status();
  KVSIFT_REQUIRE_NOT_NULL(grad_h, "grad_h");
  detail::hardkuma_sample_backward_kernel<<<detail::gate_blocks(n), detail::kGateThreads, 0, exec.stream>>>(
      options, a, b, n, stream, grad_h, grad_a, grad_b, write);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

// out.sum, out.density and out.grad_scale point to device memory.
template <class T>
Status hardkuma_expected_l0(Exec exec, const HardKumaOptions& options, const T* a, const T* b, std::int64_t n,
                            ExpectedL0Outputs<T> out) {
  KVSIFT_TRY(detail::validate_gate_arrays(options, a, b, n));
  KVSIFT_REQUIRE(n > 0 || out.density == nullptr, kInvalidArgument, "n = 0: the density of no gates is undefined");
  detail::hardkuma_expected_l0_kernel<<<1, detail::kGateThreads, 0, exec.stream>>>(options, a, b, n, out);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
