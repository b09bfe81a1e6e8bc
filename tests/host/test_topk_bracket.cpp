// The sampled bracket's arithmetic (ops/detail/topk_bracket.hpp), which every CTA of a top-k group
// computes alone and must agree on: the stride sample's shares partition the sample exactly as the
// kernel splits it (a CTA's own share from its clipped range, its peers' from the slice starts), the
// ranks bracket the budget's expected rank, the bins' tops clip at the largest key, and on random rows
// the bracket from a sample's order statistics holds the budget-th key (it may miss, rarely: a miss
// costs the kernel time, not correctness).

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "kvsift/ops/detail/topk_bracket.hpp"
#include "support/random.hpp"

using kvsift::detail::TopkBracketSample;

TEST_CASE("topk bracket: the sample's shares partition it the same way from every CTA") {
  auto rng = kvsift_test::make_rng(601);
  for (int trial = 0; trial < 4000; ++trial) {
    const int cols = kvsift_test::uniform_int(rng, 1, 300000);
    const int group = 1 << kvsift_test::uniform_int(rng, 1, 3);
    const int slice = int((std::int64_t(cols) + group - 1) / group + 7) / 8 * 8;
    const int len = kvsift_test::uniform_int(rng, 0, cols);
    const int sink = kvsift_test::uniform_int(rng, 0, 3) == 0 ? 0 : kvsift_test::uniform_int(rng, 0, 200);
    const int recent = kvsift_test::uniform_int(rng, 0, 3) == 0 ? 0 : kvsift_test::uniform_int(rng, 0, 400);
    const int capacity = kvsift_test::uniform_int(rng, 0, 1) ? 2048 : 1024;
    const kvsift::TopKRowPlan plan = kvsift::plan_topk_row(cols, len, 1, 1 << 20, sink, recent);
    const TopkBracketSample s = kvsift::detail::topk_bracket_sample(plan, capacity);
    CAPTURE(cols);
    CAPTURE(group);
    CAPTURE(len);
    CAPTURE(sink);
    CAPTURE(recent);
    REQUIRE(s.stride >= 1);
    REQUIRE(s.count <= capacity);
    REQUIRE(s.count == (plan.region() + s.stride - 1) / s.stride);
    if (s.count > 0) REQUIRE(s.first + (s.count - 1) * s.stride < plan.recent_begin);
    int next = 0;  // the first sample not yet owned
    for (int c = 0; c < group; ++c) {
      const int lo = std::max(c * slice, plan.sink_end);
      const int hi = std::max(lo, std::min((c + 1) * slice, plan.recent_begin));
      // The kernel: a CTA's own share from its clipped range, its peers' from the slice starts.
      const int from = s.first_at(lo), to = s.first_at(hi);
      REQUIRE(from == s.first_at(c * slice));
      REQUIRE(from == next);
      for (int j = from; j < to; ++j) {
        const int pos = s.first + j * s.stride;
        REQUIRE(pos >= lo);
        REQUIRE(pos < hi);
      }
      if (to < s.count) REQUIRE(s.first + to * s.stride >= hi);
      next = to;
    }
    REQUIRE(next == s.count);
  }
}

TEST_CASE("topk bracket: ranks around the budget's share, bin tops, bit widths") {
  for (int count : {1, 7, 512, 2048})
    for (int region : {count, 2 * count + 1, 131072})
      for (int budget : {1, 2, region / 3, region / 2, region - 1}) {
        if (budget < 1 || budget >= region) continue;
        const auto r = kvsift::detail::topk_bracket_ranks(budget, region, count);
        const double mean = double(budget) / region * count;
        CAPTURE(count);
        CAPTURE(region);
        CAPTURE(budget);
        REQUIRE(r.above < mean);
        REQUIRE(r.below > mean);
        REQUIRE(r.below - r.above >= 2);
      }
  using kvsift::detail::topk_bin_top;
  REQUIRE(topk_bin_top<std::uint32_t>(100, 2, 4, 0xffffffffu) == 100 + 2 * 16 + 15);
  REQUIRE(topk_bin_top<std::uint32_t>(0xfffffff0u, 0, 8, 0xffffffffu) == 0xffffffffu);  // clipped
  REQUIRE(topk_bin_top<std::uint32_t>(0x7ff00u, 0, 8, 0x7ffffu) == 0x7ffffu);           // 19-bit keys
  REQUIRE(topk_bin_top<std::uint64_t>(1, 3, 0, ~std::uint64_t(0)) == 4);
  using kvsift::detail::topk_bit_width;
  REQUIRE(topk_bit_width<std::uint32_t>(0) == 0);
  REQUIRE(topk_bit_width<std::uint32_t>(1) == 1);
  REQUIRE(topk_bit_width<std::uint32_t>(0x80000000u) == 32);
  REQUIRE(topk_bit_width<std::uint64_t>(std::uint64_t(1) << 40) == 41);
}

TEST_CASE("topk bracket: a stride sample's order statistics hold the budget-th key on random rows") {
  auto rng = kvsift_test::make_rng(602);
  int misses = 0, rows = 0;
  for (int n : {4096, 32768, 131072})
    for (int budget : {64, 1024, 4096})
      for (int rep = 0; rep < 12; ++rep) {
        if (budget >= n) continue;
        std::vector<float> row(static_cast<std::size_t>(n));
        std::normal_distribution<float> dist(0.f, 1.f);
        for (float& x : row) x = dist(rng);
        kvsift::TopKRowPlan plan;
        plan.len = n;
        plan.recent_begin = n;
        plan.budget = budget;
        const TopkBracketSample s = kvsift::detail::topk_bracket_sample(plan, 2048);
        std::vector<float> sample;
        for (int j = 0; j < s.count; ++j) sample.push_back(row[std::size_t(s.first + j * s.stride)]);
        std::sort(sample.begin(), sample.end(), std::greater<float>());
        const auto r = kvsift::detail::topk_bracket_ranks(budget, n, s.count);
        // The kernel's ends lie at or beyond these sample keys (bins widen the bracket, never narrow it).
        const float top = r.above >= 1 ? sample[std::size_t(r.above - 1)] : INFINITY;
        const float bottom = r.below <= s.count ? sample[std::size_t(r.below - 1)] : -INFINITY;
        std::vector<float> sorted = row;
        std::nth_element(sorted.begin(), sorted.begin() + (budget - 1), sorted.end(), std::greater<float>());
        const float kth = sorted[std::size_t(budget - 1)];
        ++rows;
        if (!(kth <= top && kth >= bottom)) ++misses;
      }
  CAPTURE(misses);
  CAPTURE(rows);
  REQUIRE(rows > 90);
  REQUIRE(misses <= 1);  // 4 sigma each side: about 1e-4 a row
}
