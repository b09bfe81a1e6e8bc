// GPU fuzz, HardKuma gate ops: cuda:: against host:: on random gate vectors, outputs poisoned before
// every launch. Both backends run the same KVSIFT_HD code, so the uniforms are bitwise equal and the
// gates agree to a few ulps (libm differs: the tolerance of test_hardkuma_gpu, 8 ulps relative plus
// an absolute floor of a float ulp of 1 for gates near 0); gate mixing is fma-explicit on both sides
// and must agree bitwise. Drawn per case: n 1-5000, shapes log-uniform over [1e-7, 200] (below and
// above the clamp to [1e-6, 100]), the clamp on or off (off: valid shapes only), stretched supports,
// sample eps, Philox keys and offsets; mixing shapes with padded rows, gates 0 and 1 exactly.
//
// Family weight 0.10 of test_fuzz_gpu's cases, 0.08 of its seconds.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "support/device_buffer.cuh"
#include "support/fuzz.hpp"
#include "support/fuzz_values.hpp"

namespace {

namespace fz = kvsift_test::fuzz;
using fz::chance;
using fz::pick;
using kvsift_test::DeviceBuffer;

template <class T>
void fuzz_sample(std::mt19937_64& rng, std::string* what) {
  const int n = chance(rng, 20) ? pick(rng, 1, 8) : pick(rng, 1, 5000);
  kvsift::HardKumaOptions o;
  o.clamp_shape = chance(rng, 80);
  o.l = -std::uniform_real_distribution<double>(0.01, 0.5)(rng);
  o.r = 1.0 + std::uniform_real_distribution<double>(0.01, 0.5)(rng);
  o.sample_eps = std::uniform_real_distribution<double>(1e-6, 1e-2)(rng);
  const double lo = o.clamp_shape ? 1e-7 : 1e-3, hi = o.clamp_shape ? 200.0 : 50.0;
  std::uniform_real_distribution<double> d(std::log(lo), std::log(hi));
  std::vector<T> a(static_cast<std::size_t>(n)), b(static_cast<std::size_t>(n));
  for (auto& x : a) x = T(std::exp(d(rng)));
  for (auto& x : b) x = T(std::exp(d(rng)));
  const kvsift::PhiloxStream stream{rng(), chance(rng, 50) ? rng() : std::uint64_t(pick(rng, 0, 9))};
  *what = std::string("hardkuma_sample ") + (sizeof(T) == 4 ? "float" : "double") + " n=" + std::to_string(n) +
          " clamp=" + std::to_string(o.clamp_shape) + " l=" + std::to_string(o.l) + " r=" + std::to_string(o.r) +
          " eps=" + std::to_string(o.sample_eps);
  std::vector<T> h(a.size()), k(a.size()), u(a.size());
  REQUIRE(kvsift::host::hardkuma_sample(kvsift::host::Exec{}, o, a.data(), b.data(), n, stream, h.data(), k.data(), u.data()).ok());
  DeviceBuffer<T> da(a), db(b), dh(a.size()), dk(a.size()), du(a.size());
  dh.poison();
  dk.poison();
  du.poison();
  REQUIRE(kvsift::cuda::hardkuma_sample(kvsift::cuda::Exec{}, o, da.get(), db.get(), n, stream, dh.get(), dk.get(), du.get()).ok());
  kvsift_test::sync_and_check();
  const double eps = sizeof(T) == 4 ? 6e-8 : 1.2e-16;
  const auto gh = dh.download(), gk = dk.download(), gu = du.download();
  for (int i = 0; i < n; ++i) {
    INFO("gate " << i << " a " << double(a[std::size_t(i)]) << " b " << double(b[std::size_t(i)]));
    REQUIRE(std::memcmp(&gu[std::size_t(i)], &u[std::size_t(i)], sizeof(T)) == 0);
    // k = (1 - (1 - u)^(1/b))^(1/a) amplifies rounding: y = (1 - u)^(1/b) carries ~eps (1 + |ln y|),
    // x = 1 - y multiplies that by y / x and adds its own rounding (eps: near x = 1 that is the whole
    // error), and the exponent 1/a multiplies x's relative error. Backends with different pow/log
    // roundings agree to that condition number, not to a fixed 16 ulp (a = 0.001, x = 1 - 6e-8 rounds
    // to 1 on one backend: k = 1 against 0.99994).
    const double ae = o.clamp_shape ? std::clamp(double(a[std::size_t(i)]), 1e-6, 100.0) : double(a[std::size_t(i)]);
    const double be = o.clamp_shape ? std::clamp(double(b[std::size_t(i)]), 1e-6, 100.0) : double(b[std::size_t(i)]);
    const double uu = double(u[std::size_t(i)]);
    const double y = std::pow(1.0 - uu, 1.0 / be), x = 1.0 - y;
    const double kd = std::fabs(double(k[std::size_t(i)]));
    const double cond = 1.0 + std::fabs(std::log(std::max(kd, 1e-300))) +
                        (x > 0.0 ? (1.0 / ae) * (1.0 + (1.0 + std::fabs(std::log(std::max(y, 1e-300)))) * (y / x)) : 1e30);
    const double rel = 16 * eps * cond;
    // Below the smallest normal the spacing is absolute (a = 0.018: k = 2.1e-42, the backends one
    // denormal step apart), so 16 of those steps are allowed on top of the relative bound.
    const double denorm = double(std::numeric_limits<T>::denorm_min());
    REQUIRE_MESSAGE(std::fabs(double(gk[std::size_t(i)]) - double(k[std::size_t(i)])) <= rel * kd + 16 * denorm,
                    "k ", double(gk[std::size_t(i)]), " vs ", double(k[std::size_t(i)]), " (condition ", cond, ")");
    // h = clip(l + (r - l) k, 0, 1): k's error scaled by (r - l), plus one rounding.
    REQUIRE_MESSAGE(std::fabs(double(gh[std::size_t(i)]) - double(h[std::size_t(i)])) <=
                        (o.r - o.l) * rel * kd + 16 * eps + 1e-7,
                    "h ", double(gh[std::size_t(i)]), " vs ", double(h[std::size_t(i)]));
  }
}

template <class T>
void fuzz_mix(std::mt19937_64& rng, std::string* what) {
  kvsift::GateMixShape s;
  s.tokens = pick(rng, 0, 40);
  s.kv_heads = pick(rng, 1, 8);
  s.q_heads = s.kv_heads * pick(rng, 1, 4);
  s.head_dim = fz::one_of(rng, {1, 7, 64, 128});
  s.token_stride = chance(rng, 50) ? -1 : std::int64_t(s.q_heads) * s.head_dim + pick(rng, 0, 9);
  const std::size_t size = std::size_t(std::max<std::int64_t>(1, s.tokens * s.row_stride()));
  const fz::ScoreFill fills[] = {fz::ScoreFill::kUniform, fz::ScoreFill::kDenormals, fz::ScoreFill::kSignedZeros,
                                 fz::ScoreFill::kFewValues};
  const fz::ScoreFill fill = fz::one_of(rng, fills);
  std::vector<T> dense(size), sparse(size);
  for (auto& x : dense) x = kvsift::from_float<T>(fz::score_value(rng, fill, 1e4f, 0.f));
  for (auto& x : sparse) x = kvsift::from_float<T>(fz::score_value(rng, fill, 1e4f, 0.f));
  std::vector<float> z(std::size_t(s.kv_heads));
  for (auto& x : z) x = chance(rng, 25) ? float(pick(rng, 0, 1)) : std::uniform_real_distribution<float>(0, 1)(rng);
  *what = "gate_mix tokens=" + std::to_string(s.tokens) + " q_heads=" + std::to_string(s.q_heads) + " kv_heads=" +
          std::to_string(s.kv_heads) + " d=" + std::to_string(s.head_dim) + " stride=" + std::to_string(s.token_stride) +
          " fill=" + fz::name(fill);
  DeviceBuffer<T> dd(dense), ds(sparse), dout(size);
  DeviceBuffer<float> dz(z);
  dout.poison();
  std::vector<T> want = dout.download();  // the host output starts as the poison too: padding compares
  REQUIRE(kvsift::host::gate_mix_forward(kvsift::host::Exec{}, s, z.data(), dense.data(), sparse.data(), want.data()).ok());
  REQUIRE(kvsift::cuda::gate_mix_forward(kvsift::cuda::Exec{}, s, dz.get(), dd.get(), ds.get(), dout.get()).ok());
  kvsift_test::sync_and_check();
  const auto got = dout.download();
  for (std::size_t i = 0; i < size; ++i) REQUIRE_MESSAGE(std::memcmp(&got[i], &want[i], sizeof(T)) == 0, "element ", i);
}

}  // namespace

TEST_CASE("fuzz gpu: HardKuma gate ops against the host reference") {
  for (fz::Family f("gpu gates", 0.10, "fuzz gpu: HardKuma gate ops against the host reference", 0.08); f.next();) {
    auto rng = f.rng();
    std::string what;
    INFO(f.replay());
    INFO(what);
    switch (f.index() % 5) {
      case 0: fuzz_sample<float>(rng, &what); break;
      case 1: fuzz_sample<double>(rng, &what); break;
      case 2: fuzz_mix<float>(rng, &what); break;
      case 3: fuzz_mix<kvsift::bfloat16_t>(rng, &what); break;
      default: fuzz_mix<kvsift::half_t>(rng, &what); break;
    }
  }
}
