#pragma once
/// \file
/// \brief Host reference of pool_scores (contract in score_pooling.hpp): each output element from its window,
/// the same pool_at the CUDA kernel evaluates. Host memory for every pointer; no workspace.

#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/ops/score_pooling.hpp"
#include "kvsift/ops/score_pooling_plan.hpp"

namespace kvsift {
namespace host {

/// Pools each row of `in` into the same row of `out` (columns [0, row_lengths[r]) clamped to
/// in.cols; all of them when row_lengths is null; the rest untouched). Host memory for every pointer;
/// no workspace. kInvalidArgument for a bad kernel or kind, an `out` smaller than `in`, or `out`
/// aliasing `in`.
inline Status pool_scores(const Exec&, StridedView2D<const float> in, const std::int32_t* row_lengths,
                          PoolParams params, StridedView2D<float> out, Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_pool_scores(in, params, out));
  for (std::int64_t r = 0; r < in.rows; ++r) {
    const int n = detail::clamp_row_length(row_lengths, r, in.cols);
    for (int j = 0; j < n; ++j) out(r, j) = detail::pool_at(in.row(r), n, j, params);
  }
  return Status();
}

}  // namespace host
}  // namespace kvsift
