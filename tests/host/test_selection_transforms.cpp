// SnapKV pooling and ClusterAttn's density clustering against independent brute-force formulations.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kvsift/ops/cluster_flags.hpp"
#include "kvsift/ops/cluster_flags_plan.hpp"
#include "kvsift/ops/cluster_flags_reference.hpp"
#include "kvsift/ops/score_pooling.hpp"
#include "kvsift/ops/score_pooling_plan.hpp"
#include "kvsift/ops/score_pooling_reference.hpp"
#include "support/random.hpp"

using namespace kvsift;

TEST_CASE("pool_scores matches torch avg_pool1d / max_pool1d with padding kernel // 2") {
  auto rng = kvsift_test::make_rng(50);
  for (int trial = 0; trial < 20; ++trial) {
    const int rows = 3, cols = kvsift_test::uniform_int(rng, 1, 40);
    auto in = kvsift_test::random_values<float>(rng, std::size_t(rows) * cols, 0.f, 1.f);
    std::vector<std::int32_t> len = {cols, kvsift_test::uniform_int(rng, 0, cols), kvsift_test::uniform_int(rng, 1, cols)};
    for (int kernel : {1, 3, 5, 7}) {
      for (auto kind : {PoolKind::kAvg, PoolKind::kMax}) {
        std::vector<float> out(in.size(), -5.f);
        REQUIRE(host::pool_scores(host::Exec{}, make_strided_view<const float>(in.data(), rows, cols), len.data(),
                                  PoolParams{kind, kernel}, make_strided_view(out.data(), rows, cols)).ok());
        for (int r = 0; r < rows; ++r) {
          // Explicitly padded row, as torch builds it.
          const int n = len[r], pad = kernel / 2;
          std::vector<float> padded(n + 2 * pad, kind == PoolKind::kAvg ? 0.f : -INFINITY);
          for (int j = 0; j < n; ++j) padded[j + pad] = in[r * cols + j];
          for (int j = 0; j < cols; ++j) {
            if (j >= n) { REQUIRE(out[r * cols + j] == -5.f); continue; }
            float e = kind == PoolKind::kAvg ? 0.f : -INFINITY;
            for (int t = 0; t < kernel; ++t)
              e = kind == PoolKind::kAvg ? e + padded[j + t] : std::max(e, padded[j + t]);
            if (kind == PoolKind::kAvg) e /= kernel;
            REQUIRE(out[r * cols + j] == doctest::Approx(e).epsilon(1e-6));
          }
        }
      }
    }
  }
  std::vector<float> a(4), b(4);
  CHECK(host::pool_scores(host::Exec{}, make_strided_view<const float>(a.data(), 1, 4), nullptr, PoolParams{PoolKind::kMax, 4},
                          make_strided_view(b.data(), 1, 4)).message() == "pool.kernel = 4 must be odd and >= 1");
}

// NaN, where torch's pools and kvsift's differ (the contract in score_pooling.hpp): max pooling never
// takes a NaN (a window of only NaN gives -inf), so one NaN score does not spread to its neighbours
// before top-k; average pooling propagates it, as torch does. The CUDA kernel shares pool_at.
TEST_CASE("pool_scores: max pooling skips NaN, average pooling propagates it") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> in = {0.5f, nan, 0.25f, nan, nan, nan, 0.75f, -INFINITY};
  const int n = int(in.size());
  std::vector<float> mx(in.size()), av(in.size());
  REQUIRE(host::pool_scores(host::Exec{}, make_strided_view<const float>(in.data(), 1, n), nullptr, PoolParams{PoolKind::kMax, 3},
                            make_strided_view(mx.data(), 1, n)).ok());
  REQUIRE(host::pool_scores(host::Exec{}, make_strided_view<const float>(in.data(), 1, n), nullptr, PoolParams{PoolKind::kAvg, 3},
                            make_strided_view(av.data(), 1, n)).ok());
  const std::vector<float> want_max = {0.5f, 0.5f, 0.25f, 0.25f, -INFINITY, 0.75f, 0.75f, 0.75f};
  for (int j = 0; j < n; ++j) {
    CAPTURE(j);
    CHECK(mx[j] == want_max[j]);
    const bool window_has_nan = std::isnan(in[j]) || (j > 0 && std::isnan(in[j - 1])) || (j + 1 < n && std::isnan(in[j + 1]));
    CHECK(std::isnan(av[j]) == window_has_nan);
  }
}

