#pragma once
/// \file
/// \brief CUDA backend of store_kv (contract in store_kv.hpp, workspace query in store_kv_plan.hpp, kernel
/// in detail/store_kv_kernel.cuh).

#include <cstdint>

#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/dependent_launch.cuh"
#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/workspace.hpp"
#include "kvsift/ops/detail/store_kv_kernel.cuh"
#include "kvsift/ops/store_kv.hpp"
#include "kvsift/ops/store_kv_plan.hpp"

namespace kvsift {
namespace cuda {

/// Same contract as host::store_kv, bytes identical; pointers are device pointers (seq and pos too, so
/// a captured graph replays for any positions; the rotary's rows agree with the host's to within one
/// rounding of the stored type). Asynchronous on exec.stream; needs no workspace. The grid depends on
/// n, num_kv_heads and rotary.num_q_heads only. With rotary: head_dim <= 256 (kUnsupported otherwise).
template <class View, class T>
Status store_kv(const Exec& exec, const View& kv, const StoreKvParams<T>& p, Workspace /*workspace: none needed*/ = {}) {
  static_assert(check_kv_view<View>());
  static_assert(detail::check_writable_scales<View>());
  KVSIFT_TRY(detail::validate_store_kv(kv, p));
  if (p.n == 0 || kv.batch == 0) return Status();
  const bool rotate = p.rotary.inv_freq != nullptr;
  if (rotate) {
    // A warp rotates a head in its registers: the row in one segment.
    KVSIFT_REQUIRE(kv.head_dim <= detail::kWarpRowElems, kUnsupported, "store_kv with rotary: head_dim = ", kv.head_dim,
                   " must be <= ", detail::kWarpRowElems, " on the GPU");
  }
  // One warp per (row, KV head), then, with rotary Q, one per (row, Q head).
  const std::int64_t pairs = std::int64_t(p.n) * (kv.num_kv_heads + (rotate && p.rotary.q ? p.rotary.num_q_heads : 0));
  const std::int64_t blocks = (pairs + detail::kStoreKvWarpsPerBlock - 1) / detail::kStoreKvWarpsPerBlock;
  KVSIFT_REQUIRE(blocks <= INT32_MAX, kUnsupported, "n * heads = ", pairs, " is too many rows for one launch");
  return from_cuda(detail::launch_with_pdl(exec.launches_dependent(), detail::store_kv_kernel<View, T>,
                                           dim3(unsigned(blocks)), dim3(detail::kStoreKvThreads), 0, exec.stream, kv,
                                           detail::StoreKvLaunch<T>{p, kv_capacity(kv), exec.data_error}),
                   "store_kv: the launch");
}

}  // namespace cuda
}  // namespace kvsift
