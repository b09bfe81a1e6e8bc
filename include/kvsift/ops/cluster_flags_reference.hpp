#pragma once
/// \file
/// \brief Host reference of cluster_flags (contract in cluster_flags.hpp): per row, every block's centre,
/// then every token's flag, with the same rules the CUDA kernels evaluate. Host memory for every
/// pointer; no workspace (cluster_flags_workspace_bytes reports 0 for host::Exec).

#include <cstdint>
#include <vector>

#include "kvsift/core/check.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/ops/cluster_flags.hpp"
#include "kvsift/ops/cluster_flags_plan.hpp"

namespace kvsift {
namespace host {

/// Writes flags(r, j) = 1 for the tokens of row r inside a density cluster and 0 for the others, for
/// j < n (n = row_lengths[r] clamped to scores.cols; scores.cols when row_lengths is null); the rest
/// is untouched. Host memory for every pointer; no workspace. kInvalidArgument for bad params or
/// `flags` smaller than `scores`.
inline Status cluster_flags(const Exec&, StridedView2D<const float> scores, const std::int32_t* row_lengths,
                            const ClusterParams& params, StridedView2D<std::uint8_t> flags,
                            Workspace /*workspace: the reference needs none*/ = {}) {
  KVSIFT_TRY(detail::validate_cluster_flags(scores, params, flags));
  std::vector<std::int32_t> centre;
  for (std::int64_t r = 0; r < scores.rows; ++r) {
    const int n = detail::clamp_row_length(row_lengths, r, scores.cols);
    if (n == 0) continue;
    const int block = detail::cluster_block_size(params, n);
    const int num_blocks = (n + block - 1) / block;
    centre.assign(num_blocks, -1);
    int centres = 0;
    for (int k = 0; k < num_blocks; ++k) {
      float m;
      const int arg = detail::block_argmax(scores.row(r), n, block, k, &m);
      if (arg >= 0 && m > params.theta) {
        centre[k] = arg;
        ++centres;
      }
    }
    const int radius = detail::cluster_radius(params, block, centres);
    for (int j = 0; j < n; ++j)
      flags(r, j) = detail::near_centre(centre.data(), num_blocks, block, j, params, radius) ? 1 : 0;
  }
  return Status();
}

}  // namespace host
}  // namespace kvsift
