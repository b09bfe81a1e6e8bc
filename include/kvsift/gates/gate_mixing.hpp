#pragma once
/// \file
/// \brief Output mixing for gate training (docs/algorithms/hardkuma.md §10.2): in each layer l >= 1 the
/// student's attention output of query head h is
///
///   O[t, h, :] = z[h / G] * O_dense[t, h, :] + (1 - z[h / G]) * O_sparse[t, h, :]
///
/// with z the layer's gate vector [kv_heads] broadcast over the G = q_heads / kv_heads query heads of
/// each KV head (layer 0 is never mixed; that is the caller's loop). Backward:
///
///   dL/dO_dense = z dL/dO,   dL/dO_sparse = (1 - z) dL/dO,   dL/dz[j] = sum over t, the G heads of j, d of
///   dL/dO * (O_dense - O_sparse).
///
/// Layout: O, O_dense, O_sparse and dL/dO are [tokens, q_heads, head_dim], rows `token_stride`
/// elements apart (default q_heads * head_dim), heads contiguous within a row. Element type float,
/// half_t or bfloat16_t (CUDA: also __half / __nv_bfloat16); z and dL/dz are float. Arithmetic in
/// float, and the mix is evaluated as fma(z, dense - sparse, sparse) on both backends so they agree
/// bitwise.
///
/// This header is the contract: the shape, validation, the mix formula and the workspace queries. The
/// host reference is in gate_mixing_reference.hpp, the CUDA ops in gate_mixing.cuh. Both ops have the
/// one shape (const Exec& first, a trailing Workspace); they need no workspace (the queries report 0)
/// and no device facts.

#include <cstddef>
#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"
#include "kvsift/gates/detail/no_workspace_bytes.hpp"
#include "kvsift/gates/detail/scalar_math.hpp"

namespace kvsift {

/// The shape of one layer's mixing: O, O_dense, O_sparse and their gradients are [tokens, q_heads,
/// head_dim] with rows token_stride elements apart; z and dL/dz are [kv_heads].
struct GateMixShape {
  std::int64_t tokens = 0;  ///< token rows, >= 0
  int q_heads = 0;          ///< query heads, a positive multiple of kv_heads
  int kv_heads = 0;         ///< KV heads (one gate each), > 0
  int head_dim = 0;         ///< elements per head, > 0
  std::int64_t token_stride = -1;  ///< elements between consecutive tokens; -1 = q_heads * head_dim

  /// Elements between consecutive tokens: token_stride, or q_heads * head_dim when it is -1.
  KVSIFT_HD std::int64_t row_stride() const { return token_stride < 0 ? std::int64_t(q_heads) * head_dim : token_stride; }
  /// G: query heads per KV head (query head h belongs to KV head h / G).
  KVSIFT_HD int group_size() const { return q_heads / kv_heads; }
  /// Element offset of (token t, query head h, element d).
  KVSIFT_HD std::int64_t offset(std::int64_t t, int h, int d) const { return t * row_stride() + std::int64_t(h) * head_dim + d; }
};

namespace detail {

inline Status validate_gate_mix_shape(const GateMixShape& s) {
  KVSIFT_REQUIRE(s.tokens >= 0, kInvalidArgument, "shape.tokens = ", s.tokens, " must be >= 0");
  KVSIFT_REQUIRE(s.kv_heads > 0, kInvalidArgument, "shape.kv_heads = ", s.kv_heads, " must be > 0");
  KVSIFT_REQUIRE(s.q_heads > 0 && s.q_heads % s.kv_heads == 0, kInvalidArgument, "shape.q_heads = ", s.q_heads,
                 " must be a positive multiple of shape.kv_heads = ", s.kv_heads);
  KVSIFT_REQUIRE(s.head_dim > 0, kInvalidArgument, "shape.head_dim = ", s.head_dim, " must be > 0");
  KVSIFT_REQUIRE(s.token_stride < 0 || s.token_stride >= std::int64_t(s.q_heads) * s.head_dim, kInvalidArgument,
                 "shape.token_stride = ", s.token_stride, " must be >= q_heads * head_dim = ",
                 std::int64_t(s.q_heads) * s.head_dim);
  return Status();
}

/// What gate_mix_forward checks on both backends; no pointer is needed when there are no tokens.
template <class T>
Status validate_gate_mix_forward(const GateMixShape& s, const float* z, const T* o_dense, const T* o_sparse,
                                 const T* o) {
  KVSIFT_TRY(validate_gate_mix_shape(s));
  if (s.tokens == 0) return Status();
  KVSIFT_REQUIRE_NOT_NULL(z, "z");
  KVSIFT_REQUIRE_NOT_NULL(o_dense, "o_dense");
  KVSIFT_REQUIRE_NOT_NULL(o_sparse, "o_sparse");
  KVSIFT_REQUIRE_NOT_NULL(o, "o");
  return Status();
}

/// What gate_mix_backward checks on both backends: z and grad_o when there are tokens, and the two
/// outputs whose difference dL/dz needs when grad_z is asked for.
template <class T>
Status validate_gate_mix_backward(const GateMixShape& s, const float* z, const T* o_dense, const T* o_sparse,
                                  const T* grad_o, const float* grad_z) {
  KVSIFT_TRY(validate_gate_mix_shape(s));
  if (s.tokens == 0) return Status();
  KVSIFT_REQUIRE_NOT_NULL(z, "z");
  KVSIFT_REQUIRE_NOT_NULL(grad_o, "grad_o");
  if (grad_z) {
    KVSIFT_REQUIRE_NOT_NULL(o_dense, "o_dense");
    KVSIFT_REQUIRE_NOT_NULL(o_sparse, "o_sparse");
  }
  return Status();
}

KVSIFT_HD inline float mix_value(float z, float dense, float sparse) { return gm::fma(z, dense - sparse, sparse); }

}  // namespace detail

// ---- Workspace queries (both backends; each reports 0) ----

/// Workspace of gate_mix_forward, for either backend's Exec and with the op's arguments: always 0.
/// kNullPointer when `bytes` is null.
template <class T, class Exec>
Status gate_mix_forward_workspace_bytes(const Exec&, const GateMixShape&, const float* /*z*/, const T* /*o_dense*/,
                                        const T* /*o_sparse*/, T* /*o*/, std::size_t* bytes) {
  return detail::no_workspace_bytes(bytes);
}

/// Workspace of gate_mix_backward, for either backend's Exec and with the op's arguments: always 0.
/// kNullPointer when `bytes` is null.
template <class T, class Exec>
Status gate_mix_backward_workspace_bytes(const Exec&, const GateMixShape&, const float* /*z*/, const T* /*o_dense*/,
                                         const T* /*o_sparse*/, const T* /*grad_o*/, T* /*grad_dense*/,
                                         T* /*grad_sparse*/, float* /*grad_z*/, std::size_t* bytes) {
  return detail::no_workspace_bytes(bytes);
}

}  // namespace kvsift
