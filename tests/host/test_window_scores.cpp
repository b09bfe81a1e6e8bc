#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kvsift/ops/window_scores.hpp"
#include "kvsift/ops/window_scores_plan.hpp"
#include "kvsift/ops/window_scores_reference.hpp"
#include "support/prompt_fixtures.hpp"

using namespace kvsift;

namespace {
// Brute force: the full masked attention matrix of the scored queries, softmax per row, column sums.
std::vector<double> brute_column_sums(kvsift_test::Prompt& p, int b, int hq, int nq, int window) {
  const int L = p.lengths[b], d = p.head_dim, G = p.q_heads / p.kv_heads;
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<std::vector<double>> A(nq, std::vector<double>(L, 0.0));
  for (int i = 0; i < nq; ++i) {
    const int pos = L - nq + i;
    double m = -INFINITY;
    for (int j = 0; j < L; ++j) {
      if (j > pos) { A[i][j] = -INFINITY; continue; }
      double s = 0;
      for (int e = 0; e < d; ++e)
        s += double(p.q[((std::size_t(b) * p.q_rows + i) * p.q_heads + hq) * d + e]) *
             double(p.k[((std::size_t(b) * p.kv_heads + hq / G) * p.capacity + j) * d + e]);
      A[i][j] = s * scale;
      m = std::max(m, A[i][j]);
    }
    double z = 0;
    for (int j = 0; j < L; ++j) z += std::exp(A[i][j] - m);
    for (int j = 0; j < L; ++j) A[i][j] = std::exp(A[i][j] - m) / z;
  }
  std::vector<double> col(std::max(0, L - window), 0.0);
  for (int j = 0; j < L - window; ++j)
    for (int i = 0; i < nq; ++i) col[j] += A[i][j];
  return col;
}
}  // namespace

TEST_CASE("window_scores equals the column sums of the materialised softmax") {
  auto rng = kvsift_test::make_rng(40);
  for (int trial = 0; trial < 6; ++trial) {
    const int group = trial % 2 ? 4 : 1, W = kvsift_test::uniform_int(rng, 1, 9);
    kvsift_test::Prompt p(rng, 2, 2, group, kvsift_test::uniform_int(rng, W + 1, 60), 16, W);
    auto kv = p.view();
    for (auto mode : {ScoreHeads::kKvHeadMean, ScoreHeads::kQueryHead}) {
      const int heads = mode == ScoreHeads::kKvHeadMean ? p.kv_heads : p.q_heads;
      std::vector<float> out(std::size_t(p.batch) * heads * p.capacity, -7.f);
      WindowScoreParams params;
      params.window = W;
      params.num_queries = W;
      params.heads = mode;
      REQUIRE(host::window_scores(host::Exec{}, kv, p.queries(), params,
                                  make_strided_view(out.data(), p.batch * heads, p.capacity)).ok());
      for (int b = 0; b < p.batch; ++b)
        for (int h = 0; h < heads; ++h) {
          std::vector<double> expect(std::max(0, p.lengths[b] - W), 0.0);
          const int first = mode == ScoreHeads::kKvHeadMean ? h * group : h;
          const int n = mode == ScoreHeads::kKvHeadMean ? group : 1;
          for (int g = 0; g < n; ++g) {
            auto c = brute_column_sums(p, b, first + g, std::min(W, p.lengths[b]), W);
            for (std::size_t j = 0; j < c.size(); ++j) expect[j] += c[j] / n;
          }
          const float* row = out.data() + (std::size_t(b) * heads + h) * p.capacity;
          for (std::size_t j = 0; j < expect.size(); ++j) REQUIRE(row[j] == doctest::Approx(expect[j]).epsilon(1e-5));
          for (int j = int(expect.size()); j < p.capacity; ++j) REQUIRE(row[j] == -7.f);  // untouched
        }
    }
  }
}

