// cuda::topk against host::topk with exact equality, per launch path: every kernel, CTA group size and
// CTA size the plan can pick is forced by shape (or by the device facts a test hands the plan), the
// test REQUIREs that the plan picked it, then runs it over adversarial fills (ties, all-equal rows,
// all-NaN rows, +-inf, signed zeros), every dtype, both key policies and rows at the length and
// budget edges. Outputs are poisoned before every run. The contract-level cases (forced ranges, row
// filter, determinism, graphs, errors) are in test_topk_gpu_contract.cu.

#include <initializer_list>

#include "topk_gpu_support.cuh"

using kvsift::bfloat16_t;
using kvsift::half_t;
using kvsift::detail::TopkKernel;
using namespace kvsift_topk_test;

namespace {

constexpr TopkKernel kCand = TopkKernel::kCandidateSelect;
constexpr TopkKernel kRadix = TopkKernel::kRadixSelect;
constexpr TopkKernel kReg = TopkKernel::kRegisterSelect;
constexpr TopkKernel kShort = TopkKernel::kShortRowSelect;

// The edge rows of one path under the fills that stress it most (under a sanitizer the first two).
template <class T>
void check_edges(std::mt19937_64& rng, Case c) {
  for_fills({Fill::kRandom, Fill::kConstant, Fill::kFewValues, Fill::kAllNaN}, 2, [&](Fill f) {
    c.fill = f;
    CAPTURE(int(f));
    check_case<T>(rng, c);
  });
}

Case with_facts(Case c, Case::Facts f) {
  c.facts = f;
  return c;
}

// Each fill twice: with the plan's sampled bracket and with the exact search alone (bracket off).
// Under a sanitizer the first two fills only (the callers list the ones the sample misreads first).
void check_with_and_without_bracket(std::mt19937_64& rng, Case c, std::initializer_list<Fill> fills) {
  for_fills(fills, 2, [&](Fill f) {
    c.fill = f;
    CAPTURE(int(f));
    c.bracket = true;
    check_case<float>(rng, c);
    c.bracket = false;
    check_case<float>(rng, c);
  });
}

// LycheeDecode's forced ranges (sink 128 and recent 256 tokens, or a quarter of the budget each) over
// ragged rows of random lengths in [0, cols].
Case with_forced_ranges(std::mt19937_64& rng, Case c) {
  c.params.sink = 128 < c.capacity / 4 ? 128 : c.capacity / 4;
  c.params.recent = 256 < c.capacity / 4 ? 256 : c.capacity / 4;
  for (int r = 0; r < c.rows; ++r) c.lengths.push_back(kvsift_test::uniform_int(rng, 0, c.cols));
  return c;
}

// The CTA-group plan alone (no register or short-row select): the candidate select on their shapes.
Case cta_group_plan(Case c) {
  c.register_kernels = false;
  return c;
}

}  // namespace

TEST_CASE("topk gpu paths: candidate select, one 256-thread CTA per row (block scores)") {
  // The short-row select takes these shapes by default; here the CTA-group plan alone.
  auto rng = kvsift_test::make_rng(501);
  for (int rows : {8, 300}) {
    const Case c = cta_group_plan(shape(rows, 2048, 64, 64));
    require_path<float>(c, kCand, 1, 256);
    check_all_fills<float>(rng, c);
  }
  const Case edges = cta_group_plan(edge_rows(rng, 70, 2048, 80));
  require_path<float>(edges, kCand, 1, 256);
  check_edges<float>(rng, edges);
  const Case small = cta_group_plan(shape(40, 37, 8, 5));  // a slice far below one load per thread
  require_path<float>(small, kCand, 1, 256);
  check_all_fills<float>(rng, small);
}

