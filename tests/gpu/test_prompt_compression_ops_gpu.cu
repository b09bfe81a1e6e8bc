// Stages of prompt compression on the GPU against the host reference: window scores (to fp32
// rounding), and pooling, clustering, compaction and attention cosine on identical inputs.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "support/device_buffer.cuh"
#include "support/kv_fixtures.hpp"
#include "support/prompt_fixtures.hpp"
#include "support/tool_scale.hpp"

namespace kc = kvsift::cuda;
namespace kh = kvsift::host;
using kvsift::make_strided_view;
using kvsift_test::DeviceBuffer;
using kvsift_test::Prompt;

namespace {

template <class T>
std::vector<T> convert(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = kvsift::from_float<T>(v[i]);
  return out;
}
template <class T>
std::vector<float> widen(const std::vector<T>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = kvsift::to_float(v[i]);
  return out;
}

// The shape of one window_scores comparison beyond its dtype and scoring parameters. `num_sms` > 0 makes
// the Exec claim that many SMs: the window path's persistent grid then has a few CTAs whose spans run
// over many tiles and several (sequence, KV head) pairs, and whose log-sum-exp partials share rows.
struct ScoreShape {
  int batch = 3, kv_heads = 2, capacity = 300, head_dim = 64, num_sms = 0;
  bool misaligned_q = false;  // query rows one element off 16 bytes (the ring path's general column sums)
};

// Window scores of one configuration on both backends; dtype T for Q and K.
template <class T>
void compare_window_scores(std::mt19937_64& rng, int group, int window, int num_queries, kvsift::ScoreHeads heads,
                           bool give_lse, const ScoreShape& shape = {}) {
  const int cap = shape.capacity, D = shape.head_dim;
  const int q_rows = num_queries == kvsift::kAllQueries ? cap : window;
  Prompt p(rng, shape.batch, shape.kv_heads, group, cap, D, q_rows);
  // The first sequence full, the last one longer than the window, the others anything (some shorter
  // than the window: nothing scored).
  for (int b = 0; b < p.batch; ++b) p.lengths[b] = kvsift_test::uniform_int(rng, 1, cap);
  p.lengths[0] = cap;
  if (p.batch > 1) p.lengths[p.batch - 1] = kvsift_test::uniform_int(rng, std::min(window + 1, cap), cap);
  CAPTURE(group);
  CAPTURE(window);
  CAPTURE(D);
  CAPTURE(shape.num_sms);
  CAPTURE(give_lse);
  // Round the inputs to T so host and device see the same values.
  p.k = widen(convert<T>(p.k));
  p.q = widen(convert<T>(p.q));
  const int H = heads == kvsift::ScoreHeads::kKvHeadMean ? p.kv_heads : p.q_heads;
  const int rows = p.batch * H, cols = cap;
  kvsift::WindowScoreParams params;
  params.window = window;
  params.num_queries = num_queries;
  params.heads = heads;

  // The engine's log-sum-exp, when given, comes from the host reference's definition.
  std::vector<float> lse;
  if (give_lse) {
    lse.assign(std::size_t(p.batch) * p.q_heads * q_rows, 0.f);
    auto kv = p.view();
    for (int b = 0; b < p.batch; ++b) {
      const int L = p.lengths[b], nq = num_queries == kvsift::kAllQueries ? L : std::min(window, L);
      for (int h = 0; h < p.q_heads; ++h)
        for (int i = 0; i < nq; ++i) {
          double m = -INFINITY, s = 0;
          std::vector<double> l;
          for (int j = 0; j <= L - nq + i; ++j) {
            double dot = 0;
            for (int e = 0; e < D; ++e) dot += double(p.queries().row(b, i, h)[e]) * double(kv.k_row(b, h / group, j)[e]);
            l.push_back(dot / std::sqrt(double(D)));
            m = std::max(m, l.back());
          }
          for (double x : l) s += std::exp(x - m);
          lse[(std::size_t(b) * p.q_heads + h) * q_rows + i] = float(m + std::log(s));
        }
    }
    params.lse = lse.data();
  }
  std::vector<float> expect(std::size_t(rows) * cols, -3.f);
  REQUIRE(kh::window_scores(kh::Exec{}, p.view(), p.queries(), params, make_strided_view(expect.data(), rows, cols)).ok());

  std::vector<T> q_host = convert<T>(p.q);
  if (shape.misaligned_q) q_host.insert(q_host.begin(), kvsift::from_float<T>(0.f));
  DeviceBuffer<T> dk(convert<T>(p.k)), dq(q_host);
  DeviceBuffer<std::int32_t> dlen(p.lengths);
  DeviceBuffer<float> dlse(lse), out(std::size_t(rows) * cols);
  out.poison();
  auto kv = kvsift::make_bhsd<const T>(dk.get(), dk.get(), p.batch, p.kv_heads, p.capacity, p.head_dim, dlen.get());
  auto q = kvsift::make_query_rows<T>(dq.get() + (shape.misaligned_q ? 1 : 0), q_rows, p.q_heads, p.head_dim);
  if (give_lse) params.lse = dlse.get();
  auto exec = kc::Exec::for_current_device();
  if (shape.num_sms > 0) exec.device.num_sms = shape.num_sms;
  const auto scores = make_strided_view(out.get(), rows, cols);
  std::size_t bytes = 0;
  REQUIRE(kvsift::window_scores_workspace_bytes(exec, kv, q, params, scores, &bytes).ok());
  CHECK((bytes == 0) == give_lse);  // the softmax partials, unless the engine gives the log-sum-exp
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, bytes));
  REQUIRE(kc::window_scores(exec, kv, q, params, scores, kvsift::Workspace{ws.get(), ws.size()}).ok());
  kvsift_test::sync_and_check();
  const auto got = out.download();
  for (int r = 0; r < rows; ++r) {
    const int prefix = std::max(0, p.lengths[r / H] - window);
    for (int j = 0; j < cols; ++j) {
      const float e = expect[std::size_t(r) * cols + j], g = got[std::size_t(r) * cols + j];
      if (j >= prefix) {
        REQUIRE(std::isnan(g));  // untouched poison
      } else {
        REQUIRE_MESSAGE(std::fabs(g - e) <= 1e-4f * std::fabs(e) + 1e-6f, "row ", r, " col ", j, ": ", g, " vs ", e);
      }
    }
  }
}

}  // namespace

