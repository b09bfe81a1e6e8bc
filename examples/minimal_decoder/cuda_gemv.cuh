#pragma once
// The decode step's projections: y[n, rows] = x[n, cols] W^T for a handful of rows n (the batch),
// W bf16 [rows, cols] (nn.Linear layout), x and y float, fp32 accumulation.
//
// Why not cuBLAS here: with n <= 8 a projection is a matrix-vector product that must stream W from
// HBM once at full speed, and everything else is overhead. cuBLAS also wants its input in bf16, which
// costs a conversion launch per projection. This kernel reads the float activations directly and
// rounds them to bf16 in registers (the same rounding the cuBLAS path applies, so both paths compute
// bf16 x bf16 products with fp32 sums and agree to summation order).
//
// Layout of the work: one warp computes kRowsPerWarp output rows; each lane walks the columns in
// 16-byte chunks (8 bf16), keeping kRowsPerWarp weight loads in flight and reusing each activation
// chunk for all of those rows (activations are a few KB and stay in L1/L2; the weights are read
// once, with a streaming hint so they do not evict them). A warp shuffle reduces each row at the end.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace minimal_decoder {
namespace kernels {

constexpr int kGemvMaxRows = 8;     // batch sizes served by gemv_bf16; larger n goes to cuBLAS
constexpr int kGemvRowsPerWarp = 4;
constexpr int kGemvThreads = 256;

__device__ inline float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// acc += dot(w[0..7], x[0..7]) with x rounded to bf16 first.
__device__ inline float dot8(const uint4& w, const float4& x0, const float4& x1, float acc) {
  const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&w);
  const float2 w0 = __bfloat1622float2(wp[0]), w1 = __bfloat1622float2(wp[1]);
  const float2 w2 = __bfloat1622float2(wp[2]), w3 = __bfloat1622float2(wp[3]);
  acc = fmaf(w0.x, bf16_round(x0.x), acc);
  acc = fmaf(w0.y, bf16_round(x0.y), acc);
  acc = fmaf(w1.x, bf16_round(x0.z), acc);
  acc = fmaf(w1.y, bf16_round(x0.w), acc);
  acc = fmaf(w2.x, bf16_round(x1.x), acc);
  acc = fmaf(w2.y, bf16_round(x1.y), acc);
  acc = fmaf(w3.x, bf16_round(x1.z), acc);
  acc = fmaf(w3.y, bf16_round(x1.w), acc);
  return acc;
}

// Requires cols % 8 == 0 and 16-byte aligned w and x (the caller checks; cudaMalloc'd rows of a
// multiple of 8 elements are).
template <int N>
__global__ void __launch_bounds__(kGemvThreads) gemv_bf16(const __nv_bfloat16* __restrict__ w, int rows, int cols,
                                                          const float* __restrict__ x, float* __restrict__ y) {
  const int lane = threadIdx.x % 32;
  const int first_row = int((blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x) / 32) * kGemvRowsPerWarp;
  if (first_row >= rows) return;
  const int chunks = cols / 8;
  const uint4* wr[kGemvRowsPerWarp];
  for (int r = 0; r < kGemvRowsPerWarp; ++r)  // rows past the end re-read the last row and are not written
    wr[r] = reinterpret_cast<const uint4*>(w + std::int64_t(min(first_row + r, rows - 1)) * cols);
  float acc[kGemvRowsPerWarp][N] = {};
  for (int c = lane; c < chunks; c += 32) {
    uint4 wv[kGemvRowsPerWarp];
    for (int r = 0; r < kGemvRowsPerWarp; ++r) wv[r] = __ldcs(wr[r] + c);
    for (int i = 0; i < N; ++i) {
      const float4* xr = reinterpret_cast<const float4*>(x + std::int64_t(i) * cols) + 2 * c;
      const float4 x0 = __ldg(xr), x1 = __ldg(xr + 1);
      for (int r = 0; r < kGemvRowsPerWarp; ++r) acc[r][i] = dot8(wv[r], x0, x1, acc[r][i]);
    }
  }
  for (int r = 0; r < kGemvRowsPerWarp; ++r)
    for (int i = 0; i < N; ++i)
      for (int o = 16; o > 0; o >>= 1) acc[r][i] += __shfl_xor_sync(0xffffffffu, acc[r][i], o);
  if (lane == 0)
    for (int r = 0; r < kGemvRowsPerWarp && first_row + r < rows; ++r)
      for (int i = 0; i < N; ++i) y[std::int64_t(i) * rows + first_row + r] = acc[r][i];
}

// Launches gemv_bf16 for n in 1..kGemvMaxRows on `stream`.
inline void launch_gemv_bf16(const __nv_bfloat16* w, int rows, int cols, const float* x, int n, float* y, cudaStream_t stream) {
  const std::int64_t warps = (rows + kGemvRowsPerWarp - 1) / kGemvRowsPerWarp;
  const unsigned blocks = unsigned((warps * 32 + kGemvThreads - 1) / kGemvThreads);
  switch (n) {
#define KVSIFT_DECODER_GEMV_CASE(N) \
  case N:                           \
    gemv_bf16<N><<<blocks, kGemvThreads, 0, stream>>>(w, rows, cols, x, y); \
    break;
    KVSIFT_DECODER_GEMV_CASE(1)
    KVSIFT_DECODER_GEMV_CASE(2)
    KVSIFT_DECODER_GEMV_CASE(3)
    KVSIFT_DECODER_GEMV_CASE(4)
    KVSIFT_DECODER_GEMV_CASE(5)
    KVSIFT_DECODER_GEMV_CASE(6)
    KVSIFT_DECODER_GEMV_CASE(7)
    KVSIFT_DECODER_GEMV_CASE(8)
#undef KVSIFT_DECODER_GEMV_CASE
    default:
      break;
  }
}

}  // namespace kernels
}  // namespace minimal_decoder
