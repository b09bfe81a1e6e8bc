// Bad engine data on the GPU (core/data_error.hpp, docs/integration.md "What kvsift does with bad engine
// data"): a block-table entry outside the page pool, index entries outside the sequence and counts
// outside the capacity are ignored in the documented way, every other sequence of the batch is
// computed as if nothing happened, and the first bad item lands in the engine's DataError record.
//
// Decode attention over a paged cache whose sequence 1 has its last page id set to 99 (a pool of 12)
// must equal the host reference over the same cache with that sequence's length cut to the good pages
// (outputs, LSE and the retrieval scores, whose skipped tokens read -inf), on the tensor-core kernel
// (bf16) and the CUDA-core one (float); a bad page in the middle leaves the other sequences exact and
// this one finite. store_kv never writes through a bad id; copy_kv_to_dense writes zeros for its rows.
// window_scores and attention_cosine treat the keys of a bad page as absent.

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "support/device_buffer.cuh"
#include "support/random.hpp"

namespace {

using kvsift_test::DeviceBuffer;

constexpr int kB = 3, kH = 2, kG = 2, kD = 128, kPage = 16, kMaxPages = 4, kPool = 12;

// Sequence b owns pages 4b .. 4b + 3 of the pool.
std::vector<std::int32_t> good_table() {
  std::vector<std::int32_t> t(kB * kMaxPages);
  for (int i = 0; i < kB * kMaxPages; ++i) t[std::size_t(i)] = i;
  return t;
}

kvsift::DataError read_record(const DeviceBuffer<kvsift::DataError>& d) {
  kvsift::DataError e;
  KVSIFT_TEST_CUDA(cudaMemcpy(&e, d.get(), sizeof(e), cudaMemcpyDeviceToHost));
  return e;
}

// Random K/V pools of kPool pages (NHD) and one query row per q head of each sequence, in [-1, 1].
template <class T>
struct Inputs {
  std::vector<T> k, v, q;
  explicit Inputs(std::uint64_t salt) {
    auto rng = kvsift_test::make_rng(salt);
    const std::size_t pool = std::size_t(kPool) * kPage * kH * kD;
    k = kvsift_test::random_values<T>(rng, pool, -1.f, 1.f);
    v = kvsift_test::random_values<T>(rng, pool, -1.f, 1.f);
    q = kvsift_test::random_values<T>(rng, std::size_t(kB) * kH * kG * kD, -1.f, 1.f);
  }
};

template <class T>
void decode_with_a_bad_last_page() {
  const Inputs<T> in(11);
  const auto &k = in.k, &v = in.v, &q = in.q;
  const std::vector<std::int32_t> lengths = {40, 50, 33}, cut = {40, 48, 33};  // seq 1: page 3 holds 48, 49
  auto bad = good_table();
  bad[1 * kMaxPages + 3] = 99;
  const int cols = kMaxPages * kPage;

  // The host reference: the good table, sequence 1 cut to its good pages.
  std::vector<T> want(q.size());
  std::vector<float> want_lse(std::size_t(kB) * kH * kG), want_scores(std::size_t(kB) * kH * cols);
  {
    const auto table = good_table();
    const auto kv = kvsift::make_paged(k.data(), v.data(), table.data(), kB, kMaxPages, kPool, kH, kPage, kD,
                                       kvsift::PageLayout::kNHD, cut.data());
    auto p = kvsift::make_decode_attention_params(q.data(), want.data(), 1, kH * kG, kD);
    p.io.lse = want_lse.data();
    p.scores = want_scores.data();
    p.score_row_stride = cols;
    p.score_block_size = 1;
    p.max_kv_length = cols;
    const auto st = kvsift::host::decode_attention(kvsift::host::Exec{}, kv, p);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
  }
  // The host backend refuses the bad table outright.
  {
    const auto kv = kvsift::make_paged(k.data(), v.data(), bad.data(), kB, kMaxPages, kPool, kH, kPage, kD,
                                       kvsift::PageLayout::kNHD, lengths.data());
    std::vector<T> out(q.size());
    auto p = kvsift::make_decode_attention_params(q.data(), out.data(), 1, kH * kG, kD);
    const auto st = kvsift::host::decode_attention(kvsift::host::Exec{}, kv, p);
    CHECK(st.code() == kvsift::StatusCode::kInvalidArgument);
    CHECK(st.to_string().find("block_table[1][3] = 99") != std::string::npos);
  }

  DeviceBuffer<T> dk(k), dv(v), dq(q), dout(q.size());
  DeviceBuffer<std::int32_t> dtab(bad), dlen(lengths);
  DeviceBuffer<float> dlse(want_lse.size()), dscores(want_scores.size());
  DeviceBuffer<kvsift::DataError> derr(1);
  for (const bool record : {true, false}) {
    CAPTURE(record);
    dout.poison();
    dlse.poison();
    dscores.poison();
    KVSIFT_TEST_CUDA(cudaMemset(derr.get(), 0, sizeof(kvsift::DataError)));
    auto exec = kvsift::cuda::Exec::for_current_device();
    exec.data_error = record ? derr.get() : nullptr;
    const auto kv = kvsift::make_paged<const T>(dk.get(), dv.get(), dtab.get(), kB, kMaxPages, kPool, kH, kPage, kD,
                                                kvsift::PageLayout::kNHD, dlen.get());
    auto p = kvsift::make_decode_attention_params<T>(dq.get(), dout.get(), 1, kH * kG, kD);
    p.io.lse = dlse.get();
    p.scores = dscores.get();
    p.score_row_stride = cols;
    p.score_block_size = 1;
    p.max_kv_length = cols;
    std::size_t bytes = 0;
    REQUIRE(kvsift::decode_attention_workspace_bytes(exec, kv, p, &bytes).ok());
    DeviceBuffer<unsigned char> ws(bytes);
    const auto st = kvsift::cuda::decode_attention(exec, kv, p, kvsift::Workspace{ws.get(), ws.size()});
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    kvsift_test::sync_and_check();  // no illegal address: the bad page was never read

    const auto got = dout.download();
    const double tol = sizeof(T) == 4 ? 1e-5 : 2e-2;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double g = kvsift::to_float(got[i]), w = kvsift::to_float(want[i]);
      REQUIRE_MESSAGE(std::abs(g - w) <= tol * (1 + std::abs(w)), "out[", i, "] = ", g, ", host ", w);
    }
    const auto lse = dlse.download();
    for (std::size_t i = 0; i < lse.size(); ++i)
      REQUIRE_MESSAGE(std::abs(lse[i] - want_lse[i]) <= 1e-3 * (1 + std::abs(want_lse[i])), "lse[", i, "]");
    const auto scores = dscores.download();
    // A score is qbar . k with the group-mean query qbar, which the tensor-core kernel rounds to bf16
    // (relative 2^-9 per element): the error scales with sum |qbar_i k_i|, not with the score (a score
    // near 0 is a cancellation of terms of size ~0.3). The first GPU run of this test used a bound of
    // 1e-2 (1 + |s|) and failed on such scores by 0.014 against 0.012.
    const double score_rel = sizeof(T) == 4 ? 1e-5 : 8e-3;
    const auto table = good_table();
    for (int b = 0; b < kB; ++b)
      for (int h = 0; h < kH; ++h)
        for (int t = 0; t < lengths[std::size_t(b)]; ++t) {
          const std::size_t i = (std::size_t(b) * kH + h) * cols + t;
          if (std::isinf(want_scores[i])) {
            CHECK_MESSAGE((std::isinf(scores[i]) && scores[i] < 0), "score b ", b, " h ", h, " t ", t, " = ", scores[i]);
            continue;
          }
          const std::size_t krow =
              ((std::size_t(table[std::size_t(b * kMaxPages + t / kPage)]) * kPage + t % kPage) * kH + h) * kD;
          double kmag = 0;
          for (int d = 0; d < kD; ++d) {
            double qbar = 0;
            for (int g = 0; g < kG; ++g)
              qbar += kvsift::to_float(q[((std::size_t(b) * kH + h) * kG + g) * kD + d]) / kG;
            kmag += std::abs(qbar * kvsift::to_float(k[krow + d]));
          }
          CHECK_MESSAGE(std::abs(scores[i] - want_scores[i]) <= score_rel * kmag + 1e-6, "score b ", b, " h ", h, " t ", t,
                        " = ", scores[i], ", host ", want_scores[i], " (sum |qbar k| ", kmag, ")");
        }
    const auto e = read_record(derr);
    if (record) {
      REQUIRE(e.state == 2);
      CHECK(e.op == kvsift::DataErrorOp::kDecodeAttention);
      CHECK(e.kind == kvsift::DataErrorKind::kPageOutOfPool);
      CHECK(e.batch == 1);
      CHECK(e.value == 99);
      CHECK((e.position == 48 || e.position == 49));
      const auto s = kvsift::data_error_status(e);
      CHECK(s.code() == kvsift::StatusCode::kInvalidArgument);
      CHECK(s.to_string().find("block_table entry 99 of sequence 1") != std::string::npos);
    } else {
      CHECK(e.state == 0);
    }
  }
}

}  // namespace

