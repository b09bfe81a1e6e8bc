#pragma once
// The CUDA backend's execution object: the stream every launch of an op is queued on.
// Launchers never synchronize it, never allocate, and never read device memory from the host.

#include <cuda_runtime_api.h>

#include "kvsift/core/backend.hpp"
#include "kvsift/core/cuda_status.cuh"

namespace kvsift {
namespace cuda {
struct Exec {
  cudaStream_t stream = nullptr;
};
inline Exec on_stream(cudaStream_t stream) { return Exec{stream}; }

// Copy `bytes` of device memory to the host after the stream's pending work, and wait. A
// synchronisation point: for offline procedures (calibration, reports), never for the decode hot path.
inline Status read_to_host(Exec exec, void* host_dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return Status();
  KVSIFT_CUDA_TRY(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, exec.stream));
  KVSIFT_CUDA_TRY(cudaStreamSynchronize(exec.stream));
  return Status();
}
}  // namespace cuda
}  // namespace kvsift