TEST_CASE("window_scores: a supplied log-sum-exp gives the same sums; all-query mode is H2O's") {
  auto rng = kvsift_test::make_rng(41);
  const int W = 5;
  kvsift_test::Prompt p(rng, 1, 2, 2, 40, 8, 40);  // q rows for every position (H2O), window uses the last W
  auto kv = p.view();
  // Window queries are the last W rows of the all-position Q tensor.
  QueryRows<float> window_q = p.queries();
  window_q.data += std::size_t(40 - W) * p.q_heads * p.head_dim;
  window_q.capacity = W;
  std::vector<float> lse(std::size_t(p.q_heads) * W);
  for (int h = 0; h < p.q_heads; ++h)
    for (int i = 0; i < W; ++i) {
      const int pos = 40 - W + i;
      double m = -INFINITY, s = 0;
      std::vector<double> l(pos + 1);
      for (int j = 0; j <= pos; ++j) {
        double dot = 0;
        for (int e = 0; e < 8; ++e) dot += double(window_q.row(0, i, h)[e]) * double(kv.k_row(0, h / 2, j)[e]);
        l[j] = dot / std::sqrt(8.0);
        m = std::max(m, l[j]);
      }
      for (double x : l) s += std::exp(x - m);
      lse[h * W + i] = float(m + std::log(s));
    }
  std::vector<float> a(2 * 40), b(2 * 40), h2o(2 * 40);
  WindowScoreParams params;
  params.window = W;
  params.num_queries = W;
  REQUIRE(host::window_scores(host::Exec{}, kv, window_q, params, make_strided_view(a.data(), 2, 40)).ok());
  params.lse = lse.data();
  REQUIRE(host::window_scores(host::Exec{}, kv, window_q, params, make_strided_view(b.data(), 2, 40)).ok());
  for (int j = 0; j < 2 * 40; ++j) CHECK(b[j] == doctest::Approx(a[j]).epsilon(1e-5));

  params.lse = nullptr;
  params.num_queries = kAllQueries;
  REQUIRE(host::window_scores(host::Exec{}, kv, p.queries(), params, make_strided_view(h2o.data(), 2, 40)).ok());
  for (int h = 0; h < 2; ++h) {
    std::vector<double> e(35, 0.0);
    for (int g = 0; g < 2; ++g) {
      auto c = brute_column_sums(p, 0, h * 2 + g, 40, W);
      for (int j = 0; j < 35; ++j) e[j] += c[j] / 2;
    }
    for (int j = 0; j < 35; ++j) CHECK(h2o[h * 40 + j] == doctest::Approx(e[j]).epsilon(1e-5));
  }
}

TEST_CASE("window_scores rejects bad parameters with a named Status") {
  auto rng = kvsift_test::make_rng(42);
  kvsift_test::Prompt p(rng, 1, 2, 3, 20, 8, 4);
  auto kv = p.view();
  std::vector<float> out(2 * 20);
  WindowScoreParams params;
  params.window = 4;
  params.num_queries = 4;
  auto run = [&](WindowScoreParams pp, QueryRows<float> q) {
    return host::window_scores(host::Exec{}, kv, q, pp, make_strided_view(out.data(), 2, 20));
  };
  auto bad = params;
  bad.window = -1;
  CHECK(run(bad, p.queries()).message() == "window = -1 must be >= 0");
  bad = params;
  bad.num_queries = 9;
  CHECK(run(bad, p.queries()).message() == "num_queries = 9 exceeds q.capacity = 4");
  auto q = p.queries();
  q.num_heads = 5;
  CHECK(run(params, q).message() == "q.num_heads = 5 must be a positive multiple of kv.num_kv_heads = 2");
  q = p.queries();
  q.data = nullptr;
  CHECK(run(params, q).code() == StatusCode::kNullPointer);
}

TEST_CASE("window_scores and scored_prefix_lengths: the host reference asks for no workspace") {
  auto rng = kvsift_test::make_rng(43);
  kvsift_test::Prompt p(rng, 2, 2, 2, 30, 8, 4);
  std::vector<float> out(2 * 2 * 30);
  std::vector<std::int32_t> lengths(4);
  WindowScoreParams params;
  params.window = 4;
  params.num_queries = 4;
  const auto scores = make_strided_view(out.data(), 4, 30);
  std::size_t bytes = 1;
  REQUIRE(window_scores_workspace_bytes(host::Exec{}, p.view(), p.queries(), params, scores, &bytes).ok());
  CHECK(bytes == 0);
  CHECK(window_scores_workspace_bytes(host::Exec{}, p.view(), p.queries(), params, scores, nullptr).message() ==
        "bytes is null");
  bytes = 1;
  REQUIRE(scored_prefix_lengths_workspace_bytes(host::Exec{}, p.view(), 4, 2, 30, lengths.data(), &bytes).ok());
  CHECK(bytes == 0);
  REQUIRE(host::scored_prefix_lengths(host::Exec{}, p.view(), 4, 2, 30, lengths.data(), Workspace{}).ok());
  const int second = std::max(0, p.lengths[1] - 4);  // [0, L - window) of a prompt no longer than cols
  CHECK(lengths == std::vector<std::int32_t>{26, 26, second, second});
  CHECK(host::scored_prefix_lengths(host::Exec{}, p.view(), 4, 0, 30, lengths.data()).message() ==
        "heads_per_sequence = 0 must be > 0");
}

