#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kvsift/kvsift.hpp"
#include "support/kv_fixtures.hpp"

using kvsift::PageLayout;
using kvsift_test::ContiguousFixture;
using kvsift_test::ContiguousLayout;
using kvsift_test::KVShape;
using kvsift_test::PagedFixture;

namespace {
KVShape random_shape(std::mt19937_64& rng) {
  return KVShape{kvsift_test::uniform_int(rng, 1, 3), kvsift_test::uniform_int(rng, 1, 4),
                 kvsift_test::uniform_int(rng, 1, 70), kvsift_test::uniform_int(rng, 1, 9)};
}

// Every live element read through the view's k_row/v_row equals the fixture's encoding.
template <class View>
void check_every_row(const View& kv, const KVShape& s) {
  for (int b = 0; b < kv.batch; ++b)
    for (int h = 0; h < kv.num_kv_heads; ++h)
      for (int t = 0; t < kv.length(b); ++t)
        for (int i = 0; i < kv.head_dim; ++i) {
          REQUIRE(kv.k_row(b, h, t)[i] == kvsift_test::encode(s, b, h, t, i));
          REQUIRE(kv.v_row(b, h, t)[i] == -kvsift_test::encode(s, b, h, t, i));
        }
}
}  // namespace

TEST_CASE("ContiguousKV address math matches brute force for BHSD, BSHD and padded strides") {
  auto rng = kvsift_test::make_rng(10);
  for (int trial = 0; trial < 30; ++trial) {
    for (auto layout : {ContiguousLayout::kBHSD, ContiguousLayout::kBSHD, ContiguousLayout::kPadded}) {
      const KVShape s = random_shape(rng);
      ContiguousFixture f(rng, s, layout);
      const auto kv = f.view(f.k.data(), f.v.data(), f.lengths.data());
      REQUIRE(kv.validate().ok());
      check_every_row(kv, s);
    }
  }
}

TEST_CASE("make_bhsd and make_bshd produce the documented strides") {
  float k = 0, v = 0;
  std::int32_t len = 0;
  const auto a = kvsift::make_bhsd(&k, &v, 2, 3, 5, 7, &len);
  CHECK(a.k_row(1, 2, 3) - &k == ((1 * 3 + 2) * 5 + 3) * 7);
  const auto b = kvsift::make_bshd(&k, &v, 2, 3, 5, 7, &len);
  CHECK(b.v_row(1, 2, 3) - &v == ((1 * 5 + 3) * 3 + 2) * 7);
}

TEST_CASE("PagedKV address math matches brute force for random page permutations") {
  auto rng = kvsift_test::make_rng(11);
  for (int trial = 0; trial < 30; ++trial)
    for (auto layout : {PageLayout::kNHD, PageLayout::kHND})
      for (int page_size : {1, 3, 16, 64}) {
        const KVShape s = random_shape(rng);
        PagedFixture f(rng, s, page_size, layout, trial % 2 ? kvsift_test::uniform_int(rng, 1, 9) : 0);
        const auto kv = f.view(f.k.data(), f.v.data(), f.block_table.data(), f.lengths.data());
        REQUIRE(kv.validate().ok());
        REQUIRE(kv.validate_block_table_host().ok());
        check_every_row(kv, f.shape);
      }
}

TEST_CASE("lengths are clamped to what a view can address") {
  std::vector<float> k(2 * 4 * 3), v(k.size());
  std::vector<std::int32_t> len = {-5, 99};
  const auto kv = kvsift::make_bhsd(k.data(), v.data(), 2, 1, 4, 3, len.data());
  CHECK(kv.length(0) == 0);
  CHECK(kv.length(1) == 4);
  std::vector<std::int32_t> table = {0, 1};
  const auto paged = kvsift::make_paged(k.data(), v.data(), table.data(), 2, 1, 2, 1, 4, 3, PageLayout::kNHD, len.data());
  CHECK(paged.length(1) == 4);
}

