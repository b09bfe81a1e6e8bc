#pragma once
/// \file
/// \brief Host reference of gate output mixing (contract in gate_mixing.hpp): loops over host memory with
/// the same mix formula as the CUDA kernels. Needs no workspace and no device facts.

#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/dtype.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/gates/gate_mixing.hpp"

namespace kvsift {
namespace host {

/// O = z o_dense + (1 - z) o_sparse, per KV head's gate z[h / G] (see the file comment); host memory.
/// kInvalidArgument for a bad shape, kNullPointer for a missing pointer when there are tokens.
template <class T>
Status gate_mix_forward(const Exec&, const GateMixShape& shape, const float* z, const T* o_dense, const T* o_sparse,
                        T* o, Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_gate_mix_forward(shape, z, o_dense, o_sparse, o));
  for (std::int64_t t = 0; t < shape.tokens; ++t)
    for (int h = 0; h < shape.q_heads; ++h) {
      const float zj = z[h / shape.group_size()];
      for (int d = 0; d < shape.head_dim; ++d) {
        const std::int64_t i = shape.offset(t, h, d);
        o[i] = from_float<T>(detail::mix_value(zj, to_float(o_dense[i]), to_float(o_sparse[i])));
      }
    }
  return Status();
}

/// Any of grad_dense, grad_sparse (same layout as O) and grad_z ([kv_heads], overwritten) may be null.
/// grad_z is written (zeros) even when there are no tokens.
template <class T>
Status gate_mix_backward(const Exec&, const GateMixShape& shape, const float* z, const T* o_dense, const T* o_sparse,
                         const T* grad_o, T* grad_dense, T* grad_sparse, float* grad_z,
                         Workspace /*workspace: none needed*/ = {}) {
  KVSIFT_TRY(detail::validate_gate_mix_backward(shape, z, o_dense, o_sparse, grad_o, grad_z));
  const int g = shape.group_size();
  for (int j = 0; j < shape.kv_heads; ++j) {
    double dz = 0.0;
    for (std::int64_t t = 0; t < shape.tokens; ++t)
      for (int h = j * g; h < (j + 1) * g; ++h)
        for (int d = 0; d < shape.head_dim; ++d) {
          const std::int64_t i = shape.offset(t, h, d);
          const float go = to_float(grad_o[i]);
          if (grad_dense) grad_dense[i] = from_float<T>(z[j] * go);
          if (grad_sparse) grad_sparse[i] = from_float<T>((1.f - z[j]) * go);
          if (grad_z) dz += double(go) * double(to_float(o_dense[i]) - to_float(o_sparse[i]));
        }
    if (grad_z) grad_z[j] = float(dz);
  }
  return Status();
}

}  // namespace host
}  // namespace kvsift