namespace {
// Brute force of the clustering: blocks, centres, then explicit intervals marked on a fresh array.
std::vector<int> brute_flags(const std::vector<float>& p, int n, const ClusterParams& c) {
  const int block = c.block_rule == BlockRule::kPrefixSplit ? std::max(1, (n + c.num_block - 1) / c.num_block)
                                                            : std::max(1, c.budget / c.num_block);
  std::vector<int> centres, centre_blocks;
  for (int lo = 0; lo < n; lo += block) {
    const int hi = std::min(n, lo + block);
    const int arg = int(std::max_element(p.begin() + lo, p.begin() + hi) - p.begin());  // first maximum
    if (p[arg] > c.theta) {
      centres.push_back(arg);
      centre_blocks.push_back(lo / block);
    }
  }
  std::vector<int> flags(n, 0);
  if (c.radius_rule == RadiusRule::kBudgetBlocks) {
    const int R = centres.empty() ? 0 : ((c.budget + block - 1) / block) / (2 * int(centres.size()));
    for (int kb : centre_blocks)
      for (int j = std::max(0, (kb - R) * block); j < std::min(n, (kb + R + 1) * block); ++j) flags[j] = 1;
  } else {
    const int r = c.radius_rule == RadiusRule::kHalfBlock ? block / 2 : c.fixed_radius;
    for (int ctr : centres)
      for (int j = std::max(0, ctr - r); j <= std::min(n - 1, ctr + r); ++j) flags[j] = 1;
  }
  return flags;
}
}  // namespace

TEST_CASE("cluster_flags equals the brute-force clustering for every block and radius rule") {
  auto rng = kvsift_test::make_rng(51);
  for (int trial = 0; trial < 40; ++trial) {
    const int rows = 2, cols = kvsift_test::uniform_int(rng, 1, 300);
    std::vector<float> scores(std::size_t(rows) * cols);
    // Sparse spikes over a low floor, so some blocks pass theta and others do not; ties included.
    for (auto& s : scores) s = kvsift_test::uniform_int(rng, 0, 9) == 0 ? 0.5f * kvsift_test::uniform_int(rng, 1, 4) : 1e-4f;
    std::vector<std::int32_t> len = {cols, kvsift_test::uniform_int(rng, 0, cols)};
    for (auto block_rule : {BlockRule::kPrefixSplit, BlockRule::kBudgetSplit})
      for (auto radius_rule : {RadiusRule::kHalfBlock, RadiusRule::kBudgetBlocks, RadiusRule::kFixed}) {
        ClusterParams c;
        c.num_block = kvsift_test::uniform_int(rng, 1, 40);
        c.theta = 0.7f;
        c.budget = kvsift_test::uniform_int(rng, 1, 100);
        c.block_rule = block_rule;
        c.radius_rule = radius_rule;
        c.fixed_radius = kvsift_test::uniform_int(rng, 0, 12);
        std::vector<std::uint8_t> flags(scores.size(), 9);
        REQUIRE(host::cluster_flags(host::Exec{}, make_strided_view<const float>(scores.data(), rows, cols), len.data(), c,
                                    make_strided_view(flags.data(), rows, cols)).ok());
        for (int r = 0; r < rows; ++r) {
          std::vector<float> row(scores.begin() + r * cols, scores.begin() + r * cols + len[r]);
          const auto expect = brute_flags(row, len[r], c);
          for (int j = 0; j < len[r]; ++j) REQUIRE(int(flags[r * cols + j]) == expect[j]);
          for (int j = len[r]; j < cols; ++j) REQUIRE(flags[r * cols + j] == 9);
        }
      }
  }
}

