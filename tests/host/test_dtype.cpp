#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "kvsift/core/dtype.hpp"
#include "support/random.hpp"

using kvsift::bfloat16_t;
using kvsift::half_t;

namespace {
// Reference narrowing by brute force: the representable value nearest to x, ties to even bits.
template <class T>
std::uint16_t nearest_bits(float x) {
  std::uint16_t best = 0;
  double best_err = INFINITY;
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const float y = kvsift::to_float(T{std::uint16_t(b)});
    if (!std::isfinite(y)) continue;
    const double err = std::fabs(double(y) - double(x));
    if (err < best_err || (err == best_err && (b & 1u) == 0)) {
      best = std::uint16_t(b);
      best_err = err;
    }
  }
  return best;
}
}  // namespace

TEST_CASE("half_t widening matches IEEE binary16 on every bit pattern") {
  // Recompute each value from its fields with ldexp; a different formula than the converter.
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const int sign = (b >> 15) & 1, exp = (b >> 10) & 31, man = b & 1023;
    double expect;
    if (exp == 31) expect = man ? NAN : INFINITY;
    else if (exp == 0) expect = std::ldexp(double(man), -24);
    else expect = std::ldexp(double(man | 1024), exp - 25);
    if (sign) expect = -expect;
    const float got = kvsift::to_float(half_t{std::uint16_t(b)});
    if (std::isnan(expect)) CHECK(std::isnan(got));
    else REQUIRE(double(got) == expect);
  }
}

TEST_CASE("half_t and bfloat16_t narrowing round to nearest even") {
  auto rng = kvsift_test::make_rng(1);
  std::uniform_real_distribution<float> mag(-20.f, 17.f);
  for (int i = 0; i < 300; ++i) {
    float x = std::exp2(mag(rng)) * (i % 2 ? -1.f : 1.f);
    if (std::fabs(x) >= 65504.f) x = 60000.f;
    CHECK(kvsift::from_float<half_t>(x).bits == nearest_bits<half_t>(x));
    CHECK(kvsift::from_float<bfloat16_t>(x).bits == nearest_bits<bfloat16_t>(x));
  }
  // Exact halfway cases go to the even neighbour.
  CHECK(kvsift::from_float<half_t>(1.f + std::ldexp(1.f, -11)).bits == 0x3c00);
  CHECK(kvsift::from_float<half_t>(1.f + 3 * std::ldexp(1.f, -11)).bits == 0x3c02);
  CHECK(kvsift::from_float<bfloat16_t>(1.f + std::ldexp(1.f, -8)).bits == 0x3f80);
}

TEST_CASE("special values survive the round trip") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(kvsift::to_float(kvsift::from_float<half_t>(inf)) == inf);
  CHECK(kvsift::to_float(kvsift::from_float<half_t>(-inf)) == -inf);
  CHECK(kvsift::to_float(kvsift::from_float<half_t>(1e6f)) == inf);  // overflow
  CHECK(std::isnan(kvsift::to_float(kvsift::from_float<half_t>(NAN))));
  CHECK(kvsift::to_float(kvsift::from_float<bfloat16_t>(-inf)) == -inf);
  CHECK(std::isnan(kvsift::to_float(kvsift::from_float<bfloat16_t>(NAN))));
  CHECK(kvsift::from_float<half_t>(-0.f).bits == 0x8000);
  CHECK(kvsift::to_float(kvsift::from_float<half_t>(5.96046448e-08f)) == 5.96046448e-08f);  // smallest subnormal
}

TEST_CASE("dtype traits name the types and accumulate in float") {
  CHECK(kvsift::dtype_traits<float>::dtype == kvsift::DType::kFloat32);
  CHECK(kvsift::dtype_traits<half_t>::dtype == kvsift::DType::kFloat16);
  CHECK(kvsift::dtype_traits<const bfloat16_t>::dtype == kvsift::DType::kBFloat16);
  static_assert(std::is_same_v<kvsift::dtype_traits<bfloat16_t>::accum_type, float>);
  static_assert(kvsift::is_supported_dtype<half_t>::value);
  static_assert(!kvsift::is_supported_dtype<double>::value);
  CHECK(std::string(kvsift::to_string(kvsift::DType::kBFloat16)) == "bfloat16");
}
