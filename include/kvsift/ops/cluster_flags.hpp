#pragma once
/// \file
/// \brief cluster_flags: ClusterAttn's density clustering (DBAC) of per-token scores into contiguous
/// density clusters.
///
/// For each row p[0, n) (n = row_lengths[r] clamped to [0, scores.cols]; scores.cols when row_lengths
/// is null):
///   1. block max-pool: blocks of `block` tokens (the tail block may be shorter); for block k its
///      maximum M[k] and the lowest position A[k] holding it (NaN is never the maximum; a block of
///      only NaN has none and is no centre; -inf can be, and fails the threshold);
///   2. density threshold: block k is a cluster centre when M[k] > theta; the centre is at A[k];
///   3. neighbourhood: token j is flagged when it lies within the radius of a centre;
/// and writes flags[r][j] = 1 for flagged tokens, 0 for the others. The shared top-k then ranks
/// flagged tokens ahead of all others (FlagFirstKey), which is exactly "keep the clusters; if they
/// overflow the budget keep their best tokens; if they underflow, fill from the gaps by score".
///
/// The paper leaves two relations open, the block size and the neighbourhood radius; both are switchable:
///   BlockRule::kPrefixSplit (A, default)  block = ceil(n / num_block)
///   BlockRule::kBudgetSplit (B)           block = max(1, floor(budget / num_block))
///   RadiusRule::kHalfBlock (r1, default)  tokens within floor(block / 2) of a centre
///   RadiusRule::kBudgetBlocks (r2)        whole blocks within
///                                         R = floor(ceil(budget / block) / (2 * centres))
///                                         blocks of a centre's block
///   RadiusRule::kFixed (r3)               tokens within `fixed_radius` of a centre
/// With no centre the flags are all 0 and the selection degenerates to plain top-k of the scores.
///
/// This header is the contract (parameters, the per-row rules every backend evaluates the same way,
/// validation). The scratch layout and workspace query are in cluster_flags_plan.hpp, the host
/// reference in cluster_flags_reference.hpp, the CUDA launcher in cluster_flags.cuh (kernels in
/// detail/cluster_flags_kernels.cuh).

#include <cmath>
#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/ops/score_pooling.hpp"  // detail::clamp_row_length

