#pragma once
// HardKuma gates, batched: one gate per (layer, KV head), parameters a[n], b[n] (flattened
// layer-major, gate i = layer * kv_heads + head). Host reference ops here (kvsift::host), CUDA ops in
// hardkuma.cuh (kvsift::cuda); both run the same per-gate code in kvsift::detail, so they differ only
// by the ulps of the platform's libm.
//
//   hardkuma_stats            P(h=0), P(h=1), P(0<h<1), P(h!=0), E[K], E[h], dP(h=0)/da, dP(h=0)/db
//   hardkuma_sample           h = clip(l + (r-l) F_K^-1(u)), u from Philox(seed, offset, gate index)
//   hardkuma_sample_backward  dL/da, dL/db from dL/dh at the same draw (zero where h is clipped)
//   hardkuma_expected_l0      sum and density (mean) of P(h!=0) and the density's gradient
//
// Reference numerics (specs/hardkuma.md §6), on by default and each switchable off:
//   - clamp_shape: a and b are clamped to [1e-6, 100] before use, as LycheeDecode clamps its raw
//     parameters every step; the gradient w.r.t. a raw value outside that range is 0 (torch.clamp).
//   - clamp_prob_zero: P(h=0) is clamped to [1e-6, 1 - 1e-6] wherever it is reported or enters the
//     expected L0, with zero gradient when clamped. (The reference also adds 1e-6 inside the log
//     before clamping; that 1e-6 bias is deliberately not reproduced.)
//   - sample_eps: u = eps + (1 - 2 eps) v with v uniform in (0, 1), i.e. u ~ U(1e-3, 1 - 1e-3) as
//     Kuma.sample draws it.
//
// Bad input: options are validated on every call (l < 0, r > 1, finite; 0 <= sample_eps < 0.5).
// Host ops also check the data: NaN a or b is an error; with clamp_shape off, so is any a or b that
// is <= 0 or infinite (with clamp_shape on, those are clamped, the documented behaviour). CUDA ops
// cannot read device data on the host; there such a gate yields NaN outputs instead.

#include <cstdint>
#include <type_traits>

#include "kvsift/core/exec.hpp"
#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"
#include "kvsift/core/philox.hpp"
#include "kvsift/gates/hardkuma_math.hpp"

namespace kvsift {

inline constexpr double kHardKumaShapeMin = 1e-6;
inline constexpr double kHardKumaShapeMax = 100.0;
inline constexpr double kHardKumaProbZeroMin = 1e-6;
inline constexpr double kHardKumaProbZeroMax = 1.0 - 1e-6;

struct HardKumaOptions {
  double l = -0.1;              // stretched support (l, r), l < 0 < 1 < r
  double r = 1.1;
  bool clamp_shape = true;      // a, b -> [1e-6, 100]
  bool clamp_prob_zero = true;  // P(h=0) -> [1e-6, 1 - 1e-6]
  double sample_eps = 1e-3;     // u ~ U(eps, 1 - eps)

  template <class T>
  KVSIFT_HD HardKumaSupport<T> support() const {
    return HardKumaSupport<T>{T(l), T(r)};
  }
};

// Where a backward op puts its result.
enum class GradientWrite { kOverwrite, kAccumulate };

inline Status validate(const HardKumaOptions& o) {
  KVSIFT_REQUIRE(o.l < 0.0 && o.l > -1e300, kInvalidArgument, "options.l = ", o.l, " must be finite and < 0");
  KVSIFT_REQUIRE(o.r > 1.0 && o.r < 1e300, kInvalidArgument, "options.r = ", o.r, " must be finite and > 1");
  KVSIFT_REQUIRE(o.sample_eps >= 0.0 && o.sample_eps < 0.5, kInvalidArgument, "options.sample_eps = ", o.sample_eps,
                 " must be in [0, 0.5)");
  return Status();
}

// Outputs of hardkuma_stats; each is [n] and optional (null: not computed).
template <class T>
struct GateStatsOutputs {
  T* prob_zero = nullptr;       // P(h=0), clamped if options.clamp_prob_zero
  T* prob_one = nullptr;        // P(h=1)
  T* prob_interior = nullptr;   // P(0<h<1)
  T* expected_l0 = nullptr;     // P(h!=0) = 1 - prob_zero: the gate's expected L0
  T* kuma_mean = nullptr;       // E[K], LycheeDecode's role score
  T* mean = nullptr;            // E[h], the true gate mean
  T* d_prob_zero_da = nullptr;  // w.r.t. the raw a (0 where a or P(h=0) is clamped)
  T* d_prob_zero_db = nullptr;
};

// Outputs of hardkuma_expected_l0. sum and density are single values; grad_* are [n] and optional.
template <class T>
struct ExpectedL0Outputs {
  T* sum = nullptr;               // sum_i P(h_i != 0)
  T* density = nullptr;           // sum / n, LycheeDecode's constrained quantity
  T* grad_a = nullptr;            // grad_scale * d density / d a_i
  T* grad_b = nullptr;
  const T* grad_scale = nullptr;  // one value in the backend's memory (e.g. the Lagrangian's multiplier); null = 1
  GradientWrite write = GradientWrite::kOverwrite;
};

namespace detail {

// Keeps an argument out of template deduction, so optional outputs accept a plain nullptr.
template <class T>
struct non_deduced_helper {
  using type = T;
};
template <class T>
using non_deduced = typename non_deduced_helper<T>::type;

template <class T>
inline constexpr bool is_gate_real = std::is_same<T, float>::value || std::is_same<T, double>::value;

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

template <class T>
Status validate_gate_arrays(const HardKumaOptions& o, const T* a, const T* b, std::int64_t n) {
  static_assert(is_gate_real<T>, "HardKuma gates are float or double");
  KVSIFT_TRY(validate(o));
  KVSIFT_REQUIRE(n >= 0, kInvalidArgument, "n = ", n, " must be >= 0");
  if (n > 0) {
    KVSIFT_REQUIRE_NOT_NULL(a, "a");
    KVSIFT_REQUIRE_NOT_NULL(b, "b");
  }
  return Status();
}

// Host-only data check (the CUDA ops cannot read device data; they produce NaN instead).
template <class T>
Status validate_gate_values(const HardKumaOptions& o, const T* a, const T* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    for (int which = 0; which < 2; ++which) {
      const T v = which == 0 ? a[i] : b[i];
      const char* name = which == 0 ? "a" : "b";
      KVSIFT_REQUIRE(!gm::is_nan(v), kInvalidArgument, name, "[", i, "] = nan must be a number");
      KVSIFT_REQUIRE(o.clamp_shape || (v > T(0) && gm::is_finite(v)), kInvalidArgument, name, "[", i, "] = ", v,
                     " must be finite and > 0 (or enable options.clamp_shape to clamp it to [1e-6, 100])");
    }
  }
  return Status();
}

}  // namespace detail

