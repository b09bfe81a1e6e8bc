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
// Layout of the work: one block of kGemvThreads computes R (2 or 4) output rows, its threads
// splitting the columns in 16-byte chunks (8 bf16). Every thread keeps the loads of its next chunk
// of all those rows in flight while it multiplies the current one, and reuses each activation chunk
// for all of the rows (activations are a few KB and stay in L1/L2; the weights are read once, with
// a streaming hint so they do not evict them). Splitting columns inside a block, not rows across
// warps, is what fills the GPU for the small matrices (k/v: 1024 rows = 256 blocks of 8 warps) and
// keeps the reduction deterministic: warp shuffles, then the warps' partial sums in shared memory.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_pdl.cuh"

namespace minimal_decoder {
namespace kernels {

constexpr int kGemvMaxRows = 8;  // batch sizes served by gemv_bf16; larger n goes to cuBLAS
constexpr int kGemvThreads = 256;

// Weight rows per block. 4 everywhere: 2 rows (60 instead of 98 registers at 4 input rows, twice the
// resident blocks) measured no faster at 4 input rows and up to 1.5x slower at 8 (bench_decoder_gemv,
// docs/performance.md); the benchmark keeps both to compare.
constexpr int gemv_rows_per_block(int /*input_rows*/) { return 4; }

// x rounded to bf16 and back, two at a time: one paired conversion per two values. The rounding is
// done once per activation chunk and reused for every weight row (conversions, not FMAs, are the
// scarce unit: 16 per clock per SM).
__device__ inline float2 bf16_round2(float a, float b) { return __bfloat1622float2(__floats2bfloat162_rn(a, b)); }

// The 8 bf16 weights of a 16-byte chunk as floats (unpacked once per chunk, then used for every input row).
__device__ inline void unpack8(const uint4& w, float (&out)[8]) {
  const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&w);
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(wp[j]);
    out[2 * j] = f.x;
    out[2 * j + 1] = f.y;
  }
}

// silu(g) * u with kernels::silu_mul's expression: the GEMVs' SwiGLU-fused input loads and the
// pipelined GEMV's SwiGLU pairs (cuda_gemv_pipelined.cuh) call it, so every path agrees bit for bit.
__device__ inline float swiglu1(float g, float u) { return g / (1.f + expf(-g)) * u; }
// The same for four gate/up pairs.
__device__ inline float4 swiglu4(float4 g, float4 u) {
  return make_float4(swiglu1(g.x, u.x), swiglu1(g.y, u.y), swiglu1(g.z, u.z), swiglu1(g.w, u.w));
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
    a = swiglu4(a, __ldg(ur));
    b = swiglu4(b, __ldg(ur + 1));
  }
  out[0] = bf16_round2(a.x, a.y);
  out[1] = bf16_round2(a.z, a.w);
  out[2] = bf16_round2(b.x, b.y);
  out[3] = bf16_round2(b.z, b.w);
}

// Up to kGemvMaxTargets projections of the same input (q/k/v, gate/up) in one launch: target t
// owns blocks [first_block[t], first_block[t + 1]). One launch instead of three keeps the GPU busy
// across what would be three ramps and tails, which is most of the cost of the small k/v matrices.
constexpr int kGemvMaxTargets = 3;
struct GemvTargets {
  const __nv_bfloat16* w[kGemvMaxTargets];
  float* y[kGemvMaxTargets];
  int rows[kGemvMaxTargets];
  int first_block[kGemvMaxTargets + 1];
  int count;
  // The pipelined GEMV's dynamic tile schedule (cuda_gemv_pipelined.cuh): two ints, 0 between launches,
  // owned by this launch alone while it runs; null: every block takes a fixed share of the tiles.
  int* schedule = nullptr;
  // A persistent GEMV's grid (launch_persistent_gemv): false, every block that fits at once; true, the
  // fewest blocks that take the same number of rounds of tiles, so the last round is (nearly) full.
  bool balanced = false;
  // The pipelined GEMV's SwiGLU pairs (cuda_gemv_pipelined.cuh, launch_gemv_bf16_pipelined): set,
  // targets 0 and 1 are the gate and up projections of one MLP (same rows), every tile computes the same
  // rows of both, and the GEMV writes swiglu[n, rows] = bf16(silu(gate) * up) instead of y: the down
  // projection's input, rounded as the SwiGLU-fused GEMV rounds it. Null: y, as always.
  __nv_bfloat16* swiglu = nullptr;
};

