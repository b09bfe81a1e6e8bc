// GPU fuzz, prompt-compression ops: cuda:: against host:: on random small problems, every output
// poisoned before the launch. pool_scores, cluster_flags and compact_kv are exact (the same float
// operations in the same order on both backends; the existing GPU tests hold them to memcmp), and
// window_scores is an fp32 sum whose order differs (1e-4 relative, as in test_prompt_compression_ops_gpu).
// Columns an op must leave untouched (past a row's length, the unscored window) must still hold the
// poison. Drawn per case: ragged lengths incl. 0, 1, negative and past the row, every pooling kernel
// size, cluster rules and thresholds, duplicate-free kept rows of random counts, GQA groups, fp32 and
// bf16 queries and keys, SnapKV / H2O query counts, engine-supplied log-sum-exp or not.
//
// Family weight 0.20 of test_fuzz_gpu's cases, 0.15 of its seconds.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "support/device_buffer.cuh"
#include "support/fuzz.hpp"
#include "support/fuzz_values.hpp"
#include "support/prompt_fixtures.hpp"

namespace {

namespace fz = kvsift_test::fuzz;
namespace kc = kvsift::cuda;
namespace kh = kvsift::host;
using fz::chance;
using fz::pick;
using kvsift::make_strided_view;
using kvsift_test::DeviceBuffer;

std::vector<std::int32_t> row_lengths(std::mt19937_64& rng, int rows, int cols) {
  std::vector<std::int32_t> len(static_cast<std::size_t>(rows));
  for (auto& l : len) {
    const int u = pick(rng, 0, 7);
    l = u == 0 ? 0 : u == 1 ? 1 : u == 2 ? -pick(rng, 1, 9) : u == 3 ? cols + pick(rng, 1, 9) : pick(rng, 0, cols);
  }
  return len;
}

void fuzz_pool(std::mt19937_64& rng, std::string* what) {
  const int rows = pick(rng, 1, 8), cols = pick(rng, 1, 3000);
  const kvsift::PoolParams pp{chance(rng, 50) ? kvsift::PoolKind::kAvg : kvsift::PoolKind::kMax, 2 * pick(rng, 0, 7) + 1};
  // Finite rows for kAvg (inf - inf in a running sum is not defined by the contract); no NaN for kMax.
  const fz::ScoreFill fills_avg[] = {fz::ScoreFill::kUniform, fz::ScoreFill::kFewValues, fz::ScoreFill::kAllEqual,
                                     fz::ScoreFill::kDenormals, fz::ScoreFill::kSignedZeros};
  const fz::ScoreFill fills_max[] = {fz::ScoreFill::kUniform, fz::ScoreFill::kFewValues, fz::ScoreFill::kAllEqual,
                                     fz::ScoreFill::kDenormals, fz::ScoreFill::kSignedZeros, fz::ScoreFill::kInfinities,
                                     fz::ScoreFill::kHuge};
  const fz::ScoreFill fill = pp.kind == kvsift::PoolKind::kAvg ? fz::one_of(rng, fills_avg) : fz::one_of(rng, fills_max);
  std::vector<float> s(std::size_t(rows) * cols);
  for (auto& x : s) x = fz::score_value(rng, fill, 3e38f, 0.5f);
  const auto len = row_lengths(rng, rows, cols);
  *what = "pool rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) + " kernel=" + std::to_string(pp.kernel) +
          " kind=" + std::to_string(int(pp.kind)) + " fill=" + fz::name(fill);
  std::vector<float> want(s.size());
  std::memset(want.data(), kvsift_test::kPoisonByte, want.size() * 4);
  REQUIRE(kh::pool_scores(kh::Exec{}, make_strided_view<const float>(s.data(), rows, cols), len.data(), pp,
                          make_strided_view(want.data(), rows, cols)).ok());
  DeviceBuffer<float> ds(s), dout(s.size());
  DeviceBuffer<std::int32_t> dlen(len);
  dout.poison();
  REQUIRE(kc::pool_scores(kc::Exec::for_current_device(), make_strided_view<const float>(ds.get(), rows, cols), dlen.get(), pp,
                          make_strided_view(dout.get(), rows, cols)).ok());
  kvsift_test::sync_and_check();
  const auto got = dout.download();
  for (std::size_t i = 0; i < got.size(); ++i)
    REQUIRE_MESSAGE(std::memcmp(&got[i], &want[i], 4) == 0, "row ", i / cols, " col ", i % cols, ": ", got[i], " vs ", want[i]);
}

void fuzz_cluster(std::mt19937_64& rng, std::string* what) {
  const int rows = pick(rng, 1, 6), cols = pick(rng, 1, 3000);
  std::vector<float> s(std::size_t(rows) * cols);
  const int spike = pick(rng, 5, 60);
  for (auto& x : s) x = pick(rng, 0, spike) == 0 ? 0.25f * float(pick(rng, 1, 5)) : 1e-3f * float(pick(rng, 0, 3));
  if (chance(rng, 10)) std::fill(s.begin(), s.end(), 0.125f);  // all-equal rows
  const auto len = row_lengths(rng, rows, cols);
  kvsift::ClusterParams c;
  c.num_block = pick(rng, 1, 64);
  c.theta = chance(rng, 20) ? 0.f : std::uniform_real_distribution<float>(0.f, 1.f)(rng);
  c.budget = pick(rng, 0, cols);
  c.block_rule = chance(rng, 50) ? kvsift::BlockRule::kPrefixSplit : kvsift::BlockRule::kBudgetSplit;
  c.radius_rule = kvsift::RadiusRule(pick(rng, 0, 2));
  c.fixed_radius = pick(rng, 0, 20);
  *what = "cluster rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) + " num_block=" +
          std::to_string(c.num_block) + " theta=" + std::to_string(c.theta) + " budget=" + std::to_string(c.budget) +
          " block_rule=" + std::to_string(int(c.block_rule)) + " radius_rule=" + std::to_string(int(c.radius_rule)) +
          " fixed_radius=" + std::to_string(c.fixed_radius);
  std::vector<std::uint8_t> want(s.size(), 0xFF);
  const auto hs = kh::cluster_flags(kh::Exec{}, make_strided_view<const float>(s.data(), rows, cols), len.data(), c,
                                    make_strided_view(want.data(), rows, cols));
  REQUIRE_MESSAGE(hs.ok(), hs.to_string());
  DeviceBuffer<float> ds(s);
  DeviceBuffer<std::int32_t> dlen(len);
  DeviceBuffer<std::uint8_t> dflags(s.size());
  const auto exec = kc::Exec::for_current_device();
  const auto scores = make_strided_view<const float>(ds.get(), rows, cols);
  const auto flags = make_strided_view(dflags.get(), rows, cols);
  std::size_t bytes = 0;
  REQUIRE(kvsift::cluster_flags_workspace_bytes(exec, scores, dlen.get(), c, flags, &bytes).ok());
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(bytes, 1));
  ws.poison();
  dflags.poison();
  const auto st = kc::cluster_flags(exec, scores, dlen.get(), c, flags, kvsift::Workspace{ws.get(), bytes});
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  kvsift_test::sync_and_check();
  const auto got = dflags.download();
  for (std::size_t i = 0; i < got.size(); ++i)
    REQUIRE_MESSAGE(got[i] == want[i], "row ", i / cols, " col ", i % cols, ": ", int(got[i]), " vs ", int(want[i]));
}

