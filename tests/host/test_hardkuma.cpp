// HardKuma gates on the host: Philox known answers, the test vectors of docs/algorithms/hardkuma.md §11,
// identities, round trips, gradients against central differences, Monte Carlo checks of the closed
// forms, bad input, output mixing, the Lagrangian on a toy problem, AdamW, role extraction, the
// roles file, and the one op shape (workspace queries, an Exec without device facts).

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kvsift/kvsift.hpp"
#include "support/random.hpp"

using namespace kvsift;

namespace {

host::Exec cpu;

HardKumaOptions unclamped() {
  HardKumaOptions o;
  o.clamp_shape = false;
  o.clamp_prob_zero = false;
  return o;
}

// Central difference of f at x with a relative step.
template <class F>
double central_difference(F f, double x) {
  const double h = 1e-6 * (std::fabs(x) > 1e-3 ? std::fabs(x) : 1e-3);
  return (f(x + h) - f(x - h)) / (2 * h);
}

void check_close(double got, double want, double rel, double abs_tol, const char* what) {
  INFO(what, ": got ", got, ", want ", want);
  CHECK(std::fabs(got - want) <= abs_tol + rel * std::fabs(want));
}

// A spread of shapes including the clamp bounds.
const std::vector<double> kShapes = {1e-6, 1e-3, 0.05, 0.3, 0.7, 1.0, 1.3, 2.0, 5.0, 20.0, 100.0};

struct SpecRow {
  double a, b, p0, p1, pmid, l0, kuma_mean, mean;
};
// docs/algorithms/hardkuma.md §11.2, l = -0.1, r = 1.1.
const SpecRow kSpecTable[] = {
    {1, 1, 0.083333, 0.083333, 0.833333, 0.916667, 0.500000, 0.500000},
    {0.5, 2, 0.494017, 0.001812, 0.504171, 0.505983, 0.166667, 0.134264},
    {3, 0.7, 0.000405, 0.357168, 0.642427, 0.999595, 0.799756, 0.838237},
    {2, 5, 0.034243, 0.000104, 0.965653, 0.965757, 0.369408, 0.344436},
    {0.3, 0.3, 0.175541, 0.333666, 0.490793, 0.824459, 0.592431, 0.598252},
    {5, 0.2, 0.000001, 0.811893, 0.188106, 0.999999, 0.950150, 0.971489},
};

}  // namespace

// ---------------------------------------------------------------- Philox

TEST_CASE("philox4x32-10 reproduces the Random123 known-answer vectors") {
  struct Kat {
    PhiloxBlock counter;
    PhiloxKey key;
    PhiloxBlock expected;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, {{0, 0}}, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       {{0xffffffffu, 0xffffffffu}},
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       {{0xa4093822u, 0x299f31d0u}},
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const Kat& k : kats) {
    const PhiloxBlock out = philox4x32_10(k.counter, k.key);
    for (int i = 0; i < 4; ++i) CHECK(out.w[i] == k.expected.w[i]);
  }
}

TEST_CASE("philox uniforms lie strictly inside (0, 1) and differ across index, offset and seed") {
  CHECK(uniform_float_from_bits(0u) > 0.f);
  CHECK(uniform_float_from_bits(0xffffffffu) < 1.f);
  CHECK(uniform_double_from_bits(0u, 0u) > 0.0);
  CHECK(uniform_double_from_bits(0xffffffffu, 0xffffffffu) < 1.0);
  const PhiloxStream s{42, 7};
  CHECK(philox_uniform<float>(s, 0) != philox_uniform<float>(s, 1));
  CHECK(philox_uniform<double>(s, 0) != philox_uniform<double>(PhiloxStream{42, 8}, 0));
  CHECK(philox_uniform<double>(s, 0) != philox_uniform<double>(PhiloxStream{43, 7}, 0));
  CHECK(philox_uniform<double>(s, 5) == philox_uniform<double>(PhiloxStream{42, 7}, 5));  // a pure function
  // Mean and variance of 1e5 draws: U(0,1) has 1/2 and 1/12.
  double sum = 0, sum2 = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double u = philox_uniform<double>(s, std::uint64_t(i));
    sum += u;
    sum2 += u * u;
  }
  check_close(sum / n, 0.5, 0, 5 * std::sqrt(1.0 / 12 / n), "mean of uniforms");
  check_close(sum2 / n - (sum / n) * (sum / n), 1.0 / 12, 0, 5e-3, "variance of uniforms");
}

// ---------------------------------------------------------------- test vectors (docs/algorithms/hardkuma.md §11)

TEST_CASE("HardKuma test vectors (§11.2): probabilities and means of the six (a, b) rows, double, to 1e-6") {
  const HardKumaSupport<double> s{-0.1, 1.1};
  check_close(s.c0(), 1.0 / 12, 0, 1e-15, "c0");
  check_close(s.c1(), 11.0 / 12, 0, 1e-15, "c1");
  for (const SpecRow& r : kSpecTable) {
    CAPTURE(r.a);
    CAPTURE(r.b);
    check_close(hardkuma_prob_zero(r.a, r.b, s), r.p0, 0, 1e-6, "P(h=0)");
    check_close(hardkuma_prob_one(r.a, r.b, s), r.p1, 0, 1e-6, "P(h=1)");
    check_close(hardkuma_prob_interior(r.a, r.b, s), r.pmid, 0, 1e-6, "P(0<h<1)");
    check_close(hardkuma_prob_nonzero(r.a, r.b, s), r.l0, 0, 1e-6, "1-P(h=0)");
    check_close(kumaraswamy_mean(r.a, r.b), r.kuma_mean, 0, 1e-6, "E[K]");
    check_close(hardkuma_mean(r.a, r.b, s), r.mean, 0, 1e-6, "E[h]");
  }
}

TEST_CASE("HardKuma test vectors (§11.2) through the batched host op, float and double, default (reference) clamps") {
  const int n = int(sizeof kSpecTable / sizeof kSpecTable[0]);
  auto run = [&](auto zero, double tol) {
    using T = decltype(zero);
    std::vector<T> a(n), b(n), p0(n), p1(n), pm(n), l0(n), ek(n), eh(n);
    for (int i = 0; i < n; ++i) {
      a[i] = T(kSpecTable[i].a);
      b[i] = T(kSpecTable[i].b);
    }
    GateStatsOutputs<T> out;
    out.prob_zero = p0.data();
    out.prob_one = p1.data();
    out.prob_interior = pm.data();
    out.expected_l0 = l0.data();
    out.kuma_mean = ek.data();
    out.mean = eh.data();
    REQUIRE(host::hardkuma_stats(cpu, HardKumaOptions{}, a.data(), b.data(), n, out).ok());
    for (int i = 0; i < n; ++i) {
      CAPTURE(i);
      check_close(p0[i], kSpecTable[i].p0, 0, tol, "P(h=0)");
      check_close(p1[i], kSpecTable[i].p1, 0, tol, "P(h=1)");
      check_close(pm[i], kSpecTable[i].pmid, 0, tol, "P(0<h<1)");
      check_close(l0[i], kSpecTable[i].l0, 0, tol, "1-P(h=0)");
      check_close(ek[i], kSpecTable[i].kuma_mean, 0, tol, "E[K]");
      check_close(eh[i], kSpecTable[i].mean, 0, tol, "E[h]");
    }
  };
  run(0.0, 1e-6);
  run(0.0f, 1.5e-6);  // the table is rounded to 1e-6; float adds a few ulps of 1
}

