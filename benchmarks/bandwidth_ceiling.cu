// The memory-bandwidth ceiling every other kvsift target is a fraction of: a device-to-device copy
// (bytes read + bytes written) and a streaming read (16-byte loads over a buffer far beyond L2). And
// the harness floor: what an empty kernel and a small read cost under the same protocol (graph
// replay, L2 flushed by a memset before each iteration), the least any small call can measure.
#include <benchmark/benchmark.h>

#include "support/bench_support.cuh"

namespace {

void BM_DeviceCopy(benchmark::State& state) {
  const std::size_t bytes = std::size_t(state.range(0)) << 20;
  kvsift_bench::DeviceArray<float> src(bytes / 4), dst(bytes / 4);
  kvsift_bench::fill_uniform(src.get(), src.n, -1.f, 1.f, 1);
  kvsift_bench::time_gpu(state, 2.0 * bytes, [&](cudaStream_t s) {
    KVSIFT_BENCH_CUDA(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, s));
  });
}

void BM_StreamingRead(benchmark::State& state) {
  const std::size_t bytes = std::size_t(state.range(0)) << 20;
  kvsift_bench::DeviceArray<float> src(bytes / 4), sink(1);
  kvsift_bench::fill_uniform(src.get(), src.n, -1.f, 1.f, 2);
  kvsift_bench::time_gpu(state, double(bytes), [&](cudaStream_t s) {
    kvsift_bench::launch_stream_read(src.get(), bytes, sink.get(), s);
  });
}

__global__ void empty_kernel() {}

// range(0): KiB read (0: an empty kernel); range(1): 1 flushes L2 before each iteration, 0 keeps it warm.
void BM_HarnessFloor(benchmark::State& state) {
  const std::size_t bytes = std::size_t(state.range(0)) << 10;
  kvsift_bench::DeviceArray<float> src(bytes / 4 + 4), sink(1);
  kvsift_bench::fill_uniform(src.get(), src.n, -1.f, 1.f, 3);
  kvsift_bench::TimingOptions opt;
  opt.flush_l2 = state.range(1) != 0;
  kvsift_bench::time_gpu(
      state, double(bytes),
      [&](cudaStream_t s) {
        if (bytes == 0)
          empty_kernel<<<1, 32, 0, s>>>();
        else
          kvsift_bench::launch_stream_read(src.get(), bytes, sink.get(), s);
      },
      opt);
}

}  // namespace

// Sizes in MiB: 64 MiB is near the L2 (60 MB), 1-4 GiB are pure HBM. The harness floor's sizes in KiB
// are the K/V bytes of decode-attention rows (benchmarks/decode_attention.cu, 8 KV heads, d 128, bf16):
// 4 MiB = 1024 tokens, 16 MiB = a 4096-token gather, 128 MiB = 32K tokens, 512 MiB = 128K tokens, at
// batch 1; so a row's protocol floor is the streaming read of its bytes under the same protocol.
BENCHMARK(BM_DeviceCopy)->Arg(64)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_StreamingRead)->Arg(64)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HarnessFloor)->ArgsProduct({{0, 64, 1024, 4096, 16384, 131072, 524288}, {1, 0}})->UseManualTime()->Unit(benchmark::kMicrosecond);
