#pragma once
// Adversarial index-set rows for the decode-attention tests (host and GPU). The contract
// (include/kvsift/ops/decode_attention.hpp, kv/index_set.hpp): a row's count is clamped to
// [0, capacity]; entries outside the sequence are skipped (a block partly inside keeps its tokens
// inside); duplicates are attended once per listing; nothing is sorted. Producers such as top-k emit
// sorted, distinct, in-range rows, but a stale, padded or hand-made row need not be, and a kernel
// whose split plan or loop bounds assume the nice shape drops or invents keys (issue 14, "A defect to
// fix first"). These rows put in-range entries *after* out-of-range or duplicate ones, fill the slots
// past the count (and past the capacity, up to the row stride) with in-range decoys that must not be
// read, and draw counts outside [0, capacity].

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/random.hpp"

namespace kvsift_test {

enum class RowKind : int {
  kSortedDistinct,  // what top-k emits: ascending, distinct, in range
  kSortedTail,      // sorted picks plus one duplicate and one entry past the end (the old harness row)
  kUnsorted,        // distinct in-range entries in random order
  kDuplicates,      // a few in-range units listed many times over
  kOutOfRangeFirst, // out-of-range entries first, in-range entries after them
  kChaos,           // in range, duplicates and out of range, interleaved at random
  kAllOutOfRange,   // nothing visible
  kCount
};

inline const char* name(RowKind k) {
  switch (k) {
    case RowKind::kSortedDistinct: return "sorted";
    case RowKind::kSortedTail: return "sorted+tail";
    case RowKind::kUnsorted: return "unsorted";
    case RowKind::kDuplicates: return "duplicates";
    case RowKind::kOutOfRangeFirst: return "oor-first";
    case RowKind::kChaos: return "chaos";
    case RowKind::kAllOutOfRange: return "all-oor";
    case RowKind::kCount: break;
  }
  return "?";
}

// One row as stored: `slots` has row_stride entries (capacity of them readable, the rest stride
// slack), `count` is the raw value written to counts[] (may be negative or above capacity).
struct IndexRow {
  std::vector<std::int32_t> slots;
  std::int32_t count = 0;
  RowKind kind = RowKind::kSortedDistinct;
};

// An entry no token of which lies in [0, len): just past the end (still inside the view when
// len < capacity), past the view, negative, the int32 extremes, and for blocks a value whose
// entry * block_size wraps into [0, len) in 32-bit arithmetic (the product must be formed in 64 bits).
inline std::int32_t out_of_range_entry(std::mt19937_64& rng, int live_units, int view_units, int block) {
  const int pick = uniform_int(rng, 0, block > 1 ? 8 : 7);
  switch (pick) {
    case 0:
    case 1: return live_units;  // just past the sequence (a block starting at or after len)
    case 2: return live_units + uniform_int(rng, 1, 4);
    case 3: return view_units + uniform_int(rng, 0, 9);
    case 4: return -1;
    case 5: return -uniform_int(rng, 2, 1000);
    case 6: return std::numeric_limits<std::int32_t>::max();
    case 7: return std::numeric_limits<std::int32_t>::min();
    default: {  // (2^32 / block) + small: times block that is 2^32 + small * block, 0 mod 2^32
      const std::int64_t wrap = (std::int64_t(1) << 32) / block;
      const std::int64_t e = wrap + uniform_int(rng, 0, 3);
      return e <= std::numeric_limits<std::int32_t>::max() ? std::int32_t(e) : std::numeric_limits<std::int32_t>::max();
    }
  }
}

// A raw count whose clamp to [0, capacity] is `effective` (chosen by the caller), drawn to be outside
// [0, capacity] where it can be: negative for 0, above capacity for capacity.
inline std::int32_t raw_count(std::mt19937_64& rng, int effective, int capacity) {
  if (effective == 0 && uniform_int(rng, 0, 1)) {
    const int pick = uniform_int(rng, 0, 2);
    return pick == 0 ? -1 : pick == 1 ? -uniform_int(rng, 2, 100) : std::numeric_limits<std::int32_t>::min();
  }
  if (effective == capacity && uniform_int(rng, 0, 1)) {
    const int pick = uniform_int(rng, 0, 2);
    return pick == 0 ? capacity + 1 : pick == 1 ? capacity + uniform_int(rng, 2, 1000)
                                                : std::numeric_limits<std::int32_t>::max();
  }
  return effective;
}

// A row for a sequence of `len` visible tokens (after max_kv_length), a view of `view_len` tokens,
// entries of `block` tokens (1: token granularity), `capacity` readable slots and `row_stride`
// stored ones. `force_count` >= 0 sets the effective count (clamped to capacity); otherwise the kind
// decides. Slots at or past the effective count hold in-range decoys.
inline IndexRow make_index_row(std::mt19937_64& rng, RowKind kind, int len, int view_len, int block, int capacity,
                               int row_stride, int force_count = -1) {
  IndexRow r;
  r.kind = kind;
  const int live = (len + block - 1) / block;       // entries with at least one token inside
  const int view_units = (view_len + block - 1) / block;
  auto in_range = [&]() { return live > 0 ? uniform_int(rng, 0, live - 1) : 0; };
  auto oor = [&]() { return out_of_range_entry(rng, live, view_units, block); };
  std::vector<std::int32_t> e;
  switch (kind) {
    case RowKind::kSortedDistinct:
    case RowKind::kSortedTail:
    case RowKind::kUnsorted: {
      for (int u = 0; u < live; ++u)
        if (uniform_int(rng, 0, 2) != 0) e.push_back(u);
      if (kind == RowKind::kSortedTail) {
        if (!e.empty()) e.push_back(e[e.size() / 2]);
        std::sort(e.begin(), e.end());
        e.push_back(view_units + 5);
      }
      if (kind == RowKind::kUnsorted) std::shuffle(e.begin(), e.end(), rng);
      break;
    }
    case RowKind::kDuplicates: {
      const int distinct = uniform_int(rng, 1, 3);
      std::vector<std::int32_t> pool;
      for (int i = 0; i < distinct; ++i) pool.push_back(in_range());
      const int n = uniform_int(rng, 1, std::max(1, capacity));
      for (int i = 0; i < n; ++i) e.push_back(pool[std::size_t(uniform_int(rng, 0, distinct - 1))]);
      break;
    }
    case RowKind::kOutOfRangeFirst: {
      const int lead = uniform_int(rng, 1, std::max(1, capacity / 2));
      for (int i = 0; i < lead; ++i) e.push_back(oor());
      for (int u = 0; u < live; ++u)
        if (uniform_int(rng, 0, 1)) e.push_back(u);
      if (live > 0) e.push_back(live - 1);  // the last, partly filled block
      break;
    }
    case RowKind::kChaos: {
      const int n = uniform_int(rng, 1, std::max(1, capacity));
      for (int i = 0; i < n; ++i) {
        const int pick = uniform_int(rng, 0, 9);
        if (pick < 4 || e.empty())
          e.push_back(pick < 2 ? oor() : in_range());
        else if (pick < 7)
          e.push_back(e[std::size_t(uniform_int(rng, 0, int(e.size()) - 1))]);
        else
          e.push_back(oor());
      }
      break;
    }
    case RowKind::kAllOutOfRange:
    case RowKind::kCount: {
      const int n = uniform_int(rng, 0, std::max(0, capacity));
      for (int i = 0; i < n; ++i) e.push_back(oor());
      break;
    }
  }
  // Effective count: what the kind produced, cut to capacity, or forced; rows that reach capacity
  // keep drawing so the slots are all meaningful.
  int effective = std::min<int>(int(e.size()), capacity);
  if (force_count >= 0) effective = std::min(force_count, capacity);
  while (int(e.size()) < effective) {  // forced past what the kind drew: more of the same flavour
    if (kind == RowKind::kAllOutOfRange)
      e.push_back(oor());
    else if (e.empty() || uniform_int(rng, 0, 2) == 0)
      e.push_back(in_range());
    else
      e.push_back(e[std::size_t(uniform_int(rng, 0, int(e.size()) - 1))]);
  }
  // Sometimes the count says fewer than were written: the rest become decoys the kernel must skip.
  if (force_count < 0 && effective > 0 && uniform_int(rng, 0, 5) == 0) effective = uniform_int(rng, 0, effective - 1);
  r.count = raw_count(rng, effective, capacity);
  r.slots.assign(std::size_t(std::max(row_stride, capacity)), 0);
  for (int i = 0; i < int(r.slots.size()); ++i) {
    if (i < int(e.size()) && i < capacity)
      r.slots[std::size_t(i)] = e[std::size_t(i)];
    else
      r.slots[std::size_t(i)] = in_range();  // a decoy: visible if it were (wrongly) read
  }
  return r;
}

// A kind for a randomized row: sorted-distinct rows about a quarter of the time, the rest adversarial.
inline RowKind draw_row_kind(std::mt19937_64& rng) {
  const int pick = uniform_int(rng, 0, 11);
  if (pick < 3) return RowKind::kSortedDistinct;
  return RowKind(1 + (pick - 3) % (int(RowKind::kCount) - 1));
}

inline std::string describe_rows(const std::vector<std::int32_t>& idx, const std::vector<std::int32_t>& counts,
                                 int row_stride, std::size_t max_chars = 1500) {
  std::string s;
  for (std::size_t r = 0; r < counts.size() && s.size() < max_chars; ++r) {
    s += "\n  row " + std::to_string(r) + " count " + std::to_string(counts[r]) + ": ";
    for (int i = 0; i < row_stride && s.size() < max_chars; ++i)
      s += std::to_string(idx[r * std::size_t(row_stride) + std::size_t(i)]) + " ";
  }
  return s;
}

}  // namespace kvsift_test
