#pragma once
/// \file
/// \brief CUDA backend of copy_kv_to_dense (contract in copy_kv_to_dense.hpp, workspace query in
/// copy_kv_to_dense_plan.hpp, kernel in detail/copy_kv_to_dense_kernel.cuh).

#include <cstdint>
#include <type_traits>

#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/workspace.hpp"
#include "kvsift/ops/copy_kv_to_dense.hpp"
#include "kvsift/ops/copy_kv_to_dense_plan.hpp"
#include "kvsift/ops/detail/copy_kv_to_dense_kernel.cuh"

namespace kvsift {
namespace cuda {

/// Same contract as host::copy_kv_to_dense; pointers are device pointers. Asynchronous on exec.stream;
/// needs no workspace. kUnsupported when kv.batch or kv.num_kv_heads exceeds 65535.
template <class View>
Status copy_kv_to_dense(const Exec& exec, const View& kv, int max_tokens,
                        std::remove_const_t<typename View::value_type>* k_out,
                        std::remove_const_t<typename View::value_type>* v_out,
                        Workspace /*workspace: none needed*/ = {}) {
  static_assert(check_kv_view<View>());
  KVSIFT_TRY(detail::validate_copy_kv_to_dense(kv, max_tokens, k_out, v_out));
  if (kv.batch == 0 || max_tokens == 0) return Status();
  KVSIFT_REQUIRE(kv.batch <= 65535 && kv.num_kv_heads <= 65535, kUnsupported, "kv.batch = ", kv.batch,
                 " and kv.num_kv_heads = ", kv.num_kv_heads, " must each be <= 65535 for this launch");
  using Out = std::remove_const_t<typename View::value_type>;
  const dim3 grid((max_tokens + detail::kCopyDenseRowsPerBlock - 1) / detail::kCopyDenseRowsPerBlock,
                  kv.num_kv_heads, kv.batch);
  detail::copy_kv_to_dense_kernel<<<grid, detail::kCopyDenseThreads, 0, exec.stream>>>(
      kv, detail::CopyKvToDenseLaunch<Out>{max_tokens, k_out, v_out, exec.data_error});
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
