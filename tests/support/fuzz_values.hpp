#pragma once
// Adversarial value rows for the fuzz suites (host and GPU): what an op's inputs can hold in a real
// engine, not only U(-1, 1). Score rows (top-k, pooling, clustering) may hold every class the ops
// define an order or a result for: ties, +-0, +-inf, NaN, denormals, values near the type's maximum,
// all-equal rows. KV and query values stay finite (decode attention defines nothing for inf or NaN
// keys) but cover ties, denormals and large magnitudes whose logits stay finite.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "support/random.hpp"

namespace kvsift_test {
namespace fuzz {

enum class ScoreFill : int {
  kUniform, kFewValues, kAllEqual, kInfinities, kNaNs, kDenormals, kHuge, kSignedZeros, kAllNaN, kMixed, kCount
};

inline const char* name(ScoreFill f) {
  static const char* names[] = {"uniform", "few-values", "all-equal", "infinities", "NaNs",
                                "denormals", "huge", "signed-zeros", "all-NaN", "mixed"};
  return int(f) < int(ScoreFill::kCount) ? names[int(f)] : "?";
}

// One score; `largest` is the largest finite magnitude the row's type holds (65504 for fp16).
inline float score_value(std::mt19937_64& rng, ScoreFill f, float largest, float constant) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const int u = uniform_int(rng, 0, 15);
  switch (f) {
    case ScoreFill::kUniform: return std::uniform_real_distribution<float>(-4.f, 4.f)(rng);
    case ScoreFill::kFewValues: return float(u % 3) - 1.f;
    case ScoreFill::kAllEqual: return constant;
    case ScoreFill::kInfinities: return u < 3 ? inf : u < 6 ? -inf : float(u) * 0.5f;
    case ScoreFill::kNaNs: return u < 4 ? nan : u == 4 ? -inf : u == 5 ? inf : float(u) - 8.f;
    case ScoreFill::kDenormals:  // float denormals; in 16-bit types they round to the type's own
      return (u % 2 ? 1.f : -1.f) * std::numeric_limits<float>::denorm_min() * float(uniform_int(rng, 1, 1 << 20));
    case ScoreFill::kHuge: return (u % 2 ? 1.f : -1.f) * largest * (1.f - float(u) / 64.f);
    case ScoreFill::kSignedZeros: return u < 6 ? 0.f : u < 12 ? -0.f : u < 14 ? 1.f : -1.f;
    case ScoreFill::kAllNaN: return nan;
    case ScoreFill::kMixed:
    case ScoreFill::kCount: break;
  }
  return score_value(rng, ScoreFill(uniform_int(rng, 0, int(ScoreFill::kAllNaN))), largest, constant);
}

inline ScoreFill draw_score_fill(std::mt19937_64& rng) { return ScoreFill(uniform_int(rng, 0, int(ScoreFill::kCount) - 1)); }

// KV / query values. kHuge scales V (not K: logits stay finite) by a power of two, exact in every type.
enum class KvFill : int { kUniform, kFewValues, kAllEqualKeys, kDenormals, kHugeV, kPeaky, kCount };

inline const char* name(KvFill f) {
  static const char* names[] = {"uniform", "few-values", "all-equal-keys", "denormals", "huge-V", "peaky"};
  return int(f) < int(KvFill::kCount) ? names[int(f)] : "?";
}

inline KvFill draw_kv_fill(std::mt19937_64& rng) { return KvFill(uniform_int(rng, 0, int(KvFill::kCount) - 1)); }

struct KvValueRange {
  float k_scale = 1.f, v_scale = 1.f;  // multiply U(-1, 1) keys / values
  bool few_values = false, equal_keys = false, denormals = false;
  float denormal = 1e-40f;  // a denormal of the KV type (fp16: 1e-6)
};

// A key or value element for the fill; `is_key` picks K's rules.
inline float kv_value(std::mt19937_64& rng, const KvValueRange& r, bool is_key) {
  if (is_key && r.equal_keys) return 0.375f;
  if (r.few_values) return float(uniform_int(rng, -1, 1)) * (is_key ? r.k_scale : r.v_scale);
  if (r.denormals && uniform_int(rng, 0, 2) == 0) return (uniform_int(rng, 0, 1) ? r.denormal : -r.denormal) * float(uniform_int(rng, 1, 7));
  return std::uniform_real_distribution<float>(-1.f, 1.f)(rng) * (is_key ? r.k_scale : r.v_scale);
}

// The range of a fill for a KV type whose largest finite value is `largest` and smallest denormal-ish
// value is `denormal`.
inline KvValueRange kv_range(std::mt19937_64& rng, KvFill f, float largest, float denormal) {
  KvValueRange r;
  r.denormal = denormal;
  switch (f) {
    case KvFill::kUniform: break;
    case KvFill::kFewValues: r.few_values = true; break;
    case KvFill::kAllEqualKeys: r.equal_keys = true; break;
    case KvFill::kDenormals: r.denormals = true; break;
    case KvFill::kHugeV: {
      // Up to 2^-4 of the largest value: sums of a few hundred of them still fit the type.
      const int max_exp = std::max(1, int(std::log2(largest)) - 12);
      r.v_scale = std::ldexp(1.f, uniform_int(rng, max_exp / 2, max_exp));
      break;
    }
    case KvFill::kPeaky: r.k_scale = 6.f; break;  // logits of tens: a near one-hot softmax
    case KvFill::kCount: break;
  }
  return r;
}

}  // namespace fuzz
}  // namespace kvsift_test
