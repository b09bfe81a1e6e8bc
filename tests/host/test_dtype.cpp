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

// ---- fp8 -------------------------------------------------------------------------------------------

using kvsift::fp8_e4m3_t;
using kvsift::fp8_e5m2_t;

namespace {
// The value of an fp8 code recomputed from its fields with ldexp (a different formula than the
// converter); NaN for NaN codes, +-inf for E5M2's infinities.
double fp8_value(std::uint32_t b, int man_bits, int bias, bool ieee_specials) {
  const int sign = (b >> 7) & 1;
  const int exp_bits = 7 - man_bits;
  const int exp = int(b >> man_bits) & ((1 << exp_bits) - 1), man = int(b) & ((1 << man_bits) - 1);
  const int max_exp = (1 << exp_bits) - 1;
  double v;
  if (ieee_specials && exp == max_exp) v = man ? NAN : INFINITY;
  else if (!ieee_specials && exp == max_exp && man == (1 << man_bits) - 1) v = NAN;
  else if (exp == 0) v = std::ldexp(double(man), 1 - bias - man_bits);
  else v = std::ldexp(double(man | (1 << man_bits)), exp - bias - man_bits);
  return sign ? -v : v;
}

// Brute-force narrowing: the finite code nearest to x, ties to the even code (even mantissa), values
// beyond the largest finite saturating to it; NaN to 0x7f.
template <class T>
std::uint8_t nearest_fp8(float x) {
  if (std::isnan(x)) return 0x7f;
  const float maxv = kvsift::fp8_max_finite<T>();
  if (std::isinf(x)) return kvsift::from_float<T>(x > 0 ? maxv : -maxv).bits;  // checked separately
  std::uint8_t best = 0;
  double best_err = INFINITY;
  for (std::uint32_t b = 0; b < 256; ++b) {
    const float y = kvsift::to_float(T{std::uint8_t(b)});
    if (!std::isfinite(y)) continue;
    if (std::signbit(y) != std::signbit(x)) continue;  // keeps the sign of zero and of underflow
    const double err = std::fabs(double(y) - double(x));
    if (err < best_err || (err == best_err && (b & 1u) == 0)) {
      best = std::uint8_t(b);
      best_err = err;
    }
  }
  return best;
}

template <class T>
void check_fp8_narrowing(std::mt19937_64& rng) {
  // Every finite code, the midpoints between neighbours and one float ulp either side of them.
  for (std::uint32_t b = 0; b < 256; ++b) {
    const float y = kvsift::to_float(T{std::uint8_t(b)});
    if (!std::isfinite(y)) continue;
    if (y != 0.f || b == 0 || b == 0x80) REQUIRE(kvsift::from_float<T>(y).bits == b);
    const float next = kvsift::to_float(T{std::uint8_t(b + 1)});
    if ((b & 0x7f) == 0x7f || !std::isfinite(next)) continue;
    const float mid = float((double(y) + double(next)) / 2);  // exact: fp8 neighbours are close in float
    for (float x : {mid, std::nextafter(mid, 0.f), std::nextafter(mid, INFINITY), std::nextafter(mid, -INFINITY)})
      REQUIRE_MESSAGE(kvsift::from_float<T>(x).bits == nearest_fp8<T>(x), "x = " << x << " code " << b);
  }
  // Random magnitudes over the whole float range, subnormals and overflows included.
  std::uniform_real_distribution<float> mag(-30.f, 20.f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::exp2(mag(rng)) * (i % 2 ? -1.f : 1.f);
    REQUIRE_MESSAGE(kvsift::from_float<T>(x).bits == nearest_fp8<T>(x), "x = " << x);
  }
}
}  // namespace

TEST_CASE("fp8 widening matches the E4M3 / E5M2 encodings on every code") {
  int nan4 = 0;
  for (std::uint32_t b = 0; b < 256; ++b) {
    const double e4 = fp8_value(b, 3, 7, false), e5 = fp8_value(b, 2, 15, true);
    const float g4 = kvsift::to_float(fp8_e4m3_t{std::uint8_t(b)}), g5 = kvsift::to_float(fp8_e5m2_t{std::uint8_t(b)});
    if (std::isnan(e4)) {
      ++nan4;
      REQUIRE(std::isnan(g4));
    } else {
      REQUIRE(double(g4) == e4);
      REQUIRE(std::signbit(g4) == bool(b & 0x80));
    }
    if (std::isnan(e5)) REQUIRE(std::isnan(g5));
    else REQUIRE(double(g5) == e5);
  }
  CHECK(nan4 == 2);  // only 0x7f and 0xff
  CHECK(kvsift::to_float(fp8_e4m3_t{0x7e}) == 448.f);
  CHECK(kvsift::to_float(fp8_e4m3_t{0x01}) == std::ldexp(1.f, -9));
  CHECK(kvsift::to_float(fp8_e5m2_t{0x7b}) == 57344.f);
  CHECK(kvsift::to_float(fp8_e5m2_t{0x7c}) == INFINITY);
  CHECK(kvsift::to_float(fp8_e5m2_t{0x01}) == std::ldexp(1.f, -16));
  // The packed pair helper gives the per-byte conversion in each half.
  for (std::uint32_t b = 0; b < 0x10000u; b += 7) {
    const std::uint32_t h2 = kvsift::detail::e4m3x2_bits_to_half2_bits(std::uint16_t(b));
    REQUIRE((h2 & 0xffffu) == kvsift::detail::e4m3_bits_to_half_bits(std::uint8_t(b & 0xff)));
    REQUIRE((h2 >> 16) == kvsift::detail::e4m3_bits_to_half_bits(std::uint8_t(b >> 8)));
  }
}

