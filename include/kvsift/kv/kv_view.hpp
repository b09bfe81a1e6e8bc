#pragma once
/// \file
/// \brief The KV-view concept: what a kernel needs from an engine's KV cache.
///
/// A view is a small trivially-copyable struct passed to kernels by value. For batch index b, KV head h
/// and token t < length(b), it yields pointers to the head_dim contiguous elements of that token's K
/// and V rows. That is all: kernels never assume how rows are arranged, so ContiguousKV, PagedKV and
/// any engine-specific layout run through the same kernels. Required members:
///
///   using value_type = T;                       // float, half_t, bfloat16_t, __half, __nv_bfloat16 or fp8
///   int batch, num_kv_heads, head_dim;          // data members
///   KVSIFT_HD T* k_row(int b, int h, int t) const;
///   KVSIFT_HD T* v_row(int b, int h, int t) const;
///   KVSIFT_HD int length(int b) const;          // tokens of sequence b; never beyond what is addressable
///   Status validate() const;                    // host-side parameter check
///
/// An fp8 view (value_type fp8_e4m3_t, fp8_e5m2_t, __nv_fp8_e4m3 or __nv_fp8_e5m2) also needs
///
///   KVSIFT_HD float k_scale(int b, int h, int t) const;   // element i of K is to_float(k_row(b, h, t)[i]) * k_scale(b, h, t)
///   KVSIFT_HD float v_scale(int b, int h, int t) const;
///
/// (ContiguousKV and PagedKV have them, from their `scales` member, kv/kv_scales.hpp); other views may
/// have them and are read as if they returned 1 without (kv_k_scale, kv_v_scale).
///
/// Optional: `int capacity` or `int capacity() const`, the tokens a sequence can hold; ops that write
/// through a view (cache compaction) check their output size against it.
///
/// check_kv_view<View>() turns a mismatch into one readable static_assert instead of a template error
/// deep inside a kernel. docs/integration.md walks through writing a view for a custom layout.

#include <type_traits>
#include <utility>

#include "kvsift/core/config.hpp"
#include "kvsift/core/dtype.hpp"
#include "kvsift/core/status.hpp"

