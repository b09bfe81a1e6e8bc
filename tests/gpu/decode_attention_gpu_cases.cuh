#pragma once
// Shared harness of the decode_attention GPU tests (one .cu per KV dtype keeps each translation
// unit's kernel instantiations few). A case builds random K/V/Q on the host, lays the cache out as
// contiguous BHSD/BSHD or paged NHD/HND with a random page permutation, runs the host reference on
// host memory and the CUDA op on device copies with every output poisoned, and compares.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "kvsift/ops/decode_attention.cuh"
#include "support/device_buffer.cuh"
#include "support/random.hpp"

namespace decode_test {

using kvsift::Granularity;
using kvsift_test::DeviceBuffer;

enum class Layout { kBHSD, kBSHD, kPagedNHD, kPagedHND };
inline const char* name(Layout l) {
  switch (l) {
    case Layout::kBHSD: return "BHSD";
    case Layout::kBSHD: return "BSHD";
    case Layout::kPagedNHD: return "paged NHD";
    case Layout::kPagedHND: return "paged HND";
  }
  return "?";
}

enum class Gather { kNone, kToken, kBlock };

struct Case {
  int batch = 3, hkv = 2, group = 4, d = 128, q_len = 1, cap = 200;
  Layout layout = Layout::kBSHD;
  int page_size = 16;
  std::vector<std::int32_t> lengths;
  kvsift::HeadRoleMask roles;
  Gather gather = Gather::kNone;
  int gather_block = 64;
  int score_block = 0;  // 0: no scores; 1: per token; >= 16: block max
  int num_sms = 0;
  int max_kv_length = 0;  // 0: the view's capacity (a user view must set it)

  std::string describe() const {
    std::string s = std::string(name(layout)) + " d=" + std::to_string(d) + " G=" + std::to_string(group) +
                    " q_len=" + std::to_string(q_len) + " page=" + std::to_string(page_size) +
                    " gather=" + std::to_string(int(gather)) + " score_block=" + std::to_string(score_block) +
                    " num_sms=" + std::to_string(num_sms) + " lengths=";
    for (int l : lengths) s += std::to_string(l) + ",";
    return s;
  }
};

// KV cache storage in one of the layouts, with host and device copies.
template <class KT>
struct Cache {
  int B, H, S, D, page_size = 0, max_pages = 0, num_pages = 0;
  Layout layout;
  std::vector<KT> k, v;
  std::vector<std::int32_t> table;

  Cache(std::mt19937_64& rng, const Case& c) : B(c.batch), H(c.hkv), S(c.cap), D(c.d), layout(c.layout) {
    if (layout == Layout::kPagedNHD || layout == Layout::kPagedHND) {
      page_size = c.page_size;
      max_pages = (S + page_size - 1) / page_size;
      S = max_pages * page_size;
      num_pages = B * max_pages + 3;
      std::vector<std::int32_t> perm(num_pages);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      table.assign(perm.begin(), perm.begin() + std::size_t(B) * max_pages);
      k = kvsift_test::random_values<KT>(rng, std::size_t(num_pages) * page_size * H * D);
    } else {
      k = kvsift_test::random_values<KT>(rng, std::size_t(B) * H * S * D);
    }
    v = kvsift_test::random_values<KT>(rng, k.size());
  }

