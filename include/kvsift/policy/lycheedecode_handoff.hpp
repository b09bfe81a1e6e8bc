#pragma once
/// \file
/// \brief The index handoff of one LycheeDecode layer: the glue between the retrieval heads' fused scores
/// and the index table that later layers' sparse heads read.
///
/// The score matrix and the index table both have one row per (sequence b, KV head h), r = b * H + h.
/// Only the rows of this layer's retrieval heads may change; a sparse head's row must survive, since
/// it carries the set of the latest earlier retrieval layer of that head. So, per layer:
///
///   1. plan_selection_rows   per row, into scratch: the entries top-k ranks (the sequence's tokens
///                            or blocks), the ratio-mode budget floor(keep * L), and in block mode the
///                            first block that holds one of the last `recent` tokens;
///   2. topk                  with its row filter set to the layer's roles: writes each retrieval row's
///                            entries and count straight into the table and leaves sparse rows alone.
///
/// The table has that one writer. Step 1 exists twice, here (host reference) and in
/// lycheedecode_handoff.cuh (CUDA), and both call the same per-row function, so the backends agree
/// bit for bit.

#include <cstdint>

#include "kvsift/core/exec.hpp"
#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"
#include "kvsift/kv/head_roles.hpp"
#include "kvsift/ops/topk.hpp"

namespace kvsift {

/// What plan_selection_rows needs; pointers in the backend's memory space.
struct SelectionRowsArgs {
  int num_kv_heads = 0;      ///< KV heads per sequence: row r is sequence r / num_kv_heads
  int max_kv_length = 0;     ///< lengths are clamped to it, as decode_attention does
  int entry_tokens = 1;      ///< tokens per entry: 1, or the block size
  double keep = 0.0;         ///< ratio mode: budget = floor(keep * L)
  bool ratio = false;        ///< ratio mode: write row_budget
  int recent = 0;            ///< block mode: tokens whose blocks are forced
  std::int32_t* row_lengths = nullptr;  ///< [rows] entries top-k ranks (tokens or blocks)
  std::int32_t* row_budget = nullptr;   ///< [rows] ratio mode only
  std::int32_t* recent_from = nullptr;  ///< [rows] block mode only: first forced block
};

/// Block mode's key: the blocks holding the last `recent` tokens rank above every other block, then
/// by score, then (top-k's rule) by lower position. Their number depends on each sequence's length,
/// which top-k's fixed `recent` count cannot express; the first of them comes from recent_from[row].
struct RecentBlocksFirstKey {
  static constexpr int kScoreBits = ScoreKey<float>::kBits;  ///< bits of the score part (32)
  static constexpr int kBits = kScoreBits + 1;               ///< the forced bit on top of the score bits
  using key_type = detail::order_key_t<kBits>;               ///< uint64_t (33 bits)

  const std::int32_t* recent_from = nullptr;  ///< [rows] first forced block per row, from plan_selection_rows

  /// forced << kScoreBits | the ScoreKey of `score`, forced = position >= recent_from[row].
  KVSIFT_HD key_type operator()(float score, std::int64_t row, std::int32_t position) const {
    const key_type forced = position >= recent_from[row] ? 1u : 0u;
    return (forced << kScoreBits) | key_type(ScoreKey<float>{}(score, row, position));
  }
  /// kNullPointer for a null recent_from.
  Status validate() const {
    KVSIFT_REQUIRE_NOT_NULL(recent_from, "key.recent_from");
    return Status();
  }
};

namespace detail {

template <class View>
KVSIFT_HD inline void plan_selection_row(const View& kv, const SelectionRowsArgs& a, int row) {
  int len = kv.length(row / a.num_kv_heads);
  len = len < 0 ? 0 : (len > a.max_kv_length ? a.max_kv_length : len);
  const int entries = (len + a.entry_tokens - 1) / a.entry_tokens;
  a.row_lengths[row] = entries;
  // keep * len >= 0, so the conversion truncates toward zero: floor, identical on host and device.
  if (a.row_budget) a.row_budget[row] = a.ratio ? int(a.keep * double(len)) : 0;
  if (a.recent_from) {
    const int first_recent_token = len > a.recent ? len - a.recent : 0;
    a.recent_from[row] = a.recent > 0 ? first_recent_token / a.entry_tokens : entries;
  }
}

template <class View>
Status validate_selection_rows(const View& kv, const SelectionRowsArgs& a) {
  KVSIFT_REQUIRE(a.num_kv_heads == kv.num_kv_heads, kInvalidArgument, "num_kv_heads = ", a.num_kv_heads,
                 " must equal kv.num_kv_heads = ", kv.num_kv_heads);
  KVSIFT_REQUIRE(a.entry_tokens >= 1, kInvalidArgument, "entry_tokens = ", a.entry_tokens, " must be >= 1");
  KVSIFT_REQUIRE(a.max_kv_length >= 0, kInvalidArgument, "max_kv_length = ", a.max_kv_length, " must be >= 0");
  if (kv.batch == 0) return Status();
  KVSIFT_REQUIRE_NOT_NULL(a.row_lengths, "row_lengths");
  KVSIFT_REQUIRE(!a.ratio || a.row_budget != nullptr, kNullPointer, "row_budget is null in ratio mode");
  return Status();
}

}  // namespace detail

namespace host {

/// Rows r < kv.batch * num_kv_heads; every pointer is host memory.
template <class View>
Status plan_selection_rows(const Exec&, const View& kv, const SelectionRowsArgs& args) {
  KVSIFT_TRY(detail::validate_selection_rows(kv, args));
  for (int r = 0; r < kv.batch * kv.num_kv_heads; ++r) detail::plan_selection_row(kv, args, r);
  return Status();
}

}  // namespace host
}  // namespace kvsift