TEST_CASE("window_scores on the GPU matches the host reference") {
  auto rng = kvsift_test::make_rng(70);
  for (int group : {1, 4})
    for (auto heads : {kvsift::ScoreHeads::kKvHeadMean, kvsift::ScoreHeads::kQueryHead}) {
      compare_window_scores<float>(rng, group, 32, 32, heads, false);
      compare_window_scores<__nv_bfloat16>(rng, group, 7, 7, heads, false);
    }
  compare_window_scores<kvsift::half_t>(rng, 4, 16, 16, kvsift::ScoreHeads::kKvHeadMean, true);
  compare_window_scores<float>(rng, 2, 16, kvsift::kAllQueries, kvsift::ScoreHeads::kKvHeadMean, false);  // H2O
  // 16-bit Q and K take the tensor-core path; all queries of a 300-token prompt span several row tiles.
  compare_window_scores<__nv_bfloat16>(rng, 2, 16, kvsift::kAllQueries, kvsift::ScoreHeads::kQueryHead, false);
  compare_window_scores<__half>(rng, 8, 32, 32, kvsift::ScoreHeads::kQueryHead, true);
}

// The ring path (16-bit Q and K, head_dim 64 / 128 / 256): every head_dim, both score layouts, groups
// 1-8, windows that fill the 128-row tile, ones that leave most of it empty and ones past it, H2O-prefill,
// with and without the engine's log-sum-exp, on prompts of several ring tiles. The claimed SM counts
// shrink the persistent grid to 3-21 CTAs, so one CTA's span covers many tiles and crosses segment
// boundaries mid-ring, and a row's log-sum-exp merges the partials of several CTAs; 0 keeps the real
// count (about a CTA per tile here).
TEST_CASE("window_scores on the GPU: the ring path over long persistent spans matches the host reference") {
  auto rng = kvsift_test::make_rng(71);
  using kvsift::ScoreHeads;
  struct Case {
    int group, window;
    ScoreHeads heads;
  };
  const Case cases[] = {{4, 32, ScoreHeads::kKvHeadMean}, {4, 32, ScoreHeads::kQueryHead}, {8, 16, ScoreHeads::kQueryHead},
                        {1, 100, ScoreHeads::kKvHeadMean}, {2, 5, ScoreHeads::kQueryHead},  {3, 40, ScoreHeads::kKvHeadMean}};
  // Under a sanitizer (KVSIFT_UNDER_TOOL): every head_dim and path, 2 of the 4 SM counts.
  const std::vector<int> sm_counts = kvsift_test::under_tool() ? std::vector<int>{2, 0} : std::vector<int>{1, 2, 7, 0};
  for (int D : {64, 128, 256})
    for (int sms : sm_counts) {
      ScoreShape shape;
      shape.batch = 3;
      shape.kv_heads = 2;
      shape.capacity = 700;  // 11 tiles of 64 keys, the last one partial
      shape.head_dim = D;
      shape.num_sms = sms;
      for (const Case& c : cases) {
        compare_window_scores<__nv_bfloat16>(rng, c.group, c.window, c.window, c.heads, false, shape);
        compare_window_scores<__half>(rng, c.group, c.window, c.window, c.heads, c.group == 4, shape);
      }
      // More than 128 rows a head: two segments a head on the persistent grid, K-resident column sums.
      compare_window_scores<__nv_bfloat16>(rng, 8, 32, 32, ScoreHeads::kQueryHead, false, shape);
      compare_window_scores<__half>(rng, 4, 48, 48, ScoreHeads::kKvHeadMean, true, shape);
      // H2O-prefill on a shorter prompt: with 1-7 SMs a CTA per segment (causal spans), with the real
      // count a persistent grid.
      ScoreShape h2o = shape;
      h2o.capacity = 300;
      compare_window_scores<__nv_bfloat16>(rng, 2, 16, kvsift::kAllQueries, ScoreHeads::kQueryHead, false, h2o);
      compare_window_scores<__half>(rng, 4, 16, kvsift::kAllQueries, ScoreHeads::kKvHeadMean, false, h2o);
      // The mean over 6 or 3 heads (a group that does not divide 8): the K-resident column sums' tiles
      // of 64 rows are then not whole positions, and their query rows are addressed row by row.
      compare_window_scores<__nv_bfloat16>(rng, 6, 16, kvsift::kAllQueries, ScoreHeads::kKvHeadMean, false, h2o);
      compare_window_scores<__half>(rng, 3, 48, 48, ScoreHeads::kKvHeadMean, true, shape);
      // Query rows off 16 bytes: the ring's log-sum-exp, then the general column sums.
      h2o.misaligned_q = true;
      compare_window_scores<__nv_bfloat16>(rng, 2, 16, kvsift::kAllQueries, ScoreHeads::kQueryHead, false, h2o);
    }
}