TEST_CASE("topk gpu paths: short-row select, one 256-thread CTA per row of up to 4096 positions") {
  auto rng = kvsift_test::make_rng(513);
  // The block-score shapes (8 keys a thread) and rows of 2049-4096 positions (16 keys a thread).
  for (const Case& c : {shape(8, 2048, 64, 64), shape(300, 2048, 64, 64), shape(3, 4096, 4096, 4095),
                       shape(5, 3000, 1024, 700), shape(2, 2049, 2048, 2047)}) {
    require_path<float>(c, kShort, 1, 256);
    check_all_fills<float>(rng, c);
    check_edges<float>(rng, edge_rows(rng, c.rows < 70 ? 70 : c.rows, c.cols, c.capacity));
  }
  // Rows far below one load a thread, rows of one and two positions, k = len - 1, budgets at both ends.
  for (const Case& c : {shape(40, 37, 8, 5), shape(9, 1, 1, 1), shape(9, 2, 2, 1), shape(4, 2048, 2048, 2047),
                       shape(4, 2048, 2048, 1), shape(4, 4096, 4096, 4096)}) {
    require_path<float>(c, kShort, 1, 256);
    check_all_fills<float>(rng, c);
  }
  // Unaligned rows (scalar loads), ragged lengths with forced sink and recent ranges (the row filter on
  // this path: test_topk_gpu_contract's short rows).
  Case odd = shape(7, 2047, 300, 200);
  odd.stride_pad = 3;
  require_path<float>(odd, kShort, 1, 256);
  check_all_fills<float>(rng, odd);
  Case forced = shape(16, 4000, 512, 400);
  forced.params.sink = 64;
  forced.params.recent = 128;
  for (int r = 0; r < forced.rows; ++r) forced.lengths.push_back(kvsift_test::uniform_int(rng, 0, forced.cols));
  require_path<float>(forced, kShort, 1, 256);
  check_all_fills<float>(rng, forced);
  // fp16 and bf16 scores (16-bit keys: two rounds), flag-first keys (17 bits in uint32, 33 in uint64).
  for (const Case& base : {shape(64, 2048, 64, 64), shape(5, 4096, 1000, 999)}) {
    Case c = base;
    require_path<half_t>(c, kShort, 1, 256);
    check_all_fills<half_t>(rng, c);
    check_all_fills<bfloat16_t>(rng, c);
    c.flagged = true;
    require_path<half_t>(c, kShort, 1, 256);
    check_all_fills<half_t>(rng, c);
    check_all_fills<bfloat16_t>(rng, c);
    // 33-bit flag-first keys of fp32 scores: 64-bit keys in registers, three rounds.
    require_path<float>(c, kShort, 1, 256);
    check_all_fills<float>(rng, c);
    Case edges = edge_rows(rng, 70, c.cols, c.capacity);
    edges.flagged = true;
    check_edges<float>(rng, edges);
  }
  check_case<__half>(rng, shape(8, 2048, 64, 64));
  check_case<__nv_bfloat16>(rng, shape(8, 2048, 64, 64));
}

TEST_CASE("topk gpu paths: candidate select, one 512-thread CTA per row") {
  auto rng = kvsift_test::make_rng(502);
  const Case c = shape(300, 8192, 512, 500);
  require_path<float>(c, kCand, 1, 512);
  check_all_fills<float>(rng, c);
  const Case edges = edge_rows(rng, 280, 8192, 600);
  require_path<float>(edges, kCand, 1, 512);
  check_edges<float>(rng, edges);
  // 32768-position slices: more than the eight 16-byte preloads per thread, the rest loaded after.
  const Case wide = with_facts(shape(6, 32768, 4096, 4000), Case::Facts::kNoClusters);
  require_path<float>(wide, kCand, 1, 512);
  check_all_fills<float>(rng, wide);
  check_edges<float>(rng, with_facts(edge_rows(rng, 14, 32768, 4096), Case::Facts::kNoClusters));
}

