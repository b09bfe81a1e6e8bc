#pragma once
/// \file
/// \brief The optimizer LycheeDecode trains its gate parameters with (docs/algorithms/hardkuma.md §10.4), so
/// a C++ training loop needs nothing else: AdamW with torch's update rule, and the warm-up/decay
/// schedule
///
///   factor(s) = min(1, max((s + 1) / (N * f), floor), max((N - s) / (N * f), floor))
///
/// with N total steps, f = 0.2 (ramp fraction) and floor = 0.1: a linear warm-up over the first 20%
/// of the steps and a linear decay over the last 20%, never below 0.1x. s is the 0-based index of the
/// update (torch's LambdaLR before its first scheduler.step()), so the first update uses factor(0).
///
/// adamw_step (torch.optim.AdamW, amsgrad off), for update number t = s + 1:
///   p <- p (1 - lr wd);  m <- m + (1 - b1)(g - m);  v <- b2 v + (1 - b2) g^2
///   p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
/// The scalar factors are computed in double on the host; per element the update uses explicit fma,
/// so the host and CUDA backends agree bitwise.
///
/// This header is the contract: the config, the schedule, the update rule and the workspace query. The
/// host reference is in gate_optimizer_reference.hpp, the CUDA op in gate_optimizer.cuh; adamw_step
/// has the one shape (const Exec& first, a trailing Workspace) and needs no workspace and no device facts.

#include <cstddef>
#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"
#include "kvsift/gates/detail/no_workspace_bytes.hpp"
#include "kvsift/gates/detail/scalar_math.hpp"

namespace kvsift {

/// AdamW's hyperparameters, with torch's names and LycheeDecode's defaults; validated by adamw_step.
struct AdamWConfig {
  double lr = 0.01;  ///< LycheeDecode's gate learning rate
  double beta1 = 0.9;         ///< first-moment decay, in [0, 1)
  double beta2 = 0.999;       ///< second-moment decay, in [0, 1)
  double eps = 1e-8;          ///< added to the denominator, > 0
  double weight_decay = 0.0;  ///< decoupled weight decay (p <- p (1 - lr wd)), >= 0
};

/// The learning-rate multiplier for update `step` (0-based) of `total_steps`.
inline double warmup_decay_lr_factor(std::int64_t step, std::int64_t total_steps, double ramp_fraction = 0.2,
                                     double floor = 0.1) {
  const double ramp = double(total_steps) * ramp_fraction;
  const double up = double(step + 1) / ramp;
  const double down = double(total_steps - step) / ramp;
  const double a = up > floor ? up : floor;
  const double b = down > floor ? down : floor;
  const double m = a < b ? a : b;
  return m < 1.0 ? m : 1.0;
}

/// The per-step scalars of one update; built on the host, passed by value to kernels.
struct AdamWCoefficients {
  double decay;       ///< 1 - lr wd
  double one_minus_beta1;  ///< 1 - b1
  double beta2;            ///< b2
  double one_minus_beta2;  ///< 1 - b2
  double step_size;   ///< lr / (1 - b1^t)
  double bias2_sqrt;  ///< sqrt(1 - b2^t)
  double eps;         ///< eps, added after the bias correction
};

namespace detail {

inline Status validate_adamw(const AdamWConfig& c, double lr, std::int64_t step) {
  KVSIFT_REQUIRE(lr >= 0.0 && lr < 1e300, kInvalidArgument, "lr = ", lr, " must be finite and >= 0");
  KVSIFT_REQUIRE(c.beta1 >= 0.0 && c.beta1 < 1.0, kInvalidArgument, "config.beta1 = ", c.beta1, " must be in [0, 1)");
  KVSIFT_REQUIRE(c.beta2 >= 0.0 && c.beta2 < 1.0, kInvalidArgument, "config.beta2 = ", c.beta2, " must be in [0, 1)");
  KVSIFT_REQUIRE(c.eps > 0.0, kInvalidArgument, "config.eps = ", c.eps, " must be > 0");
  KVSIFT_REQUIRE(c.weight_decay >= 0.0, kInvalidArgument, "config.weight_decay = ", c.weight_decay, " must be >= 0");
  KVSIFT_REQUIRE(step >= 0, kInvalidArgument, "step = ", step, " must be >= 0 (the 0-based update index)");
  return Status();
}

inline AdamWCoefficients adamw_coefficients(const AdamWConfig& c, double lr, std::int64_t step) {
  const double t = double(step + 1);
  AdamWCoefficients k;
  k.decay = 1.0 - lr * c.weight_decay;
  k.one_minus_beta1 = 1.0 - c.beta1;
  k.beta2 = c.beta2;
  k.one_minus_beta2 = 1.0 - c.beta2;
  k.step_size = lr / (1.0 - ::pow(c.beta1, t));
  k.bias2_sqrt = ::sqrt(1.0 - ::pow(c.beta2, t));
  k.eps = c.eps;
  return k;
}

template <class T>
KVSIFT_HD inline void adamw_element(const AdamWCoefficients& k, T* p, const T* g, T* m, T* v, std::int64_t i) {
  const T gi = g[i];
  const T mi = gm::fma(T(k.one_minus_beta1), gi - m[i], m[i]);
  const T vi = gm::fma(T(k.one_minus_beta2), gi * gi, T(k.beta2) * v[i]);
  const T denom = gm::sqrt(vi) / T(k.bias2_sqrt) + T(k.eps);
  p[i] = gm::fma(T(-k.step_size), mi / denom, p[i] * T(k.decay));
  m[i] = mi;
  v[i] = vi;
}

template <class T>
Status validate_adamw_arrays(T* params, const T* grads, T* m, T* v, std::int64_t n) {
  KVSIFT_REQUIRE(n >= 0, kInvalidArgument, "n = ", n, " must be >= 0");
  if (n == 0) return Status();
  KVSIFT_REQUIRE_NOT_NULL(params, "params");
  KVSIFT_REQUIRE_NOT_NULL(grads, "grads");
  KVSIFT_REQUIRE_NOT_NULL(m, "exp_avg");
  KVSIFT_REQUIRE_NOT_NULL(v, "exp_avg_sq");
  return Status();
}

/// What adamw_step checks on both backends.
template <class T>
Status validate_adamw_step(const AdamWConfig& c, double lr, std::int64_t step, T* params, const T* grads, T* m, T* v,
                           std::int64_t n) {
  KVSIFT_TRY(validate_adamw(c, lr, step));
  return validate_adamw_arrays(params, grads, m, v, n);
}

}  // namespace detail

// ---- Workspace query (both backends; reports 0) ----

/// Workspace of adamw_step, for either backend's Exec and with the op's arguments: always 0.
/// kNullPointer when `bytes` is null.
template <class T, class Exec>
Status adamw_step_workspace_bytes(const Exec&, const AdamWConfig&, double /*lr*/, std::int64_t /*step*/, T* /*params*/,
                                  const T* /*grads*/, T* /*m*/, T* /*v*/, std::int64_t /*n*/, std::size_t* bytes) {
  return detail::no_workspace_bytes(bytes);
}

}  // namespace kvsift