TEST_CASE("pooling and density clustering on the GPU equal the host on the same scores") {
  auto rng = kvsift_test::make_rng(71);
  const int rows = 5, cols = 3000;
  std::vector<float> s(std::size_t(rows) * cols);
  for (auto& x : s) x = kvsift_test::uniform_int(rng, 0, 30) == 0 ? 0.5f * kvsift_test::uniform_int(rng, 1, 5) : 1e-3f * kvsift_test::uniform_int(rng, 0, 3);
  std::vector<std::int32_t> len = {cols, 0, 1, kvsift_test::uniform_int(rng, 2, cols), 1999};
  DeviceBuffer<float> ds(s), dout(s.size());
  DeviceBuffer<std::int32_t> dlen(len);
  for (auto kind : {kvsift::PoolKind::kAvg, kvsift::PoolKind::kMax}) {
    std::vector<float> expect(s.size(), 0.f);
    std::memset(expect.data(), kvsift_test::kPoisonByte, expect.size() * sizeof(float));
    REQUIRE(kh::pool_scores(kh::Exec{}, make_strided_view<const float>(s.data(), rows, cols), len.data(), {kind, 7},
                            make_strided_view(expect.data(), rows, cols)).ok());
    dout.poison();
    REQUIRE(kc::pool_scores(kc::Exec::for_current_device(), make_strided_view<const float>(ds.get(), rows, cols), dlen.get(), {kind, 7},
                            make_strided_view(dout.get(), rows, cols)).ok());
    kvsift_test::sync_and_check();
    const auto got = dout.download();
    CHECK(std::memcmp(got.data(), expect.data(), got.size() * sizeof(float)) == 0);
  }
  // The clustering also on scores with NaN (never a maximum) and -inf (a maximum only of a block with
  // nothing larger), whole blocks of them, and ties: the warp-per-block centres (blocks of 32 or more
  // tokens: num_block 37 -> 82, 7 -> 429) and the thread-per-block ones (budget 500 / 37 -> 13) must
  // pick the sequential scan's lowest position of the maximum.
  std::vector<float> odd = s;
  for (std::size_t i = 0; i < odd.size(); ++i) {
    const int u = kvsift_test::uniform_int(rng, 0, 40);
    if (u == 0) odd[i] = NAN;
    if (u == 1) odd[i] = -INFINITY;
  }
  for (int i = 600; i < 1200; ++i) odd[i] = (i < 900 ? NAN : -INFINITY);  // row 0: blocks of only NaN / -inf
  DeviceBuffer<float> dodd(odd);
  for (const std::vector<float>* scores_host : {&s, &odd})
  for (int num_block : {37, 7})
  for (auto block_rule : {kvsift::BlockRule::kPrefixSplit, kvsift::BlockRule::kBudgetSplit})
    for (auto radius_rule : {kvsift::RadiusRule::kHalfBlock, kvsift::RadiusRule::kBudgetBlocks, kvsift::RadiusRule::kFixed}) {
      CAPTURE(num_block);
      CAPTURE(scores_host == &odd);
      kvsift::ClusterParams c;
      c.num_block = num_block;
      c.theta = 0.7f;
      c.budget = 500;
      c.block_rule = block_rule;
      c.radius_rule = radius_rule;
      c.fixed_radius = 9;
      std::vector<std::uint8_t> expect(s.size(), 0xFF);
      REQUIRE(kh::cluster_flags(kh::Exec{}, make_strided_view<const float>(scores_host->data(), rows, cols), len.data(), c,
                                make_strided_view(expect.data(), rows, cols)).ok());
      DeviceBuffer<std::uint8_t> dflags(s.size());
      const auto exec = kc::Exec::for_current_device();
      const auto scores = make_strided_view<const float>(scores_host == &s ? ds.get() : dodd.get(), rows, cols);
      const auto flags = make_strided_view(dflags.get(), rows, cols);
      std::size_t bytes = 0;
      REQUIRE(kvsift::cluster_flags_workspace_bytes(exec, scores, dlen.get(), c, flags, &bytes).ok());
      DeviceBuffer<unsigned char> ws(bytes);
      dflags.poison();
      REQUIRE(kc::cluster_flags(exec, scores, dlen.get(), c, flags, kvsift::Workspace{ws.get(), ws.size()}).ok());
      kvsift_test::sync_and_check();
      CHECK(dflags.download() == expect);
      // Flag rows 3 bytes apart from 8-byte alignment (the kernel stores a run of 8 flags as one word
      // only where the run is aligned): the same flags, the padding untouched.
      const int padded = cols + 3;
      DeviceBuffer<std::uint8_t> dpad(std::size_t(rows) * padded);
      dpad.poison();
      REQUIRE(kc::cluster_flags(exec, scores, dlen.get(), c, make_strided_view(dpad.get(), rows, cols, padded),
                                kvsift::Workspace{ws.get(), ws.size()}).ok());
      kvsift_test::sync_and_check();
      const auto pad = dpad.download();
      for (int r = 0; r < rows; ++r) {
        CHECK(std::memcmp(pad.data() + std::size_t(r) * padded, expect.data() + std::size_t(r) * cols, cols) == 0);
        for (int e = cols; e < padded; ++e) CHECK(pad[std::size_t(r) * padded + e] == kvsift_test::kPoisonByte);
      }
    }
}

