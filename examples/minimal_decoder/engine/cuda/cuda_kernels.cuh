#pragma once
// The decoder's own CUDA kernels: everything in a Llama layer that is neither a GEMM (cuBLAS) nor
// attention (kvsift). Each mirrors one HostBackend member, with the same float arithmetic where it
// matters for agreement (RoPE angles, RMSNorm epsilon placement), so the CPU and GPU paths differ
// only by the bf16 rounding of weights, GEMM inputs and the KV cache.
//
// Kernels are templates (over the activation type, always float here) so that this header can be
// included by several translation units without duplicate symbols. None allocates or synchronizes;
// every launch takes the backend's stream, so a decode step can be captured into a CUDA graph.
// Every kernel opens with the PDL wait and trigger (cuda_pdl.cuh): the backend may launch any of
// them with programmatic stream serialization. They have no independent work worth starting before
// the wait (their inputs are the previous kernel's outputs), so the wait comes first. (Triggering
// before the wait, so that the kernel after next is scheduled while this one waits, measured slower
// end to end: docs/performance.md, eleventh session.)

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include <kvsift/kvsift.cuh>

#include "cuda_block_rms.cuh"
#include "cuda_block_row.cuh"
#include "cuda_pdl.cuh"
#include "engine/tensor_block.hpp"

