// window_scores and attention_cosine on the GPU over fp8 KV views (e4m3, e5m2; per-token and per-head
// scales) against the host reference over the same codes and scales. Both GPU paths dequantize each
// K element as code x scale in float, as the reference does, so they agree to fp32 rounding.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "support/device_buffer.cuh"
#include "support/random.hpp"

namespace kc = kvsift::cuda;
namespace kh = kvsift::host;
using kvsift::make_strided_view;
using kvsift_test::DeviceBuffer;
using kvsift::bfloat16_t;

namespace {

constexpr int kBatch = 2, kKvHeads = 2, kGroup = 3, kQHeads = kKvHeads * kGroup, kCap = 300, kDim = 64, kWindow = 8;

// Random codes (never a NaN code) and scales; queries in bf16.
template <class E>
struct Fp8Prompt {
  std::vector<E> k, v;
  std::vector<float> ks, vs;
  std::vector<bfloat16_t> q;
  std::vector<std::int32_t> lengths{kCap, 173};
  bool per_token;
  Fp8Prompt(std::mt19937_64& rng, bool per_token_scales) : per_token(per_token_scales) {
    const std::size_t n = std::size_t(kBatch) * kKvHeads * kCap * kDim;
    k = kvsift_test::random_values<E>(rng, n, -3.f, 3.f);  // finite codes: never the NaN code
    v = kvsift_test::random_values<E>(rng, n, -3.f, 3.f);
    const std::size_t ns = per_token ? std::size_t(kBatch) * kCap * kKvHeads : kKvHeads;
    ks = kvsift_test::random_values<float>(rng, ns, 0.05f, 0.6f);
    vs = kvsift_test::random_values<float>(rng, ns, 0.05f, 0.6f);
    q = kvsift_test::random_values<bfloat16_t>(rng, std::size_t(kBatch) * kWindow * kQHeads * kDim);
  }
  // BHSD over these buffers (host or device copies).
  template <class P>
  kvsift::ContiguousKV<const E> view(P k_data, P v_data, const std::int32_t* len, float* k_scale, float* v_scale) const {
    auto kv = kvsift::make_bhsd<const E>(k_data, v_data, kBatch, kKvHeads, kCap, kDim, len);
    kv.scales = per_token ? kvsift::make_per_token_scales_for(kv, k_scale, v_scale) : kvsift::make_per_head_scales(k_scale, v_scale);
    return kv;
  }
};

template <class E>
void check_window_scores(std::mt19937_64& rng, bool per_token, kvsift::ScoreHeads heads) {
  Fp8Prompt<E> p(rng, per_token);
  auto ks = p.ks, vs = p.vs;
  const auto hkv = p.view(p.k.data(), p.v.data(), p.lengths.data(), ks.data(), vs.data());
  const auto hq = kvsift::make_query_rows<const bfloat16_t>(p.q.data(), kWindow, kQHeads, kDim);
  kvsift::WindowScoreParams params;
  params.window = kWindow;
  params.num_queries = kWindow;  // the default (32) exceeds the kWindow query rows given
  params.heads = heads;
  const int rows = kBatch * (heads == kvsift::ScoreHeads::kKvHeadMean ? kKvHeads : kQHeads), cols = kCap;
  std::vector<float> expect(std::size_t(rows) * cols, -3.f);
  const auto hst = kh::window_scores(kh::Exec{}, hkv, hq, params, make_strided_view(expect.data(), rows, cols));
  REQUIRE_MESSAGE(hst.ok(), hst.to_string());

  DeviceBuffer<E> dk(p.k), dv(p.v);
  DeviceBuffer<float> dks(p.ks), dvs(p.vs), out(std::size_t(rows) * cols);
  DeviceBuffer<std::int32_t> dlen(p.lengths);
  DeviceBuffer<bfloat16_t> dq(p.q);
  out.poison();
  const auto kv = p.view(dk.get(), dv.get(), dlen.get(), dks.get(), dvs.get());
  const auto q = kvsift::make_query_rows<const bfloat16_t>(dq.get(), kWindow, kQHeads, kDim);
  const auto exec = kc::Exec::for_current_device();
  const auto scores = make_strided_view(out.get(), rows, cols);
  std::size_t bytes = 0;
  REQUIRE(kvsift::window_scores_workspace_bytes(exec, kv, q, params, scores, &bytes).ok());
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, bytes));
  const auto st = kc::window_scores(exec, kv, q, params, scores, kvsift::Workspace{ws.get(), ws.size()});
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  kvsift_test::sync_and_check();
  const auto got = out.download();
  const int H = rows / kBatch;
  for (int r = 0; r < rows; ++r) {
    const int prefix = std::max(0, p.lengths[r / H] - kWindow);
    for (int j = 0; j < cols; ++j) {
      const float e = expect[std::size_t(r) * cols + j], g = got[std::size_t(r) * cols + j];
      if (j >= prefix) REQUIRE(std::isnan(g));  // untouched poison
      else REQUIRE_MESSAGE(std::fabs(g - e) <= 1e-4f * std::fabs(e) + 1e-6f, "row ", r, " col ", j, ": ", g, " vs ", e);
    }
  }
}