TEST_CASE("bad engine data: a page outside the pool is skipped by decode attention (bf16, tensor cores)") {
  decode_with_a_bad_last_page<kvsift::bfloat16_t>();
}

TEST_CASE("bad engine data: a page outside the pool is skipped by decode attention (float, CUDA cores)") {
  decode_with_a_bad_last_page<float>();
}

TEST_CASE("bad engine data: a bad page in the middle, index entries and counts out of range") {
  using T = kvsift::bfloat16_t;
  const Inputs<T> in(12);
  const auto &k = in.k, &v = in.v, &q = in.q;
  const std::vector<std::int32_t> lengths = {40, 50, 33};
  const auto good = good_table();
  auto bad = good;
  bad[0 * kMaxPages + 1] = -5;  // sequence 0, tokens 16..31
  // KV head 1 of every sequence is sparse: rows list tokens, with an out-of-range entry in sequence 2
  // and a count past the capacity in sequence 1.
  constexpr int kCap = 6;
  std::vector<std::int32_t> idx(std::size_t(kB) * kH * kCap, 0), counts(std::size_t(kB) * kH, 0);
  const std::int32_t rows[kB][kCap] = {{0, 3, 5, 9, 33, 39}, {1, 2, 4, 8, 16, 47}, {0, 7, 1000000, 12, 20, 32}};
  for (int b = 0; b < kB; ++b) {
    for (int j = 0; j < kCap; ++j) idx[(std::size_t(b) * kH + 1) * kCap + j] = rows[b][j];
    counts[std::size_t(b) * kH + 1] = b == 1 ? kCap + 7 : kCap;
  }
  kvsift::HeadRoleMask roles;
  roles.set_sparse(1, true);
  auto set_params = [&](auto& p, const std::int32_t* ip, const std::int32_t* cp) {
    kvsift::ConstIndexSet s;
    s.indices = ip;
    s.counts = cp;
    s.rows = kB * kH;
    s.capacity = kCap;
    s.row_stride = kCap;
    p.index_set = s;
    p.roles = roles;
  };
  // Reference for the sequences without a bad page: the host on the good table; sequence 2's
  // out-of-range entry and sequence 1's count are the host's own rules (skip, clamp).
  std::vector<T> want(q.size());
  {
    const auto kv = kvsift::make_paged(k.data(), v.data(), good.data(), kB, kMaxPages, kPool, kH, kPage, kD,
                                       kvsift::PageLayout::kNHD, lengths.data());
    auto p = kvsift::make_decode_attention_params(q.data(), want.data(), 1, kH * kG, kD);
    set_params(p, idx.data(), counts.data());
    const auto st = kvsift::host::decode_attention(kvsift::host::Exec{}, kv, p);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
  }
  DeviceBuffer<T> dk(k), dv(v), dq(q), dout(q.size());
  DeviceBuffer<std::int32_t> dtab(bad), dlen(lengths), didx(idx), dcnt(counts);
  DeviceBuffer<kvsift::DataError> derr(1);
  KVSIFT_TEST_CUDA(cudaMemset(derr.get(), 0, sizeof(kvsift::DataError)));
  dout.poison();
  auto exec = kvsift::cuda::Exec::for_current_device();
  exec.data_error = derr.get();
  const auto kv = kvsift::make_paged<const T>(dk.get(), dv.get(), dtab.get(), kB, kMaxPages, kPool, kH, kPage, kD,
                                              kvsift::PageLayout::kNHD, dlen.get());
  auto p = kvsift::make_decode_attention_params<T>(dq.get(), dout.get(), 1, kH * kG, kD);
  set_params(p, didx.get(), dcnt.get());
  std::size_t bytes = 0;
  REQUIRE(kvsift::decode_attention_workspace_bytes(exec, kv, p, &bytes).ok());
  DeviceBuffer<unsigned char> ws(bytes);
  REQUIRE(kvsift::cuda::decode_attention(exec, kv, p, kvsift::Workspace{ws.get(), ws.size()}).ok());
  kvsift_test::sync_and_check();
  const auto got = dout.download();
  for (int b = 0; b < kB; ++b)
    for (int hq = 0; hq < kH * kG; ++hq)
      for (int i = 0; i < kD; ++i) {
        const std::size_t at = (std::size_t(b) * kH * kG + hq) * kD + i;
        const double g = kvsift::to_float(got[at]), w = kvsift::to_float(want[at]);
        REQUIRE_MESSAGE(std::isfinite(g), "out b ", b, " q head ", hq, " dim ", i, " = ", g);
        // Sequence 0's dense head read a bad page: finite, not compared. Its sparse head lists tokens of
        // good pages only (0, 3, 5, 9, 33, 39) and is exact.
        if (b == 0 && hq / kG == 0) continue;
        REQUIRE_MESSAGE(std::abs(g - w) <= 2e-2 * (1 + std::abs(w)), "out b ", b, " q head ", hq, " dim ", i, " = ", g,
                        ", host ", w);
      }
  // Three bad items, one record: whichever the kernels met first, each well formed.
  const auto e = read_record(derr);
  REQUIRE(e.state == 2);
  CHECK(e.op == kvsift::DataErrorOp::kDecodeAttention);
  if (e.kind == kvsift::DataErrorKind::kPageOutOfPool) {
    CHECK(e.batch == 0);
    CHECK(e.value == -5);
    CHECK((e.position >= 16 && e.position < 32));
  } else if (e.kind == kvsift::DataErrorKind::kIndexOutOfRange) {
    CHECK(e.batch == 2);
    CHECK(e.row == 1);
    CHECK(e.position == 2);
    CHECK(e.value == 1000000);
  } else {
    CHECK(e.kind == kvsift::DataErrorKind::kCountOutOfRange);
    CHECK(e.batch == 1);
    CHECK(e.row == 1);
    CHECK(e.value == kCap + 7);
  }
  // A record is kept: a second call with the same data leaves it as it was.
  const auto first = e;
  REQUIRE(kvsift::cuda::decode_attention(exec, kv, p, kvsift::Workspace{ws.get(), ws.size()}).ok());
  kvsift_test::sync_and_check();
  const auto again = read_record(derr);
  CHECK(std::memcmp(&again, &first, sizeof(first)) == 0);
}

