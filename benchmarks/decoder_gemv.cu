// The minimal decoder's decode projections (examples/minimal_decoder/cuda_gemv.cuh) on the
// llama3-8b shapes, against cuBLAS GemmEx (bf16 x bf16 -> fp32, CUBLAS_COMPUTE_32F) on the same
// matrix in the same run. Cold L2, graph replay, median. Bytes counted: the weight matrix (bf16),
// the float input rows and the float output rows. A decode step reads each matrix once, so the
// fraction of the read ceiling here is what bounds the decoder's speed on its weights.
#include <benchmark/benchmark.h>
#include <cublas_v2.h>

#include <cstdio>
#include <cstdlib>

#include "cuda_gemv.cuh"
#include "support/bench_support.cuh"

namespace {

using BF16 = __nv_bfloat16;

struct Shape {
  const char* name;
  int rows, cols;
};
// nn.Linear [out, in] of Llama-3-8B; q/o are 4096 x 4096, k/v 1024 x 4096.
constexpr Shape kShapes[] = {{"q_o", 4096, 4096},       {"k_v", 1024, 4096},         {"gate_up", 14336, 4096},
                             {"down", 4096, 14336},     {"lm_head", 128256, 4096}};

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

void bench(benchmark::State& state, bool use_cublas) {
  const Shape& s = kShapes[state.range(0)];
  const int n = int(state.range(1));
  kvsift_bench::DeviceArray<BF16> w(std::size_t(s.rows) * s.cols), x_bf16(std::size_t(n) * s.cols);
  kvsift_bench::DeviceArray<float> x(std::size_t(n) * s.cols), y(std::size_t(n) * s.rows);
  kvsift_bench::fill_uniform_bf16(w.get(), w.n, -1.f, 1.f, 1);
  kvsift_bench::fill_uniform_bf16(x_bf16.get(), x_bf16.n, -1.f, 1.f, 2);
  kvsift_bench::fill_uniform(x.get(), x.n, -1.f, 1.f, 3);
  KVSIFT_BENCH_CUDA(cudaDeviceSynchronize());
  const double bytes = double(w.bytes()) + double(x.bytes()) + double(y.bytes());
  state.SetLabel(std::string(s.name) + (use_cublas ? " cuBLAS" : " gemv"));
  kvsift_bench::time_gpu(state, bytes, [&](cudaStream_t stream) {
    if (!use_cublas) {
      minimal_decoder::kernels::launch_gemv_bf16(w.get(), s.rows, s.cols, x.get(), n, y.get(), stream);
      return;
    }
    const float alpha = 1.f, beta = 0.f;
    cublasSetStream(cublas(), stream);
    cublasGemmEx(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, s.rows, n, s.cols, &alpha, w.get(), CUDA_R_16BF, s.cols, x_bf16.get(),
                 CUDA_R_16BF, s.cols, &beta, y.get(), CUDA_R_32F, s.rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  });
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int i = 0; i < int(sizeof(kShapes) / sizeof(kShapes[0])); ++i)
    for (int n : {1, 4, 8}) b->Args({i, n});
  b->ArgNames({"shape", "n"})->UseManualTime()->Unit(benchmark::kMicrosecond);
}

void BM_DecoderGemv(benchmark::State& state) { bench(state, false); }
void BM_CublasGemmEx(benchmark::State& state) { bench(state, true); }
BENCHMARK(BM_DecoderGemv)->Apply(shapes);
BENCHMARK(BM_CublasGemmEx)->Apply(shapes);

}  // namespace