TEST_CASE("compact_kv on the GPU into a paged destination equals the host") {
  auto rng = kvsift_test::make_rng(72);
  // 300: rows longer than a warp's register segment (256, core/warp_rows.cuh), copied in two.
  for (const int D : {128, 300}) {
    CAPTURE(D);
    Prompt p(rng, 3, 2, 4, 200, D, 1);
    p.lengths = {200, 90, 13};
    const int K = 40, W = 16, heads = 8;  // query-head granular destination
    std::vector<std::int32_t> kept(std::size_t(p.batch) * heads * K, -1), counts(std::size_t(p.batch) * heads);
    for (int b = 0; b < p.batch; ++b)
      for (int h = 0; h < heads; ++h) {
        const int r = b * heads + h, prefix = std::max(0, p.lengths[b] - W), n = std::min(K, prefix);
        std::vector<int> all(prefix);
        for (int j = 0; j < prefix; ++j) all[j] = j;
        std::shuffle(all.begin(), all.end(), rng);
        all.resize(n);
        std::sort(all.begin(), all.end());
        for (int s = 0; s < n; ++s) kept[std::size_t(r) * K + s] = all[s];
        counts[r] = n;
      }
    kvsift_test::PagedFixture pages(rng, {p.batch, heads, K + W, D}, 16, kvsift::PageLayout::kNHD);
    std::vector<std::int32_t> dst_len(p.batch, pages.shape.capacity);
    // Host reference into a host copy of the page pool.
    std::vector<float> hk(pages.k.size(), 0.f), hv(hk.size(), 0.f);
    std::vector<std::int32_t> h_new(p.batch), h_pos(std::size_t(p.batch) * heads * (K + W));
    auto host_dst = pages.view(hk.data(), hv.data(), pages.block_table.data(), dst_len.data());
    auto kept_set = kvsift::make_index_set(kept.data(), counts.data(), p.batch * heads, K);
    REQUIRE(kh::compact_kv(kh::Exec{}, p.view(), kvsift::as_const(kept_set), W, host_dst,
                           kvsift::CompactOutputs{h_new.data(), h_pos.data(), K + W}).ok());

    DeviceBuffer<float> sk(p.k), sv(p.v), dk(hk.size()), dv(hk.size());
    DeviceBuffer<std::int32_t> slen(p.lengths), dlen(dst_len), table(pages.block_table), dkept(kept), dcounts(counts),
        d_new(p.batch), d_pos(h_pos.size());
    dk.upload(std::vector<float>(hk.size(), 0.f));
    dv.upload(std::vector<float>(hk.size(), 0.f));
    d_new.poison();
    d_pos.poison();
    auto src = kvsift::make_bhsd(sk.get(), sv.get(), p.batch, p.kv_heads, p.capacity, p.head_dim, slen.get());
    auto dst = pages.view(dk.get(), dv.get(), table.get(), dlen.get());
    auto dset = kvsift::make_index_set(dkept.get(), dcounts.get(), p.batch * heads, K);
    REQUIRE(kc::compact_kv(kc::Exec::for_current_device(), src, kvsift::as_const(dset), W, dst,
                           kvsift::CompactOutputs{d_new.get(), d_pos.get(), K + W}).ok());
    kvsift_test::sync_and_check();
    CHECK(d_new.download() == h_new);
    CHECK(d_pos.download() == h_pos);
    CHECK(dk.download() == hk);
    CHECK(dv.download() == hv);
  }
}

