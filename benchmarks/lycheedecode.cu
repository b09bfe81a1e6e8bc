// LycheeDecode hybrid layer step on a Llama-3-8B layer (32 query heads, 8 KV heads, head_dim 128,
// bf16, contiguous BSHD cache, every sequence full), cold L2.
//
// The timed launch is one decode_layer of a layer with R retrieval KV heads (R = 0, 1, 2, 8): the
// mixed attention launch (retrieval heads dense with fused score emission, sparse heads gathered over
// the index rows a previous all-retrieval layer wrote), then the retrieval heads' top-k and the
// handoff into the index table. Modes: token budget 1024 or 4096 (128 sink + 256 recent inside), and
// blocks 64 x 64 (4096 tokens); in the names, mode:0 = token 1024, mode:1 = token 4096, mode:2 = block
// 64 x 64. BM_Dense is our own dense decode_attention on the same cache.
//
// Bytes floor of a step (the `MB`, `TB/s` and `of_ceiling` counters; 1 / of_ceiling is the step
// time over its floor): K and V rows the step must read (retrieval heads: the whole sequence; sparse
// heads: their budget), q read, out written, the sparse heads' index rows read and the retrieval
// heads' rows written. Extra counters: attention_us (the same attention launch alone), handoff_share
// (1 - attention / step: what selection and handoff cost), selection_us (token modes: the hand-off's
// top-k alone on the attention's scores), dense_us and speedup_vs_dense. BM_HybridLayerDependent times
// the same step with Exec::dependent_launch (every kernel a programmatic dependent of the one before);
// BM_HybridLayerBeside the step with its handoff on a second stream beside a stand-in for the
// engine's next work (hybrid_layer's comment), and how much of the handoff stays exposed.
// torch SDPA (cuDNN) dense decode on the same shapes: benchmarks/torch_decode_attention.py.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "kvsift/policy/lycheedecode.cuh"
#include "support/bench_support.cuh"