TEST_CASE("HardKuma test vector §11.1: the reparameterised sample a=1.3, b=0.7, u=0.3 and its gradient") {
  const HardKumaSupport<double> s{-0.1, 1.1};
  const HardKumaDraw<double> d = hardkuma_reparameterize(0.3, 1.3, 0.7, s);
  check_close(d.k, 0.4934519, 0, 1e-6, "k");
  check_close(d.h, 0.4921423, 0, 1e-6, "h");
  const ShapeGradient<double> g = kumaraswamy_sample_grad(0.3, 1.3, 0.7);
  check_close(g.da, 0.2681076, 0, 1e-6, "dk/da");
  check_close(g.db, -0.4157873, 0, 1e-6, "dk/db");
  // And in float.
  const HardKumaDraw<float> df = hardkuma_reparameterize(0.3f, 1.3f, 0.7f, HardKumaSupport<float>{});
  check_close(df.k, 0.4934519, 0, 1e-6, "float k");
  check_close(df.h, 0.4921423, 0, 1e-6, "float h");
  const ShapeGradient<float> gf = kumaraswamy_sample_grad(0.3f, 1.3f, 0.7f);
  check_close(gf.da, 0.2681076, 0, 2e-6, "float dk/da");
  check_close(gf.db, -0.4157873, 0, 2e-6, "float dk/db");
}

// ---------------------------------------------------------------- identities and round trips

TEST_CASE("P(h=0) + P(h=1) + P(0<h<1) = 1 and P(h!=0) = 1 - P(h=0) over the shape grid") {
  for (double l : {-0.1, -0.5, -1e-3}) {
    for (double r : {1.1, 1.5, 1.001}) {
      const HardKumaSupport<double> s{l, r};
      for (double a : kShapes)
        for (double b : kShapes) {
          CAPTURE(a);
          CAPTURE(b);
          const double p0 = hardkuma_prob_zero(a, b, s), p1 = hardkuma_prob_one(a, b, s);
          const double pm = hardkuma_prob_interior(a, b, s);
          CHECK(p0 >= 0.0);
          CHECK(p1 >= 0.0);
          CHECK(pm >= 0.0);
          check_close(p0 + p1 + pm, 1.0, 0, 1e-12, "P0 + P1 + Pmid");
          check_close(hardkuma_prob_nonzero(a, b, s), 1.0 - p0, 0, 1e-12, "P(h!=0)");
          const float p0f = hardkuma_prob_zero(float(a), float(b), HardKumaSupport<float>{float(l), float(r)});
          const float p1f = hardkuma_prob_one(float(a), float(b), HardKumaSupport<float>{float(l), float(r)});
          const float pmf = hardkuma_prob_interior(float(a), float(b), HardKumaSupport<float>{float(l), float(r)});
          check_close(p0f + p1f + pmf, 1.0, 0, 1e-5, "float P0 + P1 + Pmid");
        }
    }
  }
}

TEST_CASE("Kuma(1, 1) is Uniform(0, 1)") {
  for (double x : {0.01, 0.25, 0.5, 0.9}) {
    check_close(kumaraswamy_cdf(x, 1.0, 1.0), x, 0, 1e-15, "cdf");
    check_close(kumaraswamy_inv_cdf(x, 1.0, 1.0), x, 0, 1e-15, "inv cdf");
    check_close(kumaraswamy_log_pdf(x, 1.0, 1.0), 0.0, 0, 1e-15, "log pdf");
  }
  check_close(kumaraswamy_mean(1.0, 1.0), 0.5, 0, 1e-15, "mean");
}

TEST_CASE("cdf and inverse cdf round trips, Kumaraswamy and HardKuma") {
  const HardKumaSupport<double> s{-0.1, 1.1};
  for (double a : {0.05, 0.3, 1.0, 2.5, 20.0})
    for (double b : {0.05, 0.3, 1.0, 2.5, 20.0}) {
      CAPTURE(a);
      CAPTURE(b);
      for (double u : {1e-3, 0.1, 0.37, 0.5, 0.8, 0.999}) {
        const double k = kumaraswamy_inv_cdf(u, a, b);
        // Skip k within 1e-6 of 0 or 1, where doubles cannot resolve k well enough to invert back.
        if (k > 1e-6 && k < 1.0 - 1e-6) check_close(kumaraswamy_cdf(k, a, b), u, 1e-9, 0, "F(F^-1(u))");
      }
      for (double x : {0.02, 0.3, 0.5, 0.77, 0.98}) {
        const double u = hardkuma_cdf(x, a, b, s);
        if (u > 1e-6 && u < 1 - 1e-6) check_close(hardkuma_inv_cdf(u, a, b, s), x, 1e-7, 1e-9, "G^-1(G(x))");
      }
      // The cdf at the edges carries the point masses.
      check_close(hardkuma_cdf(0.0, a, b, s), hardkuma_prob_zero(a, b, s), 0, 1e-15, "G(0) = P0");
      check_close(1.0 - hardkuma_cdf(std::nextafter(1.0, 0.0), a, b, s), hardkuma_prob_one(a, b, s), 1e-9, 1e-12,
                  "1 - G(1-) = P1");
      CHECK(hardkuma_cdf(-0.01, a, b, s) == 0.0);
      CHECK(hardkuma_cdf(1.0, a, b, s) == 1.0);
    }
}

TEST_CASE("the interior density integrates to P(0<h<1); the mixed log-probability uses the point masses") {
  const HardKumaSupport<double> s{-0.1, 1.1};
  for (double a : {0.5, 1.0, 2.0, 4.0})
    for (double b : {0.5, 1.0, 3.0}) {
      const int n = 200000;
      double integral = 0;
      for (int i = 0; i < n; ++i) integral += std::exp(hardkuma_log_density((i + 0.5) / n, a, b, s));
      integral /= n;
      check_close(integral, hardkuma_prob_interior(a, b, s), 1e-4, 1e-6, "integral of the density");
      check_close(hardkuma_log_prob(0.0, a, b, s), std::log(hardkuma_prob_zero(a, b, s)), 1e-14, 0, "log P0");
      check_close(hardkuma_log_prob(1.0, a, b, s), std::log(hardkuma_prob_one(a, b, s)), 1e-14, 0, "log P1");
      CHECK(hardkuma_log_density(0.0, a, b, s) == -INFINITY);
    }
}

TEST_CASE("E[K] and E[h] closed forms against quadrature, including the clamp bounds") {
  const HardKumaSupport<double> s{-0.1, 1.1};
  for (double a : {1e-6, 1e-3, 0.3, 1.0, 3.0, 100.0})
    for (double b : {1e-6, 0.2, 1.0, 4.0, 100.0}) {
      CAPTURE(a);
      CAPTURE(b);
      // E[h] = (r - l) * int_{c0}^{c1} (1 - k^a)^b dk, E[K] = int_0^1 (1 - k^a)^b dk (midpoint rule).
      const int n = 200000;
      double eh = 0, ek = 0;
      for (int i = 0; i < n; ++i) {
        const double x = (i + 0.5) / n;
        eh += kumaraswamy_survival(s.c0() + (s.c1() - s.c0()) * x, a, b);
        ek += kumaraswamy_survival(x, a, b);
      }
      eh *= (s.c1() - s.c0()) * s.width() / n;
      ek /= n;
      check_close(hardkuma_mean(a, b, s), eh, 1e-6, 1e-9, "E[h]");
      // Near k = 0 the survival of a tiny-a Kuma has an integrable log singularity the midpoint rule
      // under-resolves; the tolerance allows for it.
      check_close(kumaraswamy_mean(a, b), ek, 1e-4, 1e-6, "E[K]");
      CHECK(hardkuma_mean(float(a), float(b), HardKumaSupport<float>{}) ==
            doctest::Approx(hardkuma_mean(a, b, s)).epsilon(1e-6));
    }
  // Symmetric support: E[K] > 0.5 iff E[h] > 0.5 (docs/algorithms/hardkuma.md §5).
  for (double a : kShapes)
    for (double b : kShapes)
      if (std::fabs(kumaraswamy_mean(a, b) - 0.5) > 1e-9)  // not at the a = b = 1 tie
        CHECK((kumaraswamy_mean(a, b) > 0.5) == (hardkuma_mean(a, b, s) > 0.5));
}

