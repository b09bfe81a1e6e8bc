#pragma once
/// \file
/// \brief Score candidates: the positions whose score reaches a per-row threshold, listed by the pass
/// that writes the scores (decode_attention's score emission) so that the top-k after it can select
/// from a few thousand positions instead of the whole row (LycheeDecode's retrieval heads).
///
/// A decode step's selection threshold moves little from one step to the next, so the threshold
/// carried from the last step's top-k predicts which positions can be selected now. The list is a
/// speculation the top-k checks, never trusts: with `needed` = the budget left after the forced
/// positions, it selects from the list only when the list holds at least `needed` positions of the
/// row's scored region and is complete; then every position the full search would select is on it (a
/// position outside scores below the threshold, hence below `needed` listed ones), and the result is
/// the same bits. Otherwise it runs the full search. A list already read (its tag cleared) or one that
/// falls short costs time only; a list must come from the pass that wrote the scores it is read with.
///
/// Layout (device memory; rows as the scores', row r = b * num_kv_heads + h):
///   thresholds[r]      float, kept between steps: the pass lists the positions t < len with
///                      score_t >= thresholds[r] (none when it is NaN or -inf); the top-k writes the
///                      next step's value. Any value is safe: it only decides what is listed.
///   counts[r * count_stride + ...]  the pass's header (kScoreCandidateHeader ints: a 64-bit tag that
///                      says the list is this step's, the segment length S, the number of segments
///                      written), then one count per segment j.
///   positions[r * row_stride + j * S + i], i < counts[...j]: segment j's listed positions, all in
///                      [j S, (j + 1) S), in no particular order. row_stride is the scores' (the list
///                      can never outgrow its segment), so positions has the scores' shape.
/// The pass writes the tag, every segment's count and the list; the top-k reads them and clears the
/// tag, so a list is used at most once and a step whose pass listed nothing is never read as listed.
/// Memory needs no initialisation: a tag left by chance matches with probability 2^-64, and even then
/// counts are clamped to their segments and positions to the row.

#include <cmath>
#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"

namespace kvsift {

/// Where the score pass lists its candidates and the top-k finds them (see the file comment). All
/// pointers null: no candidates (the default).
struct ScoreCandidates {
  float* thresholds = nullptr;        ///< [rows]: the threshold of the next pass, kept between steps
  std::int32_t* counts = nullptr;     ///< [rows, count_stride]: header + one count per segment
  std::int32_t* positions = nullptr;  ///< [rows, the scores' row stride]: the listed positions
  int count_stride = 0;               ///< ints per counts row: kScoreCandidateHeader + the segments

  /// Whether candidates are asked for (thresholds set).
  KVSIFT_HD bool enabled() const { return thresholds != nullptr; }
};

/// Ints at the start of a counts row: the tag (two), the segment length, the segments written.
inline constexpr int kScoreCandidateHeader = 4;
/// The tag of a list its pass finished writing, low 32 bits ("kvsf"); the top-k writes 0 over it.
inline constexpr std::uint32_t kScoreCandidateTagLo = 0x6b767366u;
/// The tag's high 32 bits ("cand").
inline constexpr std::uint32_t kScoreCandidateTagHi = 0x63616e64u;

/// Ints a counts row needs for lists of up to `segments` segments: the header and a count per segment,
/// in whole 16-byte vectors (the top-k reads the row as such).
KVSIFT_HD constexpr int score_candidate_count_stride(int segments) {
  return (kScoreCandidateHeader + segments + 3) / 4 * 4;
}

/// The threshold of the next step, from this step's: `kth` the score at the budget's rank, `used` the
/// threshold the list was made with, `listed` the scored-region positions at or above it (>= budget)
/// and `budget` the positions selected from them. The next list aims at budget + budget / 4 + 64
/// positions, assuming the scores near kth stay as dense as between `used` and kth: the gap below kth
/// is scaled by the wanted extra over the extra this step listed (within 1/8 .. 8 times). NaN (the
/// next pass lists nothing, so the next top-k runs the full search and re-seeds it) when the
/// scores give no finite answer.
KVSIFT_HD inline float next_candidate_threshold(float kth, float used, int listed, int budget) {
  const float extra = float(budget / 4 + 64);
  float scale = listed > budget ? extra / float(listed - budget) : 8.f;
  scale = scale < 0.125f ? 0.125f : (scale > 8.f ? 8.f : scale);
  const float gap = kth - used;
  const float t = kth - gap * scale;
  if (gap == 0.f) return used;  // every listed score ties at the threshold: keep it
  return (gap > 0.f && t > -INFINITY && t < INFINITY) ? t : NAN;
}

namespace detail {

/// Host-side check of a ScoreCandidates for rows of `segments` segments at most.
inline Status validate_score_candidates(const ScoreCandidates& c, int segments, const char* name) {
  if (!c.enabled()) {
    KVSIFT_REQUIRE(c.counts == nullptr && c.positions == nullptr, kInvalidArgument, name,
                   ": counts and positions are set but thresholds is null (all three, or none)");
    return Status();
  }
  KVSIFT_REQUIRE(c.counts != nullptr && c.positions != nullptr, kInvalidArgument, name,
                 ": thresholds is set, so counts and positions must be too");
  KVSIFT_REQUIRE(c.count_stride >= kScoreCandidateHeader + segments && c.count_stride % 4 == 0, kInvalidArgument,
                 name, ".count_stride = ", c.count_stride, " must be a multiple of 4 and >= ", kScoreCandidateHeader,
                 " + ", segments, " (the header and one count per segment)");
  KVSIFT_REQUIRE(reinterpret_cast<std::uintptr_t>(c.counts) % 16 == 0, kMisaligned, name, ".counts = ",
                 static_cast<const void*>(c.counts), " must be 16-byte aligned (read as 16-byte vectors)");
  return Status();
}

}  // namespace detail
}  // namespace kvsift
