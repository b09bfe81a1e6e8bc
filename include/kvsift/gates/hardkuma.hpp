#pragma once
/// \file
/// \brief HardKuma gates, batched: one gate per (layer, KV head), parameters a[n], b[n] (flattened
/// layer-major, gate i = layer * kv_heads + head). This header is the contract: options, outputs,
/// validation and the workspace queries. The host reference is in hardkuma_reference.hpp
/// (kvsift::host), the CUDA ops in hardkuma.cuh (kvsift::cuda); both run the per-gate code of
/// gates/detail/hardkuma_gate.hpp, so they differ only by the ulps of the platform's libm.
///
///   hardkuma_stats            P(h=0), P(h=1), P(0<h<1), P(h!=0), E[K], E[h], dP(h=0)/da, dP(h=0)/db
///   hardkuma_sample           h = clip(l + (r-l) F_K^-1(u)), u from Philox(seed, offset, gate index)
///   hardkuma_sample_backward  dL/da, dL/db from dL/dh at the same draw (zero where h is clipped)
///   hardkuma_expected_l0      sum and density (mean) of P(h!=0) and the density's gradient
///
/// Every op has the one shape of kvsift's ops, on both backends:
///
///   Status hardkuma_stats(const Exec& exec, options, a, b, n, out, Workspace workspace = {});
///   Status hardkuma_stats_workspace_bytes(const Exec& exec, options, a, b, n, out, std::size_t* bytes);
///
/// None needs scratch or the Exec's device facts: the queries report 0 (gates/detail/no_workspace_bytes.hpp
/// says why they exist), a workspace passed anyway is ignored, and a default-constructed Exec works.
///
/// Reference numerics (docs/algorithms/hardkuma.md §6), on by default and each switchable off:
///   - clamp_shape: a and b are clamped to [1e-6, 100] before use, as LycheeDecode clamps its raw
///     parameters every step; the gradient w.r.t. a raw value outside that range is 0 (torch.clamp).
///   - clamp_prob_zero: P(h=0) is clamped to [1e-6, 1 - 1e-6] wherever it is reported or enters the
///     expected L0, with zero gradient when clamped. (The reference also adds 1e-6 inside the log
///     before clamping; that 1e-6 bias is deliberately not reproduced.)
///   - sample_eps: u = eps + (1 - 2 eps) v with v uniform in (0, 1), i.e. u ~ U(1e-3, 1 - 1e-3) as
///     Kuma.sample draws it.
///
/// Bad input: options are validated on every call (l < 0, r > 1, finite; 0 <= sample_eps < 0.5).
/// Host ops also check the data: NaN a or b is an error; with clamp_shape off, so is any a or b that
/// is <= 0 or infinite (with clamp_shape on, those are clamped, the documented behaviour). CUDA ops
/// cannot read device data on the host; there such a gate yields NaN outputs instead.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"
#include "kvsift/core/philox.hpp"
#include "kvsift/gates/detail/no_workspace_bytes.hpp"
#include "kvsift/gates/detail/scalar_math.hpp"
#include "kvsift/gates/hardkuma_math.hpp"

namespace kvsift {

/// Lower bound of the shape clamp (options.clamp_shape): a and b are clamped to [1e-6, 100].
inline constexpr double kHardKumaShapeMin = 1e-6;
/// Upper bound of the shape clamp.
inline constexpr double kHardKumaShapeMax = 100.0;
/// Lower bound of the P(h=0) clamp (options.clamp_prob_zero).
inline constexpr double kHardKumaProbZeroMin = 1e-6;
/// Upper bound of the P(h=0) clamp.
inline constexpr double kHardKumaProbZeroMax = 1.0 - 1e-6;

/// The stretch and the reference numerics every HardKuma op takes; validate() checks them on every call.
struct HardKumaOptions {
  double l = -0.1;              ///< stretched support (l, r), l < 0 < 1 < r
  double r = 1.1;               ///< upper end of the stretched support, finite and > 1
  bool clamp_shape = true;      ///< a, b -> [1e-6, 100]
  bool clamp_prob_zero = true;  ///< P(h=0) -> [1e-6, 1 - 1e-6]
  double sample_eps = 1e-3;     ///< u ~ U(eps, 1 - eps)