template <class T>
std::vector<float> round_to(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = kvsift::to_float(kvsift::from_float<T>(v[i]));
  return out;
}
template <class T>
std::vector<T> convert(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = kvsift::from_float<T>(v[i]);
  return out;
}

template <class T>
void fuzz_window_scores(std::mt19937_64& rng, std::string* what) {
  const int batch = pick(rng, 1, 3), hkv = pick(rng, 1, 3), group = pick(rng, 1, 8), cap = pick(rng, 2, 260);
  const int D = fz::one_of(rng, {64, 128});
  const int window = pick(rng, 1, std::min(cap, 40));
  const bool h2o = chance(rng, 25);
  const int q_rows = h2o ? cap : window;
  kvsift_test::Prompt p(rng, batch, hkv, group, cap, D, q_rows, chance(rng, 20) ? 6.f : 2.f);
  for (int b = 0; b < batch; ++b) p.lengths[std::size_t(b)] = chance(rng, 20) ? pick(rng, 1, window) : pick(rng, 1, cap);
  p.k = round_to<T>(p.k);
  p.q = round_to<T>(p.q);
  kvsift::WindowScoreParams params;
  params.window = window;
  params.num_queries = h2o ? kvsift::kAllQueries : window;
  params.heads = chance(rng, 50) ? kvsift::ScoreHeads::kKvHeadMean : kvsift::ScoreHeads::kQueryHead;
  const int H = params.heads == kvsift::ScoreHeads::kKvHeadMean ? hkv : hkv * group;
  const int rows = batch * H, cols = cap + pick(rng, 0, 5);
  *what = "window_scores batch=" + std::to_string(batch) + " hkv=" + std::to_string(hkv) + " G=" + std::to_string(group) +
          " cap=" + std::to_string(cap) + " D=" + std::to_string(D) + " window=" + std::to_string(window) +
          " h2o=" + std::to_string(h2o) + " heads=" + std::to_string(int(params.heads)) + " cols=" + std::to_string(cols);
  std::vector<float> want(std::size_t(rows) * cols, -3.f);
  REQUIRE(kh::window_scores(kh::Exec{}, p.view(), p.queries(), params, make_strided_view(want.data(), rows, cols)).ok());
  DeviceBuffer<T> dk(convert<T>(p.k)), dq(convert<T>(p.q));
  DeviceBuffer<std::int32_t> dlen(p.lengths);
  DeviceBuffer<float> out(std::size_t(rows) * cols);
  out.poison();
  const auto kv = kvsift::make_bhsd<const T>(dk.get(), dk.get(), batch, hkv, cap, D, dlen.get());
  const auto q = kvsift::make_query_rows<T>(dq.get(), q_rows, p.q_heads, D);
  auto exec = kc::Exec::for_current_device();
  // A claimed SM count of 1-3 shrinks the window path's persistent grid to a few CTAs, each running over
  // many tiles and (sequence, KV head) pairs.
  const int sms = chance(rng, 30) ? pick(rng, 1, 3) : 0;
  if (sms > 0) exec.device.num_sms = sms;
  *what += " sms=" + std::to_string(sms);
  const auto scores = make_strided_view(out.get(), rows, cols);
  std::size_t bytes = 0;
  REQUIRE(kvsift::window_scores_workspace_bytes(exec, kv, q, params, scores, &bytes).ok());
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, bytes));
  ws.poison();
  const auto st = kc::window_scores(exec, kv, q, params, scores, kvsift::Workspace{ws.get(), ws.size()});
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  kvsift_test::sync_and_check();
  const auto got = out.download();
  for (int r = 0; r < rows; ++r) {
    const int prefix = std::max(0, std::min(p.lengths[std::size_t(r / H)] - window, cols));
    for (int j = 0; j < cols; ++j) {
      const float e = want[std::size_t(r) * cols + j], g = got[std::size_t(r) * cols + j];
      INFO("row " << r << " col " << j << " prefix " << prefix);
      if (j >= prefix)
        REQUIRE(std::isnan(g));  // untouched: the poison
      else
        REQUIRE_MESSAGE(std::fabs(g - e) <= 1e-4f * std::fabs(e) + 1e-6f, g, " vs ", e);
    }
  }
}

