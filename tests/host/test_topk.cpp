// host::topk against a brute force that sorts every row with std::sort on the scores themselves
// (no order keys), then the parameter checks.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "kvsift/ops/score_candidates.hpp"
#include "kvsift/ops/topk_reference.hpp"
#include "support/random.hpp"

using kvsift::bfloat16_t;
using kvsift::half_t;

namespace {

// a ranks before b: flag first (when flags are given), then the larger score; NaN below everything,
// -0 == +0; ties to the lower position.
struct BruteOrder {
  const std::vector<float>* row;
  const std::vector<std::uint8_t>* flags;
  bool operator()(int a, int b) const {
    if (flags && (*flags)[a] != (*flags)[b]) return (*flags)[a] > (*flags)[b];
    const float x = (*row)[a], y = (*row)[b];
    const bool nx = std::isnan(x), ny = std::isnan(y);
    if (nx != ny) return ny;
    if (!nx && x != y) return x > y;
    return a < b;
  }
};

// Selected positions of one row, by the documented rule written out directly.
std::vector<int> brute_force_row(const std::vector<float>& row, const std::vector<std::uint8_t>* flags, int len,
                                 int k, int capacity, int sink, int recent) {
  len = std::clamp(len, 0, int(row.size()));
  k = std::clamp(k, 0, capacity);
  std::vector<bool> forced(std::size_t(len), false);
  for (int i = 0; i < len; ++i) forced[i] = i < sink || i >= len - recent;
  const int n_forced = int(std::count(forced.begin(), forced.end(), true));
  std::vector<int> rest;
  for (int i = 0; i < len; ++i)
    if (!forced[i]) rest.push_back(i);
  std::sort(rest.begin(), rest.end(), BruteOrder{&row, flags});
  const int take = std::clamp(k - n_forced, 0, int(rest.size()));
  std::vector<int> out;
  for (int i = 0; i < len; ++i)
    if (forced[i]) out.push_back(i);
  out.insert(out.end(), rest.begin(), rest.begin() + take);
  std::sort(out.begin(), out.end());
  return out;
}

struct Case {
  int rows = 1, cols = 1, stride_pad = 0, capacity = 1;
  kvsift::TopKParams params;
  std::vector<std::int32_t> lengths, per_row_k;
};

template <class T>
void check_against_brute_force(const Case& c, const std::vector<float>& scores_f, const std::vector<std::uint8_t>* flags,
                               bool nonnegative_key = false) {
  const std::int64_t stride = c.cols + c.stride_pad;
  std::vector<T> scores(std::size_t(std::max<std::int64_t>(c.rows * stride, 1)));
  for (int r = 0; r < c.rows; ++r)
    for (int i = 0; i < c.cols; ++i) scores[r * stride + i] = kvsift::from_float<T>(scores_f[std::size_t(r) * c.cols + i]);
  std::vector<std::int32_t> indices(std::size_t(c.rows) * c.capacity + 1, -7), counts(std::size_t(c.rows) + 1, -7);
  std::vector<T> values(indices.size());
  kvsift::TopKParams p = c.params;
  p.lengths = c.lengths.empty() ? nullptr : c.lengths.data();
  p.per_row_k = c.per_row_k.empty() ? nullptr : c.per_row_k.data();
  auto out = kvsift::make_index_set(indices.data(), counts.data(), c.rows, c.capacity);
  const auto view = kvsift::make_strided_view<const T>(scores.data(), c.rows, c.cols, stride);
  kvsift::Status st;
  if (flags && nonnegative_key) {
    if constexpr (std::is_same_v<T, float>) {
      kvsift::FlagFirstNonNegativeKey key;
      key.flags = flags->data();
      key.row_stride = c.cols;
      st = kvsift::host::topk(kvsift::host::Exec{}, view, p, out, values.data(), key);
    }
  } else if (flags) {
    kvsift::FlagFirstKey<T> key;
    key.flags = flags->data();
    key.row_stride = c.cols;
    st = kvsift::host::topk(kvsift::host::Exec{}, view, p, out, values.data(), key);
  } else {
    st = kvsift::host::topk(kvsift::host::Exec{}, view, p, out, values.data());
  }
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  for (int r = 0; r < c.rows; ++r) {
    // The brute force sees the values the op sees (after rounding to T).
    std::vector<float> row(std::size_t(c.cols));
    std::vector<std::uint8_t> row_flags;
    for (int i = 0; i < c.cols; ++i) row[i] = kvsift::to_float(scores[r * stride + i]);
    if (flags) row_flags.assign(flags->begin() + std::ptrdiff_t(r) * c.cols, flags->begin() + std::ptrdiff_t(r + 1) * c.cols);
    const int len = p.lengths ? p.lengths[r] : c.cols;
    const int k = p.per_row_k ? p.per_row_k[r] : p.k;
    const auto expected = brute_force_row(row, flags ? &row_flags : nullptr, len, k, c.capacity, p.sink, p.recent);
    INFO("row ", r, " len ", len, " k ", k, " sink ", p.sink, " recent ", p.recent);
    REQUIRE(counts[r] == int(expected.size()));
    for (int j = 0; j < counts[r]; ++j) {
      REQUIRE(indices[std::size_t(r) * c.capacity + j] == expected[j]);
      const T v = values[std::size_t(r) * c.capacity + j];
      const T want = scores[r * stride + expected[j]];
      CHECK(std::memcmp(&v, &want, sizeof(T)) == 0);
    }
  }
}

std::vector<float> random_scores(std::mt19937_64& rng, std::size_t n) { return kvsift_test::random_values<float>(rng, n, -4.f, 4.f); }

// Three rows of 10-2000 positions, a random k, and flags (value 1 + trial) at a random density.
Case flagged_case(std::mt19937_64& rng, int trial, std::vector<std::uint8_t>* flags) {
  Case c;
  c.rows = 3;
  c.cols = kvsift_test::uniform_int(rng, 10, 2000);
  c.capacity = c.cols;
  c.params.k = kvsift_test::uniform_int(rng, 0, c.cols);
  flags->assign(std::size_t(c.rows) * c.cols, 0);
  const int density = kvsift_test::uniform_int(rng, 0, 10);
  for (auto& f : *flags) f = kvsift_test::uniform_int(rng, 0, 9) < density ? std::uint8_t(1 + trial) : 0;
  return c;
}

}  // namespace