TEST_CASE("topk gpu paths: candidate select, CTA groups of 2 and 4") {
  auto rng = kvsift_test::make_rng(503);
  const Case two = with_facts(shape(3, 32768, 4096, 4096), Case::Facts::kFewSms);
  require_path<float>(two, kCand, 2, 512);
  check_all_fills<float>(rng, two);
  // One row of 64K: 64 KiB slices need groups of 4 (the 4-SM device has no room to grow them further).
  const Case four = with_facts(shape(1, 65536, 2048, 1024), Case::Facts::kFewSms);
  require_path<float>(four, kCand, 4, 512);
  check_all_fills<float>(rng, four);
  // 3 rows x 2 CTAs fit one wave of the 4-SM device (7 CTA slots); more would stream.
  const Case edges2 = with_facts(edge_rows(rng, 3, 32768, 4096), Case::Facts::kFewSms);
  require_path<float>(edges2, kCand, 2, 512);
  check_edges<float>(rng, edges2);
  // 64 rows of 32K on the real device: groups of 2, 16384-position slices (256 rows stream instead).
  Case many = shape(64, 32768, 4096, 4096);
  require_path<float>(many, kCand, 2, 512);
  check_case<float>(rng, many);
}

TEST_CASE("topk gpu paths: candidate select, CTA groups of 8") {
  auto rng = kvsift_test::make_rng(504);
  // The few-row shapes go to the register select by default; here the CTA-group plan alone.
  const Case c = cta_group_plan(shape(3, 131072, 4096, 4096));  // 16384-position slices
  require_path<float>(c, kCand, 8, 512);
  check_all_fills<float>(rng, c);
  const Case mid = cta_group_plan(shape(12, 32768, 2048, 1024));  // 4096-position slices; one CTA per SM
  require_path<float>(mid, kCand, 8, 512);
  check_all_fills<float>(rng, mid);
  const Case edges = cta_group_plan(edge_rows(rng, 14, 131072, 4096));
  require_path<float>(edges, kCand, 8, 512);
  check_edges<float>(rng, edges);
  const Case longest = shape(2, 262144, 4096, 4096);  // 32768-position slices: the load loop continues
  require_path<float>(longest, kCand, 8, 512);
  check_case<float>(rng, longest);
  Case odd = cta_group_plan(shape(5, 32771, 1500, 1500));  // rows not 16-byte aligned: scalar loads
  odd.stride_pad = 3;
  require_path<float>(odd, kCand, 8, 512);
  check_all_fills<float>(rng, odd);
  Case tail = shape(6, 10001, 700, 650);  // aligned rows whose last vector passes the columns
  tail.stride_pad = 3;
  check_all_fills<float>(rng, tail);
}

namespace {

// The CTA-group plan's sampled bracket on one few-row shape (groups of 8, 512 threads, a list of 8192
// keys): every fill, the fills the stride sample misreads (the bracket misses and the digit searches
// run) with the bracket and without it, LycheeDecode's forced ranges over ragged rows, the row edges.
void check_sampled_bracket(std::mt19937_64& rng, const Case& base) {
  CAPTURE(base.rows);
  CAPTURE(base.cols);
  require_path<float>(base, kCand, 8, 512);
  require_bracket<float>(base, 8192);
  check_all_fills<float>(rng, base);
  check_with_and_without_bracket(rng, base, {Fill::kSampledHigh, Fill::kStrideHigh, Fill::kRandom, Fill::kConstant});
  check_all_fills<float>(rng, with_forced_ranges(rng, base));
  check_edges<float>(rng, cta_group_plan(edge_rows(rng, base.rows, base.cols, base.capacity)));
}

}  // namespace

