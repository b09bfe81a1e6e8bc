#pragma once
// The body of every gate op's workspace query.
//
// Every kvsift op, on either backend, comes with a query of one shape (docs/architecture.md):
//
//   Status <op>_workspace_bytes(const Exec&, <the op's parameters>, std::size_t* bytes)
//   Status <op>(const Exec&, <the op's parameters>, Workspace workspace = {})
//
// The gate ops are elementwise loops or one-block reductions that keep their state in registers and
// shared memory, so they need no scratch and each of their queries is this one call. The queries exist
// anyway, with each op's own parameters, because a caller sizes every op the same way (the Python
// binding and the engines ask, allocate what is reported and pass it, without a list of which ops need
// none), and because a later kernel that does need scratch (a multi-block reduction for a long gate
// vector, say) then changes the body of its query, not the API. A query reads shapes only, never
// memory, and does not validate: the op does.

#include <cstddef>

#include "kvsift/core/check.hpp"
#include "kvsift/core/status.hpp"

namespace kvsift {
namespace detail {

inline Status no_workspace_bytes(std::size_t* bytes) {
  KVSIFT_REQUIRE_NOT_NULL(bytes, "bytes");
  *bytes = 0;
  return Status();
}

}  // namespace detail
}  // namespace kvsift
