// Definitions of launch_gates.hpp: kvsift's CUDA gate ops, plus the caller-given-u sampling kernels
// (gate_sample.hpp's per-gate bodies, the same code as the CPU op). float and double.
#include <kvsift/core/cuda_status.cuh>
#include <kvsift/gates/detail/gate_launch.cuh>
#include <kvsift/gates/hardkuma.cuh>
#include <kvsift/gates/roles_from_gates.cuh>

#include "gate_sample.hpp"
#include "launch_gates.hpp"

namespace kvsift_torch {
namespace cuda_launch {
namespace {

template <class T>
__global__ void sample_kernel(kvsift::HardKumaOptions o, const T* a, const T* b, const T* u, std::int64_t n, T* h) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    gates::sample_gate(o, a, b, u, h, i);
}

template <class T>
__global__ void sample_backward_kernel(kvsift::HardKumaOptions o, const T* a, const T* b, const T* u, const T* grad_h,
                                       std::int64_t n, T* grad_a, T* grad_b) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    gates::sample_backward_gate(o, a, b, u, grad_h, grad_a, grad_b, i);
}

}  // namespace

template <class T>
kvsift::Status hardkuma_sample(cudaStream_t stream, const kvsift::HardKumaOptions& o, const T* a, const T* b,
                               const T* u, std::int64_t n, T* h) {
  KVSIFT_TRY(kvsift::detail::validate_hardkuma_sample(o, a, b, n, h));
  if (n == 0) return kvsift::Status();
  KVSIFT_REQUIRE_NOT_NULL(u, "u");
  sample_kernel<T><<<kvsift::detail::gate_blocks(n), kvsift::detail::kGateThreads, 0, stream>>>(o, a, b, u, n, h);
  KVSIFT_CHECK_LAUNCH();
  return kvsift::Status();
}

template <class T>
kvsift::Status hardkuma_sample_backward(cudaStream_t stream, const kvsift::HardKumaOptions& o, const T* a, const T* b,
                                        const T* u, const T* grad_h, std::int64_t n, T* grad_a, T* grad_b) {
  KVSIFT_TRY(kvsift::detail::validate_hardkuma_sample_backward(o, a, b, n, grad_h));
  if (n == 0) return kvsift::Status();
  KVSIFT_REQUIRE_NOT_NULL(u, "u");
  sample_backward_kernel<T><<<kvsift::detail::gate_blocks(n), kvsift::detail::kGateThreads, 0, stream>>>(
      o, a, b, u, grad_h, n, grad_a, grad_b);
  KVSIFT_CHECK_LAUNCH();
  return kvsift::Status();
}

template <class T>
kvsift::Status hardkuma_expected_l0(cudaStream_t stream, const kvsift::HardKumaOptions& o, const T* a, const T* b,
                                    std::int64_t n, const kvsift::ExpectedL0Outputs<T>& out) {
  kvsift::cuda::Exec exec;
  exec.stream = stream;
  return kvsift::cuda::hardkuma_expected_l0(exec, o, a, b, n, out);
}

template <class T>
kvsift::Status hardkuma_stats(cudaStream_t stream, const kvsift::HardKumaOptions& o, const T* a, const T* b,
                              std::int64_t n, const kvsift::GateStatsOutputs<T>& out) {
  kvsift::cuda::Exec exec;
  exec.stream = stream;
  return kvsift::cuda::hardkuma_stats(exec, o, a, b, n, out);
}

template <class T>
kvsift::Status extract_head_roles(cudaStream_t stream, const kvsift::RoleExtractionOptions& o, const T* a, const T* b,
                                  int layers, int kv_heads, std::uint8_t* roles, T* scores) {
  kvsift::cuda::Exec exec;
  exec.stream = stream;
  return kvsift::cuda::extract_head_roles(exec, o, a, b, layers, kv_heads, roles, scores);
}

#define KVSIFT_TORCH_INSTANTIATE_GATES(T)                                                                         \
  template kvsift::Status hardkuma_sample<T>(cudaStream_t, const kvsift::HardKumaOptions&, const T*, const T*,  \
                                             const T*, std::int64_t, T*);                                       \
  template kvsift::Status hardkuma_sample_backward<T>(cudaStream_t, const kvsift::HardKumaOptions&, const T*,   \
                                                      const T*, const T*, const T*, std::int64_t, T*, T*);      \
  template kvsift::Status hardkuma_expected_l0<T>(cudaStream_t, const kvsift::HardKumaOptions&, const T*,       \
                                                  const T*, std::int64_t, const kvsift::ExpectedL0Outputs<T>&); \
  template kvsift::Status hardkuma_stats<T>(cudaStream_t, const kvsift::HardKumaOptions&, const T*, const T*,   \
                                            std::int64_t, const kvsift::GateStatsOutputs<T>&);                  \
  template kvsift::Status extract_head_roles<T>(cudaStream_t, const kvsift::RoleExtractionOptions&, const T*,   \
                                                const T*, int, int, std::uint8_t*, T*);

KVSIFT_TORCH_INSTANTIATE_GATES(float)
KVSIFT_TORCH_INSTANTIATE_GATES(double)
#undef KVSIFT_TORCH_INSTANTIATE_GATES

}  // namespace cuda_launch
}  // namespace kvsift_torch
