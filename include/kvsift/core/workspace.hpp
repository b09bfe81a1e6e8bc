#pragma once
/// \file
/// \brief Workspace sizing and carving from one description.
///
/// A launcher describes its scratch buffers once, as a sequence of typed requests. Run against a null
/// base, the description only sizes (no device memory needed: the size query of CUB's two-call
/// pattern); run against the caller's buffer, the same description carves it. Every sub-buffer starts
/// on a 256-byte boundary, which keeps vector loads aligned and matches cudaMalloc's guarantee.
///
///   WorkspaceCarver ws(base, bytes);            // base == nullptr: sizing pass
///   float* partial = ws.take<float>(n_splits * d);
///   int*   counts  = ws.take<int>(rows);
///   KVSIFT_TRY(ws.status());                    // too small, or misaligned base
///   size_t needed = ws.required_bytes();

#include <cstddef>
#include <cstdint>

#include "kvsift/core/status.hpp"

namespace kvsift {

/// Caller-owned scratch handed to an op: `bytes` of memory at `data`, in the backend's memory space,
/// 256-byte aligned. Size it with the op's <op>_workspace_bytes query; an op that needs none accepts
/// the empty default.
struct Workspace {
  void* data = nullptr;   ///< base of the scratch; nullptr for none
  std::size_t bytes = 0;  ///< its size in bytes
};

/// The alignment, in bytes, of a workspace's base and of every sub-buffer carved from it.
inline constexpr std::size_t kWorkspaceAlignment = 256;

/// `n` rounded up to a multiple of `a` (default kWorkspaceAlignment).
constexpr std::size_t align_up(std::size_t n, std::size_t a = kWorkspaceAlignment) { return (n + a - 1) / a * a; }

/// Sizes and carves an op's scratch from one description (see the file comment): the sizing pass
/// (null base) and the carving pass run the same code, so they cannot drift apart.
class WorkspaceCarver {
 public:
  /// base == nullptr selects the sizing pass; capacity is then ignored.
  WorkspaceCarver(void* base, std::size_t capacity_bytes) : base_(static_cast<char*>(base)), capacity_(capacity_bytes) {}
  /// Carves `ws` (its data null: the sizing pass).
  explicit WorkspaceCarver(Workspace ws) : WorkspaceCarver(ws.data, ws.bytes) {}

  /// True in the sizing pass (no base): take() returns nullptr and only counts bytes.
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

  /// The bytes every take() so far needs, each request rounded up to kWorkspaceAlignment.
  std::size_t required_bytes() const { return used_; }

  /// Ok in the sizing pass; otherwise kMisaligned when the base is not 256-byte aligned, or
  /// kInsufficientSpace when the requests need more than the capacity.
  Status status() const {
    if (sizing()) return Status();
    if (reinterpret_cast<std::uintptr_t>(base_) % kWorkspaceAlignment != 0)
      return make_status(StatusCode::kMisaligned, "workspace = ", static_cast<const void*>(base_),
                         " must be aligned to ", kWorkspaceAlignment, " bytes");
    if (used_ > capacity_)
      return make_status(StatusCode::kInsufficientSpace, "workspace.bytes = ", capacity_, " is smaller than the ",
                         used_, " bytes required (ask the workspace-size query)");
    return Status();
  }

 private:
  char* base_;
  std::size_t capacity_;
  std::size_t used_ = 0;
};

}  // namespace kvsift
