// store_kv's host reference against the contract computed independently: per-token scales are
// amax / fp8_max in double rounded once (the same as one float division), codes are the nearest fp8
// of x / scale, 16/32-bit caches get plain narrowing, rows outside the view are never written.

#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <type_traits>
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

// RoPE on the way in (StoreKvRotary) against the rotation computed in double from the contract's float
// angle: K stored rotated (then narrowed, its fp8 scale from the rotated row), dims past rotary_dim and
// V as without RoPE, Q rotated in place for every row (rows outside the view too), Q's other dims kept.
namespace {

// |got - want| within a few roundings of float at the pair's magnitude, plus the narrowing to the
// stored type (half an ulp relative, and half its subnormal step: for fp8 times the scale). A pair's
// rotation can cancel to a value far below both inputs, where the stored type's step is absolute: a
// half Q row's dim at 2.7e-5 (subnormal in half, below 2^-14) is 2.5e-8 from the double rotation.
bool close(double got, double want, double mag, double narrow_rel, double narrow_abs = 0.0) {
  return std::fabs(got - want) <= 4.0 * FLT_EPSILON * mag + narrow_rel * std::fabs(want) + narrow_abs + 1e-30;
}
// The stored type's rounding, relative (none for float: the reference computes in float).
template <class X>
constexpr double narrowing() {
  return std::is_same_v<X, float> ? 0.0 : kvsift_test::epsilon_of<X>() / 2;
}

template <class KT, class T>
void check_rotary(std::mt19937_64& rng, StoreLayout layout, int head_dim, int rotary_dim) {
  const StoreCase c = kvsift_test::random_store_case(rng, layout, ScaleGranularity::kPerToken, head_dim);
  const auto r = kvsift_test::random_rotary_case(rng, c, rotary_dim);
  const auto kin = kvsift_test::random_store_rows<T>(rng, c, false);
  const auto vin = kvsift_test::random_store_rows<T>(rng, c, false);
  std::vector<T> q = kvsift_test::random_query_rows<T>(rng, c, r);
  const auto q0 = q;
  std::vector<KT> k(c.cache_elements()), v(c.cache_elements());
  std::vector<float> ks(c.scale_count(), -7.f), vs(c.scale_count(), -7.f);
  auto p = kvsift::make_store_kv_params(kin.data(), vin.data(), c.n, c.heads, c.head_dim, c.seq.data(), c.pos.data());
  p = kvsift::with_rotary(p, r.inv_freq.data(), r.position.data(), rotary_dim, q.data(), r.q_heads, c.head_dim);
  // The same store without RoPE: V, K's unrotated dims and every scale but K's must match it.
  std::vector<KT> k_plain(k.size()), v_plain(v.size());
  std::vector<float> ks_plain(ks), vs_plain(vs);
  const auto p_plain = kvsift::make_store_kv_params(kin.data(), vin.data(), c.n, c.heads, c.head_dim, c.seq.data(), c.pos.data());
  std::vector<std::int32_t> lengths(c.lengths);
  auto view = [&](KT* kk, KT* vv, float* kss, float* vss) {
    return kvsift_test::store_contiguous_view(c, kk, vv, kss, vss, lengths.data());
  };
  REQUIRE(layout != StoreLayout::kPagedNHD);  // contiguous layouts here; the GPU test takes pages
  REQUIRE(kvsift::host::store_kv(kvsift::host::Exec{}, view(k.data(), v.data(), ks.data(), vs.data()), p).ok());
  REQUIRE(kvsift::host::store_kv(kvsift::host::Exec{}, view(k_plain.data(), v_plain.data(), ks_plain.data(), vs_plain.data()),
                                 p_plain).ok());
  const int half = rotary_dim / 2;
  // The contract's angle, then double arithmetic.
  auto cos_sin = [&](int i, int j, double* cs, double* sn) {
    const float a = float(r.position[std::size_t(i)]) * r.inv_freq[std::size_t(j)];
    *cs = std::cos(double(a));
    *sn = std::sin(double(a));
  };
  const auto kvv = view(k.data(), v.data(), ks.data(), vs.data());
  for (int i = 0; i < c.n; ++i) {
    for (int h = 0; h < r.q_heads; ++h) {
      const std::size_t at = (std::size_t(i) * r.q_heads + h) * c.head_dim;
      for (int j = 0; j < half; ++j) {
        double cs, sn;
        cos_sin(i, j, &cs, &sn);
        const double x1 = kvsift::to_float(q0[at + j]), x2 = kvsift::to_float(q0[at + j + half]);
        const double mag = std::fabs(x1) + std::fabs(x2);
        const double q_sub = kvsift_test::subnormal_half_step<T>();
        REQUIRE(close(kvsift::to_float(q[at + j]), x1 * cs - x2 * sn, mag, narrowing<T>(), q_sub));
        REQUIRE(close(kvsift::to_float(q[at + j + half]), x2 * cs + x1 * sn, mag, narrowing<T>(), q_sub));
      }
      for (int e = rotary_dim; e < c.head_dim; ++e) REQUIRE(std::memcmp(&q[at + e], &q0[at + e], sizeof(T)) == 0);
    }
    const int b = c.seq[std::size_t(i)], t = c.pos[std::size_t(i)];
    if (b < 0 || b >= c.batch || t < 0 || t >= c.capacity) continue;
    for (int h = 0; h < c.heads; ++h) {
      const T* src = kin.data() + (std::size_t(i) * c.heads + h) * c.head_dim;
      const KT* got = kvv.k_row(b, h, t);
      double scale = 1.0;
      if constexpr (kvsift::is_fp8_dtype<KT>::value) scale = ks[std::size_t(kvv.scale_offset(b, h, t))];
      for (int j = 0; j < half; ++j) {
        double cs, sn;
        cos_sin(i, j, &cs, &sn);
        const double x1 = kvsift::to_float(src[j]), x2 = kvsift::to_float(src[j + half]);
        const double mag = std::fabs(x1) + std::fabs(x2);
        // E4M3's smallest step 2^-9, halved (times the row's scale); a 16-bit type's subnormal half-step.
        const double sub = kvsift::is_fp8_dtype<KT>::value ? scale / 1024 : kvsift_test::subnormal_half_step<KT>();
        REQUIRE(close(kvsift::to_float(got[j]) * scale, x1 * cs - x2 * sn, mag, narrowing<KT>(), sub));
        REQUIRE(close(kvsift::to_float(got[j + half]) * scale, x2 * cs + x1 * sn, mag, narrowing<KT>(), sub));
      }
      if (!kvsift::is_fp8_dtype<KT>::value) {  // an fp8 row's scale depends on its rotated dims
        const std::size_t off = std::size_t(got - k.data());
        for (int e = rotary_dim; e < c.head_dim; ++e) REQUIRE(std::memcmp(&k[off + e], &k_plain[off + e], sizeof(KT)) == 0);
      }
    }
  }
  REQUIRE(std::memcmp(v.data(), v_plain.data(), v.size() * sizeof(KT)) == 0);
  CHECK(vs == vs_plain);
}

}  // namespace

