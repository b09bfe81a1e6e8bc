// One layer's prompt-cache compression (ClusterAttn, SnapKV, StreamingLLM, H2O-prefill) on a
// Llama-3-8B layer (32 query heads, 8 KV heads, head_dim 128, bf16, window W = 32), and decode over
// the full versus the compressed cache.
//
// Bytes floor of a compression (counted for `of_ceiling`): the prompt's K read once per score pass
// (twice when the engine supplies no log-sum-exp, BM_CompressPrompt: one pass for each query's LSE,
// one for the column sums; once with the LSE from prefill, BM_CompressPromptWithLse; not at all for
// StreamingLLM) plus the compaction: Cp rows of K and V read and written per KV head. The PyTorch
// SnapKV baseline for the same shapes is benchmarks/torch_snapkv.py.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "kvsift/ops/decode_attention.cuh"
#include "support/bench_support.cuh"

namespace {

constexpr int kKvHeads = 8, kQHeads = 32, kHeadDim = 128, kWindow = 32;
using bf16 = __nv_bfloat16;

struct Layer {
  int batch, len;
  kvsift_bench::DeviceArray<bf16> k, v, q;
  kvsift_bench::DeviceArray<std::int32_t> lengths;
  Layer(int b, int l, int q_rows)
      : batch(b), len(l), k(std::size_t(b) * kKvHeads * l * kHeadDim), v(k.n), q(std::size_t(b) * q_rows * kQHeads * kHeadDim),
        lengths(b) {
    kvsift_bench::fill_uniform_bf16(k.get(), k.n, -1.f, 1.f, 11);
    kvsift_bench::fill_uniform_bf16(v.get(), v.n, -1.f, 1.f, 12);
    kvsift_bench::fill_uniform_bf16(q.get(), q.n, -1.f, 1.f, 13);
    const std::vector<std::int32_t> full(b, l);
    KVSIFT_BENCH_CUDA(cudaMemcpy(lengths.get(), full.data(), lengths.bytes(), cudaMemcpyHostToDevice));
  }
  kvsift::ContiguousKV<bf16> view() const {
    return kvsift::make_bhsd(k.get(), v.get(), batch, kKvHeads, len, kHeadDim, lengths.get());
  }
};

// The same K/V memory as a vLLM-style paged cache (HND pages of `page` tokens, sequence b on pages
// b * len / page onwards): the paged views' block-table checks are what this measures beside the
// contiguous layout (the bytes are the same).
struct PagedLayer {
  kvsift_bench::DeviceArray<std::int32_t> table;
  int max_pages;
  PagedLayer(const Layer& layer, int page)
      : table(std::size_t(layer.batch) * ((layer.len + page - 1) / page)), max_pages((layer.len + page - 1) / page) {
    std::vector<std::int32_t> ids(table.n);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = std::int32_t(i);
    KVSIFT_BENCH_CUDA(cudaMemcpy(table.get(), ids.data(), table.bytes(), cudaMemcpyHostToDevice));
  }
  kvsift::PagedKV<bf16> view(const Layer& layer, int page) const {
    return kvsift::make_paged(layer.k.get(), layer.v.get(), table.get(), layer.batch, max_pages, layer.batch * max_pages,
                              kKvHeads, page, kHeadDim, kvsift::PageLayout::kHND, layer.lengths.get());
  }
};

// One compress_prompt call; give_lse: with the window queries' log-sum-exp from the engine's prefill
// (FlashAttention-style prefill kernels return it), so the window policies score in one pass;
// dependent: with Exec::dependent_launch, as an engine sets it (each kernel a programmatic dependent of
// the one before).
void compress_prompt_bench(benchmark::State& state, bool give_lse, bool dependent = false) {
  const auto policy = static_cast<kvsift::CompressionPolicy>(state.range(0));
  const int batch = int(state.range(1)), len = int(state.range(2)), cp = int(state.range(3));
  const int page = state.range(4) > 0 ? int(state.range(4)) : 0;  // 0: the contiguous BHSD cache
  const bool h2o = policy == kvsift::CompressionPolicy::kH2OPrefill;
  if (give_lse && h2o) {  // its log-sum-exps would be one per prompt query: not what this sizes
    state.SkipWithError("H2O-prefill with the engine's log-sum-exp is not benchmarked");
    return;
  }
  Layer layer(batch, len, h2o ? len : kWindow);
  kvsift::PromptCompressionConfig c;
  c.policy = policy;
  c.capacity = cp;
  c.window = kWindow;
  c.theta = cp <= 1024 ? 2e-3f : (cp <= 2048 ? 1e-3f : 8e-4f);  // the paper's thresholds per budget
  const kvsift::PromptCompressionShape shape{batch, kKvHeads, kQHeads, len};
  kvsift_bench::DeviceArray<bf16> dk(std::size_t(batch) * kKvHeads * cp * kHeadDim), dv(dk.n);
  kvsift_bench::DeviceArray<std::int32_t> dst_len(batch), new_len(batch), positions(std::size_t(batch) * kKvHeads * cp);
  kvsift::cuda::Exec exec = kvsift_bench::gpu();
  exec.dependent_launch = dependent;
  std::size_t ws_bytes = 0;
  const kvsift::Status sized = kvsift::compress_prompt_workspace_bytes(exec, c, shape, &ws_bytes);
  if (!sized.ok()) {
    state.SkipWithError(sized.to_string().c_str());
    return;
  }
  kvsift_bench::DeviceArray<unsigned char> ws(ws_bytes);
  const std::vector<std::int32_t> caps(batch, cp);
  KVSIFT_BENCH_CUDA(cudaMemcpy(dst_len.get(), caps.data(), dst_len.bytes(), cudaMemcpyHostToDevice));
  const auto dst = kvsift::make_bhsd(dk.get(), dv.get(), batch, kKvHeads, cp, kHeadDim, dst_len.get());
  const auto q = kvsift::make_query_rows<bf16>(layer.q.get(), h2o ? len : kWindow, kQHeads, kHeadDim);
  kvsift_bench::DeviceArray<float> lse(give_lse ? std::size_t(batch) * kQHeads * kWindow : 1);
  if (give_lse) kvsift_bench::fill_uniform(lse.get(), lse.n, 8.f, 9.f, 14);  // any finite values: the work is the same
  const float* lse_rows = give_lse ? lse.get() : nullptr;
  const kvsift::CompactOutputs out{new_len.get(), positions.get(), cp};
  const PagedLayer paged(layer, page > 0 ? page : 16);
  auto run = [&](cudaStream_t s) {
    if (page > 0)
      return kvsift::compress_prompt(exec.on(s), c, shape, paged.view(layer, page), q, lse_rows, dst, out,
                                     kvsift::Workspace{ws.get(), ws_bytes});
    return kvsift::compress_prompt(exec.on(s), c, shape, layer.view(), q, lse_rows, dst, out,
                                   kvsift::Workspace{ws.get(), ws_bytes});
  };
  const kvsift::Status st = run(nullptr);
  if (!st.ok()) {
    (void)cudaGetLastError();  // a failed launch must not leak into the next benchmark
    state.SkipWithError(st.to_string().c_str());
    return;
  }
  const double k_bytes = double(batch) * kKvHeads * len * kHeadDim * sizeof(bf16);
  const double compaction = 4.0 * batch * kKvHeads * cp * kHeadDim * sizeof(bf16);
  const int passes = policy == kvsift::CompressionPolicy::kStreamingLLM ? 0 : give_lse ? 1 : 2;
  state.counters["floor_us"] = (passes * k_bytes + compaction) / (kvsift_bench::read_ceiling_tbps() * 1e12) * 1e6;
  state.counters["floor_lse_us"] = ((passes ? 1 : 0) * k_bytes + compaction) / (kvsift_bench::read_ceiling_tbps() * 1e12) * 1e6;
  kvsift_bench::time_gpu(state, passes * k_bytes + compaction, [&](cudaStream_t s) { (void)run(s); });
}

void BM_CompressPrompt(benchmark::State& state) { compress_prompt_bench(state, false); }
void BM_CompressPromptWithLse(benchmark::State& state) { compress_prompt_bench(state, true); }
void BM_CompressPromptDependent(benchmark::State& state) { compress_prompt_bench(state, state.range(5) != 0, true); }

// The first stage alone: window_scores of the W = 32 window queries (kKvHeadMean rows), without and
// with the engine's log-sum-exp (two passes over K, or one), contiguous or paged (16-token pages).
// Counters: floor_us (K read once per pass at the read ceiling), tflops (2 x 128 rows x len x 128
// per KV head per pass: the logits' multiply-adds).
void BM_WindowScores(benchmark::State& state) {
  const int batch = int(state.range(0)), len = int(state.range(1)), page = int(state.range(3));
  const bool give_lse = state.range(2) != 0;
  Layer layer(batch, len, kWindow);
  kvsift_bench::DeviceArray<float> scores(std::size_t(batch) * kKvHeads * len), lse(std::size_t(batch) * kQHeads * kWindow);
  kvsift_bench::fill_uniform(lse.get(), lse.n, 8.f, 9.f, 14);  // any finite values: the work is the same
  kvsift::WindowScoreParams p;
  p.window = kWindow;
  p.num_queries = kWindow;
  p.lse = give_lse ? lse.get() : nullptr;
  const auto q = kvsift::make_query_rows<bf16>(layer.q.get(), kWindow, kQHeads, kHeadDim);
  const auto out = kvsift::make_strided_view(scores.get(), std::int64_t(batch) * kKvHeads, len);
  const auto& exec = kvsift_bench::gpu();
  const PagedLayer paged(layer, page > 0 ? page : 16);
  std::size_t bytes = 0;
  kvsift::Status st = page > 0 ? kvsift::window_scores_workspace_bytes(exec, paged.view(layer, page), q, p, out, &bytes)
                               : kvsift::window_scores_workspace_bytes(exec, layer.view(), q, p, out, &bytes);
  kvsift_bench::DeviceArray<unsigned char> ws(std::max<std::size_t>(bytes, 1));
  auto run = [&](cudaStream_t s) {
    const kvsift::Workspace w{ws.get(), bytes};
    return page > 0 ? kvsift::cuda::window_scores(exec.on(s), paged.view(layer, page), q, p, out, w)
                    : kvsift::cuda::window_scores(exec.on(s), layer.view(), q, p, out, w);
  };
  if (st.ok()) st = run(nullptr);
  if (!st.ok()) {
    (void)cudaGetLastError();
    state.SkipWithError(st.to_string().c_str());
    return;
  }
  const int passes = give_lse ? 1 : 2;
  const double k_bytes = double(batch) * kKvHeads * len * kHeadDim * sizeof(bf16);
  const double flops = 2.0 * passes * batch * kKvHeads * (kWindow * (kQHeads / kKvHeads)) * double(len) * kHeadDim;
  state.counters["floor_us"] = passes * k_bytes / (kvsift_bench::read_ceiling_tbps() * 1e12) * 1e6;
  kvsift_bench::time_gpu(state, passes * k_bytes, [&](cudaStream_t s) { (void)run(s); });
  if (state.counters.count("us_median")) state.counters["tflops"] = flops / double(state.counters["us_median"]) * 1e-6;
}

// Dense decode (one query per sequence) over a cache of `len` tokens: the full prompt, or the
// compressed one of Cp tokens.
void BM_DecodeOverCache(benchmark::State& state) {
  const int batch = int(state.range(0)), len = int(state.range(1));
  Layer layer(batch, len, 1);
  kvsift_bench::DeviceArray<bf16> out(std::size_t(batch) * kQHeads * kHeadDim);
  auto p = kvsift::make_decode_attention_params<bf16>(layer.q.get(), out.get(), 1, kQHeads, kHeadDim);
  std::size_t bytes = 0;
  const auto kv = layer.view();
  kvsift::Status st = kvsift::decode_attention_workspace_bytes(kvsift_bench::gpu(), kv, p, &bytes);
  kvsift_bench::DeviceArray<unsigned char> ws(bytes);
  if (st.ok()) st = kvsift::cuda::decode_attention(kvsift_bench::gpu(), kv, p, kvsift::Workspace{ws.get(), bytes});
  if (!st.ok()) {
    (void)cudaGetLastError();
    state.SkipWithError(st.to_string().c_str());
    return;
  }
  kvsift_bench::time_gpu(state, 2.0 * layer.k.n * sizeof(bf16), [&](cudaStream_t s) {
    (void)kvsift::cuda::decode_attention(kvsift_bench::gpu().on(s), kv, p, kvsift::Workspace{ws.get(), bytes});
  });
}

void compression_shapes(benchmark::internal::Benchmark* b) {
  using P = kvsift::CompressionPolicy;
  for (P policy : {P::kClusterAttn, P::kSnapKV, P::kStreamingLLM})
    for (int batch : {1, 8})
      for (int len : {32768, 131072})
        for (int cp : {1024, 2048, 4096}) b->Args({int(policy), batch, len, cp, 0});
  // H2O-prefill scores every prompt query against every key (O(L^2 d)): one shape only.
  b->Args({int(P::kH2OPrefill), 1, 32768, 1024, 0});
  // The paged layout (16-token pages) beside the contiguous one, for the window-score policies.
  for (P policy : {P::kClusterAttn, P::kSnapKV})
    for (int batch : {1, 8})
      for (int len : {32768, 131072}) b->Args({int(policy), batch, len, 1024, 16});
}

}  // namespace

