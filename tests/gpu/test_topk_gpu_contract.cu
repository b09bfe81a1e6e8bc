// cuda::topk against host::topk with exact equality, for the contract-level behaviour on the launch
// paths that serve it (the per-path sweep is test_topk_gpu_paths.cu): ragged lengths and per-row k,
// forced sink and recent ranges, the row filter, determinism over 100 runs, CUDA-graph capture and
// replay against a direct launch, and the parameter checks. Outputs are poisoned before every run.

#include "topk_gpu_support.cuh"

using kvsift::bfloat16_t;
using kvsift::half_t;
using kvsift_test::DeviceBuffer;
using namespace kvsift_topk_test;

namespace {

// One shape per candidate-select configuration: 256-thread CTAs, 512-thread CTAs, groups of 2 and 8.
std::vector<Case> path_shapes(int capacity) {
  std::vector<Case> shapes = {shape(96, 2048, capacity, 0), shape(280, 8192, capacity, 0),
                              shape(5, 32768, capacity, 0), shape(7, 131072, capacity, 0)};
  shapes[2].facts = Case::Facts::kFewSms;
  return shapes;
}

}  // namespace

TEST_CASE("topk gpu: k = 1, k = len, k > len, len = 0, ragged lengths, per-row k") {
  auto rng = kvsift_test::make_rng(403);
  Case c = shape(6, 70000, 70008, 1);
  c.lengths = {0, 1, 70000, 69999, 12345, 8};
  for (int k : {0, 1, 8, 12345, 69999, 70000, 70008}) {
    c.params.k = k;
    CAPTURE(k);
    check_case<float>(rng, c);
  }
  // Ragged batch with per-row k (some out of range: clamped to [0, capacity]).
  for (int trial = 0; trial < 6; ++trial) {
    Case r = shape(kvsift_test::uniform_int(rng, 1, 70), kvsift_test::uniform_int(rng, 1, 140000), 5000, 0);
    for (int i = 0; i < r.rows; ++i) {
      r.lengths.push_back(kvsift_test::uniform_int(rng, -5, r.cols + 5));
      r.per_row_k.push_back(kvsift_test::uniform_int(rng, -3, r.capacity + 100));
    }
    r.fill = trial % 2 ? Fill::kRandom : Fill::kFewValues;
    CAPTURE(trial);
    check_case<float>(rng, r);
  }
}

TEST_CASE("topk gpu: the row filter writes retrieval heads' rows only, in place") {
  // LycheeDecode's table: rows b * H + h; sparse heads' rows keep what an earlier layer wrote.
  auto rng = kvsift_test::make_rng(409);
  for (const Case& base : {shape(8 * 6, 32768, 1024, 1024), shape(3 * 8, 131072, 4096, 4096), shape(5 * 3, 2048, 64, 64),
                           shape(36 * 8, 8192, 512, 512)}) {
    Case c = base;
    c.params.num_kv_heads = c.rows % 8 == 0 ? 8 : 3;
    for (int h = 0; h < c.params.num_kv_heads; ++h) c.params.roles.set_sparse(h, h % 3 != 0);
    c.params.sink = 4;
    c.params.recent = 16;
    CAPTURE(c.rows);
    check_filtered_case<float>(rng, c);  // written rows equal the reference; skipped rows keep the poison
  }
}

