#pragma once
/// \file
/// \brief Host reference of copy_kv_to_dense (contract in copy_kv_to_dense.hpp). Host memory for every
/// pointer; no workspace.

#include <cstdint>
#include <type_traits>

#include "kvsift/core/check.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/ops/copy_kv_to_dense.hpp"
#include "kvsift/ops/copy_kv_to_dense_plan.hpp"

namespace kvsift {
namespace host {

/// Copies K and V row t of sequence b, KV head h, for t < min(kv.length(b), max_tokens), to element
/// ((b * num_kv_heads + h) * max_tokens + t) * head_dim of k_out and v_out; the rest is untouched.
/// Host memory for every pointer; no workspace. kInvalidArgument for max_tokens < 0, kNullPointer for
/// a null output when there is anything to copy.
template <class View>
Status copy_kv_to_dense(const Exec&, const View& kv, int max_tokens,
                        std::remove_const_t<typename View::value_type>* k_out,
                        std::remove_const_t<typename View::value_type>* v_out,
                        Workspace /*workspace: none needed*/ = {}) {
  static_assert(check_kv_view<View>());
  KVSIFT_TRY(detail::validate_copy_kv_to_dense(kv, max_tokens, k_out, v_out));
  KVSIFT_TRY(validate_view_host(kv));
  const int d = kv.head_dim;
  for (int b = 0; b < kv.batch; ++b) {
    const int len = kv.length(b) < max_tokens ? kv.length(b) : max_tokens;
    for (int h = 0; h < kv.num_kv_heads; ++h)
      for (int t = 0; t < len; ++t) {
        const std::int64_t out = ((std::int64_t(b) * kv.num_kv_heads + h) * max_tokens + t) * d;
        const auto* k = kv.k_row(b, h, t);
        const auto* v = kv.v_row(b, h, t);
        for (int i = 0; i < d; ++i) {
          k_out[out + i] = k[i];
          v_out[out + i] = v[i];
        }
      }
  }
  return Status();
}

}  // namespace host
}  // namespace kvsift
