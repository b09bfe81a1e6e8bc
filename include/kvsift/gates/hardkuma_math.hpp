#pragma once
/// \file
/// \brief Scalar math of the stretched-and-rectified Kumaraswamy, HardKuma (Bastings et al. 2019; exact
/// formulas in docs/algorithms/hardkuma.md §2-§5):
///
///   k ~ Kuma(a, b),   t = l + (r - l) k,   h = min(1, max(0, t)),   l < 0 < 1 < r
///
/// h has a point mass at 0, a point mass at 1 and a density on (0, 1). With c0 = -l / (r - l) and
/// c1 = (1 - l) / (r - l):  P(h=0) = F_K(c0),  P(h=1) = 1 - F_K(c1),  P(0<h<1) = F_K(c1) - F_K(c0).
///
/// Functions here are unclamped, on host and device, in float or double; the reference clamps and the
/// batched ops are in hardkuma.hpp (and gates/detail/hardkuma_gate.hpp). Reverse-mode gradients are
/// closed forms, no autodiff.

#include "kvsift/core/config.hpp"
#include "kvsift/gates/detail/incomplete_beta.hpp"
#include "kvsift/gates/detail/scalar_math.hpp"
#include "kvsift/gates/kumaraswamy.hpp"

namespace kvsift {

/// The stretched support (l, r). LycheeDecode and the reference use (-0.1, 1.1).
template <class T>
struct HardKumaSupport {
  T l = T(-0.1);  ///< lower end, < 0
  T r = T(1.1);   ///< upper end, > 1

