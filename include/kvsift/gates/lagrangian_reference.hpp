#pragma once
/// \file
/// \brief Host form of the Lagrangian update op (contract and update rule in lagrangian.hpp), for loops written
/// once over host::Exec / cuda::Exec: reads the density from host memory and writes grad_scale (and, if
/// non-null, the step report) there. Needs no workspace and no device facts.

#include "kvsift/core/check.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/gates/lagrangian.hpp"

namespace kvsift {
namespace host {

/// One update from *density (host memory): advances *state and writes the step's grad_scale (and,
/// when non-null, the report *step). kInvalidArgument for a bad config, kNullPointer for a null state
/// or density; grad_scale may be null.
template <class T>
Status lagrangian_update(const Exec&, const LagrangianConfig& config, LagrangianState* state, const T* density,
                         T* grad_scale, LagrangianStep* step = nullptr, Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_lagrangian_update(config, state, density));
  const LagrangianStep r = kvsift::lagrangian_update(config, state, double(*density));
  if (grad_scale) *grad_scale = T(r.grad_scale);
  if (step) *step = r;
  return Status();
}

}  // namespace host
}  // namespace kvsift
