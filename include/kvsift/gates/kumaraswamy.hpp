#pragma once
/// \file
/// \brief The Kumaraswamy distribution K ~ Kuma(a, b) on (0, 1), a, b > 0
/// (docs/algorithms/hardkuma.md §1, §5):
///
///   f(k) = a b k^(a-1) (1 - k^a)^(b-1),   F(k) = 1 - (1 - k^a)^b,   F^-1(u) = (1 - (1 - u)^(1/b))^(1/a)
///
/// Every power is taken as exp(. * log) and every 1 - exp(.) as -expm1(.), so nothing cancels for
/// a or b near the clamp bounds 1e-6 and 100. Scalar functions on host and device, float or double.
/// Validation of a and b is the caller's (see hardkuma.hpp); invalid inputs propagate NaN.

#include "kvsift/core/config.hpp"
#include "kvsift/gates/detail/scalar_math.hpp"

namespace kvsift {

/// log(1 - k^a) from `log_k` = log k, k in (0, 1): the building block of the cdf and the density.
template <class T>
KVSIFT_HD inline T kumaraswamy_log1m_pow(T log_k, T a) {
  // log(1 - e^y), y = a log k <= 0. Near y = 0 (small a), e^y is close to 1 and 1 - e^y cancels:
  // take log(-expm1(y)) there, log1p(-e^y) elsewhere (the usual log1mexp split at -ln 2).
  const T y = a * log_k;
  return y > T(-0.6931471805599453) ? detail::gm::log(-detail::gm::expm1(y)) : detail::gm::log1p(-detail::gm::exp(y));
}

/// Survival function 1 - F(k) = (1 - k^a)^b.
template <class T>
KVSIFT_HD inline T kumaraswamy_survival(T k, T a, T b) {
  if (k <= T(0)) return T(1);
  if (k >= T(1)) return T(0);
  return detail::gm::exp(b * kumaraswamy_log1m_pow(detail::gm::log(k), a));
}

/// F(k) = 1 - (1 - k^a)^b; 0 for k <= 0, 1 for k >= 1.
template <class T>
KVSIFT_HD inline T kumaraswamy_cdf(T k, T a, T b) {
  if (k <= T(0)) return T(0);
  if (k >= T(1)) return T(1);
  return -detail::gm::expm1(b * kumaraswamy_log1m_pow(detail::gm::log(k), a));
}

/// F^-1(u) = exp((1/a) log(-expm1(log1p(-u) / b))), u in (0, 1).
template <class T>
KVSIFT_HD inline T kumaraswamy_inv_cdf(T u, T a, T b) {
  if (u <= T(0)) return T(0);
  if (u >= T(1)) return T(1);
  const T one_minus_w = -detail::gm::expm1(detail::gm::log1p(-u) / b);  // 1 - (1-u)^(1/b)
  return detail::gm::exp(detail::gm::log(one_minus_w) / a);
}

/// log f(k) for k in (0, 1); -inf outside.
template <class T>
KVSIFT_HD inline T kumaraswamy_log_pdf(T k, T a, T b) {
  if (!(k > T(0) && k < T(1))) return -T(INFINITY);
  const T log_k = detail::gm::log(k);
  return detail::gm::log(a) + detail::gm::log(b) + (a - T(1)) * log_k + (b - T(1)) * kumaraswamy_log1m_pow(log_k, a);
}

/// n-th raw moment E[K^n] = b B(1 + n/a, b). Evaluated in double whatever T is: for small a the
/// lgamma terms are ~1e7 and cancel, which float cannot represent.
template <class T>
KVSIFT_HD inline T kumaraswamy_moment(T a, T b, int n) {
  const double ad = double(a), bd = double(b), s = 1.0 + double(n) / ad;
  return T(bd * detail::gm::exp(detail::gm::lgamma(s) + detail::gm::lgamma(bd) - detail::gm::lgamma(s + bd)));
}

/// E[K] = b Gamma(1 + 1/a) Gamma(b) / Gamma(1 + 1/a + b): what the reference calls HardKuma.mean() and
/// what LycheeDecode thresholds at 0.5 to pick retrieval heads.
template <class T>
KVSIFT_HD inline T kumaraswamy_mean(T a, T b) {
  return kumaraswamy_moment(a, b, 1);
}

}  // namespace kvsift