// The score candidates' threshold rule (ops/score_candidates.hpp): the next threshold lists at least
// what this step selected (never above kth), moves by the wanted extra over the listed extra within
// 1/8 .. 8 times the gap, keeps a threshold every listed score ties at, and is NaN where the scores
// give no finite answer (the next pass then lists nothing).
TEST_CASE("topk host: next_candidate_threshold") {
  using kvsift::next_candidate_threshold;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // budget 4096: the wanted extra is 1088; 1088 listed past the budget keep the gap.
  CHECK(next_candidate_threshold(2.f, 1.f, 4096 + 1088, 4096) == 1.f);
  CHECK(next_candidate_threshold(2.f, 1.f, 4096 + 2176, 4096) == 1.5f);  // twice the extra: half the gap
  CHECK(next_candidate_threshold(2.f, 1.f, 4096 + 100000, 4096) == 2.f - 0.125f);  // at most 8 times closer
  CHECK(next_candidate_threshold(2.f, 1.f, 4096, 4096) == 2.f - 8.f);  // nothing past the budget: 8 gaps
  CHECK(next_candidate_threshold(2.f, 1.f, 4097, 4096) == 2.f - 8.f);  // 1088x the gap, clamped to 8
  CHECK(next_candidate_threshold(-3.f, -3.f, 5000, 4096) == -3.f);      // every listed score ties
  CHECK(std::isnan(next_candidate_threshold(2.f, -inf, 5000, 4096)));  // listed everything: no finite gap
  CHECK(std::isnan(next_candidate_threshold(2.f, nan, 5000, 4096)));
  CHECK(std::isnan(next_candidate_threshold(-inf, -inf, 5000, 4096)));
  CHECK(std::isnan(next_candidate_threshold(-3e38f, 3e38f, 5000, 4096)));  // kth below the threshold
  CHECK(std::isnan(next_candidate_threshold(3e38f, -3e38f, 5000, 4096)));  // the gap overflows
  auto rng = kvsift_test::make_rng(171);
  for (int i = 0; i < 10000; ++i) {
    const float kth = std::uniform_real_distribution<float>(-50.f, 50.f)(rng);
    const float used = kth - std::uniform_real_distribution<float>(0.f, 10.f)(rng);
    const int budget = kvsift_test::uniform_int(rng, 1, 8192);
    const int listed = budget + kvsift_test::uniform_int(rng, 0, 20000);
    const float t = next_candidate_threshold(kth, used, listed, budget);
    INFO(kth, " ", used, " ", listed, " ", budget);
    REQUIRE(t <= kth);
    // At least an eighth of the gap below kth (up to the rounding of kth - gap * scale near kth).
    if (used < kth) REQUIRE(kth - t >= (kth - used) * 0.125f - 1e-6f * (1.f + std::fabs(kth)));
  }
}

TEST_CASE("topk host: random rows, every dtype, ragged lengths, per-row k") {
  auto rng = kvsift_test::make_rng(301);
  for (int trial = 0; trial < 40; ++trial) {
    Case c;
    c.rows = kvsift_test::uniform_int(rng, 1, 6);
    c.cols = kvsift_test::uniform_int(rng, 1, 3000);
    c.stride_pad = kvsift_test::uniform_int(rng, 0, 5);
    c.capacity = kvsift_test::uniform_int(rng, 1, c.cols + 10);
    c.params.k = kvsift_test::uniform_int(rng, 0, c.capacity);
    c.params.sink = kvsift_test::uniform_int(rng, 0, 2) ? 0 : kvsift_test::uniform_int(rng, 0, c.capacity / 3);
    c.params.recent = kvsift_test::uniform_int(rng, 0, 2) ? 0 : kvsift_test::uniform_int(rng, 0, c.capacity / 3);
    if (trial % 2) {
      for (int r = 0; r < c.rows; ++r) c.lengths.push_back(kvsift_test::uniform_int(rng, -2, c.cols + 3));
    }
    if (trial % 3 == 0) {
      for (int r = 0; r < c.rows; ++r) c.per_row_k.push_back(kvsift_test::uniform_int(rng, -2, c.capacity + 3));
    }
    const auto s = random_scores(rng, std::size_t(c.rows) * c.cols);
    CAPTURE(trial);
    check_against_brute_force<float>(c, s, nullptr);
    check_against_brute_force<half_t>(c, s, nullptr);
    check_against_brute_force<bfloat16_t>(c, s, nullptr);
  }
}

