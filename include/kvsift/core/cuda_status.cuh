#pragma once
/// \file
/// \brief Bridge from the CUDA runtime's error codes to Status, and the check macros for CUDA calls.

#include <cuda_runtime_api.h>

#include "kvsift/core/status.hpp"

namespace kvsift {

/// An ok Status for `cudaSuccess`; otherwise `StatusCode::kCudaError` with the message
/// "<what> failed: <error name> (<error string>)" (`what` defaults to "CUDA call").
inline Status from_cuda(cudaError_t err, const char* what = nullptr) {
  if (err == cudaSuccess) return Status();
  return make_status(StatusCode::kCudaError, what ? what : "CUDA call", " failed: ", cudaGetErrorName(err),
                     " (", cudaGetErrorString(err), ")");
}

/// Evaluates a CUDA runtime call and returns `from_cuda(err, "<call>")` from the enclosing function
/// when it did not return `cudaSuccess`, naming the call.
#define KVSIFT_CUDA_TRY(call)                                                         \
  do {                                                                                \
    cudaError_t kvsift_cuda_err_ = (call);                                            \
    if (kvsift_cuda_err_ != cudaSuccess) return ::kvsift::from_cuda(kvsift_cuda_err_, #call); \
  } while (0)

/// After a kernel launch: returns the launch error (`cudaGetLastError`), if any, as a Status. A bad
/// configuration shows up as a launch error; checking it does not synchronise.
#define KVSIFT_CHECK_LAUNCH() KVSIFT_CUDA_TRY(cudaGetLastError())

}  // namespace kvsift