// The ring path's plan (window_scores_plan.hpp), checked without a GPU: which shapes take it and which
// column sums, and that its partial slots hold every CTA of its grid that touches a segment (128 rows of
// a (sequence, KV head)), within what the policies' type-free workspace query reserves.
TEST_CASE("window_scores plan: the ring path's choice, slots and workspace bound") {
  using KV = ContiguousKV<const bfloat16_t>;
  auto facts = [](int sms, std::size_t smem = 232448) { return DeviceFacts{sms, smem, true, 9, 0}; };  // H100/H200
  auto plan_for = [&](int batch, int hkv, int group, int window, int max_len, int d, ScoreHeads heads, int sms,
                      std::size_t smem = 232448) {
    KV kv = make_bhsd<const bfloat16_t>(nullptr, nullptr, batch, hkv, max_len, d, nullptr);
    QueryRows<const bfloat16_t> q = make_query_rows<const bfloat16_t>(nullptr, window, hkv * group, d);
    WindowScoreParams p;
    p.window = window;
    p.num_queries = window;
    p.heads = heads;
    return detail::plan_window_scores(kv, q, p, make_strided_view<float>(nullptr, 1, max_len), facts(sms, smem));
  };
  // ClusterAttn on a Llama-3-8B layer: one segment a head, a persistent wave of 3 CTAs per SM, Q-resident
  // column sums.
  const auto llama = plan_for(1, 8, 4, 32, 131072, 128, ScoreHeads::kKvHeadMean, 132);
  CHECK(llama.tensor_cores == 128);
  CHECK(llama.ring_grid == 396);
  CHECK(llama.chunks == 396 / 8 + 2);
  CHECK(llama.ring_columns == detail::kRingColumnsQ);
  // 256 rows a head (W 32, G 8): two segments a head, still persistent; K-resident column sums.
  const auto wide = plan_for(1, 8, 8, 32, 4096, 128, ScoreHeads::kKvHeadMean, 132);
  CHECK(wide.ring_grid == 396);
  CHECK(wide.chunks == std::min(64, 396 / 16 + 2));
  CHECK(wide.ring_columns == detail::kRingColumnsK);
  // H2O-prefill at 32K (every position scored: 1024 segments a head): a CTA per segment, one slot.
  {
    KV kv = make_bhsd<const bfloat16_t>(nullptr, nullptr, 1, 8, 32768, 128, nullptr);
    const auto q = make_query_rows<const bfloat16_t>(nullptr, 32768, 32, 128);
    WindowScoreParams p;
    p.window = 32;
    p.num_queries = kAllQueries;
    const auto h2o = detail::plan_window_scores(kv, q, p, make_strided_view<float>(nullptr, 8, 32768), facts(132));
    CHECK(h2o.ring_grid == 8 * 1024);
    CHECK(h2o.chunks == 1);
    CHECK(h2o.ring_columns == detail::kRingColumnsK);
    // Query rows that are not 16-byte aligned: the general column sums after the ring's log-sum-exp.
    const auto odd = make_query_rows<const bfloat16_t>(reinterpret_cast<const bfloat16_t*>(std::uintptr_t(2)), 32768, 32, 128);
    CHECK(detail::plan_window_scores(kv, odd, p, make_strided_view<float>(nullptr, 8, 32768), facts(132)).ring_columns == 0);
  }
  // Not the ring path: a query-head layout whose group does not divide 8, an Exec without an SM count,
  // head_dim 96 (the CUDA cores).
  CHECK(plan_for(1, 8, 3, 32, 4096, 128, ScoreHeads::kQueryHead, 132).ring_grid == 0);
  CHECK(plan_for(1, 8, 3, 32, 4096, 128, ScoreHeads::kKvHeadMean, 132).ring_grid > 0);
  CHECK(plan_for(1, 8, 4, 32, 4096, 128, ScoreHeads::kKvHeadMean, 0).ring_grid == 0);
  CHECK(plan_for(1, 8, 4, 32, 4096, 96, ScoreHeads::kKvHeadMean, 132).tensor_cores == 0);
  // A part with 99 KiB of shared memory a block (sm_86/89/120): head_dim 256's ring (up to 160 KiB) does
  // not fit, 128's does; unknown (0) keeps the general path.
  CHECK(plan_for(1, 8, 4, 32, 4096, 256, ScoreHeads::kQueryHead, 84, 101376).ring_grid == 0);
  CHECK(plan_for(1, 8, 4, 32, 4096, 256, ScoreHeads::kQueryHead, 84, 101376).tensor_cores == 256);
  CHECK(plan_for(1, 8, 4, 32, 4096, 128, ScoreHeads::kQueryHead, 84, 101376).ring_grid > 0);
  CHECK(plan_for(1, 8, 4, 32, 4096, 128, ScoreHeads::kQueryHead, 84, 0).ring_grid == 0);
  CHECK(detail::window_ring_max_smem(256, 8) > 101376);
  CHECK(detail::window_ring_max_smem(128, 8) <= 101376);

  auto rng = kvsift_test::make_rng(72);
  for (int trial = 0; trial < 3000; ++trial) {
    const int batch = kvsift_test::uniform_int(rng, 1, 9), hkv = kvsift_test::uniform_int(rng, 1, 8);
    const int max_len = kvsift_test::uniform_int(rng, 1, 40000), sms = kvsift_test::uniform_int(rng, 1, 200);
    const int d = std::vector<int>{64, 128, 256}[std::size_t(kvsift_test::uniform_int(rng, 0, 2))];
    const int group = 1 << kvsift_test::uniform_int(rng, 0, 3), window = kvsift_test::uniform_int(rng, 1, 100);
    const auto plan = plan_for(batch, hkv, group, window, max_len, d, ScoreHeads::kQueryHead, sms);
    REQUIRE(plan.ring_grid > 0);
    const std::int64_t bh = std::int64_t(batch) * hkv, tiles = detail::window_ring_tiles(max_len);
    const std::int64_t segs = bh * ((window * group + 127) / 128), n = segs * tiles;
    CHECK(plan.ring_grid <= std::max<std::int64_t>(segs, std::int64_t(sms) * detail::window_ring_ctas_per_sm(d)));
    CHECK(plan.chunks <= detail::window_partials_per_row(max_len, bh, sms));
    // CTA c spans tiles [c n / grid, (c + 1) n / grid): count the CTAs each segment's tiles meet.
    std::vector<int> touching(std::size_t(segs), 0);
    for (int c = 0; c < plan.ring_grid; ++c) {
      const std::int64_t begin = c * n / plan.ring_grid, end = (c + 1) * n / plan.ring_grid;
      REQUIRE(end > begin);
      for (std::int64_t h = begin / tiles; h <= (end - 1) / tiles; ++h) ++touching[std::size_t(h)];
    }
    for (std::int64_t h = 0; h < segs; ++h) REQUIRE(touching[std::size_t(h)] <= plan.chunks);
  }
}