// ---------------------------------------------------------------- gradients

TEST_CASE("dP(h=0)/da and dP(h=0)/db match central differences and have the documented signs") {
  for (double l : {-0.1, -0.3})
    for (double a : {0.05, 0.3, 1.0, 2.0, 5.0})
      for (double b : {0.05, 0.5, 1.0, 3.0}) {
        CAPTURE(a);
        CAPTURE(b);
        const HardKumaSupport<double> s{l, 1.1};
        const ShapeGradient<double> g = hardkuma_prob_zero_grad(a, b, s);
        check_close(g.da, central_difference([&](double x) { return hardkuma_prob_zero(x, b, s); }, a), 1e-6, 1e-10,
                    "dP0/da");
        check_close(g.db, central_difference([&](double x) { return hardkuma_prob_zero(a, x, s); }, b), 1e-6, 1e-10,
                    "dP0/db");
        CHECK(g.da < 0.0);
        CHECK(g.db > 0.0);
      }
}

TEST_CASE("dk/da and dk/db at fixed u match central differences") {
  for (double u : {0.01, 0.3, 0.7, 0.99})
    for (double a : {0.2, 1.3, 4.0})
      for (double b : {0.2, 0.7, 3.0}) {
        CAPTURE(u);
        CAPTURE(a);
        CAPTURE(b);
        const ShapeGradient<double> g = kumaraswamy_sample_grad(u, a, b);
        // Absolute slack: k is near 1 for u = 0.99, and the differences then carry ~1e-16 / 1e-7 of noise.
        check_close(g.da, central_difference([&](double x) { return kumaraswamy_inv_cdf(u, x, b); }, a), 1e-6, 2e-9,
                    "dk/da");
        check_close(g.db, central_difference([&](double x) { return kumaraswamy_inv_cdf(u, a, x); }, b), 1e-6, 2e-9,
                    "dk/db");
        CHECK(g.da > 0.0);
        CHECK(g.db < 0.0);
      }
}

TEST_CASE("hardkuma_sample_backward matches central differences of the batched sampler, zero where clipped") {
  const int n = 64;
  auto rng = kvsift_test::make_rng(5);
  std::vector<double> a(n), b(n), gh(n), h(n), ga(n), gb(n);
  for (int i = 0; i < n; ++i) {
    a[i] = std::exp(std::uniform_real_distribution<double>(-1.5, 1.5)(rng));
    b[i] = std::exp(std::uniform_real_distribution<double>(-1.5, 1.5)(rng));
    gh[i] = std::uniform_real_distribution<double>(-1, 1)(rng);
  }
  const PhiloxStream stream{0x5eed, 3};
  const HardKumaOptions o;
  REQUIRE(host::hardkuma_sample(cpu, o, a.data(), b.data(), n, stream, h.data()).ok());
  REQUIRE(host::hardkuma_sample_backward(cpu, o, a.data(), b.data(), n, stream, gh.data(), ga.data(), gb.data()).ok());
  int clipped = 0, interior = 0;
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    auto h_at = [&](double ai, double bi) {
      double hi;
      const double a1[1] = {ai}, b1[1] = {bi};
      // The same draw: gate index i of the same stream.
      const double u = detail::gate_uniform<double>(o, stream, i);
      hi = hardkuma_reparameterize(u, a1[0], b1[0], o.support<double>()).h;
      return hi;
    };
    CHECK(h_at(a[i], b[i]) == h[i]);
    if (h[i] == 0.0 || h[i] == 1.0) {
      ++clipped;
      CHECK(ga[i] == 0.0);
      CHECK(gb[i] == 0.0);
      continue;
    }
    ++interior;
    check_close(ga[i], gh[i] * central_difference([&](double x) { return h_at(x, b[i]); }, a[i]), 1e-6, 1e-10, "dL/da");
    check_close(gb[i], gh[i] * central_difference([&](double x) { return h_at(a[i], x); }, b[i]), 1e-6, 1e-10, "dL/db");
  }
  CHECK(clipped > 0);  // with these shapes some draws land in each point mass
  CHECK(interior > 0);

  // Accumulate mode adds onto what is there.
  std::vector<double> ga2(n, 1.0), gb2(n, -2.0);
  REQUIRE(host::hardkuma_sample_backward(cpu, o, a.data(), b.data(), n, stream, gh.data(), ga2.data(), gb2.data(),
                                         GradientWrite::kAccumulate)
              .ok());
  for (int i = 0; i < n; ++i) {
    CHECK(ga2[i] == 1.0 + ga[i]);
    CHECK(gb2[i] == -2.0 + gb[i]);
  }
}

TEST_CASE("expected L0: sum, density and the density's gradient against central differences") {
  const int n = 24;
  auto rng = kvsift_test::make_rng(6);
  std::vector<double> a(n), b(n), ga(n), gb(n), p0(n);
  for (int i = 0; i < n; ++i) {
    a[i] = std::exp(std::uniform_real_distribution<double>(-2, 2)(rng));
    b[i] = std::exp(std::uniform_real_distribution<double>(-2, 2)(rng));
  }
  a[0] = 150.0;   // clamped shape: no gradient through a
  b[1] = 1e-9;    // clamped shape: no gradient through b
  a[2] = 10.0;    // P(h=0) = 1 - (1 - 12^-10)^b < 1e-6: P0 clamped, no gradient at all
  b[2] = 1.0;
  const HardKumaOptions o;
  const double scale = 3.5;
  double sum = 0, density = 0;
  ExpectedL0Outputs<double> out;
  out.sum = &sum;
  out.density = &density;
  out.grad_a = ga.data();
  out.grad_b = gb.data();
  out.grad_scale = &scale;
  REQUIRE(host::hardkuma_expected_l0(cpu, o, a.data(), b.data(), n, out).ok());

  GateStatsOutputs<double> stats;
  stats.prob_zero = p0.data();
  REQUIRE(host::hardkuma_stats(cpu, o, a.data(), b.data(), n, stats).ok());
  double want = 0;
  for (double p : p0) want += 1.0 - p;
  check_close(sum, want, 1e-14, 0, "sum of P(h!=0)");
  check_close(density, want / n, 1e-14, 0, "density");
  CHECK(p0[2] == doctest::Approx(1e-6).epsilon(1e-12));

  auto density_at = [&](int i, double ai, double bi) {
    std::vector<double> a2 = a, b2 = b;
    a2[i] = ai;
    b2[i] = bi;
    double d = 0;
    ExpectedL0Outputs<double> o2;
    o2.density = &d;
    REQUIRE(host::hardkuma_expected_l0(cpu, o, a2.data(), b2.data(), n, o2).ok());
    return d;
  };
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    if (i == 0 || i == 2) {
      CHECK(ga[i] == 0.0);
    } else {
      check_close(ga[i], scale * central_difference([&](double x) { return density_at(i, x, b[i]); }, a[i]), 1e-5,
                  1e-8, "d density/da");
    }
    if (i == 1 || i == 2) {
      CHECK(gb[i] == 0.0);
    } else {
      check_close(gb[i], scale * central_difference([&](double x) { return density_at(i, a[i], x); }, b[i]), 1e-5,
                  1e-8, "d density/db");
    }
  }
}