TEST_CASE("topk host: ties, equal leading bits, +-inf, NaN, signed zeros") {
  auto rng = kvsift_test::make_rng(302);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int pattern = 0; pattern < 5; ++pattern) {
    Case c;
    c.rows = 3;
    c.cols = 1000;
    c.capacity = 400;
    c.params.k = 300;
    std::vector<float> s(std::size_t(c.rows) * c.cols);
    for (auto& x : s) {
      const int u = kvsift_test::uniform_int(rng, 0, 9);
      switch (pattern) {
        case 0: x = float(u % 3); break;                                       // many equal values
        case 1: x = 1.0f + float(u) * std::numeric_limits<float>::epsilon(); break;  // equal leading bits
        case 2: x = u == 0 ? inf : (u == 1 ? -inf : float(u)); break;
        case 3: x = u < 3 ? nan : (u == 3 ? -inf : float(u) - 5.f); break;
        default: x = u < 5 ? 0.0f : -0.0f; break;
      }
    }
    CAPTURE(pattern);
    check_against_brute_force<float>(c, s, nullptr);
    check_against_brute_force<half_t>(c, s, nullptr);
    check_against_brute_force<bfloat16_t>(c, s, nullptr);
  }
}

TEST_CASE("topk host: k = 1, k = len, k > len, len = 0") {
  auto rng = kvsift_test::make_rng(303);
  Case c;
  c.rows = 4;
  c.cols = 257;
  c.capacity = 300;
  c.lengths = {0, 1, 257, 100};
  const auto s = random_scores(rng, std::size_t(c.rows) * c.cols);
  for (int k : {0, 1, 100, 257, 300}) {
    c.params.k = k;
    CAPTURE(k);
    check_against_brute_force<float>(c, s, nullptr);
  }
}

TEST_CASE("topk host: forced sink and recent ranges overlap or exceed the row") {
  auto rng = kvsift_test::make_rng(304);
  Case c;
  c.rows = 5;
  c.cols = 600;
  c.capacity = 700;
  c.lengths = {0, 3, 200, 383, 600};
  const auto s = random_scores(rng, std::size_t(c.rows) * c.cols);
  for (int sink : {0, 128, 400}) {
    for (int recent : {0, 256}) {
      for (int k : {0, 50, 384, 500, 700}) {
        c.params.sink = sink;
        c.params.recent = recent;
        c.params.k = k;
        CAPTURE(sink);
        CAPTURE(recent);
        CAPTURE(k);
        check_against_brute_force<float>(c, s, nullptr);
      }
    }
  }
}

TEST_CASE("topk host: forced positions counted inside the budget (LycheeDecode token mode)") {
  std::vector<float> s(5000);
  std::iota(s.begin(), s.end(), 0.f);  // the best scores sit in the recent window
  std::vector<std::int32_t> idx(1024), count(1);
  kvsift::TopKParams p;
  p.k = 1024;
  p.sink = 128;
  p.recent = 256;
  const auto st = kvsift::host::topk(kvsift::host::Exec{}, kvsift::make_strided_view<const float>(s.data(), 1, 5000), p,
                                     kvsift::make_index_set(idx.data(), count.data(), 1, 1024));
  REQUIRE(st.ok());
  CHECK(count[0] == 1024);
  CHECK(idx[0] == 0);
  CHECK(idx[127] == 127);
  CHECK(idx[128] == 5000 - 256 - 640);  // 640 = 1024 - 384 chosen by score: the highest below the window
  CHECK(idx[1023] == 4999);
}

TEST_CASE("topk host: composite keys put flagged positions first") {
  auto rng = kvsift_test::make_rng(305);
  for (int trial = 0; trial < 10; ++trial) {
    std::vector<std::uint8_t> flags;
    const Case c = flagged_case(rng, trial, &flags);
    const auto s = random_scores(rng, flags.size());
    CAPTURE(trial);
    check_against_brute_force<float>(c, s, &flags);
    check_against_brute_force<half_t>(c, s, &flags);
    check_against_brute_force<bfloat16_t>(c, s, &flags);
  }
}

TEST_CASE("topk: FlagFirstNonNegativeKey orders NaN and non-negative fp32 scores as FlagFirstKey<float> does") {
  // Key against key: every pair of special values (NaN payloads of both signs, +-0, the smallest
  // denormal, FLT_MIN, 1, FLT_MAX, +inf) and random non-negative bit patterns, flagged or not: the
  // 32-bit key's compare (<, ==) equals the 33-bit one's; negative scores rank as +0.
  using Wide = kvsift::FlagFirstKey<float>;
  using Narrow = kvsift::FlagFirstNonNegativeKey;
  auto rng = kvsift_test::make_rng(612);
  std::vector<std::uint32_t> bits = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffffffffu, 0x00000000u, 0x80000000u,
                                     0x00000001u, 0x00800000u, 0x3f800000u, 0x7f7fffffu, 0x7f800000u};
  for (int i = 0; i < 1500; ++i) bits.push_back(std::uint32_t(rng()) % 0x7f800001u);  // [+0, +inf]
  const std::uint8_t flag_values[2] = {0, 1};
  Wide wide;
  Narrow narrow;
  wide.flags = narrow.flags = flag_values;
  wide.row_stride = narrow.row_stride = 0;
  std::int64_t pairs = 0;
  for (std::uint32_t a : bits)
    for (std::uint32_t b : bits)
      for (int fa = 0; fa < 2; ++fa) {
        const int fb = int(rng() & 1u);
        const float x = kvsift::detail::bits_to_float(a), y = kvsift::detail::bits_to_float(b);
        const auto wa = wide(x, 0, fa), wb = wide(y, 0, fb);
        const auto na = narrow(x, 0, fa), nb = narrow(y, 0, fb);
        if ((wa < wb) != (na < nb) || (wa == wb) != (na == nb)) {
          INFO("bits ", a, " flag ", fa, " against bits ", b, " flag ", fb);
          REQUIRE((wa < wb) == (na < nb));
          REQUIRE((wa == wb) == (na == nb));
        }
        ++pairs;
      }
  CHECK(pairs > 4000000);
  CHECK(narrow(-1.f, 0, 0) == narrow(0.f, 0, 0));
  CHECK(narrow(-std::numeric_limits<float>::infinity(), 0, 1) == narrow(-0.f, 0, 1));
  CHECK(narrow(std::numeric_limits<float>::infinity(), 0, 1) == 0xff800001u);  // below the register select's sentinel
  CHECK(narrow(std::numeric_limits<float>::quiet_NaN(), 0, 0) == 0u);

  // The host top-k with the 32-bit key against the brute force, on rows with NaN, ties, zeros of both
  // signs, denormals and +inf.
  for (int trial = 0; trial < 10; ++trial) {
    std::vector<std::uint8_t> flags;
    Case c = flagged_case(rng, trial, &flags);
    c.params.sink = kvsift_test::uniform_int(rng, 0, 4);
    auto s = random_scores(rng, flags.size());
    for (auto& x : s) {
      const int u = kvsift_test::uniform_int(rng, 0, 40);
      x = u == 0 ? std::numeric_limits<float>::quiet_NaN()
          : u == 1 ? std::numeric_limits<float>::infinity()
          : u == 2 ? -0.f
          : u == 3 ? std::numeric_limits<float>::denorm_min()
          : u < 10 ? 0.25f  // ties
                   : std::fabs(x);
    }
    CAPTURE(trial);
    check_against_brute_force<float>(c, s, &flags, /*nonnegative_key=*/true);
  }
}