TEST_CASE("window_scores ring path: the slot layout is a bank-conflict-free permutation; the row order covers every row once") {
  namespace d = kvsift::detail;
  for (int head_dim : {64, 128, 256}) {
    CAPTURE(head_dim);
    const int chunks = head_dim / 8, stage = d::kWindowRingKeys * 2 * head_dim;
    REQUIRE(stage == int(d::window_ring_bytes(head_dim) / std::size_t(d::window_ring_stages(head_dim))));
    // Every (row, 16-byte chunk) of a slot at its own 16-byte-aligned place inside the slot.
    std::vector<int> owner(std::size_t(stage / 16), -1);
    for (int k = 0; k < d::kWindowRingKeys; ++k)
      for (int c = 0; c < chunks; ++c) {
        const int at = d::window_ring_chunk_offset(k, c);
        REQUIRE(at % 16 == 0);
        REQUIRE(at >= 0);
        REQUIRE(at < stage);
        REQUIRE(owner[std::size_t(at / 16)] == -1);
        owner[std::size_t(at / 16)] = k * chunks + c;
      }
    // wgmma's 128-byte swizzle, as PTX describes the K-major layout: row k's 16-byte chunk j of column
    // group q at group base + (k / 8) x 1,024 + (k % 8) x 128 + 16 (j ^ (k % 8)).
    for (int k = 0; k < d::kWindowRingKeys; ++k)
      for (int c = 0; c < chunks; ++c)
        CHECK(d::window_ring_chunk_offset(k, c) ==
              (c / 8) * d::kWindowRingKeys * 128 + (k / 8) * 1024 + (k % 8) * 128 + 16 * ((c % 8) ^ (k % 8)));
    // An ldmatrix phase reads one chunk of 8 consecutive rows: 8 different 16-byte bank quads.
    for (int k0 = 0; k0 < d::kWindowRingKeys; k0 += 8)
      for (int c = 0; c < chunks; ++c) {
        std::vector<int> quads;
        for (int k = k0; k < k0 + 8; ++k) quads.push_back(d::window_ring_chunk_offset(k, c) / 16 % 8);
        std::sort(quads.begin(), quads.end());
        CHECK(std::unique(quads.begin(), quads.end()) == quads.end());
      }
    // The resident rows: m-tiles x warps x (g, g + 8) cover 0 .. kWindowRingRows - 1 once, and a
    // warpgroup's 4 warps hold 64 consecutive rows for each m.
    const int warps = d::window_ring_warps(head_dim), tiles = d::window_ring_warp_rows(head_dim) / 16;
    std::vector<int> seen(std::size_t(d::kWindowRingRows), 0);
    for (int m = 0; m < tiles; ++m)
      for (int w = 0; w < warps; ++w) {
        const int r0 = d::window_ring_row16(head_dim, m, w);
        CHECK(r0 / 64 == (warps * m + w) / 4);  // warpgroup (w / 4) of m-tile m: its 64-row block
        for (int g = 0; g < 8; ++g)
          for (int h = 0; h < 2; ++h) ++seen[std::size_t(r0 + g + 8 * h)];
      }
    CHECK(std::count(seen.begin(), seen.end(), 1) == d::kWindowRingRows);
  }
}