TEST_CASE("hardkuma_stats reports dP(h=0)/da, db with zero gradient under either clamp") {
  const std::vector<double> a = {1.0, 200.0, 10.0, -3.0}, b = {2.0, 1.0, 1.0, 1.0};
  std::vector<double> da(4), db(4);
  GateStatsOutputs<double> out;
  out.d_prob_zero_da = da.data();
  out.d_prob_zero_db = db.data();
  REQUIRE(host::hardkuma_stats(cpu, HardKumaOptions{}, a.data(), b.data(), 4, out).ok());
  const ShapeGradient<double> g = hardkuma_prob_zero_grad(1.0, 2.0, HardKumaSupport<double>{});
  CHECK(da[0] == doctest::Approx(g.da).epsilon(1e-14));  // constant folding may differ by an ulp
  CHECK(db[0] == doctest::Approx(g.db).epsilon(1e-14));
  CHECK(da[1] == 0.0);  // a clamped to 100
  CHECK(db[1] == 0.0);  // and P0 = 1 - (1 - 12^-100) ~ 0 clamped to 1e-6
  CHECK(da[2] == 0.0);
  CHECK(db[2] == 0.0);
  CHECK(da[3] == 0.0);  // a = -3 clamped to 1e-6: the raw parameter gets no gradient and sticks
  CHECK(db[3] != 0.0);
}

// ---------------------------------------------------------------- Monte Carlo

TEST_CASE("Monte Carlo (1e6 draws, fixed seed): P(h=0), P(h=1), E[h] match the closed forms") {
  const int n = 1000000;
  HardKumaOptions o;
  o.sample_eps = 0.0;  // draw u from all of (0, 1) so the closed forms apply exactly
  const double shapes[][2] = {{1.0, 1.0}, {0.5, 2.0}, {3.0, 0.7}, {0.3, 0.3}};
  for (const auto& ab : shapes) {
    CAPTURE(ab[0]);
    CAPTURE(ab[1]);
    std::vector<double> a(n, ab[0]), b(n, ab[1]), h(n);
    REQUIRE(host::hardkuma_sample(cpu, o, a.data(), b.data(), n, PhiloxStream{20240601, 11}, h.data()).ok());
    double zeros = 0, ones = 0, sum = 0, sum2 = 0;
    for (double x : h) {
      zeros += x == 0.0;
      ones += x == 1.0;
      sum += x;
      sum2 += x * x;
    }
    const HardKumaSupport<double> s;
    const double p0 = hardkuma_prob_zero(ab[0], ab[1], s), p1 = hardkuma_prob_one(ab[0], ab[1], s);
    const double mean = hardkuma_mean(ab[0], ab[1], s);
    const double var = sum2 / n - (sum / n) * (sum / n);
    // Five standard errors: a false alarm at about 1 in 3.5 million per check.
    check_close(zeros / n, p0, 0, 5 * std::sqrt(p0 * (1 - p0) / n) + 1e-7, "P(h=0)");
    check_close(ones / n, p1, 0, 5 * std::sqrt(p1 * (1 - p1) / n) + 1e-7, "P(h=1)");
    check_close(sum / n, mean, 0, 5 * std::sqrt(var / n), "E[h]");
  }
}

TEST_CASE("Monte Carlo with the reference's u ~ U(1e-3, 1 - 1e-3): P(h=0) is the truncated probability") {
  const int n = 1000000;
  const HardKumaOptions o;  // sample_eps = 1e-3
  std::vector<float> a(n, 1.0f), b(n, 1.0f), h(n), u(n);
  REQUIRE(host::hardkuma_sample(cpu, o, a.data(), b.data(), n, PhiloxStream{99, 0}, h.data(), nullptr, u.data()).ok());
  double zeros = 0;
  float umin = 1, umax = 0;
  for (int i = 0; i < n; ++i) {
    zeros += h[i] == 0.f;
    umin = std::fmin(umin, u[i]);
    umax = std::fmax(umax, u[i]);
  }
  CHECK(umin >= 1e-3f);
  CHECK(umax <= 1.f - 1e-3f);
  const double p = (1.0 / 12 - 1e-3) / (1 - 2e-3);  // P(eps + (1-2eps) v <= 1/12)
  check_close(zeros / n, p, 0, 5 * std::sqrt(p * (1 - p) / n), "truncated P(h=0)");
}

// ---------------------------------------------------------------- bad input and clamps

TEST_CASE("bad options and bad gate values give a Status naming the parameter") {
  const double a[3] = {1.0, 2.0, 3.0}, b[3] = {1.0, 1.0, 1.0};
  double out[3];
  GateStatsOutputs<double> stats;
  stats.prob_zero = out;
  auto message_of = [&](HardKumaOptions o, const double* aa, const double* bb) {
    const Status s = host::hardkuma_stats(cpu, o, aa, bb, 3, stats);
    CHECK(!s.ok());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    return s.message();
  };
  HardKumaOptions o;
  o.l = 0.0;
  CHECK(message_of(o, a, b).find("options.l") != std::string::npos);
  o = HardKumaOptions{};
  o.r = 1.0;
  CHECK(message_of(o, a, b).find("options.r") != std::string::npos);
  o = HardKumaOptions{};
  o.r = NAN;
  CHECK(message_of(o, a, b).find("options.r") != std::string::npos);
  o = HardKumaOptions{};
  o.sample_eps = 0.5;
  CHECK(message_of(o, a, b).find("options.sample_eps") != std::string::npos);

  const double bad_nan[3] = {1.0, NAN, 1.0};
  CHECK(message_of(HardKumaOptions{}, bad_nan, b).find("a[1]") != std::string::npos);
  CHECK(message_of(HardKumaOptions{}, a, bad_nan).find("b[1]") != std::string::npos);
  const double bad_neg[3] = {1.0, 1.0, -2.0}, bad_zero[3] = {0.0, 1.0, 1.0}, bad_inf[3] = {1.0, INFINITY, 1.0};
  CHECK(message_of(unclamped(), bad_neg, b).find("a[2]") != std::string::npos);
  CHECK(message_of(unclamped(), a, bad_zero).find("b[0]") != std::string::npos);
  CHECK(message_of(unclamped(), bad_inf, b).find("a[1]") != std::string::npos);

  // With the default clamp, <= 0 and inf are clamped instead (the documented behaviour).
  REQUIRE(host::hardkuma_stats(cpu, HardKumaOptions{}, bad_neg, b, 3, stats).ok());
  const double p0_clamped = out[2];
  const double lo[3] = {1.0, 1.0, 1e-6};
  REQUIRE(host::hardkuma_stats(cpu, HardKumaOptions{}, lo, b, 3, stats).ok());
  CHECK(out[2] == p0_clamped);
  REQUIRE(host::hardkuma_stats(cpu, HardKumaOptions{}, bad_inf, b, 3, stats).ok());

  // Null pointers and sizes.
  CHECK(host::hardkuma_stats(cpu, HardKumaOptions{}, static_cast<const double*>(nullptr), b, 3, stats).code() ==
        StatusCode::kNullPointer);
  CHECK(host::hardkuma_sample(cpu, HardKumaOptions{}, a, b, 3, PhiloxStream{}, static_cast<double*>(nullptr)).code() ==
        StatusCode::kNullPointer);
  CHECK(!host::hardkuma_stats(cpu, HardKumaOptions{}, a, b, -1, stats).ok());
  CHECK(host::hardkuma_stats(cpu, HardKumaOptions{}, a, b, 0, stats).ok());
}

