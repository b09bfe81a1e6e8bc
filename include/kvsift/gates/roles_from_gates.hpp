#pragma once
/// \file
/// \brief Head-role extraction after gate training (docs/algorithms/hardkuma.md §8): each KV head j of layer
/// l gets the score E[K(a, b)] (kumaraswamy_mean, the reference's HardKuma.mean()), and
///
///   kThreshold  retrieval iff score > threshold (0.5), the paper's "E[z] > 0.5"
///   kTopN       exactly total_retrieval_heads retrieval heads: the forced ones plus the highest scores
///
/// Layer 0 is forced to retrieval by default (LycheeDecode sets p_full[0, :] = 1; its layer 0 must be
/// all retrieval heads because it seeds every index row). In kTopN, total_retrieval_heads counts the
/// forced heads too: LycheeDecode's 32 = 8 (layer 0) + 24 learned. Ties rank the lower gate index
/// first; a NaN score ranks lowest and never passes the threshold.
///
/// Gates are layer-major (gate = layer * kv_heads + head); roles[gate] = 1 for retrieval, 0 for sparse
/// (the byte layout make_head_roles turns into a HeadRoles table).
/// a and b go through the same clamp as training (HardKumaOptions::clamp_shape).
///
/// This header is the contract of extract_head_roles: options, validation and the workspace query.
/// The host reference is in roles_from_gates_reference.hpp, the CUDA op in roles_from_gates.cuh (both
/// run gates/detail/role_ranking.hpp); the op has the one shape (const Exec& first, a trailing
/// Workspace) and needs no workspace and no device facts. lycheedecode_roles_from_hardkuma
/// (gates/lycheedecode_roles.hpp) turns host gates straight into the HeadRoles table the policy reads.

#include <cstddef>
#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/gates/detail/no_workspace_bytes.hpp"
#include "kvsift/gates/hardkuma.hpp"

namespace kvsift {

/// How retrieval heads are chosen from the scores: by threshold, or a fixed number of the best.
enum class RoleSelection { kThreshold, kTopN };

/// What extract_head_roles does; validated on every call.
struct RoleExtractionOptions {
  RoleSelection selection = RoleSelection::kThreshold;  ///< threshold or top-N
  double threshold = 0.5;         ///< kThreshold: retrieval iff E[K] > threshold
  int total_retrieval_heads = 0;  ///< kTopN: retrieval heads in all, forced ones included
  bool force_layer0 = true;       ///< make every layer-0 head a retrieval head (LycheeDecode needs it)
  HardKumaOptions gate;           ///< shape clamp applied to a and b
};

namespace detail {

inline Status validate_role_extraction(const RoleExtractionOptions& o, int layers, int kv_heads) {
  KVSIFT_TRY(validate(o.gate));
  KVSIFT_REQUIRE(layers > 0, kInvalidArgument, "layers = ", layers, " must be > 0");
  KVSIFT_REQUIRE(kv_heads > 0, kInvalidArgument, "kv_heads = ", kv_heads, " must be > 0");
  if (o.selection == RoleSelection::kTopN) {
    const int forced = o.force_layer0 ? kv_heads : 0;
    const std::int64_t total = std::int64_t(layers) * kv_heads;
    KVSIFT_REQUIRE(o.total_retrieval_heads >= forced && o.total_retrieval_heads <= total, kInvalidArgument,
                   "options.total_retrieval_heads = ", o.total_retrieval_heads, " must be in [", forced, ", ", total,
                   "] (it includes the ", forced, " forced layer-0 heads)");
  } else {
    KVSIFT_REQUIRE(o.threshold == o.threshold, kInvalidArgument, "options.threshold = nan must be a number");
  }
  return Status();
}

/// What extract_head_roles checks on both backends (the host also checks the gate values).
template <class T>
Status validate_extract_head_roles(const RoleExtractionOptions& o, const T* a, const T* b, int layers, int kv_heads,
                                   const std::uint8_t* roles) {
  KVSIFT_TRY(validate_role_extraction(o, layers, kv_heads));
  KVSIFT_TRY(validate_gate_arrays(o.gate, a, b, std::int64_t(layers) * kv_heads));
  KVSIFT_REQUIRE_NOT_NULL(roles, "roles");
  return Status();
}

}  // namespace detail

// ---- Workspace query (both backends; reports 0) ----

/// The op's optional scores are explicit here: pass nullptr where the op call leaves them out.
template <class T, class Exec>
Status extract_head_roles_workspace_bytes(const Exec&, const RoleExtractionOptions&, const T* /*a*/, const T* /*b*/,
                                          int /*layers*/, int /*kv_heads*/, std::uint8_t* /*roles*/,
                                          detail::non_deduced<T>* /*scores*/, std::size_t* bytes) {
  return detail::no_workspace_bytes(bytes);
}

}  // namespace kvsift
