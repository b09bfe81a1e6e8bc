// compress_prompt end to end on the GPU. The window scores are fp32 sums whose last bits depend on
// the order of summation, so the reference selection runs on the host over the scores the GPU
// computed (a standalone cuda::window_scores call, bitwise reproducible); every later stage and the
// stitched cache must then match exactly. Also: CUDA-graph capture and replay.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "support/device_buffer.cuh"
#include "support/prompt_fixtures.hpp"

namespace kc = kvsift::cuda;
namespace kh = kvsift::host;
using namespace kvsift;
using kvsift_test::DeviceBuffer;
using kvsift_test::Prompt;

namespace {

struct DevicePrompt {
  Prompt& p;
  std::vector<__nv_bfloat16> k, v, q;
  DeviceBuffer<__nv_bfloat16> dk, dv, dq;
  DeviceBuffer<std::int32_t> dlen;
  explicit DevicePrompt(Prompt& prompt)
      : p(prompt), k(to_bf16(p.k)), v(to_bf16(p.v)), q(to_bf16(p.q)), dk(k), dv(v), dq(q), dlen(p.lengths) {}
  static std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& x) {
    std::vector<__nv_bfloat16> out(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) out[i] = __float2bfloat16_rn(x[i]);
    return out;
  }
  ContiguousKV<__nv_bfloat16> device_view() {
    return make_bhsd(dk.get(), dv.get(), p.batch, p.kv_heads, p.capacity, p.head_dim, dlen.get());
  }
  ContiguousKV<__nv_bfloat16> host_view() {
    return make_bhsd(k.data(), v.data(), p.batch, p.kv_heads, p.capacity, p.head_dim, p.lengths.data());
  }
};

// The selection a policy makes on given scores, on the host.
void host_select(const PromptCompressionConfig& c, std::vector<float>& scores, std::vector<std::int32_t>& row_len,
                 int rows, int cols, IndexSet kept) {
  TopKParams select;
  select.k = c.budget();
  select.lengths = row_len.data();
  auto view = make_strided_view<const float>(scores.data(), rows, cols);
  std::vector<float> pooled(scores.size());
  std::vector<std::uint8_t> flags(scores.size());
  switch (c.policy) {
    case CompressionPolicy::kStreamingLLM:
      select.sink = c.sinks;
      select.recent = c.budget() - c.sinks;
      REQUIRE(topk(kh::Exec{}, view, select, kept).ok());
      break;
    case CompressionPolicy::kSnapKV:
      REQUIRE(kh::pool_scores(kh::Exec{}, view, row_len.data(), c.pool, make_strided_view(pooled.data(), rows, cols)).ok());
      REQUIRE(topk(kh::Exec{}, make_strided_view<const float>(pooled.data(), rows, cols), select, kept).ok());
      break;
    case CompressionPolicy::kH2OPrefill:
      REQUIRE(topk(kh::Exec{}, view, select, kept).ok());
      break;
    case CompressionPolicy::kClusterAttn: {
      REQUIRE(kh::cluster_flags(kh::Exec{}, view, row_len.data(), c.cluster(), make_strided_view(flags.data(), rows, cols)).ok());
      FlagFirstKey<float> key;
      key.flags = flags.data();
      key.row_stride = cols;
      REQUIRE(topk(kh::Exec{}, view, select, kept, static_cast<float*>(nullptr), key).ok());
      break;
    }
  }
}