TEST_CASE("attention_cosine on the GPU matches the host") {
  auto rng = kvsift_test::make_rng(73);
  Prompt p(rng, 2, 2, 4, 500, 64, 3);
  p.lengths = {500, 321};
  const int heads = 2, slots = 100;
  std::vector<std::int32_t> pos(std::size_t(p.batch) * heads * slots, -1);
  for (int r = 0; r < p.batch * heads; ++r) {
    int n = 0;
    for (int j = 0; j < p.lengths[r / heads] && n < slots - 10; j += kvsift_test::uniform_int(rng, 1, 6)) pos[std::size_t(r) * slots + n++] = j;
  }
  std::vector<float> expect(std::size_t(p.batch) * p.q_heads * 3);
  const kvsift::KeptPositions hkp{pos.data(), p.batch * heads, heads, slots, slots};
  REQUIRE(kh::attention_cosine(kh::Exec{}, p.view(), p.queries(), 3, 0.f, hkp, expect.data()).ok());
  DeviceBuffer<float> dk(p.k), dq(p.q), out(expect.size());
  DeviceBuffer<std::int32_t> dlen(p.lengths), dpos(pos);
  out.poison();
  auto kv = kvsift::make_bhsd(dk.get(), dk.get(), p.batch, p.kv_heads, p.capacity, p.head_dim, dlen.get());
  auto q = kvsift::make_query_rows<float>(dq.get(), 3, p.q_heads, p.head_dim);
  REQUIRE(kc::attention_cosine(kc::Exec::for_current_device(), kv, q, 3, 0.f, kvsift::KeptPositions{dpos.get(), p.batch * heads, heads, slots, slots},
                               out.get()).ok());
  kvsift_test::sync_and_check();
  const auto got = out.download();
  for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == doctest::Approx(expect[i]).epsilon(1e-4));
}

