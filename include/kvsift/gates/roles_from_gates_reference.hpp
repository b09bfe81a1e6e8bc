#pragma once
/// \file
/// \brief Host reference of head-role extraction (contract in roles_from_gates.hpp): one pass over the gates
/// with the ranking code the CUDA kernel runs, on host memory. Needs no workspace and no device facts.

#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/gates/detail/role_ranking.hpp"
#include "kvsift/gates/roles_from_gates.hpp"

namespace kvsift {
namespace host {

/// roles[layers * kv_heads] (required); scores (E[K] per gate) optional.
template <class T>
Status extract_head_roles(const Exec&, const RoleExtractionOptions& options, const T* a, const T* b, int layers,
                          int kv_heads, std::uint8_t* roles, detail::non_deduced<T>* scores = nullptr,
                          Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_extract_head_roles(options, a, b, layers, kv_heads, roles));
  const std::int64_t n = std::int64_t(layers) * kv_heads;
  KVSIFT_TRY(detail::validate_gate_values(options.gate, a, b, n));
  for (std::int64_t i = 0; i < n; ++i) {
    roles[i] = detail::head_role(options, a, b, layers, kv_heads, i);
    if (scores) scores[i] = detail::role_score(options, a, b, i);
  }
  return Status();
}

}  // namespace host
}  // namespace kvsift
