#pragma once
/// \file
/// \brief The workspace query of pool_scores (contract in score_pooling.hpp). The CUDA kernel runs one thread
/// per output element over a grid of (columns / 256, rows): no plan beyond the shape, no scratch.

#include <cstddef>
#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/ops/score_pooling.hpp"

namespace kvsift {

/// pool_scores needs no scratch on either backend: `*bytes` = 0 (kNullPointer for a null `bytes`);
/// callers still ask, so a later path can use some without an API change.
template <class Exec>
Status pool_scores_workspace_bytes(const Exec&, const StridedView2D<const float>& /*in*/,
                                   const std::int32_t* /*row_lengths*/, const PoolParams& /*params*/,
                                   const StridedView2D<float>& /*out*/, std::size_t* bytes) {
  KVSIFT_REQUIRE_NOT_NULL(bytes, "bytes");
  *bytes = 0;
  return Status();
}

}  // namespace kvsift
