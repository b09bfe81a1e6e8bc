// main() and the non-template helpers shared by every kvsift benchmark binary.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "support/bench_support.cuh"

namespace kvsift_bench {
namespace {

__device__ __forceinline__ float hash_uniform(std::uint64_t i, std::uint64_t seed) {
  std::uint64_t x = i * 0x9E3779B97F4A7C15ull ^ seed;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 33;
  return float(x >> 40) * (1.0f / 16777216.0f);  // [0, 1)
}

template <class Store>
__global__ void fill_kernel(std::size_t n, float lo, float hi, std::uint64_t seed, Store store) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    store(i, lo + (hi - lo) * hash_uniform(i, seed));
}

struct StoreF32 {
  float* p;
  __device__ void operator()(std::size_t i, float v) const { p[i] = v; }
};
struct StoreBF16 {
  std::uint16_t* p;
  __device__ void operator()(std::size_t i, float v) const {
    std::uint32_t u = __float_as_uint(v);
    u += 0x7fffu + ((u >> 16) & 1u);
    p[i] = std::uint16_t(u >> 16);
  }
};
struct StoreHalf {
  std::uint16_t* p;
  __device__ void operator()(std::size_t i, float v) const {
    std::uint16_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    p[i] = h;
  }
};

template <class Store>
void launch_fill(std::size_t n, float lo, float hi, std::uint64_t seed, cudaStream_t s, Store store) {
  if (n == 0) return;
  fill_kernel<<<1024, 256, 0, s>>>(n, lo, hi, seed, store);
  KVSIFT_BENCH_CUDA(cudaGetLastError());
}

// One 16-byte load per thread per step, accumulated so the loads cannot be dropped.
__global__ void stream_read_kernel(const float4* __restrict__ p, std::size_t n, float* sink) {
  float acc = 0.f;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    const float4 v = __ldg(p + i);
    acc += v.x + v.y + v.z + v.w;
  }
  if (acc == 12345.678f) *sink = acc;  // practically never true; keeps the loads live
}

// Instruction-cache eviction: a straight line of kCodeFlushSteps 16-byte instructions, 256 KiB of code,
// run by a warp on (practically) every SM. Hopper's per-SM instruction caches are smaller, so the
// kernel timed next fetches its code from L2 (or, after the L2 flush, from HBM) as it does inside a
// step, behind kernels of other code.
constexpr int kCodeFlushSteps = 16384;
__global__ void code_flush_kernel(unsigned seed, unsigned* sink) {
  // x = x * y + c_i with y known only at run time: ptxas cannot fold the chain into fewer instructions.
  const unsigned y = seed | 1u;
  unsigned x = seed + threadIdx.x;
#pragma unroll
  for (int i = 0; i < kCodeFlushSteps; ++i) asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(x) : "r"(y), "r"(unsigned(i) * 2654435761u));
  if (x == 0x9e3779b9u) *sink = x;  // keeps the chain live
}

}  // namespace