TEST_CASE("clamps can be switched off: P(h=0) below 1e-6 and shapes beyond [1e-6, 100] are then used as given") {
  const double a[2] = {10.0, 150.0}, b[2] = {1.0, 1.0};
  double p0[2];
  GateStatsOutputs<double> out;
  out.prob_zero = p0;
  REQUIRE(host::hardkuma_stats(cpu, HardKumaOptions{}, a, b, 2, out).ok());
  CHECK(p0[0] == doctest::Approx(1e-6).epsilon(1e-12));
  REQUIRE(host::hardkuma_stats(cpu, unclamped(), a, b, 2, out).ok());
  check_close(p0[0], std::pow(12.0, -10.0), 1e-10, 0, "unclamped P0");
  check_close(p0[1], std::pow(12.0, -150.0), 1e-10, 0, "unclamped P0 with a = 150");
}

// ---------------------------------------------------------------- output mixing

TEST_CASE("gate mixing: forward and backward against a double reference and finite differences") {
  GateMixShape shape;
  shape.tokens = 5;
  shape.q_heads = 8;
  shape.kv_heads = 2;
  shape.head_dim = 16;
  shape.token_stride = 8 * 16 + 3;  // padded rows
  const std::size_t size = std::size_t(shape.tokens) * shape.token_stride;
  auto rng = kvsift_test::make_rng(7);
  const std::vector<float> dense = kvsift_test::random_values<float>(rng, size);
  const std::vector<float> sparse = kvsift_test::random_values<float>(rng, size);
  const std::vector<float> grad_o = kvsift_test::random_values<float>(rng, size);
  const std::vector<float> z = {0.25f, 0.875f};
  std::vector<float> o(size, -7.f), gd(size, -7.f), gs(size, -7.f), gz(2, -7.f);
  REQUIRE(host::gate_mix_forward(cpu, shape, z.data(), dense.data(), sparse.data(), o.data()).ok());
  REQUIRE(host::gate_mix_backward(cpu, shape, z.data(), dense.data(), sparse.data(), grad_o.data(), gd.data(), gs.data(),
                                  gz.data())
              .ok());
  double want_gz[2] = {0, 0};
  for (std::int64_t t = 0; t < shape.tokens; ++t)
    for (int h = 0; h < shape.q_heads; ++h)
      for (int d = 0; d < shape.head_dim; ++d) {
        const std::size_t i = std::size_t(shape.offset(t, h, d));
        const int j = h / 4;
        check_close(o[i], z[j] * double(dense[i]) + (1 - z[j]) * double(sparse[i]), 0, 1e-6, "O");
        check_close(gd[i], z[j] * double(grad_o[i]), 0, 1e-7, "dL/dO_dense");
        check_close(gs[i], (1 - z[j]) * double(grad_o[i]), 0, 1e-7, "dL/dO_sparse");
        want_gz[j] += double(grad_o[i]) * (double(dense[i]) - double(sparse[i]));
      }
  // Padding between rows is left untouched.
  CHECK(o[std::size_t(shape.token_stride) - 1] == -7.f);
  for (int j = 0; j < 2; ++j) check_close(gz[j], want_gz[j], 1e-6, 1e-6, "dL/dz");

  // dL/dz by central differences of L = sum grad_o * O(z) (linear in z, so any step is exact).
  for (int j = 0; j < 2; ++j) {
    auto loss = [&](double zj) {
      std::vector<float> z2 = z;
      z2[j] = float(zj);
      std::vector<float> o2(size, 0.f);
      REQUIRE(host::gate_mix_forward(cpu, shape, z2.data(), dense.data(), sparse.data(), o2.data()).ok());
      double l = 0;
      for (std::int64_t t = 0; t < shape.tokens; ++t)
        for (int h = 0; h < shape.q_heads; ++h)
          for (int d = 0; d < shape.head_dim; ++d) {
            const std::size_t i = std::size_t(shape.offset(t, h, d));
            l += double(grad_o[i]) * double(o2[i]);
          }
      return l;
    };
    check_close(gz[j], (loss(z[j] + 0.125) - loss(z[j] - 0.125)) / 0.25, 1e-4, 1e-4, "dL/dz by differences");
  }
}

TEST_CASE("gate mixing in half and bfloat16 rounds the float result once; bad shapes are rejected") {
  GateMixShape shape;
  shape.tokens = 3;
  shape.q_heads = 4;
  shape.kv_heads = 4;
  shape.head_dim = 8;
  const std::size_t size = 3 * 4 * 8;
  auto rng = kvsift_test::make_rng(8);
  const std::vector<float> zf = {0.1f, 0.5f, 1.f, 0.f};
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const std::vector<T> dense = kvsift_test::random_values<T>(rng, size);
    const std::vector<T> sparse = kvsift_test::random_values<T>(rng, size);
    std::vector<T> o(size);
    REQUIRE(host::gate_mix_forward(cpu, shape, zf.data(), dense.data(), sparse.data(), o.data()).ok());
    for (std::size_t i = 0; i < size; ++i) {
      const float z = zf[(i / 8) % 4];
      CHECK(o[i].bits == from_float<T>(std::fma(z, to_float(dense[i]) - to_float(sparse[i]), to_float(sparse[i]))).bits);
    }
  };
  run(half_t{});
  run(bfloat16_t{});

  std::vector<float> buf(size);
  GateMixShape bad = shape;
  bad.q_heads = 6;
  const Status s = host::gate_mix_forward(cpu, bad, zf.data(), buf.data(), buf.data(), buf.data());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("shape.q_heads") != std::string::npos);
  bad = shape;
  bad.token_stride = 5;
  CHECK(host::gate_mix_forward(cpu, bad, zf.data(), buf.data(), buf.data(), buf.data()).message().find("token_stride") !=
        std::string::npos);
  CHECK(host::gate_mix_forward(cpu, shape, static_cast<const float*>(nullptr), buf.data(), buf.data(), buf.data()).code() ==
        StatusCode::kNullPointer);
}

// ---------------------------------------------------------------- Lagrangian and optimizer

TEST_CASE("Lagrangian update: the exact one-sided (LycheeDecode) and two-sided (Bastings) recurrences") {
  const LagrangianConfig ly = LagrangianConfig::lycheedecode(0.25);
  LagrangianState s = lagrangian_initial_state(ly);
  CHECK(s.lambda == 2.0);
  double c_ma = 0, lambda = 2;
  const double densities[] = {0.9, 0.6, 0.2, 0.1, 0.3};
  for (double rho : densities) {
    const double c_hat = rho > 0.25 ? rho - 0.25 : 0.0;
    c_ma = 0.9 * c_ma + 0.1 * c_hat;
    const double before = lambda;
    lambda = std::fmin(20.0, std::fmax(1e-12, lambda * std::exp(1e-3 * c_ma)));
    const LagrangianStep r = lagrangian_update(ly, &s, rho);
    check_close(r.c_hat, c_hat, 0, 1e-15, "c_hat");
    check_close(r.c, c_ma, 0, 1e-15, "c (= c_ma)");
    check_close(r.lambda, lambda, 1e-15, 0, "lambda");
    check_close(r.penalty, lambda * c_ma, 1e-15, 1e-18, "penalty");
    CHECK(r.grad_scale == (rho > 0.25 ? r.lambda : 0.0));
    CHECK(r.lambda >= before);  // one-sided: lambda never decreases
  }
  CHECK(s.steps == 5);

  // The clamp at 20.
  LagrangianConfig fast = ly;
  fast.lr = 10.0;
  LagrangianState f = lagrangian_initial_state(fast);
  for (int i = 0; i < 50; ++i) lagrangian_update(fast, &f, 1.0);
  CHECK(f.lambda == 20.0);

  // Two-sided: lambda falls when the density is below target, and the gradient is lambda either way.
  const LagrangianConfig ba = LagrangianConfig::bastings(0.5);
  LagrangianState t = lagrangian_initial_state(ba);
  CHECK(t.lambda == 1e-4);
  const LagrangianStep r1 = lagrangian_update(ba, &t, 0.2);
  check_close(r1.c_hat, -0.3, 0, 1e-15, "two-sided c_hat");
  check_close(r1.c, 0.01 * -0.3, 1e-14, 0, "two-sided c_ma");
  CHECK(r1.lambda < 1e-4);
  CHECK(r1.grad_scale == r1.lambda);

  // A NaN density leaves the state alone.
  const LagrangianState keep = t;
  const LagrangianStep rn = lagrangian_update(ba, &t, NAN);
  CHECK(std::isnan(rn.c));
  CHECK(t.lambda == keep.lambda);
  CHECK(t.c_ma == keep.c_ma);

  LagrangianConfig bad = ly;
  bad.ma_alpha = 1.0;
  CHECK(validate(bad).message().find("config.ma_alpha") != std::string::npos);
  bad = ly;
  bad.target = 1.5;
  CHECK(validate(bad).message().find("config.target") != std::string::npos);
}

