// decode_attention on a Llama-3-8B layer (32 query heads, 8 KV heads, head_dim 128, bf16), cold L2.
// Bytes counted: K and V rows the op must read (retrieval heads: every token; sparse heads: the selected ones),
// plus q, out and the index rows. Baselines (torch SDPA cuDNN / flash, gather + SDPA) come from
// benchmarks/torch_decode_attention.py on the same shapes.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "kvsift/ops/decode_attention.cuh"
#include "support/bench_support.cuh"

namespace {

using BF16 = __nv_bfloat16;
constexpr int kHq = 32, kHkv = 8, kD = 128;

// kMixed: KV head 0 retrieval, the others sparse; kMixed2: heads 0 and 4 retrieval (LycheeDecode's layers
// with one or two retrieval heads, where the split cap rather than the wave sizes the grid at batch 1).
enum class Mode { kDense, kGatherToken, kGatherBlock, kMixed, kMixed2 };

struct Inputs {
  int batch, seq;
  kvsift_bench::DeviceArray<BF16> k, v, q, out;
  kvsift_bench::DeviceArray<std::int32_t> lengths;
  Inputs(int b, int s, std::size_t kv_elems)
      : batch(b), seq(s), k(kv_elems), v(kv_elems), q(std::size_t(b) * kHq * kD), out(q.n), lengths(b) {
    kvsift_bench::fill_uniform_bf16(k.get(), k.n, -1.f, 1.f, 11);
    kvsift_bench::fill_uniform_bf16(v.get(), v.n, -1.f, 1.f, 12);
    kvsift_bench::fill_uniform_bf16(q.get(), q.n, -1.f, 1.f, 13);
    std::vector<std::int32_t> len(b, s);
    KVSIFT_BENCH_CUDA(cudaMemcpy(lengths.get(), len.data(), len.size() * 4, cudaMemcpyHostToDevice));
  }
};

// Times one decode_attention call (workspace sized by its query, cold L2) and reports the plan's
// block count; `traffic` is the bytes the rate is computed from.
template <class View>
void time_decode(benchmark::State& state, const View& kv, const kvsift::DecodeAttentionParams<BF16>& p, double traffic,
                 int batch) {
  std::size_t bytes = 0;
  auto st = kvsift::decode_attention_workspace_bytes(kvsift_bench::gpu(), kv, p, &bytes);
  if (!st.ok()) {
    state.SkipWithError(st.to_string().c_str());
    return;
  }
  kvsift_bench::DeviceArray<unsigned char> ws(bytes);
  kvsift_bench::time_gpu(state, traffic, [&](cudaStream_t s) {
    const auto r = kvsift::cuda::decode_attention(kvsift_bench::gpu().on(s), kv, p, kvsift::Workspace{ws.get(), bytes});
    if (!r.ok()) std::fprintf(stderr, "decode_attention: %s\n", r.to_string().c_str());
  });
  kvsift::detail::DecodePlan plan;
  if (kvsift::detail::plan_decode_attention(kvsift_bench::gpu().device, kv, p, &plan).ok()) state.counters["ctas"] = plan.ctas_per_tile * batch;
}

template <class View>
void run(benchmark::State& state, Inputs& in, const View& kv, Mode mode, int selected, int block, int score_block,
         double kv_bytes_per_element = sizeof(BF16)) {
  auto p = kvsift::make_decode_attention_params<BF16>(in.q.get(), in.out.get(), 1, kHq, kD);
  const bool mixed = mode == Mode::kMixed || mode == Mode::kMixed2;
  const int gblock = mode == Mode::kGatherBlock || mixed ? block : 1;
  const int per_row = selected / gblock;
  kvsift_bench::DeviceArray<std::int32_t> idx(std::size_t(in.batch) * kHkv * std::max(per_row, 1)),
      counts(std::size_t(in.batch) * kHkv);
  double kv_tokens = double(in.batch) * kHkv * in.seq;
  if (mode != Mode::kDense) {
    const auto rows = kvsift_bench::random_sorted_rows(in.batch * kHkv, in.seq / gblock, per_row, 7);
    std::vector<std::int32_t> cnt(std::size_t(in.batch) * kHkv, per_row);
    KVSIFT_BENCH_CUDA(cudaMemcpy(idx.get(), rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
    KVSIFT_BENCH_CUDA(cudaMemcpy(counts.get(), cnt.data(), cnt.size() * 4, cudaMemcpyHostToDevice));
    auto set = kvsift::make_index_set(idx.get(), counts.get(), in.batch * kHkv, per_row,
                                      gblock > 1 ? kvsift::Granularity::kBlock : kvsift::Granularity::kToken, gblock);
    p.index_set = kvsift::as_const(set);
    p.roles = kvsift::HeadRoleMask::all_sparse(kHkv);
    if (mixed) p.roles.set_sparse(0, false);
    if (mode == Mode::kMixed2) p.roles.set_sparse(4, false);
    const int dense_heads = mode == Mode::kMixed2 ? 2 : mixed ? 1 : 0;
    kv_tokens = double(in.batch) * (dense_heads * double(in.seq) + (kHkv - dense_heads) * double(selected));
  }
  kvsift_bench::DeviceArray<float> scores(std::size_t(in.batch) * kHkv * (in.seq / std::max(score_block, 1) + 1));
  if (score_block > 0) {
    p.scores = scores.get();
    p.score_block_size = score_block;
    p.score_row_stride = in.seq / score_block + 1;
  }
  const double traffic = kv_tokens * 2.0 * kD * kv_bytes_per_element + 2.0 * in.q.bytes() +
                         (mode != Mode::kDense ? double(idx.bytes()) : 0.0);
  time_decode(state, kv, p, traffic, in.batch);
}

// Contiguous [B, S, Hkv, d] (BSHD, as a static cache keeps it) or BHSD when range(2) == 1.
void BM_Contiguous(benchmark::State& state, Mode mode, int block, int score_block) {
  const int B = int(state.range(0)), S = int(state.range(1));
  Inputs in(B, S, std::size_t(B) * S * kHkv * kD);
  const auto kv = state.range(2) ? kvsift::make_bhsd(in.k.get(), in.v.get(), B, kHkv, S, kD, in.lengths.get())
                                 : kvsift::make_bshd(in.k.get(), in.v.get(), B, kHkv, S, kD, in.lengths.get());
  run(state, in, kv, mode, 4096, block, score_block);
}

// Paged NHD, page size range(2), pages of each sequence scattered by a random permutation.
void BM_Paged(benchmark::State& state, Mode mode, int block) {
  const int B = int(state.range(0)), S = int(state.range(1)), page = int(state.range(2));
  const int max_pages = S / page, num_pages = B * max_pages;
  Inputs in(B, S, std::size_t(num_pages) * page * kHkv * kD);
  std::vector<std::int32_t> table(num_pages);
  for (int i = 0; i < num_pages; ++i) table[i] = i;
  std::shuffle(table.begin(), table.end(), std::mt19937_64(3));
  kvsift_bench::DeviceArray<std::int32_t> dtable(table.size());
  KVSIFT_BENCH_CUDA(cudaMemcpy(dtable.get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  const auto kv = kvsift::make_paged(in.k.get(), in.v.get(), dtable.get(), B, max_pages, num_pages, kHkv, page, kD,
                                     kvsift::PageLayout::kNHD, in.lengths.get());
  run(state, in, kv, mode, 4096, block, 0);
}

// fp8 (e4m3) codes from a hash, never the NaN code 0x7f / 0xff.
__global__ void fill_e4m3(std::uint8_t* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint32_t h = std::uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = std::uint8_t((h % 0x7eu) | (h & 0x80u));
  }
}

// How the fp8 rows' scales are laid out.
enum class Fp8Scales { kPerTokenBTH, kPerTokenBHT, kPerHead };

// The same shapes over an fp8 e4m3 cache (BSHD): half the K/V bytes. Per-token scales [batch, token,
// head] (make_per_token_scales_for) unless named: [batch, head, token] (make_per_token_scales_head_major)
// or one per head.
void BM_ContiguousFp8(benchmark::State& state, Mode mode, int block, Fp8Scales layout = Fp8Scales::kPerTokenBTH) {
  const int B = int(state.range(0)), S = int(state.range(1));
  using E4M3 = kvsift::fp8_e4m3_t;
  const std::size_t n = std::size_t(B) * S * kHkv * kD;
  kvsift_bench::DeviceArray<E4M3> k(n), v(n);
  kvsift_bench::DeviceArray<float> ks(std::size_t(B) * S * kHkv), vs(ks.n);
  fill_e4m3<<<1024, 256>>>(reinterpret_cast<std::uint8_t*>(k.get()), n, 21);
  fill_e4m3<<<1024, 256>>>(reinterpret_cast<std::uint8_t*>(v.get()), n, 22);
  kvsift_bench::fill_uniform(ks.get(), ks.n, 0.005f, 0.01f, 23);
  kvsift_bench::fill_uniform(vs.get(), vs.n, 0.005f, 0.01f, 24);
  Inputs in(B, S, 1);  // q, out, lengths (its bf16 K/V are unused)
  auto kv = kvsift::make_bshd(k.get(), v.get(), B, kHkv, S, kD, in.lengths.get());
  kv.scales = layout == Fp8Scales::kPerTokenBTH   ? kvsift::make_per_token_scales_for(kv, ks.get(), vs.get())
              : layout == Fp8Scales::kPerTokenBHT ? kvsift::make_per_token_scales_head_major(kv, ks.get(), vs.get())
                                                  : kvsift::make_per_head_scales(ks.get(), vs.get());
  run(state, in, kv, mode, 4096, block, 0, sizeof(E4M3) + (layout == Fp8Scales::kPerHead ? 0.0 : 4.0 / kD));
}

// Dense attention over a cache of range(0) KV heads (group 4, BHSD, one sequence of range(1) tokens):
// what one, two or three retrieval heads cost when they are all a call holds (LycheeDecode's batch-1
// layers have one or two, whose blocks leave most of the wave's slots empty). The rows differ by their
// bytes at the read ceiling; what the one-head row has beyond that is the call's fixed cost
// (docs/performance.md, forty-first session).
void BM_DenseHeads(benchmark::State& state) {
  const int heads = int(state.range(0)), S = int(state.range(1)), hq = heads * (kHq / kHkv);
  const std::size_t n = std::size_t(heads) * S * kD;
  kvsift_bench::DeviceArray<BF16> k(n), v(n), q(std::size_t(hq) * kD), out(q.n);
  kvsift_bench::DeviceArray<std::int32_t> lengths(1);
  kvsift_bench::fill_uniform_bf16(k.get(), k.n, -1.f, 1.f, 11);
  kvsift_bench::fill_uniform_bf16(v.get(), v.n, -1.f, 1.f, 12);
  kvsift_bench::fill_uniform_bf16(q.get(), q.n, -1.f, 1.f, 13);
  KVSIFT_BENCH_CUDA(cudaMemcpy(lengths.get(), &S, 4, cudaMemcpyHostToDevice));
  const auto kv = kvsift::make_bhsd(k.get(), v.get(), 1, heads, S, kD, lengths.get());
  const auto p = kvsift::make_decode_attention_params<BF16>(q.get(), out.get(), 1, hq, kD);
  time_decode(state, kv, p, 2.0 * n * sizeof(BF16) + 2.0 * q.bytes(), 1);
}

void dense_shapes(benchmark::internal::Benchmark* b) {
  b->Args({1, 1024, 0});  // a short context: the fixed cost of a call
  b->Args({1, 1040, 1});  // a compressed prompt (1024 kept + 16 new tokens), BHSD as the minimal decoder keeps it
  b->Args({1, 2048, 0});
  for (int batch : {1, 8})
    for (int s : {32768, 131072}) b->Args({batch, s, 0});
  b->Args({1, 131072, 1});  // BHSD
}
void batch_shapes(benchmark::internal::Benchmark* b) {
  for (int batch : {1, 8}) b->Args({batch, 131072, 0});
}
// BHSD, as the minimal decoder keeps its cache: a retrieval head's rows are contiguous.
void bhsd_batch_shapes(benchmark::internal::Benchmark* b) {
  for (int batch : {1, 8}) b->Args({batch, 131072, 1});
}
void paged_shapes(benchmark::internal::Benchmark* b) {
  for (int batch : {1, 8})
    for (int page : {16, 64}) b->Args({batch, 131072, page});
  for (int batch : {1, 8}) b->Args({batch, 32768, 16});
}
void paged_gather_shapes(benchmark::internal::Benchmark* b) {
  for (int batch : {1, 8}) b->Args({batch, 131072, 16});
}

}  // namespace

#define KVSIFT_DECODE_BENCH(name, fn, shapes, ...)                                                    \
  BENCHMARK_CAPTURE(fn, name, __VA_ARGS__)->Apply(shapes)->UseManualTime()->Unit(benchmark::kMicrosecond)

KVSIFT_DECODE_BENCH(dense, BM_Contiguous, dense_shapes, Mode::kDense, 1, 0);
KVSIFT_DECODE_BENCH(dense_blockmax_scores, BM_Contiguous, batch_shapes, Mode::kDense, 1, 64);
KVSIFT_DECODE_BENCH(gather_token_4096, BM_Contiguous, batch_shapes, Mode::kGatherToken, 1, 0);
KVSIFT_DECODE_BENCH(gather_block64_4096, BM_Contiguous, batch_shapes, Mode::kGatherBlock, 64, 0);
KVSIFT_DECODE_BENCH(mixed_1dense_7block64, BM_Contiguous, batch_shapes, Mode::kMixed, 64, 0);
// LycheeDecode's layer in the minimal decoder: one retrieval head, seven heads gathering 4096 tokens.
KVSIFT_DECODE_BENCH(mixed_1dense_7token, BM_Contiguous, bhsd_batch_shapes, Mode::kMixed, 1, 0);
// The same layers as the decoder runs them: the retrieval heads also write per-token scores for top-k.
KVSIFT_DECODE_BENCH(mixed_1dense_7token_scores, BM_Contiguous, bhsd_batch_shapes, Mode::kMixed, 1, 1);
KVSIFT_DECODE_BENCH(mixed_2dense_6token_scores, BM_Contiguous, bhsd_batch_shapes, Mode::kMixed2, 1, 1);
BENCHMARK(BM_DenseHeads)->ArgsProduct({{1, 2, 3, 8}, {131072}})->UseManualTime()->Unit(benchmark::kMicrosecond);
KVSIFT_DECODE_BENCH(dense, BM_Paged, paged_shapes, Mode::kDense, 1);
KVSIFT_DECODE_BENCH(dense_fp8, BM_ContiguousFp8, batch_shapes, Mode::kDense, 1);
KVSIFT_DECODE_BENCH(dense_fp8_head_major_scales, BM_ContiguousFp8, batch_shapes, Mode::kDense, 1, Fp8Scales::kPerTokenBHT);
KVSIFT_DECODE_BENCH(dense_fp8_per_head_scales, BM_ContiguousFp8, batch_shapes, Mode::kDense, 1, Fp8Scales::kPerHead);
KVSIFT_DECODE_BENCH(gather_token_4096_fp8, BM_ContiguousFp8, batch_shapes, Mode::kGatherToken, 1);
KVSIFT_DECODE_BENCH(gather_token_4096_fp8_head_major_scales, BM_ContiguousFp8, batch_shapes, Mode::kGatherToken, 1, Fp8Scales::kPerTokenBHT);
KVSIFT_DECODE_BENCH(gather_token_4096_fp8_per_head_scales, BM_ContiguousFp8, batch_shapes, Mode::kGatherToken, 1, Fp8Scales::kPerHead);
KVSIFT_DECODE_BENCH(gather_block64_4096, BM_Paged, paged_gather_shapes, Mode::kGatherBlock, 64);
