#pragma once
// The kernel behind cuda::compact_kv (contract in compact_kv.hpp): one warp per destination slot
// copies the K and V rows; slots are independent, so the grid covers the capacity, not the live
// lengths.

#include "kvsift/kv/index_set.hpp"
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
};
static_assert(sizeof(CompactKvLaunch) <= 128, "kernel parameter structs stay within 128 bytes");

template <class Src, class Dst>
__global__ void compact_kv_kernel(Src src, Dst dst, CompactKvLaunch launch) {
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
  if (lane == 0 && out.positions) out.positions[r * out.positions_stride + s] = p;
  if (lane == 0 && s == 0 && h == 0) out.new_lengths[b] = kept.count(r) + (window < len ? window : len);
  const int src_head = h / (dst.num_kv_heads / src.num_kv_heads);
  if (lane == 0) compact_copy_scales(src, dst, b, h, src_head, s, p);  // fp8 views only; a no-op otherwise
  if (p < 0) return;
  const auto* ks = src.k_row(b, src_head, p);
  const auto* vs = src.v_row(b, src_head, p);
  auto* kd = dst.k_row(b, h, s);
  auto* vd = dst.v_row(b, h, s);
  for (int e = lane; e < src.head_dim; e += 32) {
    kd[e] = ks[e];
    vd[e] = vs[e];
  }
}

}  // namespace detail
}  // namespace kvsift