// The sampled bracket is split into three cases so that each fits one racecheck run (docs/testing.md;
// whole, it was cut at 150 s alone on an H100). The few-row shapes of the benchmark: groups of 8 with
// 4096- and 16384-position slices, and 100000-position rows (a short last slice); the register select
// takes these shapes by default. 32 rows of 32K (groups of 2: smaller groups lose with the bracket)
// keep the digit searches.
TEST_CASE("topk gpu paths: candidate select in CTA groups, the sampled bracket and its fallback (32K and 100000 positions)") {
  auto rng = kvsift_test::make_rng(508);
  {
    const Case wide = shape(32, 32768, 4096, 4096);
    REQUIRE(plan_of<float>(wide).bracket_capacity == 0);
  }
  for (const Case& base : {cta_group_plan(shape(8, 32768, 1024, 1024)), cta_group_plan(shape(3, 100000, 2048, 2000))})
    check_sampled_bracket(rng, base);
}

TEST_CASE("topk gpu paths: candidate select in CTA groups, the sampled bracket and its fallback (128K and 64K positions)") {
  auto rng = kvsift_test::make_rng(522);
  for (const Case& base : {cta_group_plan(shape(8, 131072, 4096, 4096)), cta_group_plan(shape(2, 65536, 8, 7))})
    check_sampled_bracket(rng, base);
}

TEST_CASE("topk gpu paths: candidate select in CTA groups, the sampled bracket at the budget's ends and on narrow and flag-first keys") {
  auto rng = kvsift_test::make_rng(523);
  // Budgets at both ends of the region (a bracket of one rank; one not there at all).
  for (int k : {1, 2, 32767, 32766, 16384}) {
    Case c = cta_group_plan(shape(8, 32768, 32768, k));
    CAPTURE(k);
    require_bracket<float>(c, 1);
    check_case<float>(rng, c);
    c.fill = Fill::kFewValues;
    check_case<float>(rng, c);
  }
  // 16- and 19-bit keys, flag-first 33-bit keys in uint64 (a list of 4096 keys).
  Case half_rows = cta_group_plan(shape(8, 32768, 1024, 1000));
  require_bracket<half_t>(half_rows, 8192);
  check_all_fills<half_t>(rng, half_rows);
  check_all_fills<bfloat16_t>(rng, half_rows);
  Case flagged = cta_group_plan(shape(8, 131072, 4096, 4096));
  flagged.flagged = true;
  require_bracket<float>(flagged, 4096);
  check_all_fills<float>(rng, flagged);
}

TEST_CASE("topk gpu paths: ClusterAttn's 32-bit flag-first keys (non-negative fp32 scores) select what the 33-bit keys do") {
  // FlagFirstNonNegativeKey on the device against FlagFirstKey<float> on the host, on the shapes of
  // ClusterAttn's selection (8 and 64 rows of 32K and 128K, k = Cp - W) and on each kernel the 32-bit
  // key reaches: the register select (which the 33-bit key never takes), the candidate select in CTA
  // groups, the stream select and the short-row select; every fill, made non-negative (NaN kept).
  auto rng = kvsift_test::make_rng(521);
  struct Shape { int rows, cols, k; TopkKernel kernel; bool cta_groups; };
  for (const Shape s : {Shape{8, 131072, 992, kReg, false}, Shape{8, 32768, 992, kReg, false},
                        Shape{8, 131072, 4064, kCand, true}, Shape{64, 32768, 992, kCand, true},
                        Shape{64, 131072, 992, TopkKernel::kStreamSelect, false}, Shape{16, 3000, 992, kShort, false}}) {
    Case c = shape(s.rows, s.cols, s.k, s.k);
    c.flagged = true;
    c.nonnegative = true;
    c.register_kernels = !s.cta_groups;
    CAPTURE(s.rows);
    CAPTURE(s.cols);
    const auto p = plan_of<float>(c);
    INFO("plan kernel ", int(p.kernel), ", ctas_per_row ", p.ctas_per_row);
    REQUIRE(int(p.kernel) == int(s.kernel));
    check_all_fills<float>(rng, c);
  }
  check_edges<float>(rng, [&] {
    Case e = edge_rows(rng, 7, 131072, 1024);
    e.flagged = true;
    e.nonnegative = true;
    return e;
  }());
}