TEST_CASE("topk host: bad parameters are reported by name") {
  std::vector<float> s(64, 1.f);
  std::vector<std::int32_t> idx(32), count(2);
  const auto view = kvsift::make_strided_view<const float>(s.data(), 2, 32);
  const auto out = kvsift::make_index_set(idx.data(), count.data(), 2, 16);
  kvsift::host::Exec exec;
  auto expect = [&](kvsift::Status st, kvsift::StatusCode code, const char* needle) {
    CHECK(st.code() == code);
    CHECK_MESSAGE(st.message().find(needle) != std::string::npos, st.to_string());
  };
  kvsift::TopKParams p;
  p.k = -1;
  expect(kvsift::host::topk(exec, view, p, out), kvsift::StatusCode::kInvalidArgument, "k = -1");
  p.k = 17;
  expect(kvsift::host::topk(exec, view, p, out), kvsift::StatusCode::kInvalidArgument, "k = 17 exceeds out.capacity");
  p.k = 4;
  p.sink = -3;
  expect(kvsift::host::topk(exec, view, p, out), kvsift::StatusCode::kInvalidArgument, "sink = -3");
  p.sink = 10;
  p.recent = 7;
  expect(kvsift::host::topk(exec, view, p, out), kvsift::StatusCode::kInvalidArgument, "sink + recent = 17");
  p.sink = p.recent = 0;
  expect(kvsift::host::topk(exec, kvsift::make_strided_view<const float>(s.data(), 2, -1), p, out),
         kvsift::StatusCode::kInvalidArgument, "scores.cols = -1");
  expect(kvsift::host::topk(exec, kvsift::make_strided_view<const float>(nullptr, 2, 32), p, out),
         kvsift::StatusCode::kNullPointer, "scores.data");
  expect(kvsift::host::topk(exec, kvsift::make_strided_view<const float>(s.data(), 2, 32, 16), p, out),
         kvsift::StatusCode::kInvalidArgument, "scores.row_stride = 16");
  const auto* odd = reinterpret_cast<const float*>(reinterpret_cast<const char*>(s.data()) + 1);
  expect(kvsift::host::topk(exec, kvsift::make_strided_view<const float>(odd, 1, 8), p, out),
         kvsift::StatusCode::kMisaligned, "scores.data");
  expect(kvsift::host::topk(exec, view, p, kvsift::make_index_set(nullptr, count.data(), 2, 16)),
         kvsift::StatusCode::kNullPointer, "out.indices");
  expect(kvsift::host::topk(exec, view, p, kvsift::make_index_set(idx.data(), nullptr, 2, 16)),
         kvsift::StatusCode::kNullPointer, "out.counts");
  expect(kvsift::host::topk(exec, view, p, kvsift::make_index_set(idx.data(), count.data(), 1, 16)),
         kvsift::StatusCode::kInvalidArgument, "out.rows = 1");
  expect(kvsift::host::topk(exec, view, p, out, static_cast<float*>(nullptr), kvsift::FlagFirstKey<float>{}),
         kvsift::StatusCode::kNullPointer, "key.flags");
  // Valid corner: zero rows, k = 0.
  CHECK(kvsift::host::topk(exec, kvsift::make_strided_view<const float>(s.data(), 0, 32), p, out).ok());
}

TEST_CASE("topk: workspace query needs no device memory") {
  std::vector<std::int32_t> idx(16), count(1);
  kvsift::TopKParams p;
  std::size_t bytes = 1;
  CHECK(kvsift::topk_workspace_bytes<float>(kvsift::host::Exec{}, kvsift::make_strided_view<const float>(nullptr, 1, 1 << 20),
                                            p, kvsift::make_index_set(idx.data(), count.data(), 1, 16), &bytes)
            .ok());
  CHECK(bytes == 0);
}

