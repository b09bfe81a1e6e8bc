#pragma once
// Bridge from the CUDA runtime's error codes to Status, and the check macros for CUDA calls.

#include <cuda_runtime_api.h>

#include "kvsift/core/status.hpp"

namespace kvsift {

inline Status from_cuda(cudaError_t err, const char* what = nullptr) {
  if (err == cudaSuccess) return Status();
  return make_status(StatusCode::kCudaError, what ? what : "CUDA call", " failed: ", cudaGetErrorName(err),
                     " (", cudaGetErrorString(err), ")");
}

// Return a Status from a CUDA call that failed, naming the call.
#define KVSIFT_CUDA_TRY(call)                                                         \
  do {                                                                                \
    cudaError_t kvsift_cuda_err_ = (call);                                            \
    if (kvsift_cuda_err_ != cudaSuccess) return ::kvsift::from_cuda(kvsift_cuda_err_, #call); \
  } while (0)

// After a kernel launch: a bad configuration shows up as a launch error, which does not sync.
#define KVSIFT_CHECK_LAUNCH() KVSIFT_CUDA_TRY(cudaGetLastError())

}  // namespace kvsift