TEST_CASE("topk gpu paths: fp16 and bf16 inputs on every candidate-select shape") {
  auto rng = kvsift_test::make_rng(505);
  struct Shape { int rows, cols, capacity, k, group, threads; };
  for (const Shape s : {Shape{300, 2048, 64, 64, 1, 256}, Shape{40, 4099, 100, 77, 2, 512},
                        Shape{24, 8192, 1024, 1000, 4, 512}, Shape{4, 131072, 2048, 2048, 8, 512}}) {
    const Case c = cta_group_plan(shape(s.rows, s.cols, s.capacity, s.k));
    CAPTURE(s.rows);
    CAPTURE(s.cols);
    require_path<half_t>(c, kCand, s.group, s.threads);
    require_path<bfloat16_t>(c, kCand, s.group, s.threads);
    check_all_fills<half_t>(rng, c);
    check_all_fills<bfloat16_t>(rng, c);
  }
  check_edges<half_t>(rng, edge_rows(rng, 14, 131072, 4096));
  check_edges<bfloat16_t>(rng, edge_rows(rng, 70, 2048, 80));
  check_case<__half>(rng, shape(8, 50000, 512, 512));
  check_case<__nv_bfloat16>(rng, shape(8, 50000, 512, 512));
}

TEST_CASE("topk gpu paths: flag-first keys (33-bit in uint64, 17-bit in uint32) on candidate-select shapes") {
  auto rng = kvsift_test::make_rng(506);
  struct Shape { int rows, cols, capacity, k, group, threads; };
  for (const Shape s : {Shape{100, 3000, 512, 500, 1, 256}, Shape{8, 32768, 992, 992, 8, 512},
                        Shape{5, 131072, 4096, 4096, 8, 512}}) {
    Case c = cta_group_plan(shape(s.rows, s.cols, s.capacity, s.k));
    c.flagged = true;
    CAPTURE(s.rows);
    CAPTURE(s.cols);
    require_path<float>(c, kCand, s.group, s.threads);
    check_all_fills<float>(rng, c);
    check_all_fills<bfloat16_t>(rng, c);
    check_case<half_t>(rng, c);
  }
  Case edges = edge_rows(rng, 14, 131072, 4096);
  edges.flagged = true;
  check_edges<float>(rng, edges);
  Case few = with_facts(shape(1, 32768, 2048, 2000), Case::Facts::kFewSms);
  few.flagged = true;
  require_path<float>(few, kCand, 4, 512);
  check_all_fills<float>(rng, few);
}

namespace {

// The register select on one shape: every fill, the fills its sample misreads with the bracket and
// with the exact search alone, LycheeDecode's forced ranges over ragged rows (short rows draw their
// sample again) and the row edges.
struct RegisterShape {
  int rows, cols, capacity, k, group;
  int threads = 256;    // the CTA size the plan gives (or the forced one)
  bool forced = false;  // run `threads` where the plan would not (Case::register_threads)
};

void check_register_shape(std::mt19937_64& rng, const RegisterShape& s) {
  CAPTURE(s.rows);
  CAPTURE(s.cols);
  CAPTURE(s.threads);
  auto sized = [&](Case c) {
    if (s.forced) c.register_threads = s.threads;
    return c;
  };
  Case c = sized(shape(s.rows, s.cols, s.capacity, s.k));
  require_path<float>(c, kReg, s.group, s.threads);
  check_all_fills<float>(rng, c);
  check_with_and_without_bracket(rng, c,
                                 {Fill::kSampledHigh, Fill::kStrideHigh, Fill::kRandom, Fill::kConstant, Fill::kFewValues});
  check_all_fills<float>(rng, sized(with_forced_ranges(rng, shape(s.rows, s.cols, s.capacity, s.k))));
  const Case edges = sized(edge_rows(rng, s.rows, s.cols, s.capacity));
  require_path<float>(edges, kReg, s.group, s.threads);
  check_edges<float>(rng, edges);
}

}  // namespace