TEST_CASE("warm-up/decay schedule and the AdamW step follow torch") {
  CHECK(warmup_decay_lr_factor(0, 3000) == doctest::Approx(0.1));  // 1/600 floored
  CHECK(warmup_decay_lr_factor(60, 3000) == doctest::Approx(61.0 / 600));
  CHECK(warmup_decay_lr_factor(599, 3000) == doctest::Approx(1.0));
  CHECK(warmup_decay_lr_factor(1500, 3000) == doctest::Approx(1.0));
  CHECK(warmup_decay_lr_factor(2400, 3000) == doctest::Approx(1.0));
  CHECK(warmup_decay_lr_factor(2401, 3000) == doctest::Approx(599.0 / 600));
  CHECK(warmup_decay_lr_factor(2999, 3000) == doctest::Approx(0.1));

  // Two steps worked by hand (torch.optim.AdamW, wd = 0.1, lr = 0.01).
  AdamWConfig c;
  c.weight_decay = 0.1;
  std::vector<double> p = {1.0, -0.5}, m(2, 0.0), v(2, 0.0);
  const double g1[2] = {0.3, -2.0}, g2[2] = {-0.1, -1.0};
  std::vector<double> pw = p, mw = m, vw = v;
  for (int step = 0; step < 2; ++step) {
    const double* g = step == 0 ? g1 : g2;
    REQUIRE(host::adamw_step(cpu, c, 0.01, step, p.data(), g, m.data(), v.data(), 2).ok());
    const double t = step + 1;
    for (int i = 0; i < 2; ++i) {
      pw[i] *= 1 - 0.01 * 0.1;
      mw[i] = 0.9 * mw[i] + 0.1 * g[i];
      vw[i] = 0.999 * vw[i] + 0.001 * g[i] * g[i];
      const double denom = std::sqrt(vw[i]) / std::sqrt(1 - std::pow(0.999, t)) + 1e-8;
      pw[i] -= 0.01 / (1 - std::pow(0.9, t)) * mw[i] / denom;
      check_close(p[i], pw[i], 1e-14, 1e-16, "param");
      check_close(m[i], mw[i], 1e-14, 1e-16, "exp_avg");
      check_close(v[i], vw[i], 1e-14, 1e-16, "exp_avg_sq");
    }
  }
  CHECK(host::adamw_step(cpu, c, -1.0, 0, p.data(), g1, m.data(), v.data(), 2).message().find("lr") != std::string::npos);
  CHECK(host::adamw_step(cpu, c, 0.01, -1, p.data(), g1, m.data(), v.data(), 2).message().find("step") !=
        std::string::npos);
}

// The training recipe on a toy problem: a task loss that rewards open gates (each with its own
// weight) against the one-sided Lagrangian, AdamW with the LycheeDecode schedule, sampled gates with
// the reparameterised backward. The density must settle at the target, and the heads kept open must
// be the ones the task values most.
TEST_CASE("the Lagrangian drives a toy problem's density to its target") {
  const int layers = 4, kv_heads = 8, n = layers * kv_heads, steps = 3000;
  const double target = 8.0 / n;
  std::vector<float> a(n, 1.f), b(n, 1.f), ma(n, 0.f), va(n, 0.f), mb(n, 0.f), vb(n, 0.f);
  std::vector<float> weight(n), h(n), grad_h(n), ga(n), gb(n);
  for (int i = 0; i < n; ++i) weight[i] = 0.2f + 0.8f * float(i % 7) / 6.f;  // which heads the task needs
  const HardKumaOptions gate;
  const LagrangianConfig lag = LagrangianConfig::lycheedecode(target);
  LagrangianState state = lagrangian_initial_state(lag);
  AdamWConfig adam;
  float density = 0.f, grad_scale = 0.f;
  double late_density = 0;
  int late_count = 0;
  for (int step = 0; step < steps; ++step) {
    const PhiloxStream stream{1234, std::uint64_t(step)};
    REQUIRE(host::hardkuma_sample(cpu, gate, a.data(), b.data(), n, stream, h.data()).ok());
    // Task loss L = -mean_i w_i h_i.
    for (int i = 0; i < n; ++i) grad_h[i] = -weight[i] / n;
    REQUIRE(host::hardkuma_sample_backward(cpu, gate, a.data(), b.data(), n, stream, grad_h.data(), ga.data(), gb.data())
                .ok());
    ExpectedL0Outputs<float> l0;
    l0.density = &density;
    REQUIRE(host::hardkuma_expected_l0(cpu, gate, a.data(), b.data(), n, l0).ok());
    REQUIRE(host::lagrangian_update(cpu, lag, &state, &density, &grad_scale).ok());
    l0.density = nullptr;
    l0.grad_a = ga.data();
    l0.grad_b = gb.data();
    l0.grad_scale = &grad_scale;
    l0.write = GradientWrite::kAccumulate;
    REQUIRE(host::hardkuma_expected_l0(cpu, gate, a.data(), b.data(), n, l0).ok());
    const double lr = adam.lr * warmup_decay_lr_factor(step, steps);
    REQUIRE(host::adamw_step(cpu, adam, lr, step, a.data(), ga.data(), ma.data(), va.data(), n).ok());
    REQUIRE(host::adamw_step(cpu, adam, lr, step, b.data(), gb.data(), mb.data(), vb.data(), n).ok());
    if (step >= steps - 500) {
      late_density += density;
      ++late_count;
    }
  }
  late_density /= late_count;
  std::printf("toy Lagrangian: target %.4f, mean density over the last 500 steps %.4f, lambda %.3f\n", target,
              late_density, state.lambda);
  CHECK(late_density == doctest::Approx(target).epsilon(0.25));
  CHECK(state.lambda >= lag.lambda_init);

  // The open heads are those the task weights most: every retrieval head (top 8) has weight >= any sparse head's.
  RoleExtractionOptions ro;
  ro.selection = RoleSelection::kTopN;
  ro.total_retrieval_heads = 8;
  ro.force_layer0 = false;
  std::vector<std::uint8_t> roles(n);
  REQUIRE(host::extract_head_roles(cpu, ro, a.data(), b.data(), layers, kv_heads, roles.data()).ok());
  float min_kept = 2.f, max_dropped = 0.f;
  for (int i = 0; i < n; ++i) {
    if (roles[i])
      min_kept = std::fmin(min_kept, weight[i]);
    else
      max_dropped = std::fmax(max_dropped, weight[i]);
  }
  CHECK(min_kept >= max_dropped - 0.15f);
}

// ---------------------------------------------------------------- roles

