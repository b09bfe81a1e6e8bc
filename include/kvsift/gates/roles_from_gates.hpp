#pragma once
// Head-role extraction after gate training (specs/lycheedecode.md §6.6, hardkuma.md §8): each KV head
// j of layer l gets the score E[K(a, b)] (kumaraswamy_mean, the reference's HardKuma.mean()), and
//
//   kThreshold  retrieval iff score > threshold (0.5), the paper's "E[z] > 0.5"
//   kTopN       exactly total_retrieval_heads retrieval heads: the forced ones plus the highest scores
//
// Layer 0 is forced to retrieval by default (LycheeDecode sets p_full[0, :] = 1; its layer 0 must be
// dense because it seeds every index row). In kTopN, total_retrieval_heads counts the forced heads
// too: LycheeDecode's 32 = 8 (layer 0) + 24 learned. Ties rank the lower gate index first; a NaN
// score ranks lowest and never passes the threshold.
//
// Gates are layer-major (gate = layer * kv_heads + head); roles[gate] = 1 for retrieval, 0 for sparse
// (the byte layout make_head_roles turns into a HeadRoles table).
// a and b go through the same clamp as training (HardKumaOptions::clamp_shape).

#include <cstdint>

#include "kvsift/core/exec.hpp"
#include "kvsift/core/check.hpp"
#include "kvsift/gates/hardkuma.hpp"
#include "kvsift/kv/head_roles.hpp"

namespace kvsift {

enum class RoleSelection { kThreshold, kTopN };

struct RoleExtractionOptions {
  RoleSelection selection = RoleSelection::kThreshold;
  double threshold = 0.5;         // kThreshold: retrieval iff E[K] > threshold
  int total_retrieval_heads = 0;  // kTopN: retrieval heads in all, forced ones included
  bool force_layer0 = true;
  HardKumaOptions gate;           // shape clamp applied to a and b
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

template <class T>
KVSIFT_HD inline T role_score(const RoleExtractionOptions& o, const T* a, const T* b, std::int64_t i) {
  return kumaraswamy_mean(resolve_shape(o.gate, a[i]).value, resolve_shape(o.gate, b[i]).value);
}

// True when gate j ranks ahead of gate i: higher score, or equal score and lower index; NaN lowest.
template <class T>
KVSIFT_HD inline bool ranks_ahead(T score_j, std::int64_t j, T score_i, std::int64_t i) {
  const bool nan_j = gm::is_nan(score_j), nan_i = gm::is_nan(score_i);
  if (nan_j != nan_i) return nan_i;
  if (!nan_j && score_j != score_i) return score_j > score_i;
  return j < i;
}

// Role of gate i; O(n) per gate in kTopN (a gate vector is a few hundred gates).
template <class T>
KVSIFT_HD inline std::uint8_t head_role(const RoleExtractionOptions& o, const T* a, const T* b, int layers,
                                        int kv_heads, std::int64_t i) {
  const std::int64_t first = o.force_layer0 ? kv_heads : 0;  // gates below this are forced
  if (i < first) return 1;
  const T score = role_score(o, a, b, i);
  if (o.selection == RoleSelection::kThreshold) return score > T(o.threshold) ? 1 : 0;
  std::int64_t ahead = 0;
  const std::int64_t n = std::int64_t(layers) * kv_heads;
  for (std::int64_t j = first; j < n; ++j)
    if (j != i && ranks_ahead(role_score(o, a, b, j), j, score, i)) ++ahead;
  return ahead < o.total_retrieval_heads - first ? 1 : 0;
}

}  // namespace detail

namespace host {

// roles[layers * kv_heads] (required); scores (E[K] per gate) optional.
template <class T>
Status extract_head_roles(Exec, const RoleExtractionOptions& options, const T* a, const T* b, int layers, int kv_heads,
                          std::uint8_t* roles, detail::non_deduced<T>* scores = nullptr) {
  KVSIFT_TRY(detail::validate_role_extraction(options, layers, kv_heads));
  const std::int64_t n = std::int64_t(layers) * kv_heads;
  KVSIFT_TRY(detail::validate_gate_arrays(options.gate, a, b, n));
  KVSIFT_REQUIRE_NOT_NULL(roles, "roles");
  KVSIFT_TRY(detail::validate_gate_values(options.gate, a, b, n));
  for (std::int64_t i = 0; i < n; ++i) {
    roles[i] = detail::head_role(options, a, b, layers, kv_heads, i);
    if (scores) scores[i] = detail::role_score(options, a, b, i);
  }
  return Status();
}

}  // namespace host
// Roles from trained HardKuma gate parameters a, b [num_layers * num_kv_heads] (host memory):
// E[Kuma(a, b)] > threshold, or the top-N heads, with layer 0 forced to retrieval (above).
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