TEST_CASE("store_kv with RoPE: K stored rotated, Q rotated in place, V and the other dims as without it") {
  auto rng = kvsift_test::make_rng(1402);
  for (auto layout : {StoreLayout::kBHSD, StoreLayout::kBSHD})
    for (int head_dim : {64, 128, 256})
      for (int rotary_dim : {64, head_dim})
        for (int trial = 0; trial < 3; ++trial) {
          CAPTURE(head_dim);
          CAPTURE(rotary_dim);
          check_rotary<float, float>(rng, layout, head_dim, rotary_dim);
          check_rotary<kvsift::bfloat16_t, float>(rng, layout, head_dim, rotary_dim);
          check_rotary<kvsift::bfloat16_t, kvsift::bfloat16_t>(rng, layout, head_dim, rotary_dim);
          check_rotary<kvsift::fp8_e4m3_t, kvsift::half_t>(rng, layout, head_dim, rotary_dim);
        }
}

TEST_CASE("store_kv with RoPE names its errors") {
  std::vector<float> k(64), v(64), rows(64), q(64), inv(8, 1.f);
  std::vector<std::int32_t> seq = {0}, pos = {0}, len = {0}, position = {5};
  auto kv = kvsift::make_bshd(k.data(), v.data(), 1, 1, 4, 16, len.data());
  const auto p0 = kvsift::make_store_kv_params(rows.data(), rows.data(), 1, 1, 16, seq.data(), pos.data());
  const kvsift::host::Exec exec{};
  auto p = kvsift::with_rotary(p0, inv.data(), position.data(), 16, q.data(), 4, 16);
  REQUIRE(kvsift::host::store_kv(exec, kv, p).ok());
  auto bad = p;
  bad.rotary.position = nullptr;
  CHECK(kvsift::host::store_kv(exec, kv, bad).message() == "rotary.position is null");
  bad = p;
  bad.rotary.rotary_dim = 7;
  CHECK(kvsift::host::store_kv(exec, kv, bad).message() == "rotary.rotary_dim = 7 must be even and in [2, head_dim = 16]");
  bad.rotary.rotary_dim = 18;
  CHECK(kvsift::host::store_kv(exec, kv, bad).code() == kvsift::StatusCode::kInvalidArgument);
  bad = p;
  bad.rotary.num_q_heads = 0;
  CHECK(kvsift::host::store_kv(exec, kv, bad).message() == "rotary.num_q_heads = 0 must be >= 1 with rotary.q");
  bad = p;
  bad.rotary.q_row_stride = 63;
  CHECK(kvsift::host::store_kv(exec, kv, bad).message() == "rotary.q_row_stride = 63 must be >= num_q_heads * head_dim = 64");
  bad = p;
  bad.rotary.q = nullptr;  // K only
  CHECK(kvsift::host::store_kv(exec, kv, bad).ok());
}