TEST_CASE("topk: the row filter leaves sparse heads' rows untouched") {
  const int heads = 4, batch = 3, cols = 50, cap = 10;
  std::vector<float> scores(std::size_t(batch) * heads * cols);
  for (std::size_t i = 0; i < scores.size(); ++i) scores[i] = float((i * 37) % 101);
  std::vector<std::int32_t> idx(std::size_t(batch) * heads * cap, 777), counts(std::size_t(batch) * heads, 555);
  kvsift::TopKParams p;
  p.k = cap;
  p.num_kv_heads = heads;
  p.roles.set_sparse(1, true);
  p.roles.set_sparse(2, true);
  const auto out = kvsift::make_index_set(idx.data(), counts.data(), batch * heads, cap);
  REQUIRE(kvsift::host::topk(kvsift::host::Exec{}, kvsift::make_strided_view<const float>(scores.data(), batch * heads, cols),
                             p, out)
              .ok());
  for (int r = 0; r < batch * heads; ++r) {
    const bool sparse = r % heads == 1 || r % heads == 2;
    CHECK(kvsift::topk_skips_row(p, r) == sparse);
    CHECK(counts[std::size_t(r)] == (sparse ? 555 : cap));
    for (int j = 0; j < cap; ++j) {
      const int v = idx[std::size_t(r) * cap + j];
      if (sparse) CHECK(v == 777);
      else CHECK((v >= 0 && v < cols));
    }
  }
  p.num_kv_heads = -1;
  const auto st = kvsift::host::topk(kvsift::host::Exec{}, kvsift::make_strided_view<const float>(scores.data(), batch * heads, cols), p, out);
  CHECK(st.message().find("num_kv_heads = -1") != std::string::npos);
}

TEST_CASE("topk: the written rows of a filtered call, counted and enumerated in row order") {
  // topk_written_rows / topk_written_row size and map the CUDA launch: they must enumerate exactly the
  // rows topk_skips_row lets through, in ascending order, for any mask (past one 64-bit word too) and
  // row count (a partial last sequence too).
  auto rng = kvsift_test::make_rng(311);
  for (int trial = 0; trial < 400; ++trial) {
    kvsift::TopKParams p;
    p.num_kv_heads = trial < 8 ? std::vector<int>{1, 2, 8, 63, 64, 65, 128, 256}[std::size_t(trial)]
                               : kvsift_test::uniform_int(rng, 1, kvsift::kMaxKvHeads);
    const int density = kvsift_test::uniform_int(rng, 0, 100);
    // Set bits past num_kv_heads too: they belong to no head and must not count.
    for (int h = 0; h < kvsift::kMaxKvHeads; ++h)
      p.roles.set_sparse(h, h >= p.num_kv_heads ? kvsift_test::uniform_int(rng, 0, 1) == 1
                                                 : kvsift_test::uniform_int(rng, 0, 99) >= density);
    const std::int64_t rows = kvsift_test::uniform_int(rng, 0, 3 * p.num_kv_heads + 5);
    CAPTURE(trial);
    CAPTURE(p.num_kv_heads);
    CAPTURE(rows);
    std::vector<std::int64_t> want;
    for (std::int64_t r = 0; r < rows; ++r)
      if (!kvsift::topk_skips_row(p, r)) want.push_back(r);
    int retrieval = 0;
    for (int h = 0; h < p.num_kv_heads; ++h) retrieval += p.roles.is_retrieval(h);
    REQUIRE(p.roles.count_retrieval(p.num_kv_heads) == retrieval);
    REQUIRE(p.roles.count_sparse(p.num_kv_heads) == p.num_kv_heads - retrieval);
    for (int n = 0, h = 0; h < p.num_kv_heads; ++h)
      if (p.roles.is_retrieval(h)) REQUIRE(p.roles.nth_retrieval(n++, p.num_kv_heads) == h);
    CHECK(p.roles.nth_retrieval(retrieval, p.num_kv_heads) == -1);
    REQUIRE(kvsift::topk_written_rows(p, rows) == std::int64_t(want.size()));
    for (std::size_t i = 0; i < want.size(); ++i) REQUIRE(kvsift::topk_written_row(p, std::int64_t(i)) == want[i]);
  }
  kvsift::TopKParams all;
  CHECK(kvsift::topk_written_rows(all, 77) == 77);
  CHECK(kvsift::topk_written_row(all, 76) == 76);
  CHECK(kvsift::HeadRoleMask().count_sparse(0) == 0);
  CHECK(kvsift::HeadRoleMask::all_sparse(8).count_retrieval(8) == 0);
}

