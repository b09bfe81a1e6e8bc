#pragma once
/// \file
/// \brief The workspace query of compact_kv (contract in compact_kv.hpp). The CUDA kernel runs one warp per
/// destination slot over a grid of (kept.capacity + window slots / 8, destination rows), from shapes
/// alone: no plan beyond the shape, no scratch.

#include <cstddef>

#include "kvsift/core/check.hpp"
#include "kvsift/kv/index_set.hpp"
#include "kvsift/ops/compact_kv.hpp"

namespace kvsift {

/// compact_kv needs no scratch on either backend: `*bytes` = 0 (kNullPointer for a null `bytes`);
/// callers still ask, so a later path can use some without an API change.
template <class Exec, class Src, class Dst>
Status compact_kv_workspace_bytes(const Exec&, const Src& /*src*/, const ConstIndexSet& /*kept*/, int /*window*/,
                                  const Dst& /*dst*/, const CompactOutputs& /*out*/, std::size_t* bytes) {
  KVSIFT_REQUIRE_NOT_NULL(bytes, "bytes");
  *bytes = 0;
  return Status();
}

}  // namespace kvsift