// The register-select cases are split by shape so that each fits one racecheck run.
TEST_CASE("topk gpu paths: register select, 32K rows in groups of 8 (benchmark shapes)") {
  auto rng = kvsift_test::make_rng(509);
  // Eight and twelve rows of 32K (16 keys a thread), and a row that leaves the group's last CTA empty.
  for (const RegisterShape s : {RegisterShape{8, 32768, 1024, 1024, 8}, RegisterShape{12, 32768, 4096, 4096, 8},
                                RegisterShape{3, 16384, 512, 500, 8}})
    check_register_shape(rng, s);
}

// Long rows in groups of 16, one case per shape or two (each fits one racecheck run): two and four
// rows of 128K (512 threads, 16 keys a thread), one row of 64K (256 threads, 16 keys) and two of
// 100000 (512 threads, a short last slice).
TEST_CASE("topk gpu paths: register select, long rows in groups of 16 (two rows of 128K)") {
  auto rng = kvsift_test::make_rng(510);
  check_register_shape(rng, RegisterShape{2, 131072, 4096, 4096, 16, 512});
}

TEST_CASE("topk gpu paths: register select, long rows in groups of 16 (four rows of 128K)") {
  auto rng = kvsift_test::make_rng(514);
  check_register_shape(rng, RegisterShape{4, 131072, 4096, 4096, 16, 512});
}

TEST_CASE("topk gpu paths: register select, long rows in groups of 16 (64K and 100000 positions)") {
  auto rng = kvsift_test::make_rng(515);
  for (const RegisterShape s : {RegisterShape{1, 65536, 2048, 2000, 16}, RegisterShape{2, 100000, 4096, 3000, 16, 512}})
    check_register_shape(rng, s);
}

TEST_CASE("topk gpu paths: register select, 5-14 long rows in 512-thread groups of 8") {
  auto rng = kvsift_test::make_rng(517);
  // Eight rows of 128K (LycheeDecode's retrieval rows at batch 8: 32 keys a thread), five of 100000 (a
  // short last slice) and twelve of 128K.
  for (const RegisterShape s : {RegisterShape{8, 131072, 4096, 4096, 8, 512}, RegisterShape{5, 100000, 4096, 3000, 8, 512},
                                RegisterShape{12, 131072, 1024, 1024, 8, 512}})
    check_register_shape(rng, s);
}

TEST_CASE("topk gpu paths: register select, 512-thread CTAs forced on shorter rows") {
  auto rng = kvsift_test::make_rng(518);
  // Rows the plan gives 256-thread CTAs, in 512-thread CTAs with 16 keys a thread (groups of 4 and 2),
  // with 32-bit and narrow keys.
  for (const RegisterShape s : {RegisterShape{8, 32768, 1024, 1000, 4, 512, true}, RegisterShape{3, 16384, 512, 500, 2, 512, true}})
    check_register_shape(rng, s);
  Case c = shape(8, 32768, 1024, 1000);
  c.register_threads = 512;
  check_all_fills<half_t>(rng, c);
  check_all_fills<bfloat16_t>(rng, c);
  c.flagged = true;
  check_all_fills<half_t>(rng, c);
}

