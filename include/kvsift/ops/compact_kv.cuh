#pragma once
/// \file
/// \brief CUDA backend of compact_kv (contract in compact_kv.hpp, workspace query in compact_kv_plan.hpp,
/// kernel in detail/compact_kv_kernel.cuh).

#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/workspace.hpp"
#include "kvsift/ops/compact_kv.hpp"
#include "kvsift/ops/compact_kv_plan.hpp"
#include "kvsift/ops/store_kv.hpp"  // check_writable_scales
#include "kvsift/ops/detail/compact_kv_kernel.cuh"

namespace kvsift {
namespace cuda {

/// Same contract as host::compact_kv; pointers are device pointers. Asynchronous on exec.stream;
/// needs no workspace. Slots are written in parallel, so dst must not alias src (no in-place
/// compaction). kUnsupported for more than 65535 destination rows.
template <class Src, class Dst>
Status compact_kv(const Exec& exec, const Src& src, ConstIndexSet kept, int window, const Dst& dst, CompactOutputs out,
                  Workspace /*workspace: none needed*/ = {}) {
  static_assert(check_kv_view<Src>());
  static_assert(check_kv_view<Dst>());
  static_assert(detail::check_writable_scales<Dst>());
  KVSIFT_TRY(detail::validate_compact_kv(src, kept, window, dst, out));
  const int rows = dst.batch * dst.num_kv_heads, slots = kept.capacity + window;
  if (rows == 0 || slots == 0) return Status();
  KVSIFT_REQUIRE(rows <= 65535, kUnsupported, "dst.batch * dst.num_kv_heads = ", rows, " must be <= 65535");
  const dim3 grid((slots + detail::kCompactSlotsPerBlock - 1) / detail::kCompactSlotsPerBlock, rows);
  const detail::CompactKvLaunch launch{kept, window, out, exec.data_error};
  KVSIFT_CUDA_TRY(detail::launch_with_pdl(exec.launches_dependent(), detail::compact_kv_kernel<Src, Dst>,
                                          grid, dim3(detail::kCompactThreads), 0, exec.stream, src, dst, launch));
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
