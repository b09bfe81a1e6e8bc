#pragma once
/// \file
/// \brief The scratch layout of cluster_flags and its workspace query (contract in cluster_flags.hpp).
///
/// The CUDA path runs in two launches over a grid of (CTAs, rows): the first writes every block's
/// centre (and, for RadiusRule::kBudgetBlocks, whose radius depends on it, counts each row's centres),
/// the second flags tokens from them. Between the two the centres live in the workspace: int32 [rows,
/// cols] (a row has at most cols blocks) and the count per row. The host reference needs none.

#include <cstddef>
#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/ops/cluster_flags.hpp"

namespace kvsift {
namespace detail {

struct ClusterFlagsScratch {
  std::int32_t* centres = nullptr;  // [rows, cols]: centre position of block k of row r, or -1
  std::int32_t* counts = nullptr;   // [rows]: centres of row r (RadiusRule::kBudgetBlocks only)
};

inline ClusterFlagsScratch carve_cluster_flags(WorkspaceCarver& ws, std::int64_t rows, std::int64_t cols) {
  ClusterFlagsScratch s;
  s.centres = ws.take<std::int32_t>(std::size_t(rows * cols));
  s.counts = ws.take<std::int32_t>(std::size_t(rows));
  return s;
}

}  // namespace detail

/// Scratch memory cluster_flags needs, from the shape of `scores` alone (no device memory touched):
/// int32 centres [rows, cols] and counts [rows] for cuda::Exec, 0 for the host reference. kNullPointer
/// for a null `bytes`.
template <class Exec>
Status cluster_flags_workspace_bytes(const Exec&, const StridedView2D<const float>& scores,
                                     const std::int32_t* /*row_lengths*/, const ClusterParams& /*params*/,
                                     const StridedView2D<std::uint8_t>& /*flags*/, std::size_t* bytes) {
  KVSIFT_REQUIRE_NOT_NULL(bytes, "bytes");
  *bytes = 0;
  if constexpr (!is_host_exec<Exec>::value) {
    WorkspaceCarver ws(nullptr, 0);
    detail::carve_cluster_flags(ws, scores.rows, scores.cols);
    *bytes = ws.required_bytes();
  }
  return Status();
}

}  // namespace kvsift
