#pragma once
// Programmatic dependent launch (PDL) for the decode step's own kernels.
//
// Why: a decode step is ~20 launches per layer, most of them small (norms, RoPE) or short (the
// GEMVs of 8-33 MB). Launched plainly, each kernel starts only after the previous one has drained:
// the GPU idles through every tail and launch. With the stream attribute
// cudaLaunchAttributeProgrammaticStreamSerialization a kernel may be scheduled while its
// predecessor still runs; it then does its independent work (the GEMV's first weight loads) and
// blocks in wait_for_previous_kernel() until the predecessor has completed and its writes are
// visible. Stream capture records the relation as a programmatic graph edge, so replayed steps
// (CudaBackend::StepGraph) overlap the same way.
//
// The rules every kernel launched through launch_kernel(..., pdl = true) keeps:
//   - it calls wait_for_previous_kernel() in every block before it reads anything an earlier
//     kernel wrote and before it writes anything (an earlier kernel may still read it); there is
//     no implicit wait, and a block that skipped it could let the grid complete early, which would
//     break the chain for the kernel after it;
//   - it may call allow_next_kernel_launch() anywhere: the trigger only lets the next kernel be
//     scheduled, it orders no memory (the next kernel's own wait does).
// A kernel launched without the attribute (kvsift's, cuBLAS', or ours with PDL off) waits for its
// predecessor completely, as always; for it, both calls below are no-ops.

#include <cuda_runtime_api.h>

#include <kvsift/core/dependent_launch.cuh>

#include <cstddef>
#include <utility>

namespace minimal_decoder {
namespace kernels {

// kvsift's own PDL primitives (core/dependent_launch.cuh; griddepcontrol exists from sm_90 on, and
// older targets serialize launches anyway), under the names this backend's rules above use.
__device__ inline void wait_for_previous_kernel() { kvsift::detail::wait_for_primary_grid(); }
__device__ inline void allow_next_kernel_launch() { kvsift::detail::allow_dependent_grids(); }

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute when `pdl`. Returns the
// launch's error (a bad configuration; faults show up later).
template <class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream, bool pdl,
                          Args&&... args) {
  return kvsift::detail::launch_with_pdl(pdl, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace kernels
}  // namespace minimal_decoder