  kvsift::ContiguousKV<KT> contiguous(KT* kp, KT* vp, const std::int32_t* len) const {
    return layout == Layout::kBHSD ? kvsift::make_bhsd(kp, vp, B, H, S, D, len) : kvsift::make_bshd(kp, vp, B, H, S, D, len);
  }
  kvsift::PagedKV<KT> paged(KT* kp, KT* vp, const std::int32_t* tab, const std::int32_t* len) const {
    return kvsift::make_paged(kp, vp, tab, B, max_pages, num_pages, H, page_size, D,
                              layout == Layout::kPagedNHD ? kvsift::PageLayout::kNHD : kvsift::PageLayout::kHND, len);
  }
};

inline float poison_float() {
  float f;
  std::memset(&f, kvsift_test::kPoisonByte, sizeof f);
  return f;
}

template <class KT>
struct Tolerance {
  static constexpr double out = 2e-2, lse = 2e-2, score = 5e-2;
};
template <>
struct Tolerance<kvsift::half_t> {
  static constexpr double out = 4e-3, lse = 4e-3, score = 1e-2;
};
template <>
struct Tolerance<float> {
  static constexpr double out = 1e-4, lse = 1e-4, score = 1e-3;
};

inline bool close(double got, double want, double tol) {
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::abs(got - want) <= tol * (1.0 + std::abs(want));
}

// Builds the case, runs both backends, compares; `make_view` picks the view type from the cache.
template <class KT, class QT, class MakeView>
void run_case_with(const Case& c, std::mt19937_64& rng, const Cache<KT>& cache, MakeView make_view) {
  INFO(c.describe());
  const int B = c.batch, H = c.hkv, Hq = H * c.group, D = c.d, QL = c.q_len;
  auto q = kvsift_test::random_values<QT>(rng, std::size_t(B) * QL * Hq * D, -2.f, 2.f);
  std::vector<std::int32_t> lengths = c.lengths;
  REQUIRE(int(lengths.size()) == B);

  // Index set: sorted random picks plus an out-of-range entry and a duplicate per row.
  std::vector<std::int32_t> idx, counts;
  int idx_cap = 0, gblock = 1;
  if (c.gather != Gather::kNone) {
    gblock = c.gather == Gather::kBlock ? c.gather_block : 1;
    const int units = (cache.S + gblock - 1) / gblock;
    idx_cap = std::max(2, units / 2 + 2);
    idx.assign(std::size_t(B) * H * idx_cap, -7);
    counts.assign(std::size_t(B) * H, 0);
    for (int r = 0; r < B * H; ++r) {
      const int len = lengths[r / H];
      const int live_units = (len + gblock - 1) / gblock;
      std::vector<std::int32_t> row;
      for (int u = 0; u < live_units; ++u)
        if (kvsift_test::uniform_int(rng, 0, 2) != 0) row.push_back(u);
      if (!row.empty() && int(row.size()) + 2 <= idx_cap) row.push_back(row[row.size() / 2]);  // duplicate
      std::sort(row.begin(), row.end());
      if (int(row.size()) + 1 <= idx_cap) row.push_back(units + 5);  // past the sequence: skipped
      if (r % 3 == 2) row.clear();                                       // an empty row
      row.resize(std::min<std::size_t>(row.size(), idx_cap));
      counts[r] = int(row.size());
      std::copy(row.begin(), row.end(), idx.begin() + std::size_t(r) * idx_cap);
    }
  }

  const int sb = c.score_block ? c.score_block : 1;
  const int score_cols = (cache.S + sb - 1) / sb;
  const std::size_t n_out = q.size(), n_lse = std::size_t(B) * QL * Hq, n_scores = std::size_t(B) * H * (score_cols + 3);

  // Host reference.
  std::vector<QT> out_ref(n_out);
  std::vector<float> lse_ref(n_lse), scores_ref(n_scores, poison_float());
  std::vector<KT> hk = cache.k, hv = cache.v;
  auto params_for = [&](const QT* qp, QT* op, float* lp, float* sp, const std::int32_t* ip, const std::int32_t* cp) {
    auto p = kvsift::make_decode_attention_params(qp, op, QL, Hq, D);
    p.io.lse = lp;
    p.roles = c.roles;
    p.max_kv_length = c.max_kv_length;
    if (c.gather != Gather::kNone) {
      kvsift::ConstIndexSet s;
      s.indices = ip;
      s.counts = cp;
      s.rows = B * H;
      s.capacity = idx_cap;
      s.row_stride = idx_cap;
      s.granularity = c.gather == Gather::kBlock ? Granularity::kBlock : Granularity::kToken;
      s.block_size = gblock;
      p.index_set = s;
    }
    if (c.score_block) {
      p.scores = sp;
      p.score_row_stride = score_cols + 3;
      p.score_block_size = sb;
    }
    return p;
  };
  {
    const auto kv = make_view(hk.data(), hv.data(), cache.table.data(), lengths.data());
    const auto p = params_for(q.data(), out_ref.data(), lse_ref.data(), scores_ref.data(), idx.data(), counts.data());
    const auto st = kvsift::host::decode_attention(kvsift::host::Exec{}, kv, p);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
  }

  // CUDA, outputs poisoned.
  DeviceBuffer<KT> dk(cache.k), dv(cache.v);
  std::vector<std::int32_t> table = cache.table.empty() ? std::vector<std::int32_t>{0} : cache.table;
  std::vector<std::int32_t> idx_h = idx.empty() ? std::vector<std::int32_t>{0} : idx;
  std::vector<std::int32_t> counts_h = counts.empty() ? std::vector<std::int32_t>{0} : counts;
  DeviceBuffer<std::int32_t> dtab(table), dlen(lengths), didx(idx_h), dcnt(counts_h);
  DeviceBuffer<QT> dq(q), dout(n_out);
  DeviceBuffer<float> dlse(n_lse), dscores(n_scores);
  dout.poison();
  dlse.poison();
  dscores.poison();
  const auto kv = make_view(dk.get(), dv.get(), dtab.get(), dlen.get());
  const auto p = params_for(dq.get(), dout.get(), dlse.get(), dscores.get(), didx.get(), dcnt.get());
  // A smaller num_sms than the GPU's stresses other split plans on the same hardware.
  auto exec = kvsift::cuda::Exec::for_current_device();
  if (c.num_sms > 0) exec.device.num_sms = c.num_sms;
  std::size_t ws_bytes = 0;
  REQUIRE(kvsift::decode_attention_workspace_bytes(exec, kv, p, &ws_bytes).ok());
  DeviceBuffer<unsigned char> ws(ws_bytes);
  ws.poison();
  const auto st = kvsift::cuda::decode_attention(exec, kv, p, kvsift::Workspace{ws.get(), ws_bytes});
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  kvsift_test::sync_and_check();

  const auto out = dout.download();
  const auto lse = dlse.download();
  const auto scores = dscores.download();
  int bad = 0;
  for (std::size_t i = 0; i < n_out && bad < 8; ++i) {
    const double got = kvsift::to_float(out[i]), want = kvsift::to_float(out_ref[i]);
    if (!close(got, want, Tolerance<KT>::out)) {
      ++bad;
      FAIL_CHECK("out[" << i << "] = " << got << ", reference " << want);
    }
  }
  for (std::size_t i = 0; i < n_lse && bad < 8; ++i)
    if (!close(lse[i], lse_ref[i], Tolerance<KT>::lse)) {
      ++bad;
      FAIL_CHECK("lse[" << i << "] = " << lse[i] << ", reference " << lse_ref[i]);
    }
  // Scores: where the reference left the poison (sparse heads, row padding) the kernel must too.
  for (std::size_t i = 0; i < n_scores && bad < 8; ++i) {
    const bool ok = std::isnan(scores_ref[i]) ? std::memcmp(&scores_ref[i], &scores[i], 4) == 0
                                              : close(scores[i], scores_ref[i], Tolerance<KT>::score);
    if (!ok) {
      ++bad;
      FAIL_CHECK("scores[" << i << "] = " << scores[i] << ", reference " << scores_ref[i]);
    }
  }
  CHECK(bad == 0);
}

template <class KT, class QT>
void run_case(const Case& c, std::mt19937_64& rng) {
  const Cache<KT> cache(rng, c);
  if (c.layout == Layout::kBHSD || c.layout == Layout::kBSHD)
    run_case_with<KT, QT>(c, rng, cache, [&](KT* k, KT* v, const std::int32_t*, const std::int32_t* len) {
      return cache.contiguous(k, v, len);
    });
  else
    run_case_with<KT, QT>(c, rng, cache, [&](KT* k, KT* v, const std::int32_t* tab, const std::int32_t* len) {
      return cache.paged(k, v, tab, len);
    });
}

// The matrix every KV dtype runs: head_dim x group x layout x lengths x roles x q_len x scores.
template <class KT, class QT>
void run_matrix(std::uint64_t salt) {
  auto rng = kvsift_test::make_rng(salt);
  const Layout layouts[] = {Layout::kBHSD, Layout::kBSHD, Layout::kPagedNHD, Layout::kPagedHND};
  int n = 0;
  for (int d : {64, 128, 256})
    for (int group : {1, 4, 8})
      for (int variant = 0; variant < 3; ++variant, ++n) {
        Case c;
        c.d = d;
        c.group = group;
        c.layout = layouts[n % 4];
        c.page_size = (n / 4) % 2 ? 64 : 16;
        c.num_sms = variant == 0 ? 132 : variant == 1 ? 3 : 1;
        c.batch = 4;
        c.cap = 130;
        c.lengths = std::vector<std::int32_t>{1, 63, 64, 65};
        std::shuffle(c.lengths.begin(), c.lengths.end(), rng);
        if (variant == 0) {  // dense, per-token scores, long enough for several splits
          c.cap = 700;
          c.lengths = std::vector<std::int32_t>{700, 0, 333, 65};
          c.score_block = 1;
        } else if (variant == 1) {  // mixed roles, token gather, causal q_len 8, block-max scores
          c.q_len = 8;
          c.lengths = std::vector<std::int32_t>{8, 63, 64, 65};
          c.roles.set_sparse(1, true);
          c.gather = Gather::kToken;
          c.score_block = 16;
        } else {  // every head gathered in blocks
          c.roles = kvsift::HeadRoleMask::all_sparse(c.hkv);
          c.gather = Gather::kBlock;
          c.gather_block = (n % 2) ? 16 : 64;
          c.lengths = std::vector<std::int32_t>{130, 63, 64, 1};
        }
        run_case<KT, QT>(c, rng);
      }
}

}  // namespace decode_test
