#pragma once
// The two backends. Every primitive exists twice with the same signature shape:
//
//   Status topk(host::Exec, ...)          reference, plain C++ on host memory (kvsift/ops/*.hpp)
//   Status topk(cuda::Exec, ...)          CUDA kernels on device memory, async on exec.stream (*.cuh)
//
// The execution object comes first and lives in the backend's namespace, so an unqualified call
// finds the right overload by argument-dependent lookup. Policy code is written once:
//
//   template <class Exec> Status step(Exec exec, ...) { KVSIFT_TRY(topk(exec, ...)); ... }
//
// and runs on the CPU (tests, the demo on a machine without a GPU) or the GPU unchanged. Pointers
// handed to an op must live in the backend's memory space: host memory for host::Exec, device memory
// for cuda::Exec.

#include <cstddef>
#include <cstring>

#include "kvsift/core/status.hpp"

namespace kvsift {
namespace host {
struct Exec {};

// Copy `bytes` of backend memory to the host and wait for it. A synchronisation point: for offline
// procedures (calibration, reports), never for the decode hot path.
inline Status read_to_host(Exec, void* host_dst, const void* src, std::size_t bytes) {
  if (bytes) std::memcpy(host_dst, src, bytes);
  return Status();
}
}  // namespace host

template <class Exec>
struct is_host_exec {
  static constexpr bool value = false;
};
template <>
struct is_host_exec<host::Exec> {
  static constexpr bool value = true;
};
}  // namespace kvsift
