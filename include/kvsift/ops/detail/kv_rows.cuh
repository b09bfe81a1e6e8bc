#pragma once
// KvRows: the row addresses of one (sequence, KV head) of a KV view, for kernels that stream its rows
// (decode attention's splits, window_scores' ring). A generic form that asks the view per token, and
// forms for the shipped views that hoist the per-head part of every address.

#include <cstdint>
#include <type_traits>

#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/kv/contiguous_kv.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/kv/paged_kv.hpp"

namespace kvsift {
namespace detail {

// Row addresses of one (batch, KV head): the generic form asks the view per token; the shipped
// views hoist the per-head part and, for power-of-two pages, replace the division by a shift.
//
// A Handle is what a row address needs besides the token id: a kernel that streams computes handles a
// stage ahead (for a paged view that is where the block-table load happens) and forms the addresses
// when it issues the copies.
//
// kAffine: a row's address is a base plus the token times a stride (K, V and the fp8 scale each), so a
// kernel streaming consecutive tokens can advance pointers instead of forming addresses per token.
template <class View>
struct KvRows {
  using T = std::remove_const_t<typename View::value_type>;
  using Handle = int;  // the token
  static constexpr bool kAffine = false;
  View kv;
  int b, h;
  __device__ KvRows(const View& v, int b_, int h_) : kv(v), b(b_), h(h_) {}
  __device__ __forceinline__ const T* k(int t) const { return kv.k_row(b, h, t); }
  __device__ __forceinline__ const T* v(int t) const { return kv.v_row(b, h, t); }
  __device__ __forceinline__ Handle handle(int t) const { return kv_row_in_pool(kv, b, t) ? t : -1; }
  // Whether the row has an address (kv_row_in_pool); a row that has none is skipped, never read.
  __device__ __forceinline__ bool valid(Handle t) const { return t >= 0; }
  // What the record reports for a row without an address: the view's kv_page_of, as the other ops do.
  __device__ __forceinline__ long long bad_value(int t) const { return kv_page_of(kv, b, t); }
  __device__ __forceinline__ const T* k_at(Handle t) const { return k(t); }
  __device__ __forceinline__ const T* v_at(Handle t) const { return v(t); }
  // fp8 only: the index of the row's scale in kv.scales.k / .v.
  __device__ __forceinline__ std::int64_t scale_at(Handle t) const { return kv.scale_offset(b, h, t); }
};

template <class E>
struct KvRows<ContiguousKV<E>> {
  using T = std::remove_const_t<E>;
  const T* k_base;
  const T* v_base;
  std::int64_t k_stride, v_stride;
  std::int64_t scale_base, scale_token_stride;  // fp8 per-token scales: base + t * stride; per head: h
  __device__ KvRows(const ContiguousKV<E>& kv, int b, int h)
      : k_base(kv.k_row(b, h, 0)), v_base(kv.v_row(b, h, 0)), k_stride(kv.k_token_stride), v_stride(kv.v_token_stride),
        scale_base(kv.scale_offset(b, h, 0)),
        scale_token_stride(kv.scales.granularity == ScaleGranularity::kPerToken ? kv.scales.token_stride : 0) {}
  __device__ __forceinline__ const T* k(int t) const { return k_base + t * k_stride; }
  __device__ __forceinline__ const T* v(int t) const { return v_base + t * v_stride; }
  using Handle = int;  // the token: its address is arithmetic
  static constexpr bool kAffine = true;
  __device__ __forceinline__ Handle handle(int t) const { return t; }
  __device__ __forceinline__ bool valid(Handle) const { return true; }  // every token has an address
  __device__ __forceinline__ long long bad_value(int t) const { return t; }
  __device__ __forceinline__ const T* k_at(Handle t) const { return k(t); }
  __device__ __forceinline__ const T* v_at(Handle t) const { return v(t); }
  __device__ __forceinline__ std::int64_t scale_at(Handle t) const { return scale_base + t * scale_token_stride; }
};

template <class E>
struct KvRows<PagedKV<E>> {
  using T = std::remove_const_t<E>;
  const T* k_pages;
  const T* v_pages;
  const std::int32_t* table;
  std::int64_t page_stride, slot_stride, head_offset;
  int page_size, page_shift;  // page_shift < 0: page_size is not a power of two
  // fp8 per-token scales: page * scale_page_stride + slot * scale_slot_stride + scale_head_offset (the
  // view's scale_offset_at, hoisted); per-head scales: scale_head_offset = h, the strides 0.
  std::int64_t scale_page_stride, scale_slot_stride, scale_head_offset;
  int num_pages;
  __device__ KvRows(const PagedKV<E>& kv, int b, int h)
      : k_pages(kv.k_pages), v_pages(kv.v_pages), table(kv.block_table + b * kv.block_table_stride),
        page_stride(kv.page_stride), num_pages(kv.num_pages) {
    const bool nhd = kv.layout == PageLayout::kNHD;
    const bool per_token = kv.scales.granularity == ScaleGranularity::kPerToken;
    scale_page_stride = per_token ? kv.scales.page_stride : 0;
    scale_slot_stride = per_token ? (nhd ? kv.num_kv_heads : 1) : 0;
    scale_head_offset = per_token ? (nhd ? h : std::int64_t(h) * kv.page_size) : h;
    slot_stride = nhd ? std::int64_t(kv.num_kv_heads) * kv.head_dim : kv.head_dim;
    head_offset = nhd ? std::int64_t(h) * kv.head_dim : std::int64_t(h) * kv.page_size * kv.head_dim;
    page_size = kv.page_size;
    page_shift = (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
  }
  // The row's offset (the same in the K and the V pool) and, for fp8, its scale's index: both from one
  // block-table read.
  struct Handle {
    std::int64_t row = 0, scale = 0;
  };
  static constexpr bool kAffine = false;
  __device__ __forceinline__ Handle handle(int t) const {
    int page, slot;
    if (page_shift >= 0) {
      page = t >> page_shift;
      slot = t & (page_size - 1);
    } else {
      page = t / page_size;
      slot = t - page * page_size;
    }
    const int id = __ldg(table + page);
    Handle hd;
    // A page outside the pool has no rows: row -1 marks the token for skipping (valid() below).
    hd.row = unsigned(id) < unsigned(num_pages) ? std::int64_t(id) * page_stride + slot * slot_stride + head_offset : -1;
    if constexpr (is_fp8_dtype<T>::value) hd.scale = id * scale_page_stride + slot * scale_slot_stride + scale_head_offset;
    return hd;
  }
  __device__ __forceinline__ bool valid(Handle o) const { return o.row >= 0; }
  // The bad page id, for the record (the cold path: read again).
  __device__ __forceinline__ long long bad_value(int t) const {
    return __ldg(table + (page_shift >= 0 ? t >> page_shift : t / page_size));
  }
  __device__ __forceinline__ const T* k(int t) const { return k_pages + handle(t).row; }
  __device__ __forceinline__ const T* v(int t) const { return v_pages + handle(t).row; }
  __device__ __forceinline__ const T* k_at(Handle o) const { return k_pages + o.row; }
  __device__ __forceinline__ const T* v_at(Handle o) const { return v_pages + o.row; }
  __device__ __forceinline__ std::int64_t scale_at(Handle o) const { return o.scale; }
};

}  // namespace detail
}  // namespace kvsift
