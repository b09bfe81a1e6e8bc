#pragma once
/// \file
/// \brief CUDA backend of gate output mixing (contract in gate_mixing.hpp). Asynchronous on exec.stream; the
/// grids are sized from the element count alone, so the ops need neither the Exec's device facts nor a
/// workspace (one passed is ignored).

#include <cstdint>

#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/reduce.cuh"
#include "kvsift/core/workspace.hpp"
#include "kvsift/gates/detail/gate_launch.cuh"
#include "kvsift/gates/gate_mixing.hpp"

namespace kvsift {
namespace detail {

inline unsigned mix_blocks(std::int64_t elements) { return gate_blocks(elements, kGateThreads, 65535 * 8); }

/// Flat element e of the tokens * q_heads * head_dim outputs (per_token = q_heads * head_dim of them a
/// token): its query head and its offset in the padded layout. The elementwise kernels split e back into
/// (t, h, d) so a padded token_stride is honoured.
struct MixElement {
  int head;
  std::int64_t offset;
};

KVSIFT_HD inline MixElement mix_element(const GateMixShape& s, std::int64_t per_token, std::int64_t e) {
  const std::int64_t t = e / per_token;
  const int h = int((e % per_token) / s.head_dim);
  return MixElement{h, t * s.row_stride() + (e % per_token)};
}

template <class T>
__global__ void gate_mix_forward_kernel(GateMixShape s, const float* z, const T* dense, const T* sparse, T* o) {
  const std::int64_t per_token = std::int64_t(s.q_heads) * s.head_dim;
  const std::int64_t total = s.tokens * per_token;
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < total; e += std::int64_t(gridDim.x) * blockDim.x) {
    const MixElement m = mix_element(s, per_token, e);
    const float zj = z[m.head / s.group_size()];
    o[m.offset] = from_float<T>(mix_value(zj, to_float(dense[m.offset]), to_float(sparse[m.offset])));
  }
}

template <class T>
__global__ void gate_mix_input_grads_kernel(GateMixShape s, const float* z, const T* grad_o, T* grad_dense,
                                            T* grad_sparse) {
  const std::int64_t per_token = std::int64_t(s.q_heads) * s.head_dim;
  const std::int64_t total = s.tokens * per_token;
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < total; e += std::int64_t(gridDim.x) * blockDim.x) {
    const MixElement m = mix_element(s, per_token, e);
    const float zj = z[m.head / s.group_size()];
    const float go = to_float(grad_o[m.offset]);
    if (grad_dense) grad_dense[m.offset] = from_float<T>(zj * go);
    if (grad_sparse) grad_sparse[m.offset] = from_float<T>((1.f - zj) * go);
  }
}

/// One block per KV head sums dL/dO * (O_dense - O_sparse) over its tokens, G heads and head_dim, in
/// double and in a fixed order (deterministic, no atomics, no workspace).
template <class T>
__global__ void __launch_bounds__(kGateThreads) gate_mix_grad_z_kernel(GateMixShape s, const T* dense, const T* sparse,
                                                                       const T* grad_o, float* grad_z) {
  __shared__ typename BlockAllReduce<double, kGateThreads>::TempStorage tmp;
  const int j = blockIdx.x;
  const int g = s.group_size();
  const std::int64_t per_token = std::int64_t(g) * s.head_dim;  // the group's heads are contiguous
  const std::int64_t total = s.tokens * per_token;
  double partial = 0.0;
  for (std::int64_t e = threadIdx.x; e < total; e += kGateThreads) {
    const std::int64_t t = e / per_token;
    const std::int64_t i = t * s.row_stride() + std::int64_t(j) * per_token + (e % per_token);
    partial += double(to_float(grad_o[i])) * double(to_float(dense[i]) - to_float(sparse[i]));
  }
  const double sum = BlockAllReduce<double, kGateThreads>::sum(tmp, partial);
  if (threadIdx.x == 0) grad_z[j] = float(sum);
}

}  // namespace detail

namespace cuda {

/// As host::gate_mix_forward; every pointer is device memory.
template <class T>
Status gate_mix_forward(const Exec& exec, const GateMixShape& shape, const float* z, const T* o_dense, const T* o_sparse,
                        T* o, Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_gate_mix_forward(shape, z, o_dense, o_sparse, o));
  if (shape.tokens == 0) return Status();
  const std::int64_t total = shape.tokens * shape.q_heads * shape.head_dim;
  detail::gate_mix_forward_kernel<<<detail::mix_blocks(total), detail::kGateThreads, 0, exec.stream>>>(shape, z, o_dense,
                                                                                                        o_sparse, o);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

/// As host::gate_mix_backward (grad_z is written, zeros, even without tokens); device memory.
template <class T>
Status gate_mix_backward(const Exec& exec, const GateMixShape& shape, const float* z, const T* o_dense,
                         const T* o_sparse, const T* grad_o, T* grad_dense, T* grad_sparse, float* grad_z,
                         Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_gate_mix_backward(shape, z, o_dense, o_sparse, grad_o, grad_z));
  KVSIFT_REQUIRE(shape.kv_heads <= 65535, kUnsupported, "shape.kv_heads = ", shape.kv_heads,
                 " must be <= 65535 for this launch");
  const std::int64_t total = shape.tokens * shape.q_heads * shape.head_dim;
  if (total > 0 && (grad_dense || grad_sparse)) {
    detail::gate_mix_input_grads_kernel<<<detail::mix_blocks(total), detail::kGateThreads, 0, exec.stream>>>(
        shape, z, grad_o, grad_dense, grad_sparse);
    KVSIFT_CHECK_LAUNCH();
  }
  if (grad_z) {  // also for tokens == 0, which writes zeros as the host does
    detail::gate_mix_grad_z_kernel<<<shape.kv_heads, detail::kGateThreads, 0, exec.stream>>>(shape, o_dense, o_sparse,
                                                                                             grad_o, grad_z);
    KVSIFT_CHECK_LAUNCH();
  }
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
