#pragma once
/// \file
/// \brief PagedKV<T>: a paged KV cache as vLLM and FlashInfer keep it.
///
/// K and V each live in a pool of fixed-size pages; page p starts at k_pages + p * page_stride. A
/// block table [batch, max_pages] (row stride block_table_stride) maps a sequence's logical page
/// t / page_size to a physical page. Inside a page the layout is NHD ([page_size, heads, head_dim])
/// or HND ([heads, page_size, head_dim]). page_stride defaults to page_size * heads * head_dim; set it
/// larger when K and V pages interleave in one allocation ([pages, 2, ...]).

#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"
#include "kvsift/core/dtype.hpp"

namespace kvsift {

/// The layout inside one page: NHD [page_size, heads, head_dim] or HND [heads, page_size, head_dim].
enum class PageLayout : int { kNHD, kHND };

/// "NHD" or "HND".
inline const char* to_string(PageLayout l) { return l == PageLayout::kNHD ? "NHD" : "HND"; }

/// A KV view over a paged cache (see the file comment); trivially copyable, passed to kernels by value.
/// Pointers are in the Exec's memory space.
template <class T>
struct PagedKV {
  using value_type = T;  ///< the element type (float, half_t, bfloat16_t, __half, __nv_bfloat16)

  T* k_pages = nullptr;  ///< the K page pool: page p at k_pages + p * page_stride
  T* v_pages = nullptr;  ///< the V page pool, the same page ids and layout as K
  const std::int32_t* block_table = nullptr;  ///< [batch, block_table_stride], physical page ids
  std::int64_t block_table_stride = 0;        ///< in entries; >= max_pages
  int batch = 0;         ///< sequences, >= 0
  int num_kv_heads = 0;  ///< KV heads per sequence, > 0
  int head_dim = 0;      ///< elements per K or V row, > 0
  int page_size = 0;     ///< tokens per page, > 0
  int max_pages = 0;   ///< pages per sequence the table holds; capacity = max_pages * page_size
  int num_pages = 0;   ///< pages in the pool, for validating block tables on the host
  std::int64_t page_stride = 0;  ///< elements between consecutive pages in the pool
  PageLayout layout = PageLayout::kNHD;  ///< NHD or HND inside each page
  const std::int32_t* lengths = nullptr;  ///< [batch]

  /// Tokens a sequence can address: max_pages * page_size.
  KVSIFT_HD int capacity() const { return max_pages * page_size; }

  /// Element offset of token `t`'s row of sequence `b`, KV head `h`, into either pool; reads the block
  /// table, no bounds check.
  KVSIFT_HD std::int64_t row_offset(int b, int h, int t) const {
    const int page = block_table[b * block_table_stride + t / page_size];
    const int slot = t % page_size;
    const std::int64_t in_page = layout == PageLayout::kNHD ? std::int64_t(slot) * num_kv_heads + h
                                                            : std::int64_t(h) * page_size + slot;
    return std::int64_t(page) * page_stride + in_page * head_dim;
  }
  /// The head_dim contiguous K elements of sequence `b`, KV head `h`, token `t`.
  KVSIFT_HD T* k_row(int b, int h, int t) const { return k_pages + row_offset(b, h, t); }
  /// The head_dim contiguous V elements of sequence `b`, KV head `h`, token `t`.
  KVSIFT_HD T* v_row(int b, int h, int t) const { return v_pages + row_offset(b, h, t); }
  /// Length of sequence b, clamped to [0, capacity()] so a bad length can never address out of bounds.
  KVSIFT_HD int length(int b) const {
    const int n = lengths[b];
    const int cap = capacity();
    return n < 0 ? 0 : (n > cap ? cap : n);
  }

