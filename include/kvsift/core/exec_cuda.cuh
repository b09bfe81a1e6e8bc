#pragma once
/// \file
/// \brief The CUDA backend's execution object: the stream every launch of an op is queued on, and the facts
/// about the device that launch plans need (core/exec.hpp). Launchers never synchronize the stream,
/// never allocate, never read device memory from the host, and never query the driver: the facts are
/// read once, when the engine makes its Exec.

#include <cuda_runtime_api.h>

#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/data_error.hpp"
#include "kvsift/core/exec.hpp"

namespace kvsift {
namespace cuda {

/// Reads the facts of `device` from the driver. The one place kvsift asks the driver about a GPU.
inline Status query_device_facts(int device, DeviceFacts* facts) {
  KVSIFT_REQUIRE_NOT_NULL(facts, "facts");
  int sms = 0, smem = 0, major = 0, minor = 0;
  KVSIFT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  KVSIFT_CUDA_TRY(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  KVSIFT_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  KVSIFT_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  facts->num_sms = sms;
  facts->max_smem_optin = std::size_t(smem);
  facts->cc_major = major;
  facts->cc_minor = minor;
  facts->clusters = major >= 9;
  return Status();
}

/// The CUDA backend: pass it first to any op to run that op's kernels, asynchronously, on `stream`.
/// Pointers passed with it are device memory. Make it once with for_current_device.
struct Exec {
  cudaStream_t stream = nullptr;  ///< where the op's launches are queued (nullptr: the legacy default stream)
  DeviceFacts device;             ///< the facts plans are made from; zero until for_current_device fills them
  /// Optional, device memory: where kernels record the first item of engine data they had to ignore (a
  /// block-table entry outside the pool, an index entry outside the sequence; core/data_error.hpp). The
  /// engine zeroes it and reads it when it likes; nullptr records nothing (the bad item is still ignored).
  DataError* data_error = nullptr;
  /// Opt-in: the ops launch their kernels as programmatic dependents of the kernel before them on
  /// `stream` (PDL, compute capability 9.0 and later; core/dependent_launch.cuh, docs/integration.md).
  /// The kernel is then scheduled while that one drains, as soon as it allows it
  /// (`griddepcontrol.launch_dependents`; at its end otherwise), and waits in every block for its
  /// completion and its writes before touching memory: the launch gap between an engine's kernels and
  /// kvsift's leaves the decode step. Results are the same bits either way. Off by default, so a
  /// launch order nothing asked for is never assumed.
  bool dependent_launch = false;
  /// Whether launches carry the PDL attribute: dependent_launch, on a device that has PDL.
  bool launches_dependent() const { return dependent_launch && device.cc_major >= 9; }

  /// The current device's facts and `stream`. Without a usable device the facts stay zero, and every op
  /// whose plan needs them returns a Status saying so (an Exec is made once, outside the hot path).
  static Exec for_current_device(cudaStream_t stream = nullptr) {
    Exec e;
    e.stream = stream;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || !query_device_facts(device, &e.device).ok()) {
      (void)cudaGetLastError();  // leave no sticky error behind for the engine's next check
      e.device = DeviceFacts();
    }
    return e;
  }
  /// The same Exec on another stream of the same device.
  Exec on(cudaStream_t s) const {
    Exec e = *this;
    e.stream = s;
    return e;
  }
};

/// Copy `bytes` of device memory to the host after the stream's pending work, and wait. A
/// synchronisation point: for offline procedures (calibration, reports), never for the decode hot path.
inline Status read_to_host(const Exec& exec, void* host_dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return Status();
  KVSIFT_CUDA_TRY(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, exec.stream));
  KVSIFT_CUDA_TRY(cudaStreamSynchronize(exec.stream));
  return Status();
}

/// Set `bytes` of device memory to zero on the Exec's stream (asynchronous; a memset node in a graph).
inline Status zero_memory(const Exec& exec, void* dst, std::size_t bytes) {
  if (bytes == 0) return Status();
  KVSIFT_CUDA_TRY(cudaMemsetAsync(dst, 0, bytes, exec.stream));
  return Status();
}
}  // namespace cuda
}  // namespace kvsift