namespace {

using BF16 = __nv_bfloat16;
constexpr int kHq = 32, kHkv = 8, kD = 128;
constexpr int kSink = 128, kRecent = 256;

enum Mode : int { kDense = -1, kToken1024 = 0, kToken4096 = 1, kBlock64x64 = 2, kBlockTenth = 3 };

// Block modes: 64-token blocks, 64 of them, or a tenth of the sequence's blocks (the paper's
// "10% of blocks" point).
bool is_block_mode(int mode) { return mode == kBlock64x64 || mode == kBlockTenth; }
int blocks_kept(int mode, int seq) { return mode == kBlockTenth ? seq / 64 / 10 : 64; }

// One full-length cache shared by every layer of the benchmark (contents do not change the traffic).
struct Inputs {
  int batch, seq;
  kvsift_bench::DeviceArray<BF16> k, v, q, out;
  kvsift_bench::DeviceArray<std::int32_t> lengths;
  Inputs(int b, int s)
      : batch(b),
        seq(s),
        k(std::size_t(b) * s * kHkv * kD),
        v(k.n),
        q(std::size_t(b) * kHq * kD),
        out(q.n),
        lengths(b) {
    kvsift_bench::fill_uniform_bf16(k.get(), k.n, -1.f, 1.f, 21);
    kvsift_bench::fill_uniform_bf16(v.get(), v.n, -1.f, 1.f, 22);
    kvsift_bench::fill_uniform_bf16(q.get(), q.n, -1.f, 1.f, 23);
    const std::vector<std::int32_t> len(b, s);
    KVSIFT_BENCH_CUDA(cudaMemcpy(lengths.get(), len.data(), len.size() * 4, cudaMemcpyHostToDevice));
  }
  kvsift::ContiguousKV<BF16> view() const {
    return kvsift::make_bshd(k.get(), v.get(), batch, kHkv, seq, kD, lengths.get());
  }
};

double dense_decode_us(const Inputs& in, std::size_t* bytes_out = nullptr) {
  const auto kv = in.view();
  auto p = kvsift::make_decode_attention_params<BF16>(in.q.get(), in.out.get(), 1, kHq, kD);
  std::size_t bytes = 0;
  if (!kvsift::decode_attention_workspace_bytes(kvsift_bench::gpu(), kv, p, &bytes).ok()) return -1.0;
  kvsift_bench::DeviceArray<unsigned char> ws(bytes);
  if (bytes_out) *bytes_out = bytes;
  return kvsift_bench::median_gpu_us([&](cudaStream_t s) {
    (void)kvsift::cuda::decode_attention(kvsift_bench::gpu().on(s), kv, p, kvsift::Workspace{ws.get(), bytes});
  });
}

kvsift::LycheeDecodeConfig layer_config(int batch, int seq, Mode mode, int retrieval) {
  kvsift::LycheeDecodeConfig c;
  c.num_layers = 2;  // layer 0 (all retrieval) seeds the table; layer 1 is the one timed
  c.num_q_heads = kHq;
  c.num_kv_heads = kHkv;
  c.head_dim = kD;
  std::vector<std::uint8_t> roles(2 * kHkv, 0);
  for (int h = 0; h < kHkv; ++h) roles[h] = 1;
  for (int h = 0; h < retrieval; ++h) roles[kHkv + h] = 1;
  (void)kvsift::make_head_roles(2, kHkv, roles.data(), &c.roles);
  c.max_batch = batch;
  c.max_kv_length = seq;
  c.sink = kSink;
  c.recent = kRecent;
  // KVSIFT_BENCH_CANDIDATES set: score candidates on (off by default, as in the config), against the
  // full search every step. The timed step repeats one query, so with candidates every step after the
  // first selects from its list (the steady state of a threshold that holds).
  c.score_candidates = std::getenv("KVSIFT_BENCH_CANDIDATES") != nullptr;
  if (is_block_mode(mode)) {
    c.selection = kvsift::LycheeDecodeSelection::kBlock;
    c.block_size = 64;
    c.num_blocks = blocks_kept(mode, seq);
    c.sink_blocks = 1;
  } else {
    c.selection = kvsift::LycheeDecodeSelection::kToken;
    c.budget = mode == kToken1024 ? 1024 : 4096;
  }
  return c;
}

void BM_Dense(benchmark::State& state) {
  const int B = int(state.range(0)), S = int(state.range(1));
  Inputs in(B, S);
  const auto kv = in.view();
  auto p = kvsift::make_decode_attention_params<BF16>(in.q.get(), in.out.get(), 1, kHq, kD);
  std::size_t bytes = 0;
  const auto st = kvsift::decode_attention_workspace_bytes(kvsift_bench::gpu(), kv, p, &bytes);
  if (!st.ok()) {
    state.SkipWithError(st.to_string().c_str());
    return;
  }
  kvsift_bench::DeviceArray<unsigned char> ws(bytes);
  const double floor = double(B) * kHkv * S * 2.0 * kD * sizeof(BF16) + 2.0 * in.q.bytes();
  kvsift_bench::time_gpu(state, floor, [&](cudaStream_t s) {
    const auto r = kvsift::cuda::decode_attention(kvsift_bench::gpu().on(s), kv, p, kvsift::Workspace{ws.get(), bytes});
    if (!r.ok()) std::fprintf(stderr, "decode_attention: %s\n", r.to_string().c_str());
  });
}

// One Llama-3-8B layer's weights (436 MB): what the GEMVs after a layer's attention stream (its
// o-projection and MLP, the next layer's q/k/v) at batch 1-8. BM_HybridLayerBeside reads this much
// beside the handoff as a stand-in for that work.
constexpr std::size_t kEngineBytes = std::size_t(436) * 1000 * 1000;

enum class Variant { kPlain, kDependent, kBeside };

// One layer as described at the top. kDependent launches every kernel of the step with
// Exec::dependent_launch (BM_HybridLayerDependent: the step's time alone, no extra counters).
// kBeside (BM_HybridLayerBeside) runs it as an engine that overlaps the handoff does
// (docs/ops/lycheedecode.md, "The handoff on a second stream"): attend_layer on the step's stream,
// hand_off_layer on a second one, and on the step's stream meanwhile a read of kEngineBytes; counters
// engine_us (the read alone), sequential_us (decode_layer, then the read) and exposed_handoff_us (the
// step - attention_us - engine_us: what of the handoff is still on the critical path).
void hybrid_layer(benchmark::State& state, Variant variant) {
  const bool dependent = variant == Variant::kDependent;
  const int B = int(state.range(0)), S = int(state.range(1)), R = int(state.range(3));
  const Mode mode = Mode(state.range(2));
  const auto config = layer_config(B, S, mode, R);
  kvsift::LycheeDecodePolicy decoder;
  auto st = kvsift::LycheeDecodePolicy::create(config, &decoder);
  if (!st.ok()) {
    state.SkipWithError(st.to_string().c_str());
    return;
  }
  Inputs in(B, S);
  const auto kv = in.view();
  const auto io = kvsift::make_query_io<BF16>(in.q.get(), in.out.get(), 1, kHq, kD);
  kvsift_bench::DeviceArray<unsigned char> state_memory(decoder.state_bytes());
  std::size_t ws_bytes = 0;
  st = decoder.workspace_bytes<BF16>(kvsift_bench::gpu(), &ws_bytes);
  kvsift_bench::DeviceArray<unsigned char> ws(ws_bytes);
  kvsift::LycheeDecodeState lychee;
  st = decoder.make_state(state_memory.get(), state_memory.n, &lychee);
  if (st.ok()) st = decoder.decode_layer(kvsift_bench::gpu(), lychee, 0, kv, io, kvsift::Workspace{ws.get(), ws_bytes});  // seed
  if (!st.ok()) {
    state.SkipWithError(st.to_string().c_str());
    return;
  }
  KVSIFT_BENCH_CUDA(cudaDeviceSynchronize());

  // Re-running layer 1 of the same step: the host cursor is put back before every launch.
  auto step = [&](cudaStream_t s) {
    lychee.next_layer = 1;
    kvsift::cuda::Exec exec = kvsift_bench::gpu().on(s);
    exec.dependent_launch = dependent;
    const auto r = decoder.decode_layer(exec, lychee, 1, kv, io, kvsift::Workspace{ws.get(), ws_bytes});
    if (!r.ok()) std::fprintf(stderr, "decode_layer: %s\n", r.to_string().c_str());
  };
  const double budget_tokens = is_block_mode(mode) ? 64.0 * blocks_kept(mode, S) : (mode == kToken1024 ? 1024.0 : 4096.0);
  const double kv_tokens = double(B) * (double(R) * S + double(kHkv - R) * budget_tokens);
  const double index_entries = double(B) * kHkv * (is_block_mode(mode) ? budget_tokens / 64.0 : budget_tokens);
  const double floor = kv_tokens * 2.0 * kD * sizeof(BF16) + 2.0 * in.q.bytes() + index_entries * 4.0;
  if (variant != Variant::kBeside) kvsift_bench::time_gpu(state, floor, step);
  if (dependent) return;
  double engine_us = 0, sequential_us = 0;
  if (variant == Variant::kBeside) {
    kvsift_bench::DeviceArray<unsigned char> weights(kEngineBytes);
    kvsift_bench::DeviceArray<float> sink(1024);
    KVSIFT_BENCH_CUDA(cudaMemset(weights.get(), 0, weights.n));
    cudaStream_t side = nullptr;
    cudaEvent_t attended = nullptr, handed_off = nullptr;
    int least = 0, greatest = 0;  // the handoff first whenever SM slots free up (as the minimal decoder does)
    KVSIFT_BENCH_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    KVSIFT_BENCH_CUDA(cudaStreamCreateWithPriority(&side, cudaStreamNonBlocking, greatest));
    KVSIFT_BENCH_CUDA(cudaEventCreateWithFlags(&attended, cudaEventDisableTiming));
    KVSIFT_BENCH_CUDA(cudaEventCreateWithFlags(&handed_off, cudaEventDisableTiming));
    const kvsift::Workspace w{ws.get(), ws_bytes};
    const auto engine = [&](cudaStream_t s) { kvsift_bench::launch_stream_read(weights.get(), weights.n, sink.get(), s); };
    kvsift_bench::time_gpu(state, floor + double(kEngineBytes), [&](cudaStream_t s) {
      lychee.next_layer = 1;
      const kvsift::cuda::Exec exec = kvsift_bench::gpu().on(s);
      auto r = decoder.attend_layer(exec, lychee, 1, kv, io, w);
      KVSIFT_BENCH_CUDA(cudaEventRecord(attended, s));
      KVSIFT_BENCH_CUDA(cudaStreamWaitEvent(side, attended, 0));
      if (r.ok()) r = decoder.hand_off_layer(exec.on(side), lychee, 1, kv, w);
      if (!r.ok()) std::fprintf(stderr, "attend_layer / hand_off_layer: %s\n", r.to_string().c_str());
      KVSIFT_BENCH_CUDA(cudaEventRecord(handed_off, side));
      engine(s);
      KVSIFT_BENCH_CUDA(cudaStreamWaitEvent(s, handed_off, 0));
    });
    engine_us = kvsift_bench::median_gpu_us(engine);
    sequential_us = kvsift_bench::median_gpu_us([&](cudaStream_t s) {
      step(s);
      engine(s);
    });
    state.counters["engine_us"] = engine_us;
    state.counters["sequential_us"] = sequential_us;
    cudaEventDestroy(attended);
    cudaEventDestroy(handed_off);
    cudaStreamDestroy(side);
  }

  // The attention launch alone (same parameters as inside the step), and our dense decode.
  kvsift_bench::DeviceArray<float> scores(std::size_t(B) * kHkv * ((S + 63) / 64 * 64 + 4));
  const auto attention = kvsift::detail::lycheedecode_attention_params(
      config, io, 1, decoder.roles(1), kvsift::as_const(lychee.table), R > 0 ? scores.get() : nullptr,
      is_block_mode(mode) ? (S / 64 + 4) : S + 4);
  std::size_t attention_bytes = 0;
  if (kvsift::decode_attention_workspace_bytes(kvsift_bench::gpu(), kv, attention, &attention_bytes).ok()) {
    kvsift_bench::DeviceArray<unsigned char> attention_ws(attention_bytes);
    const double attention_us = kvsift_bench::median_gpu_us([&](cudaStream_t s) {
      (void)kvsift::cuda::decode_attention(kvsift_bench::gpu().on(s), kv, attention, kvsift::Workspace{attention_ws.get(), attention_bytes});
    });
    state.counters["attention_us"] = attention_us;
    if (state.counters.count("us_median") && variant == Variant::kBeside)
      state.counters["exposed_handoff_us"] = double(state.counters["us_median"]) - attention_us - engine_us;
    else if (state.counters.count("us_median"))
      state.counters["handoff_share"] = 1.0 - attention_us / double(state.counters["us_median"]);
  }
  if (variant == Variant::kBeside) return;
  // Token modes: the hand-off's top-k alone, with the layer's parameters, on the scores the attention
  // launch above just wrote (full-length rows), so the part of the hand-off outside the top-k (the
  // row plan's kernel and the launch gaps) is read off as layer - attention - selection.
  if (R > 0 && !is_block_mode(mode)) {
    const int rows = B * kHkv;
    kvsift_bench::DeviceArray<std::int32_t> row_lengths(rows), idx(std::size_t(rows) * config.budget), counts(rows);
    const std::vector<std::int32_t> full(std::size_t(rows), S);
    KVSIFT_BENCH_CUDA(cudaMemcpy(row_lengths.get(), full.data(), full.size() * 4, cudaMemcpyHostToDevice));
    kvsift::TopKParams select;
    select.lengths = row_lengths.get();
    select.roles = decoder.roles(1);
    select.num_kv_heads = kHkv;
    select.k = config.budget;
    select.sink = config.sink;
    select.recent = config.recent;
    const kvsift::StridedView2D<const float> score_view{scores.get(), rows, S, S + 4};
    const auto out = kvsift::make_index_set(idx.get(), counts.get(), rows, config.budget);
    if (kvsift::cuda::topk(kvsift_bench::gpu(), score_view, select, out).ok())
      state.counters["selection_us"] = kvsift_bench::median_gpu_us(
          [&](cudaStream_t s) { (void)kvsift::cuda::topk(kvsift_bench::gpu().on(s), score_view, select, out); });
  }
  const double dense_us = dense_decode_us(in);
  state.counters["dense_us"] = dense_us;
  if (state.counters.count("us_median") && dense_us > 0)
    state.counters["speedup_vs_dense"] = dense_us / double(state.counters["us_median"]);
}

void BM_HybridLayer(benchmark::State& state) { hybrid_layer(state, Variant::kPlain); }
void BM_HybridLayerDependent(benchmark::State& state) { hybrid_layer(state, Variant::kDependent); }
void BM_HybridLayerBeside(benchmark::State& state) { hybrid_layer(state, Variant::kBeside); }

// B in {1, 8} x S in {32K, 128K}: dense; token 4096 and block 64x64 with R in {0, 1, 2, 8}; token
// 1024 with R = 1 (the paper's smaller budget). 40 cases, at most ~4.3 GB of cache each.
void dense_shapes(benchmark::internal::Benchmark* b) {
  for (int batch : {1, 8})
    for (int s : {32768, 131072}) b->Args({batch, s});
}
void hybrid_shapes(benchmark::internal::Benchmark* b) {
  for (int batch : {1, 8})
    for (int s : {32768, 131072}) {
      for (int mode : {kToken4096, kBlock64x64})
        for (int r : {0, 1, 2, 8}) b->Args({batch, s, mode, r});
      b->Args({batch, s, kToken1024, 1});
    }
  b->Args({8, 131072, kBlockTenth, 0});  // all sparse over 10% of the blocks, against cuDNN dense
}
// The dependent-launch variant on the layers with a hand-off: token 4096 and block 64 x 64, one
// retrieval head.
void dependent_shapes(benchmark::internal::Benchmark* b) {
  for (int batch : {1, 8})
    for (int s : {32768, 131072})
      for (int mode : {kToken4096, kBlock64x64}) b->Args({batch, s, mode, 1});
}

}  // namespace

BENCHMARK(BM_Dense)->Apply(dense_shapes)->ArgNames({"B", "S"})->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HybridLayer)
    ->Apply(hybrid_shapes)
    ->ArgNames({"B", "S", "mode", "R"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HybridLayerDependent)
    ->Apply(dependent_shapes)
    ->ArgNames({"B", "S", "mode", "R"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HybridLayerBeside)
    ->Apply(dependent_shapes)
    ->ArgNames({"B", "S", "mode", "R"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
