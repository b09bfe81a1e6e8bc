#pragma once
// CUDA backend of head-role extraction (contract in head_roles.hpp): one thread per gate, same code
// as the host, so roles agree unless a score sits within an ulp of the threshold or of another score.

#include <cstdint>

#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/cuda_status.cuh"
#include "kvsift/gates/roles_from_gates.hpp"

namespace kvsift {
namespace detail {

template <class T>
__global__ void extract_head_roles_kernel(RoleExtractionOptions o, const T* a, const T* b, int layers, int kv_heads,
                                          std::uint8_t* roles, T* scores) {
  const std::int64_t n = std::int64_t(layers) * kv_heads;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    roles[i] = head_role(o, a, b, layers, kv_heads, i);
    if (scores) scores[i] = role_score(o, a, b, i);
  }
}

}  // namespace detail

namespace cuda {

template <class T>
Status extract_head_roles(Exec exec, const RoleExtractionOptions& options, const T* a, const T* b, int layers,
                          int kv_heads, std::uint8_t* roles, detail::non_deduced<T>* scores = nullptr) {
  KVSIFT_TRY(detail::validate_role_extraction(options, layers, kv_heads));
  const std::int64_t n = std::int64_t(layers) * kv_heads;
  KVSIFT_TRY(detail::validate_gate_arrays(options.gate, a, b, n));
  KVSIFT_REQUIRE_NOT_NULL(roles, "roles");
  constexpr int kThreads = 128;
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  detail::extract_head_roles_kernel<<<unsigned(blocks < 4096 ? blocks : 4096), kThreads, 0, exec.stream>>>(
      options, a, b, layers, kv_heads, roles, scores);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
