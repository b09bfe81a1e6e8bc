// cuda::topk with score candidates (ops/score_candidates.hpp): lists built here as decode_attention's
// score pass builds them (segments of S positions, in shuffled order, a tag, counts), at thresholds
// that list exactly the budget, more, too few or more than the list's room, and stale or missing
// lists. Every result is compared with the host reference. Where the list holds the budget, the
// unlisted scores are then raised on the device to values the full search would select: an equal
// result shows the list was used; elsewhere they stay as the reference saw them. The row's next
// threshold and the cleared tag are checked too.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "topk_gpu_support.cuh"

using namespace kvsift_topk_test;
using kvsift::detail::TopkKernel;

namespace {

enum class Listing {
  kExact,      // the threshold lists exactly the scored region's budget-th key and what ties with it
  kMore,       // a threshold a few thousand keys lower
  kTooFew,     // just above the budget-th key, fewer listed than the budget: the full search
  kOverflow,   // more than the list's room: the full search
  kStale,      // a whole list whose tag was cleared: ignored
  kNone,       // NaN threshold: nothing listed
};

struct Lists {
  std::vector<float> thresholds;
  std::vector<std::int32_t> counts, positions;
  int count_stride = 0;
  std::vector<char> listed;  // [rows * stride]: position listed
  std::vector<char> usable;  // row: the list holds the budget (the unlisted scores may be raised)
};

// The row's region scores' threshold for listing `want` keys (>= 1): the want-th largest (NaN lowest).
float threshold_for(const std::vector<float>& region, int want) {
  std::vector<float> v;
  for (float x : region)
    if (!std::isnan(x)) v.push_back(x);
  if (v.empty() || want < 1) return std::numeric_limits<float>::quiet_NaN();
  want = std::min<int>(want, int(v.size()));
  std::nth_element(v.begin(), v.begin() + (want - 1), v.end(), std::greater<float>());
  const float t = v[want - 1];
  return t == -std::numeric_limits<float>::infinity() ? std::numeric_limits<float>::quiet_NaN() : t;
}

Lists make_lists(std::mt19937_64& rng, const Case& c, const Inputs<float>& in, Listing how, int segment) {
  Lists l;
  const int segments_max = (c.cols + 63) / 64;
  l.count_stride = kvsift::score_candidate_count_stride(segments_max);
  l.thresholds.assign(c.rows, std::numeric_limits<float>::quiet_NaN());
  l.counts.assign(std::size_t(c.rows) * l.count_stride, 0);
  l.positions.assign(std::size_t(c.rows) * in.stride, -7);
  l.listed.assign(std::size_t(c.rows) * in.stride, 0);
  l.usable.assign(c.rows, 0);
  const int segments_written = (c.cols + segment - 1) / segment;
  for (int r = 0; r < c.rows; ++r) {
    const int len = c.lengths.empty() ? c.cols : std::clamp(c.lengths[r], 0, c.cols);
    const int k = c.per_row_k.empty() ? c.params.k : c.per_row_k[r];
    const kvsift::TopKRowPlan plan = kvsift::plan_topk_row(c.cols, len, k, c.capacity, c.params.sink, c.params.recent);
    std::vector<float> region(in.scores.begin() + r * in.stride + plan.sink_end,
                              in.scores.begin() + r * in.stride + plan.recent_begin);
    float t = std::numeric_limits<float>::quiet_NaN();
    switch (how) {
      case Listing::kExact: t = threshold_for(region, plan.budget); break;
      case Listing::kMore: t = threshold_for(region, plan.budget + kvsift_test::uniform_int(rng, 1, 3000)); break;
      // Just above the budget-th key: fewer than the budget listed (a complete list all the same).
      case Listing::kTooFew: t = std::nextafter(threshold_for(region, plan.budget), std::numeric_limits<float>::infinity()); break;
      case Listing::kOverflow: t = threshold_for(region, 20000); break;
      case Listing::kStale: t = threshold_for(region, plan.budget + 100); break;
      case Listing::kNone: break;
    }
    l.thresholds[r] = t;
    std::int32_t* counts = l.counts.data() + std::size_t(r) * l.count_stride;
    counts[0] = how == Listing::kStale ? 0 : std::int32_t(kvsift::kScoreCandidateTagLo);
    counts[1] = std::int32_t(kvsift::kScoreCandidateTagHi);
    counts[2] = segment;
    counts[3] = segments_written;
    for (int j = 0; j < segments_written; ++j) {
      std::vector<std::int32_t> seg;
      for (int p = j * segment; p < std::min((j + 1) * segment, len); ++p) {
        const float s = in.scores[r * in.stride + p];
        if (s >= t && t > -std::numeric_limits<float>::infinity()) seg.push_back(p);  // as the pass lists
      }
      std::shuffle(seg.begin(), seg.end(), rng);
      counts[kvsift::kScoreCandidateHeader + j] = std::int32_t(seg.size());
      for (std::size_t i = 0; i < seg.size(); ++i) {
        l.positions[r * in.stride + j * segment + i] = seg[i];
        l.listed[r * in.stride + seg[i]] = 1;
      }
    }
    // Usable as the kernel decides it, conservatively: the segments wholly inside the region hold
    // the budget, and the whole list fits the register select's room (8192 keys at 128K, more below).
    int inner = 0, total = 0;
    for (int j = 0; j < (len + segment - 1) / segment; ++j) {
      const int n = counts[kvsift::kScoreCandidateHeader + j];
      total += n;
      if (j * segment >= plan.sink_end && (j + 1) * segment <= plan.recent_begin) inner += n;
    }
    l.usable[r] = how != Listing::kStale && !std::isnan(t) && inner >= plan.budget && total <= 8192 && plan.budget > 0 &&
                  plan.budget < plan.region();
  }
  return l;
}

// One case under one listing: the reference on the scores, then the device with the list (unlisted
// scores raised where the list is usable), outputs poisoned, then the tag and the next threshold.
void check_listing(std::mt19937_64& rng, Case c, Listing how, int segment) {
  CAPTURE(int(how));
  CAPTURE(segment);
  REQUIRE(plan_of<float>(c).kernel == TopkKernel::kRegisterSelect);
  Inputs<float> in = make_inputs<float>(rng, c);
  const Result want = reference(c, in);
  Lists l = make_lists(rng, c, in, how, segment);
  for (int r = 0; r < c.rows; ++r) {
    if (!l.usable[r] || kvsift::topk_skips_row(c.params, r)) continue;
    const int len = c.lengths.empty() ? c.cols : std::clamp(c.lengths[r], 0, c.cols);
    const int k = c.per_row_k.empty() ? c.params.k : c.per_row_k[r];
    const kvsift::TopKRowPlan plan = kvsift::plan_topk_row(c.cols, len, k, c.capacity, c.params.sink, c.params.recent);
    for (int p = plan.sink_end; p < plan.recent_begin; ++p)  // the forced positions' values are output too
      if (!l.listed[r * in.stride + p]) in.scores[r * in.stride + p] = 1e30f;  // the full search would take these
  }
  DeviceCase<float> dev(c, in);
  DeviceBuffer<float> thresholds(l.thresholds);
  DeviceBuffer<std::int32_t> counts(l.counts), positions(l.positions);
  dev.poison();
  c.params.candidates.thresholds = thresholds.get();
  c.params.candidates.counts = counts.get();
  c.params.candidates.positions = positions.get();
  c.params.candidates.count_stride = l.count_stride;
  const kvsift::Status st = dev.launch(c, in.stride, nullptr);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  kvsift_test::sync_and_check();
  const Result got = dev.download();
  require_equal(c, want, got, 2);
  const std::vector<float> next = thresholds.download();
  const std::vector<std::int32_t> counts_after = counts.download();
  for (int r = 0; r < c.rows; ++r) {
    if (kvsift::topk_skips_row(c.params, r)) continue;
    INFO("row ", r);
    const int len = c.lengths.empty() ? c.cols : std::clamp(c.lengths[r], 0, c.cols);
    const int k = c.per_row_k.empty() ? c.params.k : c.per_row_k[r];
    const kvsift::TopKRowPlan plan = kvsift::plan_topk_row(c.cols, len, k, c.capacity, c.params.sink, c.params.recent);
    REQUIRE(counts_after[std::size_t(r) * l.count_stride] == 0);  // a list is read once
    if (plan.budget == 0 || plan.budget == plan.region()) continue;
    // The next threshold lists at least what this step selected: it is NaN or at most the budget-th
    // key's score (the last region entry of the reference in key order).
    float kth = std::numeric_limits<float>::infinity();
    for (int j = 0; j < want.counts[r]; ++j) {
      const int p = want.indices[std::size_t(r) * c.capacity + j];
      if (p >= plan.sink_end && p < plan.recent_begin) kth = std::min(kth, in.scores[r * in.stride + p]);
    }
    if (!std::isnan(next[r])) REQUIRE(next[r] <= kth);
  }
}

Case with_lengths(std::mt19937_64& rng, Case c, int sink, int recent) {
  c.params.sink = std::min(sink, c.capacity / 4);  // forced positions must fit the output
  c.params.recent = std::min(recent, c.capacity / 4);
  c.lengths.resize(c.rows);
  for (auto& n : c.lengths) n = kvsift_test::uniform_int(rng, c.cols / 2, c.cols);
  return c;
}

void check_shape(std::mt19937_64& rng, const Case& base) {
  CAPTURE(base.rows);
  CAPTURE(base.cols);
  CAPTURE(base.params.k);
  const int segments[] = {64, 256, 1024, 4096};
  const Listing all[] = {Listing::kExact, Listing::kMore, Listing::kTooFew, Listing::kOverflow, Listing::kStale, Listing::kNone};
  int i = 0;
  // Under a sanitizer: the listed select (exact list, ragged rows) and the full search's threshold.
  const int listings = kvsift_test::repetitions(6, 2);
  for (int n = 0; n < listings; ++n) {
    const Listing how = n == 1 && listings == 2 ? Listing::kTooFew : all[n];
    Case c = base;
    check_listing(rng, c, how, segments[i++ % 4]);
    check_listing(rng, with_lengths(rng, c, 128, 256), how, segments[i++ % 4]);
  }
  if (kvsift_test::under_tool()) return;
  for (Fill f : {Fill::kFewValues, Fill::kLeadingBits, Fill::kNaNs, Fill::kInfinities, Fill::kSignedZeros, Fill::kConstant}) {
    Case c = base;
    c.fill = f;
    check_listing(rng, c, Listing::kExact, segments[i++ % 4]);
    check_listing(rng, c, Listing::kMore, segments[i++ % 4]);
  }
}

}  // namespace

