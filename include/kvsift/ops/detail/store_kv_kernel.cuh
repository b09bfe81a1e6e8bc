#pragma once
// The kernel behind cuda::store_kv (contract in store_kv.hpp).

#include <cstdint>
#include <type_traits>

#include "kvsift/core/data_error.cuh"
#include "kvsift/core/dependent_launch.cuh"
#include "kvsift/core/reduce.cuh"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/ops/store_kv.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kStoreKvThreads = 128;
inline constexpr int kStoreKvWarpsPerBlock = kStoreKvThreads / 32;

// What the kernel needs besides the view (within 128 bytes: detail/window_scores_common.cuh says why).
template <class T>
struct StoreKvLaunch {
  StoreKvParams<T> p;
  int capacity;  // kv_capacity(view): -1 when the view does not say
  DataError* data_error;  // cuda::Exec::data_error, or null
};
static_assert(sizeof(StoreKvLaunch<float>) <= 128, "kernel parameter structs stay within 128 bytes");

// One warp per (row i, KV head h), K then V. Lanes stride over head_dim; the per-token amax is a warp
// max of per-lane maxima, which is order-independent, so the scale equals the host's bit for bit.
template <class View, class T>
__global__ void store_kv_kernel(View kv, StoreKvLaunch<T> launch) {
  using KT = std::remove_const_t<typename View::value_type>;
  const StoreKvParams<T>& p = launch.p;
  wait_for_primary_grid();  // Exec::dependent_launch: the rows to store are the previous kernel's output
  const std::int64_t pair = std::int64_t(blockIdx.x) * kStoreKvWarpsPerBlock + threadIdx.x / 32;
  if (pair >= std::int64_t(p.n) * kv.num_kv_heads) return;  // whole warps leave together
  const int i = int(pair / kv.num_kv_heads), h = int(pair % kv.num_kv_heads);
  const int lane = threadIdx.x % 32;
  const int b = p.seq[i], t = p.pos[i];
  if (!store_row_in_range(b, t, kv.batch, launch.capacity)) return;
  // A page outside the pool: nothing is written (a write there would land in someone else's memory).
  if (!kv_row_in_pool(kv, b, t)) {
    if (lane == 0 && h == 0)
      record_data_error(launch.data_error, DataErrorOp::kStoreKv, DataErrorKind::kPageOutOfPool, b, h, t, kv_page_of(kv, b, t));
    return;  // whole warps leave together
  }
  const int d = kv.head_dim;
  for (int kvi = 0; kvi < 2; ++kvi) {
    const T* src = (kvi == 0 ? p.k : p.v) + i * p.row_stride + h * p.head_stride;
    KT* dst = kvi == 0 ? kv.k_row(b, h, t) : kv.v_row(b, h, t);
    float scale = 1.f;
    if constexpr (is_fp8_dtype<KT>::value) {
      float* scales = kvi == 0 ? kv.scales.k : kv.scales.v;
      const std::int64_t at = kv.scale_offset(b, h, t);
      if (kv.scales.granularity == ScaleGranularity::kPerToken) {
        float amax = 0.f;
        for (int e = lane; e < d; e += 32) amax = fold_amax(amax, to_float(src[e]));
        scale = per_token_scale<KT>(warp_max(amax));
        if (lane == 0) scales[at] = scale;
      } else {
        scale = scales[at];
      }
    }
    for (int e = lane; e < d; e += 32) dst[e] = quantize_element<KT>(to_float(src[e]), scale);
  }
}

}  // namespace detail
}  // namespace kvsift
