#pragma once
/// \file
/// \brief copy_kv_to_dense: read every live row of a KV view into dense
/// [batch, kv_heads, max_tokens, head_dim] K and V buffers.
///
/// It is the simplest op that goes through a view's address map, so it serves to check a custom view
/// against a known layout, to export a paged cache, and as the model for how an op is laid out: this
/// header is the contract (validation), copy_kv_to_dense_plan.hpp the workspace query,
/// copy_kv_to_dense_reference.hpp the host reference, copy_kv_to_dense.cuh the CUDA launcher with its
/// kernel in detail/copy_kv_to_dense_kernel.cuh.
///
/// Rows t < min(length(b), max_tokens) are written; the rest of the output is left untouched.
/// max_tokens >= 0; k_out and v_out (the view's element type, in the Exec's memory space) may be null
/// only when nothing is copied.

#include <cstdint>
#include <type_traits>

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
}  // namespace kvsift
