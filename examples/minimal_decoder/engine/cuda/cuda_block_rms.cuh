#pragma once
// The block-wide RMS of a row, shared by the norm kernels (cuda_kernels.cuh) and the GEMV that
// applies the norm in its prologue (cuda_gemv_pipelined.cuh): one function, so both produce the same
// bits from the same per-thread partial sums.

namespace minimal_decoder {
namespace kernels {

constexpr int kThreads = 256;  // the block size of the decoder's elementwise and norm kernels

// 1 / sqrt(mean(x^2) + eps) of a row, from each thread's partial sum of squares (one block per row,
// at most kThreads threads), the same in every thread.
__device__ inline float block_inverse_rms(float ss, int dim, float eps) {
  __shared__ float warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < int(blockDim.x / 32); ++i) total += warp_sums[i];
  return 1.f / sqrtf(total / float(dim) + eps);
}

}  // namespace kernels
}  // namespace minimal_decoder
