#pragma once
// CUDA backend of cluster_flags (contract in cluster_flags.hpp).
//   1. one thread per block of a row: its maximum and argmax -> the block's centre (or -1), and a
//      count of the row's centres (integer atomics: the count is exact whatever the order);
//   2. one thread per token: flagged when a centre within the radius exists (looks only at the
//      blocks that can reach it).

#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/cuda_status.cuh"
#include "kvsift/ops/cluster_flags.hpp"

namespace kvsift {
namespace detail {

// A template, so the header-only definition is inline across translation units.
template <class Unused = void>
__global__ void cluster_centres_kernel(StridedView2D<const float> scores, const std::int32_t* row_lengths,
                                              ClusterParams p, std::int32_t* centres, std::int32_t* counts) {
  const std::int64_t r = blockIdx.y;
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  const int n = clamp_row_length(row_lengths, r, scores.cols);
  if (n == 0) return;
  const int block = cluster_block_size(p, n);
  if (k >= (n + block - 1) / block) return;
  float m;
  const int arg = block_argmax(scores.row(r), n, block, k, &m);
  const bool centre = arg >= 0 && m > p.theta;
  centres[r * scores.cols + k] = centre ? arg : -1;
  if (centre) atomicAdd(counts + r, 1);
}

// A template, so the header-only definition is inline across translation units.
template <class Unused = void>
__global__ void cluster_flags_kernel(std::int64_t cols, const std::int32_t* row_lengths, ClusterParams p,
                                            const std::int32_t* centres, const std::int32_t* counts,
                                            StridedView2D<std::uint8_t> flags) {
  const std::int64_t r = blockIdx.y;
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  const int n = clamp_row_length(row_lengths, r, cols);
  if (j >= n) return;
  const int block = cluster_block_size(p, n);
  const int radius = cluster_radius(p, block, counts[r]);
  flags(r, j) = near_centre(centres + r * cols, (n + block - 1) / block, block, j, p, radius) ? 1 : 0;
}

}  // namespace detail

namespace cuda {

inline Status cluster_flags(Exec exec, StridedView2D<const float> scores, const std::int32_t* row_lengths,
                            const ClusterParams& params, StridedView2D<std::uint8_t> flags, void* workspace,
                            std::size_t workspace_bytes) {
  KVSIFT_TRY(detail::validate_cluster_flags(scores, params, flags));
  WorkspaceCarver ws(workspace, workspace_bytes);
  auto* centres = ws.take<std::int32_t>(std::size_t(scores.rows * scores.cols));
  auto* counts = ws.take<std::int32_t>(std::size_t(scores.rows));
  if (scores.rows == 0 || scores.cols == 0) return Status();
  KVSIFT_REQUIRE(workspace != nullptr, kNullPointer, "workspace is null (ask cluster_flags_workspace_bytes)");
  KVSIFT_TRY(ws.status());
  KVSIFT_REQUIRE(scores.rows <= 65535, kUnsupported, "scores.rows = ", scores.rows, " must be <= 65535");
  KVSIFT_CUDA_TRY(cudaMemsetAsync(counts, 0, sizeof(std::int32_t) * scores.rows, exec.stream));
  const dim3 grid(unsigned((scores.cols + 255) / 256), unsigned(scores.rows));
  detail::cluster_centres_kernel<><<<grid, 256, 0, exec.stream>>>(scores, row_lengths, params, centres, counts);
  KVSIFT_CHECK_LAUNCH();
  detail::cluster_flags_kernel<><<<grid, 256, 0, exec.stream>>>(scores.cols, row_lengths, params, centres, counts, flags);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
