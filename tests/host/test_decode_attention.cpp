// decode_attention's host reference against a naive formula written from the contract: every key
// gets a multiplicity w_t (dense: 1 below the length; gathered: how often an index entry covers t;
// 0 past the causal limit), and out = sum_t w_t e^{s_t} v_t / sum_t w_t e^{s_t}, lse = log sum_t w_t e^{s_t}.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "kvsift/kvsift.hpp"
#include "kvsift/ops/decode_attention.hpp"
#include "support/index_rows.hpp"
#include "support/random.hpp"

using kvsift::bfloat16_t;
using kvsift::Granularity;

namespace {

struct Problem {
  int batch = 2, hkv = 2, group = 2, d = 64, cap = 40, q_len = 1;
  std::vector<std::int32_t> lengths;
  kvsift::HeadRoleMask roles;
  Granularity gran = Granularity::kToken;
  int block = 1, idx_cap = 0;
  std::vector<std::int32_t> idx, counts;
  int score_block = 0;  // 0: no scores
};


// What a Problem adds to a call's params: its index rows (mutable copies the index set points at), a
// score buffer filled with the 12345 sentinel, and the LSE output. Not copyable: p points into it.
struct ProblemInputs {
  std::vector<std::int32_t> idx, counts;
  std::vector<float> scores;
  const Problem& pr;
  explicit ProblemInputs(const Problem& problem)
      : idx(problem.idx), counts(problem.counts), pr(problem) {
    const int sb = pr.score_block ? pr.score_block : 1;
    scores.assign(std::size_t(pr.batch) * pr.hkv * ((pr.cap + sb - 1) / sb), 12345.f);
  }
  ProblemInputs(const ProblemInputs&) = delete;
  ProblemInputs& operator=(const ProblemInputs&) = delete;
  template <class T>
  void attach(kvsift::DecodeAttentionParams<T>& p, std::vector<float>& lse) {
    p.io.lse = lse.data();
    p.roles = pr.roles;
    if (!idx.empty()) {
      auto set = kvsift::make_index_set(idx.data(), counts.data(), pr.batch * pr.hkv, pr.idx_cap, pr.gran, pr.block);
      p.index_set = kvsift::as_const(set);
    }
    if (pr.score_block) {
      p.scores = scores.data();
      p.score_row_stride = (pr.cap + pr.score_block - 1) / pr.score_block;
      p.score_block_size = pr.score_block;
    }
  }
};

// The contract written out directly, in double, and compared with what the reference wrote: per
// (b, h) the multiset of visible keys (duplicate entries count twice, entries outside [0, len)
// drop), the causal mask, softmax and P V; the LSE; and for retrieval heads the block-max scores of
// the group-mean query (sparse heads' score rows stay at the 12345 sentinel). kdq(b, h, t, i) and
// vdq(...) give element i of a dequantized K / V row, so plain and fp8 caches share it. out_scale is
// the absolute tolerance floor of an output element.
template <class T, class KDQ, class VDQ>
void expect_contract(const Problem& pr, const std::vector<T>& q, const std::vector<T>& out, const std::vector<float>& lse,
                     const std::vector<float>& scores, double sm_scale, KDQ kdq, VDQ vdq, double out_scale) {
  const int B = pr.batch, H = pr.hkv, G = pr.group, Hq = H * G, D = pr.d, S = pr.cap, QL = pr.q_len;
  const int sb = pr.score_block ? pr.score_block : 1;
  const int cols = (S + sb - 1) / sb;
  for (int b = 0; b < B; ++b) {
    const int len = pr.lengths[b];
    for (int h = 0; h < H; ++h) {
      std::vector<double> mult(S, 0.0);
      if (!pr.roles.is_sparse(h)) {
        for (int t = 0; t < len; ++t) mult[t] = 1;
      } else {
        const int row = b * H + h;
        for (int e = 0; e < pr.counts[row]; ++e)
          for (int i = 0; i < pr.block; ++i) {
            const long long t = (long long)pr.idx[std::size_t(row) * pr.idx_cap + e] * pr.block + i;
            if (t >= 0 && t < len) mult[t] += 1;
          }
      }
      for (int qi = 0; qi < QL; ++qi)
        for (int g = 0; g < G; ++g) {
          const int hq = h * G + g;
          const T* qr = &q[((std::size_t(b) * QL + qi) * Hq + hq) * D];
          std::vector<double> logit(S, -INFINITY);
          double m = -INFINITY;
          for (int t = 0; t < S; ++t) {
            if (t > len - QL + qi || mult[t] == 0) continue;
            double s = 0;
            for (int i = 0; i < D; ++i) s += double(kvsift::to_float(qr[i])) * kdq(b, h, t, i);
            logit[t] = s * sm_scale;
            m = std::max(m, logit[t]);
          }
          double den = 0;
          std::vector<double> num(D, 0.0);
          for (int t = 0; t < S; ++t) {
            if (logit[t] == -INFINITY) continue;
            const double e = mult[t] * std::exp(logit[t] - m);
            den += e;
            for (int i = 0; i < D; ++i) num[i] += e * vdq(b, h, t, i);
          }
          const T* o = &out[((std::size_t(b) * QL + qi) * Hq + hq) * D];
          for (int i = 0; i < D; ++i) {
            const double want = den > 0 ? num[i] / den : 0.0;
            // Only the final rounding to T separates the two: half an ulp of bf16 / fp16, relative.
            CHECK(double(kvsift::to_float(o[i])) == doctest::Approx(want).epsilon(1e-2).scale(out_scale));
          }
          const float l = lse[(std::size_t(b) * QL + qi) * Hq + hq];
          if (den > 0)
            CHECK(double(l) == doctest::Approx(m + std::log(den)).epsilon(1e-6));
          else
            CHECK(l == -INFINITY);
        }
      if (pr.score_block && !pr.roles.is_sparse(h)) {
        for (int j = 0; j < cols; ++j) {
          double best = -INFINITY;
          for (int t = j * sb; t < std::min((j + 1) * sb, len); ++t) {
            double s = 0;
            for (int i = 0; i < D; ++i) {
              double qbar = 0;
              for (int g = 0; g < G; ++g)
                qbar += kvsift::to_float(q[((std::size_t(b) * QL + QL - 1) * Hq + h * G + g) * D + i]);
              s += qbar / G * kdq(b, h, t, i);
            }
            best = std::max(best, s);
          }
          const float got = scores[(std::size_t(b) * H + h) * cols + j];
          if (best == -INFINITY)
            CHECK(got == -INFINITY);
          else
            CHECK(double(got) == doctest::Approx(best).epsilon(1e-5).scale(out_scale));
        }
      } else if (pr.score_block) {
        for (int j = 0; j < cols; ++j) CHECK(scores[(std::size_t(b) * H + h) * cols + j] == 12345.f);
      }
    }
  }
}

template <class T>
void check_against_naive(const Problem& pr, std::mt19937_64& rng) {
  const int B = pr.batch, H = pr.hkv, G = pr.group, Hq = H * G, D = pr.d, S = pr.cap, QL = pr.q_len;
  auto k = kvsift_test::random_values<T>(rng, std::size_t(B) * H * S * D);
  auto v = kvsift_test::random_values<T>(rng, k.size());
  auto q = kvsift_test::random_values<T>(rng, std::size_t(B) * QL * Hq * D, -2.f, 2.f);
  std::vector<T> out(q.size());
  std::vector<float> lse(std::size_t(B) * QL * Hq);
  const auto kv = kvsift::make_bshd(k.data(), v.data(), B, H, S, D, pr.lengths.data());
  auto p = kvsift::make_decode_attention_params(q.data(), out.data(), QL, Hq, D);
  ProblemInputs inputs(pr);
  inputs.attach(p, lse);
  const std::vector<float>& scores = inputs.scores;
  const auto st = kvsift::host::decode_attention(kvsift::host::Exec{}, kv, p);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  auto element = [&](const std::vector<T>& x) {
    return [&x, H, S, D](int b, int h, int t, int i) {
      return double(kvsift::to_float(x[((std::size_t(b) * S + t) * H + h) * D + i]));
    };
  };
  expect_contract(pr, q, out, lse, scores, p.sm_scale, element(k), element(v), 1.0);
}

}  // namespace

