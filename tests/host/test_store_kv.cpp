// store_kv's host reference against the contract computed independently: per-token scales are
// amax / fp8_max in double rounded once (the same as one float division), codes are the nearest fp8
// of x / scale, 16/32-bit caches get plain narrowing, rows outside the view are never written.

#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "kvsift/kvsift.hpp"
#include "support/random.hpp"
#include "support/store_kv_cases.hpp"

using kvsift::ScaleGranularity;
using kvsift_test::StoreCase;
using kvsift_test::StoreLayout;

namespace {

template <class KT, class T>
void check_store(std::mt19937_64& rng, StoreLayout layout, ScaleGranularity g, bool specials) {
  const StoreCase c = kvsift_test::random_store_case(rng, layout, g);
  const auto kin = kvsift_test::random_store_rows<T>(rng, c, specials);
  const auto vin = kvsift_test::random_store_rows<T>(rng, c, specials);
  const std::uint8_t poison = 0xA5;
  std::vector<KT> k(c.cache_elements()), v(c.cache_elements());
  std::memset(k.data(), poison, k.size() * sizeof(KT));
  std::memset(v.data(), poison, v.size() * sizeof(KT));
  std::vector<float> ks(c.scale_count(), -7.f), vs(c.scale_count(), -7.f);
  if (g == ScaleGranularity::kPerHead)
    for (int h = 0; h < c.heads; ++h) {
      ks[h] = 0.01f * float(h + 1);
      vs[h] = 0.5f / float(h + 1);
    }
  const auto ks0 = ks, vs0 = vs;
  auto p = kvsift::make_store_kv_params(kin.data(), vin.data(), c.n, c.heads, c.head_dim, c.seq.data(), c.pos.data());
  kvsift::Status st;
  auto run = [&](const auto& kv) {
    std::size_t bytes = 1;
    REQUIRE(kvsift::store_kv_workspace_bytes(kvsift::host::Exec{}, kv, p, &bytes).ok());
    CHECK(bytes == 0);
    st = kvsift::host::store_kv(kvsift::host::Exec{}, kv, p);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    std::vector<char> written(c.cache_elements(), 0);
    std::vector<char> scale_written(c.scale_count(), 0);
    for (int i = 0; i < c.n; ++i) {
      const int b = c.seq[i], t = c.pos[i];
      if (b < 0 || b >= c.batch || t < 0 || t >= c.capacity) continue;
      for (int h = 0; h < c.heads; ++h)
        for (int which = 0; which < 2; ++which) {
          const T* src = (which == 0 ? kin.data() : vin.data()) + (std::size_t(i) * c.heads + h) * c.head_dim;
          const KT* dst = which == 0 ? kv.k_row(b, h, t) : kv.v_row(b, h, t);
          const std::size_t at = std::size_t(dst - (which == 0 ? k.data() : v.data()));
          double scale = 1.0;
          if constexpr (kvsift::is_fp8_dtype<KT>::value) {
            const std::size_t so = std::size_t(kv.scale_offset(b, h, t));
            if (g == ScaleGranularity::kPerToken) {
              double amax = 0;
              for (int e = 0; e < c.head_dim; ++e) {
                const double a = std::fabs(double(kvsift::to_float(src[e])));
                if (std::isfinite(a)) amax = std::max(amax, a);
              }
              float want = float(amax / kvsift::fp8_max_finite<KT>());
              if (!(want >= FLT_MIN)) want = 1.f;
              REQUIRE((which == 0 ? ks : vs)[so] == want);
              scale_written[so] = 1;
              scale = want;
            } else {
              scale = (which == 0 ? ks0 : vs0)[so];
            }
          }
          for (int e = 0; e < c.head_dim; ++e) {
            const float x = kvsift::to_float(src[e]);
            // Nearest fp8 of x / scale: the double quotient rounded to float first is the float quotient.
            const KT want = kvsift::from_float<KT>(float(double(x) / scale));
            REQUIRE_MESSAGE(std::memcmp(&dst[e], &want, sizeof(KT)) == 0, "row " << i << " head " << h << " e " << e);
            if (which == 0) written[at / c.head_dim] = 1;
            if constexpr (kvsift::is_fp8_dtype<KT>::value) {
              // Dequantized, a finite element is within half an fp8 ulp (relative) of x, or of the fp8
              // subnormal step for tiny ones.
              if (std::isfinite(x) && g == ScaleGranularity::kPerToken) {
                const double back = double(kvsift::to_float(dst[e])) * scale;
                const double rel = std::is_same_v<KT, kvsift::fp8_e4m3_t> ? 1.0 / 16 : 1.0 / 8;
                const double tiny = scale * (std::is_same_v<KT, kvsift::fp8_e4m3_t> ? std::ldexp(1.0, -10) : std::ldexp(1.0, -17));
                REQUIRE(std::fabs(back - x) <= rel * std::fabs(x) + tiny);
              }
            }
          }
        }
    }
    // Nothing else in the cache changed, and per-token scales only where a row was stored.
    for (std::size_t r = 0; r < c.cache_elements() / c.head_dim; ++r)
      if (!written[r])
        for (int e = 0; e < c.head_dim; ++e) {
          std::uint8_t byte;
          std::memcpy(&byte, &k[r * c.head_dim + e], 1);
          REQUIRE(byte == poison);
        }
    if (kvsift::is_fp8_dtype<KT>::value && g == ScaleGranularity::kPerToken)
      for (std::size_t s = 0; s < c.scale_count(); ++s)
        if (!scale_written[s]) REQUIRE(ks[s] == -7.f);
    if (g == ScaleGranularity::kPerHead) CHECK(ks == ks0);
  };
  std::vector<std::int32_t> lengths(c.lengths);
  if (c.paged())
    run(kvsift_test::store_paged_view(c, k.data(), v.data(), ks.data(), vs.data(), c.table.data(), lengths.data()));
  else
    run(kvsift_test::store_contiguous_view(c, k.data(), v.data(), ks.data(), vs.data(), lengths.data()));
}

template <class KT, class T>
void every_layout(std::mt19937_64& rng, bool specials) {
  for (auto layout : {StoreLayout::kBHSD, StoreLayout::kBSHD, StoreLayout::kPagedNHD, StoreLayout::kPagedHND})
    for (auto g : {ScaleGranularity::kPerToken, ScaleGranularity::kPerHead})
      for (int trial = 0; trial < 4; ++trial) check_store<KT, T>(rng, layout, g, specials);
}

}  // namespace