TEST_CASE("topk gpu candidates: one and four rows of 128K, groups of 16") {
  auto rng = kvsift_test::make_rng(901);
  check_shape(rng, shape(1, 131072, 4096, 4096));
  check_shape(rng, shape(4, 131072, 4096, 1000));
}

TEST_CASE("topk gpu candidates: eight rows of 128K and 32K, k from 1 to 8000") {
  auto rng = kvsift_test::make_rng(902);
  check_shape(rng, shape(8, 131072, 8192, 4096));
  check_shape(rng, shape(8, 32768, 8192, 8000));
  check_shape(rng, shape(3, 16384, 64, 1));
  check_shape(rng, shape(5, 100000, 2048, 2000));
}

TEST_CASE("topk gpu candidates: the row filter (LycheeDecode's retrieval rows) and per-row budgets") {
  auto rng = kvsift_test::make_rng(903);
  Case c = shape(16, 65536, 4096, 4096);
  c.params.num_kv_heads = 8;
  c.params.roles = kvsift::HeadRoleMask::all_retrieval();
  for (int h = 0; h < 8; ++h)
    if (h != 2 && h != 5) c.params.roles.set_sparse(h, true);
  c.per_row_k.resize(c.rows);
  for (auto& k : c.per_row_k) k = kvsift_test::uniform_int(rng, 0, 4096);
  for (Listing how : {Listing::kExact, Listing::kMore, Listing::kTooFew, Listing::kNone})
    check_listing(rng, with_lengths(rng, c, 4, 64), how, 512);
}

