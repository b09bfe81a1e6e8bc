// The minimal decoder's decode projections on the llama3-8b shapes: the blocked GEMV
// (examples/minimal_decoder/engine/cuda/cuda_gemv.cuh: BM_DecoderGemv at its default rows per
// block, R2/R4 forced), the pipelined one the decoder uses by default (cuda_gemv_pipelined.cuh:
// BM_DecoderGemvPipelined), its tensor-core form (cuda_gemv_mma.cuh: BM_DecoderGemvMma), against cuBLAS GemmEx (bf16 x bf16 -> fp32, CUBLAS_COMPUTE_32F) on the same
// matrices in the same run (one GemmEx per matrix). Cold L2, graph replay, median. Bytes counted: the weight matrix (bf16),
// the float input rows and the float output rows. A decode step reads each matrix once, so the
// fraction of the read ceiling here is what bounds the decoder's speed on its weights.
#include <benchmark/benchmark.h>
#include <cublas_v2.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cuda_gemv.cuh"
#include "cuda_gemv_mma.cuh"
#include "cuda_gemv_pipelined.cuh"
#include "support/bench_support.cuh"

namespace {

using BF16 = __nv_bfloat16;

// Projections of one input in one launch (the decoder fuses q/k/v and gate/up): up to 3 row counts
// sharing the column count. nn.Linear [out, in] of Llama-3-8B.
struct Shape {
  const char* name;
  int cols;
  std::vector<int> rows;
};
const std::vector<Shape> kShapes = {{"q", 4096, {4096}},           {"k", 4096, {1024}},
                                    {"qkv", 4096, {4096, 1024, 1024}}, {"gate+up", 4096, {14336, 14336}},
                                    {"down", 14336, {4096}},       {"lm_head", 4096, {128256}}};

cublasHandle_t cublas() {
  static cublasHandle_t h = [] {
    cublasHandle_t handle = nullptr;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasCreate failed\n");
      std::exit(1);
    }
    return handle;
  }();
  return h;
}

enum class Kernel { kBlocked, kPipelined, kMma, kCublas };

// rows_per_block: the blocked GEMV's weight rows per block (2 or 4; 0 = its default for n).
void bench(benchmark::State& state, Kernel kernel, int rows_per_block) {
  const bool use_cublas = kernel == Kernel::kCublas;
  const Shape& s = kShapes[std::size_t(state.range(0))];
  const int n = int(state.range(1)), count = int(s.rows.size());
  std::vector<std::unique_ptr<kvsift_bench::DeviceArray<BF16>>> w;
  std::vector<std::unique_ptr<kvsift_bench::DeviceArray<float>>> y;
  double bytes = 0;
  minimal_decoder::kernels::GemvTargets targets{};
  for (int t = 0; t < count; ++t) {
    w.push_back(std::make_unique<kvsift_bench::DeviceArray<BF16>>(std::size_t(s.rows[t]) * s.cols));
    y.push_back(std::make_unique<kvsift_bench::DeviceArray<float>>(std::size_t(n) * s.rows[t]));
    kvsift_bench::fill_uniform_bf16(w.back()->get(), w.back()->n, -1.f, 1.f, 1 + t);
    bytes += double(w.back()->bytes()) + double(y.back()->bytes());
    targets.w[t] = w.back()->get();
    targets.y[t] = y.back()->get();
    targets.rows[t] = s.rows[t];
  }
  targets.count = count;
  kvsift_bench::DeviceArray<BF16> x_bf16(std::size_t(n) * s.cols);
  kvsift_bench::DeviceArray<float> x(std::size_t(n) * s.cols);
  kvsift_bench::fill_uniform_bf16(x_bf16.get(), x_bf16.n, -1.f, 1.f, 7);
  kvsift_bench::fill_uniform(x.get(), x.n, -1.f, 1.f, 8);
  KVSIFT_BENCH_CUDA(cudaDeviceSynchronize());
  bytes += double(x.bytes());
  state.SetLabel(std::string(s.name) + (use_cublas                    ? " cuBLAS"
                                        : kernel == Kernel::kPipelined ? " gemv pipelined"
                                        : kernel == Kernel::kMma       ? " gemv mma"
                                                                       : " gemv R=" + std::to_string(rows_per_block)));
  kvsift_bench::time_gpu(state, bytes, [&](cudaStream_t stream) {
    if (kernel == Kernel::kPipelined) {
      minimal_decoder::kernels::launch_gemv_bf16_pipelined(targets, s.cols, x.get(), n, stream);
      return;
    }
    if (kernel == Kernel::kMma) {
      minimal_decoder::kernels::launch_gemv_bf16_mma(targets, s.cols, x.get(), n, stream);
      return;
    }
    if (!use_cublas) {
      minimal_decoder::kernels::launch_gemv_bf16(targets, s.cols, x.get(), n, stream, nullptr, rows_per_block);
      return;
    }
    const float alpha = 1.f, beta = 0.f;
    cublasSetStream(cublas(), stream);
    for (int t = 0; t < count; ++t)
      cublasGemmEx(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, s.rows[t], n, s.cols, &alpha, targets.w[t], CUDA_R_16BF, s.cols,
                   x_bf16.get(), CUDA_R_16BF, s.cols, &beta, targets.y[t], CUDA_R_32F, s.rows[t], CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
  });
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int i = 0; i < int(kShapes.size()); ++i)
    for (int n : {1, 2, 3, 4, 8}) b->Args({i, n});
  b->ArgNames({"shape", "n"})->UseManualTime()->Unit(benchmark::kMicrosecond);
}

