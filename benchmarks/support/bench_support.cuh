#pragma once
// Shared helpers for kvsift's GPU microbenchmarks.
//
// - GPU time per iteration from CUDA events (UseManualTime), optionally with L2 flushed first so the
//   number is a cold-cache (HBM) time, which is what a decode step over a long cache sees. The launch
//   is captured once into a CUDA graph and replayed, as engines run a decode step, so host launch
//   overhead is not counted (and every benchmarked launcher is shown to be capturable).
// - Counters from the *median* iteration: us, TB/s for the bytes the caller counts, and the fraction
//   of the measured read ceiling of this GPU (streaming read, measured once per process; override
//   with KVSIFT_BW_CEILING_TBPS).
// - Random inputs generated on the device, never zeros.

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace kvsift_bench {

#define KVSIFT_BENCH_CUDA(call)                                                           \
  do {                                                                                    \
    const cudaError_t kvsift_bench_err_ = (call);                                         \
    if (kvsift_bench_err_ != cudaSuccess) {                                               \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(kvsift_bench_err_)); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

// A device allocation that lives for the benchmark.
template <class T>
struct DeviceArray {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit DeviceArray(std::size_t count) : n(count) { KVSIFT_BENCH_CUDA(cudaMalloc(&ptr, std::max<std::size_t>(n, 1) * sizeof(T))); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(ptr); }
  T* get() const { return ptr; }
  std::size_t bytes() const { return n * sizeof(T); }
};

// Fill with uniform values in [lo, hi) from a counter-based hash (no cuRAND dependency).
void fill_uniform(float* p, std::size_t n, float lo, float hi, std::uint64_t seed, cudaStream_t s = nullptr);
void fill_uniform_bf16(void* p, std::size_t n, float lo, float hi, std::uint64_t seed, cudaStream_t s = nullptr);
void fill_uniform_half(void* p, std::size_t n, float lo, float hi, std::uint64_t seed, cudaStream_t s = nullptr);

// Streaming-read bandwidth of this GPU in TB/s (bytes read / median kernel time over a buffer many
// times the L2), measured on first use.
double read_ceiling_tbps();

struct TimingOptions {
  bool flush_l2 = true;  // cold cache: rewrite a buffer twice the L2 size before every iteration
  // Replay the launch as a CUDA graph, as an engine's captured decode step runs: the time is then the
  // GPU's, without the host's per-call launch overhead. Falls back to direct launches (counter
  // graph = 0) if the launch cannot be captured.
  bool graph = true;
};

// Runs `launch(stream)` once per benchmark iteration between two events and reports the median.
// `launch` must enqueue its work on the stream it is given (a stream of the harness's own).
// `bytes` is the traffic the caller counts for one launch (each input read once, each output
// written once): the TB/s counter and the fraction of the read ceiling derive from it.
template <class Launch>
void time_gpu(benchmark::State& state, double bytes, Launch&& launch, TimingOptions opt = {});

void flush_l2(cudaStream_t stream);

// The kernel behind read_ceiling_tbps(): 16-byte loads over `bytes`, grid-stride.
void launch_stream_read(const void* p, std::size_t bytes, float* sink, cudaStream_t stream);

// ---- implementation of the template ----
template <class Launch>
void time_gpu(benchmark::State& state, double bytes, Launch&& launch, TimingOptions opt) {
  cudaStream_t stream;
  KVSIFT_BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  KVSIFT_BENCH_CUDA(cudaEventCreate(&start));
  KVSIFT_BENCH_CUDA(cudaEventCreate(&stop));
  // Warm-up: module load, first-touch and one-time attribute setting stay out of the numbers.
  for (int i = 0; i < 3; ++i) launch(stream);
  KVSIFT_BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaGraphExec_t replay = nullptr;
  if (opt.graph) {
    cudaGraph_t graph = nullptr;
    bool captured = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    if (captured) launch(stream);
    captured = cudaStreamEndCapture(stream, &graph) == cudaSuccess && captured && graph != nullptr;
    if (captured && cudaGraphInstantiate(&replay, graph, 0) != cudaSuccess) replay = nullptr;
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // a refused capture leaves its error behind; direct launches follow
  }
  auto run = [&] {
    if (replay) KVSIFT_BENCH_CUDA(cudaGraphLaunch(replay, stream));
    else launch(stream);
  };
  run();
  KVSIFT_BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> seconds;
  for (auto _ : state) {
    if (opt.flush_l2) flush_l2(stream);
    KVSIFT_BENCH_CUDA(cudaEventRecord(start, stream));
    run();
    KVSIFT_BENCH_CUDA(cudaEventRecord(stop, stream));
    KVSIFT_BENCH_CUDA(cudaEventSynchronize(stop));
    float ms = 0.f;
    KVSIFT_BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
    seconds.push_back(ms * 1e-3);
    state.SetIterationTime(ms * 1e-3);
  }
  KVSIFT_BENCH_CUDA(cudaGetLastError());
  if (replay) cudaGraphExecDestroy(replay);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  state.counters["graph"] = replay ? 1 : 0;
  if (seconds.empty()) return;
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  const double median = seconds[seconds.size() / 2];
  state.counters["us_median"] = median * 1e6;
  if (bytes > 0) {
    const double tbps = bytes / median * 1e-12;
    state.counters["MB"] = bytes * 1e-6;
    state.counters["TB/s"] = tbps;
    state.counters["of_ceiling"] = tbps / read_ceiling_tbps();
  }
}

}  // namespace kvsift_bench
