#pragma once
/// \file
/// \brief raise_dynamic_smem_limit: a kernel's dynamic shared-memory limit, raised and never lowered;
/// allow_nonportable_clusters: clusters past 8 CTAs, allowed once per kernel.
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

/// Lets `kernel` on the current device launch in clusters larger than the portable 8 CTAs (16 on an
/// H100 or H200), set once per (kernel, device) under the same rules as the limit above: the
/// attribute belongs to the kernel, it is only ever turned on, and nothing is enqueued.
template <class Kernel>
Status allow_nonportable_clusters(Kernel* kernel, const char* what) {
  int device = 0;
  KVSIFT_TRY(from_cuda(cudaGetDevice(&device), what));
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, bool> allowed;
  std::lock_guard<std::mutex> lock(mutex);
  const std::pair<const void*, int> id{reinterpret_cast<const void*>(kernel), device};
  if (allowed.count(id)) return Status();
  KVSIFT_TRY(from_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), what));
  allowed[id] = true;
  return Status();
}

}  // namespace detail
}  // namespace kvsift
