// cuda::topk on fp32 scores: per-head token selection (rows = batch x KV heads, n = context length,
// k = budget) and the block case (n = 2048 block scores, k = 64). Bytes counted: the scores read once
// plus the positions and counts written, so `of_ceiling` is the fraction of the one-pass read floor
// reached, `floor_us` that floor in microseconds, and `target_us` issue 15's target for the shape
// (0 where it sets none). `path` is the plan's kernel (0 radix select, 1 candidate select, 2 stream select,
// 3 register select, 4 short-row select), `group` its CTAs per row, `threads` its CTA size and
// `bracket` its bracket list (0: none); BM_TopKStreamSelect runs the stream select on the same shapes
// whatever the plan picks, BM_TopKDigitSearch the plan without the bracket, BM_TopKGroup the candidate
// select in a forced CTA group size, with and without the bracket, BM_TopKRetrievalRows LycheeDecode's
// row-filtered selection, BM_TopKRegister the register select in a forced CTA group and
// BM_TopKCtaGroups the plan without the register and short-row selects. The torch.topk baseline for
// the same shapes is benchmarks/torch_topk.py; FlashInfer's comes from a separate peer benchmark run
// in the same call (docs/performance.md, issue 15).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <vector>

#include "kvsift/ops/topk.cuh"
#include "support/bench_support.cuh"

namespace {

// Issue 15's targets (fp32, full-length rows, cold L2, graph replay, H200), in microseconds.
double target_us(int rows, int n, int k, int sink) {
  if (sink != 0) return 0.0;
  struct T { int rows, n, k; double us; };
  for (const T t : {T{8, 32768, 1024, 7}, T{32, 32768, 4096, 12}, T{256, 32768, 4096, 25}, T{8, 131072, 4096, 9},
                    T{32, 131072, 4096, 15}, T{256, 131072, 4096, 60}, T{8, 2048, 64, 4}, T{64, 2048, 64, 4},
                    T{256, 2048, 64, 6}})
    if (t.rows == rows && t.n == n && t.k == k) return t.us;
  return 0.0;
}

// One benchmark shape's device inputs and outputs: fp32 scores uniform in [-1, 1), full-length rows
// whose lengths live on the device (as in decoding), the state's k, sink and recent.
struct TopkShape {
  int rows, n, k;
  int selected_rows;  // rows the call selects (all, unless a row filter skips some): the bytes counted
  kvsift::TopKParams params;
  kvsift_bench::DeviceArray<float> scores;
  kvsift_bench::DeviceArray<std::int32_t> indices, counts, lengths;

  explicit TopkShape(const benchmark::State& state)
      : rows(int(state.range(0))), n(int(state.range(1))), k(int(state.range(2))), selected_rows(rows),
        scores(std::size_t(rows) * n),
        indices(std::size_t(rows) * k), counts(rows), lengths(rows) {
    params.k = k;
    params.sink = int(state.range(3));
    params.recent = int(state.range(4));
    kvsift_bench::fill_uniform(scores.get(), scores.n, -1.f, 1.f, 0x70c0u + rows + n);
    const std::vector<std::int32_t> full(std::size_t(rows), n);
    KVSIFT_BENCH_CUDA(cudaMemcpy(lengths.get(), full.data(), lengths.bytes(), cudaMemcpyHostToDevice));
    params.lengths = lengths.get();
  }
  kvsift::StridedView2D<const float> view() const { return kvsift::make_strided_view<const float>(scores.get(), rows, n); }
  kvsift::IndexSet out() const { return kvsift::make_index_set(indices.get(), counts.get(), rows, k); }
  // The selected rows' scores read once plus their positions and counts written.
  double bytes() const {
    return double(selected_rows) * n * sizeof(float) + double(selected_rows) * k * sizeof(std::int32_t) +
           selected_rows * 4.0;
  }

  // Times run(exec) (a first call must succeed) and sets the floor counter; false if skipped.
  template <class Run>
  bool time(benchmark::State& state, Run&& run) const {
    const kvsift::Status st = run(kvsift_bench::gpu());
    if (!st.ok()) {
      state.SkipWithError(st.to_string().c_str());
      return false;
    }
    kvsift_bench::time_gpu(state, bytes(), [&](cudaStream_t s) { (void)run(kvsift_bench::gpu().on(s)); });
    state.counters["floor_us"] = bytes() / (kvsift_bench::read_ceiling_tbps() * 1e12) * 1e6;
    return true;
  }

