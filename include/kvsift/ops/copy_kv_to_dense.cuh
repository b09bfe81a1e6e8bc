#pragma once
// CUDA backend of copy_kv_to_dense (see copy_kv_to_dense.hpp for the contract).

#include <cstdint>

#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/cuda_status.cuh"
#include "kvsift/ops/copy_kv_to_dense.hpp"

namespace kvsift {
namespace detail {

// One warp per (token, head, batch) row; lanes stride over head_dim. The grid covers max_tokens, not
// the live length, so the launch shape does not depend on device data.
template <class View, class Out>
__global__ void copy_kv_to_dense_kernel(View kv, int max_tokens, Out* k_out, Out* v_out) {
  const int warps_per_block = blockDim.x / 32;
  const int t = blockIdx.x * warps_per_block + threadIdx.x / 32;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int lane = threadIdx.x % 32;
  const int len = kv.length(b) < max_tokens ? kv.length(b) : max_tokens;
  if (t >= len) return;
  const std::int64_t out = ((std::int64_t(b) * kv.num_kv_heads + h) * max_tokens + t) * kv.head_dim;
  const auto* k = kv.k_row(b, h, t);
  const auto* v = kv.v_row(b, h, t);
  for (int i = lane; i < kv.head_dim; i += 32) {
    k_out[out + i] = k[i];
    v_out[out + i] = v[i];
  }
}

}  // namespace detail

namespace cuda {

template <class View>
Status copy_kv_to_dense(Exec exec, const View& kv, int max_tokens,
                        std::remove_const_t<typename View::value_type>* k_out,
                        std::remove_const_t<typename View::value_type>* v_out) {
  static_assert(check_kv_view<View>());
  KVSIFT_TRY(detail::validate_copy_kv_to_dense(kv, max_tokens, k_out, v_out));
  if (kv.batch == 0 || max_tokens == 0) return Status();
  KVSIFT_REQUIRE(kv.batch <= 65535 && kv.num_kv_heads <= 65535, kUnsupported, "kv.batch = ", kv.batch,
                 " and kv.num_kv_heads = ", kv.num_kv_heads, " must each be <= 65535 for this launch");
  constexpr int kThreads = 256;
  constexpr int kRowsPerBlock = kThreads / 32;
  const dim3 grid((max_tokens + kRowsPerBlock - 1) / kRowsPerBlock, kv.num_kv_heads, kv.batch);
  detail::copy_kv_to_dense_kernel<<<grid, kThreads, 0, exec.stream>>>(kv, max_tokens, k_out, v_out);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