namespace kvsift {
namespace detail {

template <class V, class = void>
struct has_value_type : std::false_type {};
template <class V>
struct has_value_type<V, std::void_t<typename V::value_type>> : std::true_type {};

template <class V, class = void>
struct has_shape_members : std::false_type {};
template <class V>
struct has_shape_members<V, std::void_t<decltype(int(std::declval<const V&>().batch)),
                                        decltype(int(std::declval<const V&>().num_kv_heads)),
                                        decltype(int(std::declval<const V&>().head_dim))>> : std::true_type {};

template <class V, class = void>
struct has_k_row : std::false_type {};
template <class V>
struct has_k_row<V, std::enable_if_t<std::is_convertible_v<decltype(std::declval<const V&>().k_row(0, 0, 0)),
                                                           const typename V::value_type*>>> : std::true_type {};

template <class V, class = void>
struct has_v_row : std::false_type {};
template <class V>
struct has_v_row<V, std::enable_if_t<std::is_convertible_v<decltype(std::declval<const V&>().v_row(0, 0, 0)),
                                                           const typename V::value_type*>>> : std::true_type {};

template <class V, class = void>
struct has_length : std::false_type {};
template <class V>
struct has_length<V, std::enable_if_t<std::is_convertible_v<decltype(std::declval<const V&>().length(0)), int>>>
    : std::true_type {};

template <class V, class = void>
struct has_validate : std::false_type {};
template <class V>
struct has_validate<V, std::enable_if_t<std::is_same_v<decltype(std::declval<const V&>().validate()), Status>>>
    : std::true_type {};

template <class V, class = void>
struct has_capacity_function : std::false_type {};
template <class V>
struct has_capacity_function<V, std::void_t<decltype(int(std::declval<const V&>().capacity()))>> : std::true_type {};

template <class V, class = void>
struct has_capacity_member : std::false_type {};
template <class V>
struct has_capacity_member<V, std::enable_if_t<std::is_member_object_pointer_v<decltype(&V::capacity)>>>
    : std::true_type {};

template <class V, class = void>
struct has_k_scale : std::false_type {};
template <class V>
struct has_k_scale<V, std::enable_if_t<std::is_convertible_v<decltype(std::declval<const V&>().k_scale(0, 0, 0)), float>>>
    : std::true_type {};

template <class V, class = void>
struct has_v_scale : std::false_type {};
template <class V>
struct has_v_scale<V, std::enable_if_t<std::is_convertible_v<decltype(std::declval<const V&>().v_scale(0, 0, 0)), float>>>
    : std::true_type {};

template <class V, bool HasValueType = has_value_type<V>::value>
struct value_type_supported : std::false_type {};
template <class V>
struct value_type_supported<V, true> : is_kv_dtype<std::remove_const_t<typename V::value_type>> {};

template <class V, bool HasValueType = has_value_type<V>::value>
struct value_type_fp8 : std::false_type {};
template <class V>
struct value_type_fp8<V, true> : is_fp8_dtype<std::remove_const_t<typename V::value_type>> {};

}  // namespace detail

/// True when V has every required member of a KV view (above) and is trivially copyable; the
/// readable form of the check is check_kv_view<V>().
template <class V>
inline constexpr bool is_kv_view_v = detail::has_value_type<V>::value && detail::has_shape_members<V>::value &&
                                     detail::has_k_row<V>::value && detail::has_v_row<V>::value &&
                                     detail::has_length<V>::value && detail::has_validate<V>::value &&
                                     std::is_trivially_copyable_v<V> &&
                                     (!detail::value_type_fp8<V>::value ||
                                      (detail::has_k_scale<V>::value && detail::has_v_scale<V>::value));

/// True when the view's K and V are fp8 (value_type fp8_e4m3_t, fp8_e5m2_t, __nv_fp8_e4m3 or
/// __nv_fp8_e5m2, optionally const): rows are read with k_scale / v_scale.
template <class V>
inline constexpr bool is_fp8_view_v = detail::value_type_fp8<V>::value;

/// The factor K row (b, h, t) of `kv` is dequantized with: kv.k_scale(b, h, t) when the view has it, else 1.
template <class V>
KVSIFT_HD float kv_k_scale(const V& kv, int b, int h, int t) {
  if constexpr (detail::has_k_scale<V>::value) return kv.k_scale(b, h, t);
  else return (void)kv, (void)b, (void)h, (void)t, 1.f;
}
/// The factor V row (b, h, t) of `kv` is dequantized with: kv.v_scale(b, h, t) when the view has it, else 1.
template <class V>
KVSIFT_HD float kv_v_scale(const V& kv, int b, int h, int t) {
  if constexpr (detail::has_v_scale<V>::value) return kv.v_scale(b, h, t);
  else return (void)kv, (void)b, (void)h, (void)t, 1.f;
}

/// Tokens a view can hold per sequence, when it says (an optional member: `int capacity` or
/// `int capacity() const`); -1 when it does not, and ops that write through a view then trust the caller.
template <class V>
int kv_capacity(const V& kv) {
  if constexpr (detail::has_capacity_function<V>::value) {
    return kv.capacity();
  } else if constexpr (detail::has_capacity_member<V>::value) {
    return kv.capacity;
  } else {
    (void)kv;
    return -1;
  }
}

/// Host-side deep check of a view whose memory is host memory, before a host op dereferences it: a
/// view has nothing more to check by default; PagedKV overloads it with its block-table check
/// (validate_block_table_host), so an out-of-pool page id is a clear error, never a crash.
template <class V>
Status validate_view_host(const V& kv) {
  (void)kv;
  return Status();
}

/// What the default kv_row_in_pool returns: a true that the compiler can see, so kernels know
/// (kv_rows_always_in_pool) that a view has no overload and compile out checks that would cost work per
/// element (window_scores masks keys inside its tensor-core tiles) for contiguous caches.
struct RowAlwaysInPool {
  /// Always true: every row of such a view has an address.
  KVSIFT_HD constexpr operator bool() const { return true; }
};

/// Whether token `t` of sequence `b` has an address the view vouches for, checked on the device before
/// a kernel reads or writes the row: true by default (RowAlwaysInPool); PagedKV overloads it (its
/// block-table entry must lie in [0, num_pages)), so a page id from a scheduler bug is skipped and
/// recorded (core/data_error.hpp) instead of read or written out of the pool. A custom view whose
/// address map can fail offers the same overload in its namespace, returning bool.
template <class V>
KVSIFT_HD constexpr RowAlwaysInPool kv_row_in_pool(const V& kv, int b, int t) {
  (void)kv, (void)b, (void)t;
  return RowAlwaysInPool{};
}

/// Whether every row of a V has an address: V's kv_row_in_pool is the default one.
template <class V>
inline constexpr bool kv_rows_always_in_pool =
    std::is_same_v<decltype(kv_row_in_pool(std::declval<const V&>(), 0, 0)), RowAlwaysInPool>;

/// What a data-error record reports for a row that fails kv_row_in_pool: the page id for PagedKV, the
/// token otherwise.
template <class V>
KVSIFT_HD long long kv_page_of(const V& kv, int b, int t) {
  (void)kv, (void)b;
  return t;
}

/// Call at the top of every op templated on a view. Each assert names the member that is missing.
template <class V>
constexpr bool check_kv_view() {
  static_assert(detail::has_value_type<V>::value,
                "kvsift KV view: missing `using value_type = T;` (the element type of K and V)");
  static_assert(detail::value_type_supported<V>::value,
                "kvsift KV view: value_type must be float, kvsift::half_t, kvsift::bfloat16_t, __half, "
                "__nv_bfloat16 or an fp8 type (kvsift::fp8_e4m3_t, fp8_e5m2_t, __nv_fp8_e4m3, __nv_fp8_e5m2), "
                "optionally const");
  static_assert(detail::has_shape_members<V>::value,
                "kvsift KV view: missing int members `batch`, `num_kv_heads` and `head_dim`");
  static_assert(detail::has_k_row<V>::value,
                "kvsift KV view: missing `KVSIFT_HD value_type* k_row(int batch, int kv_head, int token) const`");
  static_assert(detail::has_v_row<V>::value,
                "kvsift KV view: missing `KVSIFT_HD value_type* v_row(int batch, int kv_head, int token) const`");
  static_assert(detail::has_length<V>::value,
                "kvsift KV view: missing `KVSIFT_HD int length(int batch) const` (clamped to what is addressable)");
  static_assert(detail::has_validate<V>::value, "kvsift KV view: missing `kvsift::Status validate() const`");
  static_assert(!detail::value_type_fp8<V>::value || detail::has_k_scale<V>::value,
                "kvsift KV view: an fp8 view needs `KVSIFT_HD float k_scale(int batch, int kv_head, int token) const` "
                "(K element i = to_float(k_row(b, h, t)[i]) * k_scale(b, h, t))");
  static_assert(!detail::value_type_fp8<V>::value || detail::has_v_scale<V>::value,
                "kvsift KV view: an fp8 view needs `KVSIFT_HD float v_scale(int batch, int kv_head, int token) const` "
                "(V element i = to_float(v_row(b, h, t)[i]) * v_scale(b, h, t))");
  static_assert(std::is_trivially_copyable_v<V>,
                "kvsift KV view: the view is passed to kernels by value and must be trivially copyable "
                "(no std::vector, no virtual functions, no user-defined copy)");
  return true;
}

}  // namespace kvsift