TEST_CASE("decode_attention host reference: dense heads, ragged lengths, q_len 1 and causal q_len 3") {
  auto rng = kvsift_test::make_rng(400);
  for (int ql : {1, 3}) {
    Problem pr;
    pr.q_len = ql;
    pr.lengths = {40, 0};
    if (ql == 1) pr.lengths = {17, 0};
    pr.score_block = 1;
    check_against_naive<float>(pr, rng);
    pr.lengths = {ql, 33};
    pr.score_block = 16;
    check_against_naive<bfloat16_t>(pr, rng);
  }
}

TEST_CASE("decode_attention host reference: gathered tokens with duplicates and out-of-range entries") {
  auto rng = kvsift_test::make_rng(401);
  Problem pr;
  pr.roles = kvsift::HeadRoleMask::all_sparse(pr.hkv);
  pr.lengths = {30, 12};
  pr.idx_cap = 6;
  pr.idx = {0, 5, 5, 29, 30, -1,   // batch 0 head 0: a duplicate, one past the end, one negative
            3, 3, 3, 7, 8, 9,      // batch 0 head 1: count 2 below
            11, 12, 100, 0, 0, 0,  // batch 1 head 0
            4, 1, 2, 2, 2, 2};     // batch 1 head 1: count 0 (empty row)
  pr.counts = {6, 2, 3, 0};
  check_against_naive<float>(pr, rng);
  pr.q_len = 2;
  check_against_naive<float>(pr, rng);
}

TEST_CASE("decode_attention host reference: gathered blocks and mixed roles with block-max scores") {
  auto rng = kvsift_test::make_rng(402);
  Problem pr;
  pr.cap = 80;
  pr.lengths = {70, 33};
  pr.roles.set_sparse(1, true);
  pr.gran = Granularity::kBlock;
  pr.block = 16;
  pr.idx_cap = 3;
  pr.idx = {0, 0, 0, 4, 1, 4, 9, -3, 2, 2, 0, 1};
  pr.counts = {3, 3, 3, 2};
  pr.score_block = 32;
  pr.q_len = 2;
  check_against_naive<float>(pr, rng);
}

namespace {

// An "obvious" float64 decode attention written from the contract alone, sharing no code with
// kvsift::host::decode_attention (its own addressing, its own clamps): so that a bug in the
// reference cannot hide a GPU bug that the GPU tests would otherwise catch. Per (b, h): len =
// clamp(lengths[b], 0, capacity), then min(len, max_kv_length or capacity); the keys are listed
// (dense: 0..len-1; sparse: for each of the first clamp(count, 0, idx_cap) entries, every token of
// it in [0, len), duplicates listed again); query i sees keys t <= len - q_len + i.
struct Obvious {
  int B, H, G, D, S, QL, max_kv_length;
  bool bhsd;
  std::vector<std::int32_t> lengths;
  kvsift::HeadRoleMask roles;
  int block = 1, idx_cap = 0, stride = 0;
  std::vector<std::int32_t> idx, counts;
  int score_block = 0;

