#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kvsift/core/online_softmax.hpp"
#include "support/random.hpp"

namespace {
double exact_lse(const std::vector<float>& x) {
  double m = -INFINITY;
  for (float v : x) m = std::max(m, double(v));
  if (m == -INFINITY) return -INFINITY;
  double s = 0;
  for (float v : x) s += std::exp(double(v) - m);
  return m + std::log(s);
}
// Weighted sum of values with softmax weights, via the online state.
kvsift::SoftmaxState run(const std::vector<float>& x, const std::vector<float>& val, float* acc) {
  kvsift::SoftmaxState s;
  *acc = 0.f;
  for (std::size_t i = 0; i < x.size(); ++i) {
    float p;
    const float scale = s.push(x[i], &p);
    *acc = *acc * scale + p * val[i];
  }
  return s;
}
}  // namespace

TEST_CASE("online softmax: one pass equals the two-pass softmax") {
  auto rng = kvsift_test::make_rng(2);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = kvsift_test::uniform_int(rng, 1, 300);
    auto x = kvsift_test::random_values<float>(rng, n, -30.f, 30.f);
    auto val = kvsift_test::random_values<float>(rng, n);
    float acc;
    const auto s = run(x, val, &acc);
    const double lse = exact_lse(x);
    CHECK(s.lse() == doctest::Approx(lse).epsilon(1e-6));
    double expect = 0;
    for (int i = 0; i < n; ++i) expect += std::exp(double(x[i]) - lse) * val[i];
    CHECK(acc * s.inv_denominator() == doctest::Approx(expect).epsilon(1e-5));
  }
}

TEST_CASE("online softmax: merging partials over split keys is exact, empty splits are identities") {
  auto rng = kvsift_test::make_rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = kvsift_test::uniform_int(rng, 2, 200);
    const int cut = kvsift_test::uniform_int(rng, 0, n);  // cut == 0 or n makes one split empty
    auto x = kvsift_test::random_values<float>(rng, n, -10.f, 10.f);
    auto val = kvsift_test::random_values<float>(rng, n);
    std::vector<float> x1(x.begin(), x.begin() + cut), x2(x.begin() + cut, x.end());
    std::vector<float> v1(val.begin(), val.begin() + cut), v2(val.begin() + cut, val.end());
    float a1, a2, a;
    auto s1 = run(x1, v1, &a1);
    const auto s2 = run(x2, v2, &a2);
    const auto s = run(x, val, &a);
    float f1, f2;
    s1.merge(s2, &f1, &f2);
    const float merged = a1 * f1 + a2 * f2;
    CHECK(s1.lse() == doctest::Approx(s.lse()).epsilon(1e-6));
    CHECK(merged * s1.inv_denominator() == doctest::Approx(a * s.inv_denominator()).epsilon(1e-5));
    // The LSE-weight form of the same merge.
    const float total = kvsift::lse_add(s2.lse(), run(x1, v1, &a1).lse());
    CHECK(total == doctest::Approx(s.lse()).epsilon(1e-6));
  }
}

TEST_CASE("online softmax: empty and all -inf inputs give zeros and -inf, never NaN") {
  kvsift::SoftmaxState empty;
  CHECK(empty.lse() == -INFINITY);
  CHECK(empty.inv_denominator() == 0.f);
  float acc;
  const auto s = run({-INFINITY, -INFINITY}, {1.f, 2.f}, &acc);
  CHECK(s.lse() == -INFINITY);
  CHECK(acc * s.inv_denominator() == 0.f);
  kvsift::SoftmaxState a, b;
  float fa, fb;
  a.merge(b, &fa, &fb);
  CHECK(fa == 0.f);
  CHECK(fb == 0.f);
  CHECK(a.lse() == -INFINITY);
  CHECK(kvsift::lse_merge_weight(-INFINITY, 0.f) == 0.f);
  CHECK(kvsift::lse_add(-INFINITY, -INFINITY) == -INFINITY);
}
