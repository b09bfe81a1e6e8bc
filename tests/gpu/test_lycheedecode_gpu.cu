// LycheeDecode on the GPU with bf16 K/V: CUDA against the host policy over multi-layer, multi-step
// decodes (token, ratio and block modes; contiguous and paged caches; ragged batches with an empty
// slot; head_dim 64/128/256), a whole multi-layer step captured in one CUDA graph and replayed with
// new lengths and queries, and the CUDA path's own errors. fp16 K/V: test_lycheedecode_gpu_f16.cu.

#include "gpu/lycheedecode_gpu_cases.cuh"

using kvsift::bfloat16_t;
using lycheedecode_test::Case;
using lycheedecode_test::Layout;
using kvsift::LycheeDecodeSelection;

TEST_CASE("LycheeDecode bf16: token mode, contiguous cache, mixed roles") {
  Case c;
  lycheedecode_test::run_case<bfloat16_t>(c, 801);
}

// Score candidates (config.score_candidates): rows of 16K-20K positions, where the top-k takes its
// register select and reads the lists. Steps that reuse their queries keep the last step's threshold
// right (the lists hold); new queries every step mostly miss (the full search). Both against the host.
TEST_CASE("LycheeDecode bf16: token and ratio modes with score candidates, rows of 16K-20K positions") {
  for (const bool repeat : {true, false}) {
    Case c;
    c.roles = "RR/SR/RS/SS";
    c.cap = 20000;
    c.lengths = {20000, 16400, 0};
    c.budget = 600;
    c.steps = 4;
    c.candidates = true;
    c.repeat_queries = repeat;
    lycheedecode_test::run_case<bfloat16_t>(c, repeat ? 811 : 812);
  }
  Case r;
  r.roles = "RR/RS/SR";
  r.cap = 17000;
  r.lengths = {17000, 16500};
  r.selection = LycheeDecodeSelection::kRatio;
  r.rho = 0.97;
  r.steps = 3;
  r.candidates = true;
  r.repeat_queries = true;
  lycheedecode_test::run_case<bfloat16_t>(r, 813);
}

TEST_CASE("LycheeDecode bf16: token mode, paged cache, few SMs (many splits per head)") {
  Case c;
  c.layout = Layout::kPagedNHD;
  c.roles = "RRRR/SSSR/SRSS/SSSS/RSSS";
  c.num_sms = 3;
  lycheedecode_test::run_case<bfloat16_t>(c, 802);
}

TEST_CASE("LycheeDecode bf16: block mode 64, paged cache with 16-token pages") {
  Case c;
  c.layout = Layout::kPagedNHD;
  c.selection = LycheeDecodeSelection::kBlock;
  c.block_size = 64;
  c.num_blocks = 5;
  c.lengths = {640, 65, 0, 128};  // a partial last block, one past a block, exactly two blocks
  lycheedecode_test::run_case<bfloat16_t>(c, 803);
}

TEST_CASE("LycheeDecode bf16: block mode 16, contiguous cache") {
  Case c;
  c.selection = LycheeDecodeSelection::kBlock;
  c.block_size = 16;
  c.num_blocks = 8;
  c.sink_blocks = 2;
  lycheedecode_test::run_case<bfloat16_t>(c, 804);
}

TEST_CASE("LycheeDecode bf16: ratio mode, the budget grows with the length") {
  Case c;
  c.layout = Layout::kPagedNHD;
  c.page_size = 64;
  c.selection = LycheeDecodeSelection::kRatio;
  c.rho = 0.75;
  c.lengths = {500, 33, 0, 129};
  c.steps = 4;
  lycheedecode_test::run_case<bfloat16_t>(c, 805);
}

TEST_CASE("LycheeDecode bf16: head_dim 256 and 64") {
  Case c;
  c.d = 256;
  c.cap = 320;
  c.lengths = {320, 100, 0, 31};
  c.roles = "RR/SR/RS";
  c.group = 2;
  lycheedecode_test::run_case<bfloat16_t>(c, 806);
  c.d = 64;
  c.group = 8;
  c.selection = LycheeDecodeSelection::kBlock;
  c.block_size = 32;
  lycheedecode_test::run_case<bfloat16_t>(c, 807);
}