  std::size_t kv_at(int b, int h, int t) const {
    return bhsd ? ((std::size_t(b) * H + h) * S + t) * D : ((std::size_t(b) * S + t) * H + h) * D;
  }
  int visible(int b) const {
    long long len = lengths[std::size_t(b)];
    if (len < 0) len = 0;
    if (len > S) len = S;
    const long long cap = max_kv_length > 0 ? max_kv_length : S;
    return int(len < cap ? len : cap);
  }
  std::vector<long long> keys(int b, int h) const {
    std::vector<long long> out;
    const int len = visible(b);
    if (!roles.is_sparse(h)) {
      for (long long t = 0; t < len; ++t) out.push_back(t);
      return out;
    }
    const int row = b * H + h;
    long long n = counts[std::size_t(row)];
    if (n < 0) n = 0;
    if (n > idx_cap) n = idx_cap;
    for (long long e = 0; e < n; ++e) {
      const long long entry = idx[std::size_t(row) * std::size_t(stride) + std::size_t(e)];
      for (long long i = 0; i < block; ++i) {
        const long long t = entry * block + i;
        if (t >= 0 && t < len) out.push_back(t);
      }
    }
    return out;
  }
};

template <class T>
void compare_reference_with_obvious(std::mt19937_64& rng, int trial) {
  using kvsift_test::uniform_int;
  Obvious o;
  o.B = uniform_int(rng, 1, 3);
  o.H = uniform_int(rng, 1, 3);
  o.G = uniform_int(rng, 1, 3);
  o.D = uniform_int(rng, 0, 3) == 0 ? 128 : 64;
  o.S = uniform_int(rng, 4, 48);
  o.QL = uniform_int(rng, 1, 3);
  o.bhsd = uniform_int(rng, 0, 1);
  o.max_kv_length = uniform_int(rng, 0, 1) ? 0 : uniform_int(rng, o.QL, o.S + 4);
  const int M = o.max_kv_length > 0 ? o.max_kv_length : o.S;
  for (int b = 0; b < o.B; ++b) {
    const int pick = uniform_int(rng, 0, 9);
    int len = pick == 0 ? 0 : pick == 1 ? -uniform_int(rng, 1, 5) : pick == 2 ? o.S + uniform_int(rng, 1, 9)
                                                                              : uniform_int(rng, 0, o.S);
    // q_len must fit every non-empty sequence (the reference checks it).
    const int vis = std::min(std::max(len, 0), std::min(o.S, M));
    if (vis > 0 && vis < o.QL) len = o.QL;
    o.lengths.push_back(len);
  }
  for (int h = 0; h < o.H; ++h) o.roles.set_sparse(h, uniform_int(rng, 0, 3) != 0);
  const bool blocks = uniform_int(rng, 0, 1);
  o.block = blocks ? (uniform_int(rng, 0, 1) ? 16 : 32) : 1;
  const int units = (o.S + o.block - 1) / o.block;
  o.idx_cap = uniform_int(rng, 0, 9) == 0 ? 0 : uniform_int(rng, 1, 2 * units + 3);
  o.stride = o.idx_cap + (uniform_int(rng, 0, 2) == 0 ? 3 : 0);
  for (int r = 0; r < o.B * o.H; ++r) {
    const int vis = o.visible(r / o.H);
    const auto row = kvsift_test::make_index_row(rng, kvsift_test::draw_row_kind(rng), vis, o.S, o.block, o.idx_cap,
                                                 o.stride);
    o.idx.insert(o.idx.end(), row.slots.begin(), row.slots.end());
    o.counts.push_back(row.count);
  }
  if (o.idx.empty()) o.idx.push_back(0);
  const int sb_pick = uniform_int(rng, 0, 3);
  o.score_block = sb_pick == 0 ? 0 : sb_pick == 1 ? 1 : sb_pick == 2 ? 16 : 32;

  const int Hq = o.H * o.G;
  auto k = kvsift_test::random_values<T>(rng, std::size_t(o.B) * o.H * o.S * o.D);
  auto v = kvsift_test::random_values<T>(rng, k.size());
  auto q = kvsift_test::random_values<T>(rng, std::size_t(o.B) * o.QL * Hq * o.D, -2.f, 2.f);
  std::vector<T> out(q.size(), kvsift::from_float<T>(NAN));
  std::vector<float> lse(std::size_t(o.B) * o.QL * Hq, NAN);
  const auto kv = o.bhsd ? kvsift::make_bhsd(k.data(), v.data(), o.B, o.H, o.S, o.D, o.lengths.data())
                         : kvsift::make_bshd(k.data(), v.data(), o.B, o.H, o.S, o.D, o.lengths.data());
  auto p = kvsift::make_decode_attention_params(q.data(), out.data(), o.QL, Hq, o.D);
  p.io.lse = lse.data();
  p.roles = o.roles;
  p.max_kv_length = o.max_kv_length;
  kvsift::ConstIndexSet set;
  set.indices = o.idx.data();
  set.counts = o.counts.data();
  set.rows = o.B * o.H;
  set.capacity = o.idx_cap;
  set.row_stride = o.stride;
  set.granularity = blocks ? Granularity::kBlock : Granularity::kToken;
  set.block_size = o.block;
  p.index_set = set;
  const int sb = o.score_block ? o.score_block : 1;
  const int cols = (M + sb - 1) / sb, score_stride = cols + 2;
  std::vector<float> scores(std::size_t(o.B) * o.H * score_stride, 12345.f);
  if (o.score_block) {
    p.scores = scores.data();
    p.score_row_stride = score_stride;
    p.score_block_size = sb;
  }
  std::string what = "trial " + std::to_string(trial) + (o.bhsd ? " BHSD" : " BSHD") + " B=" + std::to_string(o.B) +
                     " H=" + std::to_string(o.H) + " G=" + std::to_string(o.G) + " S=" + std::to_string(o.S) +
                     " q_len=" + std::to_string(o.QL) + " max_kv_length=" + std::to_string(o.max_kv_length) +
                     " block=" + std::to_string(o.block) + " cap=" + std::to_string(o.idx_cap) + " lengths=";
  for (int l : o.lengths) what += std::to_string(l) + ",";
  what += kvsift_test::describe_rows(o.idx, o.counts, o.stride);
  INFO(what);
  const auto st = kvsift::host::decode_attention(kvsift::host::Exec{}, kv, p);
  REQUIRE_MESSAGE(st.ok(), st.to_string());

  // float in, double accumulation on both sides: only the final rounding to T differs.
  const double out_tol = std::is_same<T, float>::value ? 1e-6 : 1e-2;
  int bad = 0;
  for (int b = 0; b < o.B; ++b)
    for (int h = 0; h < o.H; ++h) {
      const auto keys = o.keys(b, h);
      const int len = o.visible(b);
      for (int qi = 0; qi < o.QL; ++qi)
        for (int g = 0; g < o.G; ++g) {
          const int hq = h * o.G + g;
          const std::size_t qrow = (std::size_t(b) * o.QL + qi) * Hq + hq;
          std::vector<double> logit;
          std::vector<long long> seen;
          for (long long t : keys) {
            if (t > len - o.QL + qi) continue;
            double s = 0;
            for (int i = 0; i < o.D; ++i)
              s += double(kvsift::to_float(q[qrow * o.D + i])) * double(kvsift::to_float(k[o.kv_at(b, h, int(t)) + i]));
            logit.push_back(s * double(p.sm_scale));
            seen.push_back(t);
          }
          const float got_lse = lse[qrow];
          if (logit.empty()) {
            if (got_lse != -INFINITY && bad++ < 8) FAIL_CHECK("lse[" << qrow << "] = " << got_lse << ", want -inf");
            for (int i = 0; i < o.D; ++i)
              if (kvsift::to_float(out[qrow * o.D + i]) != 0.f && bad++ < 8)
                FAIL_CHECK("out[" << qrow << "][" << i << "] = " << kvsift::to_float(out[qrow * o.D + i]) << ", want 0");
            continue;
          }
          const double m = *std::max_element(logit.begin(), logit.end());
          double sum = 0;
          for (double l : logit) sum += std::exp(l - m);
          const double want_lse = m + std::log(sum);
          if (!(std::abs(double(got_lse) - want_lse) <= 1e-6 * (1 + std::abs(want_lse))) && bad++ < 8)
            FAIL_CHECK("lse[" << qrow << "] = " << got_lse << ", want " << want_lse << " (" << logit.size() << " keys)");
          for (int i = 0; i < o.D; ++i) {
            double num = 0;
            for (std::size_t j = 0; j < seen.size(); ++j)
              num += std::exp(logit[j] - m) * double(kvsift::to_float(v[o.kv_at(b, h, int(seen[j])) + i]));
            const double want = num / sum, got = kvsift::to_float(out[qrow * o.D + i]);
            if (!(std::abs(got - want) <= out_tol * (1 + std::abs(want))) && bad++ < 8)
              FAIL_CHECK("out[" << qrow << "][" << i << "] = " << got << ", want " << want);
          }
        }
      // Scores: dense heads only, raw group-mean dot products of the last position, block max.
      if (!o.score_block) continue;
      const float* row = &scores[(std::size_t(b) * o.H + h) * score_stride];
      for (int j = 0; j < score_stride; ++j) {
        double want = 12345.0;  // untouched: sparse rows and the stride slack
        if (!o.roles.is_sparse(h) && j < cols) {
          want = -INFINITY;
          for (int t = j * sb; t < (j + 1) * sb && t < len; ++t) {
            double s = 0;
            for (int i = 0; i < o.D; ++i) {
              double qbar = 0;
              for (int g = 0; g < o.G; ++g)
                qbar += kvsift::to_float(q[((std::size_t(b) * o.QL + o.QL - 1) * Hq + h * o.G + g) * o.D + i]);
              s += qbar / o.G * double(kvsift::to_float(k[o.kv_at(b, h, t) + i]));
            }
            want = std::max(want, s);
          }
        }
        const double got = row[j];
        const bool ok = std::isinf(want) || want == 12345.0 ? got == want : std::abs(got - want) <= 1e-5 * (1 + std::abs(want));
        if (!ok && bad++ < 8) FAIL_CHECK("scores[b " << b << ", h " << h << "][" << j << "] = " << got << ", want " << want);
      }
    }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("decode_attention host reference agrees with an obvious float64 implementation on adversarial rows") {
  // Unsorted rows, duplicates, entries outside the sequence (negative, past the end, int32 extremes,
  // products that wrap in 32 bits), counts outside [0, capacity], slots past the count holding
  // in-range decoys, max_kv_length below the lengths, lengths outside [0, capacity].
  auto rng = kvsift_test::make_rng(403);
  for (int trial = 0; trial < 300; ++trial) {
    if (trial % 4 == 3)
      compare_reference_with_obvious<bfloat16_t>(rng, trial);
    else
      compare_reference_with_obvious<float>(rng, trial);
  }
}

TEST_CASE("decode_attention validation names the parameter") {
  std::vector<float> k(8 * 64), q(4 * 64), out(4 * 64);
  std::vector<std::int32_t> len = {4};
  const auto kv = kvsift::make_bhsd(k.data(), k.data(), 1, 1, 4, 64, len.data());
  auto p = kvsift::make_decode_attention_params<float>(q.data(), out.data(), 1, 4, 64);
  using kvsift::StatusCode;
  kvsift::host::Exec ex;
  CHECK(kvsift::host::decode_attention(ex, kv, p).ok());

  auto bad = p;
  bad.head_dim = 96;
  const auto kv96 = kvsift::make_bhsd(k.data(), k.data(), 1, 1, 2, 96, len.data());
  auto st = kvsift::host::decode_attention(ex, kv96, bad);
  CHECK(st.code() == StatusCode::kUnsupported);
  CHECK(st.message().find("head_dim = 96") != std::string::npos);

  bad = p;
  bad.num_q_heads = 3;
  const auto kv2 = kvsift::make_bhsd(k.data(), k.data(), 1, 2, 4, 64, len.data());
  st = kvsift::host::decode_attention(ex, kv2, bad);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find("num_q_heads = 3") != std::string::npos);

  bad = p;
  bad.io.q.data = nullptr;
  st = kvsift::host::decode_attention(ex, kv, bad);
  CHECK(st.code() == StatusCode::kNullPointer);
  CHECK(st.message() == "io.q.data is null");

  bad = p;
  bad.q_len = 5;
  st = kvsift::host::decode_attention(ex, kv, bad);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find("q_len = 5") != std::string::npos);

