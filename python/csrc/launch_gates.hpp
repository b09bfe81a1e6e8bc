#pragma once
// The CUDA launches of the HardKuma gate ops (gates_cuda.cpp), declared with kvsift's types only so that
// launch_gates.cu never includes torch. Instantiated for float and double. Every pointer is device
// memory; nothing is read back, nothing allocated.
#include <cuda_runtime_api.h>

#include <cstdint>

#include <kvsift/gates/hardkuma.hpp>
#include <kvsift/gates/roles_from_gates.hpp>

namespace kvsift_torch {
namespace cuda_launch {

/// h[i] for the caller's uniforms u[i] (gate_sample.hpp's per-gate body in a grid-stride kernel).
template <class T>
kvsift::Status hardkuma_sample(cudaStream_t stream, const kvsift::HardKumaOptions& o, const T* a, const T* b,
                               const T* u, std::int64_t n, T* h);

/// dL/da, dL/db at the draws of u from dL/dh.
template <class T>
kvsift::Status hardkuma_sample_backward(cudaStream_t stream, const kvsift::HardKumaOptions& o, const T* a, const T* b,
                                        const T* u, const T* grad_h, std::int64_t n, T* grad_a, T* grad_b);

/// kvsift::cuda::hardkuma_expected_l0.
template <class T>
kvsift::Status hardkuma_expected_l0(cudaStream_t stream, const kvsift::HardKumaOptions& o, const T* a, const T* b,
                                    std::int64_t n, const kvsift::ExpectedL0Outputs<T>& out);

/// kvsift::cuda::hardkuma_stats.
template <class T>
kvsift::Status hardkuma_stats(cudaStream_t stream, const kvsift::HardKumaOptions& o, const T* a, const T* b,
                              std::int64_t n, const kvsift::GateStatsOutputs<T>& out);

/// kvsift::cuda::extract_head_roles.
template <class T>
kvsift::Status extract_head_roles(cudaStream_t stream, const kvsift::RoleExtractionOptions& o, const T* a, const T* b,
                                  int layers, int kv_heads, std::uint8_t* roles, T* scores);

}  // namespace cuda_launch
}  // namespace kvsift_torch
