#pragma once
/// \file
/// \brief compact_kv: write the kept part of a prompt's KV cache into a destination view.
///
/// Stage 3 of prompt-cache compression. For destination row r = b * H_dst + h (H_dst = dst.num_kv_heads)
/// the kept prefix positions kept.row(r)[0, n) (ascending, n = kept.count(r)) go to destination slots
/// [0, n), then the last w = min(window, L) prompt tokens [L - w, L) to slots [n, n + w), where
/// L = src.length(b). Source head = h / (H_dst / H_src), so a destination with one head per query head
/// (the SnapKV reference layout) is filled from the shared KV head.
///
/// Outputs: new_lengths[b] = n + w (same for every head of a sequence when the selection gave every
/// head the same count, as the compression policies do; the op writes the count of head 0), and
/// optionally positions[r * positions_stride + s], the original position of slot s. Keys are stored
/// post-RoPE, so nothing is re-rotated: decode continues at position L + t, not at new_length + t.
///
/// Aliasing: the destination must not overlap the source rows still to be read. Compaction into fresh
/// pages (or a fresh tensor) is always safe; in-place compaction into the same storage is not supported
/// by the CUDA backend (slots are written in parallel).
/// Entries of `kept` outside [0, L - w) are skipped (their slots are not written) rather than read out
/// of bounds; the policies never produce them.
///
/// fp8 views: the codes are copied with their scales. Source and destination hold the same fp8 type
/// and the same scale granularity; per-token, slot s's scale is the source token's; per-head, every
/// destination head's scale is written from its source head (dst.scales.k[h] = src.scales.k[h / group]),
/// so the destination's scale arrays must not alias the source's unless the head counts match.
///
/// This header is the contract (outputs, validation, the slot map every backend uses). The workspace
/// query is in compact_kv_plan.hpp, the host reference in compact_kv_reference.hpp, the CUDA launcher
/// in compact_kv.cuh (kernel in detail/compact_kv_kernel.cuh).

#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"
#include "kvsift/kv/index_set.hpp"
#include "kvsift/kv/kv_scales.hpp"
#include "kvsift/kv/kv_view.hpp"

namespace kvsift {

/// Where compact_kv reports the compacted cache (see the file comment); pointers live in the
/// backend's memory space.
struct CompactOutputs {
  std::int32_t* new_lengths = nullptr;   ///< [batch], required: n + w, the compacted length
  /// [dst rows, positions_stride], optional: the original position of each slot, -1 for a slot left empty
  std::int32_t* positions = nullptr;
  std::int64_t positions_stride = 0;     ///< >= slots written per row (kept capacity + window)
};

namespace detail {

template <class Src, class Dst>
Status validate_compact_kv(const Src& src, const ConstIndexSet& kept, int window, const Dst& dst,
                           const CompactOutputs& out) {
  static_assert(is_fp8_view_v<Src> == is_fp8_view_v<Dst>,
                "compact_kv: an fp8 view compacts into an fp8 view of the same type (codes move with their scales)");
  KVSIFT_TRY(src.validate());
  KVSIFT_TRY(dst.validate());
  if constexpr (is_fp8_view_v<Dst>) {
    KVSIFT_REQUIRE(dst.scales.granularity == src.scales.granularity, kInvalidArgument, "dst.scales.granularity = ",
                   to_string(dst.scales.granularity), " must equal src.scales.granularity = ",
                   to_string(src.scales.granularity));
  }
  KVSIFT_TRY(kept.validate("kept"));
  KVSIFT_REQUIRE(window >= 0, kInvalidArgument, "window = ", window, " must be >= 0");
  KVSIFT_REQUIRE(dst.batch == src.batch, kInvalidArgument, "dst.batch = ", dst.batch, " must equal src.batch = ",
                 src.batch);
  KVSIFT_REQUIRE(dst.head_dim == src.head_dim, kInvalidArgument, "dst.head_dim = ", dst.head_dim,
                 " must equal src.head_dim = ", src.head_dim);
  KVSIFT_REQUIRE(dst.num_kv_heads % src.num_kv_heads == 0, kInvalidArgument, "dst.num_kv_heads = ",
                 dst.num_kv_heads, " must be a multiple of src.num_kv_heads = ", src.num_kv_heads);
  KVSIFT_REQUIRE(kept.granularity == Granularity::kToken, kInvalidArgument, "kept.granularity must be token");
  KVSIFT_REQUIRE(kept.rows >= dst.batch * dst.num_kv_heads, kInvalidArgument, "kept.rows = ", kept.rows,
                 " must be >= dst.batch * dst.num_kv_heads = ", dst.batch * dst.num_kv_heads);
  const int needed = kept.capacity + window;
  const int cap = kv_capacity(dst);
  KVSIFT_REQUIRE(cap < 0 || cap >= needed, kInsufficientSpace, "dst capacity = ", cap,
                 " is smaller than kept.capacity + window = ", needed);
  KVSIFT_REQUIRE(dst.batch == 0 || out.new_lengths != nullptr, kNullPointer, "new_lengths is null");
  KVSIFT_REQUIRE(out.positions == nullptr || out.positions_stride >= needed, kInvalidArgument,
                 "positions_stride = ", out.positions_stride, " must be >= kept.capacity + window = ", needed);
  return Status();
}

// Source position of destination slot s of row r, or -1 when the slot stays empty.
KVSIFT_HD inline int compact_source_position(const ConstIndexSet& kept, int r, int s, int len, int window) {
  const int w = window < len ? window : len;
  const int n = kept.count(r);
  if (s < n) {
    const int p = kept.row(r)[s];
    return (p >= 0 && p < len - w) ? p : -1;
  }
  return s < n + w ? len - w + (s - n) : -1;
}

/// Copies the scales of destination slot s of (b, h) from source token p of head src_head: per token
/// that slot's pair when the slot is filled (p >= 0); per head, once per destination head (at sequence
/// 0, slot 0, filled or not), dst head h from src_head.
template <class Src, class Dst>
KVSIFT_HD void compact_copy_scales(const Src& src, const Dst& dst, int b, int h, int src_head, int s, int p) {
  if constexpr (is_fp8_view_v<Dst>) {
    if (dst.scales.granularity == ScaleGranularity::kPerToken) {
      if (p < 0) return;
      const std::int64_t to = dst.scale_offset(b, h, s), from = src.scale_offset(b, src_head, p);
      dst.scales.k[to] = src.scales.k[from];
      dst.scales.v[to] = src.scales.v[from];
    } else if (s == 0 && b == 0) {
      dst.scales.k[h] = src.scales.k[src_head];
      dst.scales.v[h] = src.scales.v[src_head];
    }
  } else {
    (void)src, (void)dst, (void)b, (void)h, (void)src_head, (void)s, (void)p;
  }
}

}  // namespace detail

}  // namespace kvsift
