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
// KV dtype: the backend's own (float on the CPU, bf16 on the GPU), or fp8 E4M3 with one float scale per
// (token, KV head) for K and for V (--kv-dtype fp8): kvsift::store_kv quantizes each appended row with
// the scale amax / 448 and writes the scale next to it, and every kvsift op reads code * scale. The
// scales follow the rows: [batch, heads, capacity] for the contiguous layout
// (kvsift::make_per_token_scales_head_major), one float per (page, slot, head) in the page layout for
// the paged one (kvsift::make_per_token_scales_for).
//
// The page table here is fixed when the cache is made: page p of sequence b is physical page
// p * max_batch + b, so no sequence's pages are adjacent and every access goes through the table.
// A serving engine hands pages out from a free list as sequences grow; kvsift does not care how the
// table was filled, only that the pages a sequence's length covers are valid (PagedKV::validate_block_table_host).

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <kvsift/kvsift.hpp>

#include "engine/errors.hpp"

namespace minimal_decoder {

enum class KvLayout { kContiguous, kPaged };

// What the cache stores: the backend's KvType, or fp8 E4M3 codes with per-token scales.
enum class KvDtype { kNative, kFp8 };

inline const char* kv_dtype_name(KvDtype d) { return d == KvDtype::kFp8 ? "fp8 e4m3, per-token scales" : "native"; }

inline const char* kv_layout_name(KvLayout l) { return l == KvLayout::kPaged ? "paged" : "contiguous"; }

struct KvCacheShape {
  KvLayout layout = KvLayout::kContiguous;
  int max_batch = 0, capacity = 0, num_kv_heads = 0, head_dim = 0;
  int page_size = 16;  // paged only
  KvDtype dtype = KvDtype::kNative;
};

template <class Backend>
class LayerKvCache {
 public:
  using KV = typename Backend::KvType;
  using Fp8 = kvsift::fp8_e4m3_t;
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
    if (s.dtype == KvDtype::kFp8) {
      k8_ = be.template alloc<Fp8>(elements_);
      v8_ = be.template alloc<Fp8>(elements_);
      // One K and one V scale per row of head_dim elements. A contiguous cache's head of scales starts
      // on 16 bytes (its capacity rounded up to 4 floats), so the GPU decode copies them 4 at a time
      // whatever the capacity.
      scale_elements_ = elements_ / std::size_t(s.head_dim);
      if (s.layout == KvLayout::kContiguous) {
        scale_capacity_ = (s.capacity + 3) / 4 * 4;
        scale_elements_ = std::size_t(s.max_batch) * s.num_kv_heads * std::size_t(scale_capacity_);
      }
      k_scales_ = be.template alloc<float>(scale_elements_);
      v_scales_ = be.template alloc<float>(scale_elements_);
    } else {
      k_ = be.template alloc<KV>(elements_);
      v_ = be.template alloc<KV>(elements_);
    }
  }

  const KvCacheShape& shape() const { return shape_; }
  bool is_fp8() const { return shape_.dtype == KvDtype::kFp8; }
  // The K and V storage of a native cache (a page pool when paged), e.g. to fill it with random values.
  KV* k_storage() { return k_.data(); }
  KV* v_storage() { return v_.data(); }
  std::size_t storage_elements() const { return elements_; }
  // An fp8 cache's codes (storage_elements() each) and their per-token scales (scale_elements() each).
  Fp8* k_codes() { return k8_.data(); }
  Fp8* v_codes() { return v8_.data(); }
  float* k_scales() { return k_scales_.data(); }
  float* v_scales() { return v_scales_.data(); }
  std::size_t scale_elements() const { return scale_elements_; }