TEST_CASE("fp8 narrowing rounds to nearest even and saturates to the finite max") {
  auto rng = kvsift_test::make_rng(14);
  check_fp8_narrowing<fp8_e4m3_t>(rng);
  check_fp8_narrowing<fp8_e5m2_t>(rng);
}

TEST_CASE("fp8 special values: saturation, NaN, signed zero, ties") {
  const float inf = std::numeric_limits<float>::infinity();
  // E4M3: 448 is the max; 464 (max + half ulp) ties to 448 (even); anything above saturates.
  CHECK(kvsift::from_float<fp8_e4m3_t>(448.f).bits == 0x7e);
  CHECK(kvsift::from_float<fp8_e4m3_t>(464.f).bits == 0x7e);
  CHECK(kvsift::from_float<fp8_e4m3_t>(465.f).bits == 0x7e);
  CHECK(kvsift::from_float<fp8_e4m3_t>(1e30f).bits == 0x7e);
  CHECK(kvsift::from_float<fp8_e4m3_t>(inf).bits == 0x7e);
  CHECK(kvsift::from_float<fp8_e4m3_t>(-inf).bits == 0xfe);
  CHECK(kvsift::from_float<fp8_e4m3_t>(NAN).bits == 0x7f);
  CHECK(kvsift::from_float<fp8_e4m3_t>(-NAN).bits == 0x7f);
  CHECK(std::isnan(kvsift::to_float(kvsift::from_float<fp8_e4m3_t>(NAN))));
  CHECK(kvsift::from_float<fp8_e4m3_t>(-0.f).bits == 0x80);
  CHECK(kvsift::from_float<fp8_e4m3_t>(std::ldexp(1.f, -10)).bits == 0x00);   // half the smallest subnormal: tie to 0
  CHECK(kvsift::from_float<fp8_e4m3_t>(-std::ldexp(1.f, -10)).bits == 0x80);
  CHECK(kvsift::from_float<fp8_e4m3_t>(std::ldexp(1.5f, -10)).bits == 0x01);
  CHECK(kvsift::from_float<fp8_e4m3_t>(std::ldexp(3.f, -10)).bits == 0x02);   // 1.5 subnormal units: tie to even 2
  CHECK(kvsift::from_float<fp8_e4m3_t>(1.f + 1.f / 16).bits == 0x38);         // 1 + half ulp: tie to 1.0
  CHECK(kvsift::from_float<fp8_e4m3_t>(1.f + 3.f / 16).bits == 0x3a);         // 1.125 + half ulp: tie to 1.25
  CHECK(kvsift::from_float<fp8_e4m3_t>(std::ldexp(15.f, -10)).bits == 0x08);  // 7.5 units: rounds up to the smallest normal
  // E5M2: 57344 is the max; 61440 (max + half ulp) would round to infinity, so it saturates.
  CHECK(kvsift::from_float<fp8_e5m2_t>(57344.f).bits == 0x7b);
  CHECK(kvsift::from_float<fp8_e5m2_t>(61439.f).bits == 0x7b);
  CHECK(kvsift::from_float<fp8_e5m2_t>(61440.f).bits == 0x7b);
  CHECK(kvsift::from_float<fp8_e5m2_t>(inf).bits == 0x7b);
  CHECK(kvsift::from_float<fp8_e5m2_t>(-inf).bits == 0xfb);
  CHECK(kvsift::from_float<fp8_e5m2_t>(NAN).bits == 0x7f);
  CHECK(kvsift::from_float<fp8_e5m2_t>(std::ldexp(1.f, -17)).bits == 0x00);
  CHECK(kvsift::from_float<fp8_e5m2_t>(std::ldexp(1.f, -16)).bits == 0x01);
}

TEST_CASE("fp8 traits: KV storage types, not query types") {
  static_assert(kvsift::is_fp8_dtype<fp8_e4m3_t>::value && kvsift::is_fp8_dtype<const fp8_e5m2_t>::value);
  static_assert(!kvsift::is_fp8_dtype<half_t>::value && !kvsift::is_fp8_dtype<double>::value);
  static_assert(!kvsift::is_supported_dtype<fp8_e4m3_t>::value && !kvsift::is_supported_dtype<const fp8_e5m2_t>::value);
  static_assert(kvsift::is_kv_dtype<fp8_e4m3_t>::value && kvsift::is_kv_dtype<const fp8_e5m2_t>::value);
  static_assert(kvsift::is_kv_dtype<bfloat16_t>::value && kvsift::is_kv_dtype<float>::value);
  static_assert(!kvsift::is_kv_dtype<double>::value);
  static_assert(sizeof(fp8_e4m3_t) == 1 && sizeof(fp8_e5m2_t) == 1);
  static_assert(kvsift::fp8_max_finite<fp8_e4m3_t>() == 448.f && kvsift::fp8_max_finite<fp8_e5m2_t>() == 57344.f);
  CHECK(kvsift::dtype_traits<fp8_e4m3_t>::dtype == kvsift::DType::kFp8E4M3);
  CHECK(std::string(kvsift::to_string(kvsift::DType::kFp8E4M3)) == "float8_e4m3");
  CHECK(std::string(kvsift::to_string(kvsift::DType::kFp8E5M2)) == "float8_e5m2");
}