TEST_CASE("topk plan: the kernel, CTA group and CTA size per benchmarked shape (H200 facts)") {
  using kvsift::detail::TopkKernel;
  const kvsift::DeviceFacts h200{132, 232448, true, 9, 0};
  // bracket: the sampled bracket's list (8192 32-bit keys) for groups of 8 whose grid fits one CTA
  // per SM. Groups grow while the grid stays within 7/8 of the SMs (115 CTAs on 132).
  struct Want { std::int64_t rows; int cols; int group, slice, threads; bool bracket; };
  // The target shapes: fp32 scores, 32-bit keys.
  for (const Want w : {Want{8, 32768, 8, 4096, 512, true}, Want{16, 32768, 4, 8192, 512, false},
                       Want{32, 32768, 2, 16384, 512, false}, Want{64, 32768, 2, 16384, 512, false},
                       Want{1, 131072, 8, 16384, 512, true}, Want{8, 131072, 8, 16384, 512, true},
                       Want{14, 131072, 8, 16384, 512, true}, Want{15, 131072, 4, 32768, 512, false},
                       Want{16, 131072, 4, 32768, 512, false}, Want{28, 131072, 4, 32768, 512, false},
                       Want{8, 2048, 1, 2048, 256, false}, Want{64, 2048, 1, 2048, 256, false},
                       Want{256, 2048, 1, 2048, 256, false}}) {
    const auto p = kvsift::detail::plan_topk_cta_groups<std::uint32_t>(w.rows, w.cols, h200);
    CAPTURE(w.rows);
    CAPTURE(w.cols);
    CHECK(p.kernel == TopkKernel::kCandidateSelect);
    CHECK(p.ctas_per_row == w.group);
    CHECK(p.slice == w.slice);
    CHECK(p.threads == w.threads);
    CHECK(p.bracket_capacity == (w.bracket ? 8192 : 0));
    // keys + 16-bit candidate offsets (+ the bracket's list)
    CHECK(p.smem_bytes == std::size_t(w.slice) * 6 + (w.bracket ? kvsift::detail::kTopkBracketListBytes : 0));
    // Two CTAs per SM where the slice allows it and the grid needs them: dynamic + static + the 1 KiB
    // per-block reserve; one CTA with all of an SM's shared memory where the bracket takes it.
    if (w.bracket) CHECK(p.smem_bytes + kvsift::detail::kTopkCandStaticSmem <= h200.max_smem_optin);
    else if (w.slice <= 16384) CHECK(2 * (p.smem_bytes + kvsift::detail::kTopkCandStaticSmem) <= 233472);
  }
  // Many long rows: their CTA groups would need more than one wave (231 CTAs of groups of 8 on 132
  // SMs), so one CTA per row streams it, sampling one sector in 16.
  // Two CTAs per SM: dynamic + static + the 1 KiB per-block reserve within the SM's 228 KiB.
  struct Stream { std::int64_t rows; int cols; int list; };
  for (const Stream w : {Stream{256, 32768, 9728}, Stream{256, 131072, 8192}, Stream{64, 131072, 8192},
                         Stream{32, 131072, 8192}, Stream{128, 32768, 9728}}) {
    const auto p = kvsift::detail::plan_topk<std::uint32_t>(w.rows, w.cols, h200);
    CAPTURE(w.rows);
    CAPTURE(w.cols);
    CHECK(p.kernel == TopkKernel::kStreamSelect);
    CHECK(p.ctas_per_row == 1);
    CHECK(p.threads == 512);
    CHECK(std::int64_t(p.bitmap_words) * 32 >= w.cols);
    CHECK(p.bitmap_words % 2 == 0);
    CHECK(p.list_capacity == w.list);
    CHECK(p.sample_period == 16);
    CHECK(p.smem_bytes == std::size_t(p.bitmap_words) * 4 + std::size_t(p.list_capacity) * 8);  // ties in the histogram
    CHECK(2 * (p.smem_bytes + kvsift::detail::kTopkStreamStaticSmem + 1024) <= 233472);
  }
  // A few long rows with 32-bit keys: the register select in the largest group whose grid fits
  // (groups of 16 up to half the SMs, smaller ones up to 7/8 of them), 256 threads with 8 or 16 keys
  // a thread where that covers the row, else 512 threads with 16 or 32 (8 rows of 128K in groups of
  // 8, LycheeDecode's retrieval rows at batch 8); rows of up to 131072 positions, one CTA an SM.
  struct Reg { std::int64_t rows; int cols; int group, threads, keys; };
  for (const Reg w : {Reg{1, 32768, 16, 256, 8}, Reg{4, 32768, 16, 256, 8}, Reg{8, 32768, 8, 256, 16},
                      Reg{14, 32768, 8, 256, 16}, Reg{4, 131072, 16, 512, 16}, Reg{1, 131072, 16, 512, 16},
                      Reg{2, 65536, 16, 256, 16}, Reg{3, 16384, 8, 256, 8}, Reg{14, 65536, 8, 512, 16},
                      Reg{5, 65544, 8, 512, 32}, Reg{8, 131072, 8, 512, 32}, Reg{14, 131072, 8, 512, 32},
                      Reg{5, 32771, 8, 512, 16}}) {
    const auto p = kvsift::detail::plan_topk<std::uint32_t>(w.rows, w.cols, h200);
    CAPTURE(w.rows);
    CAPTURE(w.cols);
    CHECK(p.kernel == TopkKernel::kRegisterSelect);
    CHECK(p.ctas_per_row == w.group);
    CHECK(p.threads == w.threads);
    CHECK(p.slice == w.threads * w.keys);
    CHECK(p.list_capacity == kvsift::detail::kTopkRegOwnListKeys);
    CHECK(p.bracket_capacity == kvsift::detail::kTopkRegCopyKeys);
    CHECK(p.smem_bytes == std::size_t(p.list_capacity + p.bracket_capacity) * 4);
    CHECK(p.smem_bytes + kvsift::detail::kTopkRegStaticSmem <= h200.max_smem_optin);
    CHECK(2 * (p.smem_bytes + kvsift::detail::kTopkRegStaticSmem + 1024) > 233472);  // one CTA per SM
  }
  // Not where the lists do not fit beside the static histograms (a 100 KiB opt-in).
  CHECK(kvsift::detail::plan_topk<std::uint32_t>(8, 131072, kvsift::DeviceFacts{132, 100 * 1024, true, 9, 0}).kernel !=
        TopkKernel::kRegisterSelect);
  // Forced groups and CTA sizes: groups of 16 on 8 rows of 32K (two waves: measurement only), 512
  // threads where 256 would do, 256 threads where they cannot cover the row, other CTA sizes.
  CHECK(kvsift::detail::plan_topk_register<std::uint32_t>(8, 32768, 16, h200).ctas_per_row == 16);
  CHECK(kvsift::detail::plan_topk_register<std::uint32_t>(8, 32768, 16, h200).threads == 256);
  const auto wide = kvsift::detail::plan_topk_register<std::uint32_t>(8, 32768, 8, h200, 512);
  CHECK(wide.kernel == TopkKernel::kRegisterSelect);
  CHECK(wide.threads == 512);
  CHECK(wide.ctas_per_row == 4);  // 4 x 512 x 16 keys cover 32K
  CHECK(kvsift::detail::plan_topk_register<std::uint32_t>(1, 131072, 16, h200, 256).kernel != TopkKernel::kRegisterSelect);
  CHECK(kvsift::detail::plan_topk_register<std::uint32_t>(1, 32768, 16, h200, 1024).kernel != TopkKernel::kRegisterSelect);
  // Not taken: 64-bit keys, rows past kTopkRegMaxCols positions, more rows than groups of 8 fit one
  // CTA per SM on 7/8 of the SMs, no clusters.
  CHECK(kvsift::detail::plan_topk<std::uint64_t>(8, 32768, h200).kernel == TopkKernel::kCandidateSelect);
  CHECK(kvsift::detail::plan_topk<std::uint32_t>(8, 131080, h200).kernel == TopkKernel::kCandidateSelect);
  CHECK(kvsift::detail::plan_topk<std::uint32_t>(15, 131072, h200).kernel != TopkKernel::kRegisterSelect);
  CHECK(kvsift::detail::plan_topk<std::uint32_t>(15, 32768, h200).kernel == TopkKernel::kCandidateSelect);
  CHECK(kvsift::detail::plan_topk<std::uint32_t>(8, 32768, kvsift::DeviceFacts{132, 232448, false, 9, 0}).kernel ==
        TopkKernel::kCandidateSelect);
  // Rows of up to 4096 positions (LycheeDecode's block scores): the short-row select, one 256-thread
  // CTA a row with 8 keys a thread up to 2048 positions, 16 up to 4096, with or without clusters, for
  // 32- and 64-bit keys; longer rows keep the CTA-group plan.
  struct Short { std::int64_t rows; int cols; int keys; };
  for (const Short w : {Short{8, 2048, 8}, Short{64, 2048, 8}, Short{256, 2048, 8}, Short{1, 1, 8}, Short{3, 2049, 16},
                        Short{4096, 4096, 16}, Short{1, 100, 8}}) {
    for (const kvsift::DeviceFacts& d : {h200, kvsift::DeviceFacts{132, 232448, false, 9, 0}}) {
      for (const auto& p : {kvsift::detail::plan_topk<std::uint32_t>(w.rows, w.cols, d),
                            kvsift::detail::plan_topk<std::uint64_t>(w.rows, w.cols, d)}) {
        CAPTURE(w.rows);
        CAPTURE(w.cols);
        CHECK(p.kernel == TopkKernel::kShortRowSelect);
        CHECK(p.ctas_per_row == 1);
        CHECK(p.threads == 256);
        CHECK(p.slice == 256 * w.keys);
        CHECK(p.smem_bytes == 0);
      }
    }
  }
  // Key policies without a sentinel (register_select false) keep the short-row select and skip only
  // the register select.
  CHECK(kvsift::detail::plan_topk<std::uint32_t>(8, 32768, h200, false).kernel == TopkKernel::kCandidateSelect);
  CHECK(kvsift::detail::plan_topk<std::uint32_t>(8, 2048, h200, false).kernel == TopkKernel::kShortRowSelect);
  CHECK(kvsift::detail::plan_topk<std::uint32_t>(8, 4097, h200).kernel == TopkKernel::kCandidateSelect);
  CHECK(kvsift::detail::plan_topk<std::uint64_t>(8, 4097, h200).kernel == TopkKernel::kCandidateSelect);
  CHECK(kvsift::detail::plan_topk_short_row<std::uint32_t>(0).kernel != TopkKernel::kShortRowSelect);
  // LycheeDecode's retrieval layer at batch 8, 128K, one retrieval head of 8: the call has 64 rows
  // (the stream select's shape) but writes 8, and is planned as 8 rows (the register select in
  // 512-thread groups of 8).
  kvsift::TopKParams filtered;
  filtered.num_kv_heads = 8;
  for (int h = 1; h < 8; ++h) filtered.roles.set_sparse(h, true);
  const auto layer = kvsift::detail::plan_topk<std::uint32_t>(kvsift::topk_written_rows(filtered, 64), 131072, h200);
  CHECK(kvsift::topk_written_rows(filtered, 64) == 8);
  CHECK(layer.kernel == TopkKernel::kRegisterSelect);
  CHECK(layer.ctas_per_row == 8);
  CHECK(layer.threads == 512);
  CHECK(layer.bracket_capacity == kvsift::detail::kTopkRegCopyKeys);
  // Rows too long for two CTAs per SM get one, with the largest list that fits.
  const auto longest = kvsift::detail::plan_topk_stream<std::uint32_t>(1 << 19, h200);
  CHECK(longest.list_capacity > 0);
  CHECK(longest.smem_bytes + kvsift::detail::kTopkStreamStaticSmem <= 232448);
  CHECK(kvsift::detail::plan_topk_stream<std::uint32_t>(1 << 20, h200).list_capacity == 0);  // bitmaps alone too big
  // 33-bit flag-first keys of 128K rows still fit; 600000-position rows fall back to the radix select.
  CHECK(kvsift::detail::plan_topk<std::uint64_t>(5, 131072, h200).kernel == TopkKernel::kCandidateSelect);
  CHECK(kvsift::detail::plan_topk<std::uint32_t>(2, 600000, h200).kernel == TopkKernel::kRadixSelect);
  CHECK(kvsift::detail::plan_topk<std::uint64_t>(1, 700000, h200).kernel == TopkKernel::kRadixSelect);
  // Without clusters, rows up to ~35K positions keep the candidate select in one CTA.
  const kvsift::DeviceFacts no_clusters{132, 232448, false, 9, 0};
  const auto one = kvsift::detail::plan_topk<std::uint32_t>(32, 32768, no_clusters);
  CHECK(one.kernel == TopkKernel::kCandidateSelect);
  CHECK(one.ctas_per_row == 1);
  // Longer ones would be re-read on every radix pass: they stream instead.
  CHECK(kvsift::detail::plan_topk<std::uint32_t>(32, 131072, no_clusters).kernel == TopkKernel::kStreamSelect);
}