// Requires cols % 8 == 0 and 16-byte aligned w and x (the caller checks; cudaMalloc'd rows of a
// multiple of 8 elements are).
template <int N, int R, bool kSwiGLU>
__global__ void __launch_bounds__(kGemvThreads) gemv_bf16(const __grid_constant__ GemvTargets targets, int cols,
                                                          const float* __restrict__ x, const float* __restrict__ up) {
  constexpr int kWarps = kGemvThreads / 32;
  __shared__ float partial[kWarps][R][N];
  // Launched with PDL (cuda_pdl.cuh), x is the previous kernel's output: wait before anything.
  // (gemv_bf16_pipelined, the default, starts its weight stream before this wait.)
  wait_for_previous_kernel();
  allow_next_kernel_launch();
  int t = 0;
  while (t + 1 < targets.count && int(blockIdx.x) >= targets.first_block[t + 1]) ++t;
  const __nv_bfloat16* w = targets.w[t];
  const int rows = targets.rows[t];
  const int first_row = (int(blockIdx.x) - targets.first_block[t]) * R;
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
    float wf[R][8];
    for (int r = 0; r < R; ++r) unpack8(cur[r], wf[r]);
    for (int i = 0; i < N; ++i) {
      float2 xi[4];
      load_input<kSwiGLU>(x, up, std::int64_t(i) * chunks + c, xi);
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < 4; ++j) {
          acc[r][i] = fmaf(wf[r][2 * j], xi[j].x, acc[r][i]);
          acc[r][i] = fmaf(wf[r][2 * j + 1], xi[j].y, acc[r][i]);
        }
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
    if (first_row + r < rows) targets.y[t][std::int64_t(i) * rows + first_row + r] = sum;
  }
}

template <int N, int R>
cudaError_t launch_gemv_rows(const GemvTargets& targets, int cols, const float* x, cudaStream_t stream, const float* up, bool pdl) {
  const unsigned blocks = unsigned(targets.first_block[targets.count]);
  if (up) return launch_kernel(gemv_bf16<N, R, true>, blocks, kGemvThreads, 0, stream, pdl, targets, cols, x, up);
  return launch_kernel(gemv_bf16<N, R, false>, blocks, kGemvThreads, 0, stream, pdl, targets, cols, x, up);
}

template <int N>
cudaError_t launch_gemv_n(GemvTargets targets, int cols, const float* x, cudaStream_t stream, const float* up, int rows_per_block,
                          bool pdl) {
  const int R = rows_per_block > 0 ? rows_per_block : gemv_rows_per_block(N);
  targets.first_block[0] = 0;
  for (int t = 0; t < targets.count; ++t) targets.first_block[t + 1] = targets.first_block[t] + (targets.rows[t] + R - 1) / R;
  if (R == 2) return launch_gemv_rows<N, 2>(targets, cols, x, stream, up, pdl);
  return launch_gemv_rows<N, 4>(targets, cols, x, stream, up, pdl);
}

// Launches gemv_bf16 for n in 1..kGemvMaxRows on `stream`: y_t = x W_t^T for every target of
// `targets` (w, rows, y filled, count set; the block ranges are filled here). With `up`, the input
// is silu(x) * up. rows_per_block: 2 or 4 weight rows per block, 0 = gemv_rows_per_block(n).
// pdl: launch with programmatic stream serialization (cuda_pdl.cuh). Returns the launch's error.
inline cudaError_t launch_gemv_bf16(const GemvTargets& targets, int cols, const float* x, int n, cudaStream_t stream,
                                    const float* up = nullptr, int rows_per_block = 0, bool pdl = false) {
  switch (n) {
    case 1: return launch_gemv_n<1>(targets, cols, x, stream, up, rows_per_block, pdl);
    case 2: return launch_gemv_n<2>(targets, cols, x, stream, up, rows_per_block, pdl);
    case 3: return launch_gemv_n<3>(targets, cols, x, stream, up, rows_per_block, pdl);
    case 4: return launch_gemv_n<4>(targets, cols, x, stream, up, rows_per_block, pdl);
    case 5: return launch_gemv_n<5>(targets, cols, x, stream, up, rows_per_block, pdl);
    case 6: return launch_gemv_n<6>(targets, cols, x, stream, up, rows_per_block, pdl);
    case 7: return launch_gemv_n<7>(targets, cols, x, stream, up, rows_per_block, pdl);
    case 8: return launch_gemv_n<8>(targets, cols, x, stream, up, rows_per_block, pdl);
    default: return cudaErrorInvalidValue;
  }
}

// One projection's targets.
inline GemvTargets single_gemv_target(const __nv_bfloat16* w, int rows, float* y) {
  GemvTargets one{};
  one.w[0] = w;
  one.rows[0] = rows;
  one.y[0] = y;
  one.count = 1;
  return one;
}

// One projection.
inline cudaError_t launch_gemv_bf16(const __nv_bfloat16* w, int rows, int cols, const float* x, int n, float* y,
                                    cudaStream_t stream, const float* up = nullptr) {
  return launch_gemv_bf16(single_gemv_target(w, rows, y), cols, x, n, stream, up);
}

}  // namespace kernels
}  // namespace minimal_decoder
