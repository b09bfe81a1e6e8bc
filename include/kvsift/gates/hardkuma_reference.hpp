#pragma once
/// \file
/// \brief Host reference of the batched HardKuma gate ops (contract and numerics in hardkuma.hpp): plain
/// loops over the per-gate code the CUDA kernels run, on host memory. Needs no workspace (the queries
/// in hardkuma.hpp report 0) and no device facts.

#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/philox.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/gates/detail/hardkuma_gate.hpp"
#include "kvsift/gates/hardkuma.hpp"

namespace kvsift {
namespace host {

/// Fills each non-null output of `out` for gates [0, n) (see GateStatsOutputs); host memory. Errors:
/// bad options, n < 0, null a or b, and bad gate values (see the contract in hardkuma.hpp).
template <class T>
Status hardkuma_stats(const Exec&, const HardKumaOptions& options, const T* a, const T* b, std::int64_t n,
                      GateStatsOutputs<T> out, Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_gate_arrays(options, a, b, n));
  KVSIFT_TRY(detail::validate_gate_values(options, a, b, n));
  for (std::int64_t i = 0; i < n; ++i) detail::hardkuma_stats_gate(options, a, b, out, i);
  return Status();
}

/// h[n] (required), and optionally the Kuma sample k[n] and the uniform u[n] that produced it.
template <class T>
Status hardkuma_sample(const Exec&, const HardKumaOptions& options, const T* a, const T* b, std::int64_t n,
                       PhiloxStream stream, T* h, detail::non_deduced<T>* k = nullptr,
                       detail::non_deduced<T>* u = nullptr, Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_hardkuma_sample(options, a, b, n, h));
  KVSIFT_TRY(detail::validate_gate_values(options, a, b, n));
  for (std::int64_t i = 0; i < n; ++i) detail::hardkuma_sample_gate(options, a, b, stream, h, k, u, i);
  return Status();
}

/// Given dL/dh at the draw of (stream), writes or adds dL/da and dL/db (either may be null).
template <class T>
Status hardkuma_sample_backward(const Exec&, const HardKumaOptions& options, const T* a, const T* b, std::int64_t n,
                                PhiloxStream stream, const T* grad_h, detail::non_deduced<T>* grad_a,
                                detail::non_deduced<T>* grad_b, GradientWrite write = GradientWrite::kOverwrite,
                                Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_hardkuma_sample_backward(options, a, b, n, grad_h));
  KVSIFT_TRY(detail::validate_gate_values(options, a, b, n));
  for (std::int64_t i = 0; i < n; ++i)
    detail::hardkuma_sample_backward_gate(options, a, b, stream, grad_h, grad_a, grad_b, write, i);
  return Status();
}

/// Sums in double, in gate order.
template <class T>
Status hardkuma_expected_l0(const Exec&, const HardKumaOptions& options, const T* a, const T* b, std::int64_t n,
                            ExpectedL0Outputs<T> out, Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_hardkuma_expected_l0(options, a, b, n, out));
  KVSIFT_TRY(detail::validate_gate_values(options, a, b, n));
  const T scale = detail::expected_l0_grad_factor(out, n);
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) sum += detail::hardkuma_expected_l0_gate(options, a, b, out, scale, i);
  if (out.sum) *out.sum = T(sum);
  if (out.density) *out.density = T(sum / double(n));
  return Status();
}

}  // namespace host
}  // namespace kvsift