TEST_CASE("store_kv into fp8 views: per-token scales from the row amax, per-head scales as given") {
  auto rng = kvsift_test::make_rng(1400);
  every_layout<kvsift::fp8_e4m3_t, kvsift::bfloat16_t>(rng, false);
  every_layout<kvsift::fp8_e4m3_t, kvsift::half_t>(rng, false);
  every_layout<kvsift::fp8_e5m2_t, kvsift::bfloat16_t>(rng, false);
  every_layout<kvsift::fp8_e4m3_t, float>(rng, true);  // infinities saturate, NaN stays NaN
}

TEST_CASE("store_kv into 16/32-bit views narrows and leaves scales alone") {
  auto rng = kvsift_test::make_rng(1401);
  every_layout<kvsift::bfloat16_t, float>(rng, true);
  every_layout<kvsift::half_t, kvsift::bfloat16_t>(rng, false);
  every_layout<float, kvsift::half_t>(rng, false);
}

TEST_CASE("store_kv per-token edge rows: zeros store scale 1, infinities saturate, NaN stays NaN") {
  using kvsift::fp8_e4m3_t;
  const int D = 16;
  std::vector<float> kin(2 * D, 0.f), vin(2 * D, 0.f);
  for (int e = 0; e < D; ++e) kin[D + e] = float(e) - 4.f;  // row 1: amax 11
  kin[D + 2] = INFINITY;
  kin[D + 3] = NAN;
  std::vector<fp8_e4m3_t> k(2 * D), v(2 * D);
  std::vector<float> ks(2), vs(2);
  std::vector<std::int32_t> seq = {0, 0}, pos = {0, 1}, len = {0};
  auto kv = kvsift::make_bshd(k.data(), v.data(), 1, 1, 2, D, len.data());
  kv.scales = kvsift::make_per_token_scales_for(kv, ks.data(), vs.data());
  const auto p = kvsift::make_store_kv_params(kin.data(), vin.data(), 2, 1, D, seq.data(), pos.data());
  REQUIRE(kvsift::host::store_kv(kvsift::host::Exec{}, kv, p).ok());
  CHECK(ks[0] == 1.f);
  CHECK(vs[0] == 1.f);
  CHECK(vs[1] == 1.f);
  for (int e = 0; e < D; ++e) CHECK(k[e].bits == 0);
  CHECK(ks[1] == 11.f / 448.f);
  CHECK(k[D + 15].bits == 0x7e);  // the amax element lands on 448
  CHECK(k[D + 2].bits == 0x7e);   // +inf saturates
  CHECK(k[D + 3].bits == 0x7f);   // NaN
  CHECK(kvsift::to_float(k[D + 15]) * ks[1] == doctest::Approx(11.f));
}

TEST_CASE("store_kv names its errors") {
  using kvsift::fp8_e4m3_t;
  std::vector<fp8_e4m3_t> k(64), v(64);
  std::vector<float> rows(64), s(4);
  std::vector<std::int32_t> seq = {0}, pos = {0}, len = {0};
  auto kv = kvsift::make_bshd(k.data(), v.data(), 1, 1, 4, 16, len.data());
  auto p = kvsift::make_store_kv_params(rows.data(), rows.data(), 1, 1, 16, seq.data(), pos.data());
  const kvsift::host::Exec exec{};
  CHECK(kvsift::host::store_kv(exec, kv, p).message() == "kv.scales.k is null");
  kv.scales = kvsift::make_per_token_scales_for(kv, s.data(), s.data());
  REQUIRE(kvsift::host::store_kv(exec, kv, p).ok());
  auto bad = p;
  bad.n = -1;
  CHECK(bad.n < 0);
  CHECK(kvsift::host::store_kv(exec, kv, bad).message() == "n = -1 must be >= 0");
  bad = p;
  bad.pos = nullptr;
  CHECK(kvsift::host::store_kv(exec, kv, bad).message() == "pos is null");
  bad = p;
  bad.head_stride = -2;
  CHECK(kvsift::host::store_kv(exec, kv, bad).message() == "head_stride = -2 must be >= 0");
  bad = p;
  bad.n = 0;
  bad.k = nullptr;  // nothing to store needs no rows
  CHECK(kvsift::host::store_kv(exec, kv, bad).ok());
  std::size_t* null_bytes = nullptr;
  CHECK(kvsift::store_kv_workspace_bytes(exec, kv, p, null_bytes).code() == kvsift::StatusCode::kNullPointer);
}
