#pragma once
/// \file
/// \brief The execution object: which backend an op runs on, and the facts about the machine its launch plan
/// needs. Every op exists twice with the same signature shape:
///
///   Status topk(const host::Exec&, ...)   reference, plain C++ on host memory (kvsift/ops/*_reference.hpp)
///   Status topk(const cuda::Exec&, ...)   CUDA kernels on device memory, async on exec.stream (*.cuh)
///
/// The Exec comes first and lives in its backend's namespace, so an unqualified call finds the right
/// overload by argument-dependent lookup. Policy code is written once:
///
///   template <class Exec> Status step(const Exec& exec, ...) { KVSIFT_TRY(topk(exec, ...)); ... }
///
/// and runs on the CPU (tests, the demo on a machine without a GPU) or the GPU unchanged. Pointers
/// handed to an op live in the backend's memory space: host memory for host::Exec, device memory for
/// cuda::Exec.
///
/// The device facts are filled once, when the engine makes its Exec (Exec::for_current_device), and
/// travel with every call: a plan that sizes a grid from the SM count reads exec.device.num_sms, so no
/// op hard-codes a GPU or queries the driver per call (which would cost a host round trip in a decode
/// step and break on a machine whose GPU differs from the one a constant assumed).

#include <cstddef>
#include <cstring>

#include "kvsift/core/check.hpp"
#include "kvsift/core/status.hpp"

namespace kvsift {

/// What a launch plan may depend on. Zero means "unknown": an op whose plan needs a fact rejects an
/// Exec that lacks it rather than guessing.
struct DeviceFacts {
  int num_sms = 0;                  ///< streaming multiprocessors (132 on an H200, 114 on an H100 PCIe)
  std::size_t max_smem_optin = 0;   ///< bytes of shared memory a block may opt in to
  bool clusters = false;            ///< thread-block clusters with distributed shared memory (sm_90+)
  /// Compute capability, major and minor number (9 and 0 on an H100 or H200).
  int cc_major = 0, cc_minor = 0;   ///< compute capability

  /// kInvalidArgument naming `who` (the op) when num_sms is 0, the one fact every device plan needs;
  /// ops that need more facts check those themselves.
  Status validate(const char* who) const {
    KVSIFT_REQUIRE(num_sms > 0, kInvalidArgument, who, ": exec.device.num_sms = ", num_sms,
                   " (make the Exec with Exec::for_current_device(stream), or fill its DeviceFacts)");
    return Status();
  }
};

namespace host {

/// The host reference backend. Its facts describe one sequential "SM" so that code which sizes work
/// from them stays meaningful; the reference ops need no workspace.
struct Exec {
  DeviceFacts device{1, std::size_t(1) << 30, false, 0, 0};  ///< one "SM", 1 GiB "shared memory", no clusters

  /// A host Exec; the same name as cuda::Exec::for_current_device, so engine code reads alike.
  static Exec for_current_device() { return Exec{}; }
};

/// Copy `bytes` of backend memory to the host and wait for it. A synchronisation point: for offline
/// procedures (calibration, reports), never for the decode hot path.
inline Status read_to_host(const Exec&, void* host_dst, const void* src, std::size_t bytes) {
  if (bytes) std::memcpy(host_dst, src, bytes);
  return Status();
}

/// Set `bytes` of backend memory to zero (in order with the Exec's other work; no synchronisation).
inline Status zero_memory(const Exec&, void* dst, std::size_t bytes) {
  if (bytes) std::memset(dst, 0, bytes);
  return Status();
}
}  // namespace host

/// `is_host_exec<Exec>::value`: whether a backend-generic template was instantiated for the host
/// reference (host::Exec) or a device backend, for code that differs only in where memory lives.
template <class Exec>
struct is_host_exec {
  static constexpr bool value = false;  ///< not the host backend
};
/// host::Exec is the host backend.
template <>
struct is_host_exec<host::Exec> {
  static constexpr bool value = true;  ///< the host backend
};
}  // namespace kvsift
