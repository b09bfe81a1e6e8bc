#pragma once
// Shared harness of the decode_attention GPU tests (one .cu per KV dtype keeps each translation
// unit's kernel instantiations few). A case builds random K/V/Q on the host, lays the cache out as
// contiguous BHSD/BSHD or paged NHD/HND with a random page permutation, runs the host reference on
// host memory and the CUDA op on device copies with every output poisoned, and compares; then replays
// the same call from a captured CUDA graph and requires bit-identical outputs. Index rows of
// gathered and mixed cases come from the adversarial mix of support/index_rows.hpp (issue 14).

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "kvsift/ops/decode_attention.cuh"
#include "support/device_buffer.cuh"
#include "support/index_rows.hpp"
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
  // Index rows. idx_cap 0: units / 2 + 2 (units: index entries the view spans); idx_slack: row_stride
  // - capacity (slots a kernel must never read). `idx`/`counts` empty: rows drawn from the adversarial
  // mix of support/index_rows.hpp; else explicit rows [batch * hkv][idx_cap + idx_slack] and raw counts.
  int idx_cap = 0, idx_slack = 0;
  std::vector<std::int32_t> idx, counts;
  // Split-boundary case: lengths (and sparse counts) are built from the plan's chunk for this very
  // call (chunk - 1, chunk, chunk + 1, 2 chunk + 1, ...), rotated by boundary_shift; `lengths` unused.
  bool boundary = false;
  int boundary_shift = 0;
  bool graph = true;  // also replay the call from a captured CUDA graph: must be bit-identical
  std::string label;

  std::string describe() const {
    std::string s = label + (label.empty() ? "" : ": ") + std::string(name(layout)) + " B=" + std::to_string(batch) +
                    " Hkv=" + std::to_string(hkv) + " d=" + std::to_string(d) + " G=" + std::to_string(group) +
                    " q_len=" + std::to_string(q_len) + " cap=" + std::to_string(cap) +
                    " page=" + std::to_string(page_size) + " gather=" + std::to_string(int(gather)) +
                    " block=" + std::to_string(gather_block) + " score_block=" + std::to_string(score_block) +
                    " num_sms=" + std::to_string(num_sms) + " max_kv_length=" + std::to_string(max_kv_length) +
                    " sparse=";
    for (int h = 0; h < hkv; ++h) s += roles.is_sparse(h) ? "1" : "0";
    s += " lengths=";
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

// Tolerances follow the arithmetic: fp32 K/V run the softmax and both products in fp32 (the
// reference in fp64), 16-bit K/V round P to 16 bits for the P.V product and the output to 16 bits.
template <class KT>
struct Tolerance {
  static constexpr double out = 1e-2, lse = 1e-2, score = 5e-2;
};
template <>
struct Tolerance<kvsift::half_t> {
  static constexpr double out = 4e-3, lse = 4e-3, score = 1e-2;
};
template <>
struct Tolerance<float> {
  static constexpr double out = 1e-5, lse = 1e-5, score = 1e-5;
};

inline bool close(double got, double want, double tol) {
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::abs(got - want) <= tol * (1.0 + std::abs(want));  // false for NaN (the poison)
}

// Cases whose rows hold an in-range key past the first min(capacity * block, max_len) listed
// positions: what the split plan before 9b81d59 dropped. Counted so a run shows the bug class is hit.
struct Coverage {
  int cases = 0, cases_with_cut_rows = 0, rows = 0, cut_rows = 0;
  int clustered = 0;        // cases whose splits merged in clusters (DecodePlan::cluster)
  int clustered_alike = 0;  // of those, cases compared bit for bit with the merge kernel on the same splits
  int most_splits = 0;      // the most splits one head of a case had (DecodePlan::retrieval_splits / sparse_splits)
  int most_merge_parts = 0; // the most merge threads per output float4 (DecodePlan::merge_parts)
  int backfilled = 0;       // cases whose grid backfilled its wave (DecodePlan::backfill)
};
inline Coverage& coverage() {
  static Coverage c;
  return c;
}
inline void report_coverage(const std::string& what) {
  const Coverage& c = coverage();
  MESSAGE(what << ": " << c.cases << " cases, " << c.cases_with_cut_rows << " with index rows the old split plan cut ("
                << c.cut_rows << " of " << c.rows << " sparse rows), " << c.clustered << " merged in clusters (" << c.clustered_alike
                << " of them bit for bit against the merge kernel on the same splits)");
}

// Builds the case, runs both backends, compares; `make_view` picks the view type from the cache.
template <class KT, class QT, class MakeView>
void run_case_with(Case c, std::mt19937_64& rng, const Cache<KT>& cache, MakeView make_view) {
  const int B = c.batch, H = c.hkv, Hq = H * c.group, D = c.d, QL = c.q_len;
  auto q = kvsift_test::random_values<QT>(rng, std::size_t(B) * QL * Hq * D, -2.f, 2.f);
  const bool gathered = c.gather != Gather::kNone;
  const int gblock = c.gather == Gather::kBlock ? c.gather_block : 1;
  const int units = (cache.S + gblock - 1) / gblock;
  int idx_cap = 0;
  if (gathered) idx_cap = c.idx_cap ? c.idx_cap : c.boundary ? units + 2 : std::max(2, units / 2 + 2);
  const int stride = idx_cap + c.idx_slack;
  const int M = c.max_kv_length > 0 ? c.max_kv_length : cache.S;  // the lengths this call covers
  const int sb = c.score_block ? c.score_block : 1;
  const int score_cols = (std::max(cache.S, M) + sb - 1) / sb;

  // A smaller num_sms than the GPU's stresses other split plans on the same hardware.
  auto exec = kvsift::cuda::Exec::for_current_device();
  if (c.num_sms > 0) exec.device.num_sms = c.num_sms;

  DeviceBuffer<KT> dk(cache.k), dv(cache.v);
  std::vector<std::int32_t> table = cache.table.empty() ? std::vector<std::int32_t>{0} : cache.table;
  DeviceBuffer<std::int32_t> dtab(table);
  DeviceBuffer<QT> dq(q);
  auto params_for = [&](const QT* qp, QT* op, float* lp, float* sp, const std::int32_t* ip, const std::int32_t* cp) {
    auto p = kvsift::make_decode_attention_params(qp, op, QL, Hq, D);
    p.io.lse = lp;
    p.roles = c.roles;
    p.max_kv_length = c.max_kv_length;
    if (gathered) {
      kvsift::ConstIndexSet s;
      s.indices = ip;
      s.counts = cp;
      s.rows = B * H;
      s.capacity = idx_cap;
      s.row_stride = stride;
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

  // Split-boundary lengths from the plan the launch will make (same view, params and DeviceFacts);
  // when the GPU's SM count gives a chunk too long for the cache, more "SMs" shorten it.
  std::vector<std::int32_t> force_counts;
  if (c.boundary) {
    c.lengths.assign(std::size_t(B), 0);
    DeviceBuffer<std::int32_t> dzero(std::vector<std::int32_t>(std::size_t(B) * H + 1, 0));
    kvsift::detail::DecodePlan plan;
    for (int attempt = 0; attempt < 10; ++attempt) {
      const auto kv = make_view(dk.get(), dv.get(), dtab.get(), dzero.get());
      const auto p = params_for(dq.get(), reinterpret_cast<QT*>(dq.get()), nullptr, reinterpret_cast<float*>(dzero.get()),
                                dzero.get(), dzero.get());
      const auto st = kvsift::detail::plan_decode_attention(exec.device, kv, p, &plan);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
      // The lengths probe the retrieval heads' splits; with none, the sparse heads' (whose chunk
      // is then the only one the kernel uses).
      if (2 * (plan.num_retrieval > 0 ? plan.chunk : plan.sparse_chunk) + 1 <= std::min(cache.S, M)) break;
      exec.device.num_sms *= 2;
    }
    const int ch = plan.num_retrieval > 0 ? plan.chunk : plan.sparse_chunk;
    INFO(c.describe());
    REQUIRE_MESSAGE(2 * ch + 1 <= std::min(cache.S, M), "chunk " << ch << " too long for the case");
    c.num_sms = exec.device.num_sms;
    const std::int32_t pattern[] = {ch - 1, ch, ch + 1, 2 * ch + 1, 2 * ch, QL, 0, cache.S};
    for (int b = 0; b < B; ++b) c.lengths[std::size_t(b)] = pattern[(b + c.boundary_shift) % 8];
    const int cu = plan.sparse_chunk / gblock;  // entries per split of a sparse head
    const int cpat[] = {cu - 1, cu, cu + 1, 2 * cu + 1, 0, idx_cap};
    for (int r = 0; r < B * H; ++r) force_counts.push_back(std::max(0, cpat[(r + c.boundary_shift) % 6]));
    c.label += " chunk=" + std::to_string(ch);
  }
  std::vector<std::int32_t> lengths = c.lengths;
  REQUIRE(int(lengths.size()) == B);
  auto visible = [&](int b) { return std::min(std::max(lengths[std::size_t(b)], 0), std::min(cache.S, M)); };

  // Index set: explicit rows, or the adversarial mix (sorted-distinct rows among unsorted ones,
  // duplicates, entries outside the sequence, counts outside [0, capacity], decoys past the count).
  std::vector<std::int32_t> idx, counts;
  if (gathered) {
    if (!c.idx.empty()) {
      idx = c.idx;
      counts = c.counts;
    } else {
      for (int r = 0; r < B * H; ++r) {
        const int f = c.boundary ? force_counts[std::size_t(r)] : -1;
        const auto row = kvsift_test::make_index_row(rng, kvsift_test::draw_row_kind(rng), visible(r / H), cache.S,
                                                     gblock, idx_cap, stride, f);
        idx.insert(idx.end(), row.slots.begin(), row.slots.end());
        counts.push_back(row.count);
      }
    }
    REQUIRE(idx.size() == std::size_t(B) * H * stride);
    REQUIRE(counts.size() == std::size_t(B) * H);
  }
  // Coverage: rows holding a visible key past what the pre-fix plan covered.
  {
    auto& cov = coverage();
    ++cov.cases;
    bool cut = false;
    const int old_cover = int((std::min<long long>((long long)idx_cap * gblock, M) + gblock - 1) / gblock);  // entries read
    for (int r = 0; gathered && r < B * H; ++r) {
      if (!c.roles.is_sparse(r % H)) continue;
      ++cov.rows;
      const int n = std::min(std::max(counts[std::size_t(r)], 0), idx_cap), len = visible(r / H);
      bool row_cut = false;
      for (int e = old_cover; e < n && !row_cut; ++e) {
        const long long first = (long long)idx[std::size_t(r) * stride + e] * gblock;
        row_cut = first + gblock > 0 && first < len;
      }
      cov.cut_rows += row_cut;
      cut = cut || row_cut;
    }
    cov.cases_with_cut_rows += cut;
  }
  INFO(c.describe());
  INFO("index rows:" << (gathered ? kvsift_test::describe_rows(idx, counts, stride) : std::string(" none")));

  const std::size_t n_out = q.size(), n_lse = std::size_t(B) * QL * Hq, n_scores = std::size_t(B) * H * (score_cols + 3);

  // The device cache's rows past each sequence's visible length hold NaN (the host reference keeps
  // the random values and never reads them): a kernel that copies such a row and weighs it by zero
  // (a masked position, the early stage's rows past a split's end) must zero it first, or the NaN
  // reaches the output.
  {
    std::vector<KT> pk = cache.k, pv = cache.v;
    const KT nan = kvsift::from_float<KT>(NAN);
    const auto kv = make_view(pk.data(), pv.data(), cache.table.data(), lengths.data());  // the view's own addressing
    for (int b = 0; b < B; ++b)
      for (int t = visible(b); t < cache.S; ++t)
        for (int h = 0; h < H; ++h) {
          std::fill_n(kv.k_row(b, h, t), D, nan);
          std::fill_n(kv.v_row(b, h, t), D, nan);
        }
    dk.upload(pk);
    dv.upload(pv);
  }

  // Host reference.
  std::vector<QT> out_ref(n_out, kvsift::from_float<QT>(NAN));
  std::vector<float> lse_ref(n_lse, NAN), scores_ref(n_scores, poison_float());
  {
    std::vector<KT> hk = cache.k, hv = cache.v;
    const auto kv = make_view(hk.data(), hv.data(), cache.table.data(), lengths.data());
    const auto p = params_for(q.data(), out_ref.data(), lse_ref.data(), scores_ref.data(), idx.data(), counts.data());
    const auto st = kvsift::host::decode_attention(kvsift::host::Exec{}, kv, p);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
  }
  for (std::size_t i = 0; i < n_out; ++i) REQUIRE(!std::isnan(kvsift::to_float(out_ref[i])));
  for (std::size_t i = 0; i < n_lse; ++i) REQUIRE(!std::isnan(lse_ref[i]));

  // CUDA, outputs and workspace poisoned.
  std::vector<std::int32_t> idx_h = idx.empty() ? std::vector<std::int32_t>{0} : idx;
  std::vector<std::int32_t> counts_h = counts.empty() ? std::vector<std::int32_t>{0} : counts;
  DeviceBuffer<std::int32_t> dlen(lengths), didx(idx_h), dcnt(counts_h);
  DeviceBuffer<QT> dout(n_out);
  DeviceBuffer<float> dlse(n_lse), dscores(n_scores);
  const auto kv = make_view(dk.get(), dv.get(), dtab.get(), dlen.get());
  auto p = params_for(dq.get(), dout.get(), dlse.get(), dscores.get(), didx.get(), dcnt.get());
  // Per-token scores also list score candidates (ops/score_candidates.hpp): each row's threshold is
  // one of its reference scores (or NaN, or -inf: nothing listed), the lists poisoned; checked below
  // against the scores the pass wrote.
  const int cand_stride = kvsift::decode_candidate_count_stride(M);
  std::vector<float> cand_thresholds(std::size_t(B) * H, NAN);
  if (c.score_block == 1)
    for (int r = 0; r < B * H; ++r) {
      const int len = visible(r / H), pick = kvsift_test::uniform_int(rng, 0, 9);
      if (len > 0 && pick < 8) cand_thresholds[r] = scores_ref[std::size_t(r) * (score_cols + 3) + kvsift_test::uniform_int(rng, 0, len - 1)];
      if (pick == 9) cand_thresholds[r] = -INFINITY;
    }
  DeviceBuffer<float> dcand_thresholds(cand_thresholds);
  // One row more than the rows: a guard that must keep its poison (a count written past a row's
  // segments lands in the next row, or past the last one here).
  DeviceBuffer<std::int32_t> dcand_counts(std::size_t(B) * H * cand_stride + cand_stride), dcand_positions(n_scores);
  if (c.score_block == 1) {
    p.candidates.thresholds = dcand_thresholds.get();
    p.candidates.counts = dcand_counts.get();
    p.candidates.positions = dcand_positions.get();
    p.candidates.count_stride = cand_stride;
  }
  std::size_t ws_bytes = 0;
  REQUIRE(kvsift::decode_attention_workspace_bytes(exec, kv, p, &ws_bytes).ok());
  DeviceBuffer<unsigned char> ws(ws_bytes);
  auto poison_all = [&] {
    dout.poison();
    dlse.poison();
    dscores.poison();
    dcand_counts.poison();
    dcand_positions.poison();
    ws.poison();
    kvsift_test::sync_and_check();
  };
  poison_all();
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
      const std::size_t row = i / D;  // [b, qi, hq]
      FAIL_CHECK("out[b " << row / (QL * Hq) << ", qi " << row / Hq % QL << ", hq " << row % Hq << "][" << i % D
                          << "] = " << got << (std::isnan(got) ? " (still the poison)" : "") << ", reference " << want);
    }
  }
  for (std::size_t i = 0; i < n_lse && bad < 8; ++i)
    if (!close(lse[i], lse_ref[i], Tolerance<KT>::lse)) {
      ++bad;
      FAIL_CHECK("lse[b " << i / (QL * Hq) << ", qi " << i / Hq % QL << ", hq " << i % Hq << "] = " << lse[i]
                          << (std::isnan(lse[i]) ? " (still the poison)" : "") << ", reference " << lse_ref[i]);
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
  if (c.score_block == 1) {  // the lists: exactly the positions t < len whose written score reaches the threshold
    const auto counts_got = dcand_counts.download();
    const auto positions_got = dcand_positions.download();
    // A sparse head's counts row and the guard row are never written.
    std::int32_t poison;
    std::memset(&poison, kvsift_test::kPoisonByte, sizeof poison);
    for (int r = 0; r <= B * H; ++r) {
      if (r < B * H && !c.roles.is_sparse(r % H)) continue;
      const std::int32_t* row = counts_got.data() + std::size_t(r) * cand_stride;
      const int i = int(std::find_if(row, row + cand_stride, [&](std::int32_t x) { return x != poison; }) - row);
      REQUIRE_MESSAGE(i == cand_stride, "counts row " << r << (r == B * H ? " (the guard)" : " (a sparse head)")
                                                      << ": entry " << i << " was written");
    }
    for (int r = 0; r < B * H && bad < 8; ++r) {
      if (c.roles.is_sparse(r % H)) continue;
      INFO("candidates of row " << r << ", threshold " << cand_thresholds[std::size_t(r)]);
      const std::int32_t* h = counts_got.data() + std::size_t(r) * cand_stride;
      REQUIRE(std::uint32_t(h[0]) == kvsift::kScoreCandidateTagLo);
      REQUIRE(std::uint32_t(h[1]) == kvsift::kScoreCandidateTagHi);
      const int seg = h[2], segs = h[3], len = visible(r / H);
      REQUIRE(seg >= 64);
      REQUIRE(segs * seg >= M);
      const float t = cand_thresholds[std::size_t(r)];
      std::vector<char> listed(std::size_t(score_cols), 0);
      for (int j = 0; j < segs; ++j) {
        const int n = h[kvsift::kScoreCandidateHeader + j];
        REQUIRE(n >= 0);
        REQUIRE(n <= seg);
        for (int i = 0; i < n; ++i) {
          const int pos = positions_got[std::size_t(r) * (score_cols + 3) + std::size_t(j) * seg + i];
          REQUIRE(pos >= j * seg);
          REQUIRE(pos < std::min((j + 1) * seg, len));
          REQUIRE(!listed[std::size_t(pos)]);
          listed[std::size_t(pos)] = 1;
        }
      }
      for (int pos = 0; pos < len; ++pos) {
        const float sc = scores[std::size_t(r) * (score_cols + 3) + pos];
        const bool want = t > -INFINITY && sc >= t;
        if (bool(listed[std::size_t(pos)]) != want) {
          ++bad;
          FAIL_CHECK("position " << pos << " (score " << sc << ") listed " << int(listed[std::size_t(pos)]));
        }
      }
    }
  }

  // Another run of the same call (its outputs downloaded after it): bit-identical to the direct launch.
  auto same_as_direct = [&](const char* what) {
    kvsift_test::sync_and_check();
    const auto again_out = dout.download();
    const auto again_lse = dlse.download();
    const auto again_scores = dscores.download();
    CHECK_MESSAGE(std::memcmp(again_out.data(), out.data(), n_out * sizeof(QT)) == 0, what << ": out differs");
    CHECK_MESSAGE(std::memcmp(again_lse.data(), lse.data(), n_lse * sizeof(float)) == 0, what << ": lse differs");
    CHECK_MESSAGE(std::memcmp(again_scores.data(), scores.data(), n_scores * sizeof(float)) == 0, what << ": scores differ");
  };

  // The same call captured in a CUDA graph and replayed (outputs and workspace poisoned again):
  // bit-identical to the direct launch.
  if (c.graph) {
    cudaStream_t stream;
    KVSIFT_TEST_CUDA(cudaStreamCreate(&stream));
    cudaGraph_t graph;
    KVSIFT_TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const auto gst = kvsift::cuda::decode_attention(exec.on(stream), kv, p, kvsift::Workspace{ws.get(), ws_bytes});
    KVSIFT_TEST_CUDA(cudaStreamEndCapture(stream, &graph));
    REQUIRE_MESSAGE(gst.ok(), gst.to_string());
    cudaGraphExec_t gexec;
    KVSIFT_TEST_CUDA(cudaGraphInstantiate(&gexec, graph, 0));
    poison_all();
    KVSIFT_TEST_CUDA(cudaGraphLaunch(gexec, stream));
    KVSIFT_TEST_CUDA(cudaStreamSynchronize(stream));
    same_as_direct("graph replay");
    cudaGraphExecDestroy(gexec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }

  // A call whose splits merge in clusters, again without clusters (the merge kernel, the partials in
  // the workspace): where that plan cuts the heads alike, the same arithmetic in the same order, so
  // bit-identical. (Where the cluster plan grew the chunks, or gave one role empty splits, the
  // splits differ and only the reference comparison above applies.)
  kvsift::detail::DecodePlan plan;
  REQUIRE(kvsift::detail::plan_decode_attention(exec.device, kv, p, &plan).ok());
  if (plan.cluster > 1) ++coverage().clustered;
  if (plan.backfill) ++coverage().backfilled;
  coverage().most_splits = std::max({coverage().most_splits, plan.num_retrieval > 0 ? plan.retrieval_splits : 0,
                                     plan.num_sparse > 0 ? plan.sparse_splits : 0});
  if (plan.merge_kernel()) coverage().most_merge_parts = std::max(coverage().most_merge_parts, plan.merge_parts);
  auto unclustered = exec;
  unclustered.device.clusters = false;
  kvsift::detail::DecodePlan flat;
  REQUIRE(kvsift::detail::plan_decode_attention(unclustered.device, kv, p, &flat).ok());
  REQUIRE(flat.cluster == 0);
  if (plan.cluster > 1 && flat.chunk == plan.chunk && flat.sparse_chunk == plan.sparse_chunk &&
      flat.ctas_per_tile == plan.ctas_per_tile) {
    ++coverage().clustered_alike;
    std::size_t flat_bytes = 0;
    REQUIRE(kvsift::decode_attention_workspace_bytes(unclustered, kv, p, &flat_bytes).ok());
    DeviceBuffer<unsigned char> flat_ws(std::max<std::size_t>(flat_bytes, 1));
    poison_all();
    flat_ws.poison();
    const auto fst = kvsift::cuda::decode_attention(unclustered, kv, p, kvsift::Workspace{flat_ws.get(), flat_bytes});
    REQUIRE_MESSAGE(fst.ok(), fst.to_string());
    same_as_direct("the merge kernel on the cluster's splits");
  }
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

// The matrix every KV dtype runs: head_dim x group x layout x lengths x roles x q_len x scores; the
// gathered and mixed variants draw adversarial index rows, and some cap the lengths by max_kv_length.
template <class KT, class QT>
void run_matrix(std::uint64_t salt) {
  coverage() = Coverage();
  auto rng = kvsift_test::make_rng(salt);
  const Layout layouts[] = {Layout::kBHSD, Layout::kBSHD, Layout::kPagedNHD, Layout::kPagedHND};
  int n = 0;
  for (int d : {64, 128, 256})
    for (int group : {1, 4, 8})
      for (int variant = 0; variant < 3; ++variant, ++n) {
        Case c;
        c.label = "matrix " + std::to_string(n);
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
          if (n % 2) c.max_kv_length = 500;  // below the longest length
        } else if (variant == 1) {  // mixed roles, token gather, causal q_len 8, block-max scores
          c.q_len = 8;
          c.lengths = std::vector<std::int32_t>{8, 63, 64, 65};
          c.roles.set_sparse(1, true);
          c.gather = Gather::kToken;
          c.score_block = 16;
          if (n % 2) c.max_kv_length = 40;
          c.idx_slack = n % 3 == 1 ? 3 : 0;
        } else {  // every head gathered in blocks
          c.roles = kvsift::HeadRoleMask::all_sparse(c.hkv);
          c.gather = Gather::kBlock;
          c.gather_block = (n % 2) ? 16 : 64;
          c.lengths = std::vector<std::int32_t>{130, 63, 64, 1};
          if (n % 3 == 2) c.max_kv_length = 50;
          if (n % 4 == 0) c.idx_cap = (c.cap + c.gather_block - 1) / c.gather_block * 2 + 1;  // room for duplicates
        }
        run_case<KT, QT>(c, rng);
      }
  report_coverage("matrix");
}

// Randomized shapes with adversarial index rows, in the spirit of the independent check that found
// issue 14's defect: every view, head_dim, group, q_len 1-4, mixed or all-sparse roles with token or
// block gather, counts and entries outside range, max_kv_length below the lengths, lengths outside
// [0, capacity], several split plans.
template <class KT, class QT>
void run_random(std::uint64_t salt, int cases) {
  using kvsift_test::uniform_int;
  coverage() = Coverage();
  auto rng = kvsift_test::make_rng(salt);
  const Layout layouts[] = {Layout::kBHSD, Layout::kBSHD, Layout::kPagedNHD, Layout::kPagedHND};
  const int dims[] = {64, 128, 256}, groups[] = {1, 2, 4, 8}, pages[] = {16, 32, 64}, blocks[] = {16, 32, 64, 128};
  const int sms[] = {0, 1, 3, 7, 132, 1000}, score_blocks[] = {0, 0, 1, 16, 64};
  for (int i = 0; i < cases; ++i) {
    Case c;
    c.label = "random " + std::to_string(i);
    c.d = dims[uniform_int(rng, 0, 2)];
    c.hkv = uniform_int(rng, 1, 4);
    c.group = groups[uniform_int(rng, 0, 3)];
    c.batch = uniform_int(rng, 1, 5);
    c.q_len = uniform_int(rng, 0, 2) ? 1 : uniform_int(rng, 2, 4);
    c.layout = layouts[uniform_int(rng, 0, 3)];
    c.page_size = pages[uniform_int(rng, 0, 2)];
    c.cap = uniform_int(rng, 4, 320);
    const bool paged = c.layout == Layout::kPagedNHD || c.layout == Layout::kPagedHND;
    const int S = paged ? (c.cap + c.page_size - 1) / c.page_size * c.page_size : c.cap;
    for (int h = 0; h < c.hkv; ++h) c.roles.set_sparse(h, uniform_int(rng, 0, 4) < 3);
    if (c.roles.count_sparse(c.hkv) == 0 && uniform_int(rng, 0, 4)) c.roles.set_sparse(uniform_int(rng, 0, c.hkv - 1), true);
    if (c.roles.count_sparse(c.hkv) > 0) {
      c.gather = uniform_int(rng, 0, 1) ? Gather::kToken : Gather::kBlock;
      c.gather_block = blocks[uniform_int(rng, 0, 3)];  // 64 and 128: whole stages of one block (block runs)
      const int block = c.gather == Gather::kBlock ? c.gather_block : 1;
      const int units = (S + block - 1) / block;
      c.idx_cap = uniform_int(rng, 0, 2) ? uniform_int(rng, 1, 2 * units + 3) : 0;
      c.idx_slack = uniform_int(rng, 0, 2) ? 0 : 3;
    }
    c.score_block = score_blocks[uniform_int(rng, 0, 4)];
    c.num_sms = sms[uniform_int(rng, 0, 5)];
    const int pick = uniform_int(rng, 0, 5);
    c.max_kv_length = pick < 3 ? 0 : pick < 5 ? uniform_int(rng, c.q_len, S) : S + uniform_int(rng, 1, 40);
    const int M = c.max_kv_length > 0 ? c.max_kv_length : S;
    for (int b = 0; b < c.batch; ++b) {
      const int lp = uniform_int(rng, 0, 9);
      int len = lp == 0 ? 0 : lp == 1 ? -uniform_int(rng, 1, 3) : lp == 2 ? S + uniform_int(rng, 1, 9) : uniform_int(rng, 1, S);
      const int vis = std::min(std::max(len, 0), std::min(S, M));
      if (vis > 0 && vis < c.q_len) len = c.q_len;  // q_len fits every non-empty sequence
      c.lengths.push_back(len);
    }
    run_case<KT, QT>(c, rng);
  }
  report_coverage("random");
}

// Shapes at the split boundaries: lengths chunk - 1, chunk, chunk + 1, 2 chunk + 1 (chunk from the
// launch's own plan), batch 1 to 256, q_len 1-4, groups 1-8, every head_dim, with and without scores,
// dense, mixed and all-sparse; each also replayed from a CUDA graph.
template <class KT, class QT>
void run_boundary(std::uint64_t salt) {
  coverage() = Coverage();
  auto rng = kvsift_test::make_rng(salt);
  enum Roles { kDense, kMixedToken, kSparseBlock64, kMixedBlock16, kSparseToken };
  struct Row {
    int batch, hkv, group, d, q_len, score_block;
    Roles roles;
    Layout layout;
    int page, cap, max_kv_length;
  };
  const Row rows[] = {
      {1, 2, 1, 64, 1, 0, kDense, Layout::kBHSD, 16, 512, 0},
      {1, 2, 8, 128, 4, 1, kMixedToken, Layout::kBSHD, 16, 512, 0},
      {1, 2, 2, 128, 1, 64, kDense, Layout::kBSHD, 16, 1000, 600},
      {2, 2, 2, 256, 2, 64, kDense, Layout::kPagedNHD, 16, 512, 0},
      {2, 4, 4, 64, 3, 1, kSparseBlock64, Layout::kPagedHND, 64, 512, 0},
      {2, 8, 1, 128, 1, 0, kSparseToken, Layout::kBSHD, 16, 600, 0},
      {7, 2, 4, 128, 1, 64, kMixedBlock16, Layout::kBSHD, 16, 400, 0},
      {7, 1, 8, 64, 2, 0, kDense, Layout::kPagedNHD, 64, 400, 0},
      {7, 2, 1, 256, 4, 1, kMixedToken, Layout::kBHSD, 16, 400, 0},
      {7, 2, 8, 64, 4, 16, kMixedToken, Layout::kPagedNHD, 64, 300, 0},
      {64, 2, 2, 64, 1, 1, kDense, Layout::kBSHD, 16, 192, 0},
      {64, 2, 4, 128, 2, 0, kMixedToken, Layout::kPagedHND, 16, 192, 0},
      {64, 1, 1, 256, 3, 64, kDense, Layout::kBHSD, 16, 192, 0},
      {256, 2, 2, 64, 1, 0, kSparseBlock64, Layout::kBSHD, 16, 160, 0},
      {256, 1, 8, 128, 1, 1, kDense, Layout::kPagedNHD, 16, 160, 0},
      {256, 2, 1, 64, 4, 64, kMixedToken, Layout::kBHSD, 16, 160, 0},
  };
  int n = 0;
  for (const Row& r : rows) {
    Case c;
    c.label = "boundary " + std::to_string(n);
    c.batch = r.batch;
    c.hkv = r.hkv;
    c.group = r.group;
    c.d = r.d;
    c.q_len = r.q_len;
    c.score_block = r.score_block;
    c.layout = r.layout;
    c.page_size = r.page;
    c.cap = r.cap;
    c.max_kv_length = r.max_kv_length;
    c.boundary = true;
    c.boundary_shift = n++;
    switch (r.roles) {
      case kDense: break;
      case kMixedToken: c.roles.set_sparse(r.hkv - 1, true); c.gather = Gather::kToken; break;
      case kSparseBlock64: c.roles = kvsift::HeadRoleMask::all_sparse(r.hkv); c.gather = Gather::kBlock; c.gather_block = 64; break;
      case kMixedBlock16: c.roles.set_sparse(0, true); c.gather = Gather::kBlock; c.gather_block = 16; break;
      case kSparseToken: c.roles = kvsift::HeadRoleMask::all_sparse(r.hkv); c.gather = Gather::kToken; break;
    }
    run_case<KT, QT>(c, rng);
  }
  report_coverage("split boundaries");
}

// Heads cut into as many splits as the plan allows (kDecodeMaxSplits): a long retrieval head beside
// seven token-gathered ones, as in a LycheeDecode layer with one retrieval head, and a lone dense head
// with a partial last split, as on a tensor-parallel rank with one KV head. The merge kernel then gives
// each output float4 more threads than smaller calls do (kDecodeMaxSplits / kDecodeMergeBatch: 8 at
// 128 splits); many "SMs" let the short sequences reach the cap.
template <class KT, class QT>
void run_many_splits(std::uint64_t salt) {
  namespace d = kvsift::detail;
  coverage() = Coverage();
  auto rng = kvsift_test::make_rng(salt);
  Case mixed;
  mixed.label = "many splits, mixed";
  mixed.batch = 1;
  mixed.hkv = 8;
  mixed.cap = 64 * d::kDecodeMaxSplits;
  mixed.lengths = {mixed.cap};
  mixed.roles = kvsift::HeadRoleMask::all_sparse(8);
  mixed.roles.set_sparse(3, false);
  mixed.gather = Gather::kToken;
  mixed.idx_cap = 4096;
  mixed.score_block = 1;
  mixed.num_sms = 1000;
  run_case<KT, QT>(mixed, rng);
  CHECK(coverage().most_splits == d::kDecodeMaxSplits);
  Case lone;
  lone.label = "many splits, one dense head";
  lone.batch = 2;
  lone.hkv = 1;
  lone.group = 8;
  lone.d = 64;
  lone.layout = Layout::kPagedNHD;
  lone.page_size = 64;
  lone.cap = 64 * d::kDecodeMaxSplits * 5 / 4;  // past the cap: chunks of 128, the last one partial
  lone.lengths = {lone.cap - 37, lone.cap / 3};
  lone.score_block = 64;
  lone.num_sms = 1000;
  run_case<KT, QT>(lone, rng);
  const int splits = coverage().most_splits;
  CHECK(splits > d::kDecodeMaxSplits / 2);
  CHECK(coverage().most_merge_parts * d::kDecodeMergeBatch >= splits);
  CHECK(coverage().most_merge_parts >= (d::kDecodeMaxSplits + d::kDecodeMergeBatch - 1) / d::kDecodeMergeBatch);
}

// Score candidates in a cluster plan: every head of a cluster plan gets the larger role's split count,
// so a short retrieval head beside long sparse rows has empty splits past its one 64-token segment,
// and its counts row (the header and room for four counts) must hold only that segment's count (the
// empty splits once wrote theirs into the next row's header). The retrieval head is the last one, so
// its last row's overflow would reach the guard row the case checks.
template <class KT, class QT>
void run_clustered_candidates(std::uint64_t salt) {
  coverage() = Coverage();
  auto rng = kvsift_test::make_rng(salt);
  Case c;
  c.label = "candidates, cluster plan";
  c.batch = 2;
  c.hkv = 2;
  c.cap = 64;
  c.lengths = {64, 37};
  c.roles = kvsift::HeadRoleMask::all_sparse(2);
  c.roles.set_sparse(1, false);
  c.gather = Gather::kToken;
  c.idx_cap = 512;  // 512 positions a sparse row: 8 splits of 64
  c.score_block = 1;
  c.num_sms = 1000;
  run_case<KT, QT>(c, rng);
  CHECK(coverage().clustered == 1);
  CHECK(coverage().most_splits > 4);  // more splits than the counts row has room for
}

// Backfilling grids (DecodePlan::backfill): mixed calls whose sparse splits end early, planned for 12
// SMs so that four short sequences already backfill (more blocks than the wave, the retrieval blocks
// first in the grid's linear order, the block -> (sequence, row tile, split) map of
// decode_backfill_place). One and two row tiles, token and block gathers, per-token scores, contiguous
// and paged views, ragged lengths with an empty sequence; every case must backfill.
template <class KT, class QT>
void run_backfill(std::uint64_t salt) {
  coverage() = Coverage();
  auto rng = kvsift_test::make_rng(salt);
  struct Shape {
    Gather gather;
    int block, group, retrieval, score_block;
    Layout layout;
  };
  const Shape shapes[] = {
      {Gather::kToken, 1, 4, 1, 1, Layout::kBHSD},
      {Gather::kBlock, 64, 4, 2, 0, Layout::kPagedNHD},
      {Gather::kBlock, 16, 16, 1, 1, Layout::kBSHD},  // 16 query rows and the score row: two row tiles
      {Gather::kToken, 1, 16, 3, 0, Layout::kPagedHND},
  };
  for (const Shape& s : shapes) {
    Case c;
    c.label = "backfill";
    c.batch = 4;
    c.hkv = 8;
    c.group = s.group;
    c.cap = 8192;
    c.layout = s.layout;
    c.page_size = 64;
    c.lengths = {8192, 5001, 3, 0};
    c.roles = kvsift::HeadRoleMask::all_sparse(8);
    const int retrieval_heads[] = {2, 5, 7};
    for (int i = 0; i < s.retrieval; ++i) c.roles.set_sparse(retrieval_heads[i], false);
    c.gather = s.gather;
    c.gather_block = s.block;
    c.idx_cap = 1024 / s.block;
    c.score_block = s.score_block;
    c.num_sms = 12;
    run_case<KT, QT>(c, rng);
  }
  CHECK(coverage().backfilled == int(std::size(shapes)));
  report_coverage("backfill");
}

// A regression case from issue 14: it must hold index rows the pre-9b81d59 plan cut (else it no
// longer tests what it is named for), and the CUDA op must match the reference on it.
template <class KT, class QT>
void run_regression(const Case& c, std::mt19937_64& rng) {
  coverage() = Coverage();
  run_case<KT, QT>(c, rng);
  CHECK_MESSAGE(coverage().cases_with_cut_rows == 1, c.label << ": no index row the old split plan would have cut");
}

}  // namespace decode_test
