// GPU fuzz, top-k: cuda::topk against host::topk, exactly (indices, counts and the values' bits), on
// random small shapes through the shared harness of the top-k GPU tests (gpu/topk_gpu_support.cuh:
// inputs, reference, poisoned device outputs, comparison). Drawn per case: fp32 / fp16 / bf16,
// rows 1-40, columns 1-9000 (sometimes 1-4, sometimes 1-8 rows of 16K-140K columns: the CTA-group
// paths and their sampled bracket), a padded row stride, every value fill of the harness (ties,
// +-inf, NaN, all-NaN, signed zeros, constant rows, leading-bit ladders, and the fills that put the
// high keys where the bracket's stride sample looks or just beside it), lengths and per-row k outside
// their ranges, forced sink / recent, flag-first keys, LycheeDecode's row filter, and device facts
// that force the radix select or CTA groups.
//
// Family weight 0.25 of test_fuzz_gpu's cases and seconds.

#include "gpu/topk_gpu_support.cuh"
#include "support/fuzz.hpp"

namespace {

namespace fz = kvsift_test::fuzz;
using fz::chance;
using fz::pick;
using namespace kvsift_topk_test;

std::string describe(const Case& c) {
  std::string s = "topk rows=" + std::to_string(c.rows) + " cols=" + std::to_string(c.cols) + " pad=" +
                  std::to_string(c.stride_pad) + " cap=" + std::to_string(c.capacity) + " k=" + std::to_string(c.params.k) +
                  " sink=" + std::to_string(c.params.sink) + " recent=" + std::to_string(c.params.recent) +
                  " fill=" + std::to_string(int(c.fill)) + " flagged=" + std::to_string(c.flagged) +
                  " facts=" + std::to_string(int(c.facts)) + " filter_heads=" + std::to_string(c.params.num_kv_heads) +
                  " lengths=";
  for (int l : c.lengths) s += std::to_string(l) + ",";
  s += " per_row_k=";
  for (int k : c.per_row_k) s += std::to_string(k) + ",";
  return s;
}

Case draw_case(std::mt19937_64& rng) {
  Case c;
  c.rows = pick(rng, 1, 40);
  const int u = pick(rng, 0, 19);
  c.cols = u == 0 ? pick(rng, 1, 4) : u == 1 ? pick(rng, 16384, 140000) : pick(rng, 1, 9000);
  if (u == 1) c.rows = pick(rng, 1, 8);  // long rows, few of them: CTA groups, the bracket where they fit one wave
  c.stride_pad = chance(rng, 30) ? pick(rng, 1, 9) : 0;
  c.capacity = chance(rng, 20) ? pick(rng, 1, 8) : pick(rng, 1, std::min(c.cols + 16, 4096));
  c.params.k = pick(rng, 0, c.capacity);
  if (chance(rng, 30)) {
    c.params.sink = pick(rng, 0, c.capacity / 2);
    c.params.recent = pick(rng, 0, c.capacity - c.params.sink);
  }
  if (chance(rng, 60))
    for (int r = 0; r < c.rows; ++r) c.lengths.push_back(chance(rng, 10) ? pick(rng, -9, -1) : pick(rng, 0, c.cols + 9));
  if (chance(rng, 40))
    for (int r = 0; r < c.rows; ++r) c.per_row_k.push_back(pick(rng, -3, c.capacity + 9));
  if (chance(rng, 20)) {
    c.params.num_kv_heads = pick(rng, 1, 8);
    for (int h = 0; h < c.params.num_kv_heads; ++h) c.params.roles.set_sparse(h, chance(rng, 50));
  }
  c.fill = Fill(pick(rng, 0, int(Fill::kStrideHigh)));
  c.flagged = chance(rng, 25);
  c.facts = Case::Facts(pick(rng, 0, 3));
  return c;
}

}  // namespace

TEST_CASE("fuzz gpu: topk against the host reference") {
  for (fz::Family f("gpu topk", 0.25, "fuzz gpu: topk against the host reference"); f.next();) {
    auto rng = f.rng();
    const Case c = draw_case(rng);
    INFO(f.replay());
    INFO(describe(c));
    switch (f.index() % 3) {
      case 0: check_filtered_case<float>(rng, c); break;
      case 1: check_filtered_case<kvsift::bfloat16_t>(rng, c); break;
      default: check_filtered_case<kvsift::half_t>(rng, c); break;
    }
  }
}