void run_policy(std::mt19937_64& rng, CompressionPolicy policy, ScoreHeads heads) {
  PromptCompressionConfig c;
  c.policy = policy;
  c.heads = heads;
  c.capacity = 96;
  c.window = 16;
  c.num_block = 24;
  c.theta = 0.02f;
  const int L = 700;
  Prompt p(rng, 3, 2, 4, L, 64, policy == CompressionPolicy::kH2OPrefill ? L : c.window);
  p.lengths = {L, kvsift_test::uniform_int(rng, c.capacity + 1, L), kvsift_test::uniform_int(rng, c.window + 1, c.capacity)};
  DevicePrompt dp(p);
  const PromptCompressionShape shape{p.batch, p.kv_heads, p.q_heads, L};
  const int H = shape.score_heads(c), rows = p.batch * H;

  // GPU pipeline into a fresh BHSD destination.
  std::vector<std::int32_t> dst_len_h(p.batch, c.capacity);
  DeviceBuffer<__nv_bfloat16> dst_k(std::size_t(rows) * c.capacity * p.head_dim), dst_v(dst_k.size());
  DeviceBuffer<std::int32_t> dst_len(dst_len_h), new_len(p.batch), positions(std::size_t(rows) * c.capacity);
  const auto exec = kc::Exec::for_current_device();
  std::size_t bytes = 0;
  REQUIRE(compress_prompt_workspace_bytes(exec, c, shape, &bytes).ok());
  DeviceBuffer<unsigned char> ws(bytes);
  for (auto* b : {&dst_k, &dst_v}) b->poison();
  new_len.poison();
  positions.poison();
  auto dst = make_bhsd(dst_k.get(), dst_v.get(), p.batch, H, c.capacity, p.head_dim, dst_len.get());
  auto q = make_query_rows<__nv_bfloat16>(dp.dq.get(), p.q_rows, p.q_heads, p.head_dim);
  const CompactOutputs out{new_len.get(), positions.get(), c.capacity};
  REQUIRE(compress_prompt(exec, c, shape, dp.device_view(), q, nullptr, dst, out, Workspace{ws.get(), ws.size()}).ok());
  kvsift_test::sync_and_check();

  // The scores the GPU computes, then the host's selection and compaction on them.
  std::vector<float> scores(std::size_t(rows) * L, 0.f);
  if (policy != CompressionPolicy::kStreamingLLM) {
    DeviceBuffer<float> dscores(scores.size());
    const auto sp = detail::score_params(c, shape, nullptr);
    const auto score_view = make_strided_view(dscores.get(), rows, L);
    std::size_t score_bytes = 0;
    REQUIRE(window_scores_workspace_bytes(exec, dp.device_view(), q, sp, score_view, &score_bytes).ok());
    DeviceBuffer<unsigned char> sws(std::max<std::size_t>(1, score_bytes));
    // window_scores writes only each row's scored prefix [0, len - window) and leaves the other
    // columns untouched (ops/window_scores.hpp), so the buffer is poisoned first: unpoisoned, the
    // download below copied never-written device memory (initcheck's 3,207 uninitialized reads).
    dscores.poison();
    REQUIRE(kc::window_scores(exec, dp.device_view(), q, sp, score_view, Workspace{sws.get(), sws.size()}).ok());
    kvsift_test::sync_and_check();
    scores = dscores.download();
  }
  std::vector<std::int32_t> row_len(rows);
  REQUIRE(kh::scored_prefix_lengths(kh::Exec{}, dp.host_view(), c.window, H, L, row_len.data()).ok());
  if (policy != CompressionPolicy::kStreamingLLM) {
    // The columns past the scored prefix still hold the poison: nothing wrote them.
    for (int r = 0; r < rows; ++r)
      for (int j = row_len[r]; j < L; ++j) {
        const float s = scores[std::size_t(r) * L + j];
        if (!std::isnan(s)) REQUIRE_MESSAGE(std::isnan(s), "scores row ", r, " col ", j, " was written: ", s);
      }
  }
  std::vector<std::int32_t> kept(std::size_t(rows) * c.budget()), counts(rows);
  auto kept_set = make_index_set(kept.data(), counts.data(), rows, c.budget());
  host_select(c, scores, row_len, rows, L, kept_set);
  std::vector<__nv_bfloat16> hk(dst_k.size()), hv(dst_k.size());
  std::memset(static_cast<void*>(hk.data()), kvsift_test::kPoisonByte, hk.size() * 2);
  std::memset(static_cast<void*>(hv.data()), kvsift_test::kPoisonByte, hv.size() * 2);
  std::vector<std::int32_t> h_new(p.batch), h_pos(std::size_t(rows) * c.capacity);
  auto host_dst = make_bhsd(hk.data(), hv.data(), p.batch, H, c.capacity, p.head_dim, dst_len_h.data());
  REQUIRE(kh::compact_kv(kh::Exec{}, dp.host_view(), as_const(kept_set), c.window, host_dst,
                         CompactOutputs{h_new.data(), h_pos.data(), c.capacity}).ok());

  CHECK(new_len.download() == h_new);
  CHECK(positions.download() == h_pos);
  const auto gk = dst_k.download(), gv = dst_v.download();
  CHECK(std::memcmp(gk.data(), hk.data(), gk.size() * 2) == 0);
  CHECK(std::memcmp(gv.data(), hv.data(), gv.size() * 2) == 0);
}

}  // namespace

