#pragma once
/// \file
/// \brief CUDA backend of topk (contract in topk.hpp, plan in topk_plan.hpp, design notes in docs/ops/topk.md).
///
/// One launch: the register select (ops/detail/topk_register_select.cuh) for a few long rows, the
/// short-row select (ops/detail/topk_short_row_select.cuh) for rows of up to 4096 positions, the
/// stream select (ops/detail/topk_stream_select.cuh) for many long rows, the candidate select
/// (ops/detail/topk_candidate_select.cuh) where the plan finds its shared memory, else the radix
/// select (ops/detail/topk_radix_select.cuh). The launch shape comes
/// from the plan, never from lengths or k in device memory, so a call can be captured in a CUDA graph.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/dependent_launch.cuh"
#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/smem_limit.cuh"
#include "kvsift/core/workspace.hpp"
#include "kvsift/ops/detail/topk_candidate_select.cuh"
#include "kvsift/ops/detail/topk_radix_select.cuh"
#include "kvsift/ops/detail/topk_register_select.cuh"
#include "kvsift/ops/detail/topk_short_row_select.cuh"
#include "kvsift/ops/detail/topk_stream_select.cuh"
#include "kvsift/ops/topk.hpp"
#include "kvsift/ops/topk_plan.hpp"

namespace kvsift {
namespace detail {

/// The plan cuda::topk launches for scores of type T under key policy Key: plan_topk, except that a
/// key policy with no value it never produces (kTopkRegHasSentinel: 64-bit keys, 32-bit user
/// policies) skips the register select (short rows still take the short-row select, which needs no
/// sentinel).
template <class T, class Key>
TopkPlan topk_plan_for(std::int64_t rows, int cols, const DeviceFacts& device) {
  return plan_topk<typename Key::key_type>(rows, cols, device, kTopkRegHasSentinel<T, Key>);
}

/// Dynamic shared memory of the register select's listing instantiation: 192 KiB where the device
/// has it beside the static histograms (an H100 or H200), else the plan's.
inline std::size_t device_listing_smem(const DeviceFacts& device) {
  constexpr std::size_t kListing = std::size_t(192) << 10;
  return kListing + kTopkRegStaticSmem + 1024 <= device.max_smem_optin ? kListing : 0;
}

/// Launches the plan's kernel for an already validated call (cuda::topk's second half). Tests and
/// bench_topk also call it with a plan of their choosing (plan_topk_stream, or a forced CTA group) to
/// run every kernel on the same shapes; the plan must come from topk_plan.hpp's functions.
template <class T, class Key>
Status launch_topk(const cuda::Exec& exec, TopkLaunch<T, Key> launch) {
  const TopkPlan& plan = launch.plan;
  // The grid covers the rows the filter writes: a sparse head's row costs no CTA (topk_written_row).
  const std::int64_t rows = topk_written_rows(launch.params, launch.scores.rows);
  if (rows == 0) return Status();
  KVSIFT_REQUIRE(rows * plan.ctas_per_row <= INT32_MAX, kUnsupported, "scores.rows = ", launch.scores.rows,
                 " is too many rows for one launch");
  KVSIFT_REQUIRE(plan.kernel != TopkKernel::kStreamSelect || (plan.list_capacity > 0 && plan.ctas_per_row == 1 &&
                                                              std::int64_t(plan.bitmap_words) * 32 >= plan.cols),
                 kInternal, "topk plan: a stream select without room for its list or bitmaps");
  KVSIFT_REQUIRE(plan.kernel != TopkKernel::kStreamSelect || plan.sample_period >= 1, kInternal,
                 "topk plan: sample_period = ", plan.sample_period, " must be >= 1");
  // The 256-thread configuration has no peer loop (detail::kTopkCandMaxGroup).
  KVSIFT_REQUIRE(plan.kernel != TopkKernel::kCandidateSelect || plan.threads == 512 || plan.ctas_per_row == 1,
                 kInternal, "topk plan: 256-thread CTAs in a group of ", plan.ctas_per_row);
  // 16-byte loads need every row to start on a 16-byte boundary; otherwise the kernel reads scalars.
  launch.plan.vector_loads = reinterpret_cast<std::uintptr_t>(launch.scores.data) % 16 == 0 &&
                             (launch.scores.row_stride * std::int64_t(sizeof(T))) % 16 == 0;

  auto kernel = plan.kernel == TopkKernel::kRadixSelect    ? topk_radix_select_kernel<T, Key>
                : plan.kernel == TopkKernel::kStreamSelect ? topk_stream_select_kernel<T, Key>
                : plan.threads == 256                      ? topk_candidate_select_kernel<T, Key, 256>
                                                           : topk_candidate_select_kernel<T, Key, 512>;
  if constexpr (kTopkRegHasSentinel<T, Key>) {
    if (plan.kernel == TopkKernel::kRegisterSelect) {
      const int keys = plan.threads > 0 ? plan.slice / plan.threads : 0;
      // 8 or 16 keys a thread at 256 threads, 16 or 32 at 512 (plan_topk_register).
      const bool narrow = plan.threads == kTopkRegThreads, wide = plan.threads == kTopkRegWideThreads;
      KVSIFT_REQUIRE((narrow || wide) && plan.slice == keys * plan.threads &&
                         (narrow ? keys == 8 || keys == 16 : keys == 16 || keys == 32) && plan.ctas_per_row >= 2 &&
                         plan.ctas_per_row <= kTopkRegMaxGroup && exec.device.clusters &&
                         std::int64_t(plan.slice) * plan.ctas_per_row >= plan.cols,
                     kInternal, "topk plan: a register select with slice ", plan.slice, " in groups of ",
                     plan.ctas_per_row);
      kernel = narrow ? (keys == 8 ? topk_register_select_kernel<T, Key, 8, kTopkRegThreads>
                                   : topk_register_select_kernel<T, Key, 16, kTopkRegThreads>)
                      : (keys == 16 ? topk_register_select_kernel<T, Key, 16, kTopkRegWideThreads>
                                    : topk_register_select_kernel<T, Key, 32, kTopkRegWideThreads>);
      // Score candidates take the instantiation that reads them (validate_topk allows them only here),
      // with room for lists of up to five budgets of 4096 at 128K (topk_listed_capacity): the list's
      // capacity, not its margin, decides how often it holds on learned attention (docs/performance.md,
      // forty-fifth session). One CTA an SM either way.
      if constexpr (std::is_same_v<T, float> && std::is_same_v<Key, ScoreKey<float>>) {
        if (launch.params.candidates.enabled()) {
          launch.plan.smem_bytes = std::max(launch.plan.smem_bytes, device_listing_smem(exec.device));
          kernel = narrow ? (keys == 8 ? topk_register_select_kernel<T, Key, 8, kTopkRegThreads, true>
                                       : topk_register_select_kernel<T, Key, 16, kTopkRegThreads, true>)
                          : (keys == 16 ? topk_register_select_kernel<T, Key, 16, kTopkRegWideThreads, true>
                                        : topk_register_select_kernel<T, Key, 32, kTopkRegWideThreads, true>);
        }
      }
    }
  } else {
    KVSIFT_REQUIRE(plan.kernel != TopkKernel::kRegisterSelect, kInternal,
                   "topk plan: a register select for a key policy without a sentinel (topk_plan_for)");
  }
  if (plan.kernel == TopkKernel::kShortRowSelect) {
    const int keys = plan.slice / kTopkRegThreads;
    KVSIFT_REQUIRE(plan.threads == kTopkRegThreads && plan.ctas_per_row == 1 && (keys == 8 || keys == 16) &&
                       plan.slice % kTopkRegThreads == 0 && plan.slice >= plan.cols && plan.smem_bytes == 0,
                   kInternal, "topk plan: a short-row select with slice ", plan.slice, " for ", plan.cols,
                   " positions");
    kernel = keys == 8 ? topk_short_row_select_kernel<T, Key, 8> : topk_short_row_select_kernel<T, Key, 16>;
  }
  // Static shared memory (17-34 KB) counts against the 48 KB default too, so the dynamic limit is
  // raised for every launch with dynamic shared memory, not only above 48 KB, and only ever raised
  // (core/smem_limit.cuh: several host threads). Two CTAs per SM of the candidate and stream selects
  // need the largest carveout; they stream their rows, so the L1 they give up holds nothing worth keeping.
  if (plan.smem_bytes > 0)
    KVSIFT_TRY(raise_dynamic_smem_limit(kernel, plan.smem_bytes, plan.kernel != TopkKernel::kRadixSelect,
                                        "topk: cudaFuncSetAttribute"));
  // Groups of 16 (the register select's) are a non-portable cluster size: where the device cannot
  // schedule one, the same rows are planned again in groups of at most 8.
  if (plan.ctas_per_row > kTopkMaxCtasPerRow) {
    bool fits = false;
    KVSIFT_TRY(nonportable_clusters_fit(kernel, plan.ctas_per_row, plan.threads, plan.smem_bytes, &fits,
                                        "topk: cluster size"));
    if (!fits) {
      using K = typename Key::key_type;
      launch.plan = plan_topk_register<K>(rows, plan.cols, kTopkMaxCtasPerRow, exec.device, plan.threads);
      if (launch.plan.kernel != TopkKernel::kRegisterSelect) launch.plan = plan_topk_cta_groups<K>(rows, plan.cols, exec.device);
      return launch_topk(exec, launch);
    }
  }

  // One CTA a row without a peer: the stream and short-row selects launch no clusters.
  // Exec::dependent_launch: scheduled while the kernel before it drains; every kernel waits for it
  // (wait_for_primary_grid) before its first read.
  const bool clustered =
      exec.device.clusters && plan.kernel != TopkKernel::kStreamSelect && plan.kernel != TopkKernel::kShortRowSelect;
  KVSIFT_CUDA_TRY(launch_with_attributes(exec.launches_dependent(), clustered ? unsigned(plan.ctas_per_row) : 0u, kernel,
                                         dim3(unsigned(rows * plan.ctas_per_row)), dim3(unsigned(plan.threads)), plan.smem_bytes,
                                         exec.stream, launch.scores, launch.params, launch.out, launch.values, launch.key,
                                         launch.plan));
  return Status();
}

}  // namespace detail

namespace cuda {

/// Same contract as host::topk; pointers are device pointers. Asynchronous on exec.stream: no
/// allocation, no synchronization, no read of device data by the host, no driver query. Needs no
/// workspace today (topk_workspace_bytes reports 0); a workspace passed anyway is ignored. With
/// exec.dependent_launch, a programmatic dependent of the kernel before it (core/dependent_launch.cuh).
template <class T, class Key = ScoreKey<T>>
Status topk(const Exec& exec, StridedView2D<const T> scores, const TopKParams& params, IndexSet out,
            T* values = nullptr, Key key = Key{}, Workspace /*workspace*/ = {}) {
  static_assert(detail::check_key_policy<T, Key>());
  KVSIFT_TRY(detail::validate_topk(scores, params, out, values, key));
  if (scores.rows == 0) return Status();
  KVSIFT_TRY(exec.device.validate("topk"));
  return detail::launch_topk(exec, detail::TopkLaunch<T, Key>{
                                       scores, params, out, values, key,
                                       detail::topk_plan_for<T, Key>(topk_written_rows(params, scores.rows),
                                                                     int(scores.cols), exec.device)});
}

}  // namespace cuda
}  // namespace kvsift
