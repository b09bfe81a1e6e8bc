#pragma once
/// \file
/// \brief CUDA backend of window_scores and scored_prefix_lengths (contract in window_scores.hpp, plan and
/// workspace in window_scores_plan.hpp).
///
/// Two passes per call: the log-sum-exp of each scored query (skipped when the caller gives lse), then
/// the column sums. Three paths, chosen by the plan (window_scores_plan.hpp):
/// - the ring path (16-bit Q and K of one type, head_dim 64/128/256, 16-byte aligned K rows, per-head
///   rows only for a group that divides 8): one operand resident in registers, the other streamed
///   through a shared-memory ring (detail/window_scores_ring.cuh);
/// - the general tensor-core path, the other 16-bit cases (detail/window_scores_mma.cuh);
/// - the CUDA-core path, the rest (detail/window_scores_simt.cuh).
/// Every kernel takes the views and one WindowScoresLaunch by value. Grids come from the plan (shapes,
/// params.max_length and the SM count), never from lengths in device memory, so a call can be captured
/// in a CUDA graph.

#include <algorithm>
#include <cstdint>

#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/smem_limit.cuh"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/row_alignment.hpp"
#include "kvsift/ops/detail/window_scores_common.cuh"
#include "kvsift/ops/detail/window_scores_mma.cuh"
#include "kvsift/ops/detail/window_scores_ring.cuh"
#include "kvsift/ops/detail/window_scores_simt.cuh"
#include "kvsift/ops/window_scores.hpp"
#include "kvsift/ops/window_scores_plan.hpp"

