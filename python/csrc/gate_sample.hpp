#pragma once
// HardKuma's reparameterised draw for a uniform the caller provides, forward and backward, one gate per
// call: what the torch op hardkuma_sample runs (host loop, CUDA kernel). kvsift's batched
// hardkuma_sample draws u itself from Philox(seed, offset, gate); the Python op takes u as a tensor
// instead, so that the draw is the caller's (torch's generator, a fixed test vector) and the op is a
// pure function of its inputs, as autograd and torch.compile expect. The body is the library's
// per-gate one (gates/detail/hardkuma_gate.hpp) with `u` read from memory rather than drawn: the same
// shape clamp (resolve_shape), the same draw (hardkuma_reparameterize) and the same closed-form
// gradient (kumaraswamy_sample_grad, hardkuma_dh_dk), so there is no second copy of the math.
//
// Torch-free: included by the CPU op (gates_cpu.cpp) and the CUDA launcher (launch_gates.cu).

#include <cstdint>

#include <kvsift/core/check.hpp>
#include <kvsift/gates/detail/hardkuma_gate.hpp>
#include <kvsift/gates/hardkuma.hpp>

namespace kvsift_torch {
namespace gates {

/// h[i] = clip(l + (r - l) F_K^-1(u[i]; a[i], b[i]), 0, 1), a and b through the documented clamp.
template <class T>
KVSIFT_HD inline void sample_gate(const kvsift::HardKumaOptions& o, const T* a, const T* b, const T* u, T* h,
                                  std::int64_t i) {
  const auto d = kvsift::hardkuma_reparameterize(u[i], kvsift::detail::resolve_shape(o, a[i]).value,
                                                 kvsift::detail::resolve_shape(o, b[i]).value, o.support<T>());
  h[i] = d.h;
}

/// dL/da[i], dL/db[i] from dL/dh[i] at the draw of u[i]: zero where h is clipped or a raw shape
/// parameter is outside the clamp (kvsift's hardkuma_sample_backward, with u from memory).
template <class T>
KVSIFT_HD inline void sample_backward_gate(const kvsift::HardKumaOptions& o, const T* a_raw, const T* b_raw,
                                           const T* u, const T* grad_h, T* grad_a, T* grad_b, std::int64_t i) {
  const auto a = kvsift::detail::resolve_shape(o, a_raw[i]);
  const auto b = kvsift::detail::resolve_shape(o, b_raw[i]);
  const kvsift::HardKumaSupport<T> s = o.support<T>();
  const auto d = kvsift::hardkuma_reparameterize(u[i], a.value, b.value, s);
  const T dh_dk = kvsift::hardkuma_dh_dk(d.t, s);
  T ga = T(0), gb = T(0);
  if (dh_dk != T(0)) {
    const kvsift::ShapeGradient<T> dk = kvsift::kumaraswamy_sample_grad(u[i], a.value, b.value);
    if (a.passes_gradient) ga = grad_h[i] * dh_dk * dk.da;
    if (b.passes_gradient) gb = grad_h[i] * dh_dk * dk.db;
  }
  grad_a[i] = ga;
  grad_b[i] = gb;
}

/// Host-only data check of u (the CUDA path cannot read device data; there a u outside (0, 1) gives
/// h = 0 or 1 with a NaN gradient): every u[i] strictly inside (0, 1), where F_K^-1 and its
/// gradient are finite.
template <class T>
kvsift::Status validate_uniforms(const T* u, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    KVSIFT_REQUIRE(u[i] > T(0) && u[i] < T(1), kInvalidArgument, "u[", i, "] = ", u[i],
                   " must be in (0, 1) (hardkuma_noise draws U(1e-3, 1 - 1e-3) as the reference does)");
  return kvsift::Status();
}

}  // namespace gates
}  // namespace kvsift_torch
