#pragma once
/// \file
/// \brief Programmatic dependent launch (PDL) between the kernels of one op.
///
/// An op that needs two kernels (decode attention's split pass and its merge) launches the second
/// with `cudaLaunchAttributeProgrammaticStreamSerialization`: the second grid is scheduled as soon as
/// every block of the first has called allow_dependent_grids(), runs nothing that depends on the
/// first, and blocks in wait_for_primary_grid() until the first grid has completed and its writes are
/// visible. The second launch and its block start-up then overlap the first kernel's tail instead of
/// following it, and no counter in memory has to be zeroed for the hand-over. Stream capture records
/// the relation as a programmatic graph edge, so a replayed graph overlaps the same way.
///
/// The rules a kernel launched with launch_dependent() keeps: every block calls
/// wait_for_primary_grid() before it reads what the first kernel wrote and before it writes anything
/// (so the grid cannot complete before the first one has, which keeps the order for whatever the
/// stream runs next). Both calls compile to nothing before sm_90, where the attribute is not set.

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/status.hpp"

namespace kvsift {
namespace detail {

/// In the first kernel: lets the dependent grid be scheduled (it orders no memory; the dependent's
/// wait does).
__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// In the dependent kernel: returns once the grid before it on the stream has completed and its
/// memory operations are visible (at once when the kernel was launched without the attribute).
__device__ __forceinline__ void wait_for_primary_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// First thing in a kernel that is both: wait for the kernel before it (everything it reads may be
/// that kernel's output), then let the kernel after it be scheduled (which waits for this one).
__device__ __forceinline__ void dependent_kernel_start() {
  wait_for_primary_grid();
  allow_dependent_grids();
}

/// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic-serialization attribute when
/// `pdl` (the device must have PDL: compute capability 9.0 or later) and, when cluster_x > 1, in
/// thread-block clusters of cluster_x blocks along x (sm_90+; grid.x a multiple of it); the launch's error.
template <class... Params, class... Args>
cudaError_t launch_with_attributes(bool pdl, unsigned cluster_x, void (*kernel)(Params...), dim3 grid, dim3 block,
                                   std::size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attrs[2] = {};
  unsigned n = 0;
  if (pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_x > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = cluster_x;
    attrs[n].val.clusterDim.y = 1;
    attrs[n++].val.clusterDim.z = 1;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = n > 0 ? attrs : nullptr;
  config.numAttrs = n;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

/// launch_with_attributes without clusters.
template <class... Params, class... Args>
cudaError_t launch_with_pdl(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
                            Args&&... args) {
  return launch_with_attributes(pdl, 0u, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

/// kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent of the launch before
/// it on `stream` when the device has PDL (compute capability 9.0 and later), a plain launch
/// otherwise. `what` names the op in an error.
template <class... Params, class... Args>
Status launch_dependent(const DeviceFacts& device, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                        cudaStream_t stream, const char* what, Args&&... args) {
  return from_cuda(launch_with_pdl(device.cc_major >= 9, kernel, grid, block, smem, stream, std::forward<Args>(args)...), what);
}

}  // namespace detail
}  // namespace kvsift