// Special floats as bits (NaN payloads of both signs, +-inf, +-0, denormals, the smallest normals,
// +-FLT_MAX, +-1) and `random` random bit patterns: what the order-key tests compare over.
static std::vector<std::uint32_t> order_key_test_floats(std::uint64_t seed, int random) {
  auto rng = kvsift_test::make_rng(seed);
  std::vector<std::uint32_t> values = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffffffffu,
                                       0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u,
                                       0x007fffffu, 0x807fffffu, 0x00800000u, 0x80800000u, 0x7f7fffffu, 0xff7fffffu,
                                       0x3f800000u, 0xbf800000u};
  for (int i = 0; i < random; ++i) values.push_back(std::uint32_t(rng()));
  return values;
}

TEST_CASE("topk: float_order_key orders the floats, NaN lowest at 0, the zeros as one") {
  // The key's whole contract against float compares, pairwise over special floats and random bits.
  using kvsift::detail::bits_to_float;
  using kvsift::detail::float_order_key;
  const std::vector<std::uint32_t> values = order_key_test_floats(607, 1500);
  for (std::uint32_t v : values) {
    const float x = bits_to_float(v);
    if (std::isnan(x)) {
      REQUIRE(float_order_key(x) == 0u);
    } else {
      REQUIRE(float_order_key(x) > 0u);  // every non-NaN float ranks above NaN
    }
  }
  for (std::uint32_t va : values)
    for (std::uint32_t vb : values) {
      const float a = bits_to_float(va), b = bits_to_float(vb);
      if (std::isnan(a) || std::isnan(b)) continue;
      const std::uint32_t ka = float_order_key(a), kb = float_order_key(b);
      if ((a < b) != (ka < kb) || (a == b) != (ka == kb)) {
        INFO("bits ", va, " and ", vb);
        REQUIRE((a < b) == (ka < kb));
        REQUIRE((a == b) == (ka == kb));
      }
    }
}

