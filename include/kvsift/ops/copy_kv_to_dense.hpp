#pragma once
// copy_kv_to_dense: read every live row of a KV view into dense [batch, kv_heads, max_tokens, head_dim]
// K and V buffers. It is the simplest op that goes through a view's address map, so it serves to
// check a custom view against a known layout, to export a paged cache, and as the model for how an
// op is laid out (parameters + host reference here, kernel + launcher in the .cuh).
//
// Rows t < min(length(b), max_tokens) are written; the rest of the output is left untouched.

#include <cstdint>

#include "kvsift/core/exec.hpp"
#include "kvsift/core/check.hpp"
#include "kvsift/kv/kv_view.hpp"

namespace kvsift {
namespace detail {

template <class View, class Out>
Status validate_copy_kv_to_dense(const View& kv, int max_tokens, Out* k_out, Out* v_out) {
  KVSIFT_TRY(kv.validate());
  KVSIFT_REQUIRE(max_tokens >= 0, kInvalidArgument, "max_tokens = ", max_tokens, " must be >= 0");
  if (kv.batch == 0 || max_tokens == 0) return Status();
  KVSIFT_REQUIRE_NOT_NULL(k_out, "k_out");
  KVSIFT_REQUIRE_NOT_NULL(v_out, "v_out");
  return Status();
}

}  // namespace detail

namespace host {

template <class View>
Status copy_kv_to_dense(Exec, const View& kv, int max_tokens, std::remove_const_t<typename View::value_type>* k_out,
                        std::remove_const_t<typename View::value_type>* v_out) {
  static_assert(check_kv_view<View>());
  KVSIFT_TRY(detail::validate_copy_kv_to_dense(kv, max_tokens, k_out, v_out));
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
