// GPU fuzz, decode attention: cuda::decode_attention against host::decode_attention on random small
// problems. Every KV dtype (fp32, bf16, fp16, fp8 e4m3 / e5m2 with per-head or per-token scales),
// contiguous BSHD, paged NHD / HND (pages in a random order), and a custom view (tokens stored in
// reverse order, 16/32-bit only: custom fp8 views are not served on CUDA); dense, gathered (token or
// block granularity) and mixed heads; head_dim 64/128/256, GQA groups 1-8, q_len 1-4; lengths 0, 1,
// negative, past the capacity and at the split plan's chunk boundaries (chunk - 1, chunk, chunk + 1
// of the very launch's plan); index rows from the adversarial mix of support/index_rows.hpp; value
// fills of support/fuzz_values.hpp; optional block-max scores; num_sms varied so other split plans
// run on the same GPU. Outputs and workspace are poisoned before every launch, and the device cache's
// rows past each visible length hold NaN.
//
// Tolerances follow the arithmetic (the reference accumulates in double): fp32 K/V run the softmax and
// both products in fp32 (1e-5); 16-bit K/V round P to 16 bits for P.V and the output to 16 bits (bf16
// 1e-2, fp16 4e-3); fp8 K/V are widened exactly and run as fp16/bf16 MMAs (2e-2). The output bound is
// relative to the largest |v| the row attends to (the sum of p |v| bounds the products' error), so
// huge V values get the same relative tolerance as small ones.
//
// Family weight 0.40 of test_fuzz_gpu's cases and seconds (the binary's weights sum to 1).

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "kvsift/ops/decode_attention.cuh"
#include "support/device_buffer.cuh"
#include "support/fuzz.hpp"
#include "support/fuzz_values.hpp"
#include "support/index_rows.hpp"