namespace minimal_decoder {
namespace kernels {


inline unsigned blocks_for(std::int64_t n, int threads = kThreads) {
  const std::int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 65535 * 32 ? (b > 0 ? b : 1) : 65535 * 32);  // grid-stride loops cover the rest
}

// out[i, :] = float(table[tokens[i], :]); a row segment's loads before its stores (cuda_block_row.cuh).
template <class T>
__global__ void embed(const std::int32_t* tokens, int n, const __nv_bfloat16* table, int cols, T* out) {
  wait_for_previous_kernel();  // PDL (cuda_pdl.cuh): before the first dependent read or any write
  allow_next_kernel_launch();
  const int row = blockIdx.x;
  if (row >= n) return;
  const __nv_bfloat16* src = table + std::int64_t(tokens[row]) * cols;
  T* dst = out + std::int64_t(row) * cols;
  for (int base = 0; base < cols; base += row_segment_size()) {
    float v[kRowSlots];
    load_row_segment([&](int i) { return __bfloat162float(src[i]); }, cols, base, v);
    store_row_segment([&](int i, float x) { dst[i] = T(x); }, cols, base, v);
  }
}


// One block per row: y = x * rsqrt(mean(x^2) + eps) * w. Each thread writes only the elements it
// read, after the block-wide sum, so y may alias x (the q/k norms run in place). A row of one segment
// stays in registers between the sum and the writes (cuda_block_row.cuh); a longer one is read again.
template <class T>
__global__ void rms_norm(const T* x, int dim, const float* w, float eps, T* y) {
  wait_for_previous_kernel();  // PDL (cuda_pdl.cuh): before the first dependent read or any write
  allow_next_kernel_launch();
  const T* xr = x + std::int64_t(blockIdx.x) * dim;
  T* yr = y + std::int64_t(blockIdx.x) * dim;
  auto load_x = [&](int i) { return float(xr[i]); };
  float v[kRowSlots];
  float ss = 0.f;
  for (int base = 0; base < dim; base += row_segment_size()) {
    load_row_segment(load_x, dim, base, v);
#pragma unroll
    for (int k = 0; k < kRowSlots; ++k) ss += v[k] * v[k];  // 0 past dim: adds nothing
  }
  const float inv = block_inverse_rms(ss, dim, eps);
  for (int base = 0; base < dim; base += row_segment_size()) {
    if (dim > row_segment_size()) load_row_segment(load_x, dim, base, v);
    float wv[kRowSlots];
    load_row_segment([&](int i) { return w[i]; }, dim, base, wv);
#pragma unroll
    for (int k = 0; k < kRowSlots; ++k) v[k] = v[k] * inv * wv[k];
    store_row_segment([&](int i, float o) { yr[i] = T(o); }, dim, base, v);
  }
}

// One block per row: x_out = x + y (x alone when y is null), then out = rms_norm(x_out) as above (the
// residual add fused into the next norm). x_out may be x; each thread writes out only where it read
// y, after the block-wide sum, so out may alias y. Segments as in rms_norm.
template <class T>
__global__ void add_rms_norm(const T* x, const T* y, T* x_out, int dim, const float* w, float eps, T* out) {
  wait_for_previous_kernel();  // PDL (cuda_pdl.cuh): before the first dependent read or any write
  allow_next_kernel_launch();
  const T* xr = x + std::int64_t(blockIdx.x) * dim;
  const T* yr = y ? y + std::int64_t(blockIdx.x) * dim : nullptr;
  T* xo = x_out + std::int64_t(blockIdx.x) * dim;
  T* outr = out + std::int64_t(blockIdx.x) * dim;
  float v[kRowSlots];
  float ss = 0.f;
  for (int base = 0; base < dim; base += row_segment_size()) {
    load_row_segment([&](int i) { return yr ? float(xr[i]) + float(yr[i]) : float(xr[i]); }, dim, base, v);
    store_row_segment([&](int i, float s) { xo[i] = T(s); }, dim, base, v);
#pragma unroll
    for (int k = 0; k < kRowSlots; ++k) ss += v[k] * v[k];  // 0 past dim: adds nothing
  }
  const float inv = block_inverse_rms(ss, dim, eps);
  for (int base = 0; base < dim; base += row_segment_size()) {
    if (dim > row_segment_size()) load_row_segment([&](int i) { return float(xo[i]); }, dim, base, v);
    float wv[kRowSlots];
    load_row_segment([&](int i) { return w[i]; }, dim, base, wv);
#pragma unroll
    for (int k = 0; k < kRowSlots; ++k) v[k] = float(T(v[k])) * inv * wv[k];  // x_out as stored
    store_row_segment([&](int i, float o) { outr[i] = T(o); }, dim, base, v);
  }
}

// RoPE "rotate half" in place on q [n, q_heads, head_dim] and k [n, k_heads, head_dim], one launch for
// both; one thread per (row, head, pair), so a decode step's handful of rows still spreads over
// thousands of threads (a thread per (row, pair) looping over the heads ran the 40 heads' read-modify-
// writes one after another at batch 1). The angle is the host's (rope_angle in
// host_backend.cpp): float32 inverse frequency and product, as Hugging Face computes them. The power
// is taken in double and rounded, which matches a correctly rounded powf better than CUDA's powf
// (2 ulp); cos/sin of that float angle are taken in double like the host, which also keeps positions
// near 128K exact.
template <class T>
__global__ void rope(T* q, int q_heads, T* k, int k_heads, const std::int32_t* positions, int n, int head_dim, float theta) {
  wait_for_previous_kernel();  // PDL (cuda_pdl.cuh): before the first dependent read or any write
  allow_next_kernel_launch();
  const int half = head_dim / 2, heads = q_heads + k_heads;
  const std::int64_t total = std::int64_t(n) * heads * half;
  for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += std::int64_t(gridDim.x) * blockDim.x) {
    const int i = int(idx % half), h = int(idx / half % heads), t = int(idx / (std::int64_t(half) * heads));
    const float freq_pow = float(pow(double(theta), double(float(2 * i) / float(head_dim))));
    const float inv_freq = 1.f / freq_pow;
    const float angle = float(positions[t]) * inv_freq;
    double s, c;
    sincos(double(angle), &s, &c);
    const float cf = float(c), sf = float(s);
    T* r = h < q_heads ? q + (std::int64_t(t) * q_heads + h) * head_dim : k + (std::int64_t(t) * k_heads + h - q_heads) * head_dim;
    const float x1 = float(r[i]), x2 = float(r[i + half]);
    r[i] = T(x1 * cf - x2 * sf);
    r[i + half] = T(x2 * cf + x1 * sf);
  }
}

// gate = silu(gate) * up, the host's expression
template <class T>
__global__ void silu_mul(T* gate, const T* up, std::int64_t n) {
  wait_for_previous_kernel();  // PDL (cuda_pdl.cuh): before the first dependent read or any write
  allow_next_kernel_launch();
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    const float g = float(gate[i]);
    gate[i] = T(g / (1.f + expf(-g)) * float(up[i]));
  }
}

// x += y
template <class T>
__global__ void add(T* x, const T* y, std::int64_t n) {
  wait_for_previous_kernel();  // PDL (cuda_pdl.cuh): before the first dependent read or any write
  allow_next_kernel_launch();
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    x[i] = T(float(x[i]) + float(y[i]));
}

// The GEMM input: float activations rounded to bf16 (round to nearest even).
template <class T>
__global__ void to_bf16(const T* x, std::int64_t n, __nv_bfloat16* y) {
  wait_for_previous_kernel();  // PDL (cuda_pdl.cuh): before the first dependent read or any write
  allow_next_kernel_launch();
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16_rn(float(x[i]));
}

