#pragma once
/// \file
/// \brief CUDA backend of cluster_flags (contract in cluster_flags.hpp, scratch and workspace query in
/// cluster_flags_plan.hpp, kernels in detail/cluster_flags_kernels.cuh): two launches over (CTAs, rows),
/// both taking one ClusterFlagsLaunch by value.

#include <algorithm>
#include <cstdint>

#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/workspace.hpp"
#include "kvsift/ops/cluster_flags.hpp"
#include "kvsift/ops/cluster_flags_plan.hpp"
#include "kvsift/ops/detail/cluster_flags_kernels.cuh"

namespace kvsift {
namespace cuda {

/// Same contract as host::cluster_flags; pointers are device pointers. Asynchronous on exec.stream.
/// `workspace` must hold cluster_flags_workspace_bytes(exec, ...) bytes (kNullPointer when its data is
/// null and there is anything to flag); kUnsupported for more than 65535 rows.
inline Status cluster_flags(const Exec& exec, StridedView2D<const float> scores, const std::int32_t* row_lengths,
                            const ClusterParams& params, StridedView2D<std::uint8_t> flags, Workspace workspace = {}) {
  KVSIFT_TRY(detail::validate_cluster_flags(scores, params, flags));
  WorkspaceCarver ws(workspace);
  const detail::ClusterFlagsLaunch launch{scores, row_lengths, params, flags,
                                          detail::carve_cluster_flags(ws, scores.rows, scores.cols)};
  if (scores.rows == 0 || scores.cols == 0) return Status();
  KVSIFT_REQUIRE(workspace.data != nullptr, kNullPointer, "workspace.data is null (ask cluster_flags_workspace_bytes)");
  KVSIFT_TRY(ws.status());
  KVSIFT_REQUIRE(scores.rows <= 65535, kUnsupported, "scores.rows = ", scores.rows, " must be <= 65535");
  if (detail::cluster_counts_centres(params))
    KVSIFT_CUDA_TRY(cudaMemsetAsync(launch.scratch.counts, 0, sizeof(std::int32_t) * scores.rows, exec.stream));
  constexpr std::int64_t kFlagTokensPerCta = detail::kClusterFlagThreads * detail::kClusterFlagRun;
  const dim3 grid(unsigned((scores.cols + kFlagTokensPerCta - 1) / kFlagTokensPerCta), unsigned(scores.rows));
  // The centres: a warp per block of 32 or more tokens (8 a CTA), a thread per shorter block (256 a
  // CTA), so as many CTAs as a row has blocks over 8 (or over 256), at most: ceil(n / ceil(n /
  // num_block)) <= num_block blocks under kPrefixSplit, and under kBudgetSplit ceil(cols / block) with
  // the row-independent block (the kernel strides over any more).
  const bool prefix_split = params.block_rule == BlockRule::kPrefixSplit;
  const std::int64_t budget_block = detail::cluster_block_size(params, 1);  // kBudgetSplit: the same for every n
  const std::int64_t max_blocks =
      std::min<std::int64_t>(scores.cols, prefix_split ? params.num_block : (scores.cols + budget_block - 1) / budget_block);
  const std::int64_t per_cta = !prefix_split && budget_block < 32 ? 256 : 8;
  const dim3 centres_grid(unsigned((max_blocks + per_cta - 1) / per_cta), unsigned(scores.rows));
  // Exec::dependent_launch: both kernels wait for the kernel before them (dependent_kernel_start).
  const bool pdl = exec.launches_dependent();
  KVSIFT_CUDA_TRY(detail::launch_with_pdl(pdl, detail::cluster_centres_kernel<>, centres_grid, dim3(256), 0, exec.stream, launch));
  KVSIFT_CUDA_TRY(
      detail::launch_with_pdl(pdl, detail::cluster_flags_kernel<>, grid, dim3(detail::kClusterFlagThreads), 0, exec.stream, launch));
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