TEST_CASE("copy_kv_to_dense on the host reads through both views") {
  auto rng = kvsift_test::make_rng(12);
  const KVShape s{3, 2, 40, 8};
  PagedFixture f(rng, s, 16, PageLayout::kHND);
  const auto kv = f.view(f.k.data(), f.v.data(), f.block_table.data(), f.lengths.data());
  const int max_tokens = 37;  // shorter than the capacity: rows beyond it are not written
  std::vector<float> k_out(std::size_t(s.batch) * s.heads * max_tokens * s.head_dim, 7.f), v_out(k_out);
  REQUIRE(kvsift::host::copy_kv_to_dense(kvsift::host::Exec{}, kv, max_tokens, k_out.data(), v_out.data()).ok());
  CHECK(k_out == kvsift_test::expected_dense(f.shape, f.lengths, max_tokens, 1.f, 7.f));
  CHECK(v_out == kvsift_test::expected_dense(f.shape, f.lengths, max_tokens, -1.f, 7.f));
}

TEST_CASE("ContiguousKV validation names the bad parameter and value") {
  std::vector<float> k(64), v(64);
  std::int32_t len = 4;
  const auto good = kvsift::make_bhsd(k.data(), v.data(), 1, 2, 4, 8, &len);
  REQUIRE(good.validate().ok());
  auto expect = [](kvsift::ContiguousKV<float> kv, kvsift::StatusCode code, const std::string& msg) {
    const auto st = kv.validate();
    CHECK(st.code() == code);
    CHECK(st.message() == msg);
  };
  auto bad = good; bad.num_kv_heads = 0;
  expect(bad, kvsift::StatusCode::kInvalidArgument, "kv.num_kv_heads = 0 must be > 0");
  bad = good; bad.head_dim = -1;
  expect(bad, kvsift::StatusCode::kInvalidArgument, "kv.head_dim = -1 must be > 0");
  bad = good; bad.k = nullptr;
  expect(bad, kvsift::StatusCode::kNullPointer, "kv.k is null");
  bad = good; bad.lengths = nullptr;
  expect(bad, kvsift::StatusCode::kNullPointer, "kv.lengths is null");
  bad = good; bad.v_token_stride = 4;
  expect(bad, kvsift::StatusCode::kInvalidArgument, "kv.v_token_stride = 4 must be >= head_dim = 8");
  bad = good; bad.k_batch_stride = -1;
  expect(bad, kvsift::StatusCode::kInvalidArgument, "kv.k_batch_stride = -1 must be >= 0");
  bad = good; bad.batch = 0; bad.k = nullptr;  // an empty batch needs no memory
  CHECK(bad.validate().ok());
}

TEST_CASE("PagedKV validation names the bad parameter and checks block tables on the host") {
  std::vector<float> k(4 * 16 * 2 * 8), v(k.size());
  std::vector<std::int32_t> table = {3, 1, 0, 2}, len = {32, 20};
  const auto good = kvsift::make_paged(k.data(), v.data(), table.data(), 2, 2, 4, 2, 16, 8, PageLayout::kNHD, len.data());
  REQUIRE(good.validate().ok());
  REQUIRE(good.validate_block_table_host().ok());
  auto bad = good; bad.page_size = 0;
  CHECK(bad.validate().message() == "kv.page_size = 0 must be > 0");
  bad = good; bad.block_table_stride = 1;
  CHECK(bad.validate().message() == "kv.block_table_stride = 1 must be >= max_pages = 2");
  bad = good; bad.page_stride = 10;
  CHECK(bad.validate().message() == "kv.page_stride = 10 must be >= page_size * num_kv_heads * head_dim = 256");
  bad = good; bad.block_table = nullptr;
  CHECK(bad.validate().code() == kvsift::StatusCode::kNullPointer);
  bad = good; bad.layout = static_cast<PageLayout>(7);
  CHECK(bad.validate().message() == "kv.layout = 7 is not NHD or HND");
  table[3] = 4;  // page id outside the pool of 4
  CHECK(good.validate_block_table_host().message() == "kv.block_table[1][1] = 4 is outside the page pool [0, 4)");
  len[1] = 16;  // the bad entry is now beyond the sequence and never read
  CHECK(good.validate_block_table_host().ok());
}

namespace {
// A custom engine layout: K and V of one sequence interleaved per token ([t][k|v][heads][dim]).
struct InterleavedKV {
  using value_type = float;
  float* base;
  int batch, num_kv_heads, head_dim, capacity;
  const std::int32_t* lengths;
  KVSIFT_HD float* k_row(int b, int h, int t) const {
    return base + ((std::int64_t(b) * capacity + t) * 2 * num_kv_heads + h) * head_dim;
  }
  KVSIFT_HD float* v_row(int b, int h, int t) const { return k_row(b, h, t) + std::int64_t(num_kv_heads) * head_dim; }
  KVSIFT_HD int length(int b) const { return lengths[b] < capacity ? lengths[b] : capacity; }
  kvsift::Status validate() const { return kvsift::Status(); }
};
struct NotAView {
  using value_type = float;
  int batch, num_kv_heads, head_dim;
};
}  // namespace