TEST_CASE("topk gpu: the filtered launch maps its CTAs onto the written rows, on every path") {
  // cuda::topk launches CTAs for the written rows only (topk_written_row): retrieval heads anywhere in
  // the mask, one or none of them, a partial last sequence, masks past one 64-bit word, on each kernel.
  auto rng = kvsift_test::make_rng(417);
  struct Filter {
    int heads, rows;
    std::vector<int> retrieval;
  };
  const std::vector<Filter> filters = {
      {8, 64, {3}},          {8, 64, {0, 7}},     {8, 8, {5}},   {8, 16, {}},  {8, 16, {0, 1, 2, 3, 4, 5, 6, 7}},
      {3, 11, {1, 2}},        {3, 7, {2}},        {100, 203, {0, 63, 64, 99}},  {256, 300, {1, 130, 200, 255}},
  };
  for (const Filter& f : filters) {
    for (int path = 0; path < 5; ++path) {
      // 0: the device's plan for 20K rows (CTA groups, or one CTA a row once they fill the GPU),
      // 1: short rows (the short-row select), 2: the radix select (no clusters, an sm_86's shared memory), 3: the stream
      // select forced, 4: the radix select in CTA groups (rows too long to cache; few rows only).
      if (path == 4 && f.rows > 16) continue;
      Case c = shape(f.rows, path == 1 ? 2048 : path == 4 ? 600000 : 20000, 256, 200);
      if (path == 2) c.facts = Case::Facts::kNoClustersSmallSmem;
      c.stream = path == 3;
      c.params.num_kv_heads = f.heads;
      for (int h = 0; h < f.heads; ++h) c.params.roles.set_sparse(h, true);
      for (int h : f.retrieval) c.params.roles.set_sparse(h, false);
      c.params.sink = 2;
      c.params.recent = 5;
      for (int r = 0; r < c.rows; ++r) c.lengths.push_back(kvsift_test::uniform_int(rng, 0, c.cols));
      CAPTURE(f.heads);
      CAPTURE(f.rows);
      CAPTURE(path);
      std::int64_t written = 0;
      for (int r = 0; r < c.rows; ++r) written += kvsift::topk_skips_row(c.params, r) ? 0 : 1;
      REQUIRE(kvsift::topk_written_rows(c.params, c.rows) == written);
      if (written > 0) {
        const auto plan = plan_of<float>(c);
        if (path == 1) CHECK(plan.threads == 256);
        if (path == 2 || path == 4) CHECK(int(plan.kernel) == int(kvsift::detail::TopkKernel::kRadixSelect));
        if (path == 4) CHECK(plan.ctas_per_row == 8);
      }
      check_filtered_case<float>(rng, c);
    }
  }
}

TEST_CASE("topk gpu: forced sink and recent ranges, overlapping and exceeding the row, on every path") {
  auto rng = kvsift_test::make_rng(404);
  for (Case c : path_shapes(4096)) {
    c.lengths.clear();
    const int lens[] = {c.cols, c.cols - 3, 4000, 383, 200, 2, 1, 0};
    for (int r = 0; r < c.rows; ++r) c.lengths.push_back(std::min(lens[r % 8], c.cols));
    for (auto sr : {std::pair<int, int>{128, 256}, {3000, 1000}, {0, 4096}, {4096, 0}, {17, 5}}) {
      c.params.sink = sr.first;
      c.params.recent = sr.second;
      for (int k : {0, 100, 384, 4096}) {
        c.params.k = k;
        CAPTURE(c.rows);
        CAPTURE(c.cols);
        CAPTURE(sr.first);
        CAPTURE(sr.second);
        CAPTURE(k);
        check_case<float>(rng, c);
      }
    }
  }
  // LycheeDecode token mode with fp16 scores and flag-first keys.
  Case lt = shape(7, 131072, 4096, 4096);
  lt.params.sink = 128;
  lt.params.recent = 256;
  check_case<half_t>(rng, lt);
  lt.flagged = true;
  check_case<float>(rng, lt);
}

TEST_CASE("topk gpu: 100 runs give identical bits, on every path") {
  auto rng = kvsift_test::make_rng(406);
  for (Case c : path_shapes(1024)) {
    c.params.k = c.cols > 4096 ? 1024 : 64;
    for (Fill f : {Fill::kFewValues, Fill::kConstant}) {
      c.fill = f;
      CAPTURE(c.rows);
      CAPTURE(c.cols);
      CAPTURE(int(f));
      const Inputs<float> in = make_inputs<float>(rng, c);
      DeviceCase<float> dev(c, in);
      dev.poison();
      REQUIRE(dev.launch(c, in.stride, nullptr).ok());
      kvsift_test::sync_and_check();
      const Result first = dev.download();
      require_equal(c, reference(c, in), first, 2);
      // Under a sanitizer 3 runs: a tool checks each launch's accesses, not the bits' agreement.
      for (int run = 1, runs = kvsift_test::repetitions(100, 3); run < runs; ++run) {
        dev.poison();
        REQUIRE(dev.launch(c, in.stride, nullptr).ok());
        kvsift_test::sync_and_check();
        const Result again = dev.download();
        INFO("run ", run);
        REQUIRE(again.counts == first.counts);
        REQUIRE(again.indices == first.indices);  // poison past counts[r] included: nothing else written
        REQUIRE(again.value_bits == first.value_bits);
      }
    }
  }
}

