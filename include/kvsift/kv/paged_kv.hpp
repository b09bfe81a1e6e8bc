#pragma once
/// \file
/// \brief PagedKV<T>: a paged KV cache as vLLM and FlashInfer keep it.
///
/// K and V each live in a pool of fixed-size pages; page p starts at k_pages + p * page_stride. A
/// block table [batch, max_pages] (row stride block_table_stride) maps a sequence's logical page
/// t / page_size to a physical page. Inside a page the layout is NHD ([page_size, heads, head_dim])
/// or HND ([heads, page_size, head_dim]). page_stride defaults to page_size * heads * head_dim; set it
/// larger when K and V pages interleave in one allocation ([pages, 2, ...]).
///
/// For fp8 T the member `scales` (kv/kv_scales.hpp) holds the dequantization scales: per KV head, or one
/// float per (page, slot, head) in the rows' page layout, so the scale of a row sits at the row's
/// in-page index (scale_offset_at) and needs no second block-table read.

#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"
#include "kvsift/core/dtype.hpp"
#include "kvsift/kv/kv_scales.hpp"

namespace kvsift {

/// The layout inside one page: NHD [page_size, heads, head_dim] or HND [heads, page_size, head_dim].
enum class PageLayout : int { kNHD, kHND };

/// "NHD" or "HND".
inline const char* to_string(PageLayout l) { return l == PageLayout::kNHD ? "NHD" : "HND"; }

/// A KV view over a paged cache (see the file comment); trivially copyable, passed to kernels by value.
/// Pointers are in the Exec's memory space.
template <class T>
struct PagedKV {
  using value_type = T;  ///< the element type (float, half_t, bfloat16_t, __half, __nv_bfloat16, fp8)

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
  /// fp8 only: the dequantization scales (per head, or per (page, slot, head) at scales.page_stride);
  /// ignored for 16/32-bit T. Set with make_per_head_scales or make_per_token_scales_for.
  KvScales scales;

  /// Tokens a sequence can address: max_pages * page_size.
  KVSIFT_HD int capacity() const { return max_pages * page_size; }

