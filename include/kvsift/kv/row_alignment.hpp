#pragma once
/// \file
/// \brief Whether a view's K/V rows start on 16-byte boundaries, which kernels that move rows with 16-byte
/// vector loads need. The shipped views are checked from their pointers and strides; a custom view
/// promises it (docs/integration.md: keep rows 16-byte aligned to use the vectorised kernels).

#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/kv/contiguous_kv.hpp"
#include "kvsift/kv/paged_kv.hpp"

namespace kvsift {
namespace detail {

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace detail

/// A custom view: always ok, because the view promises 16-byte aligned rows (see the file comment).
template <class V>
Status check_rows_16byte_aligned(const V&) {
  return Status();
}

/// kMisaligned unless k and v are 16-byte aligned and every stride is a multiple of 16 bytes.
template <class T>
Status check_rows_16byte_aligned(const ContiguousKV<T>& kv) {
  constexpr std::int64_t e = 16 / sizeof(T);
  KVSIFT_REQUIRE(detail::aligned16(kv.k) && detail::aligned16(kv.v), kMisaligned, "kv.k and kv.v must be 16-byte aligned");
  const std::int64_t s[6] = {kv.k_batch_stride, kv.k_head_stride, kv.k_token_stride,
                             kv.v_batch_stride, kv.v_head_stride, kv.v_token_stride};
  for (std::int64_t x : s)
    KVSIFT_REQUIRE(x % e == 0, kMisaligned, "kv strides must be multiples of ", e, " elements (16 bytes); got ", x);
  return Status();
}

/// kMisaligned unless both pools are 16-byte aligned and page_stride and head_dim are multiples of
/// 16 bytes.
template <class T>
Status check_rows_16byte_aligned(const PagedKV<T>& kv) {
  constexpr std::int64_t e = 16 / sizeof(T);
  KVSIFT_REQUIRE(detail::aligned16(kv.k_pages) && detail::aligned16(kv.v_pages), kMisaligned,
                 "kv.k_pages and kv.v_pages must be 16-byte aligned");
  KVSIFT_REQUIRE(kv.page_stride % e == 0, kMisaligned, "kv.page_stride = ", kv.page_stride, " must be a multiple of ",
                 e, " elements (16 bytes)");
  KVSIFT_REQUIRE(kv.head_dim % e == 0, kMisaligned, "kv.head_dim = ", kv.head_dim, " must be a multiple of ", e,
                 " elements (16 bytes)");
  return Status();
}

}  // namespace kvsift
