// The memory-bandwidth ceiling every other kvsift target is a fraction of: a device-to-device copy
// (bytes read + bytes written) and a streaming read (16-byte loads over a buffer far beyond L2). And
// the harness floor: what an empty kernel and a small read cost under the same protocol (graph
// replay, L2 flushed by a memset before each iteration), the least any small call can measure. And the
// gather ceiling: the best a bare read of a gathered decode's rows does, with the same index sets and
// layout as benchmarks/decode_attention.cu, so a gather row's distance from the floor splits into what
// HBM gives scattered rows and what the attention kernel adds.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

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

// Each thread reads one 16-byte chunk of kUnroll (K row, V row) pairs, all loads issued before any is
// used, so a warp keeps 2 * kUnroll * 512 bytes in flight: far more than the attention kernel's ring,
// which makes this an upper bound on what scattered rows give. Rows lie [batch, token, head] (BSHD).
template <int kRowBytes>
__global__ void gather_rows_kernel(const uint4* __restrict__ k, const uint4* __restrict__ v,
                                   const std::int32_t* __restrict__ units, int heads, int seq, int tokens_per_row,
                                   int block, long long slots, uint4* sink) {
  constexpr int kChunks = kRowBytes / 16, kUnroll = 4;
  const long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x / kChunks;
  const int chunk = int(g % kChunks);
  const int units_per_row = tokens_per_row / block;
  long long off[kUnroll];
#pragma unroll
  for (int j = 0; j < kUnroll; ++j) {
    const long long s = g / kChunks + j * stride;
    off[j] = -1;
    if (s < slots) {
      const long long r = s / tokens_per_row;
      const int i = int(s % tokens_per_row);
      const long long token = (long long)__ldg(units + r * units_per_row + i / block) * block + i % block;
      off[j] = (((r / heads) * seq + token) * heads + r % heads) * kChunks + chunk;
    }
  }
  uint4 a[kUnroll], b[kUnroll];
#pragma unroll
  for (int j = 0; j < kUnroll; ++j)
    if (off[j] >= 0) a[j] = __ldg(k + off[j]), b[j] = __ldg(v + off[j]);
  unsigned acc = 0;
#pragma unroll
  for (int j = 0; j < kUnroll; ++j)
    if (off[j] >= 0) acc ^= a[j].x ^ a[j].y ^ a[j].z ^ a[j].w ^ b[j].x ^ b[j].y ^ b[j].z ^ b[j].w;
  if (acc == 0x9e3779b9u) sink->x = acc;  // practically never true; keeps the loads live
}

// The decode benchmark's gathers (8 KV heads, 128K tokens, 4096 selected per (batch, KV head)):
// range(0) batch, range(1) bytes per K (and per V) row (256: bf16 d 128; 128: fp8), range(2) tokens per
// selected unit (1: token gather, 64: block gather, 4096: one run, the dense order as a control).
void BM_GatherCeiling(benchmark::State& state) {
  const int batch = int(state.range(0)), row_bytes = int(state.range(1)), block = int(state.range(2));
  constexpr int kHeads = 8, kSeq = 131072, kSelected = 4096;
  const std::size_t rows = std::size_t(batch) * kHeads, cache = rows * kSeq * row_bytes;
  kvsift_bench::DeviceArray<float> k(cache / 4), v(cache / 4);
  kvsift_bench::fill_uniform(k.get(), k.n, -1.f, 1.f, 21);
  kvsift_bench::fill_uniform(v.get(), v.n, -1.f, 1.f, 22);
  const std::vector<std::int32_t> sel = kvsift_bench::random_sorted_rows(int(rows), kSeq / block, kSelected / block, 7);
  kvsift_bench::DeviceArray<std::int32_t> units(sel.size());
  KVSIFT_BENCH_CUDA(cudaMemcpy(units.get(), sel.data(), units.bytes(), cudaMemcpyHostToDevice));
  kvsift_bench::DeviceArray<uint4> sink(1);
  const long long slots = (long long)rows * kSelected;
  const long long threads = slots * (row_bytes / 16) / 4;
  const int grid = int((threads + 255) / 256);
  const double traffic = double(slots) * 2.0 * row_bytes + double(units.bytes());
  const auto* kp = reinterpret_cast<const uint4*>(k.get());
  const auto* vp = reinterpret_cast<const uint4*>(v.get());
  kvsift_bench::time_gpu(state, traffic, [&](cudaStream_t s) {
    if (row_bytes == 128)
      gather_rows_kernel<128><<<grid, 256, 0, s>>>(kp, vp, units.get(), kHeads, kSeq, kSelected, block, slots, sink.get());
    else
      gather_rows_kernel<256><<<grid, 256, 0, s>>>(kp, vp, units.get(), kHeads, kSeq, kSelected, block, slots, sink.get());
    KVSIFT_BENCH_CUDA(cudaGetLastError());
  });
}

}  // namespace

// Sizes in MiB: 64 MiB is near the L2 (60 MB), 1-4 GiB are pure HBM. The harness floor's sizes in KiB
// are the K/V bytes of decode-attention rows (benchmarks/decode_attention.cu, 8 KV heads, d 128, bf16):
// 4 MiB = 1024 tokens, 16 MiB = a 4096-token gather, 128 MiB = 32K tokens, 512 MiB = 128K tokens, at
// batch 1, and 1 / 4 GiB = 32K / 128K tokens at batch 8; so a row's protocol floor is the streaming read
// of its bytes under the same protocol. The top-k rows of benchmarks/topk.cu (fp32 scores) add theirs:
// 64 KiB / 512 KiB / 2 MiB = 8 / 64 / 256 rows of 2048 block scores, 1 / 4 / 32 MiB = 8 / 32 / 256 rows
// of 32K, 4 / 16 / 128 MiB = 8 / 32 / 256 rows of 128K.
BENCHMARK(BM_DeviceCopy)->Arg(64)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_StreamingRead)->Arg(64)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HarnessFloor)->ArgsProduct({{0, 64, 512, 1024, 2048, 4096, 16384, 32768, 131072, 524288, 1048576, 4194304}, {1, 0}})->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GatherCeiling)->ArgsProduct({{1, 8}, {256, 128}, {1, 64, 4096}})->UseManualTime()->Unit(benchmark::kMicrosecond);
