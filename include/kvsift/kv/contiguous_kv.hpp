#pragma once
/// \file
/// \brief ContiguousKV<T>: a KV cache whose K and V live in strided dense tensors.
///
/// Element (b, h, t, :) of K is at k + b*k_batch_stride + h*k_head_stride + t*k_token_stride, and the
/// head_dim elements of a row are contiguous. Strides are in elements and independent for K and V, so
/// the one type covers BHSD ([batch, heads, seq, dim]), BSHD ([batch, seq, heads, dim]), K and V halves
/// of one fused tensor, and caches with spare capacity per sequence.

#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"
#include "kvsift/core/dtype.hpp"

namespace kvsift {

/// A KV view over strided dense K and V tensors (see the file comment); trivially copyable, passed to
/// kernels by value. Pointers are in the Exec's memory space.
template <class T>
struct ContiguousKV {
  using value_type = T;  ///< the element type (float, half_t, bfloat16_t, __half, __nv_bfloat16)

  T* k = nullptr;         ///< K element (0, 0, 0, 0)
  T* v = nullptr;         ///< V element (0, 0, 0, 0)
  int batch = 0;          ///< sequences, >= 0
  int num_kv_heads = 0;   ///< KV heads per sequence, > 0
  int head_dim = 0;       ///< elements per K or V row, > 0
  int capacity = 0;  ///< tokens addressable per sequence; lengths are clamped to it
  /// \var k_head_stride
  /// Elements between the K rows of consecutive KV heads (>= head_dim when num_kv_heads > 1).

  /// \var v_head_stride
  /// Elements between the V rows of consecutive KV heads (>= head_dim when num_kv_heads > 1).

  /// Elements between the K rows of consecutive sequences; every stride is in elements and >= 0.
  std::int64_t k_batch_stride = 0, k_head_stride = 0, k_token_stride = 0;  ///< k_token_stride: between tokens
  /// Elements between the V rows of consecutive sequences.
  std::int64_t v_batch_stride = 0, v_head_stride = 0, v_token_stride = 0;  ///< v_token_stride: between tokens
  const std::int32_t* lengths = nullptr;  ///< [batch], host or device memory as the backend needs

  /// The head_dim contiguous K elements of sequence `b`, KV head `h`, token `t`; no bounds check.
  KVSIFT_HD T* k_row(int b, int h, int t) const {
    return k + b * k_batch_stride + h * k_head_stride + t * k_token_stride;
  }
  /// The head_dim contiguous V elements of sequence `b`, KV head `h`, token `t`; no bounds check.
  KVSIFT_HD T* v_row(int b, int h, int t) const {
    return v + b * v_batch_stride + h * v_head_stride + t * v_token_stride;
  }
  /// Length of sequence b, clamped to [0, capacity] so a bad length can never address out of bounds.
  KVSIFT_HD int length(int b) const {
    const int n = lengths[b];
    return n < 0 ? 0 : (n > capacity ? capacity : n);
  }

  /// Host-side check of the shape, the pointers (needed when batch > 0) and the strides (>= 0; token
  /// and head rows must not overlap); kInvalidArgument or kNullPointer naming the field. Reads no lengths.
  Status validate() const;
};

/// [batch, heads, capacity, head_dim] for both K and V.
template <class T>
ContiguousKV<T> make_bhsd(T* k, T* v, int batch, int num_kv_heads, int capacity, int head_dim,
                          const std::int32_t* lengths) {
  ContiguousKV<T> kv;
  kv.k = k;
  kv.v = v;
  kv.batch = batch;
  kv.num_kv_heads = num_kv_heads;
  kv.head_dim = head_dim;
  kv.capacity = capacity;
  kv.k_token_stride = kv.v_token_stride = head_dim;
  kv.k_head_stride = kv.v_head_stride = std::int64_t(capacity) * head_dim;
  kv.k_batch_stride = kv.v_batch_stride = std::int64_t(num_kv_heads) * capacity * head_dim;
  kv.lengths = lengths;
  return kv;
}

/// [batch, capacity, heads, head_dim] for both K and V.
template <class T>
ContiguousKV<T> make_bshd(T* k, T* v, int batch, int num_kv_heads, int capacity, int head_dim,
                          const std::int32_t* lengths) {
  ContiguousKV<T> kv = make_bhsd(k, v, batch, num_kv_heads, capacity, head_dim, lengths);
  kv.k_head_stride = kv.v_head_stride = head_dim;
  kv.k_token_stride = kv.v_token_stride = std::int64_t(num_kv_heads) * head_dim;
  return kv;
}

template <class T>
Status ContiguousKV<T>::validate() const {
  static_assert(is_supported_dtype<T>::value, "ContiguousKV<T>: T must be float, half_t, bfloat16_t, __half or __nv_bfloat16");
  KVSIFT_REQUIRE(batch >= 0, kInvalidArgument, "kv.batch = ", batch, " must be >= 0");
  KVSIFT_REQUIRE(num_kv_heads > 0, kInvalidArgument, "kv.num_kv_heads = ", num_kv_heads, " must be > 0");
  KVSIFT_REQUIRE(head_dim > 0, kInvalidArgument, "kv.head_dim = ", head_dim, " must be > 0");
  KVSIFT_REQUIRE(capacity >= 0, kInvalidArgument, "kv.capacity = ", capacity, " must be >= 0");
  if (batch == 0) return Status();
  KVSIFT_REQUIRE_NOT_NULL(k, "kv.k");
  KVSIFT_REQUIRE_NOT_NULL(v, "kv.v");
  KVSIFT_REQUIRE_NOT_NULL(lengths, "kv.lengths");
  const std::int64_t strides[6] = {k_batch_stride, k_head_stride, k_token_stride,
                                   v_batch_stride, v_head_stride, v_token_stride};
  const char* names[6] = {"kv.k_batch_stride", "kv.k_head_stride", "kv.k_token_stride",
                          "kv.v_batch_stride", "kv.v_head_stride", "kv.v_token_stride"};
  for (int i = 0; i < 6; ++i)
    KVSIFT_REQUIRE(strides[i] >= 0, kInvalidArgument, names[i], " = ", strides[i], " must be >= 0");
  // A row of head_dim elements must not overlap the next token's or head's row.
  KVSIFT_REQUIRE(capacity <= 1 || k_token_stride >= head_dim, kInvalidArgument, "kv.k_token_stride = ",
                 k_token_stride, " must be >= head_dim = ", head_dim);
  KVSIFT_REQUIRE(capacity <= 1 || v_token_stride >= head_dim, kInvalidArgument, "kv.v_token_stride = ",
                 v_token_stride, " must be >= head_dim = ", head_dim);
  KVSIFT_REQUIRE(num_kv_heads == 1 || k_head_stride >= head_dim, kInvalidArgument, "kv.k_head_stride = ",
                 k_head_stride, " must be >= head_dim = ", head_dim);
  KVSIFT_REQUIRE(num_kv_heads == 1 || v_head_stride >= head_dim, kInvalidArgument, "kv.v_head_stride = ",
                 v_head_stride, " must be >= head_dim = ", head_dim);
  return Status();
}

}  // namespace kvsift