TEST_CASE("role extraction: threshold with layer 0 forced, and exactly N heads by score") {
  const int layers = 3, kv_heads = 4, n = 12;
  // E[K(a, 1)] = 1/(1 + 1/a) ... a = 3 -> 0.75, a = 1 -> 0.5, a = 0.5 -> 1/3.
  const std::vector<double> a = {0.1, 0.1, 0.1, 0.1,  // layer 0: low scores, forced anyway
                                 3.0, 1.0, 0.5, 2.0,  // 0.75, 0.5 (not > 0.5), 0.333, 0.667
                                 0.5, 9.0, 2.0, 0.5}; // 0.333, 0.9, 0.667, 0.333
  const std::vector<double> b(n, 1.0);
  std::vector<std::uint8_t> roles(n);
  std::vector<double> scores(n);
  RoleExtractionOptions o;
  REQUIRE(host::extract_head_roles(cpu, o, a.data(), b.data(), layers, kv_heads, roles.data(), scores.data()).ok());
  const std::vector<std::uint8_t> want = {1, 1, 1, 1, 1, 0, 0, 1, 0, 1, 1, 0};
  CHECK(roles == want);
  check_close(scores[4], 0.75, 0, 1e-12, "E[K(3, 1)]");

  o.force_layer0 = false;
  REQUIRE(host::extract_head_roles(cpu, o, a.data(), b.data(), layers, kv_heads, roles.data()).ok());
  CHECK(roles[0] == 0);

  // Top-N: 4 forced + 3 best of the rest (0.9, 0.75, then 0.667 twice: the lower index wins the tie).
  o = RoleExtractionOptions{};
  o.selection = RoleSelection::kTopN;
  o.total_retrieval_heads = 7;
  REQUIRE(host::extract_head_roles(cpu, o, a.data(), b.data(), layers, kv_heads, roles.data()).ok());
  const std::vector<std::uint8_t> want_top = {1, 1, 1, 1, 1, 0, 0, 1, 0, 1, 0, 0};
  CHECK(roles == want_top);
  int count = 0;
  for (auto r : roles) count += r;
  CHECK(count == 7);

  o.total_retrieval_heads = 3;  // fewer than the 4 forced heads
  const Status s = host::extract_head_roles(cpu, o, a.data(), b.data(), layers, kv_heads, roles.data());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("total_retrieval_heads") != std::string::npos);
  o.total_retrieval_heads = 13;
  CHECK(!host::extract_head_roles(cpu, o, a.data(), b.data(), layers, kv_heads, roles.data()).ok());
  CHECK(host::extract_head_roles(cpu, RoleExtractionOptions{}, a.data(), b.data(), 0, kv_heads, roles.data())
            .message()
            .find("layers") != std::string::npos);
}

TEST_CASE("roles file: format, parse and file round trip") {
  const int layers = 5, kv_heads = 3;
  std::vector<std::uint8_t> mask(layers * kv_heads);
  auto rng = kvsift_test::make_rng(9);
  for (auto& m : mask) m = std::uint8_t(kvsift_test::uniform_int(rng, 0, 1));
  HeadRoles roles;
  REQUIRE(make_head_roles(layers, kv_heads, mask.data(), &roles).ok());
  const std::string text = format_head_roles(roles);
  HeadRoles parsed;
  REQUIRE(parse_head_roles(text, &parsed, layers, kv_heads).ok());
  CHECK(parsed == roles);
  CHECK(text.find("kvsift-head-roles v1 layers=5 kv_heads=3\n") != std::string::npos);

  const std::string path = "test_hardkuma_roles.txt";
  REQUIRE(write_head_roles_file(path, roles).ok());
  HeadRoles from_file;
  REQUIRE(read_head_roles_file(path, &from_file).ok());
  CHECK(from_file == roles);
  std::remove(path.c_str());
  CHECK(read_head_roles_file(path, &from_file).message().find("cannot be opened") != std::string::npos);

  // Comments, blank lines, CRLF and trailing blanks are accepted.
  REQUIRE(parse_head_roles("# hi\r\n\nkvsift-head-roles v1 layers=2 kv_heads=2\r\nRS \r\n\nSR\t\n", &parsed).ok());
  CHECK(parsed.is_retrieval(0, 0));
  CHECK(!parsed.is_retrieval(0, 1));
  CHECK(parsed.is_retrieval(1, 1));
}

TEST_CASE("roles file: malformed files give a clear error") {
  HeadRoles out;
  auto error = [&](const std::string& text, int layers = -1, int heads = -1) {
    const Status s = parse_head_roles(text, &out, layers, heads);
    CHECK(!s.ok());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    return s.message();
  };
  const std::string header = "kvsift-head-roles v1 layers=2 kv_heads=3\n";
  CHECK(error(header + "RSR\n").find("has 1 layer rows") != std::string::npos);
  CHECK(error(header + "RSR\nRRR\nSSS\n").find("more than layers = 2") != std::string::npos);
  CHECK(error(header + "RSR\nRR\n").find("expected kv_heads = 3") != std::string::npos);
  CHECK(error(header + "RSR\nRxR\n").find("line 3, column 2: illegal character 'x'") != std::string::npos);
  CHECK(error(header + "RSR\nR1R\n").find("illegal character '1'") != std::string::npos);
  CHECK(error("RSR\nRSR\n").find("expected the header") != std::string::npos);
  CHECK(error("").find("no 'kvsift-head-roles' header") != std::string::npos);
  CHECK(error("kvsift-head-roles v2 layers=2 kv_heads=3\n").find("expected the header") != std::string::npos);
  CHECK(error("kvsift-head-roles v1 layers=-2 kv_heads=3\n").find("expected the header") != std::string::npos);
  CHECK(error("kvsift-head-roles v1 layers=0 kv_heads=3\n").find("must be > 0") != std::string::npos);
  CHECK(error(header + "RSR\nRSR\n", 32, 3).find("the model has 32 layers") != std::string::npos);
  CHECK(error(header + "RSR\nRSR\n", 2, 8).find("the model has 8 KV heads") != std::string::npos);
}

// ---------------------------------------------------------------- the op shape

// Every gate op with its workspace query, called the same way; `exec` is any host::Exec.
struct GateOpFixture {
  static constexpr int layers = 3, kv_heads = 4, n = layers * kv_heads;
  std::vector<double> a, b, grad_h, h, k, u, ga, gb, p, m, v, scores;
  std::vector<std::uint8_t> roles;
  std::vector<float> z, dense, sparse, grad_o, mixed, gd, gs, gz;
  double sum = 0, density = 0;
  float f_density = 0.3f, grad_scale = 0.f;
  GateMixShape shape;
  LagrangianConfig lag = LagrangianConfig::lycheedecode(0.25);
  LagrangianState lag_state = lagrangian_initial_state(lag);
  LagrangianStep lag_step;

  GateOpFixture()
      : a(n), b(n), grad_h(n), h(n), k(n), u(n), ga(n), gb(n), p(n, 1.0), m(n), v(n), scores(n), roles(n) {
    for (int i = 0; i < n; ++i) {
      a[i] = 0.3 + 0.4 * i;
      b[i] = 2.0 - 0.1 * i;
      grad_h[i] = 0.5 - 0.05 * i;
    }
    shape.tokens = 3;
    shape.q_heads = 4;
    shape.kv_heads = 2;
    shape.head_dim = 8;
    const std::size_t size = 3 * 4 * 8;
    z = {0.25f, 0.75f};
    dense.assign(size, 1.5f);
    sparse.assign(size, -0.5f);
    grad_o.assign(size, 0.125f);
    mixed.assign(size, 0.f);
    gd.assign(size, 0.f);
    gs.assign(size, 0.f);
    gz.assign(2, 0.f);
  }
  GateStatsOutputs<double> stats() { return GateStatsOutputs<double>{h.data(), nullptr, nullptr, k.data()}; }
  ExpectedL0Outputs<double> l0() {
    ExpectedL0Outputs<double> out;
    out.sum = &sum;
    out.density = &density;
    out.grad_a = ga.data();
    out.grad_b = gb.data();
    return out;
  }