void flush_code(cudaStream_t stream) {
  static DeviceArray<unsigned> sink(1);
  static const int sms = [] {
    int dev = 0, n = 0;
    KVSIFT_BENCH_CUDA(cudaGetDevice(&dev));
    KVSIFT_BENCH_CUDA(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  // Two one-warp blocks an SM: the block scheduler spreads them, so every SM runs one or two.
  code_flush_kernel<<<2 * sms, 32, 0, stream>>>(3u, sink.get());
  KVSIFT_BENCH_CUDA(cudaGetLastError());
}

void fill_uniform(float* p, std::size_t n, float lo, float hi, std::uint64_t seed, cudaStream_t s) {
  launch_fill(n, lo, hi, seed, s, StoreF32{p});
}
void fill_uniform_bf16(void* p, std::size_t n, float lo, float hi, std::uint64_t seed, cudaStream_t s) {
  launch_fill(n, lo, hi, seed, s, StoreBF16{static_cast<std::uint16_t*>(p)});
}
void fill_uniform_half(void* p, std::size_t n, float lo, float hi, std::uint64_t seed, cudaStream_t s) {
  launch_fill(n, lo, hi, seed, s, StoreHalf{static_cast<std::uint16_t*>(p)});
}

// KVSIFT_BENCH_FLUSH=read flushes by reading the scratch instead of rewriting it. A rewrite (the
// default, and what FlashInfer's benchmark does) leaves the L2 full of dirty lines, so the timed
// kernel's first ~L2-size of reads also pays their write-back; a read leaves clean lines, as the
// weight reads before an engine's attention do.
void flush_l2(cudaStream_t stream) {
  static DeviceArray<char>* scratch = [] {
    int dev = 0, l2 = 0;
    KVSIFT_BENCH_CUDA(cudaGetDevice(&dev));
    KVSIFT_BENCH_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    return new DeviceArray<char>(std::size_t(std::max(l2, 1 << 20)) * 2);
  }();
  static DeviceArray<float> sink(1);
  static const bool by_reading = [] {
    const char* env = std::getenv("KVSIFT_BENCH_FLUSH");
    return env != nullptr && std::string(env) == "read";
  }();
  static const bool code = [] {
    const char* env = std::getenv("KVSIFT_BENCH_FLUSH_CODE");
    return env != nullptr && std::string(env) == "1";
  }();
  if (code) flush_code(stream);  // first: its own code then leaves L2 with the rest
  if (by_reading)
    launch_stream_read(scratch->get(), scratch->bytes(), sink.get(), stream);
  else
    KVSIFT_BENCH_CUDA(cudaMemsetAsync(scratch->get(), 0, scratch->bytes(), stream));
}

void launch_stream_read(const void* p, std::size_t bytes, float* sink, cudaStream_t stream) {
  int dev = 0, sms = 0;
  KVSIFT_BENCH_CUDA(cudaGetDevice(&dev));
  KVSIFT_BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  stream_read_kernel<<<sms * 8, 512, 0, stream>>>(static_cast<const float4*>(p), bytes / 16, sink);
}

double read_ceiling_tbps() {
  static const double ceiling = [] {
    if (const char* env = std::getenv("KVSIFT_BW_CEILING_TBPS")) return std::atof(env);
    const std::size_t bytes = std::size_t(2) << 30;  // 2 GiB: far beyond the 60 MB L2
    DeviceArray<float> buf(bytes / sizeof(float)), sink(1);
    fill_uniform(buf.get(), buf.n, -1.f, 1.f, 7);
    cudaEvent_t a, b;
    KVSIFT_BENCH_CUDA(cudaEventCreate(&a));
    KVSIFT_BENCH_CUDA(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int i = 0; i < 23; ++i) {
      KVSIFT_BENCH_CUDA(cudaEventRecord(a));
      launch_stream_read(buf.get(), bytes, sink.get(), nullptr);
      KVSIFT_BENCH_CUDA(cudaEventRecord(b));
      KVSIFT_BENCH_CUDA(cudaEventSynchronize(b));
      float t = 0.f;
      KVSIFT_BENCH_CUDA(cudaEventElapsedTime(&t, a, b));
      if (i >= 3) ms.push_back(t);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(ms.begin(), ms.end());
    const double tbps = double(bytes) / (ms[ms.size() / 2] * 1e-3) * 1e-12;
    std::fprintf(stderr, "kvsift bench: measured streaming-read ceiling %.3f TB/s (KVSIFT_BW_CEILING_TBPS overrides)\n", tbps);
    return tbps;
  }();
  return ceiling;
}

}  // namespace kvsift_bench

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("kvsift benchmarks need a CUDA device; none found, nothing measured.\n");
    return 0;
  }
  cudaDeviceProp prop{};
  KVSIFT_BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  benchmark::AddCustomContext("gpu", prop.name);
  benchmark::AddCustomContext("sm_count", std::to_string(prop.multiProcessorCount));
  benchmark::AddCustomContext("l2_bytes", std::to_string(prop.l2CacheSize));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