template <class E>
void check_cosine(std::mt19937_64& rng, bool per_token) {
  Fp8Prompt<E> p(rng, per_token);
  const int slots = 60;
  std::vector<std::int32_t> pos(std::size_t(kBatch) * kKvHeads * slots, -1);
  for (int r = 0; r < kBatch * kKvHeads; ++r) {
    int n = 0;
    for (int j = 0; j < p.lengths[r / kKvHeads] && n < slots - 5; j += kvsift_test::uniform_int(rng, 1, 7)) pos[std::size_t(r) * slots + n++] = j;
  }
  auto ks = p.ks, vs = p.vs;
  const auto hkv = p.view(p.k.data(), p.v.data(), p.lengths.data(), ks.data(), vs.data());
  const auto hq = kvsift::make_query_rows<const bfloat16_t>(p.q.data(), 3, kQHeads, kDim);
  std::vector<float> expect(std::size_t(kBatch) * kQHeads * 3);
  REQUIRE(kh::attention_cosine(kh::Exec{}, hkv, hq, 3, 0.f, kvsift::KeptPositions{pos.data(), kBatch * kKvHeads, kKvHeads, slots, slots},
                               expect.data()).ok());
  DeviceBuffer<E> dk(p.k), dv(p.v);
  DeviceBuffer<float> dks(p.ks), dvs(p.vs), out(expect.size());
  DeviceBuffer<std::int32_t> dlen(p.lengths), dpos(pos);
  DeviceBuffer<bfloat16_t> dq(p.q);
  out.poison();
  const auto kv = p.view(dk.get(), dv.get(), dlen.get(), dks.get(), dvs.get());
  const auto q = kvsift::make_query_rows<const bfloat16_t>(dq.get(), 3, kQHeads, kDim);
  const auto st = kc::attention_cosine(kc::Exec::for_current_device(), kv, q, 3, 0.f,
                                       kvsift::KeptPositions{dpos.get(), kBatch * kKvHeads, kKvHeads, slots, slots}, out.get());
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  kvsift_test::sync_and_check();
  const auto got = out.download();
  for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == doctest::Approx(expect[i]).epsilon(1e-4));
}

}  // namespace

TEST_CASE("window_scores on the GPU over fp8 KV matches the host reference") {
  auto rng = kvsift_test::make_rng(811);
  for (bool per_token : {true, false}) {
    CAPTURE(per_token);
    check_window_scores<kvsift::fp8_e4m3_t>(rng, per_token, kvsift::ScoreHeads::kKvHeadMean);
    check_window_scores<kvsift::fp8_e5m2_t>(rng, per_token, kvsift::ScoreHeads::kQueryHead);
  }
}

TEST_CASE("attention_cosine on the GPU over fp8 KV matches the host reference") {
  auto rng = kvsift_test::make_rng(812);
  for (bool per_token : {true, false}) {
    CAPTURE(per_token);
    check_cosine<kvsift::fp8_e4m3_t>(rng, per_token);
    check_cosine<kvsift::fp8_e5m2_t>(rng, per_token);
  }
}