  bad = p;
  bad.q_len = 0;
  CHECK(kvsift::host::decode_attention(ex, kv, bad).code() == StatusCode::kInvalidArgument);

  bad = p;
  std::vector<float> sc(1);
  bad.scores = sc.data();
  bad.score_row_stride = 1;
  bad.score_block_size = 8;
  st = kvsift::host::decode_attention(ex, kv, bad);
  CHECK(st.message().find("score_block_size = 8") != std::string::npos);
  bad.score_block_size = 1;
  st = kvsift::host::decode_attention(ex, kv, bad);
  CHECK(st.message().find("score_row_stride = 1") != std::string::npos);

  // Score candidates: per-token scores only, all three pointers, a 16-byte aligned counts row of a
  // multiple of 4 ints with room for the header and a count per 64 tokens (1 here: 4 tokens).
  bad = p;
  std::vector<float> sc4(4), thr(1);
  alignas(16) std::int32_t counts[12] = {};
  std::vector<std::int32_t> listed(4);
  bad.scores = sc4.data();
  bad.score_row_stride = 4;
  bad.candidates.thresholds = thr.data();
  st = kvsift::host::decode_attention(ex, kv, bad);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find("counts and positions") != std::string::npos);
  bad.candidates.counts = counts;
  bad.candidates.positions = listed.data();
  bad.candidates.count_stride = 4;
  st = kvsift::host::decode_attention(ex, kv, bad);
  CHECK(st.message().find("candidates.count_stride = 4") != std::string::npos);
  bad.candidates.count_stride = 6;
  CHECK(kvsift::host::decode_attention(ex, kv, bad).code() == StatusCode::kInvalidArgument);  // not a multiple of 4
  bad.candidates.count_stride = 8;
  CHECK(kvsift::host::decode_attention(ex, kv, bad).ok());  // the host reference lists nothing
  bad.candidates.counts = counts + 1;
  CHECK(kvsift::host::decode_attention(ex, kv, bad).code() == StatusCode::kMisaligned);
  bad.candidates.counts = counts;
  std::vector<float> block_scores(1);
  bad.scores = block_scores.data();
  bad.score_row_stride = 1;
  bad.score_block_size = 16;
  st = kvsift::host::decode_attention(ex, kv, bad);
  CHECK(st.message().find("candidates need per-token scores") != std::string::npos);
  bad.scores = nullptr;
  CHECK(kvsift::host::decode_attention(ex, kv, bad).code() == StatusCode::kInvalidArgument);

  bad = p;
  bad.roles = kvsift::HeadRoleMask::all_sparse(1);
  std::vector<std::int32_t> idx(4), cnt(1);
  auto set = kvsift::make_index_set(idx.data(), cnt.data(), 1, 4, Granularity::kBlock, 8);
  bad.index_set = kvsift::as_const(set);
  st = kvsift::host::decode_attention(ex, kv, bad);
  CHECK(st.message().find("index_set.block_size = 8") != std::string::npos);
}

// The CUDA plan is a pure function of host values: an Exec-like value with an H200's facts plans it
// here, on a machine without a GPU. (cuda::Exec has the same `device` member.)
struct H200Facts {
  kvsift::DeviceFacts device{132, 227 * 1024, true, 9, 0};
};
const H200Facts kH200;

TEST_CASE("decode_attention workspace query needs no device memory and grows with splits") {
  std::vector<std::int32_t> len = {0};
  const auto kv = kvsift::make_bshd<kvsift::bfloat16_t>(nullptr, nullptr, 1, 8, 131072, 128, len.data());
  auto p = kvsift::make_decode_attention_params<kvsift::bfloat16_t>(nullptr, nullptr, 1, 32, 128);
  std::size_t bytes = 0;
  // q and out may be null for the size query; the view still validates its own pointers.
  auto kv_ok = kv;
  kv_ok.k = kv_ok.v = reinterpret_cast<kvsift::bfloat16_t*>(256);
  REQUIRE(kvsift::decode_attention_workspace_bytes(kH200, kv_ok, p, &bytes).ok());
  CHECK(bytes > 0);
  kvsift::detail::DecodePlan plan;
  REQUIRE(kvsift::detail::plan_decode_attention(kH200.device, kv_ok, p, &plan).ok());
  CHECK(plan.ctas_per_tile <= 132 * kvsift::detail::decode_ctas_per_sm(true, 128, 256));
  CHECK(plan.ctas_per_tile >= 132);
  CHECK(plan.chunk % kvsift::detail::kDecodeCtaTokens == 0);
  CHECK(std::size_t(plan.ctas_per_tile) * 8 * 129 * 4 <= bytes);

  // Mixed: one retrieval head out of eight gets proportionally more splits than a sparse one.
  std::vector<std::int32_t> idx(8 * 4096), cnt(8, 4096);
  auto set = kvsift::make_index_set(idx.data(), cnt.data(), 8, 4096);
  p.index_set = kvsift::as_const(set);
  p.roles = kvsift::HeadRoleMask::all_sparse(8);
  p.roles.set_sparse(0, false);
  REQUIRE(kvsift::detail::plan_decode_attention(kH200.device, kv_ok, p, &plan).ok());
  CHECK(plan.num_retrieval == 1);
  CHECK(plan.head_at[0] == 0);
  CHECK(plan.retrieval_splits >= 16 * plan.sparse_splits);
  CHECK(plan.ctas_per_tile <= 132 * kvsift::detail::decode_ctas_per_sm(true, 128, 256));
}

TEST_CASE("decode_attention workspace: the query for a batch covers every smaller batch") {
  // Engines size the workspace once for their largest batch; the split plan rounds per batch size, so
  // the query must report the most any batch up to it needs.
  using kvsift::bfloat16_t;
  for (int S : {1000, 32768, 131072})
    for (int q_len : {1, 8}) {
      std::size_t prev = 0;
      for (int b = 1; b <= 24; ++b) {
        auto kv = kvsift::make_bhsd<bfloat16_t>(reinterpret_cast<bfloat16_t*>(256), reinterpret_cast<bfloat16_t*>(256),
                                                b, 8, S, 128, reinterpret_cast<const std::int32_t*>(256));
        auto p = kvsift::make_decode_attention_params<bfloat16_t>(reinterpret_cast<bfloat16_t*>(256),
                                                                  reinterpret_cast<bfloat16_t*>(256), q_len, 32, 128);
        std::size_t bytes = 0;
        REQUIRE(kvsift::decode_attention_workspace_bytes(kH200, kv, p, &bytes).ok());
        CHECK(bytes >= prev);
        prev = bytes;
      }
    }
}