TEST_CASE("topk: float_order_threshold's float compare equals the order-key compare") {
  // Every special float (NaN payloads of both signs, +-inf, +-0, denormals, +-FLT_MAX) and random
  // bit patterns, against keys at every boundary (just below / at / above -inf's and +inf's keys, the
  // zeros' key and its neighbours) and random keys; then the reduced keys of fp16 and bf16 scores.
  using kvsift::detail::float_order_key;
  using kvsift::detail::float_order_threshold;
  auto rng = kvsift_test::make_rng(611);
  const std::vector<std::uint32_t> values = order_key_test_floats(613, 3000);
  std::vector<std::uint32_t> keys = {1u, 2u, 0x007ffffeu, 0x007fffffu, 0x00800000u, 0x7ffffffeu, 0x7fffffffu,
                                     0x80000000u, 0x80000001u, 0xff7fffffu, 0xff800000u, 0xff800001u, 0xfffffffeu,
                                     0xffffffffu};
  for (std::uint32_t v : values) keys.push_back(float_order_key(kvsift::detail::bits_to_float(v)));
  for (int i = 0; i < 300; ++i) keys.push_back(std::uint32_t(rng()) | 1u);
  int checked = 0;
  for (std::uint32_t key : keys) {
    if (key == 0) continue;  // key 0 admits NaN: the stream select keeps the key compare there
    const float t = float_order_threshold(key);
    for (std::uint32_t v : values) {
      const float x = kvsift::detail::bits_to_float(v);
      if ((x >= t) != (float_order_key(x) >= key)) {
        INFO("value bits ", v, ", key ", key);
        REQUIRE((x >= t) == (float_order_key(x) >= key));
      }
      ++checked;
    }
  }
  CHECK(checked > 900000);
  // ScoreKey<T> reduces the key to its top kBits bits: key >= T exactly when the full key >= T << (32 - kBits).
  auto reduced = [&](auto tag) {
    using T = decltype(tag);
    using Key = kvsift::ScoreKey<T>;
    for (int i = 0; i < 20000; ++i) {
      const std::uint16_t bits = std::uint16_t(rng());
      T score;
      std::memcpy(&score, &bits, sizeof score);
      const std::uint32_t threshold = (std::uint32_t(rng()) >> (32 - Key::kBits)) | 1u;
      const float t = float_order_threshold(threshold << (32 - Key::kBits));
      REQUIRE((kvsift::dtype_traits<T>::to_float(score) >= t) == (Key{}(score, 0, 0) >= threshold));
    }
  };
  reduced(kvsift::half_t{});
  reduced(kvsift::bfloat16_t{});
}