namespace host {

template <class T>
Status hardkuma_stats(Exec, const HardKumaOptions& options, const T* a, const T* b, std::int64_t n,
                      GateStatsOutputs<T> out) {
  KVSIFT_TRY(detail::validate_gate_arrays(options, a, b, n));
  KVSIFT_TRY(detail::validate_gate_values(options, a, b, n));
  for (std::int64_t i = 0; i < n; ++i) detail::hardkuma_stats_gate(options, a, b, out, i);
  return Status();
}

// h[n] (required), and optionally the Kuma sample k[n] and the uniform u[n] that produced it.
template <class T>
Status hardkuma_sample(Exec, const HardKumaOptions& options, const T* a, const T* b, std::int64_t n,
                       PhiloxStream stream, T* h, detail::non_deduced<T>* k = nullptr,
                       detail::non_deduced<T>* u = nullptr) {
  KVSIFT_TRY(detail::validate_gate_arrays(options, a, b, n));
  if (n > 0) KVSIFT_REQUIRE_NOT_NULL(h, "h");
  KVSIFT_TRY(detail::validate_gate_values(options, a, b, n));
  for (std::int64_t i = 0; i < n; ++i) detail::hardkuma_sample_gate(options, a, b, stream, h, k, u, i);
  return Status();
}

// Given dL/dh at the draw of (stream), writes or adds dL/da and dL/db (either may be null).
template <class T>
Status hardkuma_sample_backward(Exec, const HardKumaOptions& options, const T* a, const T* b, std::int64_t n,
                                PhiloxStream stream, const T* grad_h, detail::non_deduced<T>* grad_a,
                                detail::non_deduced<T>* grad_b,
                                GradientWrite write = GradientWrite::kOverwrite) {
  KVSIFT_TRY(detail::validate_gate_arrays(options, a, b, n));
  if (n > 0) KVSIFT_REQUIRE_NOT_NULL(grad_h, "grad_h");
  KVSIFT_TRY(detail::validate_gate_values(options, a, b, n));
  for (std::int64_t i = 0; i < n; ++i)
    detail::hardkuma_sample_backward_gate(options, a, b, stream, grad_h, grad_a, grad_b, write, i);
  return Status();
}

template <class T>
Status hardkuma_expected_l0(Exec, const HardKumaOptions& options, const T* a, const T* b, std::int64_t n,
                            ExpectedL0Outputs<T> out) {
  KVSIFT_TRY(detail::validate_gate_arrays(options, a, b, n));
  KVSIFT_REQUIRE(n > 0 || out.density == nullptr, kInvalidArgument, "n = 0: the density of no gates is undefined");
  KVSIFT_TRY(detail::validate_gate_values(options, a, b, n));
  const T scale = (out.grad_scale ? *out.grad_scale : T(1)) / T(n > 0 ? n : 1);
  const bool want_grad = out.grad_a || out.grad_b;
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    ShapeGradient<T> g{};
    sum += double(detail::hardkuma_l0_term(options, a[i], b[i], want_grad ? &g : nullptr));
    if (out.grad_a) detail::write_gradient(out.grad_a + i, scale * g.da, out.write);
    if (out.grad_b) detail::write_gradient(out.grad_b + i, scale * g.db, out.write);
  }
  if (out.sum) *out.sum = T(sum);
  if (out.density) *out.density = T(sum / double(n));
  return Status();
}

}  // namespace host
}  // namespace kvsift
