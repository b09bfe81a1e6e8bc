#pragma once
/// \file
/// \brief Lagrangian sparsity control of the gates' expected L0 density (docs/algorithms/hardkuma.md §9;
/// Rezende & Viola 2018, Algorithm 1, as in the Bastings and LycheeDecode reference code). Per training
/// step, given the current density rho (hardkuma_expected_l0):
///
///   c_hat  = rho - target                  (two-sided, Bastings)   or relu(rho - target) (one-sided, LycheeDecode)
///   c_ma   = alpha c_ma + (1 - alpha) c_hat
///   lambda = lambda exp(lr c_ma)           (then clamped to [lambda_min, lambda_max] if clamp_lambda)
///   loss  += lambda c,  where c has the value c_ma and the gradient of c_hat
///
/// So the penalty's gradient w.r.t. rho is lambda * dc_hat/drho: `grad_scale` below, which is what
/// hardkuma_expected_l0 takes as ExpectedL0Outputs::grad_scale to add the penalty's gradient to a and
/// b. The multiplier used is the one updated this step, as in the reference. c_ma starts at 0.
///
/// One-sided: c_hat >= 0, so lambda never decreases, and the penalty has no gradient once rho <= target
/// (relu's gradient at 0 is taken as 0, as torch does).
///
/// This header is the contract: config, state, the update rule (a scalar function, callable on host and
/// device), validation and the workspace query of the op. The op form, which reads the density from
/// and writes grad_scale to the backend's memory, is in lagrangian_reference.hpp (host) and
/// lagrangian.cuh (CUDA, one thread, graph-capturable); it has the one shape (const Exec& first, a
/// trailing Workspace) and needs no workspace and no device facts.

#include <cstddef>
#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"
#include "kvsift/gates/detail/no_workspace_bytes.hpp"
#include "kvsift/gates/detail/scalar_math.hpp"

namespace kvsift {

/// Which violations the constraint penalises: only rho > target (one-sided, LycheeDecode) or any
/// difference from the target (two-sided, Bastings).
enum class ConstraintSide { kOneSided, kTwoSided };

/// The controller's hyperparameters; validate() checks them, and the two presets give the reference
/// codes' values.
struct LagrangianConfig {
  double target = 0.0;          ///< desired density rho* (LycheeDecode: 24 / (layers * kv_heads))
  double lambda_init = 2.0;     ///< the multiplier before the first update, finite and > 0
  double lr = 1e-3;             ///< multiplicative step of lambda
  double ma_alpha = 0.9;        ///< moving-average factor of the constraint
  bool clamp_lambda = true;     ///< clamp lambda to [lambda_min, lambda_max] after each update
  double lambda_min = 1e-12;    ///< lower clamp bound, > 0
  double lambda_max = 20.0;     ///< upper clamp bound, >= lambda_min
  ConstraintSide side = ConstraintSide::kOneSided;  ///< one- or two-sided constraint