TEST_CASE("decode_attention plan: one wave, and a merge grid that covers every split and output of the merged heads") {
  // The merge kernel gives each output float4 merge_parts threads that read at most kDecodeMergeBatch
  // splits each, and cuts a head's row_tile x head_dim / 4 float4s into merge_blocks_per_head blocks;
  // a head with one split is not merged (its split block writes the output).
  using kvsift::bfloat16_t;
  namespace d = kvsift::detail;
  std::vector<std::int32_t> idx(64 * 8 * 4096), cnt(64 * 8, 4096);
  int merging = 0, not_merging = 0, clustered = 0;
  for (int b : {1, 2, 8, 64})
    for (int S : {1000, 32768, 131072})
      for (int hd : {64, 128, 256})
        for (bool mixed : {false, true}) {
          auto kv = kvsift::make_bhsd<bfloat16_t>(reinterpret_cast<bfloat16_t*>(256), reinterpret_cast<bfloat16_t*>(256), b,
                                                  8, S, hd, reinterpret_cast<const std::int32_t*>(256));
          auto p = kvsift::make_decode_attention_params<bfloat16_t>(reinterpret_cast<bfloat16_t*>(256),
                                                                    reinterpret_cast<bfloat16_t*>(256), 1, 32, hd);
          auto set = kvsift::make_index_set(idx.data(), cnt.data(), b * 8, 4096);
          if (mixed) {
            p.index_set = kvsift::as_const(set);
            p.roles = kvsift::HeadRoleMask::all_sparse(8);
            p.roles.set_sparse(0, false);
          }
          d::DecodePlan plan;
          REQUIRE(d::plan_decode_attention(kH200.device, kv, p, &plan).ok());
          CAPTURE(b);
          CAPTURE(S);
          CAPTURE(hd);
          CAPTURE(mixed);
          // One wave: the grid fits the blocks the plan sizes for, unless every head is down to one split
          // or to chunks of kDecodeMaxChunk (the cap of the block-max scratch).
          const std::int64_t blocks = std::int64_t(b) * plan.row_tiles * plan.ctas_per_tile;
          const std::int64_t wave = 132 * d::decode_ctas_per_sm(true, hd, hd * 2);
          const bool floor_r = plan.retrieval_splits == 1 || plan.chunk >= d::kDecodeMaxChunk;
          const bool floor_s = plan.sparse_splits == 1 || plan.sparse_chunk >= d::kDecodeMaxChunk;
          // A backfilling plan starts a wave of its retrieval blocks and more sparse blocks than the rest.
          const std::int64_t first_wave = plan.backfill ? std::int64_t(b) * plan.row_tiles * plan.num_retrieval * plan.retrieval_splits : blocks;
          const bool one_wave = first_wave <= wave || (floor_r && floor_s);
          CHECK(one_wave);
          if (plan.backfill) CHECK(blocks > wave);
          CHECK(plan.chunk % d::kDecodeCtaTokens == 0);
          CHECK(plan.sparse_chunk % d::kDecodeCtaTokens == 0);
          CHECK(plan.retrieval_splits * plan.chunk >= plan.max_len);
          if (mixed) CHECK(plan.sparse_splits * plan.sparse_chunk >= plan.sparse_tokens);
          if (plan.cluster > 1) {  // small calls: a head's splits merge in their cluster
            CHECK(plan.cluster <= d::kDecodeMaxClusterSplits);
            if (plan.num_retrieval > 0) CHECK(plan.retrieval_splits == plan.cluster);
            if (plan.num_sparse > 0) CHECK(plan.sparse_splits == plan.cluster);
            CHECK(blocks <= 132);
            CHECK(plan.merged_heads == 0);
            CHECK(plan.workspace_bytes() == 0);
            ++clustered;
            continue;
          }
          const bool merge_r = plan.num_retrieval > 0 && plan.retrieval_splits > 1;
          const bool merge_s = plan.num_sparse > 0 && plan.sparse_splits > 1;
          CHECK(plan.merged_heads == (merge_r ? plan.num_retrieval : 0) + (merge_s ? plan.num_sparse : 0));
          if (!plan.splits_any()) {
            CHECK(plan.merged_heads == 0);
            ++not_merging;
            continue;
          }
          ++merging;
          const int parts = plan.merge_parts;
          CHECK((parts & (parts - 1)) == 0);  // a power of two: it divides the block
          CHECK(parts <= d::kDecodeMergeThreads);
          CHECK(parts * d::kDecodeMergeBatch >= (merge_r ? plan.retrieval_splits : 0));
          CHECK(parts * d::kDecodeMergeBatch >= (merge_s ? plan.sparse_splits : 0));
          const bool smallest = parts == 1 || (parts / 2) * d::kDecodeMergeBatch < std::max(plan.retrieval_splits, plan.sparse_splits);
          CHECK(smallest);  // no more parts than the splits need
          const int per_block = d::kDecodeMergeThreads / parts;
          CHECK(plan.merge_blocks_per_head * per_block >= plan.row_tile * hd / 4);
          CHECK((plan.merge_blocks_per_head - 1) * per_block < plan.row_tile * hd / 4);
        }
  CHECK(merging > 0);
  CHECK(not_merging > 0);
  CHECK(clustered > 0);
}

TEST_CASE("decode_attention plan: small calls merge their splits in clusters, large ones in the merge kernel") {
  using kvsift::bfloat16_t;
  namespace d = kvsift::detail;
  auto plan_for = [](int batch, int len, bool clusters) {
    auto kv = kvsift::make_bhsd<bfloat16_t>(reinterpret_cast<bfloat16_t*>(256), reinterpret_cast<bfloat16_t*>(256), batch, 8,
                                            len, 128, reinterpret_cast<const std::int32_t*>(256));
    auto p = kvsift::make_decode_attention_params<bfloat16_t>(reinterpret_cast<bfloat16_t*>(256),
                                                              reinterpret_cast<bfloat16_t*>(256), 1, 32, 128);
    H200Facts facts;
    facts.device.clusters = clusters;
    d::DecodePlan plan;
    REQUIRE(d::plan_decode_attention(facts.device, kv, p, &plan).ok());
    return plan;
  };
  // 1024 tokens, 8 KV heads: 16 splits of 64 become 8 of 128 (two stages, the ring's depth).
  auto p = plan_for(1, 1024, true);
  CHECK(p.cluster == 8);
  CHECK(p.chunk == 128);
  CHECK(p.retrieval_splits == 8);
  CHECK_FALSE(p.merge_kernel());
  // 1040 tokens (a compressed prompt plus new ones): 17 splits of 64, or 8 of 192 (one ring more).
  p = plan_for(1, 1040, true);
  CHECK(p.cluster == 8);
  CHECK(p.chunk == 192);
  // Short enough for 5 splits of 64: they are the cluster.
  p = plan_for(1, 300, true);
  CHECK(p.cluster == 5);
  CHECK(p.chunk == 64);
  // One split per head: nothing to merge.
  p = plan_for(1, 64, true);
  CHECK(p.cluster == 0);
  CHECK_FALSE(p.splits_any());
  // Growing 8 splits by more than a ring's depth: the merge kernel.
  p = plan_for(1, 4096, true);
  CHECK(p.cluster == 0);
  CHECK(p.merge_kernel());
  // More blocks than SMs: the merge kernel (a cluster could wait for a GPC with room).
  p = plan_for(8, 131072, true);
  CHECK(p.cluster == 0);
  CHECK(p.merge_kernel());
  // A device without clusters.
  p = plan_for(1, 1024, false);
  CHECK(p.cluster == 0);
  CHECK(p.retrieval_splits == 16);
  CHECK(p.merge_kernel());
}