TEST_CASE("the view concept accepts shipped and custom views and rejects incomplete ones") {
  static_assert(kvsift::is_kv_view_v<kvsift::ContiguousKV<float>>);
  static_assert(kvsift::is_kv_view_v<kvsift::ContiguousKV<const kvsift::bfloat16_t>>);
  static_assert(kvsift::is_kv_view_v<kvsift::PagedKV<kvsift::half_t>>);
  static_assert(kvsift::is_kv_view_v<InterleavedKV>);
  static_assert(kvsift::check_kv_view<InterleavedKV>());
  static_assert(!kvsift::is_kv_view_v<NotAView>);
  static_assert(!kvsift::is_kv_view_v<int>);

  // The custom view runs through an op unchanged.
  const int B = 2, H = 2, S = 5, D = 3;
  std::vector<float> base(std::size_t(B) * S * 2 * H * D);
  for (std::size_t i = 0; i < base.size(); ++i) base[i] = float(i + 1);
  std::vector<std::int32_t> len = {5, 3};
  InterleavedKV kv{base.data(), B, H, D, S, len.data()};
  std::vector<float> k_out(std::size_t(B) * H * S * D, 0.f), v_out(k_out);
  REQUIRE(kvsift::host::copy_kv_to_dense(kvsift::host::Exec{}, kv, S, k_out.data(), v_out.data()).ok());
  CHECK(k_out[((1 * H + 1) * S + 2) * D + 1] == base[((1 * S + 2) * 2 * H + 1) * D + 1]);
  CHECK(v_out[((1 * H + 1) * S + 2) * D + 1] == base[((1 * S + 2) * 2 * H + H + 1) * D + 1]);
  CHECK(k_out[((1 * H + 0) * S + 4) * D + 0] == 0.f);  // beyond length 3: untouched
}

TEST_CASE("copy_kv_to_dense rejects bad arguments with a Status") {
  std::vector<float> k(64), v(64), out(64);
  std::int32_t len = 4;
  const auto kv = kvsift::make_bhsd(k.data(), v.data(), 1, 2, 4, 8, &len);
  CHECK(kvsift::host::copy_kv_to_dense(kvsift::host::Exec{}, kv, -1, out.data(), out.data()).message() ==
        "max_tokens = -1 must be >= 0");
  CHECK(kvsift::host::copy_kv_to_dense(kvsift::host::Exec{}, kv, 4, nullptr, out.data()).message() == "k_out is null");
}

TEST_CASE("copy_kv_to_dense needs no workspace") {
  std::vector<float> k(64), v(64), k_out(64), v_out(64);
  std::int32_t len = 4;
  const auto kv = kvsift::make_bhsd(k.data(), v.data(), 1, 2, 4, 8, &len);
  std::size_t bytes = 1;
  REQUIRE(kvsift::copy_kv_to_dense_workspace_bytes(kvsift::host::Exec{}, kv, 4, k_out.data(), v_out.data(), &bytes).ok());
  CHECK(bytes == 0);
  CHECK(kvsift::host::copy_kv_to_dense(kvsift::host::Exec{}, kv, 4, k_out.data(), v_out.data(), kvsift::Workspace{}).ok());
}

// ---- fp8 views and their scales ----------------------------------------------------------------------

namespace {
// An fp8 custom view without scales: the concept rejects it.
struct Fp8WithoutScales {
  using value_type = kvsift::fp8_e4m3_t;
  kvsift::fp8_e4m3_t* base;
  int batch, num_kv_heads, head_dim;
  KVSIFT_HD kvsift::fp8_e4m3_t* k_row(int, int, int) const { return base; }
  KVSIFT_HD kvsift::fp8_e4m3_t* v_row(int, int, int) const { return base; }
  KVSIFT_HD int length(int) const { return 0; }
  kvsift::Status validate() const { return kvsift::Status(); }
};
}  // namespace

