// decode_attention over fp8 KV (e4m3, e5m2) on the GPU against the host reference, which dequantizes
// in double: contiguous BSHD and paged NHD/HND (pages in a random order), per-head and per-token
// scales (for BSHD both [batch, token, head] and [batch, head, token], the latter 16-byte aligned or
// not), dense, gathered (tokens, blocks) and mixed heads, head_dim 64/128/256, GQA groups 1/4/8,
// q_len 1 and 3, with and without block-max scores. Outputs are poisoned before each launch.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "kvsift/ops/decode_attention.cuh"
#include "support/device_buffer.cuh"
#include "support/random.hpp"

namespace {

using kvsift::bfloat16_t;
using kvsift_test::DeviceBuffer;

// kBSHDHeadMajor: a BSHD cache whose per-token scales are [batch, head, token] (make_per_token_scales_head_major).
enum class Layout { kBSHD, kBSHDHeadMajor, kPagedNHD, kPagedHND };

struct Fp8Case {
  int batch = 2, hkv = 2, group = 4, d = 128, q_len = 1, cap = 300, page = 16;
  Layout layout = Layout::kBSHD;
  kvsift::ScaleGranularity gran = kvsift::ScaleGranularity::kPerToken;
  int sparse_heads = 0;  // the last ones
  int block = 1;         // 1: token gathers; >= 16: blocks
  int score_block = 0;   // 0: none
  int num_sms = 0;       // 0: the device's
};

bool close(double got, double want, double tol) {
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::abs(got - want) <= tol * (1.0 + std::abs(want));  // false for NaN (the poison)
}

template <class KT>
void run_case(const Fp8Case& c, std::mt19937_64& rng) {
  const int B = c.batch, H = c.hkv, G = c.group, Hq = H * G, D = c.d, QL = c.q_len;
  const bool paged = c.layout == Layout::kPagedNHD || c.layout == Layout::kPagedHND;
  const int P = c.page, pages_per_seq = (c.cap + P - 1) / P, S = paged ? pages_per_seq * P : c.cap;
  const int num_pages = B * pages_per_seq + 1;
  const std::size_t rows = paged ? std::size_t(num_pages) * P * H : std::size_t(B) * S * H;
  std::uniform_real_distribution<float> val(-300.f, 300.f), sc(0.002f, 0.2f);
  std::vector<KT> k(rows * D), v(rows * D);
  for (auto& x : k) x = kvsift::from_float<KT>(val(rng));
  for (auto& x : v) x = kvsift::from_float<KT>(val(rng));
  const bool per_token = c.gran == kvsift::ScaleGranularity::kPerToken;
  std::vector<float> ks(per_token ? rows : std::size_t(H)), vs(ks.size());
  for (auto& x : ks) x = sc(rng);
  for (auto& x : vs) x = sc(rng);
  std::vector<std::int32_t> lengths(B);
  for (int b = 0; b < B; ++b) lengths[b] = b == 0 ? S : std::max(QL, int(rng() % (S + 1)));
  std::vector<std::int32_t> table(std::size_t(B) * pages_per_seq);
  {
    std::vector<std::int32_t> perm(num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::copy(perm.begin(), perm.begin() + table.size(), table.begin());
  }
  auto q = kvsift_test::random_values<bfloat16_t>(rng, std::size_t(B) * QL * Hq * D, -2.f, 2.f);
  // Index rows for the sparse heads: random entries, some duplicated, some out of range.
  const int units = (S + c.block - 1) / c.block, capacity = std::max(1, std::min(units, 64 / std::max(1, c.block / 16)));
  std::vector<std::int32_t> idx(std::size_t(B) * H * capacity), counts(std::size_t(B) * H);
  for (std::size_t r = 0; r < counts.size(); ++r) {
    counts[r] = int(rng() % (capacity + 1));
    for (int e = 0; e < capacity; ++e) idx[r * capacity + e] = int(rng() % (units + 2)) - 1;
  }
  kvsift::HeadRoleMask roles;
  for (int h = H - c.sparse_heads; h < H; ++h) roles.set_sparse(h, true);

  auto build = [&](auto* kp, auto* vp, float* ksp, float* vsp, const std::int32_t* tab, const std::int32_t* len) {
    using P_ = std::remove_pointer_t<decltype(kp)>;
    struct Views {
      kvsift::ContiguousKV<P_> c;
      kvsift::PagedKV<P_> p;
    } out;
    out.c = kvsift::make_bshd(kp, vp, B, H, S, D, len);
    out.c.scales = !per_token                           ? kvsift::make_per_head_scales(ksp, vsp)
                   : c.layout == Layout::kBSHDHeadMajor ? kvsift::make_per_token_scales_head_major(out.c, ksp, vsp)
                                                        : kvsift::make_per_token_scales_for(out.c, ksp, vsp);
    out.p = kvsift::make_paged(kp, vp, tab, B, pages_per_seq, num_pages, H, P, D,
                               c.layout == Layout::kPagedHND ? kvsift::PageLayout::kHND : kvsift::PageLayout::kNHD, len);
    out.p.scales = per_token ? kvsift::make_per_token_scales_for(out.p, ksp, vsp) : kvsift::make_per_head_scales(ksp, vsp);
    return out;
  };
  const int sb = c.score_block ? c.score_block : 1;
  const int cols = (S + sb - 1) / sb;
  auto params = [&](const bfloat16_t* qp, bfloat16_t* op, float* lse, const std::int32_t* ip, const std::int32_t* cp,
                    float* scores) {
    auto p = kvsift::make_decode_attention_params(qp, op, QL, Hq, D);
    p.io.lse = lse;
    p.roles = roles;
    auto set = kvsift::make_index_set(const_cast<std::int32_t*>(ip), const_cast<std::int32_t*>(cp), B * H, capacity,
                                      c.block > 1 ? kvsift::Granularity::kBlock : kvsift::Granularity::kToken, c.block);
    p.index_set = kvsift::as_const(set);
    if (c.score_block) {
      p.scores = scores;
      p.score_row_stride = cols;
      p.score_block_size = sb;
    }
    return p;
  };

  // Host reference.
  std::vector<bfloat16_t> ref(q.size());
  std::vector<float> ref_lse(std::size_t(B) * QL * Hq), ref_scores(std::size_t(B) * H * cols, 0.f);
  const auto hv = build(k.data(), v.data(), ks.data(), vs.data(), table.data(), lengths.data());
  const auto hp = params(q.data(), ref.data(), ref_lse.data(), idx.data(), counts.data(), ref_scores.data());
  const auto hst = paged ? kvsift::host::decode_attention(kvsift::host::Exec{}, hv.p, hp)
                         : kvsift::host::decode_attention(kvsift::host::Exec{}, hv.c, hp);
  REQUIRE_MESSAGE(hst.ok(), hst.to_string());

  // CUDA.
  DeviceBuffer<KT> dk(k), dv(v);
  DeviceBuffer<float> dks(ks), dvs(vs), dlse(ref_lse.size()), dscores(ref_scores.size());
  DeviceBuffer<std::int32_t> dtable(table), dlen(lengths), didx(idx), dcnt(counts);
  DeviceBuffer<bfloat16_t> dq(q), dout(q.size());
  dout.poison();
  dlse.poison();
  dscores.poison();
  auto exec = kvsift::cuda::Exec::for_current_device();
  if (c.num_sms > 0) exec.device.num_sms = c.num_sms;
  const auto dvw = build(dk.get(), dv.get(), dks.get(), dvs.get(), dtable.get(), dlen.get());
  const auto dp = params(dq.get(), dout.get(), dlse.get(), didx.get(), dcnt.get(), dscores.get());
  std::size_t bytes = 0;
  const auto qst = paged ? kvsift::decode_attention_workspace_bytes(exec, dvw.p, dp, &bytes)
                         : kvsift::decode_attention_workspace_bytes(exec, dvw.c, dp, &bytes);
  REQUIRE_MESSAGE(qst.ok(), qst.to_string());
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(bytes, 1));
  const auto st = paged ? kvsift::cuda::decode_attention(exec, dvw.p, dp, kvsift::Workspace{ws.get(), bytes})
                        : kvsift::cuda::decode_attention(exec, dvw.c, dp, kvsift::Workspace{ws.get(), bytes});
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  kvsift_test::sync_and_check();

  // fp16 tensor cores: Q and P are rounded to fp16 (K and V are exact), accumulation fp32.
  const auto out = dout.download();
  const auto lse = dlse.download();
  for (std::size_t i = 0; i < out.size(); ++i)
    REQUIRE_MESSAGE(close(kvsift::to_float(out[i]), kvsift::to_float(ref[i]), 2e-2), "out ", i);
  for (std::size_t i = 0; i < lse.size(); ++i) REQUIRE_MESSAGE(close(lse[i], ref_lse[i], 2e-3), "lse ", i);
  if (c.score_block) {
    const auto scores = dscores.download();
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H - c.sparse_heads; ++h)
        for (int j = 0; j < cols; ++j) {
          const std::size_t i = (std::size_t(b) * H + h) * cols + j;
          REQUIRE_MESSAGE(close(scores[i], ref_scores[i], 2e-2), "score ", i);
        }
  }
}

