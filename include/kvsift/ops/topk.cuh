#pragma once
/// \file
/// \brief CUDA backend of topk (contract in topk.hpp, plan in topk_plan.hpp, design notes in docs/ops/topk.md).
///
/// One launch: the candidate select (ops/detail/topk_candidate_select.cuh) where the plan finds its
/// shared memory, else the radix select (ops/detail/topk_radix_select.cuh). The launch shape comes
/// from the plan, never from lengths or k in device memory, so a call can be captured in a CUDA graph.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/smem_limit.cuh"
#include "kvsift/core/workspace.hpp"
#include "kvsift/ops/detail/topk_candidate_select.cuh"
#include "kvsift/ops/detail/topk_radix_select.cuh"
#include "kvsift/ops/topk.hpp"
#include "kvsift/ops/topk_plan.hpp"

namespace kvsift {
namespace cuda {

/// Same contract as host::topk; pointers are device pointers. Asynchronous on exec.stream: no
/// allocation, no synchronization, no read of device data by the host, no driver query. Needs no
/// workspace today (topk_workspace_bytes reports 0); a workspace passed anyway is ignored.
template <class T, class Key = ScoreKey<T>>
Status topk(const Exec& exec, StridedView2D<const T> scores, const TopKParams& params, IndexSet out,
            T* values = nullptr, Key key = Key{}, Workspace /*workspace*/ = {}) {
  static_assert(detail::check_key_policy<T, Key>());
  KVSIFT_TRY(detail::validate_topk(scores, params, out, values, key));
  if (scores.rows == 0) return Status();
  KVSIFT_TRY(exec.device.validate("topk"));

  using K = typename Key::key_type;
  detail::TopkLaunch<T, Key> launch{scores, params, out, values, key,
                                    detail::plan_topk<K>(scores.rows, int(scores.cols), exec.device)};
  KVSIFT_REQUIRE(scores.rows * launch.plan.ctas_per_row <= INT32_MAX, kUnsupported, "scores.rows = ", scores.rows,
                 " is too many rows for one launch");
  // 16-byte loads need every row to start on a 16-byte boundary; otherwise the kernel reads scalars.
  launch.plan.vector_loads = reinterpret_cast<std::uintptr_t>(scores.data) % 16 == 0 &&
                             (scores.row_stride * std::int64_t(sizeof(T))) % 16 == 0;

  auto kernel = launch.plan.kernel == detail::TopkKernel::kRadixSelect ? detail::topk_radix_select_kernel<T, Key>
                : launch.plan.threads == 256 ? detail::topk_candidate_select_kernel<T, Key, 256>
                                             : detail::topk_candidate_select_kernel<T, Key, 512>;
  // The 256-thread configuration has no peer loop (detail::kTopkCandMaxGroup).
  KVSIFT_REQUIRE(launch.plan.kernel != detail::TopkKernel::kCandidateSelect || launch.plan.threads == 512 ||
                     launch.plan.ctas_per_row == 1,
                 kInternal, "topk plan: 256-thread CTAs in a group of ", launch.plan.ctas_per_row);
  // Static shared memory (about 17-19 KB) counts against the 48 KB default too, so the dynamic limit is
  // raised for every cached launch, not only for slices above 48 KB, and only ever raised
  // (core/smem_limit.cuh: several host threads). Two 113 KB candidate-select CTAs per SM need the
  // largest carveout; the kernel streams its row once, so the L1 it gives up holds nothing worth keeping.
  if (launch.plan.smem_bytes > 0)
    KVSIFT_TRY(detail::raise_dynamic_smem_limit(kernel, launch.plan.smem_bytes,
                                                launch.plan.kernel == detail::TopkKernel::kCandidateSelect,
                                                "topk: cudaFuncSetAttribute"));

  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(scores.rows * launch.plan.ctas_per_row));
  config.blockDim = dim3(unsigned(launch.plan.threads));
  config.dynamicSmemBytes = launch.plan.smem_bytes;
  config.stream = exec.stream;
  cudaLaunchAttribute group_dim;
  group_dim.id = cudaLaunchAttributeClusterDimension;
  group_dim.val.clusterDim.x = unsigned(launch.plan.ctas_per_row);
  group_dim.val.clusterDim.y = 1;
  group_dim.val.clusterDim.z = 1;
  config.attrs = &group_dim;
  config.numAttrs = exec.device.clusters ? 1 : 0;
  KVSIFT_CUDA_TRY(cudaLaunchKernelEx(&config, kernel, launch.scores, launch.params, launch.out, launch.values, launch.key,
                                     launch.plan));
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