TEST_CASE("fp8 views: the concept wants k_scale / v_scale; 16-bit views read scale 1") {
  using kvsift::fp8_e4m3_t;
  using kvsift::fp8_e5m2_t;
  static_assert(kvsift::is_kv_view_v<kvsift::ContiguousKV<fp8_e4m3_t>>);
  static_assert(kvsift::is_kv_view_v<kvsift::PagedKV<const fp8_e5m2_t>>);
  static_assert(kvsift::is_fp8_view_v<kvsift::PagedKV<fp8_e4m3_t>>);
  static_assert(!kvsift::is_fp8_view_v<kvsift::PagedKV<kvsift::bfloat16_t>>);
  static_assert(!kvsift::is_kv_view_v<Fp8WithoutScales>);
  static_assert(!kvsift::is_fp8_view_v<InterleavedKV>);
  std::vector<float> k(64), v(64);
  std::int32_t len = 4;
  const auto kv = kvsift::make_bhsd(k.data(), v.data(), 1, 2, 4, 8, &len);
  CHECK(kv.k_scale(0, 1, 3) == 1.f);
  CHECK(kvsift::kv_v_scale(kv, 0, 1, 3) == 1.f);
  InterleavedKV custom{k.data(), 1, 1, 8, 4, &len};
  CHECK(kvsift::kv_k_scale(custom, 0, 0, 0) == 1.f);  // a view without scales reads 1
}

TEST_CASE("ContiguousKV fp8 scales: per head and per token address the documented floats") {
  using kvsift::fp8_e4m3_t;
  const int B = 2, H = 3, S = 5, D = 16;
  std::vector<fp8_e4m3_t> k(std::size_t(B) * H * S * D), v(k.size());
  std::vector<std::int32_t> len = {5, 2};
  std::vector<float> ks(std::size_t(B) * 8 * H), vs(ks.size());  // room for head-major scales padded to 8 tokens
  for (std::size_t i = 0; i < ks.size(); ++i) {
    ks[i] = float(i + 1);
    vs[i] = -float(i + 1);
  }
  for (bool bshd : {false, true}) {
    auto kv = bshd ? kvsift::make_bshd(k.data(), v.data(), B, H, S, D, len.data())
                   : kvsift::make_bhsd(k.data(), v.data(), B, H, S, D, len.data());
    // Without scales an fp8 view is invalid.
    CHECK(kv.validate().code() == kvsift::StatusCode::kNullPointer);
    CHECK(kv.validate().message() == "kv.scales.k is null");
    // Per-token scales valid and at index_of(b, h, t) of both arrays.
    auto check_per_token = [&](auto index_of) {
      REQUIRE(kv.validate().ok());
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
          for (int t = 0; t < S; ++t) {
            REQUIRE(kv.k_scale(b, h, t) == ks[index_of(b, h, t)]);
            REQUIRE(kv.v_scale(b, h, t) == vs[index_of(b, h, t)]);
          }
    };
    kv.scales = kvsift::make_per_token_scales_for(kv, ks.data(), vs.data());  // [batch, token, head]
    check_per_token([&](int b, int h, int t) { return (std::size_t(b) * S + t) * H + h; });
    kv.scales = kvsift::make_per_token_scales_head_major(kv, ks.data(), vs.data());  // [batch, head, token]
    check_per_token([&](int b, int h, int t) { return (std::size_t(b) * H + h) * S + t; });
    // Each head's scales padded to 8 tokens (ks holds B * H * 8 floats).
    kv.scales = kvsift::make_per_token_scales_head_major(kv, ks.data(), vs.data(), 8);
    check_per_token([&](int b, int h, int t) { return (std::size_t(b) * H + h) * 8 + t; });
    kv.scales = kvsift::make_per_head_scales(ks.data(), vs.data());
    REQUIRE(kv.validate().ok());
    CHECK(kv.k_scale(1, 2, 4) == ks[2]);
    CHECK(kv.v_scale(0, 1, 0) == vs[1]);
  }
}

