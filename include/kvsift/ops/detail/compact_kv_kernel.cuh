#pragma once
// The kernel behind cuda::compact_kv (contract in compact_kv.hpp): one warp per destination slot
// copies the K and V rows (both rows' loads in flight before their stores: core/warp_rows.cuh); slots
// are independent, so the grid covers the capacity, not the live lengths.

#include <type_traits>

#include "kvsift/core/dependent_launch.cuh"
#include "kvsift/core/data_error.cuh"
#include "kvsift/core/warp_rows.cuh"
#include "kvsift/kv/index_set.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/ops/compact_kv.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kCompactThreads = 256;
inline constexpr int kCompactSlotsPerBlock = kCompactThreads / 32;

// What the kernel needs besides the two views, passed with them by value (each kernel parameter within
// 128 bytes: detail/window_scores_common.cuh says why).
struct CompactKvLaunch {
  ConstIndexSet kept;
  int window;
  CompactOutputs out;
  DataError* data_error;  // cuda::Exec::data_error, or null
};
static_assert(sizeof(CompactKvLaunch) <= 128, "kernel parameter structs stay within 128 bytes");

template <class Src, class Dst>
__global__ void compact_kv_kernel(Src src, Dst dst, CompactKvLaunch launch) {
  dependent_kernel_start();  // Exec::dependent_launch
  const ConstIndexSet& kept = launch.kept;
  const CompactOutputs& out = launch.out;
  const int window = launch.window;
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  const int s = blockIdx.x * warps + threadIdx.x / 32;
  const int r = blockIdx.y, b = r / dst.num_kv_heads, h = r % dst.num_kv_heads;
  const int slots = kept.capacity + window;
  if (s >= slots) return;
  const int len = src.length(b);
  const int p = compact_source_position(kept, r, s, len, window);
  if (p < 0 && s < kept.count(r) && lane == 0)  // a kept entry outside the prefix: skipped, recorded
    record_data_error(launch.data_error, DataErrorOp::kCompactKv, DataErrorKind::kIndexOutOfRange, b, h, s, kept.row(r)[s]);
  if (lane == 0 && out.positions) out.positions[r * out.positions_stride + s] = p;
  if (lane == 0 && s == 0 && h == 0) out.new_lengths[b] = kept.count(r) + (window < len ? window : len);
  const int src_head = h / (dst.num_kv_heads / src.num_kv_heads);
  // A page outside a pool (only rows that get a token are checked): a destination row there is not
  // written; a source row there is copied as zeros. Either is recorded.
  const bool dst_ok = p < 0 || kv_row_in_pool(dst, b, s), src_ok = p < 0 || kv_row_in_pool(src, b, p);
  if ((!dst_ok || !src_ok) && lane == 0)
    record_data_error(launch.data_error, DataErrorOp::kCompactKv, DataErrorKind::kPageOutOfPool, b, h, dst_ok ? p : s,
                      dst_ok ? kv_page_of(src, b, p) : kv_page_of(dst, b, s));
  // fp8 views only (a no-op otherwise): a slot with a bad page on either side counts as unfilled, so no
  // per-token scale is read or written through that page (the destination's is left as it was);
  // per-head scales are copied as always.
  if (lane == 0) compact_copy_scales(src, dst, b, h, src_head, s, src_ok && dst_ok ? p : -1);
  if (!dst_ok || p < 0) return;
  if (!src_ok) {
    using DT = std::remove_const_t<typename Dst::value_type>;
    DT* kd = dst.k_row(b, h, s);
    DT* vd = dst.v_row(b, h, s);
    for (int e = lane; e < dst.head_dim; e += 32) {
      kd[e] = DT{};  // zero bits: +0 in every dtype
      vd[e] = DT{};
    }
    return;
  }
  warp_copy_row_pair(src.k_row(b, src_head, p), src.v_row(b, src_head, p), dst.k_row(b, h, s), dst.v_row(b, h, s),
                     src.head_dim, lane);
}

}  // namespace detail
}  // namespace kvsift
