#pragma once
/// \file
/// \brief LycheeDecode's head roles from trained HardKuma gates, as the HeadRoles table the policy reads
/// (kv/head_roles.hpp): extract_head_roles on the host (gates/roles_from_gates.hpp: threshold or
/// top-N), with layer 0 forced to retrieval, packed into one mask per layer. A host procedure on host
/// memory, for the step between training and inference (like writing the roles file), not a backend op.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvsift/core/check.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/gates/roles_from_gates.hpp"
#include "kvsift/gates/roles_from_gates_reference.hpp"
#include "kvsift/kv/head_roles.hpp"

namespace kvsift {

/// Roles from trained HardKuma gate parameters a, b [num_layers * num_kv_heads] (host memory):
/// E[Kuma(a, b)] > threshold, or the top-N heads, with layer 0 forced to retrieval (roles_from_gates.hpp).
template <class T>
Status lycheedecode_roles_from_hardkuma(const T* a, const T* b, int num_layers, int num_kv_heads,
                                        const RoleExtractionOptions& options, HeadRoles* out) {
  KVSIFT_REQUIRE_NOT_NULL(out, "out");
  KVSIFT_REQUIRE(options.force_layer0, kInvalidArgument,
                 "options.force_layer0 = false: LycheeDecode needs layer 0 all retrieval");
  KVSIFT_REQUIRE(num_layers > 0 && num_kv_heads > 0, kInvalidArgument, "num_layers = ", num_layers,
                 " and num_kv_heads = ", num_kv_heads, " must be > 0");
  std::vector<std::uint8_t> roles(std::size_t(num_layers) * num_kv_heads);
  KVSIFT_TRY(host::extract_head_roles(host::Exec{}, options, a, b, num_layers, num_kv_heads, roles.data()));
  return make_head_roles(num_layers, num_kv_heads, roles.data(), out);
}

}  // namespace kvsift