TEST_CASE("fp8 scale validation names the field that does not fit the view") {
  using kvsift::fp8_e4m3_t;
  std::vector<fp8_e4m3_t> k(2 * 2 * 4 * 16), v(k.size());
  std::vector<float> s(64);
  std::vector<std::int32_t> len = {4, 3};
  auto kv = kvsift::make_bshd(k.data(), v.data(), 2, 2, 4, 16, len.data());
  const auto good = kvsift::make_per_token_scales_for(kv, s.data(), s.data());
  auto expect = [&](kvsift::KvScales sc, kvsift::StatusCode code, const std::string& msg) {
    kv.scales = sc;
    const auto st = kv.validate();
    CHECK(st.code() == code);
    CHECK(st.message() == msg);
  };
  auto bad = good; bad.v = nullptr;
  expect(bad, kvsift::StatusCode::kNullPointer, "kv.scales.v is null");
  bad = good; bad.token_stride = 1;  // tokens and heads would share floats
  expect(bad, kvsift::StatusCode::kInvalidArgument,
         "kv.scales.token_stride = 1 must be >= 2: the scales of two (sequence, token, head) would share a float "
         "(per-token scales of 2 x 4 x 2)");
  bad = good; bad.batch_stride = 3;
  expect(bad, kvsift::StatusCode::kInvalidArgument,
         "kv.scales.batch_stride = 3 must be >= 8: the scales of two (sequence, token, head) would share a float "
         "(per-token scales of 2 x 4 x 2)");
  bad = good; bad.head_stride = -1;
  expect(bad, kvsift::StatusCode::kInvalidArgument, "kv.scales.head_stride = -1 must be >= 0");
  bad = good; bad.page_stride = 8;  // scales made for a paged view
  expect(bad, kvsift::StatusCode::kInvalidArgument,
         "kv.scales.page_stride = 8 is for PagedKV; ContiguousKV per-token scales use batch_stride, token_stride and "
         "head_stride");
  bad = good; bad.granularity = kvsift::ScaleGranularity::kPerHead;  // per-token strides, per-head flag
  expect(bad, kvsift::StatusCode::kInvalidArgument,
         "kv.scales.batch_stride = 8 must be 0: per-head scales are k[h], v[h] (set granularity = per-token for "
         "per-token scales)");
  bad = good; bad.granularity = static_cast<kvsift::ScaleGranularity>(5);
  expect(bad, kvsift::StatusCode::kInvalidArgument, "kv.scales.granularity = 5 is not per-head or per-token");
  // Head-major per-token scales ([batch, heads, capacity]) are fine too.
  bad = good; bad.head_stride = 4; bad.token_stride = 1;
  kv.scales = bad;
  CHECK(kv.validate().ok());
  // A 16-bit view ignores whatever its scales member holds.
  std::vector<kvsift::bfloat16_t> kb(k.size()), vb(k.size());
  auto b16 = kvsift::make_bshd(kb.data(), vb.data(), 2, 2, 4, 16, len.data());
  b16.scales.granularity = static_cast<kvsift::ScaleGranularity>(5);
  CHECK(b16.validate().ok());
  CHECK(b16.k_scale(0, 0, 0) == 1.f);
}

TEST_CASE("PagedKV fp8 per-token scales follow the page layout (NHD and HND)") {
  using kvsift::fp8_e4m3_t;
  const int pages = 4, P = 4, H = 2, D = 16;
  std::vector<fp8_e4m3_t> k(std::size_t(pages) * P * H * D), v(k.size());
  std::vector<float> ks(std::size_t(pages) * P * H), vs(ks.size());
  for (std::size_t i = 0; i < ks.size(); ++i) {
    ks[i] = float(i) + 0.5f;
    vs[i] = float(i) + 0.25f;
  }
  std::vector<std::int32_t> table = {3, 1, 0, 2}, len = {8, 7};
  for (auto layout : {PageLayout::kNHD, PageLayout::kHND}) {
    auto kv = kvsift::make_paged(k.data(), v.data(), table.data(), 2, 2, pages, H, P, D, layout, len.data());
    CHECK(kv.validate().message() == "kv.scales.k is null");
    kv.scales = kvsift::make_per_token_scales_for(kv, ks.data(), vs.data());
    REQUIRE(kv.validate().ok());
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < 8; ++t) {
          const int page = table[b * 2 + t / P], slot = t % P;
          const std::size_t in_page = layout == PageLayout::kNHD ? std::size_t(slot) * H + h : std::size_t(h) * P + slot;
          const std::size_t want = std::size_t(page) * P * H + in_page;
          REQUIRE(kv.scale_offset(b, h, t) == std::int64_t(want));
          REQUIRE(kv.scale_offset_at(page, h, slot) == std::int64_t(want));
          REQUIRE(kv.k_scale(b, h, t) == ks[want]);
          REQUIRE(kv.v_scale(b, h, t) == vs[want]);
          // The row sits at the same in-page index, head_dim elements per index.
          REQUIRE(kv.row_offset(b, h, t) == std::int64_t(page) * kv.page_stride + std::int64_t(in_page) * D);
        }
    auto bad = kv.scales; bad.page_stride = 7;
    kv.scales = bad;
    CHECK(kv.validate().message() == "kv.scales.page_stride = 7 must be >= page_size * num_kv_heads = 8");
    bad.page_stride = 8; bad.token_stride = 2;  // contiguous-style strides on a paged view
    kv.scales = bad;
    CHECK(kv.validate().message() ==
          "kv.scales.token_stride = 2 is for ContiguousKV; PagedKV per-token scales follow the page layout (set page_stride)");
    kv.scales = kvsift::make_per_head_scales(ks.data(), vs.data());
    REQUIRE(kv.validate().ok());
    CHECK(kv.k_scale(1, 1, 6) == ks[1]);
    CHECK(kv.scale_offset(1, 1, 6) == 1);
  }
}