// The ring kernels' walk over a CTA's span of (segment, tile) items: forward it visits exactly the span's
// live tiles (first key below the segment's key_end) in order, backward the same ones in reverse, and
// neither asks key_end of a segment outside the span.
TEST_CASE("window_scores ring path: the span walk visits the live tiles, forward and backward") {
  auto rng = kvsift_test::make_rng(91);
  for (int trial = 0; trial < 3000; ++trial) {
    const int tiles = kvsift_test::uniform_int(rng, 1, 12), segs = kvsift_test::uniform_int(rng, 1, 9);
    std::vector<int> key_end(segs);
    for (int& e : key_end) {
      const int pick = kvsift_test::uniform_int(rng, 0, 4);  // none, all, one key, a random count
      e = pick == 0 ? 0 : pick == 1 ? tiles * detail::kWindowRingKeys : pick == 2 ? 1
                                    : kvsift_test::uniform_int(rng, 0, tiles * detail::kWindowRingKeys + 70);
    }
    const std::int64_t n = std::int64_t(segs) * tiles;
    std::int64_t begin = kvsift_test::uniform_int(rng, 0, int(n)), end = kvsift_test::uniform_int(rng, 0, int(n));
    if (begin > end) std::swap(begin, end);
    CAPTURE(trial);
    std::vector<std::int64_t> want;
    for (std::int64_t item = begin; item < end; ++item)
      if (item % tiles * detail::kWindowRingKeys < key_end[item / tiles]) want.push_back(item);
    const int first_seg = int(begin / tiles), last_seg = end > begin ? int((end - 1) / tiles) : -1;
    auto key_end_of = [&](int s) {
      CHECK(s >= first_seg);
      CHECK(s <= last_seg);
      return key_end[std::size_t(std::clamp(s, 0, segs - 1))];
    };
    std::vector<std::int64_t> fwd, bwd;
    for (detail::RingCursor<> c(begin, end, tiles, key_end_of); c.live() && fwd.size() <= want.size(); c.next(key_end_of)) {
      CHECK(c.key0() == c.tile * detail::kWindowRingKeys);
      fwd.push_back(std::int64_t(c.seg) * tiles + c.tile);
    }
    for (detail::RingCursor<true> c(begin, end, tiles, key_end_of); c.live() && bwd.size() <= want.size(); c.next(key_end_of))
      bwd.push_back(std::int64_t(c.seg) * tiles + c.tile);
    CHECK(fwd == want);
    std::reverse(want.begin(), want.end());
    CHECK(bwd == want);
  }
}
