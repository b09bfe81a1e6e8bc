#pragma once
/// \file
/// \brief ContiguousKV<T>: a KV cache whose K and V live in strided dense tensors.
///
/// Element (b, h, t, :) of K is at k + b*k_batch_stride + h*k_head_stride + t*k_token_stride, and the
/// head_dim elements of a row are contiguous. Strides are in elements and independent for K and V, so
/// the one type covers BHSD ([batch, heads, seq, dim]), BSHD ([batch, seq, heads, dim]), K and V halves
/// of one fused tensor, and caches with spare capacity per sequence.
///
/// For fp8 T (fp8_e4m3_t, fp8_e5m2_t) the member `scales` (kv/kv_scales.hpp) holds the dequantization
/// scales, per KV head or per (token, KV head); k_scale / v_scale read them (1 for other types).

#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"
#include "kvsift/core/dtype.hpp"
#include "kvsift/kv/kv_scales.hpp"

namespace kvsift {

/// A KV view over strided dense K and V tensors (see the file comment); trivially copyable, passed to
/// kernels by value. Pointers are in the Exec's memory space.
template <class T>
struct ContiguousKV {
  using value_type = T;  ///< the element type (float, half_t, bfloat16_t, __half, __nv_bfloat16, fp8)

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
  /// fp8 only: the dequantization scales (per head, or per token at batch/token/head strides); ignored
  /// for 16/32-bit T. Set with make_per_head_scales or make_per_token_scales_for.
  KvScales scales;

  /// The head_dim contiguous K elements of sequence `b`, KV head `h`, token `t`; no bounds check.
  KVSIFT_HD T* k_row(int b, int h, int t) const {
    return k + b * k_batch_stride + h * k_head_stride + t * k_token_stride;
  }
  /// The head_dim contiguous V elements of sequence `b`, KV head `h`, token `t`; no bounds check.
  KVSIFT_HD T* v_row(int b, int h, int t) const {
    return v + b * v_batch_stride + h * v_head_stride + t * v_token_stride;
  }
  /// Length of sequence b, clamped to [0, capacity] so a bad length can never address out of bounds.
  KVSIFT_HD int length(int b) const { return clamp_length(lengths[b]); }
  /// A length as length() clamps it (a kernel can load lengths[b] early and clamp it where it uses it).
  KVSIFT_HD int clamp_length(int n) const { return n < 0 ? 0 : (n > capacity ? capacity : n); }
  /// Index into scales.k / scales.v of the scale of sequence `b`, KV head `h`, token `t`: h per head,
  /// b * batch_stride + t * token_stride + h * head_stride per token. No bounds check.
  KVSIFT_HD std::int64_t scale_offset(int b, int h, int t) const {
    return scales.granularity == ScaleGranularity::kPerToken
               ? std::int64_t(b) * scales.batch_stride + std::int64_t(t) * scales.token_stride +
                     std::int64_t(h) * scales.head_stride
               : std::int64_t(h);
  }
  /// The factor K row (b, h, t) is dequantized with: scales.k[scale_offset(b, h, t)] for fp8, 1 otherwise.
  KVSIFT_HD float k_scale(int b, int h, int t) const {
    if constexpr (is_fp8_dtype<T>::value) return scales.k[scale_offset(b, h, t)];
    else return (void)b, (void)h, (void)t, 1.f;
  }
  /// The factor V row (b, h, t) is dequantized with: scales.v[scale_offset(b, h, t)] for fp8, 1 otherwise.
  KVSIFT_HD float v_scale(int b, int h, int t) const {
    if constexpr (is_fp8_dtype<T>::value) return scales.v[scale_offset(b, h, t)];
    else return (void)b, (void)h, (void)t, 1.f;
  }

