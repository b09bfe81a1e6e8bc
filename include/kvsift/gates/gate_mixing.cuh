#pragma once
// CUDA backend of gate output mixing (contract in gate_mixing.hpp).

#include <cstdint>

#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/core/reduce.cuh"
#include "kvsift/gates/gate_mixing.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kMixThreads = 256;

inline unsigned mix_blocks(std::int64_t elements) {
  const std::int64_t blocks = (elements + kMixThreads - 1) / kMixThreads;
  return unsigned(blocks < 65535 * 8 ? blocks : 65535 * 8);
}

// Elementwise over tokens * q_heads * head_dim; the flat index is split back into (t, h, d) so a
// padded token_stride is honoured.
template <class T>
__global__ void gate_mix_forward_kernel(GateMixShape s, const float* z, const T* dense, const T* sparse, T* o) {
  const std::int64_t per_token = std::int64_t(s.q_heads) * s.head_dim;
  const std::int64_t total = s.tokens * per_token;
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < total; e += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t t = e / per_token;
    const int h = int((e % per_token) / s.head_dim);
    const std::int64_t i = t * s.row_stride() + (e % per_token);
    o[i] = from_float<T>(mix_value(z[h / s.group_size()], to_float(dense[i]), to_float(sparse[i])));
  }
}

template <class T>
__global__ void gate_mix_input_grads_kernel(GateMixShape s, const float* z, const T* grad_o, T* grad_dense,
                                            T* grad_sparse) {
  const std::int64_t per_token = std::int64_t(s.q_heads) * s.head_dim;
  const std::int64_t total = s.tokens * per_token;
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < total; e += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t t = e / per_token;
    const int h = int((e % per_token) / s.head_dim);
    const std::int64_t i = t * s.row_stride() + (e % per_token);
    const float zj = z[h / s.group_size()];
    const float go = to_float(grad_o[i]);
    if (grad_dense) grad_dense[i] = from_float<T>(zj * go);
    if (grad_sparse) grad_sparse[i] = from_float<T>((1.f - zj) * go);
  }
}

// One block per KV head sums dL/dO * (O_dense - O_sparse) over its tokens, G heads and head_dim, in
// double and in a fixed order (deterministic, no atomics, no workspace).
template <class T>
__global__ void __launch_bounds__(kMixThreads) gate_mix_grad_z_kernel(GateMixShape s, const T* dense, const T* sparse,
                                                                      const T* grad_o, float* grad_z) {
  __shared__ typename BlockAllReduce<double, kMixThreads>::TempStorage tmp;
  const int j = blockIdx.x;
  const int g = s.group_size();
  const std::int64_t per_token = std::int64_t(g) * s.head_dim;  // the group's heads are contiguous
  const std::int64_t total = s.tokens * per_token;
  double partial = 0.0;
  for (std::int64_t e = threadIdx.x; e < total; e += kMixThreads) {
    const std::int64_t t = e / per_token;
    const std::int64_t i = t * s.row_stride() + std::int64_t(j) * per_token + (e % per_token);
    partial += double(to_float(grad_o[i])) * double(to_float(dense[i]) - to_float(sparse[i]));
  }
  const double sum = BlockAllReduce<double, kMixThreads>::sum(tmp, partial);
  if (threadIdx.x == 0) grad_z[j] = float(sum);
}

}  // namespace detail

namespace cuda {

template <class T>
Status gate_mix_forward(Exec exec, const GateMixShape& shape, const float* z, const T* o_dense, const T* o_sparse, T* o) {
  KVSIFT_TRY(detail::validate_gate_mix_shape(shape));
  if (shape.tokens == 0) return Status();
  KVSIFT_REQUIRE_NOT_NULL(z, "z");
  KVSIFT_REQUIRE_NOT_NULL(o_dense, "o_dense");
  KVSIFT_REQUIRE_NOT_NULL(o_sparse, "o_sparse");
  KVSIFT_REQUIRE_NOT_NULL(o, "o");
  const std::int64_t total = shape.tokens * shape.q_heads * shape.head_dim;
  detail::gate_mix_forward_kernel<<<detail::mix_blocks(total), detail::kMixThreads, 0, exec.stream>>>(shape, z, o_dense,
                                                                                                       o_sparse, o);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

template <class T>
Status gate_mix_backward(Exec exec, const GateMixShape& shape, const float* z, const T* o_dense, const T* o_sparse,
                         const T* grad_o, T* grad_dense, T* grad_sparse, float* grad_z) {
  KVSIFT_TRY(detail::validate_gate_mix_shape(shape));
  KVSIFT_REQUIRE(shape.kv_heads <= 65535, kUnsupported, "shape.kv_heads = ", shape.kv_heads,
                 " must be <= 65535 for this launch");
  if (shape.tokens > 0) {
    KVSIFT_REQUIRE_NOT_NULL(z, "z");
    KVSIFT_REQUIRE_NOT_NULL(grad_o, "grad_o");
  }
  if (grad_z && shape.tokens > 0) {
    KVSIFT_REQUIRE_NOT_NULL(o_dense, "o_dense");
    KVSIFT_REQUIRE_NOT_NULL(o_sparse, "o_sparse");
  }
  const std::int64_t total = shape.tokens * shape.q_heads * shape.head_dim;
  if (total > 0 && (grad_dense || grad_sparse)) {
    detail::gate_mix_input_grads_kernel<<<detail::mix_blocks(total), detail::kMixThreads, 0, exec.stream>>>(
        shape, z, grad_o, grad_dense, grad_sparse);
    KVSIFT_CHECK_LAUNCH();
  }
  if (grad_z) {  // also for tokens == 0, which writes zeros as the host does
    detail::gate_mix_grad_z_kernel<<<shape.kv_heads, detail::kMixThreads, 0, exec.stream>>>(shape, o_dense, o_sparse,
                                                                                            grad_o, grad_z);
    KVSIFT_CHECK_LAUNCH();
  }
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
