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

#include <cstddef>
#include <utility>

namespace minimal_decoder {
namespace kernels {

// griddepcontrol exists from sm_90 on; older targets serialize launches anyway.
__device__ inline void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ inline void allow_next_kernel_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute when `pdl`. Returns the
// launch's error (a bad configuration; faults show up later).
template <class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream, bool pdl,
                          Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = pdl ? &attr : nullptr;
  config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace kernels
}  // namespace minimal_decoder