  /// Index of KV head `h`, slot `slot` inside a page, in rows (NHD: slot * heads + h; HND: h * page_size
  /// + slot); rows and per-token scales share it.
  KVSIFT_HD std::int64_t in_page_index(int h, int slot) const {
    return layout == PageLayout::kNHD ? std::int64_t(slot) * num_kv_heads + h : std::int64_t(h) * page_size + slot;
  }
  /// The block-table entry of the page holding token `t` of sequence `b` (unchecked: see kv_row_in_pool).
  KVSIFT_HD int page_id(int b, int t) const { return block_table[b * block_table_stride + t / page_size]; }
  /// Element offset of token `t`'s row of sequence `b`, KV head `h`, into either pool; reads the block
  /// table, no bounds check (kernels test kv_row_in_pool first).
  KVSIFT_HD std::int64_t row_offset(int b, int h, int t) const {
    const int page = page_id(b, t);
    return std::int64_t(page) * page_stride + in_page_index(h, t % page_size) * head_dim;
  }
  /// Index into scales.k / scales.v of the scale of KV head `h` at `slot` of physical page `page`: h per
  /// head, page * scales.page_stride + in_page_index(h, slot) per token. For a kernel that already read
  /// the page id for the row.
  KVSIFT_HD std::int64_t scale_offset_at(int page, int h, int slot) const {
    return scales.granularity == ScaleGranularity::kPerToken ? std::int64_t(page) * scales.page_stride + in_page_index(h, slot)
                                                             : std::int64_t(h);
  }
  /// Index into scales.k / scales.v of the scale of sequence `b`, KV head `h`, token `t` (reads the block
  /// table for per-token scales).
  KVSIFT_HD std::int64_t scale_offset(int b, int h, int t) const {
    if (scales.granularity != ScaleGranularity::kPerToken) return h;
    return scale_offset_at(block_table[b * block_table_stride + t / page_size], h, t % page_size);
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
  /// The head_dim contiguous K elements of sequence `b`, KV head `h`, token `t`.
  KVSIFT_HD T* k_row(int b, int h, int t) const { return k_pages + row_offset(b, h, t); }
  /// The head_dim contiguous V elements of sequence `b`, KV head `h`, token `t`.
  KVSIFT_HD T* v_row(int b, int h, int t) const { return v_pages + row_offset(b, h, t); }
  /// Length of sequence b, clamped to [0, capacity()] so a bad length can never address out of bounds.
  KVSIFT_HD int length(int b) const { return clamp_length(lengths[b]); }
  /// A length as length() clamps it (a kernel can load lengths[b] early and clamp it where it uses it).
  KVSIFT_HD int clamp_length(int n) const {
    const int cap = capacity();
    return n < 0 ? 0 : (n > cap ? cap : n);
  }

  /// Host-side check of the shape (capacity within int32), block_table_stride >= max_pages,
  /// page_stride >= page_size * num_kv_heads * head_dim, the layout, and the pointers (needed when
  /// batch > 0), and for fp8 T the scales (non-null; per token: page_stride >= page_size * num_kv_heads
  /// and no contiguous strides); kInvalidArgument or kNullPointer naming the field. Reads no device memory.
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

/// Per-token scales for `kv`: one float per (page, slot, head) in the view's page layout, pages
/// page_size * num_kv_heads floats apart (kv.num_pages * page_size * num_kv_heads floats for K, as many for V).
template <class T>
KvScales make_per_token_scales_for(const PagedKV<T>& kv, float* k, float* v) {
  KvScales s;
  s.k = k;
  s.v = v;
  s.granularity = ScaleGranularity::kPerToken;
  s.page_stride = kv.page_size * kv.num_kv_heads;
  return s;
}

namespace detail {

/// Per-token scales of a paged view follow its page layout: only page_stride is free.
inline Status validate_paged_scales(const KvScales& s, int page_size, int heads) {
  KVSIFT_TRY(validate_scale_pointers(s));
  if (s.granularity == ScaleGranularity::kPerHead) return validate_per_head_scale_strides(s);
  const std::int32_t strides[3] = {s.batch_stride, s.token_stride, s.head_stride};
  const char* names[3] = {"kv.scales.batch_stride", "kv.scales.token_stride", "kv.scales.head_stride"};
  for (int i = 0; i < 3; ++i)
    KVSIFT_REQUIRE(strides[i] == 0, kInvalidArgument, names[i], " = ", strides[i],
                   " is for ContiguousKV; PagedKV per-token scales follow the page layout (set page_stride)");
  KVSIFT_REQUIRE(s.page_stride >= std::int64_t(page_size) * heads, kInvalidArgument, "kv.scales.page_stride = ",
                 s.page_stride, " must be >= page_size * num_kv_heads = ", std::int64_t(page_size) * heads);
  return Status();
}

}  // namespace detail

// Views are kernel parameters: within 128 bytes nvcc keeps their fields block-uniform (docs/architecture.md).
static_assert(sizeof(PagedKV<float>) <= 128, "PagedKV must stay within 128 bytes");

template <class T>
Status PagedKV<T>::validate() const {
  static_assert(is_kv_dtype<T>::value,
                "PagedKV<T>: T must be float, half_t, bfloat16_t, __half, __nv_bfloat16 or an fp8 type");
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
  if constexpr (is_fp8_dtype<T>::value) KVSIFT_TRY(detail::validate_paged_scales(scales, page_size, num_kv_heads));
  return Status();
}

/// validate_view_host for a paged view: its block table (validate_block_table_host).
template <class T>
Status validate_view_host(const PagedKV<T>& kv) {
  return kv.validate_block_table_host();
}

/// kv_row_in_pool for a paged view (kv_view.hpp): the page holding token t lies in the pool. Reads the
/// block table, so it runs where the table lives (the device, for the kernels).
template <class T>
KVSIFT_HD bool kv_row_in_pool(const PagedKV<T>& kv, int b, int t) {
  const int id = kv.page_id(b, t);
  return id >= 0 && id < kv.num_pages;
}

/// kv_page_of for a paged view: the block-table entry of the row's page.
template <class T>
KVSIFT_HD long long kv_page_of(const PagedKV<T>& kv, int b, int t) {
  return kv.page_id(b, t);
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
