#pragma once
// The CUDA backend's execution object: the stream every launch of an op is queued on.
// Launchers never synchronize it, never allocate, and never read device memory from the host.

#include <cuda_runtime_api.h>

#include "kvsift/core/backend.hpp"

namespace kvsift {
namespace cuda {
struct Exec {
  cudaStream_t stream = nullptr;
};
inline Exec on_stream(cudaStream_t stream) { return Exec{stream}; }
}  // namespace cuda
}  // namespace kvsift