TEST_CASE("topk gpu candidates: refused for other keys and types, and without all three pointers") {
  DeviceBuffer<float> scores(1024), thresholds(1);
  DeviceBuffer<std::int32_t> indices(64), counts(64), list(1024);
  const auto view = kvsift::make_strided_view<const float>(scores.get(), 1, 1024, 1024);
  const auto out = kvsift::make_index_set(indices.get(), counts.get(), 1, 64);
  const auto exec = kvsift::cuda::Exec::for_current_device(nullptr);
  kvsift::TopKParams p;
  p.k = 8;
  p.candidates.thresholds = thresholds.get();
  p.candidates.count_stride = 18;
  kvsift::Status st = kvsift::cuda::topk(exec, view, p, out);
  REQUIRE(st.code() == kvsift::StatusCode::kInvalidArgument);
  CHECK(st.message().find("counts and positions") != std::string::npos);
  p.candidates.counts = counts.get();
  p.candidates.positions = list.get();
  st = kvsift::cuda::topk(exec, view, p, out);
  REQUIRE(st.code() == kvsift::StatusCode::kInvalidArgument);  // 18 is not a multiple of 4
  p.candidates.count_stride = 24;
  REQUIRE(kvsift::cuda::topk(exec, view, p, out).ok());
  kvsift::FlagFirstKey<float> flagged;
  DeviceBuffer<std::uint8_t> flags(1024);
  flagged.flags = flags.get();
  flagged.row_stride = 1024;
  st = kvsift::cuda::topk(exec, view, p, out, static_cast<float*>(nullptr), flagged);
  REQUIRE(st.code() == kvsift::StatusCode::kInvalidArgument);
  CHECK(st.message().find("ScoreKey<float>") != std::string::npos);
  kvsift_test::sync_and_check();
}
