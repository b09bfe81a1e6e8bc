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
// Layout of the work: one block of kGemvThreads computes kGemvRowsPerBlock output rows, its threads
// splitting the columns in 16-byte chunks (8 bf16). Every thread keeps the loads of its next chunk
// of all those rows in flight while it multiplies the current one, and reuses each activation chunk
// for all of the rows (activations are a few KB and stay in L1/L2; the weights are read once, with
// a streaming hint so they do not evict them). Splitting columns inside a block, not rows across
// warps, is what fills the GPU for the small matrices (k/v: 1024 rows = 256 blocks of 8 warps) and
// keeps the reduction deterministic: warp shuffles, then the warps' partial sums in shared memory.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace minimal_decoder {
namespace kernels {

constexpr int kGemvMaxRows = 8;  // batch sizes served by gemv_bf16; larger n goes to cuBLAS
constexpr int kGemvRowsPerBlock = 4;
constexpr int kGemvThreads = 256;

// x rounded to bf16 and back, two at a time: one paired conversion per two values. The rounding is
// done once per activation chunk and reused for every weight row (conversions, not FMAs, are the
// scarce unit: 16 per clock per SM).
__device__ inline float2 bf16_round2(float a, float b) { return __bfloat1622float2(__floats2bfloat162_rn(a, b)); }

// acc += dot(w[0..7], x[0..7]), x already rounded.
__device__ inline float dot8(const uint4& w, const float2 (&x)[4], float acc) {
  const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&w);
  for (int j = 0; j < 4; ++j) {
    const float2 wj = __bfloat1622float2(wp[j]);
    acc = fmaf(wj.x, x[j].x, acc);
    acc = fmaf(wj.y, x[j].y, acc);
  }
  return acc;
}

// The GEMV's input chunk i of a row: x itself, or for the SwiGLU down projection silu(gate) * up
// computed on the fly (the expression of kernels::silu_mul, so the fused and unfused paths agree).
// Returns the chunk rounded to bf16 (as the GEMM input is).
template <bool kSwiGLU>
__device__ inline void load_input(const float* x, const float* up, std::int64_t i, float2 (&out)[4]) {
  const float4* xr = reinterpret_cast<const float4*>(x) + 2 * i;
  float4 a = __ldg(xr), b = __ldg(xr + 1);
  if (kSwiGLU) {
    const float4* ur = reinterpret_cast<const float4*>(up) + 2 * i;
    const float4 ua = __ldg(ur), ub = __ldg(ur + 1);
    auto swiglu = [](float g, float u) { return g / (1.f + expf(-g)) * u; };
    a = make_float4(swiglu(a.x, ua.x), swiglu(a.y, ua.y), swiglu(a.z, ua.z), swiglu(a.w, ua.w));
    b = make_float4(swiglu(b.x, ub.x), swiglu(b.y, ub.y), swiglu(b.z, ub.z), swiglu(b.w, ub.w));
  }
  out[0] = bf16_round2(a.x, a.y);
  out[1] = bf16_round2(a.z, a.w);
  out[2] = bf16_round2(b.x, b.y);
  out[3] = bf16_round2(b.z, b.w);
}

// Requires cols % 8 == 0 and 16-byte aligned w and x (the caller checks; cudaMalloc'd rows of a
// multiple of 8 elements are).
template <int N, bool kSwiGLU>
__global__ void __launch_bounds__(kGemvThreads) gemv_bf16(const __nv_bfloat16* __restrict__ w, int rows, int cols,
                                                          const float* __restrict__ x, const float* __restrict__ up,
                                                          float* __restrict__ y) {
  constexpr int R = kGemvRowsPerBlock, kWarps = kGemvThreads / 32;
  __shared__ float partial[kWarps][R][N];
  const int first_row = blockIdx.x * R;
  const int chunks = cols / 8;
  const uint4* wr[R];
  for (int r = 0; r < R; ++r)  // rows past the end re-read the last row and are not written
    wr[r] = reinterpret_cast<const uint4*>(w + std::int64_t(min(first_row + r, rows - 1)) * cols);
  float acc[R][N] = {};
  int c = threadIdx.x;
  uint4 cur[R];
  if (c < chunks)
    for (int r = 0; r < R; ++r) cur[r] = __ldcs(wr[r] + c);
  for (; c < chunks; c += kGemvThreads) {
    uint4 next[R];
    const bool more = c + kGemvThreads < chunks;
    for (int r = 0; r < R; ++r) next[r] = more ? __ldcs(wr[r] + c + kGemvThreads) : cur[r];
    for (int i = 0; i < N; ++i) {
      float2 xi[4];
      load_input<kSwiGLU>(x, up, std::int64_t(i) * chunks + c, xi);
      for (int r = 0; r < R; ++r) acc[r][i] = dot8(cur[r], xi, acc[r][i]);
    }
    for (int r = 0; r < R; ++r) cur[r] = next[r];
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < N; ++i) {
      float v = acc[r][i];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) partial[warp][r][i] = v;
    }
  __syncthreads();
  if (threadIdx.x < R * N) {
    const int r = threadIdx.x / N, i = threadIdx.x % N;
    float sum = 0.f;
    for (int k = 0; k < kWarps; ++k) sum += partial[k][r][i];  // fixed order: deterministic
    if (first_row + r < rows) y[std::int64_t(i) * rows + first_row + r] = sum;
  }
}

// Launches gemv_bf16 for n in 1..kGemvMaxRows on `stream`; with `up`, the input is silu(x) * up.
inline void launch_gemv_bf16(const __nv_bfloat16* w, int rows, int cols, const float* x, int n, float* y, cudaStream_t stream,
                             const float* up = nullptr) {
  const unsigned blocks = unsigned((rows + kGemvRowsPerBlock - 1) / kGemvRowsPerBlock);
  switch (n) {
#define KVSIFT_DECODER_GEMV_CASE(N)                                                        \
  case N:                                                                                  \
    if (up)                                                                                \
      gemv_bf16<N, true><<<blocks, kGemvThreads, 0, stream>>>(w, rows, cols, x, up, y);    \
    else                                                                                   \
      gemv_bf16<N, false><<<blocks, kGemvThreads, 0, stream>>>(w, rows, cols, x, up, y);   \
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