std::string describe(const Fp8Case& c) {
  return "d=" + std::to_string(c.d) + " G=" + std::to_string(c.group) + " q_len=" + std::to_string(c.q_len) +
         " cap=" + std::to_string(c.cap) +
         " layout=" + std::to_string(int(c.layout)) + " per_token=" + std::to_string(int(c.gran)) +
         " sparse=" + std::to_string(c.sparse_heads) + " block=" + std::to_string(c.block) +
         " score_block=" + std::to_string(c.score_block) + " num_sms=" + std::to_string(c.num_sms);
}

template <class KT>
void run_matrix() {
  std::mt19937_64 rng(kvsift_test::test_seed());
  for (int d : {64, 128, 256})
    for (auto layout : {Layout::kBSHD, Layout::kBSHDHeadMajor, Layout::kPagedNHD, Layout::kPagedHND})
      for (auto gran : {kvsift::ScaleGranularity::kPerHead, kvsift::ScaleGranularity::kPerToken}) {
        if (layout == Layout::kBSHDHeadMajor && gran == kvsift::ScaleGranularity::kPerHead) continue;
        Fp8Case c;
        // Head-major scales: capacity 300 keeps every head's scales 16-byte aligned (the vector copies),
        // 302 misaligns the odd heads (their per-scale copies).
        if (layout == Layout::kBSHDHeadMajor) c.cap = rng() % 2 ? 300 : 302;
        c.d = d;
        c.layout = layout;
        c.gran = gran;
        c.group = d == 256 ? 1 : 4;
        c.hkv = 2;
        c.sparse_heads = int(rng() % 3);
        c.block = rng() % 2 ? 1 : 32;
        c.q_len = rng() % 3 == 0 ? 3 : 1;
        c.score_block = c.sparse_heads < 2 && rng() % 2 ? 64 : 0;
        c.num_sms = rng() % 2 ? 2 : 0;  // few SMs: many splits per head
        CAPTURE(describe(c));
        run_case<KT>(c, rng);
      }
  Fp8Case g8;  // G = 8, the 16-row tile
  g8.group = 8;
  g8.q_len = 2;
  CAPTURE(describe(g8));
  run_case<KT>(g8, rng);
}

}  // namespace

TEST_CASE("decode_attention fp8 e4m3: CUDA matches the host reference across layouts, scales and roles") {
  run_matrix<kvsift::fp8_e4m3_t>();
}

TEST_CASE("decode_attention fp8 e5m2: CUDA matches the host reference across layouts, scales and roles") {
  run_matrix<kvsift::fp8_e5m2_t>();
}
