// CPU fuzz: the host references against brute-force float64 computations written here from the
// contracts (the header comments), on random shapes with adversarial values and engine data. Runs in
// CI; the run's seed, case budget and time box come from support/fuzz.hpp (KVSIFT_FUZZ_SEED,
// KVSIFT_FUZZ_CASES, KVSIFT_FUZZ_SECONDS, KVSIFT_FUZZ_CASE). Family weights sum to 1: the default
// 10,000 cases are top-k 25 %, decode attention 45 %, pooling 15 %, gate mixing 15 %.
//
// The brute forces address raw buffers by their own formulas (BSHD, paged NHD through the block
// table), never through the views, so a view's address bug is caught too.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "kvsift/kvsift.hpp"
#include "support/fuzz.hpp"
#include "support/fuzz_values.hpp"
#include "support/index_rows.hpp"

using kvsift_test::fuzz::chance;
using kvsift_test::fuzz::Family;
using kvsift_test::fuzz::pick;
namespace fz = kvsift_test::fuzz;

namespace {

template <class T>
float largest_finite() {
  if constexpr (std::is_same_v<T, kvsift::half_t>) return 65504.f;
  else if constexpr (std::is_same_v<T, kvsift::fp8_e4m3_t>) return 448.f;
  else return 3.0e38f;  // float, bfloat16
}

// Relative rounding unit of a type's stored results.
template <class T>
double unit_roundoff() {
  if constexpr (std::is_same_v<T, kvsift::half_t>) return std::ldexp(1.0, -11);
  else if constexpr (std::is_same_v<T, kvsift::bfloat16_t>) return std::ldexp(1.0, -8);
  else return std::ldexp(1.0, -24);
}

// The spacing of T's values at zero (its smallest denormal): results round to multiples of it.
template <class T>
double smallest_step() {
  if constexpr (std::is_same_v<T, kvsift::half_t>) return std::ldexp(1.0, -24);
  else if constexpr (std::is_same_v<T, kvsift::bfloat16_t>) return std::ldexp(1.0, -133);
  else return std::ldexp(1.0, -149);
}

// ---------------------------------------------------------------------------------------------------
// top-k: the order of topk.hpp (NaN below every number, -0 == +0, ties to the lower position) by
// comparisons of doubles, not by the reference's radix key.

// a ranks above b.
bool better(double a, int pa, double b, int pb) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return nb;                // a number beats NaN
  if (!na && a != b) return a > b;        // -0 == +0 falls through
  return pa < pb;
}