  // f(view) with the layout's kvsift view of sequences [0, batch), lengths[batch] in backend memory.
  // kvsift views carry mutable pointers; through a const cache they are only ever read.
  template <class F>
  decltype(auto) with_view(int batch, const std::int32_t* lengths, F&& f) const {
    if (is_fp8()) {
      if (shape_.layout == KvLayout::kPaged) return f(paged_view<Fp8>(batch, lengths, 0));
      return f(contiguous_view<Fp8>(batch, lengths, 0));
    }
    if (shape_.layout == KvLayout::kPaged) return f(paged_view<KV>(batch, lengths, 0));
    return f(contiguous_view<KV>(batch, lengths, 0));
  }
  // f(view) with the view of the single sequence b, lengths pointing at its length: prefill attends
  // sequence by sequence, each with its own number of queries.
  template <class F>
  decltype(auto) with_sequence_view(int b, const std::int32_t* lengths_b, F&& f) const {
    if (is_fp8()) {
      if (shape_.layout == KvLayout::kPaged) return f(paged_view<Fp8>(1, lengths_b, b));
      return f(contiguous_view<Fp8>(1, lengths_b, b));
    }
    if (shape_.layout == KvLayout::kPaged) return f(paged_view<KV>(1, lengths_b, b));
    return f(contiguous_view<KV>(1, lengths_b, b));
  }
  // The contiguous view of a native cache, for offline tools that index the cache on the host (passkey probes).
  kvsift::ContiguousKV<KV> contiguous(int batch, const std::int32_t* lengths) const {
    if (shape_.layout != KvLayout::kContiguous) throw DecoderError("this tool needs the contiguous KV layout");
    if (is_fp8()) throw DecoderError("this tool needs the native KV dtype (not --kv-dtype fp8)");
    return contiguous_view<KV>(batch, lengths, 0);
  }
  // The contiguous view over storage of type T (KV or fp8, whichever the cache holds), scales included.
  template <class T>
  kvsift::ContiguousKV<T> contiguous_as(int batch, const std::int32_t* lengths) const {
    if (shape_.layout != KvLayout::kContiguous) throw DecoderError("this tool needs the contiguous KV layout");
    return contiguous_view<T>(batch, lengths, 0);
  }

 private:
  template <class T>
  T* storage(bool k) const {
    if constexpr (std::is_same_v<T, Fp8>) return const_cast<T*>(k ? k8_.data() : v8_.data());
    else return const_cast<T*>(k ? k_.data() : v_.data());
  }
  template <class T>
  kvsift::ContiguousKV<T> contiguous_view(int batch, const std::int32_t* lengths, int first) const {
    const std::int64_t per_sequence = std::int64_t(shape_.num_kv_heads) * shape_.capacity * shape_.head_dim;
    T* k = storage<T>(true) + first * per_sequence;
    T* v = storage<T>(false) + first * per_sequence;
    auto kv = kvsift::make_bhsd(k, v, batch, shape_.num_kv_heads, shape_.capacity, shape_.head_dim, lengths);
    if constexpr (std::is_same_v<T, Fp8>) {
      // [batch, heads, capacity] scales, like the rows: a head's consecutive tokens have consecutive
      // scales, which the GPU decode reads 16 bytes at a time instead of one 32-byte sector per token
      // ([batch, capacity, heads] strides a head's scales by heads * 4 bytes). A one-sequence view
      // starts at its sequence's scales.
      const std::int64_t scales_per_sequence = std::int64_t(scale_capacity_) * shape_.num_kv_heads;
      kv.scales = kvsift::make_per_token_scales_head_major(kv, const_cast<float*>(k_scales_.data()) + first * scales_per_sequence,
                                                           const_cast<float*>(v_scales_.data()) + first * scales_per_sequence,
                                                           scale_capacity_);
    }
    return kv;
  }
  template <class T>
  kvsift::PagedKV<T> paged_view(int batch, const std::int32_t* lengths, int first) const {
    const std::int64_t pages = std::int64_t(shape_.max_batch) * pages_per_sequence_;
    auto kv = kvsift::make_paged(storage<T>(true), storage<T>(false),
                                 block_table_.data() + std::int64_t(first) * pages_per_sequence_, batch, pages_per_sequence_,
                                 int(pages), shape_.num_kv_heads, shape_.page_size, shape_.head_dim, kvsift::PageLayout::kNHD,
                                 lengths);
    if constexpr (std::is_same_v<T, Fp8>)  // one scale per (page, slot, head): the rows' own page layout
      kv.scales = kvsift::make_per_token_scales_for(kv, const_cast<float*>(k_scales_.data()),
                                                    const_cast<float*>(v_scales_.data()));
    return kv;
  }

  KvCacheShape shape_;
  int pages_per_sequence_ = 0;
  std::size_t elements_ = 0;
  int scale_capacity_ = 0;          // fp8 contiguous: scales per (sequence, head), capacity rounded up to 4
  std::size_t scale_elements_ = 0;  // fp8: K (and V) scales allocated
  Buffer<KV> k_, v_;
  Buffer<Fp8> k8_, v8_;               // --kv-dtype fp8: codes
  Buffer<float> k_scales_, v_scales_;  // and their per-token scales
  Buffer<std::int32_t> block_table_;
};

}  // namespace minimal_decoder
