#pragma once
/// \file
/// \brief CUDA backend of head-role extraction (contract in roles_from_gates.hpp): one thread per gate, same
/// code as the host (gates/detail/role_ranking.hpp), so roles agree unless a score sits within an ulp
/// of the threshold or of another score. Asynchronous on exec.stream; needs no workspace (one passed is
/// ignored) and no device facts.

#include <cstdint>

#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/workspace.hpp"
#include "kvsift/gates/detail/gate_launch.cuh"
#include "kvsift/gates/detail/role_ranking.hpp"
#include "kvsift/gates/roles_from_gates.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kRoleThreads = 128;

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

/// As host::extract_head_roles; a, b, roles and scores are device memory.
template <class T>
Status extract_head_roles(const Exec& exec, const RoleExtractionOptions& options, const T* a, const T* b, int layers,
                          int kv_heads, std::uint8_t* roles, detail::non_deduced<T>* scores = nullptr,
                          Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_extract_head_roles(options, a, b, layers, kv_heads, roles));
  const std::int64_t n = std::int64_t(layers) * kv_heads;
  detail::extract_head_roles_kernel<<<detail::gate_blocks(n, detail::kRoleThreads), detail::kRoleThreads, 0,
                                      exec.stream>>>(options, a, b, layers, kv_heads, roles, scores);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
