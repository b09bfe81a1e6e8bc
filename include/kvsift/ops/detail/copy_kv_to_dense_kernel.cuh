#pragma once
// The kernel behind cuda::copy_kv_to_dense (contract in copy_kv_to_dense.hpp).

#include <cstdint>

#include "kvsift/core/data_error.cuh"
#include "kvsift/core/warp_rows.cuh"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/ops/copy_kv_to_dense.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kCopyDenseThreads = 256;
inline constexpr int kCopyDenseRowsPerBlock = kCopyDenseThreads / 32;

// What the kernel needs besides the view, passed with it by value (each kernel parameter within 128
// bytes: detail/window_scores_common.cuh says why).
template <class Out>
struct CopyKvToDenseLaunch {
  int max_tokens;
  Out* k_out;
  Out* v_out;
  DataError* data_error;  // cuda::Exec::data_error, or null
};
static_assert(sizeof(CopyKvToDenseLaunch<float>) <= 128, "kernel parameter structs stay within 128 bytes");

// One warp per (token, head, batch) row, its K and V loads in flight before their stores
// (core/warp_rows.cuh). The grid covers max_tokens, not the live length, so the launch shape does not
// depend on device data.
template <class View, class Out>
__global__ void copy_kv_to_dense_kernel(View kv, CopyKvToDenseLaunch<Out> launch) {
  const int max_tokens = launch.max_tokens;
  const int warps_per_block = blockDim.x / 32;
  const int t = blockIdx.x * warps_per_block + threadIdx.x / 32;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int lane = threadIdx.x % 32;
  const int len = kv.length(b) < max_tokens ? kv.length(b) : max_tokens;
  if (t >= len) return;
  const std::int64_t out = ((std::int64_t(b) * kv.num_kv_heads + h) * max_tokens + t) * kv.head_dim;
  if (!kv_row_in_pool(kv, b, t)) {  // a page outside the pool: the row comes out as zeros, recorded
    if (lane == 0 && h == 0)
      record_data_error(launch.data_error, DataErrorOp::kCopyKvToDense, DataErrorKind::kPageOutOfPool, b, h, t,
                        kv_page_of(kv, b, t));
    for (int i = lane; i < kv.head_dim; i += 32) {
      launch.k_out[out + i] = Out{};
      launch.v_out[out + i] = Out{};
    }
    return;
  }
  warp_copy_row_pair(kv.k_row(b, h, t), kv.v_row(b, h, t), launch.k_out + out, launch.v_out + out, kv.head_dim, lane);
}

}  // namespace detail
}  // namespace kvsift