TEST_CASE("cluster_flags: the CUDA kernel's warp per block (lane strides, then a butterfly) finds block_argmax's centre") {
  // The kernel's order of operations replayed on the host: lane l scans positions lo + l, lo + l + 32,
  // ... with argmax_step, then five rounds of argmax_merge with the lane l ^ off (off 16, 8, 4, 2, 1),
  // every lane from the values of the round before; lane 0's result against block_argmax, on blocks of
  // 1 to 300 tokens with NaN, -inf, +inf, ties, -0 / +0 and blocks of only NaN.
  auto rng = kvsift_test::make_rng(81);
  const float specials[] = {NAN, -INFINITY, INFINITY, -0.f, 0.f, 1.f, 1.f, -1.f};
  for (int trial = 0; trial < 4000; ++trial) {
    const int block = kvsift_test::uniform_int(rng, 1, 300);
    std::vector<float> x(static_cast<std::size_t>(block));
    const int mode = trial % 4;  // random / mostly specials / all NaN / all one value
    for (auto& v : x) {
      const int u = kvsift_test::uniform_int(rng, 0, 7);
      v = mode == 2 ? NAN : mode == 3 ? 0.5f : mode == 1 || u == 0 ? specials[kvsift_test::uniform_int(rng, 0, 7)]
                                                            : float(kvsift_test::uniform_int(rng, -3, 3));
    }
    float lm[32], m2[32];
    int la[32], a2[32];
    for (int l = 0; l < 32; ++l) {
      lm[l] = -INFINITY;
      la[l] = -1;
      for (int t = l; t < block; t += 32) detail::argmax_step(x[std::size_t(t)], t, lm[l], la[l]);
    }
    for (int off = 16; off > 0; off /= 2) {
      for (int l = 0; l < 32; ++l) m2[l] = lm[l], a2[l] = la[l];
      for (int l = 0; l < 32; ++l) detail::argmax_merge(m2[l ^ off], a2[l ^ off], lm[l], la[l]);
    }
    float expect_m;
    const int expect = detail::block_argmax(x.data(), block, block, 0, &expect_m);
    CAPTURE(trial);
    CAPTURE(block);
    REQUIRE(la[0] == expect);
    if (expect >= 0) CHECK(std::memcmp(&lm[0], &expect_m, sizeof(float)) == 0);
  }
}

TEST_CASE("cluster_flags: no block above theta flags nothing; theta below everything flags around every block") {
  std::vector<float> s(100, 0.01f);
  std::vector<std::uint8_t> f(100);
  ClusterParams c;
  c.num_block = 10;
  c.theta = 0.5f;
  REQUIRE(host::cluster_flags(host::Exec{}, make_strided_view<const float>(s.data(), 1, 100), nullptr, c,
                              make_strided_view(f.data(), 1, 100)).ok());
  CHECK(std::count(f.begin(), f.end(), 1) == 0);
  c.theta = 0.f;
  REQUIRE(host::cluster_flags(host::Exec{}, make_strided_view<const float>(s.data(), 1, 100), nullptr, c,
                              make_strided_view(f.data(), 1, 100)).ok());
  // Centre of each block of 10 is its first token (all equal), radius 5: tokens [0, 96) are covered.
  CHECK(std::count(f.begin(), f.end(), 1) == 96);
  c.num_block = 0;
  CHECK(host::cluster_flags(host::Exec{}, make_strided_view<const float>(s.data(), 1, 100), nullptr, c,
                            make_strided_view(f.data(), 1, 100)).message() == "num_block = 0 must be >= 1");
  c.num_block = 4;
  c.theta = -1.f;
  CHECK(host::cluster_flags(host::Exec{}, make_strided_view<const float>(s.data(), 1, 100), nullptr, c,
                            make_strided_view(f.data(), 1, 100)).message() == "theta = -1 must be >= 0");
}

TEST_CASE("pool_scores and cluster_flags: the host reference asks for no workspace") {
  const auto scores = make_strided_view<const float>(nullptr, 3, 1000);
  const auto pooled = make_strided_view<float>(nullptr, 3, 1000);
  const auto flags = make_strided_view<std::uint8_t>(nullptr, 3, 1000);
  std::size_t bytes = 1;
  REQUIRE(pool_scores_workspace_bytes(host::Exec{}, scores, nullptr, PoolParams{}, pooled, &bytes).ok());
  CHECK(bytes == 0);
  bytes = 1;
  REQUIRE(cluster_flags_workspace_bytes(host::Exec{}, scores, nullptr, ClusterParams{}, flags, &bytes).ok());
  CHECK(bytes == 0);
  CHECK(cluster_flags_workspace_bytes(host::Exec{}, scores, nullptr, ClusterParams{}, flags, nullptr).message() ==
        "bytes is null");
}