namespace {

namespace fz = kvsift_test::fuzz;
using fz::chance;
using fz::pick;
using kvsift_test::DeviceBuffer;

// A custom view: sequence b's token t lives in slot capacity - 1 - t of a BSHD buffer. No capacity
// member, so the call must set max_kv_length (the path engines with their own layouts take).
template <class T>
struct ReversedKV {
  using value_type = T;
  T* k = nullptr;
  T* v = nullptr;
  const std::int32_t* lengths = nullptr;
  int batch = 0, num_kv_heads = 0, head_dim = 0, slots = 0;
  KVSIFT_HD std::int64_t offset(int b, int h, int t) const {
    return ((std::int64_t(b) * slots + (slots - 1 - t)) * num_kv_heads + h) * head_dim;
  }
  KVSIFT_HD T* k_row(int b, int h, int t) const { return k + offset(b, h, t); }
  KVSIFT_HD T* v_row(int b, int h, int t) const { return v + offset(b, h, t); }
  KVSIFT_HD int length(int b) const {
    const int n = lengths[b];
    return n < 0 ? 0 : (n > slots ? slots : n);
  }
  kvsift::Status validate() const { return kvsift::Status(); }
};

enum class Layout { kBSHD, kPagedNHD, kPagedHND, kReversed };
const char* name(Layout l) {
  static const char* n[] = {"BSHD", "paged NHD", "paged HND", "custom reversed"};
  return n[int(l)];
}

template <class KT> struct Tol { static constexpr double out = 1e-2, lse = 1e-2, score = 5e-2; };
template <> struct Tol<kvsift::half_t> { static constexpr double out = 4e-3, lse = 4e-3, score = 1e-2; };
template <> struct Tol<float> { static constexpr double out = 1e-5, lse = 1e-5, score = 1e-5; };
template <> struct Tol<kvsift::fp8_e4m3_t> { static constexpr double out = 2e-2, lse = 2e-3, score = 2e-2; };
template <> struct Tol<kvsift::fp8_e5m2_t> { static constexpr double out = 2e-2, lse = 2e-3, score = 2e-2; };

bool close(double got, double want, double tol, double scale) {
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::abs(got - want) <= tol * (scale + std::abs(want));  // false for NaN (the poison)
}

template <class KT>
float largest() {
  if constexpr (std::is_same_v<KT, kvsift::half_t>) return 65504.f;
  else if constexpr (kvsift::is_fp8_dtype<KT>::value) return 448.f;
  else return 3.0e38f;
}

template <class KT, class QT>
void fuzz_case(std::mt19937_64& rng, std::string* what) {
  constexpr bool fp8 = kvsift::is_fp8_dtype<KT>::value;
  const int B = pick(rng, 1, 4), H = pick(rng, 1, 3), G = pick(rng, 1, 8), Hq = H * G;
  const int D = fz::one_of(rng, {64, 128, 256}), QL = chance(rng, 60) ? 1 : pick(rng, 2, 4);
  Layout layout = Layout(pick(rng, 0, fp8 ? 2 : 3));
  const bool paged = layout == Layout::kPagedNHD || layout == Layout::kPagedHND;
  const int page = fz::one_of(rng, {16, 32, 64});
  const int cap = pick(rng, QL, chance(rng, 20) ? 400 : 160);
  const int max_pages = (cap + page - 1) / page, S = paged ? max_pages * page : cap;
  const int num_pages = B * max_pages + pick(rng, 0, 3);
  auto exec = kvsift::cuda::Exec::for_current_device();
  const int sms[] = {0, 1, 2, 3, 7, 132, 1000};
  const int num_sms = fz::one_of(rng, sms);
  if (num_sms > 0) exec.device.num_sms = num_sms;
  // A custom view has no capacity: max_kv_length is required; elsewhere sometimes below, sometimes past S.
  int max_kv_length = layout == Layout::kReversed ? S : 0;
  if (chance(rng, 25)) max_kv_length = pick(rng, QL, S + (layout == Layout::kReversed ? 0 : 20));
  const int M = max_kv_length > 0 ? max_kv_length : S;

  kvsift::HeadRoleMask roles;
  const int role_pick = pick(rng, 0, 2);  // dense, mixed, all sparse
  for (int h = 0; h < H; ++h) roles.set_sparse(h, role_pick == 2 || (role_pick == 1 && chance(rng, 50)));
  const bool any_sparse = roles.count_sparse(H) > 0;
  const bool block_gather = chance(rng, 40);
  const int gblock = block_gather ? fz::one_of(rng, {16, 32, 64, 128}) : 1;
  const int units = (S + gblock - 1) / gblock;
  const int idx_cap = any_sparse ? pick(rng, 1, 2 * units + 2) : 0;
  const int idx_stride = idx_cap + (chance(rng, 30) ? 3 : 0);
  const int score_block = chance(rng, 40) ? fz::one_of(rng, {1, 16, 64}) : 0;
  const int sb = score_block ? score_block : 1;
  const int score_cols = (std::max(S, M) + sb - 1) / sb, score_stride = score_cols + 2;
  const bool per_token = fp8 && chance(rng, 50);
  const fz::KvFill fill = fz::draw_kv_fill(rng);
  const auto range = fz::kv_range(rng, fill, largest<KT>(), std::is_same_v<KT, kvsift::half_t> ? 1e-6f : 1e-40f);

  auto params_for = [&](const QT* qp, QT* op, float* lp, float* sp, const std::int32_t* ip, const std::int32_t* cp) {
    auto p = kvsift::make_decode_attention_params(qp, op, QL, Hq, D);
    p.io.lse = lp;
    p.roles = roles;
    p.max_kv_length = max_kv_length;
    if (any_sparse) {
      kvsift::ConstIndexSet s;
      s.indices = ip;
      s.counts = cp;
      s.rows = B * H;
      s.capacity = idx_cap;
      s.row_stride = idx_stride;
      s.granularity = block_gather ? kvsift::Granularity::kBlock : kvsift::Granularity::kToken;
      s.block_size = gblock;
      p.index_set = s;
    }
    if (score_block) {
      p.scores = sp;
      p.score_row_stride = score_stride;
      p.score_block_size = sb;
    }
    return p;
  };

  // Storage: BSHD rows (contiguous and reversed) or paged rows, one scale per row (per token) or head.
  const std::size_t rows = paged ? std::size_t(num_pages) * page * H : std::size_t(B) * S * H;
  std::vector<KT> k(rows * D), v(rows * D);
  const float code_scale = fp8 ? 200.f : 1.f;  // fp8 codes use their range; the scales bring them back
  // fp8 codes stay inside the smaller (e4m3) range: an overflowing code is not a number.
  auto code = [&](float x) { return fp8 ? std::clamp(code_scale * x, -440.f, 440.f) : x; };
  for (auto& x : k) x = kvsift::from_float<KT>(code(fz::kv_value(rng, range, true)));
  for (auto& x : v) x = kvsift::from_float<KT>(code(fz::kv_value(rng, range, false)));
  std::vector<float> ks(per_token ? rows : std::size_t(H), 1.f), vs(ks.size(), 1.f);
  if (fp8) {
    std::uniform_real_distribution<float> sc(0.001f, 0.02f);
    for (auto& x : ks) x = sc(rng);
    for (auto& x : vs) x = sc(rng);
  }
  std::vector<std::int32_t> table(std::size_t(B) * max_pages, 0);
  {
    std::vector<std::int32_t> perm(static_cast<std::size_t>(num_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::copy(perm.begin(), perm.begin() + table.size(), table.begin());
  }
  const auto q = kvsift_test::random_values<QT>(rng, std::size_t(B) * QL * Hq * D, -2.f, 2.f);

  auto make_view = [&](KT* kp, KT* vp, float* ksp, float* vsp, const std::int32_t* tab, const std::int32_t* len,
                       auto&& f) {
    if (layout == Layout::kBSHD) {
      auto kv = kvsift::make_bshd(kp, vp, B, H, S, D, len);
      if constexpr (fp8)
        kv.scales = per_token ? kvsift::make_per_token_scales_for(kv, ksp, vsp) : kvsift::make_per_head_scales(ksp, vsp);
      return f(kv);
    }
    if (paged) {
      auto kv = kvsift::make_paged(kp, vp, tab, B, max_pages, num_pages, H, page, D,
                                   layout == Layout::kPagedNHD ? kvsift::PageLayout::kNHD : kvsift::PageLayout::kHND, len);
      if constexpr (fp8)
        kv.scales = per_token ? kvsift::make_per_token_scales_for(kv, ksp, vsp) : kvsift::make_per_head_scales(ksp, vsp);
      return f(kv);
    }
    if constexpr (!fp8) {
      ReversedKV<KT> kv{kp, vp, len, B, H, D, S};
      return f(kv);
    }
    return kvsift::Status();
  };

  DeviceBuffer<KT> dk(k), dv(v);
  DeviceBuffer<float> dks(ks), dvs(vs);
  DeviceBuffer<std::int32_t> dtab(table);
  DeviceBuffer<QT> dq(q);

  // Lengths: random (0, 1, negative, past the capacity), or at the chunk boundaries of this launch's
  // own split plan (computed from the same view, params and device facts the launch uses).
  std::vector<std::int32_t> lengths(static_cast<std::size_t>(B));
  const bool boundary = chance(rng, 30);
  int chunk = 0, sparse_chunk = 0;  // the plan's splits of a retrieval head (tokens) and a sparse head (positions)
  if (boundary) {
    DeviceBuffer<std::int32_t> dzero(std::vector<std::int32_t>(std::size_t(B) * H * std::max(1, idx_stride) + 1, 0));
    kvsift::detail::DecodePlan plan;
    // Non-null lse / scores pointers like the launch's: the plan (the chunk) depends on them.
    const auto p = params_for(dq.get(), const_cast<QT*>(dq.get()), reinterpret_cast<float*>(dzero.get()),
                              reinterpret_cast<float*>(dzero.get()), dzero.get(), dzero.get());
    const auto st = make_view(dk.get(), dv.get(), dks.get(), dvs.get(), dtab.get(), dzero.get(), [&](const auto& kv) {
      return kvsift::detail::plan_decode_attention(exec.device, kv, p, &plan);
    });
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    chunk = plan.num_retrieval > 0 ? plan.chunk : plan.sparse_chunk;
    sparse_chunk = plan.sparse_chunk;
    const int pattern[] = {chunk - 1, chunk, chunk + 1, 2 * chunk - 1, 2 * chunk, 2 * chunk + 1, 0, 1, S};
    for (auto& l : lengths) l = std::clamp(fz::one_of(rng, pattern), 0, S + 1);
  } else {
    for (auto& l : lengths) {
      const int u = pick(rng, 0, 9);
      l = u == 0 ? 0 : u == 1 ? 1 : u == 2 ? -pick(rng, 1, 3) : u == 3 ? S + pick(rng, 1, 9) : pick(rng, 0, S);
    }
  }
  auto visible = [&](int b) { return std::min(std::max(lengths[std::size_t(b)], 0), std::min(S, M)); };
  for (int b = 0; b < B; ++b)
    if (visible(b) > 0 && visible(b) < QL) lengths[std::size_t(b)] = QL;  // q_len fits every non-empty sequence
  // On the device, the rows past each sequence's visible length hold NaN, and so do their per-token fp8
  // scales (the host reference reads the finite values): a kernel that copies such a row and weighs it
  // by zero must zero it first, or the NaN reaches the output.
  {
    std::vector<KT> pk = k, pv = v;
    std::vector<float> pks = ks, pvs = vs;
    const KT nan = kvsift::from_float<KT>(NAN);
    const auto st = make_view(pk.data(), pv.data(), pks.data(), pvs.data(), table.data(), lengths.data(), [&](const auto& kv) {
      for (int b = 0; b < B; ++b)
        for (int t = visible(b); t < S; ++t)
          for (int h = 0; h < H; ++h) {
            std::fill_n(kv.k_row(b, h, t), D, nan);
            std::fill_n(kv.v_row(b, h, t), D, nan);
            if constexpr (fp8)
              if (per_token) pks[std::size_t(kv.scale_offset(b, h, t))] = pvs[std::size_t(kv.scale_offset(b, h, t))] = NAN;
          }
      return kvsift::Status();
    });
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    dk.upload(pk);
    dv.upload(pv);
    dks.upload(pks);
    dvs.upload(pvs);
  }

  std::vector<std::int32_t> idx, counts;
  if (any_sparse)
    for (int r = 0; r < B * H; ++r) {
      const int force =
          boundary && sparse_chunk >= gblock ? std::max(0, sparse_chunk / gblock + pick(rng, -1, 1)) : -1;
      const auto row = kvsift_test::make_index_row(rng, kvsift_test::draw_row_kind(rng), visible(r / H), S, gblock,
                                                   idx_cap, idx_stride, force);
      idx.insert(idx.end(), row.slots.begin(), row.slots.end());
      counts.push_back(row.count);
    }
  *what = std::string("decode ") + kvsift::dtype_traits<KT>::name + "/" + kvsift::dtype_traits<QT>::name + " " +
          name(layout) + " B=" + std::to_string(B) + " H=" + std::to_string(H) + " G=" + std::to_string(G) +
          " D=" + std::to_string(D) + " q_len=" + std::to_string(QL) + " S=" + std::to_string(S) +
          " page=" + std::to_string(page) + " M=" + std::to_string(max_kv_length) + " num_sms=" + std::to_string(num_sms) +
          " roles=" + std::to_string(role_pick) + " gblock=" + std::to_string(gblock) + " idx_cap=" +
          std::to_string(idx_cap) + " score_block=" + std::to_string(score_block) + " per_token=" +
          std::to_string(per_token) + " fill=" + fz::name(fill) + (boundary ? " chunk=" + std::to_string(chunk) : "") +
          " lengths=";
  for (int l : lengths) *what += std::to_string(l) + ",";
  if (any_sparse) *what += " rows:" + kvsift_test::describe_rows(idx, counts, idx_stride, 600);

  // Host reference.
  const std::size_t n_out = q.size(), n_lse = std::size_t(B) * QL * Hq, n_scores = std::size_t(B) * H * score_stride;
  float poison;
  std::memset(&poison, kvsift_test::kPoisonByte, 4);
  std::vector<QT> out_ref(n_out, kvsift::from_float<QT>(NAN));
  std::vector<float> lse_ref(n_lse, NAN), scores_ref(n_scores, poison);
  {
    std::vector<KT> hk = k, hv = v;
    std::vector<float> hks = ks, hvs = vs;
    const auto p = params_for(q.data(), out_ref.data(), lse_ref.data(), scores_ref.data(), idx.data(), counts.data());
    const auto st = make_view(hk.data(), hv.data(), hks.data(), hvs.data(), table.data(), lengths.data(),
                              [&](const auto& kv) { return kvsift::host::decode_attention(kvsift::host::Exec{}, kv, p); });
    REQUIRE_MESSAGE(st.ok(), st.to_string());
  }

  // CUDA, outputs and workspace poisoned.
  DeviceBuffer<std::int32_t> dlen(lengths), didx(idx.empty() ? std::vector<std::int32_t>{0} : idx),
      dcnt(counts.empty() ? std::vector<std::int32_t>{0} : counts);
  DeviceBuffer<QT> dout(n_out);
  DeviceBuffer<float> dlse(n_lse), dscores(n_scores);
  dout.poison();
  dlse.poison();
  dscores.poison();
  const auto p = params_for(dq.get(), dout.get(), dlse.get(), dscores.get(), didx.get(), dcnt.get());
  std::size_t ws_bytes = 0;
  const auto st = make_view(dk.get(), dv.get(), dks.get(), dvs.get(), dtab.get(), dlen.get(), [&](const auto& kv) {
    KVSIFT_TRY(kvsift::decode_attention_workspace_bytes(exec, kv, p, &ws_bytes));
    DeviceBuffer<unsigned char> ws(ws_bytes);
    ws.poison();
    return kvsift::cuda::decode_attention(exec, kv, p, kvsift::Workspace{ws.get(), ws_bytes});
  });
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  kvsift_test::sync_and_check();

  // The largest |v| (dequantized) of each sequence and KV head bounds the products' error.
  std::vector<double> vmax(std::size_t(B) * H, 0.0);
  make_view(v.data(), v.data(), vs.data(), vs.data(), table.data(), lengths.data(), [&](const auto& kv) {
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < S; ++t) {
          const auto* row = kv.v_row(b, h, t);
          const double s = kvsift::kv_v_scale(kv, b, h, t);
          for (int i = 0; i < D; ++i) vmax[std::size_t(b) * H + h] = std::max(vmax[std::size_t(b) * H + h], std::abs(double(kvsift::to_float(row[i])) * s));
        }
    return kvsift::Status();
  });
  // The score row is the group-mean query of the last position against each key, computed with that
  // query rounded to the KV type (tensor cores): its error scales with sum_i |q_i k_i|, not with the
  // score, which cancellation can make small. The largest such sum of each sequence and KV head.
  std::vector<double> kmag(std::size_t(B) * H, 0.0);
  if (score_block)
    make_view(k.data(), k.data(), ks.data(), ks.data(), table.data(), lengths.data(), [&](const auto& kv) {
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h) {
          std::vector<double> qbar(std::size_t(D), 0.0);
          for (int g = 0; g < G; ++g)
            for (int i = 0; i < D; ++i)
              qbar[std::size_t(i)] += double(kvsift::to_float(q[((std::size_t(b) * QL + (QL - 1)) * Hq + h * G + g) * D + i])) / G;
          for (int t = 0; t < S; ++t) {
            const auto* row = kv.k_row(b, h, t);
            const double sc = kvsift::kv_k_scale(kv, b, h, t);
            double m = 0.0;
            for (int i = 0; i < D; ++i) m += std::abs(qbar[std::size_t(i)] * double(kvsift::to_float(row[i])) * sc);
            kmag[std::size_t(b) * H + h] = std::max(kmag[std::size_t(b) * H + h], m);
          }
        }
      return kvsift::Status();
    });
  const auto out = dout.download();
  const auto lse = dlse.download();
  const auto scores = dscores.download();
  for (std::size_t i = 0; i < n_out; ++i) {
    const std::size_t row = i / D;  // [b, qi, hq]
    const int b = int(row / (QL * Hq)), hq = int(row % Hq);
    const double got = kvsift::to_float(out[i]), want = kvsift::to_float(out_ref[i]);
    REQUIRE_MESSAGE(close(got, want, Tol<KT>::out, vmax[std::size_t(b) * H + hq / G]),
                    "out[b " << b << ", qi " << row / Hq % QL << ", hq " << hq << "][" << i % D << "] = " << got
                             << (std::isnan(got) ? " (the poison)" : "") << ", reference " << want);
  }
  for (std::size_t i = 0; i < n_lse; ++i)
    REQUIRE_MESSAGE(close(lse[i], lse_ref[i], Tol<KT>::lse, 1.0),
                    "lse[" << i << "] = " << lse[i] << ", reference " << lse_ref[i]);
  for (std::size_t i = 0; i < n_scores; ++i) {
    const std::size_t r = i / std::size_t(score_stride);  // b * H + h
    const bool ok = std::isnan(scores_ref[i]) ? std::memcmp(&scores_ref[i], &scores[i], 4) == 0
                                              : close(scores[i], scores_ref[i], Tol<KT>::score, 1.0 + kmag[r]);
    REQUIRE_MESSAGE(ok, "scores[" << i << "] = " << scores[i] << ", reference " << scores_ref[i]);
  }
}

}  // namespace

TEST_CASE("fuzz gpu: decode_attention against the host reference") {
  for (fz::Family f("gpu decode_attention", 0.40, "fuzz gpu: decode_attention against the host reference"); f.next();) {
    auto rng = f.rng();
    std::string what;
    INFO(f.replay());
    INFO(what);
    switch (f.index() % 7) {
      case 0: fuzz_case<float, float>(rng, &what); break;
      case 1:
      case 2: fuzz_case<kvsift::bfloat16_t, kvsift::bfloat16_t>(rng, &what); break;
      case 3: fuzz_case<kvsift::half_t, kvsift::half_t>(rng, &what); break;
      case 4: fuzz_case<kvsift::fp8_e4m3_t, kvsift::bfloat16_t>(rng, &what); break;
      case 5: fuzz_case<kvsift::fp8_e5m2_t, kvsift::half_t>(rng, &what); break;
      default: fuzz_case<kvsift::fp8_e4m3_t, kvsift::half_t>(rng, &what); break;
    }
  }
}
