#pragma once
// Float/double overloads of the libm functions the gate math needs, callable on host and device.
// Templates over T call these instead of std:: functions so that a float instantiation calls the
// float function (logf, not log) on both backends, and no host-only overload sneaks into device code.

#include <cmath>

#include "kvsift/core/config.hpp"

namespace kvsift {
namespace detail {
namespace gm {

KVSIFT_HD inline float log(float x) { return ::logf(x); }
KVSIFT_HD inline double log(double x) { return ::log(x); }
KVSIFT_HD inline float log1p(float x) { return ::log1pf(x); }
KVSIFT_HD inline double log1p(double x) { return ::log1p(x); }
KVSIFT_HD inline float exp(float x) { return ::expf(x); }
KVSIFT_HD inline double exp(double x) { return ::exp(x); }
KVSIFT_HD inline float expm1(float x) { return ::expm1f(x); }
KVSIFT_HD inline double expm1(double x) { return ::expm1(x); }
KVSIFT_HD inline float sqrt(float x) { return ::sqrtf(x); }
KVSIFT_HD inline double sqrt(double x) { return ::sqrt(x); }
KVSIFT_HD inline float fma(float a, float b, float c) { return ::fmaf(a, b, c); }
KVSIFT_HD inline double fma(double a, double b, double c) { return ::fma(a, b, c); }
KVSIFT_HD inline double lgamma(double x) { return ::lgamma(x); }

// NaN-propagating helpers written without <cmath> macros, which differ between host and device.
template <class T>
KVSIFT_HD inline bool is_nan(T x) {
  return x != x;
}
template <class T>
KVSIFT_HD inline bool is_finite(T x) {
  return x == x && x - x == T(0);
}
template <class T>
KVSIFT_HD inline T abs(T x) {
  return x < T(0) ? -x : x;
}
// Clamp that keeps NaN as NaN (fmin/fmax would replace it with a bound).
template <class T>
KVSIFT_HD inline T clamp(T x, T lo, T hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

}  // namespace gm
}  // namespace detail
}  // namespace kvsift