TEST_CASE("decode_attention plan: a mixed call whose sparse blocks end early backfills its wave") {
  using kvsift::bfloat16_t;
  namespace d = kvsift::detail;
  std::vector<std::int32_t> idx(8 * 8 * 4096), cnt(8 * 8, 4096);
  // One retrieval head beside seven sparse ones over 4096 positions (a LycheeDecode layer), 128K.
  auto plan_for = [&](int batch, int block) {
    auto kv = kvsift::make_bhsd<bfloat16_t>(reinterpret_cast<bfloat16_t*>(256), reinterpret_cast<bfloat16_t*>(256), batch, 8,
                                            131072, 128, reinterpret_cast<const std::int32_t*>(256));
    auto p = kvsift::make_decode_attention_params<bfloat16_t>(reinterpret_cast<bfloat16_t*>(256),
                                                              reinterpret_cast<bfloat16_t*>(256), 1, 32, 128);
    auto set = kvsift::make_index_set(idx.data(), cnt.data(), batch * 8, 4096 / block,
                                      block > 1 ? Granularity::kBlock : Granularity::kToken, block);
    p.index_set = kvsift::as_const(set);
    p.roles = kvsift::HeadRoleMask::all_sparse(8);
    p.roles.set_sparse(0, false);
    d::DecodePlan plan;
    REQUIRE(d::plan_decode_attention(kH200.device, kv, p, &plan).ok());
    return plan;
  };
  // Block-64 gathers at batch 8: one wave would be 35 x 3776 + 2 x 2048 a head (392 blocks), its sparse
  // blocks ending at 54% of its retrieval ones. Backfilled: the retrieval head takes 396 x 131072 /
  // (131072 + 7 x 4096) = 324 slots, 40 splits of 3328 a sequence (320 blocks), and the sparse heads
  // 8 splits of 512 (448 blocks for the 76 slots left).
  auto p = plan_for(8, 64);
  if (!d::kDecodeBackfill) {  // off in this build (KVSIFT_DECODE_BACKFILL): the one-wave plan
    CHECK_FALSE(p.backfill);
    CHECK(p.retrieval_splits == 35);
    CHECK(p.sparse_splits == 2);
    return;
  }
  CHECK(p.backfill);
  CHECK(p.retrieval_splits == 40);
  CHECK(p.chunk == 3328);
  CHECK(p.sparse_splits == 8);
  CHECK(p.sparse_chunk == d::kDecodeBackfillChunk);
  CHECK(p.ctas_per_tile == 40 + 7 * 8);
  // Token gathers cost 1.5 a position: 2 x 2048 x 1.5 = 3072 of 3776 is above the ratio, no backfill.
  p = plan_for(8, 1);
  CHECK_FALSE(p.backfill);
  CHECK(p.retrieval_splits == 35);
  CHECK(p.sparse_splits == 2);
  // Batch 1: the retrieval head's blocks are capped at kDecodeMaxSplits, the wave is not full, and there
  // is nothing to fill it with.
  p = plan_for(1, 64);
  CHECK_FALSE(p.backfill);
}

TEST_CASE("decode_attention plan: the backfilling grid order places every block once") {
  namespace d = kvsift::detail;
  for (int batch : {1, 3, 8})
    for (int row_tiles : {1, 2, 3})
      for (int retrieval_ctas : {1, 5, 40})
        for (int sparse_ctas : {1, 7, 56}) {
          const int ctas = retrieval_ctas + sparse_ctas, total = ctas * row_tiles * batch;
          std::vector<int> seen(std::size_t(total), 0);
          for (int linear = 0; linear < total; ++linear) {
            const d::DecodeBlockPlace at = d::decode_backfill_place(linear, ctas, retrieval_ctas, row_tiles, batch);
            REQUIRE(at.x >= 0);
            REQUIRE(at.x < ctas);
            REQUIRE(at.tile >= 0);
            REQUIRE(at.tile < row_tiles);
            REQUIRE(at.b >= 0);
            REQUIRE(at.b < batch);
            // Retrieval blocks come first, in (sequence, row tile, split) order.
            CHECK((linear < retrieval_ctas * row_tiles * batch) == (at.x < retrieval_ctas));
            ++seen[std::size_t((at.b * row_tiles + at.tile) * ctas + at.x)];
          }
          for (int n : seen) REQUIRE(n == 1);
        }
}

TEST_CASE("decode_attention plan: the SM count comes from the Exec, never a default") {
  std::vector<std::int32_t> len = {0};
  const auto kv = kvsift::make_bshd<kvsift::bfloat16_t>(reinterpret_cast<kvsift::bfloat16_t*>(256),
                                                        reinterpret_cast<kvsift::bfloat16_t*>(256), 1, 8, 131072, 128,
                                                        len.data());
  const auto p = kvsift::make_decode_attention_params<kvsift::bfloat16_t>(nullptr, nullptr, 1, 32, 128);
  H200Facts unknown;
  unknown.device = kvsift::DeviceFacts();
  std::size_t bytes = 0;
  const auto st = kvsift::decode_attention_workspace_bytes(unknown, kv, p, &bytes);
  CHECK(st.code() == kvsift::StatusCode::kInvalidArgument);
  CHECK(st.message().find("exec.device.num_sms = 0") != std::string::npos);
  // A smaller GPU gets a smaller grid.
  H200Facts a100;
  a100.device.num_sms = 108;
  kvsift::detail::DecodePlan big, small;
  REQUIRE(kvsift::detail::plan_decode_attention(kH200.device, kv, p, &big).ok());
  REQUIRE(kvsift::detail::plan_decode_attention(a100.device, kv, p, &small).ok());
  CHECK(small.ctas_per_tile <= 108 * kvsift::detail::decode_ctas_per_sm(true, 128, 256));
  CHECK(small.ctas_per_tile < big.ctas_per_tile);
  // The host reference needs no workspace.
  REQUIRE(kvsift::decode_attention_workspace_bytes(kvsift::host::Exec{}, kv, p, &bytes).ok());
  CHECK(bytes == 0);
}

// ---- fp8 KV ------------------------------------------------------------------------------------------
// The reference over fp8 views against a float64 computation that dequantizes the raw buffers itself
// (code * scale from its own index math, not through the view), for per-head and per-token scales,
// contiguous and paged (NHD, HND), dense, gathered and mixed heads, with scores.

namespace {

enum class Fp8Layout { kBSHD, kPagedNHD, kPagedHND };

template <class KT, class T>
void check_fp8_against_float64(const Problem& pr, Fp8Layout layout, kvsift::ScaleGranularity gran,
                               std::mt19937_64& rng) {
  const int B = pr.batch, H = pr.hkv, G = pr.group, Hq = H * G, D = pr.d, S = pr.cap, QL = pr.q_len;
  const int P = 16, pages_per_seq = (S + P - 1) / P, num_pages = B * pages_per_seq;
  const bool paged = layout != Fp8Layout::kBSHD;
  const std::size_t rows = paged ? std::size_t(num_pages) * P * H : std::size_t(B) * S * H;
  // Codes from random values of varying magnitude, scales spread over two decades.
  std::uniform_real_distribution<float> val(-300.f, 300.f), sc(0.002f, 0.2f);
  std::vector<KT> k(rows * D), v(rows * D);
  for (auto& x : k) x = kvsift::from_float<KT>(val(rng));
  for (auto& x : v) x = kvsift::from_float<KT>(val(rng));
  const std::size_t nscales = gran == kvsift::ScaleGranularity::kPerHead ? std::size_t(H) : rows;
  std::vector<float> ks(nscales), vs(nscales);
  for (auto& x : ks) x = sc(rng);
  for (auto& x : vs) x = sc(rng);
  auto q = kvsift_test::random_values<T>(rng, std::size_t(B) * QL * Hq * D, -2.f, 2.f);
  std::vector<T> out(q.size());
  std::vector<float> lse(std::size_t(B) * QL * Hq);
  // Page table: sequence b's logical page j is physical page (j * B + b) (interleaved, not identity).
  std::vector<std::int32_t> table(std::size_t(B) * pages_per_seq);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < pages_per_seq; ++j) table[std::size_t(b) * pages_per_seq + j] = j * B + b;
  // The row index (in rows of D elements) of (b, h, t), and the scale index, by hand.
  auto row_of = [&](int b, int h, int t) -> std::size_t {
    if (!paged) return (std::size_t(b) * S + t) * H + h;
    const std::size_t page = std::size_t(table[std::size_t(b) * pages_per_seq + t / P]);
    const int slot = t % P;
    return page * P * H + (layout == Fp8Layout::kPagedNHD ? std::size_t(slot) * H + h : std::size_t(h) * P + slot);
  };
  auto scale_of = [&](const std::vector<float>& s, int b, int h, int t) -> double {
    return gran == kvsift::ScaleGranularity::kPerHead ? s[h] : s[row_of(b, h, t)];
  };
  auto kdq = [&](int b, int h, int t, int i) {
    return double(kvsift::to_float(k[row_of(b, h, t) * D + i])) * scale_of(ks, b, h, t);
  };
  auto vdq = [&](int b, int h, int t, int i) {
    return double(kvsift::to_float(v[row_of(b, h, t) * D + i])) * scale_of(vs, b, h, t);
  };