  // Each query's reported size, in op order; -1 where a query failed.
  template <class Exec>
  std::vector<long long> query_all(const Exec& exec) {
    const HardKumaOptions o;
    const RoleExtractionOptions ro;
    const PhiloxStream draw{1, 2};
    std::vector<long long> sizes;
    // Each query starts from a nonzero size, so one that does not write it fails the check.
    auto ask = [&](auto query) {
      std::size_t bytes = 12345;
      const Status s = query(&bytes);
      sizes.push_back(s.ok() ? (long long)bytes : -1);
    };
    ask([&](std::size_t* bytes) {
      return hardkuma_stats_workspace_bytes(exec, o, a.data(), b.data(), n, stats(), bytes);
    });
    ask([&](std::size_t* bytes) {
      return hardkuma_sample_workspace_bytes(exec, o, a.data(), b.data(), n, draw, h.data(), k.data(), nullptr, bytes);
    });
    ask([&](std::size_t* bytes) {
      return hardkuma_sample_backward_workspace_bytes(exec, o, a.data(), b.data(), n, draw, grad_h.data(), ga.data(),
                                                      gb.data(), GradientWrite::kOverwrite, bytes);
    });
    ask([&](std::size_t* bytes) {
      return hardkuma_expected_l0_workspace_bytes(exec, o, a.data(), b.data(), n, l0(), bytes);
    });
    ask([&](std::size_t* bytes) {
      return gate_mix_forward_workspace_bytes(exec, shape, z.data(), dense.data(), sparse.data(), mixed.data(), bytes);
    });
    ask([&](std::size_t* bytes) {
      return gate_mix_backward_workspace_bytes(exec, shape, z.data(), dense.data(), sparse.data(), grad_o.data(),
                                               gd.data(), gs.data(), gz.data(), bytes);
    });
    ask([&](std::size_t* bytes) {
      return adamw_step_workspace_bytes(exec, AdamWConfig{}, 0.01, 0, p.data(), ga.data(), m.data(), v.data(), n, bytes);
    });
    ask([&](std::size_t* bytes) {
      return lagrangian_update_workspace_bytes(exec, lag, &lag_state, &f_density, &grad_scale, &lag_step, bytes);
    });
    ask([&](std::size_t* bytes) {
      return extract_head_roles_workspace_bytes(exec, ro, a.data(), b.data(), layers, kv_heads, roles.data(), nullptr,
                                                bytes);
    });
    return sizes;
  }

  // Runs every op with `workspace`; the first failing op's Status, or ok.
  Status run_all(const host::Exec& exec, Workspace workspace = {}) {
    const HardKumaOptions o;
    const PhiloxStream draw{1, 2};
    KVSIFT_TRY(host::hardkuma_stats(exec, o, a.data(), b.data(), n, stats(), workspace));
    KVSIFT_TRY(host::hardkuma_sample(exec, o, a.data(), b.data(), n, draw, h.data(), k.data(), u.data(), workspace));
    KVSIFT_TRY(host::hardkuma_sample_backward(exec, o, a.data(), b.data(), n, draw, grad_h.data(), ga.data(), gb.data(),
                                              GradientWrite::kOverwrite, workspace));
    KVSIFT_TRY(host::hardkuma_expected_l0(exec, o, a.data(), b.data(), n, l0(), workspace));
    KVSIFT_TRY(host::gate_mix_forward(exec, shape, z.data(), dense.data(), sparse.data(), mixed.data(), workspace));
    KVSIFT_TRY(host::gate_mix_backward(exec, shape, z.data(), dense.data(), sparse.data(), grad_o.data(), gd.data(),
                                       gs.data(), gz.data(), workspace));
    KVSIFT_TRY(host::adamw_step(exec, AdamWConfig{}, 0.01, 0, p.data(), ga.data(), m.data(), v.data(), n, workspace));
    KVSIFT_TRY(host::lagrangian_update(exec, lag, &lag_state, &f_density, &grad_scale, &lag_step, workspace));
    KVSIFT_TRY(host::extract_head_roles(exec, RoleExtractionOptions{}, a.data(), b.data(), layers, kv_heads,
                                        roles.data(), scores.data(), workspace));
    return Status();
  }
};

TEST_CASE("every gate op's workspace query reports 0 bytes, and a null `bytes` is an error") {
  GateOpFixture f;
  const std::vector<long long> sizes = f.query_all(cpu);
  CHECK(sizes.size() == 9);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    CAPTURE(i);
    CHECK(sizes[i] == 0);
  }
  const Status s = hardkuma_stats_workspace_bytes(cpu, HardKumaOptions{}, f.a.data(), f.b.data(), f.n, f.stats(),
                                                  static_cast<std::size_t*>(nullptr));
  CHECK(s.code() == StatusCode::kNullPointer);
  CHECK(s.message().find("bytes") != std::string::npos);
}

TEST_CASE("the gate ops need no device facts and no workspace: an Exec with zero facts and a passed workspace "
          "give the same bits") {
  GateOpFixture with_facts, without_facts, with_workspace;
  host::Exec no_facts;
  no_facts.device = DeviceFacts{};  // what an Exec made without a device holds
  REQUIRE(with_facts.run_all(cpu).ok());
  REQUIRE(without_facts.run_all(no_facts).ok());
  alignas(256) static unsigned char scratch[1024];
  REQUIRE(with_workspace.run_all(cpu, Workspace{scratch, sizeof scratch}).ok());
  for (GateOpFixture* g : {&without_facts, &with_workspace}) {
    CHECK(g->h == with_facts.h);
    CHECK(g->k == with_facts.k);
    CHECK(g->u == with_facts.u);
    CHECK(g->ga == with_facts.ga);
    CHECK(g->gb == with_facts.gb);
    CHECK(g->p == with_facts.p);
    CHECK(g->mixed == with_facts.mixed);
    CHECK(g->gz == with_facts.gz);
    CHECK(g->roles == with_facts.roles);
    CHECK(g->scores == with_facts.scores);
    CHECK(g->density == with_facts.density);
    CHECK(g->grad_scale == with_facts.grad_scale);
  }
}

TEST_CASE("lycheedecode_roles_from_hardkuma packs extract_head_roles into HeadRoles") {
  const int layers = 3, kv_heads = 4, n = 12;
  const std::vector<double> a = {0.1, 0.1, 0.1, 0.1, 3.0, 1.0, 0.5, 2.0, 0.5, 9.0, 2.0, 0.5};
  const std::vector<double> b(n, 1.0);
  std::vector<std::uint8_t> roles(n);
  REQUIRE(host::extract_head_roles(cpu, RoleExtractionOptions{}, a.data(), b.data(), layers, kv_heads, roles.data())
              .ok());
  HeadRoles table;
  REQUIRE(lycheedecode_roles_from_hardkuma(a.data(), b.data(), layers, kv_heads, RoleExtractionOptions{}, &table).ok());
  CHECK(table.layers == layers);
  CHECK(table.kv_heads == kv_heads);
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < kv_heads; ++h) CHECK(table.is_retrieval(l, h) == (roles[std::size_t(l * kv_heads + h)] == 1));
  RoleExtractionOptions no_force;
  no_force.force_layer0 = false;
  CHECK(lycheedecode_roles_from_hardkuma(a.data(), b.data(), layers, kv_heads, no_force, &table)
            .message()
            .find("force_layer0") != std::string::npos);
}