  /// Host-side check of the shape, the pointers (needed when batch > 0) and the strides (>= 0; token
  /// and head rows must not overlap); for fp8 T also the scales (non-null, strides that fit the
  /// granularity and do not overlap); kInvalidArgument or kNullPointer naming the field. Reads no lengths.
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

/// Per-token scales laid out [batch, capacity, heads] for `kv` (head_stride 1, token_stride heads,
/// batch_stride capacity * heads: kv.batch * kv.capacity * kv.num_kv_heads floats for K and as many for V).
template <class T>
KvScales make_per_token_scales_for(const ContiguousKV<T>& kv, float* k, float* v) {
  KvScales s;
  s.k = k;
  s.v = v;
  s.granularity = ScaleGranularity::kPerToken;
  s.head_stride = 1;
  s.token_stride = kv.num_kv_heads;
  // Beyond int32 the stride wraps negative, which validate() names.
  s.batch_stride = static_cast<std::int32_t>(std::int64_t(kv.capacity) * kv.num_kv_heads);
  return s;
}

/// Per-token scales laid out [batch, heads, head_capacity] for `kv` (token_stride 1, head_stride
/// head_capacity, batch_stride heads * head_capacity; head_capacity 0 means kv.capacity, which takes as
/// many floats as make_per_token_scales_for). The layout decode attention streams fastest on the GPU: a
/// stage's 64 scales of one head are 256 consecutive bytes, copied in 16-byte pieces where a head's
/// scales start 16-byte aligned, so an engine whose capacity is not a multiple of 4 passes it rounded up
/// (and allocates batch * heads * head_capacity floats); [batch, capacity, heads] costs one 4-byte read
/// per scale.
template <class T>
KvScales make_per_token_scales_head_major(const ContiguousKV<T>& kv, float* k, float* v, int head_capacity = 0) {
  KvScales s = make_per_token_scales_for(kv, k, v);  // the same sequences, heads and tokens within one
  const std::int64_t per_head = head_capacity > 0 ? head_capacity : kv.capacity;
  s.token_stride = 1;
  s.head_stride = static_cast<std::int32_t>(per_head);
  // Beyond int32 the stride wraps negative, which validate() names.
  s.batch_stride = static_cast<std::int32_t>(per_head * kv.num_kv_heads);
  return s;
}

namespace detail {

/// The per-token scale strides of a contiguous view: >= 0, no page_stride, and no two (b, t, h) of the
/// view sharing a float (sorted by stride, each dimension must step past the previous one's extent).
inline Status validate_contiguous_scales(const KvScales& s, int batch, int capacity, int heads) {
  KVSIFT_TRY(validate_scale_pointers(s));
  if (s.granularity == ScaleGranularity::kPerHead) return validate_per_head_scale_strides(s);
  KVSIFT_REQUIRE(s.page_stride == 0, kInvalidArgument, "kv.scales.page_stride = ", s.page_stride,
                 " is for PagedKV; ContiguousKV per-token scales use batch_stride, token_stride and head_stride");
  std::int64_t stride[3] = {s.batch_stride, s.token_stride, s.head_stride};
  std::int64_t extent[3] = {batch, capacity, heads};
  const char* name[3] = {"kv.scales.batch_stride", "kv.scales.token_stride", "kv.scales.head_stride"};
  for (int i = 0; i < 3; ++i)
    KVSIFT_REQUIRE(stride[i] >= 0, kInvalidArgument, name[i], " = ", stride[i], " must be >= 0");
  int order[3] = {0, 1, 2};  // by stride, then by extent so a dimension of extent 1 comes first
  for (int i = 0; i < 3; ++i)
    for (int j = i + 1; j < 3; ++j)
      if (stride[order[j]] < stride[order[i]] ||
          (stride[order[j]] == stride[order[i]] && extent[order[j]] < extent[order[i]])) {
        const int t = order[i];
        order[i] = order[j];
        order[j] = t;
      }
  std::int64_t span = 1;  // floats covered by the dimensions already placed
  for (int i = 0; i < 3; ++i) {
    const int d = order[i];
    if (extent[d] <= 1) continue;
    KVSIFT_REQUIRE(stride[d] >= span, kInvalidArgument, name[d], " = ", stride[d], " must be >= ", span,
                   ": the scales of two (sequence, token, head) would share a float (per-token scales of ",
                   batch, " x ", capacity, " x ", heads, ")");
    span = stride[d] * extent[d];
  }
  return Status();
}

}  // namespace detail

// Views are kernel parameters: within 128 bytes nvcc keeps their fields block-uniform (docs/architecture.md).
static_assert(sizeof(ContiguousKV<float>) <= 128, "ContiguousKV must stay within 128 bytes");

template <class T>
Status ContiguousKV<T>::validate() const {
  static_assert(is_kv_dtype<T>::value,
                "ContiguousKV<T>: T must be float, half_t, bfloat16_t, __half, __nv_bfloat16 or an fp8 type");
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
  if constexpr (is_fp8_dtype<T>::value) KVSIFT_TRY(detail::validate_contiguous_scales(scales, batch, capacity, num_kv_heads));
  return Status();
}

}  // namespace kvsift