BENCHMARK(BM_CompressPrompt)
    ->Apply(compression_shapes)
    ->ArgNames({"policy", "batch", "len", "cp", "page"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
// ClusterAttn and SnapKV with the prefill's log-sum-exp (one score pass): issue 16's compression row
// for an engine that hands it over.
BENCHMARK(BM_CompressPromptWithLse)
    ->ArgsProduct({{int(kvsift::CompressionPolicy::kClusterAttn), int(kvsift::CompressionPolicy::kSnapKV)}, {1, 8}, {131072}, {1024}, {0}})
    ->ArgNames({"policy", "batch", "len", "cp", "page"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CompressPromptDependent)
    ->ArgsProduct({{int(kvsift::CompressionPolicy::kClusterAttn), int(kvsift::CompressionPolicy::kSnapKV)}, {1, 8}, {131072}, {1024}, {0}, {0, 1}})
    ->ArgNames({"policy", "batch", "len", "cp", "page", "lse"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_WindowScores)
    ->ArgsProduct({{1, 8}, {32768, 131072}, {0, 1}, {0}})
    ->Args({1, 131072, 0, 16})
    ->Args({8, 131072, 0, 16})
    ->ArgNames({"batch", "len", "lse", "page"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeOverCache)
    ->Args({8, 131072})
    ->Args({8, 1024})
    ->Args({1, 131072})
    ->Args({1, 1024})
    ->ArgNames({"batch", "len"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