namespace kvsift {
namespace detail {

// The two passes, on tensor cores for head_dim D (64, 128 or 256) or on CUDA cores (D = 0).
template <int D, class View, class QT>
Status launch_window_score_passes(cudaStream_t stream, const View& kv, const QueryRows<QT>& q,
                                  const WindowScoresLaunch& launch) {
  constexpr int kRowTile = D > 0 ? kMmaRowTile : kScoreTile;
  constexpr int kKeysPerBlock = D > 0 ? kMmaKeysPerBlock : kScoreTile;
  static_assert(kMmaThreads == kScoreThreads, "both paths launch blocks of the same size");
  const int bh = kv.batch * kv.num_kv_heads;
  const int rows = launch.plan.row_capacity;
  if (!launch.params.lse) {
    const dim3 grid1((rows + kRowTile - 1) / kRowTile, launch.plan.chunks, bh);
    if constexpr (D > 0) lse_partials_mma_kernel<D><<<grid1, kMmaThreads, 0, stream>>>(kv, q, launch);
    else lse_partials_kernel<<<grid1, kScoreThreads, 0, stream>>>(kv, q, launch);
    KVSIFT_CHECK_LAUNCH();
    lse_merge_kernel<<<dim3((rows + 127) / 128, bh), 128, 0, stream>>>(kv, q, launch);
    KVSIFT_CHECK_LAUNCH();
  }
  const std::int64_t keys = std::min<std::int64_t>(launch.plan.cols, launch.plan.max_length);
  const dim3 grid2(unsigned((keys + kKeysPerBlock - 1) / kKeysPerBlock), bh);
  if constexpr (D > 0) column_sums_mma_kernel<D><<<grid2, kMmaThreads, 0, stream>>>(kv, q, launch);
  else column_sums_kernel<<<grid2, kScoreThreads, 0, stream>>>(kv, q, launch);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

// The ring path (detail/window_scores_ring.cuh): the log-sum-exp pass and its merge unless the caller
// gives lse, then the column sums: Q resident on a persistent grid (one row tile per head), K resident
// in 128-key blocks (several row tiles), or the general tensor-core kernel (several row tiles, query
// rows not 16-byte aligned; it reads the same per-row log-sum-exps).
template <int D, class View, class QT>
Status launch_window_score_ring(const cuda::Exec& exec, const View& kv, const QueryRows<QT>& q,
                                const WindowScoresLaunch& launch) {
  using R = WindowRing<D>;
  const int bh = kv.batch * kv.num_kv_heads;
  const int heads_out = launch.params.heads == ScoreHeads::kQueryHead ? q.num_heads / kv.num_kv_heads : 1;
  // Kernel limits only grow, under a lock (core/smem_limit.cuh: several host threads).
  const char* what = "window_scores: cudaFuncSetAttribute";
  // Exec::dependent_launch: each ring kernel waits for the kernel before it (dependent_kernel_start).
  const bool pdl = exec.launches_dependent();
  if (!launch.params.lse) {
    auto* partials = lse_partials_ring_kernel<D, View, QT>;
    const std::size_t smem = kWindowRingAlign + R::kRingBytes + R::kFlagBytes;
    KVSIFT_TRY(raise_dynamic_smem_limit(partials, smem, /*max_carveout=*/true, what));
    KVSIFT_CUDA_TRY(launch_with_pdl(pdl, partials, dim3(launch.plan.ring_grid), dim3(R::kThreads), smem, exec.stream, kv, q, launch));
    KVSIFT_CUDA_TRY(launch_with_pdl(pdl, lse_merge_ring_kernel<View, QT>, dim3((launch.plan.row_capacity + 7) / 8, bh), dim3(256), 0,
                                    exec.stream, kv, q, launch));
  }
  const std::int64_t keys = std::min<std::int64_t>(launch.plan.cols, launch.plan.max_length);
  if (launch.plan.ring_columns == kRingColumnsQ) {
    const int grid = window_ring_grid(std::int64_t(bh) * window_ring_tiles(keys), exec.device.num_sms, D);
    auto* sums = column_sums_ring_kernel<D, View, QT>;
    const std::size_t smem = kWindowRingAlign + R::kRingBytes + window_ring_col_bytes(D, heads_out) + R::kFlagBytes;
    KVSIFT_TRY(raise_dynamic_smem_limit(sums, smem, /*max_carveout=*/true, what));
    KVSIFT_CUDA_TRY(launch_with_pdl(pdl, sums, dim3(grid), dim3(R::kThreads), smem, exec.stream, kv, q, launch));
  } else if (launch.plan.ring_columns == kRingColumnsK) {
    const dim3 grid(unsigned(bh), unsigned((keys + kWindowRingRows - 1) / kWindowRingRows));
    auto* sums = column_sums_keys_kernel<D, View, QT>;
    const std::size_t smem = kWindowRingAlign + R::kRingBytes + window_ring_lse_bytes(D);
    KVSIFT_TRY(raise_dynamic_smem_limit(sums, smem, /*max_carveout=*/true, what));
    KVSIFT_CUDA_TRY(launch_with_pdl(pdl, sums, dim3(grid), dim3(R::kThreads), smem, exec.stream, kv, q, launch));
  } else {
    const dim3 grid(unsigned((keys + kMmaKeysPerBlock - 1) / kMmaKeysPerBlock), unsigned(bh));
    column_sums_mma_kernel<D><<<grid, kMmaThreads, 0, exec.stream>>>(kv, q, launch);  // plain: it has no wait
    KVSIFT_CHECK_LAUNCH();
  }
  return Status();
}

}  // namespace detail

namespace cuda {

/// Same contract as host::window_scores; pointers are device pointers. Asynchronous on exec.stream:
/// no allocation, no synchronization, no read of device data by the host. Unless params.lse is given,
/// `workspace` must hold window_scores_workspace_bytes(exec, ...) bytes (kNullPointer when its data
/// is null), sized with an Exec of the same device facts. kInvalidArgument for an Exec without its
/// device facts (exec.device.num_sms), kUnsupported when batch * num_kv_heads > 65535 or the prompt is
/// too long for one launch. fp8 views are read by the CUDA-core kernels (each K element dequantized as
/// code x scale).
template <class View, class QT>
Status window_scores(const Exec& exec, const View& kv, const QueryRows<QT>& q, const WindowScoreParams& params,
                     StridedView2D<float> scores, Workspace workspace = {}) {
  static_assert(check_kv_view<View>());
  KVSIFT_TRY(detail::validate_window_scores(kv, q, params, scores));
  KVSIFT_TRY(exec.device.validate("window_scores"));
  const detail::WindowScorePlan plan = detail::plan_window_scores(kv, q, params, scores, exec.device);
  KVSIFT_REQUIRE(plan.max_length >= 0, kInvalidArgument,
                 "max_length = 0 and the view has no capacity: set WindowScoreParams::max_length");
  if (kv.batch == 0 || plan.max_length <= params.window || scores.cols == 0) return Status();
  KVSIFT_REQUIRE(std::int64_t(kv.batch) * kv.num_kv_heads <= 65535, kUnsupported, "batch * num_kv_heads = ",
                 std::int64_t(kv.batch) * kv.num_kv_heads, " must be <= 65535");

  WorkspaceCarver ws(workspace);
  const detail::WindowScoreScratch scratch = detail::carve_window_scores(ws, kv, params, plan, exec.device.num_sms);
  const detail::WindowScoresLaunch launch{params, scores, plan, scratch, exec.data_error};
  if (!params.lse) {
    KVSIFT_REQUIRE(workspace.data != nullptr, kNullPointer,
                   "workspace.data is null (ask window_scores_workspace_bytes)");
    KVSIFT_TRY(ws.status());
  }
  if constexpr (detail::window_scores_tensor_core_types<View, QT>()) {
    if (plan.ring_grid > 0) {
      if (plan.tensor_cores == 64) return detail::launch_window_score_ring<64>(exec, kv, q, launch);
      if (plan.tensor_cores == 128) return detail::launch_window_score_ring<128>(exec, kv, q, launch);
      return detail::launch_window_score_ring<256>(exec, kv, q, launch);
    }
  }
  KVSIFT_REQUIRE(plan.chunks <= 65535, kUnsupported, "prompt too long for one launch");
  if constexpr (detail::window_scores_tensor_core_types<View, QT>()) {
    // The tensor-core path stages K with 16-byte loads; unaligned rows take the CUDA-core path.
    if (plan.tensor_cores == 64) return detail::launch_window_score_passes<64>(exec.stream, kv, q, launch);
    if (plan.tensor_cores == 128) return detail::launch_window_score_passes<128>(exec.stream, kv, q, launch);
    if (plan.tensor_cores == 256) return detail::launch_window_score_passes<256>(exec.stream, kv, q, launch);
  }
  return detail::launch_window_score_passes<0>(exec.stream, kv, q, launch);
}

/// Same contract as host::scored_prefix_lengths; row_lengths is a device pointer. Asynchronous on
/// exec.stream; needs no workspace.
template <class View>
Status scored_prefix_lengths(const Exec& exec, const View& kv, int window, int heads_per_sequence, std::int64_t cols,
                             std::int32_t* row_lengths, Workspace /*workspace: none needed*/ = {}) {
  static_assert(check_kv_view<View>());
  KVSIFT_TRY(detail::validate_scored_prefix_lengths(kv, heads_per_sequence, row_lengths));
  const int rows = kv.batch * heads_per_sequence;
  if (rows == 0) return Status();
  const detail::ScoredPrefixLengthsLaunch launch{window, heads_per_sequence, cols, row_lengths};
  KVSIFT_CUDA_TRY(detail::launch_with_pdl(exec.launches_dependent(),
                                          detail::scored_prefix_lengths_kernel<View>, dim3((rows + 255) / 256), dim3(256), 0,
                                          exec.stream, kv, launch));
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
