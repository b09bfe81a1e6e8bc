#pragma once
/// \file
/// \brief raise_dynamic_smem_limit: a kernel's dynamic shared-memory limit, raised and never lowered;
/// nonportable_clusters_fit: whether clusters past 8 CTAs can run, asked once per kernel.
///
/// `cudaFuncAttributeMaxDynamicSharedMemorySize` belongs to the kernel (per device), not to a launch.
/// Setting it to each call's own need is a race between host threads: a call that needs less can lower
/// the limit between another call's set and its launch, which then fails with an invalid-value error.
/// So a launcher asks for at least its bytes here: the limit only ever grows, a mutex orders the
/// raises, and the calls that need no raise (all but the first few of each kernel) change nothing.
/// Nothing is enqueued, so a captured graph is unaffected. (A cudaDeviceReset forgets the attributes
/// but not this record; kvsift does not support resetting a device under it.)

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/status.hpp"

namespace kvsift {
namespace detail {

/// Ensures `kernel` on the current device may use `bytes` of dynamic shared memory, and on the first
/// call for it prefers the largest shared-memory carveout when `max_carveout` (kernels sized for
/// several blocks per SM). `what` names the op in an error.
inline Status raise_dynamic_smem_limit(const void* kernel, std::size_t bytes, bool max_carveout, const char* what) {
  int device = 0;
  KVSIFT_TRY(from_cuda(cudaGetDevice(&device), what));
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, std::size_t> raised;  // highest limit set per (kernel, device)
  std::lock_guard<std::mutex> lock(mutex);
  auto found = raised.find({kernel, device});
  if (found != raised.end() && found->second >= bytes) return Status();
  KVSIFT_TRY(from_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)), what));
  if (max_carveout && found == raised.end())
    KVSIFT_TRY(from_cuda(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared)),
        what));
  raised[{kernel, device}] = bytes;
  return Status();
}

/// The same for a typed kernel pointer.
template <class Kernel>
Status raise_dynamic_smem_limit(Kernel* kernel, std::size_t bytes, bool max_carveout, const char* what) {
  return raise_dynamic_smem_limit(reinterpret_cast<const void*>(kernel), bytes, max_carveout, what);
}

/// Whether `kernel` on the current device can run clusters of `cluster` CTAs, more than the portable
/// 8, of `threads` threads and `smem_bytes` of dynamic shared memory each (its limit raised first). The
/// first ask per (kernel, device, cluster, bytes) lets the kernel use such clusters (an attribute of the
/// kernel, only ever turned on) and asks the occupancy calculator whether one fits at all: an H100 or
/// H200 holds several clusters of 16, a part whose GPCs have fewer free SMs holds none. The answer is
/// kept, so later calls enqueue nothing and query nothing (a captured graph is unaffected).
template <class Kernel>
Status nonportable_clusters_fit(Kernel* kernel, int cluster, int threads, std::size_t smem_bytes, bool* fits,
                                const char* what) {
  int device = 0;
  KVSIFT_TRY(from_cuda(cudaGetDevice(&device), what));
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int, std::size_t>, bool> known;
  std::lock_guard<std::mutex> lock(mutex);
  const std::tuple<const void*, int, int, std::size_t> id{reinterpret_cast<const void*>(kernel), device, cluster,
                                                          smem_bytes};
  const auto found = known.find(id);
  if (found != known.end()) {
    *fits = found->second;
    return Status();
  }
  KVSIFT_TRY(from_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), what));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(cluster));
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = smem_bytes;
  cudaLaunchAttribute dim;
  dim.id = cudaLaunchAttributeClusterDimension;
  dim.val.clusterDim.x = unsigned(cluster);
  dim.val.clusterDim.y = 1;
  dim.val.clusterDim.z = 1;
  config.attrs = &dim;
  config.numAttrs = 1;
  int clusters = 0;
  // A size the device cannot schedule at all may be reported as an error rather than 0: both mean no.
  const cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
  if (err != cudaSuccess) (void)cudaGetLastError();
  *fits = err == cudaSuccess && clusters > 0;
  known[id] = *fits;
  return Status();
}

}  // namespace detail
}  // namespace kvsift