// bf16 -> float, exact (attention outputs over an fp8 cache).
template <class T>
__global__ void from_bf16(const __nv_bfloat16* x, std::int64_t n, T* y) {
  wait_for_previous_kernel();  // PDL (cuda_pdl.cuh): before the first dependent read or any write
  allow_next_kernel_launch();
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = __bfloat162float(x[i]);
}

// K/V rows of token i ([n, kv_heads * head_dim], float) to cache slot slot[i] of sequence seq[i],
// rounded to the cache's type. One thread per element; the view's own addressing (k_row/v_row)
// places it, so any kvsift view works: ContiguousKV in any layout, PagedKV through its block table.
template <class T, class View>
__global__ void store_kv(const T* k, const T* v, int n, const std::int32_t* seq, const std::int32_t* slot, View cache) {
  wait_for_previous_kernel();  // PDL (cuda_pdl.cuh): before the first dependent read or any write
  allow_next_kernel_launch();
  using KV = typename View::value_type;
  const int D = cache.head_dim, row = cache.num_kv_heads * D;
  const std::int64_t total = std::int64_t(n) * row;
  for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += std::int64_t(gridDim.x) * blockDim.x) {
    const int i = int(idx / row), h = int(idx % row) / D, d = int(idx % D);
    cache.k_row(seq[i], h, slot[i])[d] = kvsift::dtype_traits<KV>::from_float(float(k[idx]));
    cache.v_row(seq[i], h, slot[i])[d] = kvsift::dtype_traits<KV>::from_float(float(v[idx]));
  }
}

// dst row dst_row[i] = src row i, for rows with dst_row[i] >= 0
template <class T>
__global__ void scatter_rows(const T* src, int n, std::int64_t row_elems, const std::int32_t* dst_row, T* dst) {
  wait_for_previous_kernel();  // PDL (cuda_pdl.cuh): before the first dependent read or any write
  allow_next_kernel_launch();
  const std::int64_t total = std::int64_t(n) * row_elems;
  for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += std::int64_t(gridDim.x) * blockDim.x) {
    const int i = int(idx / row_elems);
    const int d = dst_row[i];
    if (d >= 0) dst[std::int64_t(d) * row_elems + idx % row_elems] = src[idx];
  }
}

// A standard normal draw per element from a counter-based hash (SplitMix64 + Box-Muller), times
// `scale`: random weights and synthetic K/V generated where they are used, reproducible from the
// seed and independent of the launch shape, with no host-side generation of gigabytes.
__device__ inline std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The draw of element `i` of stream `seed`: a function of the two alone, so any block of a tensor
// can be generated by itself (fill_normal_block).
__device__ inline float hashed_normal(std::uint64_t seed, std::uint64_t i) {
  const std::uint64_t r = splitmix64(seed ^ splitmix64(i));
  const float u1 = (float(r >> 40) + 1.f) * (1.f / 16777217.f);  // (0, 1]
  const float u2 = float((r >> 16) & 0xffffffu) * (1.f / 16777216.f);
  return sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
}

template <class Out>
__global__ void fill_normal(Out* out, std::int64_t n, std::uint64_t seed, float scale) {
  wait_for_previous_kernel();  // PDL (cuda_pdl.cuh): before the first dependent read or any write
  allow_next_kernel_launch();
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    out[i] = kvsift::dtype_traits<Out>::from_float(hashed_normal(seed, std::uint64_t(i)) * scale);
}

// out[i] = value (--synthetic-prefill's fp8 scales).
__global__ void fill_value(float* out, std::int64_t n, float value) {
  wait_for_previous_kernel();  // PDL (cuda_pdl.cuh): before the first dependent read or any write
  allow_next_kernel_launch();
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    out[i] = value;
}

// out[i] = the draw of the full tensor's element block.global_index(i): a tensor-parallel rank's
// slice of a random weight, the same values as that slice of the whole tensor (random_device_layout.hpp).
template <class Out>
__global__ void fill_normal_block(Out* out, TensorBlock block, std::uint64_t seed, float scale) {
  wait_for_previous_kernel();  // PDL (cuda_pdl.cuh): before the first dependent read or any write
  allow_next_kernel_launch();
  const std::int64_t n = block.elements();
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    out[i] = kvsift::dtype_traits<Out>::from_float(hashed_normal(seed, std::uint64_t(block.global_index(i))) * scale);
}

}  // namespace kernels
}  // namespace minimal_decoder