  /// Host-side check of the shape (capacity within int32), block_table_stride >= max_pages,
  /// page_stride >= page_size * num_kv_heads * head_dim, the layout, and the pointers (needed when
  /// batch > 0); kInvalidArgument or kNullPointer naming the field. Reads no device memory.
  Status validate() const;
  /// Host-only deep check: every page id a sequence uses (its first ceil(len / page_size) entries) is
  /// in [0, num_pages). Reads block_table and lengths, so both must be host memory.
  Status validate_block_table_host() const;
};

/// A paged view with the default strides: block_table_stride = max_pages, page_stride = page_size *
/// num_kv_heads * head_dim (set page_stride afterwards for interleaved K/V pools).
template <class T>
PagedKV<T> make_paged(T* k_pages, T* v_pages, const std::int32_t* block_table, int batch, int max_pages,
                      int num_pages, int num_kv_heads, int page_size, int head_dim, PageLayout layout,
                      const std::int32_t* lengths) {
  PagedKV<T> kv;
  kv.k_pages = k_pages;
  kv.v_pages = v_pages;
  kv.block_table = block_table;
  kv.block_table_stride = max_pages;
  kv.batch = batch;
  kv.num_kv_heads = num_kv_heads;
  kv.head_dim = head_dim;
  kv.page_size = page_size;
  kv.max_pages = max_pages;
  kv.num_pages = num_pages;
  kv.page_stride = std::int64_t(page_size) * num_kv_heads * head_dim;
  kv.layout = layout;
  kv.lengths = lengths;
  return kv;
}

template <class T>
Status PagedKV<T>::validate() const {
  static_assert(is_supported_dtype<T>::value, "PagedKV<T>: T must be float, half_t, bfloat16_t, __half or __nv_bfloat16");
  KVSIFT_REQUIRE(batch >= 0, kInvalidArgument, "kv.batch = ", batch, " must be >= 0");
  KVSIFT_REQUIRE(num_kv_heads > 0, kInvalidArgument, "kv.num_kv_heads = ", num_kv_heads, " must be > 0");
  KVSIFT_REQUIRE(head_dim > 0, kInvalidArgument, "kv.head_dim = ", head_dim, " must be > 0");
  KVSIFT_REQUIRE(page_size > 0, kInvalidArgument, "kv.page_size = ", page_size, " must be > 0");
  KVSIFT_REQUIRE(max_pages >= 0, kInvalidArgument, "kv.max_pages = ", max_pages, " must be >= 0");
  KVSIFT_REQUIRE(num_pages >= 0, kInvalidArgument, "kv.num_pages = ", num_pages, " must be >= 0");
  KVSIFT_REQUIRE(std::int64_t(max_pages) * page_size <= INT32_MAX, kInvalidArgument, "kv.max_pages * kv.page_size = ",
                 std::int64_t(max_pages) * page_size, " exceeds the int32 token range");
  KVSIFT_REQUIRE(block_table_stride >= max_pages, kInvalidArgument, "kv.block_table_stride = ", block_table_stride,
                 " must be >= max_pages = ", max_pages);
  KVSIFT_REQUIRE(page_stride >= std::int64_t(page_size) * num_kv_heads * head_dim, kInvalidArgument,
                 "kv.page_stride = ", page_stride, " must be >= page_size * num_kv_heads * head_dim = ",
                 std::int64_t(page_size) * num_kv_heads * head_dim);
  KVSIFT_REQUIRE(layout == PageLayout::kNHD || layout == PageLayout::kHND, kInvalidArgument, "kv.layout = ",
                 static_cast<int>(layout), " is not NHD or HND");
  if (batch == 0) return Status();
  KVSIFT_REQUIRE_NOT_NULL(k_pages, "kv.k_pages");
  KVSIFT_REQUIRE_NOT_NULL(v_pages, "kv.v_pages");
  KVSIFT_REQUIRE_NOT_NULL(block_table, "kv.block_table");
  KVSIFT_REQUIRE_NOT_NULL(lengths, "kv.lengths");
  return Status();
}

template <class T>
Status PagedKV<T>::validate_block_table_host() const {
  KVSIFT_TRY(validate());
  for (int b = 0; b < batch; ++b) {
    const int used = (length(b) + page_size - 1) / page_size;
    for (int p = 0; p < used; ++p) {
      const std::int32_t id = block_table[b * block_table_stride + p];
      KVSIFT_REQUIRE(id >= 0 && id < num_pages, kInvalidArgument, "kv.block_table[", b, "][", p, "] = ", id,
                     " is outside the page pool [0, ", num_pages, ")");
    }
  }
  return Status();
}

}  // namespace kvsift