TEST_CASE("bad engine data: store_kv never writes through a bad page; copy_kv_to_dense writes zeros") {
  using T = kvsift::bfloat16_t;
  auto rng = kvsift_test::make_rng(13);
  const std::size_t pool = std::size_t(kPool) * kPage * kH * kD;
  const auto k = kvsift_test::random_values<T>(rng, pool, -1.f, 1.f);
  const auto v = kvsift_test::random_values<T>(rng, pool, -1.f, 1.f);
  // The pool has a guard page past its end (page kPool) that a write through id kPool would hit.
  std::vector<T> kg(k), vg(v);
  kg.resize(pool + std::size_t(kPage) * kH * kD, kvsift::from_float<T>(7.f));
  vg.resize(kg.size(), kvsift::from_float<T>(7.f));
  auto table = good_table();
  table[2 * kMaxPages + 2] = kPool;  // sequence 2, tokens 32..47: one past the pool
  const std::vector<std::int32_t> lengths = {40, 50, 40};
  DeviceBuffer<T> dk(kg), dv(vg);
  DeviceBuffer<std::int32_t> dtab(table), dlen(lengths);
  DeviceBuffer<kvsift::DataError> derr(1);
  auto exec = kvsift::cuda::Exec::for_current_device();
  exec.data_error = derr.get();
  const auto kv = kvsift::make_paged<T>(dk.get(), dv.get(), dtab.get(), kB, kMaxPages, kPool, kH, kPage, kD,
                                        kvsift::PageLayout::kNHD, dlen.get());
  {
    KVSIFT_TEST_CUDA(cudaMemset(derr.get(), 0, sizeof(kvsift::DataError)));
    // New rows: sequence 0 token 39 (good) and sequence 2 token 35 (bad page).
    const auto nk = kvsift_test::random_values<T>(rng, std::size_t(2) * kH * kD, -1.f, 1.f);
    const auto nv = kvsift_test::random_values<T>(rng, nk.size(), -1.f, 1.f);
    DeviceBuffer<T> dnk(nk), dnv(nv);
    DeviceBuffer<std::int32_t> dseq(std::vector<std::int32_t>{0, 2}), dpos(std::vector<std::int32_t>{39, 35});
    const auto p = kvsift::make_store_kv_params<T>(dnk.get(), dnv.get(), 2, kH, kD, dseq.get(), dpos.get());
    REQUIRE(kvsift::cuda::store_kv(exec, kv, p).ok());
    kvsift_test::sync_and_check();
    const auto gk = dk.download();
    // The guard page is untouched, the good row was written.
    for (std::size_t i = pool; i < gk.size(); ++i) REQUIRE(kvsift::to_float(gk[i]) == 7.f);
    const std::size_t row = ((std::size_t(0 * kMaxPages + 39 / kPage) * kPage + 39 % kPage) * kH + 0) * kD;
    for (int i = 0; i < kD; ++i) REQUIRE(std::memcmp(&gk[row + i], &nk[std::size_t(i)], sizeof(T)) == 0);
    const auto e = read_record(derr);
    REQUIRE(e.state == 2);
    CHECK(e.op == kvsift::DataErrorOp::kStoreKv);
    CHECK(e.kind == kvsift::DataErrorKind::kPageOutOfPool);
    CHECK(e.batch == 2);
    CHECK(e.position == 35);
    CHECK(e.value == kPool);
  }
  {
    KVSIFT_TEST_CUDA(cudaMemset(derr.get(), 0, sizeof(kvsift::DataError)));
    const int max_tokens = kMaxPages * kPage;
    const std::size_t n = std::size_t(kB) * kH * max_tokens * kD;
    DeviceBuffer<T> ko(n), vo(n);
    ko.poison();
    vo.poison();
    const auto ckv = kvsift::make_paged<const T>(dk.get(), dv.get(), dtab.get(), kB, kMaxPages, kPool, kH, kPage, kD,
                                                 kvsift::PageLayout::kNHD, dlen.get());
    REQUIRE(kvsift::cuda::copy_kv_to_dense(exec, ckv, max_tokens, ko.get(), vo.get()).ok());
    kvsift_test::sync_and_check();
    const auto gk = ko.download(), pk = dk.download();
    for (int h = 0; h < kH; ++h)
      for (int t = 0; t < 40; ++t)
        for (int i = 0; i < kD; ++i) {
          const std::size_t at = ((std::size_t(2) * kH + h) * max_tokens + t) * kD + i;
          const int page = table[std::size_t(2 * kMaxPages + t / kPage)];
          const float want = page >= kPool ? 0.f
                                           : kvsift::to_float(pk[((std::size_t(page) * kPage + t % kPage) * kH + h) * kD + i]);
          REQUIRE_MESSAGE(kvsift::to_float(gk[at]) == want, "h ", h, " t ", t, " i ", i);
        }
    const auto e = read_record(derr);
    REQUIRE(e.state == 2);
    CHECK(e.op == kvsift::DataErrorOp::kCopyKvToDense);
    CHECK(e.batch == 2);
    CHECK(e.value == kPool);
  }
}

