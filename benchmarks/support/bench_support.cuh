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
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "kvsift/core/exec_cuda.cuh"

namespace kvsift_bench {

// The Exec every benchmark launches with: the device's facts are read once per process, as an
// engine does; a timed lambda re-targets it to its stream with gpu().on(stream).
inline const kvsift::cuda::Exec& gpu() {
  static const kvsift::cuda::Exec exec = kvsift::cuda::Exec::for_current_device();
  return exec;
}

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

// Sorted random selections, as a top-k hands them to a gathered decode: `per_row` distinct units (tokens
// or blocks) out of `units` for each of `rows` rows, ascending within a row, from a fixed seed.
inline std::vector<std::int32_t> random_sorted_rows(int rows, int units, int per_row, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> all(units), out;
  out.reserve(std::size_t(rows) * per_row);
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < units; ++i) all[i] = i;
    for (int i = 0; i < per_row; ++i) std::swap(all[i], all[i + rng() % (units - i)]);
    std::sort(all.begin(), all.begin() + per_row);
    out.insert(out.end(), all.begin(), all.begin() + per_row);
  }
  return out;
}

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

// Evicts every SM's instruction caches (a kernel of 256 KiB of straight-line code on every SM).
// flush_l2 runs it first when KVSIFT_BENCH_FLUSH_CODE=1: the timed kernel then starts with cold
// instruction caches, as it does inside a decode step; by default a benchmark that replays one
// kernel finds its code still cached from the replay before.
void flush_code(cudaStream_t stream);

// The kernel behind read_ceiling_tbps(): 16-byte loads over `bytes`, grid-stride.
void launch_stream_read(const void* p, std::size_t bytes, float* sink, cudaStream_t stream);

// Times one launch per call on a stream of its own between two events. The launch is warmed up, then
// captured once into a CUDA graph and replayed (graph = true), or launched directly.
class LaunchTimer {
 public:
  template <class Launch>
  LaunchTimer(Launch&& launch, bool graph, bool flush) : launch_(std::forward<Launch>(launch)), flush_(flush) {
    KVSIFT_BENCH_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KVSIFT_BENCH_CUDA(cudaEventCreate(&start_));
    KVSIFT_BENCH_CUDA(cudaEventCreate(&stop_));
    // Warm-up: module load, first-touch and one-time attribute setting stay out of the numbers.
    for (int i = 0; i < 3; ++i) launch_(stream_);
    KVSIFT_BENCH_CUDA(cudaStreamSynchronize(stream_));
    if (graph) {
      cudaGraph_t g = nullptr;
      bool captured = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
      if (captured) launch_(stream_);
      captured = cudaStreamEndCapture(stream_, &g) == cudaSuccess && captured && g != nullptr;
      if (captured && cudaGraphInstantiate(&replay_, g, 0) != cudaSuccess) replay_ = nullptr;
      if (g) cudaGraphDestroy(g);
      (void)cudaGetLastError();  // a refused capture leaves its error behind; direct launches follow
    }
    run();
    KVSIFT_BENCH_CUDA(cudaStreamSynchronize(stream_));
  }
  LaunchTimer(const LaunchTimer&) = delete;
  LaunchTimer& operator=(const LaunchTimer&) = delete;
  ~LaunchTimer() {
    if (replay_) cudaGraphExecDestroy(replay_);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
  }

  bool replayed() const { return replay_ != nullptr; }

  // GPU seconds of one launch (L2 flushed first when asked, outside the events).
  double seconds() {
    if (flush_) flush_l2(stream_);
    KVSIFT_BENCH_CUDA(cudaEventRecord(start_, stream_));
    run();
    KVSIFT_BENCH_CUDA(cudaEventRecord(stop_, stream_));
    KVSIFT_BENCH_CUDA(cudaEventSynchronize(stop_));
    float ms = 0.f;
    KVSIFT_BENCH_CUDA(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }

 private:
  void run() {
    if (replay_) KVSIFT_BENCH_CUDA(cudaGraphLaunch(replay_, stream_));
    else launch_(stream_);
  }

  std::function<void(cudaStream_t)> launch_;
  bool flush_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  cudaGraphExec_t replay_ = nullptr;
};

inline double median_of(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Median cold-L2 microseconds of `launch(stream)` over `iterations` graph replays, for extra counters
// measured beside a benchmark's main timing.
template <class Launch>
double median_gpu_us(Launch&& launch, int iterations = 15) {
  LaunchTimer timer(std::forward<Launch>(launch), /*graph=*/true, /*flush=*/true);
  std::vector<double> us;
  for (int i = 0; i < iterations; ++i) us.push_back(timer.seconds() * 1e6);
  return median_of(us);
}

// ---- implementation of the template ----
template <class Launch>
void time_gpu(benchmark::State& state, double bytes, Launch&& launch, TimingOptions opt) {
  LaunchTimer timer(std::forward<Launch>(launch), opt.graph, opt.flush_l2);
  std::vector<double> seconds;
  for (auto _ : state) {
    seconds.push_back(timer.seconds());
    state.SetIterationTime(seconds.back());
  }
  KVSIFT_BENCH_CUDA(cudaGetLastError());
  state.counters["graph"] = timer.replayed() ? 1 : 0;
  if (seconds.empty()) return;
  const double median = median_of(seconds);
  state.counters["us_median"] = median * 1e6;
  if (bytes > 0) {
    const double tbps = bytes / median * 1e-12;
    state.counters["MB"] = bytes * 1e-6;
    state.counters["TB/s"] = tbps;
    state.counters["of_ceiling"] = tbps / read_ceiling_tbps();
  }
}

}  // namespace kvsift_bench