TEST_CASE("compress_prompt on the GPU: every policy and GQA mode equals the host selection") {
  auto rng = kvsift_test::make_rng(80);
  for (auto policy : {CompressionPolicy::kClusterAttn, CompressionPolicy::kSnapKV, CompressionPolicy::kStreamingLLM,
                      CompressionPolicy::kH2OPrefill})
    for (auto heads : {ScoreHeads::kKvHeadMean, ScoreHeads::kQueryHead}) {
      CAPTURE(static_cast<int>(policy));
      CAPTURE(static_cast<int>(heads));
      run_policy(rng, policy, heads);
    }
}

TEST_CASE("compress_prompt is CUDA-graph capturable and replays for new lengths") {
  auto rng = kvsift_test::make_rng(81);
  PromptCompressionConfig c;
  c.capacity = 128;
  c.window = 32;
  const int L = 1000;
  Prompt p(rng, 2, 2, 4, L, 128, c.window);
  DevicePrompt dp(p);
  const PromptCompressionShape shape{p.batch, p.kv_heads, p.q_heads, L};
  const int rows = p.batch * p.kv_heads;
  DeviceBuffer<__nv_bfloat16> dst_k(std::size_t(rows) * c.capacity * p.head_dim), dst_v(dst_k.size());
  DeviceBuffer<std::int32_t> dst_len(std::vector<std::int32_t>(p.batch, c.capacity)), new_len(p.batch),
      positions(std::size_t(rows) * c.capacity);
  const auto exec = kc::Exec::for_current_device();
  std::size_t bytes = 0;
  REQUIRE(compress_prompt_workspace_bytes(exec, c, shape, &bytes).ok());
  DeviceBuffer<unsigned char> ws(bytes);
  auto dst = make_bhsd(dst_k.get(), dst_v.get(), p.batch, p.kv_heads, c.capacity, p.head_dim, dst_len.get());
  auto q = make_query_rows<__nv_bfloat16>(dp.dq.get(), c.window, p.q_heads, p.head_dim);
  const CompactOutputs out{new_len.get(), positions.get(), c.capacity};

  cudaStream_t stream;
  KVSIFT_TEST_CUDA(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t replay;
  KVSIFT_TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const auto on_stream = exec.on(stream);
  const Status captured =
      compress_prompt(on_stream, c, shape, dp.device_view(), q, nullptr, dst, out, Workspace{ws.get(), ws.size()});
  KVSIFT_TEST_CUDA(cudaStreamEndCapture(stream, &graph));
  REQUIRE(captured.ok());
  KVSIFT_TEST_CUDA(cudaGraphInstantiate(&replay, graph, 0));

  for (int round = 0; round < 2; ++round) {
    p.lengths = {kvsift_test::uniform_int(rng, c.capacity, L), kvsift_test::uniform_int(rng, c.window + 1, L)};
    dp.dlen.upload(p.lengths);
    positions.poison();
    KVSIFT_TEST_CUDA(cudaGraphLaunch(replay, stream));
    KVSIFT_TEST_CUDA(cudaStreamSynchronize(stream));
    const auto replayed = positions.download();
    positions.poison();
    REQUIRE(compress_prompt(on_stream, c, shape, dp.device_view(), q, nullptr, dst, out, Workspace{ws.get(), ws.size()}).ok());
    KVSIFT_TEST_CUDA(cudaStreamSynchronize(stream));
    CHECK(positions.download() == replayed);
    const auto lens = new_len.download();
    for (int b = 0; b < p.batch; ++b) CHECK(lens[b] == std::min(c.capacity, p.lengths[b]));
  }
  cudaGraphExecDestroy(replay);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_CASE("calibrate_num_block on the GPU agrees with the host") {
  auto rng = kvsift_test::make_rng(82);
  PromptCompressionConfig c;
  c.capacity = 128;
  c.window = 16;
  c.theta = 0.02f;
  const int L = 800, T = 4;
  Prompt p(rng, 2, 2, 4, L, 64, c.window);
  p.lengths = {800, 555};
  DevicePrompt dp(p);
  // The host runs on the bf16-rounded values the GPU sees.
  for (std::size_t i = 0; i < p.k.size(); ++i) p.k[i] = __bfloat162float(dp.k[i]);
  for (std::size_t i = 0; i < p.q.size(); ++i) p.q[i] = __bfloat162float(dp.q[i]);
  std::vector<float> dq_f = kvsift_test::random_values<float>(rng, std::size_t(2) * T * 8 * 64, -2.f, 2.f);
  const auto dq_bf = DevicePrompt::to_bf16(dq_f);
  for (std::size_t i = 0; i < dq_f.size(); ++i) dq_f[i] = __bfloat162float(dq_bf[i]);
  const PromptCompressionShape shape{2, 2, 8, L};
  const std::vector<int> candidates = {4, 16, 64};

  NumBlockCalibration host_result, gpu_result;
  {
    std::vector<float> sk(std::size_t(2) * 2 * c.capacity * 64), sv(sk.size());
    std::vector<std::int32_t> slen(2, c.capacity);
    auto scratch = make_bhsd(sk.data(), sv.data(), 2, 2, c.capacity, 64, slen.data());
    std::size_t bytes = 0;
    REQUIRE(calibrate_num_block_workspace_bytes(kh::Exec{}, c, shape, T, &bytes).ok());
    std::vector<unsigned char> ws(bytes + 256);
    void* base = reinterpret_cast<void*>(align_up(reinterpret_cast<std::uintptr_t>(ws.data())));
    REQUIRE(calibrate_num_block(kh::Exec{}, c, shape, p.view(), p.queries(), nullptr,
                                make_query_rows<float>(dq_f.data(), T, 8, 64), T, candidates, scratch, &host_result,
                                Workspace{base, bytes}).ok());
  }
  DeviceBuffer<__nv_bfloat16> sk(std::size_t(2) * 2 * c.capacity * 64), sv(sk.size()), dq(dq_bf);
  DeviceBuffer<std::int32_t> slen(std::vector<std::int32_t>(2, c.capacity));
  const auto exec = kc::Exec::for_current_device();
  std::size_t bytes = 0;
  REQUIRE(calibrate_num_block_workspace_bytes(exec, c, shape, T, &bytes).ok());
  DeviceBuffer<unsigned char> ws(bytes);
  auto scratch = make_bhsd(sk.get(), sv.get(), 2, 2, c.capacity, 64, slen.get());
  auto wq = make_query_rows<__nv_bfloat16>(dp.dq.get(), c.window, 8, 64);
  REQUIRE(calibrate_num_block(exec, c, shape, dp.device_view(), wq, nullptr,
                              make_query_rows<__nv_bfloat16>(dq.get(), T, 8, 64), T, candidates, scratch, &gpu_result,
                              Workspace{ws.get(), ws.size()}).ok());
  REQUIRE(gpu_result.table.size() == candidates.size());
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    MESSAGE("num_block ", candidates[i], ": host ", host_result.table[i].mean_cosine, ", gpu ", gpu_result.table[i].mean_cosine);
    CHECK(gpu_result.table[i].mean_cosine == doctest::Approx(host_result.table[i].mean_cosine).epsilon(2e-3));
  }
}

TEST_CASE("compress_prompt on the GPU: an Exec without device facts is refused before any launch") {
  auto rng = kvsift_test::make_rng(83);
  PromptCompressionConfig c;
  c.capacity = 64;
  c.window = 16;
  const int L = 300;
  Prompt p(rng, 1, 2, 2, L, 64, c.window);
  DevicePrompt dp(p);
  const PromptCompressionShape shape{1, 2, 4, L};
  const auto exec = kc::Exec::for_current_device();
  std::size_t bytes = 0;
  REQUIRE(compress_prompt_workspace_bytes(exec, c, shape, &bytes).ok());
  DeviceBuffer<unsigned char> ws(bytes);
  DeviceBuffer<__nv_bfloat16> dst_k(std::size_t(2) * c.capacity * 64), dst_v(dst_k.size());
  DeviceBuffer<std::int32_t> dst_len(std::vector<std::int32_t>{c.capacity}), new_len(1);
  new_len.poison();
  const auto dst = make_bhsd(dst_k.get(), dst_v.get(), 1, 2, c.capacity, 64, dst_len.get());
  const auto q = make_query_rows<__nv_bfloat16>(dp.dq.get(), c.window, p.q_heads, p.head_dim);
  const kc::Exec no_facts{exec.stream, DeviceFacts{}};
  const Status st = compress_prompt(no_facts, c, shape, dp.device_view(), q, nullptr, dst, CompactOutputs{new_len.get()},
                                    Workspace{ws.get(), ws.size()});
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message() == "compress_prompt: exec.device.num_sms = 0 (make the Exec with Exec::for_current_device(stream), "
                        "or fill its DeviceFacts)");
  kvsift_test::sync_and_check();
  const auto untouched = new_len.download();
  std::int32_t poison;
  std::memset(&poison, kvsift_test::kPoisonByte, sizeof poison);
  CHECK(untouched[0] == poison);
}