namespace {

// A stand-in for the engine's kernels after a layer's attention: waits for the kernel before it
// (launched as its programmatic dependent), then fills a scratch buffer of its own.
__global__ void engine_stand_in(uint4* p, std::size_t n, unsigned v) {
  kvsift::detail::wait_for_primary_grid();
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    p[i] = make_uint4(v, v, v, v);
}

// One step's outputs of every layer: [layer][batch * q heads * head_dim].
using LayerOutputs = std::vector<std::vector<bfloat16_t>>;

// second_stream: every layer as attend_layer on the step's stream and hand_off_layer on a second one
// (forked by an event after the attention, joined before the next layer), with unrelated work (a
// kernel filling a scratch buffer, the engine's next kernels in a real step) queued on the first
// stream meanwhile, and every launch a programmatic dependent: the way the minimal decoder overlaps
// the handoff. The bits must be those of decode_layer on the host.
void graph_replay(LycheeDecodeSelection selection, Layout layout, bool second_stream = false) {
  using lycheedecode_test::DeviceBuffer;
  Case c;
  c.selection = selection;
  c.layout = layout;
  c.num_blocks = 6;
  auto rng = kvsift_test::make_rng(810 + int(selection));
  INFO(c.describe());
  const auto config = c.config();
  lycheedecode_test::Caches<bfloat16_t> caches(rng, c);
  lycheedecode_test::HostPolicy host;
  lycheedecode_test::DevicePolicy device;
  host.init<bfloat16_t>(config);
  device.init<bfloat16_t>(config);
  const int B = caches.B, Hq = caches.H * c.group, D = c.d, L = c.layers();
  const std::size_t n = std::size_t(B) * Hq * D;
  DeviceBuffer<std::int32_t> dlengths(c.lengths);
  std::vector<std::unique_ptr<DeviceBuffer<bfloat16_t>>> dq, graph_out, eager_out;
  for (int l = 0; l < L; ++l) {
    dq.push_back(std::make_unique<DeviceBuffer<bfloat16_t>>(n));
    graph_out.push_back(std::make_unique<DeviceBuffer<bfloat16_t>>(n));
    eager_out.push_back(std::make_unique<DeviceBuffer<bfloat16_t>>(n));
  }
  cudaStream_t stream, side;
  KVSIFT_TEST_CUDA(cudaStreamCreate(&stream));
  KVSIFT_TEST_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t attended, handed_off;
  KVSIFT_TEST_CUDA(cudaEventCreateWithFlags(&attended, cudaEventDisableTiming));
  KVSIFT_TEST_CUDA(cudaEventCreateWithFlags(&handed_off, cudaEventDisableTiming));
  DeviceBuffer<unsigned char> busy(std::size_t(32) << 20);
  auto exec = kvsift::cuda::Exec::for_current_device(stream);
  // With PDL the next layer's attention has a programmatic edge from the stand-in kernel before it and
  // an event edge from the handoff: the mix a captured engine step holds.
  exec.dependent_launch = second_stream;
  const auto side_exec = exec.on(side);
  auto run_step = [&](std::vector<std::unique_ptr<DeviceBuffer<bfloat16_t>>>& outs, std::vector<kvsift::Status>& st) {
    const kvsift::Workspace ws{device.workspace->get(), device.workspace->size()};
    bool joined = true;
    for (int l = 0; l < L; ++l)
      caches.with_device_view(l, dlengths.get(), [&](const auto& kv) {
        const auto io = kvsift::make_query_io(dq[l]->get(), outs[l]->get(), 1, Hq, D);
        if (!second_stream) {
          st.push_back(device.decoder.decode_layer(exec, device.state, l, kv, io, ws));
          return;
        }
        if (!joined) KVSIFT_TEST_CUDA(cudaStreamWaitEvent(stream, handed_off, 0));  // the table, then attention
        st.push_back(device.decoder.attend_layer(exec, device.state, l, kv, io, ws));
        KVSIFT_TEST_CUDA(cudaEventRecord(attended, stream));
        KVSIFT_TEST_CUDA(cudaStreamWaitEvent(side, attended, 0));
        st.push_back(device.decoder.hand_off_layer(side_exec, device.state, l, kv, ws));
        KVSIFT_TEST_CUDA(cudaEventRecord(handed_off, side));
        joined = false;
        KVSIFT_TEST_CUDA(kvsift::detail::launch_with_pdl(true, engine_stand_in, dim3(264), dim3(256), 0, stream,
                                                         reinterpret_cast<uint4*>(busy.get()), busy.size() / 16, unsigned(l)));
      });
    if (!joined) KVSIFT_TEST_CUDA(cudaStreamWaitEvent(stream, handed_off, 0));
  };

  // Capture one whole step: every layer's attention, selection and handoff.
  std::vector<kvsift::Status> captured;
  cudaGraph_t graph;
  KVSIFT_TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  run_step(graph_out, captured);
  KVSIFT_TEST_CUDA(cudaStreamEndCapture(stream, &graph));
  for (const auto& st : captured) REQUIRE_MESSAGE(st.ok(), st.to_string());
  cudaGraphExec_t graph_exec;
  KVSIFT_TEST_CUDA(cudaGraphInstantiate(&graph_exec, graph, 0));
  CHECK(device.state.next_layer == 0);  // the host cursor went round once, at capture

  const std::vector<std::vector<std::int32_t>> length_sets = {
      {640, 37, 0, 251}, {300, 1, 5, 640}, {64, 639, 128, 0}, {17, 17, 400, 33}};
  for (const auto& lengths : length_sets) {
    CAPTURE(lengths[0]);
    dlengths.upload(lengths);
    std::vector<std::vector<bfloat16_t>> q(L);
    for (int l = 0; l < L; ++l) {
      q[l] = lycheedecode_test::quarter_steps<bfloat16_t>(rng, n);
      dq[l]->upload(q[l]);
      graph_out[l]->poison();
      eager_out[l]->poison();
    }
    KVSIFT_TEST_CUDA(cudaGraphLaunch(graph_exec, stream));
    KVSIFT_TEST_CUDA(cudaStreamSynchronize(stream));
    const auto graph_table = lycheedecode_test::device_table_rows(device.state.table, B * caches.H);
    std::vector<kvsift::Status> eager;
    run_step(eager_out, eager);
    for (const auto& st : eager) REQUIRE_MESSAGE(st.ok(), st.to_string());
    kvsift_test::sync_and_check();
    CHECK(lycheedecode_test::device_table_rows(device.state.table, B * caches.H) == graph_table);

    for (int l = 0; l < L; ++l) {
      CAPTURE(l);
      std::vector<bfloat16_t> want(n);
      caches.with_host_view(l, lengths.data(), [&](const auto& kv) {
        const auto io = kvsift::make_query_io(q[l].data(), want.data(), 1, Hq, D);
        const auto st = host.decoder.decode_layer(kvsift::host::Exec{}, host.state, l, kv, io, kvsift::Workspace{host.workspace->get(), host.workspace->bytes()});
        REQUIRE_MESSAGE(st.ok(), st.to_string());
      });
      const auto replayed = graph_out[l]->download();
      const auto eager_l = eager_out[l]->download();
      CHECK(std::memcmp(replayed.data(), eager_l.data(), n * sizeof(bfloat16_t)) == 0);  // identical bits
      CHECK(lycheedecode_test::compare_outputs(replayed, want, "replayed out") == 0);
    }
    const auto& ht = host.state.table;
    CHECK(lycheedecode_test::table_rows(ht, B * caches.H, ht.indices, ht.counts) == graph_table);
  }
  cudaGraphExecDestroy(graph_exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(attended);
  cudaEventDestroy(handed_off);
  cudaStreamDestroy(side);
  cudaStreamDestroy(stream);
}

}  // namespace

TEST_CASE("LycheeDecode: a multi-layer step captured in one CUDA graph replays with new lengths (token, BSHD)") {
  graph_replay(LycheeDecodeSelection::kToken, Layout::kBSHD);
}

TEST_CASE("LycheeDecode: a multi-layer step captured in one CUDA graph replays with new lengths (block, paged)") {
  graph_replay(LycheeDecodeSelection::kBlock, Layout::kPagedNHD);
}

TEST_CASE("LycheeDecode: the handoff on a second stream (attend_layer, hand_off_layer) gives decode_layer's bits, eager and captured") {
  graph_replay(LycheeDecodeSelection::kToken, Layout::kBSHD, /*second_stream=*/true);
  graph_replay(LycheeDecodeSelection::kBlock, Layout::kPagedNHD, /*second_stream=*/true);
}

TEST_CASE("LycheeDecode CUDA path rejects a short workspace and a foreign state without launching") {
  Case c;
  auto rng = kvsift_test::make_rng(820);
  lycheedecode_test::Caches<bfloat16_t> caches(rng, c);
  lycheedecode_test::DevicePolicy device;
  device.init<bfloat16_t>(c.config());
  const int Hq = caches.H * c.group;
  lycheedecode_test::DeviceBuffer<std::int32_t> dlengths(c.lengths);
  lycheedecode_test::DeviceBuffer<bfloat16_t> dq(std::size_t(caches.B) * Hq * c.d), dout(dq.size());
  caches.with_device_view(0, dlengths.get(), [&](const auto& kv) {
    const auto io = kvsift::make_query_io(dq.get(), dout.get(), 1, Hq, c.d);
    auto st = device.decoder.decode_layer(device.exec, device.state, 0, kv, io, kvsift::Workspace{device.workspace->get(), device.workspace->size() - 1});
    CHECK(st.code() == kvsift::StatusCode::kInsufficientSpace);
    st = device.decoder.decode_layer(device.exec, device.state, 1, kv, io, kvsift::Workspace{device.workspace->get(), device.workspace->size()});
    CHECK(st.message().find("layer = 1 is out of order") != std::string::npos);
    kvsift::LycheeDecodeState foreign = device.state;
    foreign.num_layers = 2;
    st = device.decoder.decode_layer(device.exec, foreign, 0, kv, io, kvsift::Workspace{device.workspace->get(), device.workspace->size()});
    CHECK(st.message().find("state") != std::string::npos);
  });
  kvsift_test::sync_and_check();
}
