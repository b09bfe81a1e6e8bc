#pragma once
/// \file
/// \brief KvScales: the dequantization scales of an fp8 KV cache.
///
/// An fp8 element of a K (or V) row stands for to_float(code) * scale. The scale is either one float per
/// KV head for the whole cache (ScaleGranularity::kPerHead: k[h], v[h]) or one float per (token, KV
/// head) (kPerToken), written next to the row by store_kv when the token is appended. Per-token scales
/// are addressed like the rows they belong to:
///
///   ContiguousKV: k[b * batch_stride + t * token_stride + h * head_stride], any strides
///                 (make_per_token_scales_for makes [batch, capacity, heads],
///                 make_per_token_scales_head_major [batch, heads, capacity], which the GPU decode
///                 reads in 16-byte pieces); page_stride stays 0.
///   PagedKV:      one float per (page, slot, head) in the page layout of the rows: page p's scales at
///                 k + p * page_stride, inside it [page_size, heads] for NHD pages and [heads,
///                 page_size] for HND ones, so a kernel that has the row's page id and slot has the
///                 scale's address too (PagedKV::scale_offset_at); the other strides stay 0.
///
/// K and V scales share one layout (the same offsets into k and v). The strides are int32 (offsets are
/// computed in int64): with them a view stays within the 128 bytes up to which nvcc keeps a kernel
/// parameter's fields block-uniform (docs/architecture.md), fp8 or not. The pointers are writable, like the
/// view's rows, because store_kv and compact_kv write per-token scales through the view. Views of 16-
/// or 32-bit types ignore the member entirely; fp8 views validate it (null pointers, strides that do not
/// fit the view or the granularity are named errors). docs/ops/decode_attention.md, "fp8 KV cache",
/// shows how an engine lays the scales out.

#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"

namespace kvsift {

/// What one scale covers: every token of one KV head (kPerHead), or one token of one KV head (kPerToken).
enum class ScaleGranularity : int { kPerHead, kPerToken };

/// "per-head" or "per-token".
inline const char* to_string(ScaleGranularity g) { return g == ScaleGranularity::kPerHead ? "per-head" : "per-token"; }

/// The dequantization scales of an fp8 view (see the file comment); trivially copyable, a member of
/// ContiguousKV and PagedKV. Pointers are in the Exec's memory space, like the view's rows.
struct KvScales {
  float* k = nullptr;  ///< K scales: [num_kv_heads] per head, else addressed as the file comment says
  float* v = nullptr;  ///< V scales, the same layout as k
  ScaleGranularity granularity = ScaleGranularity::kPerHead;  ///< what one scale covers
  /// ContiguousKV per-token: floats between the scales of consecutive sequences.
  std::int32_t batch_stride = 0;
  /// ContiguousKV per-token: floats between the scales of consecutive tokens.
  std::int32_t token_stride = 0;
  /// ContiguousKV per-token: floats between the scales of consecutive KV heads.
  std::int32_t head_stride = 0;
  /// PagedKV per-token: floats between the scales of consecutive pages, >= page_size * num_kv_heads.
  std::int32_t page_stride = 0;
};

/// Per-head scales: token t of KV head h reads k[h] and v[h] (arrays of num_kv_heads floats).
inline KvScales make_per_head_scales(float* k, float* v) {
  KvScales s;
  s.k = k;
  s.v = v;
  s.granularity = ScaleGranularity::kPerHead;
  return s;
}

namespace detail {

/// The pointer and granularity checks every fp8 view shares; the views add their stride checks.
inline Status validate_scale_pointers(const KvScales& s) {
  KVSIFT_REQUIRE(s.granularity == ScaleGranularity::kPerHead || s.granularity == ScaleGranularity::kPerToken,
                 kInvalidArgument, "kv.scales.granularity = ", static_cast<int>(s.granularity),
                 " is not per-head or per-token");
  KVSIFT_REQUIRE_NOT_NULL(s.k, "kv.scales.k");
  KVSIFT_REQUIRE_NOT_NULL(s.v, "kv.scales.v");
  return Status();
}

/// Per-head scales are k[h], v[h]: a stride set means the scales were built for another granularity.
inline Status validate_per_head_scale_strides(const KvScales& s) {
  const std::int32_t strides[4] = {s.batch_stride, s.token_stride, s.head_stride, s.page_stride};
  const char* names[4] = {"kv.scales.batch_stride", "kv.scales.token_stride", "kv.scales.head_stride",
                          "kv.scales.page_stride"};
  for (int i = 0; i < 4; ++i)
    KVSIFT_REQUIRE(strides[i] == 0, kInvalidArgument, names[i], " = ", strides[i],
                   " must be 0: per-head scales are k[h], v[h] (set granularity = per-token for per-token scales)");
  return Status();
}

}  // namespace detail

static_assert(sizeof(KvScales) <= 40, "KvScales keeps ContiguousKV and PagedKV within 128 bytes");

}  // namespace kvsift