  // Times the given plan's kernel on this shape (detail::launch_topk): a plan of the benchmark's choice.
  bool time_plan(benchmark::State& state, const kvsift::detail::TopkPlan& plan) const {
    const kvsift::detail::TopkLaunch<float, kvsift::ScoreKey<float>> launch{view(), params, out(), nullptr,
                                                                            kvsift::ScoreKey<float>{}, plan};
    return time(state, [&](const kvsift::cuda::Exec& exec) { return kvsift::detail::launch_topk(exec, launch); });
  }
};

// Turns the plan's sampled bracket off; false (the benchmark skipped) where the plan takes none.
bool without_bracket(benchmark::State& state, kvsift::detail::TopkPlan& plan) {
  if (plan.bracket_capacity == 0) {
    state.SkipWithError("the plan takes no bracket on this shape");
    return false;
  }
  plan.bracket_capacity = 0;
  return true;
}

// The counters that say which launch a plan is: kernel, CTAs per row, CTA size, bracket list.
void plan_counters(benchmark::State& state, const kvsift::detail::TopkPlan& plan) {
  state.counters["path"] = int(plan.kernel);
  state.counters["group"] = plan.ctas_per_row;
  state.counters["threads"] = plan.threads;
  state.counters["bracket"] = plan.bracket_capacity;
}

void BM_TopK(benchmark::State& state) {
  const TopkShape shape(state);
  const auto view = shape.view();
  const auto out = shape.out();
  if (!shape.time(state, [&](const kvsift::cuda::Exec& exec) { return kvsift::cuda::topk(exec, view, shape.params, out); }))
    return;
  const auto plan = kvsift::detail::plan_topk<std::uint32_t>(shape.rows, shape.n, kvsift_bench::gpu().device);
  state.counters["target_us"] = target_us(shape.rows, shape.n, shape.k, shape.params.sink);
  plan_counters(state, plan);
}

// The stream select forced on every shape (detail::launch_topk with plan_topk_stream), beside the
// plan's choice above: where the plan switches kernels (topk_plan.hpp) is read off these two.
void BM_TopKStreamSelect(benchmark::State& state) {
  const TopkShape shape(state);
  const auto plan = kvsift::detail::plan_topk_stream<std::uint32_t>(shape.n, kvsift_bench::gpu().device);
  if (plan.list_capacity == 0) {
    state.SkipWithError("the stream select does not fit shared memory");
    return;
  }
  if (!shape.time_plan(state, plan)) return;
  state.counters["list"] = plan.list_capacity;
}

// The plan's kernel with the candidate select's sampled bracket off (the exact digit searches only):
// the bracket's gain, read off beside BM_TopK in the same run.
void BM_TopKDigitSearch(benchmark::State& state) {
  const TopkShape shape(state);
  auto plan = kvsift::detail::plan_topk<std::uint32_t>(shape.rows, shape.n, kvsift_bench::gpu().device);
  if (without_bracket(state, plan)) shape.time_plan(state, plan);
}

// LycheeDecode's selection as its retrieval layer launches it (args: rows = batch x 8 KV heads, n, k,
// 0, 0, R, bracket, all_rows): the row filter (TopKParams::roles, KV heads R..7 sparse) leaves the R
// retrieval heads' rows to select, and cuda::topk plans and launches for those rows only
// (topk_written_rows). Beside BM_TopK on batch x R rows, the same selections as a call of their own, it
// shows what the filtered launch costs. bracket 0 runs the plan with the sampled bracket off; all_rows 1
// sizes the plan by every row of the call instead, as kvsift did until 2026-12-02 (B=8: the stream
// select over 64 rows, 8 of them selected), so the gain of planning by the written rows is read off one
// binary.
void BM_TopKRetrievalRows(benchmark::State& state) {
  TopkShape shape(state);
  constexpr int kKvHeads = 8;
  const int retrieval = int(state.range(5));
  shape.params.num_kv_heads = kKvHeads;
  for (int h = retrieval; h < kKvHeads; ++h) shape.params.roles.set_sparse(h, true);
  shape.selected_rows = int(kvsift::topk_written_rows(shape.params, shape.rows));
  const int planned_rows = state.range(7) != 0 ? shape.rows : shape.selected_rows;
  auto plan = kvsift::detail::plan_topk<std::uint32_t>(planned_rows, shape.n, kvsift_bench::gpu().device);
  if (state.range(6) == 0 && !without_bracket(state, plan)) return;
  if (shape.time_plan(state, plan)) plan_counters(state, plan);
}

// The candidate select in CTA groups of a forced size (args: rows, n, k, 0, 0, group, bracket):
// detail::plan_topk_group, the plan's own choice beside it in BM_TopK. The plan's group-size and
// bracket rules (topk_plan.hpp) are read off this table.
void BM_TopKGroup(benchmark::State& state) {
  const TopkShape shape(state);
  const auto plan = kvsift::detail::plan_topk_group<std::uint32_t>(shape.n, int(state.range(5)), state.range(6) != 0,
                                                                   kvsift_bench::gpu().device);
  if (state.range(6) != 0 && plan.bracket_capacity == 0) {
    state.SkipWithError("the bracket's list does not fit beside this slice");
    return;
  }
  if (shape.time_plan(state, plan)) plan_counters(state, plan);
}

// The register select in a forced CTA group and CTA size (args: rows, n, k, 0, 0, group, exact,
// threads; threads 0 is the plan's choice): detail::plan_topk_register, with `exact` 1 running its
// exact search only (no bracket).
// Where the plan takes it, and with which group, is read off this table beside BM_TopK.
void BM_TopKRegister(benchmark::State& state) {
  const TopkShape shape(state);
  auto plan = kvsift::detail::plan_topk_register<std::uint32_t>(shape.rows, shape.n, int(state.range(5)),
                                                                kvsift_bench::gpu().device, int(state.range(7)));
  if (plan.kernel != kvsift::detail::TopkKernel::kRegisterSelect) {
    state.SkipWithError("the register select does not take this shape in this group");
    return;
  }
  if (state.range(6) != 0) plan.bracket_capacity = 0;
  if (shape.time_plan(state, plan)) {
    plan_counters(state, plan);
    state.counters["keys"] = plan.slice / plan.threads;
  }
}

// The plan without the register and short-row selects (detail::plan_topk_cta_groups, cuda::topk's
// plan before 2026-12-04; BM_TopKNoRegister until then) on the plan's own shapes: those kernels'
// gain, read off beside BM_TopK in one binary.
void BM_TopKCtaGroups(benchmark::State& state) {
  const TopkShape shape(state);
  const auto plan = kvsift::detail::plan_topk_cta_groups<std::uint32_t>(shape.rows, shape.n, kvsift_bench::gpu().device);
  if (shape.time_plan(state, plan)) plan_counters(state, plan);
}

// The stream select with other sample periods (args: rows, n, k, 0, 0, period in 32-byte sectors).
void BM_TopKStreamSample(benchmark::State& state) {
  const TopkShape shape(state);
  auto plan = kvsift::detail::plan_topk_stream<std::uint32_t>(shape.n, kvsift_bench::gpu().device);
  plan.sample_period = int(state.range(5));
  shape.time_plan(state, plan);
}

void sample_shapes(benchmark::internal::Benchmark* b) {
  for (int rows : {8, 64, 256})
    for (int n : {32768, 131072})
      for (int period : {2, 4, 8, 16}) b->Args({rows, n, 4096, 0, 0, period});
}

void token_shapes(benchmark::internal::Benchmark* b) {
  for (int rows : {8, 32, 64, 256})
    for (int n : {32768, 131072})
      for (int k : {1024, 2048, 4096}) b->Args({rows, n, k, 0, 0});
}

// LycheeDecode's retrieval layers: batch 1 and 8 of 8 KV heads, one or two retrieval heads; and BM_TopK
// on the rows they select (1, 2, 8, 16 rows; 8 is in token_shapes).
void retrieval_shapes(benchmark::internal::Benchmark* b) {
  for (int batch : {1, 8})
    for (int n : {32768, 131072})
      for (int r : {1, 2})
        for (int bracket : {1, 0})
          for (int all_rows : {0, 1}) b->Args({batch * 8, n, 4096, 0, 0, r, bracket, all_rows});
}
void selected_row_shapes(benchmark::internal::Benchmark* b) {
  for (int rows : {1, 2, 12, 16})
    for (int n : {32768, 131072}) b->Args({rows, n, 4096, 0, 0});
}

void group_shapes(benchmark::internal::Benchmark* b) {
  for (int rows : {8, 16, 32, 64})
    for (int n : {32768, 131072})
      for (int group : {2, 4, 8})
        for (int bracket : {0, 1}) b->Args({rows, n, 4096, 0, 0, group, bracket});
}

// The longest row 256-thread register-select CTAs cover: a group of 16 at 16 keys a thread.
constexpr int kLongest256ThreadRow =
    kvsift::detail::kTopkRegMaxGroup * kvsift::detail::kTopkRegThreads * (kvsift::detail::kTopkRegMaxKeys / 2);
void register_shapes(benchmark::internal::Benchmark* b) {
  for (int rows : {1, 2, 4, 8, 12})
    for (int n : {32768, 131072})
      for (int k : {1024, 4096})
        for (int group : {8, 16})
          for (int threads : {256, 512})  // 256 threads cover 128K rows in no group (16 keys at most)
            if (rows * group <= 128 && (threads == 512 || n <= kLongest256ThreadRow)) b->Args({rows, n, k, 0, 0, group, 0, threads});
  for (int rows : {16, 32})
    for (int n : {32768, 131072}) b->Args({rows, n, 4096, 0, 0, 64 / rows * 2, 0, 0});
  for (int threads : {256, 512}) b->Args({8, 32768, 4096, 0, 0, 8, 1, threads});  // the exact search alone
  b->Args({4, 131072, 4096, 0, 0, 16, 1, 512});
  b->Args({4, 131072, 4096, 128, 256, 16, 0, 512});  // LycheeDecode token mode
}

// Short rows beyond the block-score case: 16 keys a thread (4096 positions), a budget of a quarter
// of the row, many rows.
void short_row_shapes(benchmark::internal::Benchmark* b) {
  for (int rows : {8, 256}) b->Args({rows, 4096, 1024, 0, 0});
  b->Args({1024, 2048, 64, 0, 0});
}

void block_and_forced_shapes(benchmark::internal::Benchmark* b) {
  for (int rows : {8, 64, 256}) b->Args({rows, 2048, 64, 0, 0});  // block scores, 64 blocks kept
  b->Args({32, 131072, 4096, 128, 256});                          // LycheeDecode token mode
}

// The shapes cuda::topk's plan is timed on: BM_TopK, and BM_TopKCtaGroups beside it.
void plan_shapes(benchmark::internal::Benchmark* b) {
  token_shapes(b);
  block_and_forced_shapes(b);
  selected_row_shapes(b);
  short_row_shapes(b);
}

}  // namespace

BENCHMARK(BM_TopK)
    ->Apply(plan_shapes)
    ->ArgNames({"rows", "n", "k", "sink", "recent"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_TopKStreamSelect)
    ->Apply(token_shapes)
    ->Apply(block_and_forced_shapes)
    ->ArgNames({"rows", "n", "k", "sink", "recent"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_TopKDigitSearch)
    ->Apply(token_shapes)
    ->Apply(block_and_forced_shapes)
    ->ArgNames({"rows", "n", "k", "sink", "recent"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_TopKStreamSample)
    ->Apply(sample_shapes)
    ->ArgNames({"rows", "n", "k", "sink", "recent", "period"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_TopKGroup)
    ->Apply(group_shapes)
    ->ArgNames({"rows", "n", "k", "sink", "recent", "group", "bracket"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_TopKCtaGroups)
    ->Apply(plan_shapes)
    ->ArgNames({"rows", "n", "k", "sink", "recent"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_TopKRegister)
    ->Apply(register_shapes)
    ->ArgNames({"rows", "n", "k", "sink", "recent", "group", "exact", "threads"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_TopKRetrievalRows)
    ->Apply(retrieval_shapes)
    ->ArgNames({"rows", "n", "k", "sink", "recent", "R", "bracket", "all_rows"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