TEST_CASE("topk gpu paths: register select, forced groups, budget ends, unaligned rows") {
  auto rng = kvsift_test::make_rng(511);
  // Forced groups of 2, 4 and 8 on one shape each (the plan's own choice is 16 there).
  for (int group : {2, 4, 8}) {
    const Case c = shape(2, 16384, 1024, 900);
    const auto exec = exec_for(c, nullptr);
    const auto plan = kvsift::detail::plan_topk_register<std::uint32_t>(c.rows, c.cols, group, exec.device);
    CAPTURE(group);
    REQUIRE(int(plan.kernel) == int(kReg));
    REQUIRE(plan.ctas_per_row == group);
  }
  // Budgets at both ends of the region, unaligned rows (scalar loads), aligned rows whose last vector
  // passes the columns, lists past the copy's room (rows of few values: the exact search).
  for (int k : {1, 2, 32767, 32766, 16384}) {
    Case c = shape(8, 32768, 32768, k);
    CAPTURE(k);
    require_path<float>(c, kReg, 8, 256);
    check_case<float>(rng, c);
    c.fill = Fill::kFewValues;
    check_case<float>(rng, c);
    c.fill = Fill::kAscending;
    check_case<float>(rng, c);
  }
  Case odd = shape(5, 32771, 1500, 1500);  // 8 x 256 x 16 keys fall 3 positions short: 512 threads
  odd.stride_pad = 3;
  require_path<float>(odd, kReg, 8, 512);
  check_all_fills<float>(rng, odd);
  Case tail = shape(4, 20001, 700, 650);
  tail.stride_pad = 3;
  require_path<float>(tail, kReg, 16, 256);
  check_all_fills<float>(rng, tail);
}

namespace {

// 16- and 19-bit keys (8 per 16-byte vector) and 17- and 20-bit flag-first keys (still 32-bit) on one
// register-select shape.
void check_narrow_register_keys(std::mt19937_64& rng, const RegisterShape& s) {
  Case c = shape(s.rows, s.cols, s.capacity, s.k);
  require_path<half_t>(c, kReg, s.group, s.threads);
  check_all_fills<half_t>(rng, c);
  check_all_fills<bfloat16_t>(rng, c);
  c.flagged = true;
  require_path<half_t>(c, kReg, s.group, s.threads);
  check_all_fills<half_t>(rng, c);
  check_all_fills<bfloat16_t>(rng, c);
  c.bracket = false;
  check_case<half_t>(rng, c);
}

}  // namespace

// Split by shape so that each fits one racecheck run.
TEST_CASE("topk gpu paths: register select, 16- to 20-bit keys (fp16, bf16, flag-first) on 32K rows") {
  auto rng = kvsift_test::make_rng(512);
  check_narrow_register_keys(rng, RegisterShape{8, 32768, 1024, 1000, 8});
  check_case<__half>(rng, shape(8, 50000, 512, 512));
  check_case<__nv_bfloat16>(rng, shape(8, 50000, 512, 512));
}

TEST_CASE("topk gpu paths: register select, 16- to 20-bit keys (fp16, bf16, flag-first) on 128K rows") {
  auto rng = kvsift_test::make_rng(516);
  check_narrow_register_keys(rng, RegisterShape{4, 131072, 4096, 4096, 16, 512});
}