  /// The support (l, r) in the gate's real type.
  template <class T>
  KVSIFT_HD HardKumaSupport<T> support() const {
    return HardKumaSupport<T>{T(l), T(r)};
  }
};

/// Where a backward op puts its result.
enum class GradientWrite { kOverwrite, kAccumulate };

/// kInvalidArgument unless l is finite and < 0, r finite and > 1, and 0 <= sample_eps < 0.5.
inline Status validate(const HardKumaOptions& o) {
  KVSIFT_REQUIRE(o.l < 0.0 && o.l > -1e300, kInvalidArgument, "options.l = ", o.l, " must be finite and < 0");
  KVSIFT_REQUIRE(o.r > 1.0 && o.r < 1e300, kInvalidArgument, "options.r = ", o.r, " must be finite and > 1");
  KVSIFT_REQUIRE(o.sample_eps >= 0.0 && o.sample_eps < 0.5, kInvalidArgument, "options.sample_eps = ", o.sample_eps,
                 " must be in [0, 0.5)");
  return Status();
}

/// Outputs of hardkuma_stats; each is [n] and optional (null: not computed).
template <class T>
struct GateStatsOutputs {
  T* prob_zero = nullptr;       ///< P(h=0), clamped if options.clamp_prob_zero
  T* prob_one = nullptr;        ///< P(h=1)
  T* prob_interior = nullptr;   ///< P(0<h<1)
  T* expected_l0 = nullptr;     ///< P(h!=0) = 1 - prob_zero: the gate's expected L0
  T* kuma_mean = nullptr;       ///< E[K], LycheeDecode's role score
  T* mean = nullptr;            ///< E[h], the true gate mean
  T* d_prob_zero_da = nullptr;  ///< w.r.t. the raw a (0 where a or P(h=0) is clamped)
  T* d_prob_zero_db = nullptr;  ///< w.r.t. the raw b (0 where b or P(h=0) is clamped)
};

/// Outputs of hardkuma_expected_l0. sum and density are single values; grad_* are [n] and optional.
template <class T>
struct ExpectedL0Outputs {
  T* sum = nullptr;               ///< sum_i P(h_i != 0)
  T* density = nullptr;           ///< sum / n, LycheeDecode's constrained quantity
  T* grad_a = nullptr;            ///< grad_scale * d density / d a_i
  T* grad_b = nullptr;            ///< grad_scale * d density / d b_i
  const T* grad_scale = nullptr;  ///< one value in the backend's memory (e.g. the Lagrangian's multiplier); null = 1
  GradientWrite write = GradientWrite::kOverwrite;  ///< overwrite grad_a and grad_b, or add to them
};

namespace detail {

/// Keeps an argument out of template deduction, so optional outputs accept a plain nullptr.
template <class T>
struct non_deduced_helper {
  using type = T;
};
template <class T>
using non_deduced = typename non_deduced_helper<T>::type;

template <class T>
inline constexpr bool is_gate_real = std::is_same<T, float>::value || std::is_same<T, double>::value;

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

/// What each op checks on every call, on both backends (pointers, sizes, options; never device data).
template <class T>
Status validate_hardkuma_sample(const HardKumaOptions& o, const T* a, const T* b, std::int64_t n, const T* h) {
  KVSIFT_TRY(validate_gate_arrays(o, a, b, n));
  if (n > 0) KVSIFT_REQUIRE_NOT_NULL(h, "h");
  return Status();
}

template <class T>
Status validate_hardkuma_sample_backward(const HardKumaOptions& o, const T* a, const T* b, std::int64_t n,
                                         const T* grad_h) {
  KVSIFT_TRY(validate_gate_arrays(o, a, b, n));
  if (n > 0) KVSIFT_REQUIRE_NOT_NULL(grad_h, "grad_h");
  return Status();
}

template <class T>
Status validate_hardkuma_expected_l0(const HardKumaOptions& o, const T* a, const T* b, std::int64_t n,
                                     const ExpectedL0Outputs<T>& out) {
  KVSIFT_TRY(validate_gate_arrays(o, a, b, n));
  KVSIFT_REQUIRE(n > 0 || out.density == nullptr, kInvalidArgument, "n = 0: the density of no gates is undefined");
  return Status();
}

/// Host-only data check (the CUDA ops cannot read device data; they produce NaN instead).
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

// ---- Workspace queries (both backends; every one reports 0) ----

/// Workspace of hardkuma_stats, for either backend's Exec and with the op's arguments: always 0.
/// kNullPointer when `bytes` is null.
template <class T, class Exec>
Status hardkuma_stats_workspace_bytes(const Exec&, const HardKumaOptions&, const T* /*a*/, const T* /*b*/,
                                      std::int64_t /*n*/, const GateStatsOutputs<T>&, std::size_t* bytes) {
  return detail::no_workspace_bytes(bytes);
}

/// The op's optional k and u are explicit here: pass nullptr where the op call leaves them out.
template <class T, class Exec>
Status hardkuma_sample_workspace_bytes(const Exec&, const HardKumaOptions&, const T* /*a*/, const T* /*b*/,
                                       std::int64_t /*n*/, PhiloxStream, T* /*h*/, detail::non_deduced<T>* /*k*/,
                                       detail::non_deduced<T>* /*u*/, std::size_t* bytes) {
  return detail::no_workspace_bytes(bytes);
}

/// Workspace of hardkuma_sample_backward: always 0 (kNullPointer when `bytes` is null).
template <class T, class Exec>
Status hardkuma_sample_backward_workspace_bytes(const Exec&, const HardKumaOptions&, const T* /*a*/, const T* /*b*/,
                                                std::int64_t /*n*/, PhiloxStream, const T* /*grad_h*/,
                                                detail::non_deduced<T>* /*grad_a*/, detail::non_deduced<T>* /*grad_b*/,
                                                GradientWrite, std::size_t* bytes) {
  return detail::no_workspace_bytes(bytes);
}

/// Workspace of hardkuma_expected_l0: always 0 (kNullPointer when `bytes` is null).
template <class T, class Exec>
Status hardkuma_expected_l0_workspace_bytes(const Exec&, const HardKumaOptions&, const T* /*a*/, const T* /*b*/,
                                            std::int64_t /*n*/, const ExpectedL0Outputs<T>&, std::size_t* bytes) {
  return detail::no_workspace_bytes(bytes);
}

}  // namespace kvsift
