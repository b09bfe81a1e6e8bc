#pragma once
/// \file
/// \brief CUDA backend of the LycheeDecode handoff glue (contract in lycheedecode_handoff.hpp): one thread
/// per (sequence, KV head) row, a grid sized from kv.batch and num_kv_heads only. No allocation, no
/// synchronization, nothing read back: graph-capturable. With Exec::dependent_launch, a programmatic
/// dependent of the kernel before it.

#include <cuda_runtime_api.h>

#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/dependent_launch.cuh"
#include "kvsift/policy/lycheedecode_handoff.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kHandoffThreads = 128;

template <class View>
__global__ void __launch_bounds__(kHandoffThreads) plan_selection_rows_kernel(View kv, SelectionRowsArgs a, int rows) {
  // Exec::dependent_launch: the top-k after this kernel may be scheduled at once (it waits for this
  // grid before reading the rows); this grid waits for the attention launch before writing them.
  allow_dependent_grids();
  wait_for_primary_grid();
  const int r = int(blockIdx.x) * kHandoffThreads + int(threadIdx.x);
  if (r < rows) plan_selection_row(kv, a, r);
}

inline unsigned handoff_blocks(int rows) { return unsigned((rows + kHandoffThreads - 1) / kHandoffThreads); }

}  // namespace detail

namespace cuda {

/// Device memory for every pointer and for the view's lengths.
template <class View>
Status plan_selection_rows(const Exec& exec, const View& kv, const SelectionRowsArgs& args) {
  KVSIFT_TRY(detail::validate_selection_rows(kv, args));
  const int rows = kv.batch * kv.num_kv_heads;
  if (rows == 0) return Status();
  return from_cuda(detail::launch_with_pdl(exec.launches_dependent(),
                                           detail::plan_selection_rows_kernel<View>, dim3(detail::handoff_blocks(rows)),
                                           dim3(detail::kHandoffThreads), 0, exec.stream, kv, args, rows),
                   "plan_selection_rows: launch");
}

}  // namespace cuda
}  // namespace kvsift
