#pragma once
// One layer's KV cache in either of the two layouts engines use, and the kvsift view of it.
//
//   contiguous  K and V each one [max_batch, kv_heads, capacity, head_dim] tensor: kvsift::ContiguousKV
//               (make_bhsd). Simple, but every sequence reserves the whole capacity.
//   paged       K and V each a pool of pages of page_size tokens ([page_size, kv_heads, head_dim],
//               vLLM's NHD), and a block table [max_batch, pages_per_sequence] of physical page ids:
//               kvsift::PagedKV (make_paged). kvsift reads the cache only through the view, so the
//               decoder's code above this file is the same for both.
//
// kvsift's launchers are templates over the view type. with_view() hands the caller's generic
// lambda the right view, so every kvsift call is written once and compiled for both layouts:
//
//   cache.with_view(batch, d_lengths, [&](const auto& kv) { decode_attention(exec, kv, params, ws, bytes); });
//
// The page table here is fixed when the cache is made: page p of sequence b is physical page
// p * max_batch + b, so no sequence's pages are adjacent and every access goes through the table.
// A serving engine hands pages out from a free list as sequences grow; kvsift does not care how the
// table was filled, only that the pages a sequence's length covers are valid (PagedKV::validate_block_table_host).

#include <cstdint>
#include <string>
#include <vector>

#include <kvsift/kvsift.hpp>

#include "engine/errors.hpp"

namespace minimal_decoder {

enum class KvLayout { kContiguous, kPaged };

inline const char* kv_layout_name(KvLayout l) { return l == KvLayout::kPaged ? "paged" : "contiguous"; }

struct KvCacheShape {
  KvLayout layout = KvLayout::kContiguous;
  int max_batch = 0, capacity = 0, num_kv_heads = 0, head_dim = 0;
  int page_size = 16;  // paged only
};

template <class Backend>
class LayerKvCache {
 public:
  using KV = typename Backend::KvType;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  LayerKvCache() = default;
  LayerKvCache(const Backend& be, const KvCacheShape& s) : shape_(s) {
    if (s.layout == KvLayout::kPaged) {
      if (s.page_size < 1) throw DecoderError("--page-size must be >= 1");
      pages_per_sequence_ = (s.capacity + s.page_size - 1) / s.page_size;
      const std::int64_t pages = std::int64_t(s.max_batch) * pages_per_sequence_;
      if (pages > INT32_MAX) throw DecoderError("KV cache: more pages than an int32 page id can name");
      std::vector<std::int32_t> table(static_cast<std::size_t>(pages));
      for (int b = 0; b < s.max_batch; ++b)
        for (int p = 0; p < pages_per_sequence_; ++p)
          table[std::size_t(b) * pages_per_sequence_ + p] = std::int32_t(std::int64_t(p) * s.max_batch + b);
      block_table_ = be.template alloc<std::int32_t>(table.size());
      be.upload(block_table_.data(), table.data(), table.size());
      elements_ = std::size_t(pages) * s.page_size * s.num_kv_heads * s.head_dim;
    } else {
      elements_ = std::size_t(s.max_batch) * s.num_kv_heads * s.capacity * s.head_dim;
    }
    k_ = be.template alloc<KV>(elements_);
    v_ = be.template alloc<KV>(elements_);
  }

  const KvCacheShape& shape() const { return shape_; }
  // The K and V storage (a page pool when paged), e.g. to fill it with random values.
  KV* k_storage() { return k_.data(); }
  KV* v_storage() { return v_.data(); }
  std::size_t storage_elements() const { return elements_; }

  // f(view) with the layout's kvsift view of sequences [0, batch), lengths[batch] in backend memory.
  // kvsift views carry mutable pointers; through a const cache they are only ever read.
  template <class F>
  decltype(auto) with_view(int batch, const std::int32_t* lengths, F&& f) const {
    if (shape_.layout == KvLayout::kPaged) return f(paged_view(batch, lengths, 0));
    return f(contiguous_view(batch, lengths, 0));
  }
  // f(view) with the view of the single sequence b, lengths pointing at its length: prefill attends
  // sequence by sequence, each with its own number of queries.
  template <class F>
  decltype(auto) with_sequence_view(int b, const std::int32_t* lengths_b, F&& f) const {
    if (shape_.layout == KvLayout::kPaged) return f(paged_view(1, lengths_b, b));
    return f(contiguous_view(1, lengths_b, b));
  }
  // The contiguous view, for offline tools that index the cache on the host (passkey probes).
  kvsift::ContiguousKV<KV> contiguous(int batch, const std::int32_t* lengths) const {
    if (shape_.layout != KvLayout::kContiguous) throw DecoderError("this tool needs the contiguous KV layout");
    return contiguous_view(batch, lengths, 0);
  }

 private:
  kvsift::ContiguousKV<KV> contiguous_view(int batch, const std::int32_t* lengths, int first) const {
    const std::int64_t per_sequence = std::int64_t(shape_.num_kv_heads) * shape_.capacity * shape_.head_dim;
    KV* k = const_cast<KV*>(k_.data()) + first * per_sequence;
    KV* v = const_cast<KV*>(v_.data()) + first * per_sequence;
    return kvsift::make_bhsd(k, v, batch, shape_.num_kv_heads, shape_.capacity, shape_.head_dim, lengths);
  }
  kvsift::PagedKV<KV> paged_view(int batch, const std::int32_t* lengths, int first) const {
    const std::int64_t pages = std::int64_t(shape_.max_batch) * pages_per_sequence_;
    return kvsift::make_paged(const_cast<KV*>(k_.data()), const_cast<KV*>(v_.data()),
                              block_table_.data() + std::int64_t(first) * pages_per_sequence_, batch, pages_per_sequence_,
                              int(pages), shape_.num_kv_heads, shape_.page_size, shape_.head_dim, kvsift::PageLayout::kNHD,
                              lengths);
  }

  KvCacheShape shape_;
  int pages_per_sequence_ = 0;
  std::size_t elements_ = 0;
  Buffer<KV> k_, v_;
  Buffer<std::int32_t> block_table_;
};

}  // namespace minimal_decoder