namespace {

// Prompt compression's scoring over the paged cache of the tests above, with sequence 1's second page
// (tokens 16..31) set to 99: every key on it is treated as absent. The expected values come from a
// float64 evaluation of each op's formula with those keys masked out; the same evaluation must agree with
// the host reference on the good table for the other sequences, so a wrong formula fails too.
constexpr int kScoreQueries = 4, kScoreWindow = 4;
const std::vector<std::int32_t> kScoreLengths = {40, 50, 40};
bool skipped_key(int b, int t) { return b == 1 && t >= 16 && t < 32; }

template <class T>
double key_dot(const std::vector<T>& k, const T* qrow, int b, int h, int t, double scale) {
  const auto table = good_table();
  const std::size_t krow = ((std::size_t(table[std::size_t(b * kMaxPages + t / kPage)]) * kPage + t % kPage) * kH + h) * kD;
  double s = 0;
  for (int d = 0; d < kD; ++d) s += double(kvsift::to_float(qrow[d])) * double(kvsift::to_float(k[krow + d]));
  return s * scale;
}

// window_scores, kKvHeadMean: P[b][h][j] = mean over the group of sum_i exp(l_ij - lse_i), each query
// i at position L - nq + i seeing the keys up to it that are not skipped.
template <class T>
std::vector<double> masked_window_scores(const std::vector<T>& k, const std::vector<T>& q, int cols) {
  std::vector<double> out(std::size_t(kB) * kH * cols, 0.0);
  const double scale = 1.0 / std::sqrt(double(kD));
  for (int b = 0; b < kB; ++b) {
    const int L = kScoreLengths[std::size_t(b)], prefix = std::min(L - kScoreWindow, cols);
    for (int h = 0; h < kH; ++h)
      for (int g = 0; g < kG; ++g)
        for (int i = 0; i < kScoreQueries; ++i) {
          const T* qrow = q.data() + ((std::size_t(b) * kScoreQueries + i) * kH * kG + h * kG + g) * kD;
          const int last = L - kScoreQueries + i;
          std::vector<double> l(std::size_t(last) + 1, -INFINITY);
          double m = -INFINITY;
          for (int j = 0; j <= last; ++j)
            if (!skipped_key(b, j)) m = std::max(m, l[std::size_t(j)] = key_dot(k, qrow, b, h, j, scale));
          double z = 0;
          for (int j = 0; j <= last; ++j) z += std::exp(l[std::size_t(j)] - m);
          for (int j = 0; j < prefix && j <= last; ++j)
            out[(std::size_t(b) * kH + h) * cols + j] += std::exp(l[std::size_t(j)] - m) / z / kG;
        }
  }
  return out;
}

template <class T>
void window_scores_with_a_bad_page() {
  const Inputs<T> in(21);
  auto rng = kvsift_test::make_rng(22);
  const auto q = kvsift_test::random_values<T>(rng, std::size_t(kB) * kScoreQueries * kH * kG * kD, -1.f, 1.f);
  const int cols = kMaxPages * kPage;
  const auto good = good_table();
  auto bad = good;
  bad[1 * kMaxPages + 1] = 99;
  kvsift::WindowScoreParams params;
  params.window = kScoreWindow;
  params.num_queries = kScoreQueries;
  params.max_length = cols;
  const auto want = masked_window_scores(in.k, q, cols);
  {  // the float64 formula against the host reference, on the sequences with good pages
    std::vector<float> host(want.size(), 0.f);
    const auto kv = kvsift::make_paged(in.k.data(), in.v.data(), good.data(), kB, kMaxPages, kPool, kH, kPage, kD,
                                       kvsift::PageLayout::kNHD, kScoreLengths.data());
    const auto qr = kvsift::make_query_rows(q.data(), kScoreQueries, kH * kG, kD);
    const auto st = kvsift::host::window_scores(kvsift::host::Exec{}, kv, qr, params,
                                                kvsift::make_strided_view(host.data(), kB * kH, cols));
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    for (int b : {0, 2})
      for (int i = b * kH * cols; i < (b + 1) * kH * cols; ++i)
        REQUIRE_MESSAGE(std::abs(host[std::size_t(i)] - want[std::size_t(i)]) <= 1e-5 * (1 + want[std::size_t(i)]),
                        "host score ", i, " = ", host[std::size_t(i)], ", float64 ", want[std::size_t(i)]);
  }
  DeviceBuffer<T> dk(in.k), dv(in.v), dq(q);
  DeviceBuffer<std::int32_t> dtab(bad), dlen(kScoreLengths);
  DeviceBuffer<float> dscores(want.size());
  DeviceBuffer<kvsift::DataError> derr(1);
  dscores.poison();
  KVSIFT_TEST_CUDA(cudaMemset(derr.get(), 0, sizeof(kvsift::DataError)));
  auto exec = kvsift::cuda::Exec::for_current_device();
  exec.data_error = derr.get();
  const auto kv = kvsift::make_paged<const T>(dk.get(), dv.get(), dtab.get(), kB, kMaxPages, kPool, kH, kPage, kD,
                                              kvsift::PageLayout::kNHD, dlen.get());
  const auto qr = kvsift::make_query_rows<T>(dq.get(), kScoreQueries, kH * kG, kD);
  const auto scores = kvsift::make_strided_view(dscores.get(), kB * kH, cols);
  std::size_t bytes = 0;
  REQUIRE(kvsift::window_scores_workspace_bytes(exec, kv, qr, params, scores, &bytes).ok());
  DeviceBuffer<unsigned char> ws(bytes);
  const auto st = kvsift::cuda::window_scores(exec, kv, qr, params, scores, kvsift::Workspace{ws.get(), ws.size()});
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  kvsift_test::sync_and_check();  // the bad page was never read
  const auto got = dscores.download();
  // The float64 formula reads the same (bf16-rounded) values: only fp32 sums and expf differ.
  const double tol = 1e-4;
  for (int b = 0; b < kB; ++b)
    for (int h = 0; h < kH; ++h)
      for (int j = 0; j < kScoreLengths[std::size_t(b)] - kScoreWindow; ++j) {
        const std::size_t i = (std::size_t(b) * kH + h) * cols + j;
        if (skipped_key(b, j)) {
          REQUIRE_MESSAGE(got[i] == 0.f, "score b ", b, " h ", h, " key ", j, " = ", got[i], " (its page is bad)");
          continue;
        }
        REQUIRE_MESSAGE(std::abs(got[i] - want[i]) <= tol * (1e-3 + want[i]), "score b ", b, " h ", h, " key ", j, " = ",
                        got[i], ", float64 ", want[i]);
      }
  const auto e = read_record(derr);
  REQUIRE(e.state == 2);
  CHECK(e.op == kvsift::DataErrorOp::kWindowScores);
  CHECK(e.kind == kvsift::DataErrorKind::kPageOutOfPool);
  CHECK(e.batch == 1);
  CHECK(e.value == 99);
  CHECK((e.position >= 16 && e.position < 32));
  CHECK(kvsift::data_error_status(e).to_string().find("window_scores: kv.block_table entry 99 of sequence 1") !=
        std::string::npos);
}

}  // namespace