namespace custom_rows {
// An engine's own view type whose address map can fail: its kv_row_in_pool overload is found by ADL.
struct View {};
bool kv_row_in_pool(const View&, int, int);
}  // namespace custom_rows

TEST_CASE("kv_row_in_pool and data_error_status: what the kernels check and record about bad engine data") {
  // A paged view over host memory: the check reads the block table like the kernels do.
  std::vector<float> pool(4 * 2 * 8, 0.f);
  const std::vector<std::int32_t> table = {0, 1, 9, -1, 2, 3, 0, 1};  // sequence 0: pages 0, 1, then 9 (pool of 4), -1
  const std::vector<std::int32_t> lengths = {32, 16};
  const auto kv = kvsift::make_paged(pool.data(), pool.data(), table.data(), 2, 4, 4, 1, 8, 8,
                                     kvsift::PageLayout::kNHD, lengths.data());
  CHECK(kvsift::kv_row_in_pool(kv, 0, 0));
  CHECK(kvsift::kv_row_in_pool(kv, 0, 15));
  CHECK_FALSE(kvsift::kv_row_in_pool(kv, 0, 16));  // page 9
  CHECK_FALSE(kvsift::kv_row_in_pool(kv, 0, 31));  // page -1
  CHECK(kvsift::kv_page_of(kv, 0, 20) == 9);
  CHECK(kvsift::kv_row_in_pool(kv, 1, 15));
  // Other views vouch for every row.
  std::vector<float> kc(2 * 1 * 32 * 8), vc(kc.size());
  const auto ckv = kvsift::make_bhsd(kc.data(), vc.data(), 2, 1, 32, 8, lengths.data());
  CHECK(kvsift::kv_row_in_pool(ckv, 1, 31));
  // Which views the kernels may skip the check for (kv_rows_always_in_pool): those without an overload.
  static_assert(kvsift::kv_rows_always_in_pool<kvsift::ContiguousKV<float>>);
  static_assert(kvsift::kv_rows_always_in_pool<kvsift::ContiguousKV<const kvsift::half_t>>);
  static_assert(!kvsift::kv_rows_always_in_pool<kvsift::PagedKV<float>>);
  static_assert(!kvsift::kv_rows_always_in_pool<kvsift::PagedKV<const kvsift::bfloat16_t>>);
  static_assert(!kvsift::kv_rows_always_in_pool<custom_rows::View>);

  kvsift::DataError e;
  CHECK(kvsift::data_error_status(e).ok());  // nothing recorded
  e.state = 2;
  e.op = kvsift::DataErrorOp::kDecodeAttention;
  e.kind = kvsift::DataErrorKind::kPageOutOfPool;
  e.batch = 0;
  e.row = 0;
  e.position = 16;
  e.value = 9;
  auto s = kvsift::data_error_status(e);
  CHECK(s.code() == kvsift::StatusCode::kInvalidArgument);
  CHECK(s.to_string() == "invalid argument: decode_attention: kv.block_table entry 9 of sequence 0 (token 16, KV head 0) "
                         "is outside the page pool; its tokens were skipped");
  e.op = kvsift::DataErrorOp::kCompactKv;
  e.kind = kvsift::DataErrorKind::kIndexOutOfRange;
  e.value = 1000;
  e.position = 3;
  s = kvsift::data_error_status(e);
  CHECK(s.to_string().find("compact_kv: index_set entry 3 of sequence 0, KV head 0 = 1000") != std::string::npos);
  e.kind = kvsift::DataErrorKind::kCountOutOfRange;
  CHECK(kvsift::data_error_status(e).to_string().find("clamped") != std::string::npos);
}
