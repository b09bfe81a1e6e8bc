#pragma once
/// \file
/// \brief The workspace query of store_kv (contract in store_kv.hpp). The CUDA kernel runs one warp per
/// (row, KV head) over a grid sized from n and num_kv_heads alone: no plan beyond the shape, no scratch.

#include <cstddef>

#include "kvsift/core/check.hpp"
#include "kvsift/ops/store_kv.hpp"

namespace kvsift {

/// store_kv needs no scratch on either backend: `*bytes` = 0 (kNullPointer for a null `bytes`); callers
/// still ask, so a later path can use some without an API change.
template <class Exec, class View, class T>
Status store_kv_workspace_bytes(const Exec&, const View& /*kv*/, const StoreKvParams<T>& /*params*/, std::size_t* bytes) {
  KVSIFT_REQUIRE_NOT_NULL(bytes, "bytes");
  *bytes = 0;
  return Status();
}

}  // namespace kvsift