template <class T>
void fuzz_topk_case(std::mt19937_64& rng, std::string* what) {
  const int rows = pick(rng, 1, 12), cols = chance(rng, 10) ? pick(rng, 1, 3) : pick(rng, 1, 300);
  const int capacity = pick(rng, 1, cols + 8), pad = chance(rng, 30) ? pick(rng, 1, 9) : 0;
  const std::int64_t stride = cols + pad;
  kvsift::TopKParams p;
  p.k = pick(rng, 0, capacity);
  p.sink = chance(rng, 40) ? pick(rng, 0, capacity / 2) : 0;
  p.recent = chance(rng, 40) ? pick(rng, 0, capacity - p.sink) : 0;
  std::vector<std::int32_t> lengths, per_row_k;
  if (chance(rng, 70))
    for (int r = 0; r < rows; ++r) lengths.push_back(chance(rng, 15) ? pick(rng, -5, -1) : pick(rng, 0, cols + 5));
  if (chance(rng, 50))
    for (int r = 0; r < rows; ++r) per_row_k.push_back(pick(rng, -3, capacity + 5));
  if (chance(rng, 25)) {  // LycheeDecode's row filter
    p.num_kv_heads = pick(rng, 1, 4);
    for (int h = 0; h < p.num_kv_heads; ++h) p.roles.set_sparse(h, chance(rng, 50));
  }
  const bool flagged = chance(rng, 25);
  const fz::ScoreFill fill = fz::draw_score_fill(rng);
  const float constant = std::uniform_real_distribution<float>(-3.f, 3.f)(rng);
  std::vector<T> scores(std::size_t(rows) * stride, kvsift::from_float<T>(7.f));
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) scores[r * stride + c] = kvsift::from_float<T>(fz::score_value(rng, fill, largest_finite<T>(), constant));
  // Flag-first fp32 rows, half of them as the 32-bit FlagFirstNonNegativeKey over the scores'
  // magnitudes (its order equals the 33-bit key's there; fabs keeps NaN).
  const bool nonnegative = flagged && std::is_same_v<T, float> && chance(rng, 50);
  if (nonnegative)
    for (auto& x : scores) x = kvsift::from_float<T>(std::fabs(kvsift::to_float(x)));
  std::vector<std::uint8_t> flags(std::size_t(rows) * cols);
  for (auto& f : flags) f = chance(rng, 30) ? 1 : 0;
  *what = "topk rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) + " cap=" + std::to_string(capacity) +
          " k=" + std::to_string(p.k) + " sink=" + std::to_string(p.sink) + " recent=" + std::to_string(p.recent) +
          " fill=" + fz::name(fill) + " flagged=" + std::to_string(flagged) + " nonnegative=" + std::to_string(nonnegative) + " filter=" + std::to_string(p.num_kv_heads);

  std::vector<std::int32_t> idx(std::size_t(rows) * capacity, -7), counts(rows, -7);
  std::vector<T> values(idx.size(), kvsift::from_float<T>(-5.f));
  p.lengths = lengths.empty() ? nullptr : lengths.data();
  p.per_row_k = per_row_k.empty() ? nullptr : per_row_k.data();
  const auto view = kvsift::make_strided_view<const T>(scores.data(), rows, cols, stride);
  const auto out = kvsift::make_index_set(idx.data(), counts.data(), rows, capacity);
  kvsift::Status st;
  if (nonnegative) {
    if constexpr (std::is_same_v<T, float>) {
      kvsift::FlagFirstNonNegativeKey key;
      key.flags = flags.data();
      key.row_stride = cols;
      st = kvsift::host::topk(kvsift::host::Exec{}, view, p, out, values.data(), key);
    }
  } else if (flagged) {
    kvsift::FlagFirstKey<T> key;
    key.flags = flags.data();
    key.row_stride = cols;
    st = kvsift::host::topk(kvsift::host::Exec{}, view, p, out, values.data(), key);
  } else {
    st = kvsift::host::topk(kvsift::host::Exec{}, view, p, out, values.data());
  }
  REQUIRE_MESSAGE(st.ok(), st.to_string());

  for (int r = 0; r < rows; ++r) {
    INFO("row " << r);
    if (p.num_kv_heads > 0 && p.roles.is_sparse(r % p.num_kv_heads)) {  // filtered: untouched
      REQUIRE(counts[r] == -7);
      for (int j = 0; j < capacity; ++j) REQUIRE(idx[std::size_t(r) * capacity + j] == -7);
      continue;
    }
    const int len = std::clamp(lengths.empty() ? cols : lengths[r], 0, cols);
    const int k = std::clamp(per_row_k.empty() ? p.k : per_row_k[r], 0, capacity);
    std::vector<char> forced(std::size_t(len), 0);
    for (int t = 0; t < len; ++t) forced[t] = t < p.sink || t >= len - p.recent;
    const int n_forced = int(std::count(forced.begin(), forced.end(), 1));
    std::vector<int> region;
    for (int t = 0; t < len; ++t)
      if (!forced[t]) region.push_back(t);
    const int budget = std::clamp(k - n_forced, 0, int(region.size()));
    auto key_of = [&](int t) { return double(kvsift::to_float(scores[r * stride + t])); };
    std::sort(region.begin(), region.end(), [&](int a, int b) {
      if (flagged) {
        const bool fa = flags[std::size_t(r) * cols + a] != 0, fb = flags[std::size_t(r) * cols + b] != 0;
        if (fa != fb) return fa;
      }
      return better(key_of(a), a, key_of(b), b);
    });
    std::vector<int> want;
    for (int t = 0; t < len; ++t)
      if (forced[t]) want.push_back(t);
    want.insert(want.end(), region.begin(), region.begin() + budget);
    std::sort(want.begin(), want.end());
    REQUIRE(counts[r] == int(want.size()));
    for (int j = 0; j < int(want.size()); ++j) {
      INFO("entry " << j);
      REQUIRE(idx[std::size_t(r) * capacity + j] == want[j]);
      const T v = values[std::size_t(r) * capacity + j], s = scores[r * stride + want[j]];
      REQUIRE(std::memcmp(&v, &s, sizeof(T)) == 0);
    }
  }
}