TEST_CASE("topk gpu: captured in a CUDA graph and replayed on new data, equal to a direct launch") {
  auto rng = kvsift_test::make_rng(407);
  for (Case c : {shape(16, 131072, 4096, 4096), shape(64, 2048, 64, 64), shape(256, 32768, 4096, 4096)}) {
    c.params.sink = c.cols > 2048 ? 128 : 4;
    c.params.recent = c.cols > 2048 ? 256 : 8;
    c.lengths.resize(std::size_t(c.rows));
    for (auto& l : c.lengths) l = kvsift_test::uniform_int(rng, 0, c.cols);
    c.lengths[0] = c.cols;
    Inputs<float> in = make_inputs<float>(rng, c);
    DeviceCase<float> dev(c, in);
    // The uploads and poisons are cudaMemcpy / cudaMemset on the legacy stream, which may return
    // before the device has finished them and which a non-blocking stream does not wait for: every
    // launch on `stream` below comes after a device synchronize (without it the poison could land
    // after the kernel's writes; it did under initcheck, synccheck and racecheck, 2026-12-02).
    KVSIFT_TEST_CUDA(cudaDeviceSynchronize());
    cudaStream_t stream;
    KVSIFT_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    KVSIFT_TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const kvsift::Status st = dev.launch(c, in.stride, stream);
    KVSIFT_TEST_CUDA(cudaStreamEndCapture(stream, &graph));
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    cudaGraphExec_t exec;
    KVSIFT_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 3; ++replay) {
      // New scores and lengths in the same buffers: the graph must pick them up.
      for (auto& l : c.lengths) l = kvsift_test::uniform_int(rng, 0, c.cols);
      in = make_inputs<float>(rng, c);
      dev.scores.upload(in.scores);
      dev.lengths.upload(c.lengths);
      dev.poison();
      KVSIFT_TEST_CUDA(cudaDeviceSynchronize());
      KVSIFT_TEST_CUDA(cudaGraphLaunch(exec, stream));
      KVSIFT_TEST_CUDA(cudaStreamSynchronize(stream));
      kvsift_test::sync_and_check();
      CAPTURE(c.rows);
      CAPTURE(replay);
      const Result replayed = dev.download();
      require_equal(c, reference(c, in), replayed, 2);
      dev.poison();
      KVSIFT_TEST_CUDA(cudaDeviceSynchronize());
      REQUIRE(dev.launch(c, in.stride, stream).ok());
      KVSIFT_TEST_CUDA(cudaStreamSynchronize(stream));
      kvsift_test::sync_and_check();
      const Result direct = dev.download();
      REQUIRE(direct.counts == replayed.counts);
      REQUIRE(direct.indices == replayed.indices);
      REQUIRE(direct.value_bits == replayed.value_bits);
    }
    KVSIFT_TEST_CUDA(cudaGraphExecDestroy(exec));
    KVSIFT_TEST_CUDA(cudaGraphDestroy(graph));
    KVSIFT_TEST_CUDA(cudaStreamDestroy(stream));
  }
}

TEST_CASE("topk gpu: bad parameters are reported before any launch") {
  DeviceBuffer<float> s(64);
  DeviceBuffer<std::int32_t> idx(32), count(2);
  kvsift::TopKParams p;
  p.k = -1;
  const auto st = kvsift::cuda::topk(kvsift::cuda::Exec::for_current_device(), kvsift::make_strided_view<const float>(s.get(), 2, 32), p,
                                     kvsift::make_index_set(idx.get(), count.get(), 2, 16));
  CHECK(st.code() == kvsift::StatusCode::kInvalidArgument);
  CHECK(st.message().find("k = -1") != std::string::npos);
  p.k = 1;
  const auto st2 = kvsift::cuda::topk(kvsift::cuda::Exec::for_current_device(), kvsift::make_strided_view<const float>(s.get(), 2, 32), p,
                                      kvsift::make_index_set(nullptr, count.get(), 2, 16));
  CHECK(st2.code() == kvsift::StatusCode::kNullPointer);
}
