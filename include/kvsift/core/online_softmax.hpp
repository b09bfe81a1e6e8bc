#pragma once
/// \file
/// \brief Online softmax state and the log-sum-exp merge of partial attention results (Flash-Decoding).
///
/// A partial result over a set of keys is (m, d, o): running max of the logits, sum of exp(logit - m),
/// and the unnormalised output sum of exp(logit - m) * v. Partials over disjoint key sets merge
/// exactly; the final output is o / d and the log-sum-exp is m + log(d). An empty set is
/// m = -inf, d = 0, and merging with it is the identity. Logits are in natural-log units; kernels that
/// work in base 2 (exp2f) scale by log2(e) (kLog2e) and convert the LSE back by multiplying with kLn2.

#include <cmath>

#include "kvsift/core/config.hpp"

namespace kvsift {

/// log2(e): multiplies natural-log logits into base 2 for exp2f.
inline constexpr float kLog2e = 1.4426950408889634f;
/// ln(2): multiplies a base-2 log-sum-exp back into natural-log units.
inline constexpr float kLn2 = 0.6931471805599453f;

/// The (m, d) part of a partial softmax over a set of keys; the caller keeps the output sum o and
/// rescales it by the factors push and merge return. Default-constructed, it is the empty set.
struct SoftmaxState {
  float m = -INFINITY;  ///< running max
  float d = 0.f;        ///< sum of exp(x - m)

  /// Add one logit; returns the factor by which previously accumulated outputs must be rescaled, and
  /// writes the weight of this logit to *p.
  KVSIFT_HD float push(float x, float* p) {
    const float m_new = fmaxf(m, x);
    const float scale = (m == -INFINITY) ? 0.f : expf(m - m_new);
    const float w = (x == -INFINITY) ? 0.f : expf(x - m_new);
    d = d * scale + w;
    m = m_new;
    *p = w;
    return scale;
  }

  /// Merge another partial; returns the rescale factors for this and the other partial's outputs.
  KVSIFT_HD void merge(const SoftmaxState& o, float* scale_self, float* scale_other) {
    const float m_new = fmaxf(m, o.m);
    if (m_new == -INFINITY) {  // both empty
      *scale_self = 0.f;
      *scale_other = 0.f;
      return;
    }
    *scale_self = (m == -INFINITY) ? 0.f : expf(m - m_new);
    *scale_other = (o.m == -INFINITY) ? 0.f : expf(o.m - m_new);
    d = d * *scale_self + o.d * *scale_other;
    m = m_new;
  }

  /// log(sum exp(x)); -inf for an empty set.
  KVSIFT_HD float lse() const { return d > 0.f ? m + logf(d) : -INFINITY; }
  /// Normaliser for the output; 0 for an empty set, so an empty result is zeros, not NaN.
  KVSIFT_HD float inv_denominator() const { return d > 0.f ? 1.f / d : 0.f; }
};

/// Weight of a partial with log-sum-exp `lse_i` in a merge whose total log-sum-exp is `lse_total`.
KVSIFT_HD inline float lse_merge_weight(float lse_i, float lse_total) {
  return lse_i == -INFINITY ? 0.f : expf(lse_i - lse_total);
}

/// log(exp(a) + exp(b)), exact for -inf inputs.
KVSIFT_HD inline float lse_add(float a, float b) {
  const float m = fmaxf(a, b);
  if (m == -INFINITY) return -INFINITY;
  return m + logf(expf(a - m) + expf(b - m));
}

}  // namespace kvsift