  auto p = kvsift::make_decode_attention_params(q.data(), out.data(), QL, Hq, D);
  ProblemInputs inputs(pr);
  inputs.attach(p, lse);
  const std::vector<float>& scores = inputs.scores;
  p.max_kv_length = S;
  kvsift::Status st;
  if (paged) {
    auto kv = kvsift::make_paged(k.data(), v.data(), table.data(), B, pages_per_seq, num_pages, H, P, D,
                                 layout == Fp8Layout::kPagedNHD ? kvsift::PageLayout::kNHD : kvsift::PageLayout::kHND,
                                 pr.lengths.data());
    kv.scales = gran == kvsift::ScaleGranularity::kPerHead ? kvsift::make_per_head_scales(ks.data(), vs.data())
                                                           : kvsift::make_per_token_scales_for(kv, ks.data(), vs.data());
    st = kvsift::host::decode_attention(kvsift::host::Exec{}, kv, p);
  } else {
    auto kv = kvsift::make_bshd(k.data(), v.data(), B, H, S, D, pr.lengths.data());
    kv.scales = gran == kvsift::ScaleGranularity::kPerHead ? kvsift::make_per_head_scales(ks.data(), vs.data())
                                                           : kvsift::make_per_token_scales_for(kv, ks.data(), vs.data());
    st = kvsift::host::decode_attention(kvsift::host::Exec{}, kv, p);
  }
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  expect_contract(pr, q, out, lse, scores, p.sm_scale, kdq, vdq, 1e-3);
}

template <class KT, class T>
void fp8_every_layout(const Problem& pr, std::mt19937_64& rng) {
  for (auto layout : {Fp8Layout::kBSHD, Fp8Layout::kPagedNHD, Fp8Layout::kPagedHND})
    for (auto gran : {kvsift::ScaleGranularity::kPerHead, kvsift::ScaleGranularity::kPerToken})
      check_fp8_against_float64<KT, T>(pr, layout, gran, rng);
}

}  // namespace

TEST_CASE("decode_attention host reference over fp8 KV: dense, q_len 1 and causal q_len 3, with scores") {
  auto rng = kvsift_test::make_rng(410);
  for (int ql : {1, 3}) {
    Problem pr;
    pr.q_len = ql;
    pr.lengths = {37, ql == 1 ? 0 : 5};
    pr.score_block = ql == 1 ? 1 : 16;
    fp8_every_layout<kvsift::fp8_e4m3_t, bfloat16_t>(pr, rng);
    fp8_every_layout<kvsift::fp8_e5m2_t, kvsift::half_t>(pr, rng);
  }
}

TEST_CASE("decode_attention host reference over fp8 KV: gathered tokens and mixed block heads") {
  auto rng = kvsift_test::make_rng(411);
  Problem pr;
  pr.roles = kvsift::HeadRoleMask::all_sparse(pr.hkv);
  pr.lengths = {30, 12};
  pr.idx_cap = 6;
  pr.idx = {0, 5, 5, 29, 30, -1, 3, 3, 3, 7, 8, 9, 11, 12, 100, 0, 0, 0, 4, 1, 2, 2, 2, 2};
  pr.counts = {6, 2, 3, 0};
  pr.q_len = 2;
  fp8_every_layout<kvsift::fp8_e4m3_t, kvsift::half_t>(pr, rng);
  Problem mixed;
  mixed.cap = 80;
  mixed.lengths = {70, 33};
  mixed.roles.set_sparse(1, true);
  mixed.gran = Granularity::kBlock;
  mixed.block = 16;
  mixed.idx_cap = 3;
  mixed.idx = {0, 0, 0, 4, 1, 4, 9, -3, 2, 2, 0, 1};
  mixed.counts = {3, 3, 3, 2};
  mixed.score_block = 32;
  mixed.q_len = 2;
  fp8_every_layout<kvsift::fp8_e4m3_t, bfloat16_t>(mixed, rng);
  fp8_every_layout<kvsift::fp8_e5m2_t, bfloat16_t>(mixed, rng);
}

TEST_CASE("decode_attention over fp8 KV: float queries, missing or mismatched scales are named errors") {
  std::vector<kvsift::fp8_e4m3_t> k(2 * 8 * 64), v(k.size());
  std::vector<float> s(16);
  std::vector<std::int32_t> len = {8};
  auto kv = kvsift::make_bhsd(k.data(), v.data(), 1, 2, 8, 64, len.data());
  std::vector<bfloat16_t> q(2 * 64), out(q.size());
  auto p = kvsift::make_decode_attention_params(q.data(), out.data(), 1, 2, 64);
  const kvsift::host::Exec exec{};
  auto st = kvsift::host::decode_attention(exec, kv, p);
  CHECK(st.code() == kvsift::StatusCode::kNullPointer);
  CHECK(st.message() == "kv.scales.k is null");
  kv.scales = kvsift::make_per_token_scales_for(kv, s.data(), s.data());
  REQUIRE(kvsift::host::decode_attention(exec, kv, p).ok());
  auto bad = kv;
  bad.scales.page_stride = 16;
  CHECK(kvsift::host::decode_attention(exec, bad, p).code() == kvsift::StatusCode::kInvalidArgument);
  std::vector<float> qf(2 * 64), of(qf.size());
  auto pf = kvsift::make_decode_attention_params(qf.data(), of.data(), 1, 2, 64);
  st = kvsift::host::decode_attention(exec, kv, pf);
  CHECK(st.code() == kvsift::StatusCode::kUnsupported);
  CHECK(st.message() == "fp8 KV needs bf16 or fp16 queries (got float32)");
  auto p32 = kvsift::make_decode_attention_params(q.data(), out.data(), 1, 2, 32);
  auto kv32 = kvsift::make_bhsd(k.data(), v.data(), 1, 2, 8, 32, len.data());
  kv32.scales = kv.scales;
  CHECK(kvsift::host::decode_attention(exec, kv32, p32).message() == "head_dim = 32 is not supported (64, 128 or 256)");
}