namespace kvsift {

/// The block size of the max-pool: kPrefixSplit (A, default) ceil(n / num_block), kBudgetSplit (B)
/// max(1, floor(budget / num_block)); see the file comment.
enum class BlockRule : int { kPrefixSplit, kBudgetSplit };
/// The neighbourhood of a centre: kHalfBlock (r1, default) floor(block / 2) tokens, kBudgetBlocks (r2)
/// whole blocks from the budget and the centre count, kFixed (r3) fixed_radius tokens.
enum class RadiusRule : int { kHalfBlock, kBudgetBlocks, kFixed };

/// Per-call parameters of cluster_flags (the density clustering of ClusterAttn); validated by every
/// backend, each message naming the field.
struct ClusterParams {
  int num_block = 128;   ///< cluster granularity, >= 1; calibrate per dataset (calibrate_num_block)
  float theta = 2e-3f;   ///< density threshold on the block maximum (strict >), >= 0
  int budget = 0;        ///< K, >= 0: prefix tokens the selection will keep (Cp - W)
  BlockRule block_rule = BlockRule::kPrefixSplit;  ///< how the block size follows from num_block
  RadiusRule radius_rule = RadiusRule::kHalfBlock;  ///< how far a centre's density cluster reaches
  int fixed_radius = 0;  ///< tokens, >= 0, for RadiusRule::kFixed
};

namespace detail {

KVSIFT_HD inline int cluster_block_size(const ClusterParams& p, int n) {
  if (p.block_rule == BlockRule::kPrefixSplit) {
    const int b = (n + p.num_block - 1) / p.num_block;
    return b < 1 ? 1 : b;
  }
  const int b = p.budget / p.num_block;
  return b < 1 ? 1 : b;
}

// Radius in tokens (kHalfBlock, kFixed) or in blocks (kBudgetBlocks, which needs the centre count).
KVSIFT_HD inline int cluster_radius(const ClusterParams& p, int block, int centres) {
  switch (p.radius_rule) {
    case RadiusRule::kHalfBlock: return block / 2;
    case RadiusRule::kFixed: return p.fixed_radius;
    case RadiusRule::kBudgetBlocks: {
      if (centres == 0) return 0;
      const int blocks_in_budget = (p.budget + block - 1) / block;
      return blocks_in_budget / (2 * centres);
    }
  }
  return 0;
}

// One step of a scan in ascending positions for the maximum and the lowest position holding it:
// (m, arg) starts at (-inf, -1); NaN is never taken, -inf only while nothing is.
KVSIFT_HD inline void argmax_step(float x, int t, float& m, int& arg) {
  if (x > m || (arg < 0 && x == m)) {
    m = x;
    arg = t;
  }
}
// Merges the result (om, oa) of another part of the same block into (m, arg): the larger maximum,
// the lower position on a tie; a part with no value (arg -1) yields. Merged in any order over parts
// that each scanned their positions in ascending order, it gives the scan of the whole block.
KVSIFT_HD inline void argmax_merge(float om, int oa, float& m, int& arg) {
  if (oa >= 0 && (arg < 0 || om > m || (om == m && oa < arg))) {
    m = om;
    arg = oa;
  }
}
// Block k of a row: max and the lowest position of it (-1 when the block is empty or all NaN).
KVSIFT_HD inline int block_argmax(const float* row, int n, int block, int k, float* max_out) {
  const int lo = k * block, hi = lo + block < n ? lo + block : n;
  int arg = -1;
  float m = -INFINITY;
  for (int t = lo; t < hi; ++t) argmax_step(row[t], t, m, arg);
  *max_out = m;
  return arg;
}

// Is token j flagged, given each block's centre (-1 = none)? Looks only at blocks that can reach j.
KVSIFT_HD inline bool near_centre(const std::int32_t* centre_of_block, int num_blocks, int block, int j,
                                  const ClusterParams& p, int radius) {
  if (p.radius_rule == RadiusRule::kBudgetBlocks) {
    const int kb = j / block;
    const int lo = kb - radius < 0 ? 0 : kb - radius;
    const int hi = kb + radius >= num_blocks ? num_blocks - 1 : kb + radius;
    for (int k = lo; k <= hi; ++k)
      if (centre_of_block[k] >= 0) return true;
    return false;
  }
  const int lo_tok = j - radius < 0 ? 0 : j - radius;
  const int lo = lo_tok / block, hi_raw = (j + radius) / block;
  const int hi = hi_raw >= num_blocks ? num_blocks - 1 : hi_raw;
  for (int k = lo; k <= hi; ++k) {
    const int c = centre_of_block[k];
    if (c >= 0 && (c - j <= radius && j - c <= radius)) return true;
  }
  return false;
}

inline Status validate_cluster_params(const ClusterParams& p) {
  KVSIFT_REQUIRE(p.num_block >= 1, kInvalidArgument, "num_block = ", p.num_block, " must be >= 1");
  KVSIFT_REQUIRE(p.theta >= 0.f, kInvalidArgument, "theta = ", p.theta, " must be >= 0");
  KVSIFT_REQUIRE(p.budget >= 0, kInvalidArgument, "budget = ", p.budget, " must be >= 0");
  KVSIFT_REQUIRE(p.block_rule == BlockRule::kPrefixSplit || p.block_rule == BlockRule::kBudgetSplit,
                 kInvalidArgument, "block_rule = ", static_cast<int>(p.block_rule), " is not a BlockRule");
  KVSIFT_REQUIRE(p.radius_rule == RadiusRule::kHalfBlock || p.radius_rule == RadiusRule::kBudgetBlocks ||
                     p.radius_rule == RadiusRule::kFixed,
                 kInvalidArgument, "radius_rule = ", static_cast<int>(p.radius_rule), " is not a RadiusRule");
  KVSIFT_REQUIRE(p.fixed_radius >= 0, kInvalidArgument, "fixed_radius = ", p.fixed_radius, " must be >= 0");
  return Status();
}

inline Status validate_cluster_flags(const StridedView2D<const float>& scores, const ClusterParams& p,
                                     const StridedView2D<std::uint8_t>& flags) {
  KVSIFT_TRY(validate_cluster_params(p));
  KVSIFT_TRY(scores.validate("scores"));
  KVSIFT_TRY(flags.validate("flags"));
  KVSIFT_REQUIRE(flags.rows >= scores.rows && flags.cols >= scores.cols, kInvalidArgument, "flags = ", flags.rows,
                 " x ", flags.cols, " must be at least scores = ", scores.rows, " x ", scores.cols);
  return Status();
}

}  // namespace detail

}  // namespace kvsift