  KVSIFT_HD T width() const { return r - l; }              ///< r - l, the stretch factor
  KVSIFT_HD T c0() const { return -l / (r - l); }          ///< Kuma quantile that maps to h = 0
  KVSIFT_HD T c1() const { return (T(1) - l) / (r - l); }  ///< Kuma quantile that maps to h = 1
};

// ---- Probabilities of the three parts of the support ----

/// P(h = 0) = 1 - (1 - c0^a)^b = -expm1(b log1p(-c0^a)).
template <class T>
KVSIFT_HD inline T hardkuma_prob_zero(T a, T b, HardKumaSupport<T> s) {
  return -detail::gm::expm1(b * kumaraswamy_log1m_pow(detail::gm::log(s.c0()), a));
}

/// P(h != 0) = (1 - c0^a)^b: one gate's expected L0, computed directly rather than as 1 - P0.
template <class T>
KVSIFT_HD inline T hardkuma_prob_nonzero(T a, T b, HardKumaSupport<T> s) {
  return detail::gm::exp(b * kumaraswamy_log1m_pow(detail::gm::log(s.c0()), a));
}

/// P(h = 1) = (1 - c1^a)^b.
template <class T>
KVSIFT_HD inline T hardkuma_prob_one(T a, T b, HardKumaSupport<T> s) {
  return detail::gm::exp(b * kumaraswamy_log1m_pow(detail::gm::log(s.c1()), a));
}

/// P(0 < h < 1) = (1 - c0^a)^b - (1 - c1^a)^b = (1 - c0^a)^b * -expm1(b (log(1 - c1^a) - log(1 - c0^a))).
template <class T>
KVSIFT_HD inline T hardkuma_prob_interior(T a, T b, HardKumaSupport<T> s) {
  const T log_s0 = kumaraswamy_log1m_pow(detail::gm::log(s.c0()), a);
  const T log_s1 = kumaraswamy_log1m_pow(detail::gm::log(s.c1()), a);
  return detail::gm::exp(b * log_s0) * -detail::gm::expm1(b * (log_s1 - log_s0));
}

/// A gradient with respect to the two shape parameters (a, b) of one gate.
template <class T>
struct ShapeGradient {
  T da;  ///< d/da
  T db;  ///< d/db
};

/// Gradient of P(h = 0) (docs/algorithms/hardkuma.md §3):
/// dP0/da = b (1 - c0^a)^(b-1) c0^a ln c0 (< 0), dP0/db = -(1 - c0^a)^b ln(1 - c0^a) (> 0).
/// The expected L0 P(h != 0) has the negated gradient.
template <class T>
KVSIFT_HD inline ShapeGradient<T> hardkuma_prob_zero_grad(T a, T b, HardKumaSupport<T> s) {
  const T log_c0 = detail::gm::log(s.c0());
  const T c0_pow_a = detail::gm::exp(a * log_c0);
  const T log_s0 = kumaraswamy_log1m_pow(log_c0, a);  // log(1 - c0^a), without cancellation for small a
  return ShapeGradient<T>{b * detail::gm::exp((b - T(1)) * log_s0) * c0_pow_a * log_c0,
                          -detail::gm::exp(b * log_s0) * log_s0};
}

// ---- Distribution of h ----

/// P(h <= x): 0 below 0, F_K((x - l) / (r - l)) on [0, 1) (which includes the mass at 0), 1 from 1 on.
template <class T>
KVSIFT_HD inline T hardkuma_cdf(T x, T a, T b, HardKumaSupport<T> s) {
  if (x < T(0)) return T(0);
  if (x >= T(1)) return T(1);
  return kumaraswamy_cdf((x - s.l) / s.width(), a, b);
}

/// Generalised inverse of hardkuma_cdf: the reparameterisation h = clip(l + (r - l) F_K^-1(u)).
template <class T>
KVSIFT_HD inline T hardkuma_inv_cdf(T u, T a, T b, HardKumaSupport<T> s) {
  const T t = s.l + s.width() * kumaraswamy_inv_cdf(u, a, b);
  return detail::gm::clamp(t, T(0), T(1));
}

/// Log-density of the continuous part, for 0 < x < 1: log f_K((x - l)/(r - l)) - log(r - l).
/// -inf outside (0, 1).
template <class T>
KVSIFT_HD inline T hardkuma_log_density(T x, T a, T b, HardKumaSupport<T> s) {
  if (!(x > T(0) && x < T(1))) return -T(INFINITY);
  return kumaraswamy_log_pdf((x - s.l) / s.width(), a, b) - detail::gm::log(s.width());
}

/// Log-likelihood of an observed gate value under the mixed measure (the reference's
/// HardBinary.log_pdf): log P(h=0) at 0, log P(h=1) at 1, the log-density in between.
template <class T>
KVSIFT_HD inline T hardkuma_log_prob(T x, T a, T b, HardKumaSupport<T> s) {
  if (x == T(0)) return detail::gm::log(hardkuma_prob_zero(a, b, s));
  if (x == T(1)) return detail::gm::log(hardkuma_prob_one(a, b, s));
  return hardkuma_log_density(x, a, b, s);
}

// ---- Means (docs/algorithms/hardkuma.md §5) ----

/// E[h] = int_0^1 P(h > x) dx = (r - l)/a [B(c1^a; 1/a, b+1) - B(c0^a; 1/a, b+1)]
///      = (r - l) E[K] [I(c1^a; 1/a, b+1) - I(c0^a; 1/a, b+1)]     (I regularised, E[K] = B(1/a, b+1)/a).
/// Always evaluated in double (see kumaraswamy_moment).
template <class T>
KVSIFT_HD inline T hardkuma_mean(T a, T b, HardKumaSupport<T> s) {
  const double ad = double(a), bd = double(b), l = double(s.l), r = double(s.r);
  const double p = 1.0 / ad, q = bd + 1.0;
  const double log_c0 = detail::gm::log(-l / (r - l)), log_c1 = detail::gm::log((1.0 - l) / (r - l));
  // x = c^a and 1 - x = -expm1(a ln c), each without cancellation.
  const double i1 = detail::regularized_incomplete_beta(detail::gm::exp(ad * log_c1), -detail::gm::expm1(ad * log_c1), p, q);
  const double i0 = detail::regularized_incomplete_beta(detail::gm::exp(ad * log_c0), -detail::gm::expm1(ad * log_c0), p, q);
  return T((r - l) * kumaraswamy_mean(ad, bd) * (i1 - i0));
}

// ---- Reparameterised sampling (docs/algorithms/hardkuma.md §4) ----

/// One reparameterised draw and its intermediate values (what the backward pass needs).
template <class T>
struct HardKumaDraw {
  T u;  ///< the uniform used
  T k;  ///< Kuma sample F_K^-1(u)
  T t;  ///< stretched value l + (r - l) k
  T h;  ///< the gate: t clipped to [0, 1]
};

/// The draw for uniform `u` in (0, 1): k = F_K^-1(u), t = l + (r - l) k, h = clip(t, 0, 1).
template <class T>
KVSIFT_HD inline HardKumaDraw<T> hardkuma_reparameterize(T u, T a, T b, HardKumaSupport<T> s) {
  const T k = kumaraswamy_inv_cdf(u, a, b);
  const T t = s.l + s.width() * k;
  return HardKumaDraw<T>{u, k, t, detail::gm::clamp(t, T(0), T(1))};
}

/// dk/da and dk/db at fixed u. With w = (1 - u)^(1/b) and k = (1 - w)^(1/a):
///   dk/da = -k ln(1 - w) / a^2,   dk/db = k w ln(1 - u) / (a b^2 (1 - w)).
template <class T>
KVSIFT_HD inline ShapeGradient<T> kumaraswamy_sample_grad(T u, T a, T b) {
  const T log_1mu = detail::gm::log1p(-u);
  const T log_w = log_1mu / b;
  const T w = detail::gm::exp(log_w);
  const T one_minus_w = -detail::gm::expm1(log_w);
  const T k = detail::gm::exp(detail::gm::log(one_minus_w) / a);
  return ShapeGradient<T>{-k * detail::gm::log(one_minus_w) / (a * a), k * w * log_1mu / (a * b * b * one_minus_w)};
}

/// dh/dk: (r - l) strictly inside the clip, 0 where the sample is clipped (hardtanh's gradient).
template <class T>
KVSIFT_HD inline T hardkuma_dh_dk(T t, HardKumaSupport<T> s) {
  return (t > T(0) && t < T(1)) ? s.width() : T(0);
}

}  // namespace kvsift
