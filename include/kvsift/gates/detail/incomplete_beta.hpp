#pragma once
// The regularised incomplete beta function I_x(p, q), in double, on host and device. The HardKuma
// mean needs it with p = 1/a up to 1e6 (a clamped at 1e-6) and x = c^a within 1e-6 of 1, so the
// caller passes both x and y = 1 - x, each computed without cancellation.
//
// Method: the continued fraction for I_x (modified Lentz), evaluated on whichever side of the mean
// (p + 1) / (p + q + 2) it converges fast, and the symmetry I_x(p, q) = 1 - I_y(q, p) for the other.

#include "kvsift/core/config.hpp"
#include "kvsift/gates/detail/scalar_math.hpp"

namespace kvsift {
namespace detail {

// Continued fraction part of I_x(p, q); converges quickly for x < (p + 1) / (p + q + 2).
KVSIFT_HD inline double incomplete_beta_continued_fraction(double x, double p, double q) {
  constexpr double kTiny = 1e-300;
  constexpr double kTolerance = 1e-15;
  constexpr int kMaxIterations = 20000;  // worst case grows like sqrt(max(p, q)); p <= 1e6 here
  const double pq = p + q;
  double c = 1.0;
  double d = 1.0 - pq * x / (p + 1.0);
  if (gm::abs(d) < kTiny) d = kTiny;
  d = 1.0 / d;
  double f = d;
  for (int m = 1; m <= kMaxIterations; ++m) {
    const double m2 = 2.0 * m;
    // Even step.
    double coef = m * (q - m) * x / ((p - 1.0 + m2) * (p + m2));
    d = 1.0 + coef * d;
    if (gm::abs(d) < kTiny) d = kTiny;
    c = 1.0 + coef / c;
    if (gm::abs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    f *= d * c;
    // Odd step.
    coef = -(p + m) * (pq + m) * x / ((p + m2) * (p + 1.0 + m2));
    d = 1.0 + coef * d;
    if (gm::abs(d) < kTiny) d = kTiny;
    c = 1.0 + coef / c;
    if (gm::abs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    const double delta = d * c;
    f *= delta;
    if (gm::abs(delta - 1.0) < kTolerance) break;
  }
  return f;
}

// I_x(p, q) for p, q > 0, given x and y = 1 - x (both in [0, 1]).
KVSIFT_HD inline double regularized_incomplete_beta(double x, double y, double p, double q) {
  if (x <= 0.0) return 0.0;
  if (y <= 0.0) return 1.0;
  const double log_beta = gm::lgamma(p) + gm::lgamma(q) - gm::lgamma(p + q);
  const double front = gm::exp(p * gm::log(x) + q * gm::log(y) - log_beta);
  if (x < (p + 1.0) / (p + q + 2.0)) return front * incomplete_beta_continued_fraction(x, p, q) / p;
  return 1.0 - front * incomplete_beta_continued_fraction(y, q, p) / q;
}

}  // namespace detail
}  // namespace kvsift