void fuzz_compact(std::mt19937_64& rng, std::string* what) {
  const int batch = pick(rng, 1, 3), hkv = pick(rng, 1, 3), D = fz::one_of(rng, {64, 128}), cap = pick(rng, 1, 200);
  kvsift_test::Prompt p(rng, batch, hkv, 1, cap, D, 1);
  for (auto& l : p.lengths) l = pick(rng, 0, cap);
  // The index set's capacity is max(K, 1) (a row cannot have capacity 0), and compact_kv needs
  // capacity + W destination slots.
  const int K = pick(rng, 0, 48), W = pick(rng, 0, 24), slots = std::max(K, 1) + W + pick(rng, 0, 4);
  if (slots == 0) return;
  std::vector<std::int32_t> kept(std::size_t(batch) * hkv * std::max(K, 1), -1), counts(std::size_t(batch) * hkv);
  for (int b = 0; b < batch; ++b) {
    const int prefix = std::max(0, p.lengths[std::size_t(b)] - W);
    const int n = std::min(K, prefix);
    for (int h = 0; h < hkv; ++h) {  // every head the same count, as the policies produce
      std::vector<int> all(static_cast<std::size_t>(prefix));
      for (int j = 0; j < prefix; ++j) all[std::size_t(j)] = j;
      std::shuffle(all.begin(), all.end(), rng);
      all.resize(std::size_t(n));
      std::sort(all.begin(), all.end());
      const int r = b * hkv + h;
      for (int s = 0; s < n; ++s) kept[std::size_t(r) * std::max(K, 1) + s] = all[std::size_t(s)];
      counts[std::size_t(r)] = n;
    }
  }
  *what = "compact_kv batch=" + std::to_string(batch) + " hkv=" + std::to_string(hkv) + " D=" + std::to_string(D) +
          " cap=" + std::to_string(cap) + " K=" + std::to_string(K) + " W=" + std::to_string(W) + " slots=" + std::to_string(slots);
  std::vector<std::int32_t> dst_len(std::size_t(batch), slots);
  const std::size_t dst_elems = std::size_t(batch) * hkv * slots * D;
  std::vector<float> hk(dst_elems), hv(dst_elems);
  std::memset(hk.data(), kvsift_test::kPoisonByte, dst_elems * 4);
  std::memset(hv.data(), kvsift_test::kPoisonByte, dst_elems * 4);
  std::vector<std::int32_t> h_new(std::size_t(batch), -1), h_pos(std::size_t(batch) * hkv * slots, -1);
  auto hdst = kvsift::make_bhsd(hk.data(), hv.data(), batch, hkv, slots, D, dst_len.data());
  auto hset = kvsift::make_index_set(kept.data(), counts.data(), batch * hkv, std::max(K, 1));
  const auto hs = kh::compact_kv(kh::Exec{}, p.view(), kvsift::as_const(hset), W, hdst,
                                 kvsift::CompactOutputs{h_new.data(), h_pos.data(), slots});
  REQUIRE_MESSAGE(hs.ok(), hs.to_string());
  DeviceBuffer<float> sk(p.k), sv(p.v), dk(dst_elems), dv(dst_elems);
  DeviceBuffer<std::int32_t> slen(p.lengths), dlen(dst_len), dkept(kept), dcounts(counts), d_new(static_cast<std::size_t>(batch)),
      d_pos(h_pos.size());
  for (auto* b : {&dk, &dv}) b->poison();
  d_new.poison();
  d_pos.poison();
  auto src = kvsift::make_bhsd(sk.get(), sv.get(), batch, hkv, cap, D, slen.get());
  auto ddst = kvsift::make_bhsd(dk.get(), dv.get(), batch, hkv, slots, D, dlen.get());
  auto dset = kvsift::make_index_set(dkept.get(), dcounts.get(), batch * hkv, std::max(K, 1));
  const auto st = kc::compact_kv(kc::Exec::for_current_device(), src, kvsift::as_const(dset), W, ddst,
                                 kvsift::CompactOutputs{d_new.get(), d_pos.get(), slots});
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  kvsift_test::sync_and_check();
  // Positions: host -1 for empty slots vs device poison -1: the same bytes either way.
  REQUIRE(d_new.download() == h_new);
  REQUIRE(d_pos.download() == h_pos);
  const auto gk = dk.download(), gv = dv.download();
  REQUIRE(std::memcmp(gk.data(), hk.data(), dst_elems * 4) == 0);
  REQUIRE(std::memcmp(gv.data(), hv.data(), dst_elems * 4) == 0);
}

}  // namespace

TEST_CASE("fuzz gpu: prompt-compression ops against the host reference") {
  for (fz::Family f("gpu compression ops", 0.20, "fuzz gpu: prompt-compression ops against the host reference", 0.15);
       f.next();) {
    auto rng = f.rng();
    std::string what;
    INFO(f.replay());
    INFO(what);
    switch (f.index() % 5) {
      case 0: fuzz_pool(rng, &what); break;
      case 1: fuzz_cluster(rng, &what); break;
      case 2: fuzz_window_scores<float>(rng, &what); break;
      case 3: fuzz_window_scores<kvsift::bfloat16_t>(rng, &what); break;
      default: fuzz_compact(rng, &what); break;
    }
  }
}