// One llama3-8b layer's four decode projections back to back, as a step runs them: q/k/v fused, o,
// gate/up fused, down with the SwiGLU fused, each a pipelined GEMV launched with PDL (the first as a
// plain launch; `mma` 1: gemv_bf16_mma instead; 2: gemv_bf16_mma but for down, which stays on the
// pipelined GEMV, as the decoder runs 4-7 rows by shape; `pairs` 1: gate/up as SwiGLU pairs writing
// bf16(silu(gate) * up), down reading it, GemvTargets::swiglu). The inputs are not what a layer computes
// (every GEMV reads x, or gate/up): the weights' bytes and the launch chain are what is timed, against
// the same bytes in one stream.
void BM_DecoderLayerChain(benchmark::State& state) {
  namespace k = minimal_decoder::kernels;
  const int n = int(state.range(0));
  const int mma = int(state.range(1));
  const bool pairs = state.range(2) != 0;
  if (pairs && (mma == 1 || (mma == 0 && n > k::kGemvSwiGLUPairsMaxRows))) {
    state.SkipWithError("the pairs' down runs on the pipelined GEMV; its own pairs go up to kGemvSwiGLUPairsMaxRows rows");
    return;
  }
  const int hidden = 4096, kv = 1024, inter = 14336;
  struct Mat {
    std::unique_ptr<kvsift_bench::DeviceArray<BF16>> w;
    int rows, cols;
  };
  std::vector<Mat> m;
  const int dims[7][2] = {{hidden, hidden}, {kv, hidden}, {kv, hidden}, {hidden, hidden}, {inter, hidden}, {inter, hidden}, {hidden, inter}};
  double bytes = 0;
  for (const auto& d : dims) {
    m.push_back({std::make_unique<kvsift_bench::DeviceArray<BF16>>(std::size_t(d[0]) * d[1]), d[0], d[1]});
    kvsift_bench::fill_uniform_bf16(m.back().w->get(), m.back().w->n, -1.f, 1.f, 11 + int(m.size()));
    bytes += double(m.back().w->bytes());
  }
  kvsift_bench::DeviceArray<float> x(std::size_t(n) * inter), gate(std::size_t(n) * inter), up(std::size_t(n) * inter);
  kvsift_bench::fill_uniform(x.get(), x.n, -1.f, 1.f, 3);
  kvsift_bench::fill_uniform(gate.get(), gate.n, -1.f, 1.f, 4);
  kvsift_bench::fill_uniform(up.get(), up.n, -1.f, 1.f, 5);
  kvsift_bench::DeviceArray<float> y(std::size_t(n) * inter * 2);
  kvsift_bench::DeviceArray<BF16> h(std::size_t(n) * inter);  // the pairs' output, down's input
  const std::vector<std::vector<int>> launches = {{0, 1, 2}, {3}, {4, 5}, {6}};  // the matrices of each launch
  std::vector<k::GemvTargets> targets(launches.size());
  for (std::size_t l = 0; l < launches.size(); ++l) {
    targets[l] = k::GemvTargets{};
    std::int64_t offset = 0;
    for (int i : launches[l]) {
      targets[l].w[targets[l].count] = m[std::size_t(i)].w->get();
      targets[l].rows[targets[l].count] = m[std::size_t(i)].rows;
      targets[l].y[targets[l].count] = y.get() + offset;
      offset += std::int64_t(n) * m[std::size_t(i)].rows;
      ++targets[l].count;
    }
  }
  if (pairs) targets[2].swiglu = h.get();
  KVSIFT_BENCH_CUDA(cudaDeviceSynchronize());
  state.SetLabel(std::string("layer chain (q/k/v, o, gate/up, down), ") +
                 (mma == 1 ? "mma" : mma == 2 ? "mma, down pipelined" : "pipelined") + (pairs ? ", SwiGLU pairs" : ""));
  kvsift_bench::time_gpu(state, bytes, [&](cudaStream_t stream) {
    for (std::size_t l = 0; l < launches.size(); ++l) {
      if (pairs && l == 3) {
        k::launch_gemv_bf16_pipelined_bf16_input(targets[l], inter, h.get(), n, stream, true);
        continue;
      }
      const bool swiglu = l == 3;
      const auto launch = mma == 1 || (mma == 2 && l != 3) ? k::launch_gemv_bf16_mma : k::launch_gemv_bf16_pipelined;
      launch(targets[l], m[std::size_t(launches[l][0])].cols, swiglu ? gate.get() : x.get(), n, stream, swiglu ? up.get() : nullptr,
             l > 0, k::NormInput{});
    }
  });
}
BENCHMARK(BM_DecoderLayerChain)
    ->ArgsProduct({{1, 2, 4, 8}, {0, 1}, {0}})
    ->Args({1, 0, 1})
    ->Args({2, 0, 1})
    ->Args({4, 2, 0})
    ->Args({4, 2, 1})
    ->ArgNames({"n", "mma", "pairs"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_DecoderGemv(benchmark::State& state) { bench(state, Kernel::kBlocked, 0); }
void BM_DecoderGemvR2(benchmark::State& state) { bench(state, Kernel::kBlocked, 2); }
void BM_DecoderGemvR4(benchmark::State& state) { bench(state, Kernel::kBlocked, 4); }
void BM_DecoderGemvPipelined(benchmark::State& state) { bench(state, Kernel::kPipelined, 0); }
void BM_DecoderGemvMma(benchmark::State& state) { bench(state, Kernel::kMma, 0); }
void BM_CublasGemmEx(benchmark::State& state) { bench(state, Kernel::kCublas, 0); }
BENCHMARK(BM_DecoderGemv)->Apply(shapes);
BENCHMARK(BM_DecoderGemvPipelined)->Apply(shapes);
BENCHMARK(BM_DecoderGemvMma)->Apply(shapes);
BENCHMARK(BM_DecoderGemvR2)->Apply(shapes);
BENCHMARK(BM_DecoderGemvR4)->Apply(shapes);
BENCHMARK(BM_CublasGemmEx)->Apply(shapes);

}  // namespace