TEST_CASE("window_scores and cluster_flags on the GPU: a workspace too small names the bytes, before any launch") {
  auto rng = kvsift_test::make_rng(74);
  Prompt p(rng, 2, 2, 2, 200, 64, 16);
  DeviceBuffer<float> dk(p.k), dq(p.q), out(std::size_t(p.batch) * p.kv_heads * 200);
  DeviceBuffer<std::int32_t> dlen(p.lengths);
  const auto exec = kc::Exec::for_current_device();
  const auto kv = kvsift::make_bhsd(dk.get(), dk.get(), p.batch, p.kv_heads, p.capacity, p.head_dim, dlen.get());
  const auto q = kvsift::make_query_rows<float>(dq.get(), 16, p.q_heads, p.head_dim);
  kvsift::WindowScoreParams params;
  params.window = 16;
  params.num_queries = 16;
  const auto scores = make_strided_view(out.get(), p.batch * p.kv_heads, 200);
  std::size_t bytes = 0;
  REQUIRE(kvsift::window_scores_workspace_bytes(exec, kv, q, params, scores, &bytes).ok());
  REQUIRE(bytes > 0);
  DeviceBuffer<unsigned char> ws(bytes);
  auto st = kc::window_scores(exec, kv, q, params, scores, kvsift::Workspace{ws.get(), bytes - 1});
  CHECK(st.code() == kvsift::StatusCode::kInsufficientSpace);
  CHECK(st.message() == "workspace.bytes = " + std::to_string(bytes - 1) + " is smaller than the " +
                            std::to_string(bytes) + " bytes required (ask the workspace-size query)");
  st = kc::window_scores(exec, kv, q, params, scores);
  CHECK(st.message() == "workspace.data is null (ask window_scores_workspace_bytes)");

  const auto flags_in = make_strided_view<const float>(out.get(), p.batch * p.kv_heads, 200);
  DeviceBuffer<std::uint8_t> dflags(std::size_t(p.batch) * p.kv_heads * 200);
  const auto flags = make_strided_view(dflags.get(), p.batch * p.kv_heads, 200);
  kvsift::ClusterParams c;
  c.budget = 64;
  REQUIRE(kvsift::cluster_flags_workspace_bytes(exec, flags_in, nullptr, c, flags, &bytes).ok());
  DeviceBuffer<unsigned char> cws(bytes);
  st = kc::cluster_flags(exec, flags_in, nullptr, c, flags, kvsift::Workspace{cws.get(), bytes / 2});
  CHECK(st.code() == kvsift::StatusCode::kInsufficientSpace);
  CHECK(st.message() == "workspace.bytes = " + std::to_string(bytes / 2) + " is smaller than the " +
                            std::to_string(bytes) + " bytes required (ask the workspace-size query)");
  kvsift_test::sync_and_check();
}
