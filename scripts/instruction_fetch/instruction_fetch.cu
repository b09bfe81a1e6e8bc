// Cold instruction fetch: the time of straight-line kernels of 0.5-128 KiB of code, warm (the same
// kernel just before) and cold (two other 128 KiB kernels on every SM, then an L2 flush by memset, so
// the timed kernel fetches its code from HBM as behind other kernels in a decode step). Each kernel
// runs 8 independent IMAD chains, so one warp issues an instruction a cycle; three launch shapes (one
// or four warps an SM, and four blocks an SM); medians of 15 launches by CUDA events. Prices the code
// a kernel executes: docs/performance.md, "Forty-seventh session" (~0.06 us per KiB cold).
// A measurement tool, not part of the library:
//   nvcc -O3 -arch=sm_90a -o /tmp/instruction_fetch scripts/instruction_fetch/instruction_fetch.cu && /tmp/instruction_fetch
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
// 8 independent chains: one warp can issue an instruction a cycle.
template <int kSteps, int kSalt>
__global__ void straight(unsigned seed, unsigned* sink) {
  const unsigned y = seed | 1u;
  unsigned x[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) x[c] = seed + threadIdx.x + c;
#pragma unroll
  for (int i = 0; i < kSteps / 8; ++i)
#pragma unroll
    for (int c = 0; c < 8; ++c)
      asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(x[c]) : "r"(y), "r"(unsigned(i * 8 + c) * 2654435761u + kSalt));
  unsigned s = 0;
#pragma unroll
  for (int c = 0; c < 8; ++c) s ^= x[c];
  if (s == 0x9e3779b9u) *sink = s;
}
template <int kSteps>
float time_one(int blocks, int threads, bool cold, unsigned* sink, char* scratch, size_t scratch_bytes, cudaEvent_t a, cudaEvent_t b) {
  std::vector<float> t;
  for (int r = 0; r < 15; ++r) {
    if (cold) {
      straight<8192, 7><<<264, 32>>>(3u, sink);
      straight<8192, 9><<<264, 32>>>(3u, sink);
      cudaMemsetAsync(scratch, r, scratch_bytes);
    } else {
      straight<kSteps, 1><<<blocks, threads>>>(3u, sink);
    }
    cudaEventRecord(a);
    straight<kSteps, 1><<<blocks, threads>>>(3u, sink);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms * 1000.f);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
int main() {
  unsigned* sink; char* scratch; size_t bytes = size_t(200) << 20;
  CK(cudaMalloc(&sink, 4)); CK(cudaMalloc(&scratch, bytes));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  const int cfg[3][2] = {{132, 32}, {132, 128}, {528, 128}};
  for (auto& c : cfg) {
    for (int cold = 0; cold < 2; ++cold) {
      printf("blocks %d threads %d %s: ", c[0], c[1], cold ? "cold" : "warm");
      printf("0.5KiB %.2f  4KiB %.2f  16KiB %.2f  32KiB %.2f  64KiB %.2f  128KiB %.2f us\n",
             time_one<32>(c[0], c[1], cold, sink, scratch, bytes, a, b), time_one<256>(c[0], c[1], cold, sink, scratch, bytes, a, b),
             time_one<1024>(c[0], c[1], cold, sink, scratch, bytes, a, b), time_one<2048>(c[0], c[1], cold, sink, scratch, bytes, a, b),
             time_one<4096>(c[0], c[1], cold, sink, scratch, bytes, a, b), time_one<8192>(c[0], c[1], cold, sink, scratch, bytes, a, b));
    }
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
