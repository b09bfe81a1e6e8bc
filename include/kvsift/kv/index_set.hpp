#pragma once
/// \file
/// \brief IndexSet: selected positions, one row per (batch, kv_head) or whatever the producer's rows are.
///
/// Row r holds counts[r] int32 entries at indices + r * row_stride, in ascending order unless the
/// producer documents otherwise. Entries are token positions (Granularity::kToken) or block numbers
/// (kBlock; block j covers tokens [j * block_size, (j + 1) * block_size)). Consumers skip entries
/// outside the sequence, so a stale or padded row never reads out of bounds. The same type feeds
/// decode attention (its sparse heads), cache compaction and the LycheeDecode handoff between layers.

#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"

namespace kvsift {

/// What an index-set entry counts: a token position, or a block of `block_size` tokens.
enum class Granularity : int { kToken, kBlock };

/// "token" or "block".
inline const char* to_string(Granularity g) { return g == Granularity::kToken ? "token" : "block"; }

/// An index set (see the file comment): rows of `Index` entries plus a count per row, in the Exec's
/// memory space. A view, passed to kernels by value; use the IndexSet and ConstIndexSet aliases.
template <class Index = std::int32_t>
struct IndexSetT {
  Index* indices = nullptr;           ///< [rows, row_stride]
  Index* counts = nullptr;            ///< [rows]
  int rows = 0;                       ///< index rows, >= 0
  int capacity = 0;                   ///< entries a row can hold
  std::int64_t row_stride = 0;        ///< in entries; >= capacity
  Granularity granularity = Granularity::kToken;  ///< what the entries count: tokens or blocks
  int block_size = 1;                 ///< tokens per entry; 1 for token granularity

  /// The first entry of row `r`; no bounds check.
  KVSIFT_HD Index* row(int r) const { return indices + r * row_stride; }
  /// Entries in row r, clamped to [0, capacity].
  KVSIFT_HD int count(int r) const { return clamp_count(counts[r]); }
  /// A count as count() clamps it.
  KVSIFT_HD int clamp_count(int n) const { return n < 0 ? 0 : (n > capacity ? capacity : n); }

  /// Host-side check: rows, capacity >= 0, row_stride >= capacity, block_size 1 for tokens or a power
  /// of two for blocks, non-null indices and counts when rows > 0; kInvalidArgument or kNullPointer,
  /// the message prefixed with `name`. Reads no entries.
  Status validate(const char* name = "index_set") const {
    KVSIFT_REQUIRE(rows >= 0, kInvalidArgument, name, ".rows = ", rows, " must be >= 0");
    KVSIFT_REQUIRE(capacity >= 0, kInvalidArgument, name, ".capacity = ", capacity, " must be >= 0");
    KVSIFT_REQUIRE(row_stride >= capacity, kInvalidArgument, name, ".row_stride = ", row_stride,
                   " must be >= capacity = ", capacity);
    if (granularity == Granularity::kToken) {
      KVSIFT_REQUIRE(block_size == 1, kInvalidArgument, name, ".block_size = ", block_size,
                     " must be 1 for token granularity");
    } else {
      KVSIFT_REQUIRE(granularity == Granularity::kBlock, kInvalidArgument, name, ".granularity = ",
                     static_cast<int>(granularity), " is not token or block");
      KVSIFT_REQUIRE(detail::is_power_of_two(block_size), kInvalidArgument, name,
                     ".block_size = ", block_size, " must be a power of two");
    }
    if (rows == 0) return Status();
    KVSIFT_REQUIRE(capacity == 0 || indices != nullptr, kNullPointer, name, ".indices is null");
    KVSIFT_REQUIRE_NOT_NULL(counts, (std::string(name) + ".counts").c_str());
    return Status();
  }
};

/// A writable index set of int32 entries: what top-k writes.
using IndexSet = IndexSetT<std::int32_t>;
/// A read-only index set: what decode attention, compaction and the handoff read.
using ConstIndexSet = IndexSetT<const std::int32_t>;

/// An index set with densely packed rows (row_stride = capacity); `block_size` is forced to 1 for
/// token granularity.
inline IndexSet make_index_set(std::int32_t* indices, std::int32_t* counts, int rows, int capacity,
                               Granularity granularity = Granularity::kToken, int block_size = 1) {
  IndexSet s;
  s.indices = indices;
  s.counts = counts;
  s.rows = rows;
  s.capacity = capacity;
  s.row_stride = capacity;
  s.granularity = granularity;
  s.block_size = granularity == Granularity::kToken ? 1 : block_size;
  return s;
}

/// The same rows, read-only.
inline ConstIndexSet as_const(const IndexSet& s) {
  ConstIndexSet c;
  c.indices = s.indices;
  c.counts = s.counts;
  c.rows = s.rows;
  c.capacity = s.capacity;
  c.row_stride = s.row_stride;
  c.granularity = s.granularity;
  c.block_size = s.block_size;
  return c;
}

}  // namespace kvsift