  /// LycheeDecode's train_kuma.py: lambda0 = 2, lr = 1e-3, alpha = 0.9, one-sided, lambda in [1e-12, 20].
  static LagrangianConfig lycheedecode(double target) {
    LagrangianConfig c;
    c.target = target;
    return c;
  }
  /// Bastings' latent.py defaults: lambda0 = 1e-4, lr = 0.01, alpha = 0.99, two-sided, no clamp.
  static LagrangianConfig bastings(double target) {
    LagrangianConfig c;
    c.target = target;
    c.lambda_init = 1e-4;
    c.lr = 0.01;
    c.ma_alpha = 0.99;
    c.clamp_lambda = false;
    c.side = ConstraintSide::kTwoSided;
    return c;
  }
};

/// The controller's state, carried across training steps; start it with lagrangian_initial_state.
/// A plain struct, so it can live in host or device memory (the op form updates it in place).
struct LagrangianState {
  double lambda = 2.0;     ///< the current multiplier
  double c_ma = 0.0;       ///< moving average of the constraint violation; starts at 0
  std::int64_t steps = 0;  ///< updates applied (a NaN density does not count)
};

/// What one update reports (for logging and for the backward pass).
struct LagrangianStep {
  double c_hat = 0.0;       ///< this step's constraint violation
  double c = 0.0;           ///< smoothed constraint (= c_ma), the value of the penalty's factor
  double lambda = 0.0;      ///< multiplier after the update
  double penalty = 0.0;     ///< lambda * c, the term added to the loss
  double grad_scale = 0.0;  ///< d penalty / d rho = lambda * dc_hat/drho
};

/// kInvalidArgument unless target is in [0, 1], lambda_init finite and > 0, lr finite and >= 0,
/// ma_alpha in [0, 1), and (when clamping) 0 < lambda_min <= lambda_max.
inline Status validate(const LagrangianConfig& c) {
  KVSIFT_REQUIRE(c.target >= 0.0 && c.target <= 1.0, kInvalidArgument, "config.target = ", c.target,
                 " must be a density in [0, 1]");
  KVSIFT_REQUIRE(c.lambda_init > 0.0 && c.lambda_init < 1e300, kInvalidArgument, "config.lambda_init = ",
                 c.lambda_init, " must be finite and > 0");
  KVSIFT_REQUIRE(c.lr >= 0.0 && c.lr < 1e300, kInvalidArgument, "config.lr = ", c.lr, " must be finite and >= 0");
  KVSIFT_REQUIRE(c.ma_alpha >= 0.0 && c.ma_alpha < 1.0, kInvalidArgument, "config.ma_alpha = ", c.ma_alpha,
                 " must be in [0, 1)");
  KVSIFT_REQUIRE(!c.clamp_lambda || (c.lambda_min > 0.0 && c.lambda_min <= c.lambda_max), kInvalidArgument,
                 "config.lambda_min = ", c.lambda_min, " and config.lambda_max = ", c.lambda_max,
                 " must satisfy 0 < lambda_min <= lambda_max");
  return Status();
}

namespace detail {

/// What the lagrangian_update op checks on both backends.
template <class T>
Status validate_lagrangian_update(const LagrangianConfig& c, const LagrangianState* state, const T* density) {
  KVSIFT_TRY(validate(c));
  KVSIFT_REQUIRE_NOT_NULL(state, "state");
  KVSIFT_REQUIRE_NOT_NULL(density, "density");
  return Status();
}

}  // namespace detail

/// The state before the first update: lambda = config.lambda_init, c_ma = 0, no steps.
inline LagrangianState lagrangian_initial_state(const LagrangianConfig& c) {
  LagrangianState s;
  s.lambda = c.lambda_init;
  return s;
}

/// The update itself, on host or device. A NaN density leaves lambda and c_ma untouched and reports
/// NaN, so one bad step does not poison the multiplier for the rest of training.
KVSIFT_HD inline LagrangianStep lagrangian_update(const LagrangianConfig& c, LagrangianState* s, double density) {
  LagrangianStep out;
  if (detail::gm::is_nan(density)) {
    out.c_hat = out.c = out.penalty = out.grad_scale = density;
    out.lambda = s->lambda;
    return out;
  }
  const double violation = density - c.target;
  const bool one_sided = c.side == ConstraintSide::kOneSided;
  out.c_hat = one_sided ? (violation > 0.0 ? violation : 0.0) : violation;
  s->c_ma = c.ma_alpha * s->c_ma + (1.0 - c.ma_alpha) * out.c_hat;
  double lambda = s->lambda * detail::gm::exp(c.lr * s->c_ma);
  if (c.clamp_lambda) lambda = detail::gm::clamp(lambda, c.lambda_min, c.lambda_max);
  s->lambda = lambda;
  s->steps += 1;
  out.c = s->c_ma;
  out.lambda = lambda;
  out.penalty = lambda * s->c_ma;
  out.grad_scale = (one_sided && !(violation > 0.0)) ? 0.0 : lambda;
  return out;
}

// ---- Workspace query (both backends; reports 0) ----

/// Workspace of the lagrangian_update op, for either backend's Exec and with the op's arguments:
/// always 0. kNullPointer when `bytes` is null.
template <class T, class Exec>
Status lagrangian_update_workspace_bytes(const Exec&, const LagrangianConfig&, LagrangianState* /*state*/,
                                         const T* /*density*/, T* /*grad_scale*/, LagrangianStep* /*step*/,
                                         std::size_t* bytes) {
  return detail::no_workspace_bytes(bytes);
}

}  // namespace kvsift
