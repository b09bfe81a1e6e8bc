#pragma once
// One gate's role score and role (contract in gates/roles_from_gates.hpp), shared by the host
// reference and the CUDA kernel so both rank with the same expression.

#include <cstdint>

#include "kvsift/core/config.hpp"
#include "kvsift/gates/detail/hardkuma_gate.hpp"
#include "kvsift/gates/detail/scalar_math.hpp"
#include "kvsift/gates/kumaraswamy.hpp"
#include "kvsift/gates/roles_from_gates.hpp"

namespace kvsift {
namespace detail {

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
}  // namespace kvsift
