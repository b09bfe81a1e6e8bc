#pragma once
// Workspace sizing and carving from one description.
//
// A launcher describes its scratch buffers once, as a sequence of typed requests. Run against a null
// base, the description only sizes (no device memory needed: the size query of CUB's two-call
// pattern); run against the caller's buffer, the same description carves it. Every sub-buffer starts
// on a 256-byte boundary, which keeps vector loads aligned and matches cudaMalloc's guarantee.
//
//   WorkspaceCarver ws(base, bytes);            // base == nullptr: sizing pass
//   float* partial = ws.take<float>(n_splits * d);
//   int*   counts  = ws.take<int>(rows);
//   KVSIFT_TRY(ws.status());                    // too small, or misaligned base
//   size_t needed = ws.required_bytes();

#include <cstddef>
#include <cstdint>

#include "kvsift/core/status.hpp"

namespace kvsift {

/// Caller-owned scratch handed to an op: `bytes` of memory at `data`, in the backend's memory space,
/// 256-byte aligned. Size it with the op's <op>_workspace_bytes query; an op that needs none accepts
/// the empty default.
struct Workspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

inline constexpr std::size_t kWorkspaceAlignment = 256;

constexpr std::size_t align_up(std::size_t n, std::size_t a = kWorkspaceAlignment) { return (n + a - 1) / a * a; }

class WorkspaceCarver {
 public:
  /// base == nullptr selects the sizing pass; capacity is then ignored.
  WorkspaceCarver(void* base, std::size_t capacity_bytes) : base_(static_cast<char*>(base)), capacity_(capacity_bytes) {}
  explicit WorkspaceCarver(Workspace ws) : WorkspaceCarver(ws.data, ws.bytes) {}

  bool sizing() const { return base_ == nullptr; }

  /// Reserve `count` elements of T. Returns nullptr in the sizing pass or when the buffer is too small
  /// (status() then reports it); carving continues so required_bytes() stays exact.
  template <class T>
  T* take(std::size_t count) {
    const std::size_t offset = used_;
    used_ = align_up(offset + count * sizeof(T));
    if (sizing() || used_ > capacity_) return nullptr;
    return reinterpret_cast<T*>(base_ + offset);
  }

  std::size_t required_bytes() const { return used_; }

  Status status() const {
    if (sizing()) return Status();
    if (reinterpret_cast<std::uintptr_t>(base_) % kWorkspaceAlignment != 0)
      return make_status(StatusCode::kMisaligned, "workspace = ", static_cast<const void*>(base_),
                         " must be aligned to ", kWorkspaceAlignment, " bytes");
    if (used_ > capacity_)
      return make_status(StatusCode::kInsufficientSpace, "workspace_bytes = ", capacity_, " is smaller than the ",
                         used_, " bytes required (ask the workspace-size query)");
    return Status();
  }

 private:
  char* base_;
  std::size_t capacity_;
  std::size_t used_ = 0;
};

}  // namespace kvsift