TEST_CASE("topk gpu paths: stream select, one CTA per row streaming it twice (many long rows)") {
  auto rng = kvsift_test::make_rng(508);
  // The benchmark's many-row shapes pick it on the real device.
  require_path<float>(shape(256, 131072, 4096, 4096), TopkKernel::kStreamSelect, 1, 512);
  require_path<float>(shape(256, 32768, 4096, 4096), TopkKernel::kStreamSelect, 1, 512);
  require_path<float>(shape(32, 131072, 4096, 4096), TopkKernel::kStreamSelect, 1, 512);
  Case many = shape(300, 32768, 4096, 4096);
  check_case<float>(rng, many);
  auto forced = [](Case c, int list = 0) {
    c.stream = true;
    c.stream_list = list;
    return c;
  };
  // Every fill (ties, all-equal and all-NaN rows overflow the list: the extra streams), the row edges,
  // each list size from one that overflows on every row to one that never does.
  for (int list : {0, 300, 2048}) {
    CAPTURE(list);
    check_all_fills<float>(rng, forced(shape(20, 40000, 3000, 2999), list));
    check_edges<float>(rng, forced(edge_rows(rng, 28, 20000, 1024), list));
  }
  check_all_fills<float>(rng, forced(shape(6, 131072, 4096, 4096)));
  // Other sample periods (one sector of every 1, 2, 16): same rows, same answers.
  for (int period : {1, 2, 16}) {
    CAPTURE(period);
    Case sampled = forced(shape(7, 50000, 4096, 3000));
    sampled.stream_period = period;
    check_case<float>(rng, sampled);
    Case unaligned = sampled;
    unaligned.stride_pad = 3;
    check_case<float>(rng, unaligned);
    check_case<half_t>(rng, sampled);
  }
  // A sample that misleads: the threshold passes fewer than budget keys, the row is streamed again.
  for (int k : {100, 4096, 16000}) {
    Case misled = forced(shape(5, 131072, 16384, k));
    misled.fill = Fill::kSampledHigh;
    check_case<float>(rng, misled);
    check_case<bfloat16_t>(rng, misled);
  }
  Case odd = forced(shape(5, 32771, 1500, 1500));  // rows not 16-byte aligned: scalar loads
  odd.stride_pad = 3;
  check_all_fills<float>(rng, odd);
  Case tail = forced(shape(6, 10001, 700, 650));  // aligned rows whose last vector passes the columns
  tail.stride_pad = 3;
  check_all_fills<float>(rng, tail);
  check_all_fills<float>(rng, forced(shape(40, 37, 8, 5)));  // shorter than one load per thread
  for (int list : {0, 200}) {
    check_all_fills<half_t>(rng, forced(shape(9, 50000, 512, 512), list));
    check_all_fills<bfloat16_t>(rng, forced(shape(9, 50000, 512, 512), list));
    Case flagged = forced(shape(7, 32768, 992, 992), list);
    flagged.flagged = true;
    check_all_fills<float>(rng, flagged);
    check_case<bfloat16_t>(rng, flagged);
  }
  Case flagged_edges = forced(edge_rows(rng, 14, 131072, 4096));
  flagged_edges.flagged = true;
  check_edges<float>(rng, flagged_edges);
  // Rows past 262144 positions: the tie bitmap leaves the histogram for dynamic shared memory.
  {
    const Case wide = forced(shape(3, 300000, 2048, 2000));
    REQUIRE(kvsift::detail::plan_topk_stream<std::uint32_t>(wide.cols, exec_for(wide, nullptr).device).bitmap_words >
            kvsift::detail::kTopkStreamHistWords);
    check_case<float>(rng, wide);
    Case wide_ties = wide;
    wide_ties.fill = Fill::kFewValues;  // mostly ties: the tie bitmap decides, and the list overflows
    check_case<float>(rng, wide_ties);
  }
  Case forced_ranges = forced(shape(12, 65536, 4096, 4096));
  forced_ranges.params.sink = 128;
  forced_ranges.params.recent = 256;
  check_all_fills<float>(rng, forced_ranges);
}

TEST_CASE("topk gpu paths: the radix select fallback (rows too long, or a GPU with less shared memory)") {
  auto rng = kvsift_test::make_rng(507);
  const Case huge = shape(2, 600000, 2048, 2000);  // slices too large to cache: global passes
  require_path<float>(huge, kRadix, 8, 512);
  check_all_fills<float>(rng, huge);
  Case huge64 = shape(1, 700000, 4096, 4096);  // uint64 keys not cached
  huge64.flagged = true;
  require_path<float>(huge64, kRadix, 8, 512);
  check_case<float>(rng, huge64);
  const Case small_smem = with_facts(shape(20, 20000, 1024, 1000), Case::Facts::kNoClustersSmallSmem);
  require_path<float>(small_smem, kRadix, 1, 512);  // cached radix select, one CTA per row
  CHECK(plan_of<float>(small_smem).cached);
  check_all_fills<float>(rng, small_smem);
  check_edges<float>(rng, with_facts(edge_rows(rng, 14, 20000, 1024), Case::Facts::kNoClustersSmallSmem));
}
