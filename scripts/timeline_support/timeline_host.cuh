// What the timeline tools' drivers share (scripts/decode_timeline/timeline.cu,
// scripts/topk_timeline/timeline.cu): the error check, the L2 flushes before each timed call, the
// read-back of the marks and the per-block percentile table. Measurement tools, not part of the library.
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } } while (0)

__global__ void tl_read_all(const float4* p, size_t n, float* sink) {
  float acc = 0.f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) acc += p[i].x;
  if (acc == 1234.5f) *sink = acc;
}

// Twice the L2 of scratch, flushed before a timed call: "memset" (the benchmarks' flush, L2 left
// dirty), "none", or anything else a read of it (a clean cold L2).
struct TlFlush {
  std::string kind;
  size_t bytes = 0;
  char* scratch = nullptr;
  float* sink = nullptr;
  int num_sms = 0;
  TlFlush(std::string k, int sms) : kind(std::move(k)), num_sms(sms) {
    int l2 = 0;
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    bytes = size_t(l2) * 2;
    CK(cudaMalloc(&scratch, bytes));
    CK(cudaMalloc(&sink, 4));
  }
  void run(cudaStream_t st, int round) const {
    if (kind == "memset") CK(cudaMemsetAsync(scratch, round & 0xff, bytes, st));
    else if (kind != "none") tl_read_all<<<num_sms * 8, 512, 0, st>>>(reinterpret_cast<float4*>(scratch), bytes / 16, sink);
  }
};

// The marks of `blocks` blocks (kSlots each) after a call.
inline std::vector<unsigned long long> tl_read_marks(const unsigned long long* tl, int blocks, int slots) {
  std::vector<unsigned long long> h(size_t(blocks) * slots);
  CK(cudaMemcpy(h.data(), tl, h.size() * 8, cudaMemcpyDeviceToHost));
  return h;
}

// Microseconds from mark b to mark a.
inline double tl_us(unsigned long long a, unsigned long long b) { return (double(a) - double(b)) * 1e-3; }

// One line per non-empty column: its name and the p0 / p10 / p50 / p90 / p100 of its values.
inline void tl_print_percentiles(const char* const* names, const std::vector<double>* cols, int n, int name_width) {
  for (int c = 0; c < n; ++c) {
    std::vector<double> v = cols[c];
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    std::printf("    %-*s p0 %6.2f  p10 %6.2f  p50 %6.2f  p90 %6.2f  p100 %6.2f\n", name_width, names[c], v.front(),
                v[v.size() / 10], v[v.size() / 2], v[v.size() * 9 / 10], v.back());
  }
}
