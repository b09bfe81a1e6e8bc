#pragma once
/// \file
/// \brief CUDA backend of attention_cosine (contract in attention_similarity.hpp, plan and workspace query in
/// attention_similarity_plan.hpp, kernel in detail/attention_similarity_kernel.cuh). Meant for
/// calibration and fidelity reports, not the decode hot path.

#include <cstdint>

#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/workspace.hpp"
#include "kvsift/ops/attention_similarity.hpp"
#include "kvsift/ops/attention_similarity_plan.hpp"
#include "kvsift/ops/detail/attention_similarity_kernel.cuh"

namespace kvsift {
namespace cuda {

/// Same contract as host::attention_cosine (fp32 accumulation); pointers are device pointers.
/// Asynchronous on exec.stream; needs no workspace. kUnsupported when batch * q.num_heads > 65535. fp8
/// views: each K element is dequantized as code x scale, as the host reference does.
template <class View, class QT>
Status attention_cosine(const Exec& exec, const View& kv, const QueryRows<QT>& q, int num_queries, float sm_scale,
                        const KeptPositions& kept, float* cosine, Workspace /*workspace: none needed*/ = {}) {
  static_assert(check_kv_view<View>());
  KVSIFT_TRY(detail::validate_attention_cosine(kv, q, num_queries, kept, cosine));
  if (kv.batch == 0 || num_queries == 0) return Status();
  KVSIFT_REQUIRE(std::int64_t(kv.batch) * q.num_heads <= 65535, kUnsupported, "batch * q.num_heads must be <= 65535");
  const detail::AttentionCosineLaunch launch{num_queries, kept, cosine, detail::plan_attention_cosine(kv, sm_scale),
                                            exec.data_error};
  detail::attention_cosine_kernel<<<dim3(num_queries, kv.batch * q.num_heads), detail::kCosineThreads,
                                    launch.plan.smem_bytes, exec.stream>>>(kv, q, launch);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