TEST_CASE("bad engine data: window_scores masks keys on a page outside the pool (bf16, tensor cores)") {
  window_scores_with_a_bad_page<kvsift::bfloat16_t>();
}

TEST_CASE("bad engine data: window_scores masks keys on a page outside the pool (float, CUDA cores)") {
  window_scores_with_a_bad_page<float>();
}

TEST_CASE("bad engine data: attention_cosine gives keys on a page outside the pool no attention") {
  using T = float;
  const Inputs<T> in(23);
  auto rng = kvsift_test::make_rng(24);
  const auto q = kvsift_test::random_values<T>(rng, std::size_t(kB) * kScoreQueries * kH * kG * kD, -1.f, 1.f);
  auto bad = good_table();
  bad[1 * kMaxPages + 1] = 99;
  // Kept: every third position of each KV head's row (some on the bad page).
  constexpr int kKept = 12;
  std::vector<std::int32_t> kept(std::size_t(kB) * kH * kKept);
  for (std::size_t r = 0; r < std::size_t(kB) * kH; ++r)
    for (int s = 0; s < kKept; ++s) kept[r * kKept + std::size_t(s)] = 3 * s + int(r % 2);
  // float64: the cosine of the full and kept attention distributions of each query, skipped keys excluded.
  const double scale = 1.0 / std::sqrt(double(kD));
  std::vector<double> want(std::size_t(kB) * kH * kG * kScoreQueries);
  for (int b = 0; b < kB; ++b)
    for (int hq = 0; hq < kH * kG; ++hq)
      for (int t = 0; t < kScoreQueries; ++t) {
        const int L = kScoreLengths[std::size_t(b)], h = hq / kG;
        const T* qrow = q.data() + ((std::size_t(b) * kScoreQueries + t) * kH * kG + hq) * kD;
        std::vector<double> l(std::size_t(L), -INFINITY);
        std::vector<char> is_kept(std::size_t(L), 0);
        for (int s = 0; s < kKept; ++s) is_kept[std::size_t(kept[(std::size_t(b) * kH + h) * kKept + std::size_t(s)])] = 1;
        double mf = -INFINITY, mk = -INFINITY;
        for (int j = 0; j < L; ++j) {
          if (skipped_key(b, j)) continue;
          l[std::size_t(j)] = key_dot(in.k, qrow, b, h, j, scale);
          mf = std::max(mf, l[std::size_t(j)]);
          if (is_kept[std::size_t(j)]) mk = std::max(mk, l[std::size_t(j)]);
        }
        double zf = 0, zk = 0;
        for (int j = 0; j < L; ++j) {
          zf += std::exp(l[std::size_t(j)] - mf);
          if (is_kept[std::size_t(j)]) zk += std::exp(l[std::size_t(j)] - mk);
        }
        double dot = 0, nf = 0, nk = 0;
        for (int j = 0; j < L; ++j) {
          const double af = std::exp(l[std::size_t(j)] - mf) / zf;
          const double ak = is_kept[std::size_t(j)] ? std::exp(l[std::size_t(j)] - mk) / zk : 0.0;
          dot += af * ak, nf += af * af, nk += ak * ak;
        }
        want[(std::size_t(b) * kH * kG + hq) * kScoreQueries + std::size_t(t)] = dot / std::sqrt(nf * nk);
      }
  kvsift::KeptPositions kp;
  kp.rows = kB * kH;
  kp.heads = kH;
  kp.count = kKept;
  kp.stride = kKept;
  {  // the float64 formula against the host reference on the good table (sequences 0 and 2)
    std::vector<float> host(want.size());
    const auto good = good_table();
    const auto kv = kvsift::make_paged(in.k.data(), in.v.data(), good.data(), kB, kMaxPages, kPool, kH, kPage, kD,
                                       kvsift::PageLayout::kNHD, kScoreLengths.data());
    kp.data = kept.data();
    const auto st = kvsift::host::attention_cosine(kvsift::host::Exec{}, kv,
                                                   kvsift::make_query_rows(q.data(), kScoreQueries, kH * kG, kD),
                                                   kScoreQueries, 0.f, kp, host.data());
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    for (int b : {0, 2})
      for (std::size_t i = std::size_t(b) * kH * kG * kScoreQueries; i < std::size_t(b + 1) * kH * kG * kScoreQueries; ++i)
        REQUIRE_MESSAGE(std::abs(host[i] - want[i]) <= 1e-5, "host cosine ", i, " = ", host[i], ", float64 ", want[i]);
  }
  DeviceBuffer<T> dk(in.k), dv(in.v), dq(q);
  DeviceBuffer<std::int32_t> dtab(bad), dlen(kScoreLengths), dkept(kept);
  DeviceBuffer<float> dcos(want.size());
  DeviceBuffer<kvsift::DataError> derr(1);
  dcos.poison();
  KVSIFT_TEST_CUDA(cudaMemset(derr.get(), 0, sizeof(kvsift::DataError)));
  auto exec = kvsift::cuda::Exec::for_current_device();
  exec.data_error = derr.get();
  const auto kv = kvsift::make_paged<const T>(dk.get(), dv.get(), dtab.get(), kB, kMaxPages, kPool, kH, kPage, kD,
                                              kvsift::PageLayout::kNHD, dlen.get());
  kp.data = dkept.get();
  const auto st = kvsift::cuda::attention_cosine(exec, kv, kvsift::make_query_rows<T>(dq.get(), kScoreQueries, kH * kG, kD),
                                                 kScoreQueries, 0.f, kp, dcos.get());
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  kvsift_test::sync_and_check();
  const auto got = dcos.download();
  for (std::size_t i = 0; i < got.size(); ++i)
    REQUIRE_MESSAGE(std::abs(got[i] - want[i]) <= 1e-5, "cosine ", i, " = ", got[i], ", float64 ", want[i]);
  const auto e = read_record(derr);
  REQUIRE(e.state == 2);
  CHECK(e.op == kvsift::DataErrorOp::kAttentionCosine);
  CHECK(e.batch == 1);
  CHECK(e.value == 99);
  CHECK((e.position >= 16 && e.position < 32));
}