TEST_CASE("fuzz host: topk against a brute-force sort") {
  for (Family f("host topk", 0.25, "fuzz host: topk against a brute-force sort"); f.next();) {
    auto rng = f.rng();
    std::string what;
    INFO(f.replay());
    INFO(what);
    switch (f.index() % 3) {
      case 0: fuzz_topk_case<float>(rng, &what); break;
      case 1: fuzz_topk_case<kvsift::bfloat16_t>(rng, &what); break;
      default: fuzz_topk_case<kvsift::half_t>(rng, &what); break;
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// decode attention: the contract of decode_attention.hpp computed in double over the raw buffers.

struct DecodeCase {
  int B, H, G, D, QL, S, page = 0, max_pages = 0, num_pages = 0, max_kv_length = 0;
  bool paged = false, per_token = false;
  kvsift::HeadRoleMask roles;
  bool block_gather = false;
  int block = 1, idx_cap = 0, idx_stride = 0, score_block = 0, score_stride = 0;
  std::vector<std::int32_t> lengths, table, idx, counts;
  std::vector<float> k_scale, v_scale;  // fp8 only
  std::string describe() const {
    std::string s = std::string(paged ? "paged NHD" : "BSHD") + " B=" + std::to_string(B) + " H=" + std::to_string(H) +
                    " G=" + std::to_string(G) + " D=" + std::to_string(D) + " q_len=" + std::to_string(QL) +
                    " S=" + std::to_string(S) + " M=" + std::to_string(max_kv_length) + " block=" + std::to_string(block) +
                    " idx_cap=" + std::to_string(idx_cap) + " score_block=" + std::to_string(score_block) +
                    " per_token=" + std::to_string(per_token) + " sparse=";
    for (int h = 0; h < H; ++h) s += roles.is_sparse(h) ? "1" : "0";
    s += " lengths=";
    for (int l : lengths) s += std::to_string(l) + ",";
    return s;
  }
  // Element offset of K/V row (b, h, t), and the offset of its per-token scale, by our own formulas.
  std::int64_t row(int b, int h, int t) const {
    if (!paged) return ((std::int64_t(b) * S + t) * H + h) * D;
    const std::int64_t pg = table[std::size_t(b) * max_pages + t / page];
    return ((pg * page + t % page) * H + h) * D;
  }
  std::int64_t scale_at(int b, int h, int t) const {
    if (!per_token) return h;
    if (!paged) return (std::int64_t(b) * S + t) * H + h;
    const std::int64_t pg = table[std::size_t(b) * max_pages + t / page];
    return (pg * page + t % page) * H + h;
  }
};

template <class KT, class QT>
void fuzz_decode_case(std::mt19937_64& rng, std::string* what) {
  constexpr bool fp8 = kvsift::is_fp8_dtype<KT>::value;
  DecodeCase c;
  c.B = pick(rng, 1, 3);
  c.H = pick(rng, 1, 3);
  c.G = pick(rng, 1, 8);
  c.D = fz::one_of(rng, {64, 128, 256});
  c.QL = chance(rng, 60) ? 1 : pick(rng, 2, 4);
  c.paged = chance(rng, 50);
  const int cap = pick(rng, c.QL, 72);
  if (c.paged) {
    c.page = fz::one_of(rng, {1, 16, 32});
    c.max_pages = (cap + c.page - 1) / c.page;
    c.S = c.max_pages * c.page;
    c.num_pages = c.B * c.max_pages + pick(rng, 0, 3);
    std::vector<std::int32_t> perm(std::size_t(c.num_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    c.table.assign(perm.begin(), perm.begin() + std::size_t(c.B) * c.max_pages);
  } else {
    c.S = cap;
  }
  c.max_kv_length = chance(rng, 25) ? pick(rng, c.QL, c.S + 8) : 0;
  const int M = c.max_kv_length > 0 ? c.max_kv_length : c.S;
  for (int b = 0; b < c.B; ++b) {
    const int u = pick(rng, 0, 9);
    int len = u == 0 ? 0 : u == 1 ? 1 : u == 2 ? -pick(rng, 1, 5) : u == 3 ? c.S + pick(rng, 1, 5) : pick(rng, 0, c.S);
    // The contract wants q_len <= every non-empty sequence (validated on the host backend).
    const int vis = std::min(std::clamp(len, 0, c.S), M);
    if (vis > 0 && vis < c.QL) len = c.QL;
    c.lengths.push_back(len);
  }
  for (int h = 0; h < c.H; ++h) c.roles.set_sparse(h, chance(rng, 50));
  const bool any_sparse = c.roles.count_sparse(c.H) > 0;
  c.block_gather = chance(rng, 40);
  c.block = c.block_gather ? fz::one_of(rng, {16, 32}) : 1;
  auto visible = [&](int b) { return std::min(std::clamp(c.lengths[b], 0, c.S), M); };
  if (any_sparse) {
    const int units = (c.S + c.block - 1) / c.block;
    c.idx_cap = pick(rng, 1, 2 * units + 2);
    c.idx_stride = c.idx_cap + (chance(rng, 30) ? pick(rng, 1, 3) : 0);
    for (int r = 0; r < c.B * c.H; ++r) {
      const auto row = kvsift_test::make_index_row(rng, kvsift_test::draw_row_kind(rng), visible(r / c.H), c.S, c.block,
                                                   c.idx_cap, c.idx_stride);
      c.idx.insert(c.idx.end(), row.slots.begin(), row.slots.end());
      c.counts.push_back(row.count);
    }
  }
  c.score_block = chance(rng, 40) ? fz::one_of(rng, {1, 16, 32}) : 0;
  const int score_cols = c.score_block ? (M + c.score_block - 1) / c.score_block : 0;
  c.score_stride = score_cols + (c.score_block ? pick(rng, 0, 3) : 0);
  c.per_token = fp8 && chance(rng, 50);
  const fz::KvFill fill = fz::draw_kv_fill(rng);
  const auto range = fz::kv_range(rng, fill, fp8 ? 448.f : largest_finite<KT>(),
                                  std::is_same_v<KT, kvsift::half_t> ? 1e-6f : 1e-40f);
  *what = "decode " + c.describe() + " fill=" + fz::name(fill);

  const int Hq = c.H * c.G;
  const std::size_t rows = c.paged ? std::size_t(c.num_pages) * c.page * c.H : std::size_t(c.B) * c.S * c.H;
  std::vector<KT> k(rows * c.D), v(rows * c.D);
  // fp8 codes use their range (the scales bring them back) but stay inside e4m3's: an overflowing code
  // is not a number.
  auto code = [&](float x) { return fp8 ? std::clamp(200.f * x, -440.f, 440.f) : x; };
  for (auto& x : k) x = kvsift::from_float<KT>(code(fz::kv_value(rng, range, true)));
  for (auto& x : v) x = kvsift::from_float<KT>(code(fz::kv_value(rng, range, false)));
  if (fp8) {
    std::uniform_real_distribution<float> sc(0.001f, 0.02f);
    c.k_scale.resize(c.per_token ? rows : std::size_t(c.H));
    c.v_scale.resize(c.k_scale.size());
    for (auto& x : c.k_scale) x = sc(rng);
    for (auto& x : c.v_scale) x = sc(rng);
  }
  const std::vector<QT> q = kvsift_test::random_values<QT>(rng, std::size_t(c.B) * c.QL * Hq * c.D, -2.f, 2.f);

  // The reference through the view.
  std::vector<QT> out(q.size(), kvsift::from_float<QT>(NAN));
  std::vector<float> lse(std::size_t(c.B) * c.QL * Hq, NAN), scores(std::size_t(c.B) * c.H * std::max(1, c.score_stride), -123.f);
  auto p = kvsift::make_decode_attention_params(q.data(), out.data(), c.QL, Hq, c.D);
  p.io.lse = lse.data();
  p.roles = c.roles;
  p.max_kv_length = c.max_kv_length;
  if (any_sparse) {
    auto set = kvsift::make_index_set(c.idx.data(), c.counts.data(), c.B * c.H, c.idx_cap,
                                      c.block_gather ? kvsift::Granularity::kBlock : kvsift::Granularity::kToken, c.block);
    set.row_stride = c.idx_stride;
    p.index_set = kvsift::as_const(set);
  }
  if (c.score_block) {
    p.scores = scores.data();
    p.score_row_stride = c.score_stride;
    p.score_block_size = c.score_block;
  }
  std::vector<std::int32_t> lengths = c.lengths;
  kvsift::Status st;
  if (c.paged) {
    auto kv = kvsift::make_paged(k.data(), v.data(), c.table.data(), c.B, c.max_pages, c.num_pages, c.H, c.page, c.D,
                                 kvsift::PageLayout::kNHD, lengths.data());
    if constexpr (fp8)
      kv.scales = c.per_token ? kvsift::make_per_token_scales_for(kv, c.k_scale.data(), c.v_scale.data())
                              : kvsift::make_per_head_scales(c.k_scale.data(), c.v_scale.data());
    st = kvsift::host::decode_attention(kvsift::host::Exec{}, kv, p);
  } else {
    auto kv = kvsift::make_bshd(k.data(), v.data(), c.B, c.H, c.S, c.D, lengths.data());
    if constexpr (fp8)
      kv.scales = c.per_token ? kvsift::make_per_token_scales_for(kv, c.k_scale.data(), c.v_scale.data())
                              : kvsift::make_per_head_scales(c.k_scale.data(), c.v_scale.data());
    st = kvsift::host::decode_attention(kvsift::host::Exec{}, kv, p);
  }
  REQUIRE_MESSAGE(st.ok(), st.to_string());

  // Brute force.
  auto kval = [&](int b, int h, int t, int i) {
    const double s = fp8 ? double(c.k_scale[std::size_t(c.scale_at(b, h, t))]) : 1.0;
    return double(kvsift::to_float(k[std::size_t(c.row(b, h, t) + i)])) * s;
  };
  auto vval = [&](int b, int h, int t, int i) {
    const double s = fp8 ? double(c.v_scale[std::size_t(c.scale_at(b, h, t))]) : 1.0;
    return double(kvsift::to_float(v[std::size_t(c.row(b, h, t) + i)])) * s;
  };
  const double sm = double(1.f / std::sqrt(float(c.D)));
  const double u = unit_roundoff<QT>();
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.H; ++h) {
      const int len = visible(b);
      std::vector<int> keys;  // the key list in order, duplicates kept
      if (!c.roles.is_sparse(h)) {
        for (int t = 0; t < len; ++t) keys.push_back(t);
      } else {
        const int r = b * c.H + h, n = std::clamp(c.counts[std::size_t(r)], 0, c.idx_cap);
        for (int e = 0; e < n; ++e) {
          const std::int64_t first = std::int64_t(c.idx[std::size_t(r) * c.idx_stride + e]) * c.block;
          for (std::int64_t t = first; t < first + c.block; ++t)
            if (t >= 0 && t < len) keys.push_back(int(t));
        }
      }
      double vmax = 0;
      for (int t : keys)
        for (int i = 0; i < c.D; ++i) vmax = std::max(vmax, std::abs(vval(b, h, t, i)));
      for (int qi = 0; qi < c.QL; ++qi)
        for (int g = 0; g < c.G; ++g) {
          const int hq = h * c.G + g;
          const std::size_t qrow = ((std::size_t(b) * c.QL + qi) * Hq + hq) * c.D;
          const int last = len - c.QL + qi;  // the query's own position: sees t <= last
          std::vector<double> logit;
          std::vector<int> seen;
          for (int t : keys) {
            if (t > last) continue;
            double s = 0;
            for (int i = 0; i < c.D; ++i) s += double(kvsift::to_float(q[qrow + i])) * kval(b, h, t, i);
            logit.push_back(s * sm);
            seen.push_back(t);
          }
          INFO("b " << b << " h " << h << " qi " << qi << " g " << g << " keys " << seen.size());
          const double m = logit.empty() ? -INFINITY : *std::max_element(logit.begin(), logit.end());
          double sum = 0;
          for (double l : logit) sum += std::exp(l - m);
          const float got_lse = lse[(std::size_t(b) * c.QL + qi) * Hq + hq];
          if (seen.empty()) {
            REQUIRE(got_lse == -INFINITY);
          } else {
            const double want = m + std::log(sum);
            REQUIRE(std::abs(double(got_lse) - want) <= 1e-6 * (1.0 + std::abs(want)));
          }
          std::vector<double> w(seen.size());
          for (std::size_t n = 0; n < seen.size(); ++n) w[n] = std::exp(logit[n] - m);
          for (int i = 0; i < c.D; ++i) {
            double acc = 0;
            for (std::size_t n = 0; n < seen.size(); ++n) acc += w[n] * vval(b, h, seen[n], i);
            const double want = seen.empty() ? 0.0 : acc / sum;
            const double got = kvsift::to_float(out[qrow + i]);
            // One rounding to the output type (through float; near zero, to its denormal grid), plus
            // double-vs-double noise scaled by the largest |v| the weighted sum could have cancelled.
            REQUIRE_MESSAGE(std::abs(got - want) <= 2 * u * std::abs(want) + 1e-9 * vmax + smallest_step<QT>(),
                            "out[" << i << "] = " << got << ", brute force " << want);
          }
        }
      if (!c.score_block) continue;
      const float* row = scores.data() + (std::size_t(b) * c.H + h) * c.score_stride;
      if (c.roles.is_sparse(h)) {  // sparse heads' rows untouched
        for (int j = 0; j < c.score_stride; ++j) REQUIRE(row[j] == -123.f);
        continue;
      }
      const int cols = (M + c.score_block - 1) / c.score_block;
      std::vector<double> qbar(std::size_t(c.D), 0.0);  // the group-mean query of the last position
      for (int i = 0; i < c.D; ++i) {
        for (int g = 0; g < c.G; ++g)
          qbar[i] += double(kvsift::to_float(q[((std::size_t(b) * c.QL + c.QL - 1) * Hq + h * c.G + g) * c.D + i]));
        qbar[i] /= c.G;
      }
      for (int j = 0; j < cols; ++j) {
        double want = -INFINITY, bound = 0;
        for (int t = j * c.score_block; t < std::min((j + 1) * c.score_block, len); ++t) {
          double s = 0, a = 0;
          for (int i = 0; i < c.D; ++i) {
            s += qbar[i] * kval(b, h, t, i);
            a += std::abs(qbar[i] * kval(b, h, t, i));
          }
          if (s > want) { want = s; bound = a; }
        }
        INFO("score b " << b << " h " << h << " col " << j);
        if (want == -INFINITY)
          REQUIRE(row[j] == -INFINITY);
        else
          REQUIRE(std::abs(double(row[j]) - want) <= 1e-6 * (bound + std::abs(want)) + 1e-30);
      }
      for (int j = cols; j < c.score_stride; ++j) REQUIRE(row[j] == -123.f);  // row padding untouched
    }
}

TEST_CASE("fuzz host: decode_attention against a float64 brute force") {
  for (Family f("host decode_attention", 0.45, "fuzz host: decode_attention against a float64 brute force"); f.next();) {
    auto rng = f.rng();
    std::string what;
    INFO(f.replay());
    INFO(what);
    switch (f.index() % 5) {
      case 0: fuzz_decode_case<float, float>(rng, &what); break;
      case 1: fuzz_decode_case<kvsift::bfloat16_t, kvsift::bfloat16_t>(rng, &what); break;
      case 2: fuzz_decode_case<kvsift::half_t, kvsift::half_t>(rng, &what); break;
      case 3: fuzz_decode_case<kvsift::fp8_e4m3_t, kvsift::bfloat16_t>(rng, &what); break;
      default: fuzz_decode_case<kvsift::fp8_e5m2_t, kvsift::half_t>(rng, &what); break;
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// pool_scores: torch's avg_pool1d / max_pool1d with "same" padding (score_pooling.hpp).

TEST_CASE("fuzz host: pool_scores against a brute-force window") {
  for (Family f("host pool_scores", 0.15, "fuzz host: pool_scores against a brute-force window"); f.next();) {
    auto rng = f.rng();
    const int rows = pick(rng, 1, 6), cols = pick(rng, 1, 200), stride = cols + pick(rng, 0, 4);
    const kvsift::PoolParams pp{chance(rng, 50) ? kvsift::PoolKind::kAvg : kvsift::PoolKind::kMax, 2 * pick(rng, 0, 6) + 1};
    // Avg pooling of inf - inf is NaN, which the op may define either way: avg rows stay finite.
    fz::ScoreFill fill = fz::draw_score_fill(rng);
    if (pp.kind == kvsift::PoolKind::kAvg &&
        (fill == fz::ScoreFill::kInfinities || fill == fz::ScoreFill::kNaNs || fill == fz::ScoreFill::kAllNaN ||
         fill == fz::ScoreFill::kMixed || fill == fz::ScoreFill::kHuge))
      fill = fz::ScoreFill::kUniform;
    // Max pooling with NaN: the contract does not say whether NaN propagates; keep max rows NaN-free.
    if (pp.kind == kvsift::PoolKind::kMax && (fill == fz::ScoreFill::kNaNs || fill == fz::ScoreFill::kAllNaN ||
                                              fill == fz::ScoreFill::kMixed))
      fill = fz::ScoreFill::kInfinities;
    INFO(f.replay());
    INFO("rows " << rows << " cols " << cols << " kernel " << pp.kernel << " kind " << int(pp.kind) << " fill "
                 << std::string(fz::name(fill)));
    std::vector<float> in(std::size_t(rows) * stride), out(in.size(), -77.f);
    for (auto& x : in) x = fz::score_value(rng, fill, 3e38f, 0.25f);
    std::vector<std::int32_t> len(rows);
    for (auto& l : len) l = pick(rng, -2, cols + 3);
    REQUIRE(kvsift::host::pool_scores(kvsift::host::Exec{}, kvsift::make_strided_view<const float>(in.data(), rows, cols, stride),
                                      len.data(), pp, kvsift::make_strided_view(out.data(), rows, cols, stride)).ok());
    const int half = pp.kernel / 2;
    for (int r = 0; r < rows; ++r) {
      const int n = std::clamp(len[r], 0, cols);
      for (int j = 0; j < stride; ++j) {
        const float got = out[std::size_t(r) * stride + j];
        INFO("row " << r << " col " << j << " len " << n);
        if (j >= n) {
          REQUIRE(got == -77.f);  // outside the row's length: untouched
          continue;
        }
        double sum = 0, mx = -INFINITY;
        for (int t = j - half; t <= j + half; ++t)
          if (t >= 0 && t < n) {
            sum += in[std::size_t(r) * stride + t];
            mx = std::max(mx, double(in[std::size_t(r) * stride + t]));
          }
        if (pp.kind == kvsift::PoolKind::kMax) {
          REQUIRE(double(got) == mx);  // a max is exact
        } else {
          const double want = sum / pp.kernel;
          double mag = 0;
          for (int t = std::max(0, j - half); t <= std::min(n - 1, j + half); ++t) mag += std::abs(in[std::size_t(r) * stride + t]);
          // Float sums of up to 13 terms and one division: a few roundings of the magnitude.
          REQUIRE(std::abs(double(got) - want) <= 16 * std::ldexp(1.0, -24) * mag / pp.kernel + 1e-44);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// gate mixing: O = z O_dense + (1 - z) O_sparse per KV head's gate (gate_mixing.hpp), in double.

template <class T>
void fuzz_gate_mix_case(std::mt19937_64& rng) {
  kvsift::GateMixShape s;
  s.tokens = pick(rng, 0, 9);
  s.kv_heads = pick(rng, 1, 4);
  s.q_heads = s.kv_heads * pick(rng, 1, 4);
  s.head_dim = pick(rng, 1, 40);
  s.token_stride = chance(rng, 50) ? -1 : std::int64_t(s.q_heads) * s.head_dim + pick(rng, 0, 5);
  const std::size_t n = std::size_t(std::max<std::int64_t>(1, s.tokens * s.row_stride()));
  const fz::ScoreFill fill = chance(rng, 30) ? fz::ScoreFill::kDenormals : chance(rng, 30) ? fz::ScoreFill::kHuge : fz::ScoreFill::kUniform;
  std::vector<T> dense(n), sparse(n), o(n, kvsift::from_float<T>(-9.f));
  // Huge values: the difference dense - sparse must not overflow, so at most half the type's range.
  for (auto& x : dense) x = kvsift::from_float<T>(fz::score_value(rng, fill, largest_finite<T>() / 4, 0.f));
  for (auto& x : sparse) x = kvsift::from_float<T>(fz::score_value(rng, fill, largest_finite<T>() / 4, 0.f));
  std::vector<float> z(std::size_t(s.kv_heads));
  for (auto& x : z) x = chance(rng, 20) ? float(pick(rng, 0, 1)) : std::uniform_real_distribution<float>(0, 1)(rng);
  INFO("tokens " << s.tokens << " q_heads " << s.q_heads << " kv_heads " << s.kv_heads << " d " << s.head_dim << " fill "
                 << std::string(fz::name(fill)));
  REQUIRE(kvsift::host::gate_mix_forward(kvsift::host::Exec{}, s, z.data(), dense.data(), sparse.data(), o.data()).ok());
  for (std::int64_t t = 0; t < s.tokens; ++t)
    for (int h = 0; h < s.q_heads; ++h)
      for (int d = 0; d < s.head_dim; ++d) {
        const std::size_t i = std::size_t(s.offset(t, h, d));
        const double zz = z[std::size_t(h / s.group_size())], a = kvsift::to_float(dense[i]), b = kvsift::to_float(sparse[i]);
        const double want = zz * a + (1 - zz) * b;
        const double got = kvsift::to_float(o[i]);
        // float dense - sparse, one fma, one rounding to T: relative to the operands' magnitude.
        const double tol = (std::is_same_v<T, float> ? 4 * std::ldexp(1.0, -24) : 2 * unit_roundoff<T>()) *
                           (std::abs(a) + std::abs(b) + std::abs(want)) +
                           smallest_step<T>();
        REQUIRE_MESSAGE(std::abs(got - want) <= tol, "O[t " << t << ", h " << h << ", d " << d << "] = " << got
                                                            << ", brute force " << want);
      }
  // Padding between rows: untouched.
  for (std::int64_t t = 0; t < s.tokens; ++t)
    for (std::int64_t e = std::int64_t(s.q_heads) * s.head_dim; e < s.row_stride(); ++e)
      REQUIRE(kvsift::to_float(o[std::size_t(t * s.row_stride() + e)]) == -9.f);
}

TEST_CASE("fuzz host: gate_mix_forward against a float64 mix") {
  for (Family f("host gate_mix", 0.15, "fuzz host: gate_mix_forward against a float64 mix"); f.next();) {
    auto rng = f.rng();
    INFO(f.replay());
    switch (f.index() % 3) {
      case 0: fuzz_gate_mix_case<float>(rng); break;
      case 1: fuzz_gate_mix_case<kvsift::bfloat16_t>(rng); break;
      default: fuzz_gate_mix_case<kvsift::half_t>(rng); break;
    }
  }
}

}  // namespace
