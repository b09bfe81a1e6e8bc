#pragma once
/// \file
/// \brief The sampled bracket of the candidate select (ops/detail/topk_candidate_select.cuh; design and
/// measurements in docs/ops/topk.md, "The sampled bracket"): the arithmetic every CTA of a group must
/// agree on without exchanging it, host and device (tests/host/test_topk.cpp checks it).
//
// A CTA group's exact digit searches cost one group barrier, one DSMEM read of every peer's 2048 bins
// and one block scan each, three times for fp32 keys: most of a few-row call's time on the H200. The
// bracket replaces them, on ordinary rows, with two group barriers: a stride sample of the row, drawn
// while the slices are still loading, gives two keys that hold the budget-th key between them with
// overwhelming probability; each CTA counts its keys above the bracket and lists those inside it; and
// after the second barrier every CTA copies the whole group's (short) list and finishes the selection
// alone, with block barriers only. Whether the bracket held is checked exactly (the counts say it),
// and where it did not (a row of equal keys, a sample the row's structure misleads), the group runs
// the exact digit searches instead: the result is the same bits either way.

#include <cmath>
#include <cstdint>

#include "kvsift/core/config.hpp"
#include "kvsift/ops/topk.hpp"

namespace kvsift {
namespace detail {

/// Standard deviations of the sampled rank between the budget's expected rank and each end of the
/// bracket: a bracket misses with probability ~1e-4 per row on a uniform stride sample of
/// independent keys (each side is a binomial tail), and a miss costs time, not correctness.
inline constexpr float kTopkBracketSigmas = 4.f;

/// Number of significant bits of x (0 for 0).
template <class K>
KVSIFT_HD inline int topk_bit_width(K x) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(K) == 8) return 64 - __clzll(static_cast<long long>(x));
  else return 32 - __clz(static_cast<int>(x));
#else
  int bits = 0;
  while (x != 0) {
    ++bits;
    x >>= 1;
  }
  return bits;
#endif
}

/// The stride sample of a row's scored region [sink_end, recent_begin): the positions
/// first + j * stride, j in [0, count), at most `capacity` of them. A CTA's share is the samples inside
/// its slice, so any CTA computes any peer's share from the slice arithmetic alone.
struct TopkBracketSample {
  int first = 0;   ///< the first sampled position (the region's start)
  int stride = 1;  ///< positions between two samples
  int count = 0;   ///< samples in the region

  /// Index of the first sample at or after position p, clamped to [0, count].
  KVSIFT_HD inline int first_at(int p) const {
    if (p <= first) return 0;
    const int j = (p - first + stride - 1) / stride;
    return j < count ? j : count;
  }
};

/// The sample of a row with `plan`'s scored region: a stride of ceil(region / capacity), so at most
/// `capacity` samples spread over the whole region.
KVSIFT_HD inline TopkBracketSample topk_bracket_sample(const TopKRowPlan& plan, int capacity) {
  TopkBracketSample s;
  const int n = plan.region();
  s.first = plan.sink_end;
  s.stride = n > capacity ? (n + capacity - 1) / capacity : 1;
  s.count = n > 0 ? (n - 1) / s.stride + 1 : 0;
  return s;
}

/// The sample ranks (1-based, descending) that end the bracket: the budget's share of the sample
/// minus / plus kTopkBracketSigmas binomial deviations and one. `above < 1` means no upper end (no key
/// is counted above the bracket); `below > count` no lower end (every key down to the lowest is inside).
struct TopkBracketRanks {
  int above = 0;  ///< rank of the bracket's top (keys above it are counted, not listed)
  int below = 0;  ///< rank of the bracket's bottom (keys from it up to the top are listed)
};

/// The bracket's ranks for a budget of `budget` keys of `region`, in a sample of `count` of them.
KVSIFT_HD inline TopkBracketRanks topk_bracket_ranks(int budget, int region, int count) {
  const float p = float(budget) / float(region);
  const float mean = p * float(count);
  const float margin = kTopkBracketSigmas * sqrtf(mean * (1.f - p)) + 1.f;
  TopkBracketRanks r;
  r.above = int(floorf(mean - margin));
  r.below = int(ceilf(mean + margin));
  return r;
}

/// The largest key of bin `bin` of width 2^shift starting at `base`, clipped to `key_max` (the last
/// bin may reach past the largest key a kBits-bit key can take).
template <class K>
KVSIFT_HD inline K topk_bin_top(K base, int bin, int shift, K key_max) {
  const K bottom = base + (K(bin) << shift);
  const K width_minus_one = (K(1) << shift) - 1;
  return key_max - bottom < width_minus_one ? key_max : bottom + width_minus_one;
}

}  // namespace detail
}  // namespace kvsift
