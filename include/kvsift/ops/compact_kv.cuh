#pragma once
// CUDA backend of compact_kv (contract in compact_kv.hpp): one warp per destination slot copies the
// K and V rows; slots are independent, so the grid covers the capacity, not the live lengths.

#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/cuda_status.cuh"
#include "kvsift/ops/compact_kv.hpp"

namespace kvsift {
namespace detail {

template <class Src, class Dst>
__global__ void compact_kv_kernel(Src src, ConstIndexSet kept, int window, Dst dst, CompactOutputs out) {
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  const int s = blockIdx.x * warps + threadIdx.x / 32;
  const int r = blockIdx.y, b = r / dst.num_kv_heads, h = r % dst.num_kv_heads;
  const int slots = kept.capacity + window;
  if (s >= slots) return;
  const int len = src.length(b);
  const int p = compact_source_position(kept, r, s, len, window);
  if (lane == 0 && out.positions) out.positions[r * out.positions_stride + s] = p;
  if (lane == 0 && s == 0 && h == 0) out.new_lengths[b] = kept.count(r) + (window < len ? window : len);
  if (p < 0) return;
  const int src_head = h / (dst.num_kv_heads / src.num_kv_heads);
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

namespace cuda {

template <class Src, class Dst>
Status compact_kv(Exec exec, const Src& src, ConstIndexSet kept, int window, const Dst& dst, CompactOutputs out) {
  static_assert(check_kv_view<Src>());
  static_assert(check_kv_view<Dst>());
  KVSIFT_TRY(detail::validate_compact_kv(src, kept, window, dst, out));
  const int rows = dst.batch * dst.num_kv_heads, slots = kept.capacity + window;
  if (rows == 0 || slots == 0) return Status();
  KVSIFT_REQUIRE(rows <= 65535, kUnsupported, "dst.batch * dst.num_kv_heads = ", rows, " must be <= 65535");
  constexpr int kThreads = 256, kSlotsPerBlock = kThreads / 32;
  const dim3 grid((slots + kSlotsPerBlock - 1) / kSlotsPerBlock, rows);
  detail::compact_kv_kernel<<<grid, kThreads, 0, exec.stream>>>(src, kept, window, dst, out);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
