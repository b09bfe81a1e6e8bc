#pragma once
// One gate's work in each batched HardKuma op (contract in gates/hardkuma.hpp): the documented clamps
// applied to a gate's raw parameters, and the per-gate bodies that the host loops
// (hardkuma_reference.hpp) and the CUDA kernels (hardkuma.cuh) both run, so the two backends compute
// the same expression for every gate.

#include <cstdint>

#include "kvsift/core/config.hpp"
#include "kvsift/core/philox.hpp"
#include "kvsift/gates/detail/scalar_math.hpp"
#include "kvsift/gates/hardkuma.hpp"
#include "kvsift/gates/hardkuma_math.hpp"
#include "kvsift/gates/kumaraswamy.hpp"

namespace kvsift {
namespace detail {

// A gate's shape parameter after the documented clamp, and whether the gradient flows to the raw value.
template <class T>
struct ResolvedShape {
  T value;
  bool passes_gradient;
};

template <class T>
KVSIFT_HD inline ResolvedShape<T> resolve_shape(const HardKumaOptions& o, T raw) {
  if (gm::is_nan(raw)) return ResolvedShape<T>{raw, false};
  if (o.clamp_shape) {
    const T lo = T(kHardKumaShapeMin), hi = T(kHardKumaShapeMax);
    return ResolvedShape<T>{gm::clamp(raw, lo, hi), raw >= lo && raw <= hi};
  }
  if (!(raw > T(0)) || !gm::is_finite(raw)) return ResolvedShape<T>{T(NAN), false};
  return ResolvedShape<T>{raw, true};
}

template <class T>
struct ResolvedProbZero {
  T value;
  bool passes_gradient;
};

template <class T>
KVSIFT_HD inline ResolvedProbZero<T> resolve_prob_zero(const HardKumaOptions& o, T p0) {
  if (!o.clamp_prob_zero) return ResolvedProbZero<T>{p0, true};
  const T lo = T(kHardKumaProbZeroMin), hi = T(kHardKumaProbZeroMax);
  return ResolvedProbZero<T>{gm::clamp(p0, lo, hi), p0 >= lo && p0 <= hi};
}

// d P(h=0) / d (raw a, raw b), honouring both clamps.
template <class T>
KVSIFT_HD inline ShapeGradient<T> prob_zero_grad_raw(const HardKumaOptions& o, ResolvedShape<T> a, ResolvedShape<T> b,
                                                    bool p0_passes) {
  const ShapeGradient<T> g = hardkuma_prob_zero_grad(a.value, b.value, o.support<T>());
  return ShapeGradient<T>{(a.passes_gradient && p0_passes) ? g.da : T(0), (b.passes_gradient && p0_passes) ? g.db : T(0)};
}

template <class T>
KVSIFT_HD inline void write_gradient(T* out, T value, GradientWrite mode) {
  *out = mode == GradientWrite::kAccumulate ? *out + value : value;
}

// ---- Per-gate bodies shared by the host loops and the CUDA kernels ----

template <class T>
KVSIFT_HD inline void hardkuma_stats_gate(const HardKumaOptions& o, const T* a_raw, const T* b_raw,
                                          const GateStatsOutputs<T>& out, std::int64_t i) {
  const ResolvedShape<T> a = resolve_shape(o, a_raw[i]);
  const ResolvedShape<T> b = resolve_shape(o, b_raw[i]);
  const HardKumaSupport<T> s = o.support<T>();
  const ResolvedProbZero<T> p0 = resolve_prob_zero(o, hardkuma_prob_zero(a.value, b.value, s));
  if (out.prob_zero) out.prob_zero[i] = p0.value;
  // Unclamped, P(h!=0) is computed directly (no 1 - P0 cancellation); clamped, it is 1 - clamp(P0).
  if (out.expected_l0)
    out.expected_l0[i] = (o.clamp_prob_zero && !p0.passes_gradient) ? T(1) - p0.value
                                                                    : hardkuma_prob_nonzero(a.value, b.value, s);
  if (out.prob_one) out.prob_one[i] = hardkuma_prob_one(a.value, b.value, s);
  if (out.prob_interior) out.prob_interior[i] = hardkuma_prob_interior(a.value, b.value, s);
  if (out.kuma_mean) out.kuma_mean[i] = kumaraswamy_mean(a.value, b.value);
  if (out.mean) out.mean[i] = hardkuma_mean(a.value, b.value, s);
  if (out.d_prob_zero_da || out.d_prob_zero_db) {
    const ShapeGradient<T> g = prob_zero_grad_raw(o, a, b, p0.passes_gradient);
    if (out.d_prob_zero_da) out.d_prob_zero_da[i] = g.da;
    if (out.d_prob_zero_db) out.d_prob_zero_db[i] = g.db;
  }
}

// u for gate i: eps + (1 - 2 eps) v, written as one fma so both backends round it identically.
template <class T>
KVSIFT_HD inline T gate_uniform(const HardKumaOptions& o, const PhiloxStream& stream, std::int64_t i) {
  const T v = philox_uniform<T>(stream, std::uint64_t(i));
  return gm::fma(T(1.0 - 2.0 * o.sample_eps), v, T(o.sample_eps));
}

template <class T>
KVSIFT_HD inline void hardkuma_sample_gate(const HardKumaOptions& o, const T* a_raw, const T* b_raw,
                                           const PhiloxStream& stream, T* h, T* k, T* u, std::int64_t i) {
  const T ui = gate_uniform<T>(o, stream, i);
  const HardKumaDraw<T> d =
      hardkuma_reparameterize(ui, resolve_shape(o, a_raw[i]).value, resolve_shape(o, b_raw[i]).value, o.support<T>());
  h[i] = d.h;
  if (k) k[i] = d.k;
  if (u) u[i] = d.u;
}

template <class T>
KVSIFT_HD inline void hardkuma_sample_backward_gate(const HardKumaOptions& o, const T* a_raw, const T* b_raw,
                                                    const PhiloxStream& stream, const T* grad_h, T* grad_a, T* grad_b,
                                                    GradientWrite mode, std::int64_t i) {
  const ResolvedShape<T> a = resolve_shape(o, a_raw[i]);
  const ResolvedShape<T> b = resolve_shape(o, b_raw[i]);
  const HardKumaSupport<T> s = o.support<T>();
  const T u = gate_uniform<T>(o, stream, i);
  const HardKumaDraw<T> d = hardkuma_reparameterize(u, a.value, b.value, s);
  const T dh_dk = hardkuma_dh_dk(d.t, s);
  T ga = T(0), gb = T(0);
  if (dh_dk != T(0)) {
    const ShapeGradient<T> dk = kumaraswamy_sample_grad(u, a.value, b.value);
    if (a.passes_gradient) ga = grad_h[i] * dh_dk * dk.da;
    if (b.passes_gradient) gb = grad_h[i] * dh_dk * dk.db;
  }
  if (grad_a) write_gradient(grad_a + i, ga, mode);
  if (grad_b) write_gradient(grad_b + i, gb, mode);
}

// One gate's contribution P(h!=0) to the expected L0, and (scaled) d/d(raw a, raw b) of it.
template <class T>
KVSIFT_HD inline T hardkuma_l0_term(const HardKumaOptions& o, T a_raw, T b_raw, ShapeGradient<T>* grad) {
  const ResolvedShape<T> a = resolve_shape(o, a_raw);
  const ResolvedShape<T> b = resolve_shape(o, b_raw);
  const HardKumaSupport<T> s = o.support<T>();
  const ResolvedProbZero<T> p0 = resolve_prob_zero(o, hardkuma_prob_zero(a.value, b.value, s));
  if (grad) {
    const ShapeGradient<T> g = prob_zero_grad_raw(o, a, b, p0.passes_gradient);
    *grad = ShapeGradient<T>{-g.da, -g.db};
  }
  return p0.passes_gradient ? hardkuma_prob_nonzero(a.value, b.value, s) : T(1) - p0.value;
}

// Gate i's contribution to hardkuma_expected_l0: its P(h!=0) is returned for the caller's sum, its
// gradient (times `scale` = grad_scale / n) written to out.grad_a / out.grad_b.
template <class T>
KVSIFT_HD inline double hardkuma_expected_l0_gate(const HardKumaOptions& o, const T* a, const T* b,
                                                  const ExpectedL0Outputs<T>& out, T scale, std::int64_t i) {
  const bool want_grad = out.grad_a || out.grad_b;
  ShapeGradient<T> g{};
  const double term = double(hardkuma_l0_term(o, a[i], b[i], want_grad ? &g : nullptr));
  if (out.grad_a) write_gradient(out.grad_a + i, scale * g.da, out.write);
  if (out.grad_b) write_gradient(out.grad_b + i, scale * g.db, out.write);
  return term;
}

// The factor of every gate's gradient in hardkuma_expected_l0: grad_scale / n (grad_scale is read
// from the backend's memory, so on the GPU this runs in the kernel).
template <class T>
KVSIFT_HD inline T expected_l0_grad_factor(const ExpectedL0Outputs<T>& out, std::int64_t n) {
  return (out.grad_scale ? *out.grad_scale : T(1)) / T(n > 0 ? n : 1);
}

}  // namespace detail
}  // namespace kvsift
