#pragma once
/// \file
/// \brief raise_dynamic_smem_limit: a kernel's dynamic shared-memory limit, raised and never lowered.
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

}  // namespace detail
}  // namespace kvsift
