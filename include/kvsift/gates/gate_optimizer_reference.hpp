#pragma once
/// \file
/// \brief Host reference of the gate optimizer step (contract in gate_optimizer.hpp): the same per-element
/// update as the CUDA kernel, on host memory. Needs no workspace and no device facts.

#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/gates/gate_optimizer.hpp"

namespace kvsift {
namespace host {

/// One AdamW update of params[n] with grads[n]; m (exp_avg) and v (exp_avg_sq) start at zero and are
/// the optimizer's state. lr is the scheduled rate (config.lr * warmup_decay_lr_factor(step, N)).
template <class T>
Status adamw_step(const Exec&, const AdamWConfig& config, double lr, std::int64_t step, T* params, const T* grads, T* m,
                  T* v, std::int64_t n, Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_adamw_step(config, lr, step, params, grads, m, v, n));
  const AdamWCoefficients k = detail::adamw_coefficients(config, lr, step);
  for (std::int64_t i = 0; i < n; ++i) detail::adamw_element(k, params, grads, m, v, i);
  return Status();
}

}  // namespace host
}  // namespace kvsift