TEST_CASE("decode_attention host reference: a block-table id outside the page pool is a named error, not a crash") {
  // 2 sequences of 40 tokens in pages of 16: 3 pages each out of a pool of 6; sequence 1's second page
  // id is 99.
  constexpr int kPage = 16, kPool = 6, kD = 64;
  std::vector<float> k(std::size_t(kPool) * kPage * kD, 0.5f), v(k.size(), 0.25f), q(2 * 2 * kD, 1.f), out(q.size());
  std::vector<std::int32_t> table = {0, 1, 2, 3, 99, 5}, lengths = {40, 40};
  auto kv = kvsift::make_paged(k.data(), v.data(), table.data(), 2, 3, kPool, 1, kPage, kD, kvsift::PageLayout::kNHD,
                               lengths.data());
  const auto p = kvsift::make_decode_attention_params(q.data(), out.data(), 1, 2, kD);
  auto st = kvsift::host::decode_attention(kvsift::host::Exec{}, kv, p);
  CHECK(st.code() == kvsift::StatusCode::kInvalidArgument);
  CHECK(st.message() == "kv.block_table[1][1] = 99 is outside the page pool [0, 6)");
  table[4] = 4;
  CHECK(kvsift::host::decode_attention(kvsift::host::Exec{}, kv, p).ok());
}

TEST_CASE("decode_attention plan: invariants over random shapes, devices and roles (cluster and merge-kernel plans)") {
  // What the launch relies on, for any plan: one wave or every head at its floor; chunks that cover
  // the heads; a cluster plan only on sm_90 with clusters, every role at the same count of <= 8 splits,
  // at most one block per SM and an empty workspace; a merge-kernel plan whose merge grid covers every
  // split; and a workspace query (for the largest batch) that covers this batch's carve.
  using kvsift::bfloat16_t;
  namespace d = kvsift::detail;
  auto rng = kvsift_test::make_rng(402);
  auto pick = [&](int lo, int hi) { return int(std::uniform_int_distribution<int>(lo, hi)(rng)); };
  std::vector<std::int32_t> idx(1), cnt(1);
  int clustered = 0, merged = 0, backfilled = 0;
  for (int it = 0; it < 4000; ++it) {
    const int b = pick(1, 12), hkv = 1 << pick(0, 3), group = 1 << pick(0, 3), q_len = pick(1, 3);
    const int hd = 64 << pick(0, 2), S = pick(0, 1) ? pick(1, 4096) : pick(1, 200000);
    kvsift::DeviceFacts dev{pick(1, 200), 227 * 1024, pick(0, 3) != 0, pick(0, 3) != 0 ? 9 : 8, 0};
    auto kv = kvsift::make_bhsd<bfloat16_t>(reinterpret_cast<bfloat16_t*>(256), reinterpret_cast<bfloat16_t*>(256), b, hkv, S,
                                            hd, reinterpret_cast<const std::int32_t*>(256));
    auto p = kvsift::make_decode_attention_params<bfloat16_t>(reinterpret_cast<bfloat16_t*>(256),
                                                              reinterpret_cast<bfloat16_t*>(256), q_len, hkv * group, hd);
    if (pick(0, 3) == 0) p.max_kv_length = pick(1, S);
    const int roles = pick(0, 2);  // all retrieval, all sparse, or mixed
    if (roles > 0) {
      const int block = pick(0, 1) ? 1 : 16 << pick(0, 2);
      const int cap = pick(1, 5000 / block + 1);
      idx.assign(std::size_t(b) * hkv * cap, 0);
      cnt.assign(std::size_t(b) * hkv, cap);
      auto set = kvsift::make_index_set(idx.data(), cnt.data(), b * hkv, cap,
                                        block > 1 ? Granularity::kBlock : Granularity::kToken, block);
      p.index_set = kvsift::as_const(set);
      p.roles = kvsift::HeadRoleMask::all_sparse(hkv);
      if (roles == 2) p.roles.set_sparse(pick(0, hkv - 1), false);
    }
    if (pick(0, 4) == 0) {
      p.scores = reinterpret_cast<float*>(256);
      p.score_block_size = pick(0, 1) ? 1 : 64;
      p.score_row_stride = (S + p.score_block_size - 1) / p.score_block_size + 1;
    }
    CAPTURE(it);
    CAPTURE(b);
    CAPTURE(S);
    CAPTURE(hkv);
    CAPTURE(group);
    CAPTURE(hd);
    CAPTURE(q_len);
    CAPTURE(roles);
    CAPTURE(dev.num_sms);
    CAPTURE(dev.clusters);
    d::DecodePlan plan;
    const auto st = d::plan_decode_attention(dev, kv, p, &plan);
    if (!st.ok()) continue;  // a combination the contract rejects (e.g. scores with sparse heads)
    CHECK(plan.chunk % d::kDecodeCtaTokens == 0);
    CHECK(plan.sparse_chunk % d::kDecodeCtaTokens == 0);
    if (plan.num_retrieval > 0) CHECK(std::int64_t(plan.retrieval_splits) * plan.chunk >= plan.max_len);
    if (plan.num_sparse > 0) CHECK(std::int64_t(plan.sparse_splits) * plan.sparse_chunk >= plan.sparse_tokens);
    CHECK(plan.ctas_per_tile == plan.num_retrieval * plan.retrieval_splits + plan.num_sparse * plan.sparse_splits);
    const std::int64_t blocks = std::int64_t(b) * plan.row_tiles * plan.ctas_per_tile;
    if (plan.backfill) {
      ++backfilled;
      CHECK(plan.cluster <= 1);
      CHECK(plan.num_retrieval > 0);
      CHECK(plan.num_sparse > 0);
      const std::int64_t wave = std::int64_t(dev.num_sms) * d::decode_ctas_per_sm(true, hd, hd * 2);
      const std::int64_t retrieval_blocks = std::int64_t(b) * plan.row_tiles * plan.num_retrieval * plan.retrieval_splits;
      CHECK(wave >= 2 * dev.num_sms);
      CHECK(retrieval_blocks < wave);
      CHECK(blocks > wave);
      CHECK(plan.chunk <= d::kDecodeMaxChunk);
      CHECK(plan.sparse_chunk <= d::kDecodeMaxChunk);
      CHECK(plan.retrieval_splits <= d::kDecodeMaxSplits);
      CHECK(plan.sparse_splits <= d::kDecodeMaxSplits);
    }
    if (plan.cluster > 1) {
      ++clustered;
      CHECK(dev.clusters);
      CHECK(dev.cc_major >= 9);
      CHECK(plan.cluster <= d::kDecodeMaxClusterSplits);
      if (plan.num_retrieval > 0) CHECK(plan.retrieval_splits == plan.cluster);
      if (plan.num_sparse > 0) CHECK(plan.sparse_splits == plan.cluster);
      CHECK(plan.ctas_per_tile % plan.cluster == 0);  // grid.x holds whole clusters, one head each
      CHECK(blocks <= dev.num_sms);
      CHECK_FALSE(plan.merge_kernel());
      CHECK(plan.workspace_bytes() == 0);
      CHECK(plan.chunk <= d::kDecodeMaxChunk);
      CHECK(plan.sparse_chunk <= d::kDecodeMaxChunk);
    } else {
      CHECK(plan.cluster == 0);
      if (plan.merge_kernel()) {
        ++merged;
        CHECK(plan.merge_parts * d::kDecodeMergeBatch >= std::max(plan.retrieval_splits, plan.sparse_splits));
        CHECK(plan.merge_blocks_per_head * (d::kDecodeMergeThreads / plan.merge_parts) >= plan.row_tile * hd / 4);
      }
    }
    std::size_t query = 0;
    H200Facts facts;
    facts.device = dev;
    REQUIRE(kvsift::decode_attention_workspace_bytes(facts, kv, p, &query).ok());
    CHECK(query >= plan.workspace_bytes());
  }
  MESSAGE("random plans: " << clustered << " merge in clusters, " << merged << " in the merge kernel, " << backfilled
                            << " backfill");
  if (d::kDecodeBackfill) CHECK(backfilled > 10);
  else CHECK(backfilled == 0);
  CHECK(clustered > 100);
  CHECK(merged > 100);
}
