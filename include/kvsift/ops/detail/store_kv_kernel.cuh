#pragma once
// The kernel behind cuda::store_kv (contract in store_kv.hpp).

#include <cstdint>
#include <type_traits>

#include "kvsift/core/data_error.cuh"
#include "kvsift/core/dependent_launch.cuh"
#include "kvsift/core/reduce.cuh"
#include "kvsift/core/warp_rows.cuh"
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

// RoPE on a head in a warp's registers (StoreKvRotary; the head in one segment: slot j of a lane
// holds dim lane + 32 j). Dim e < r pairs with p = e + r/2 below r/2 and with p = e - r/2 above it,
// which sits in slot p / 32 of lane p % 32. A shuffle moves one slot index for the whole warp, so every
// slot is shuffled from the partner's lane and each lane keeps the one its partner sits in (for r a
// multiple of 64 the partner is in the lane itself). Each lane then turns its own dims with the angle
// of pair e mod r/2, by rotate_pair's arithmetic: the two lanes of a pair form the products the host's
// one rotate_pair call forms, each rounded alone.
//
// The angles come first, each once a warp: pair f < r/2 is computed by lane f % 32 (its pair slot
// f / 32), all of a lane's inverse frequencies loaded before its first sincos, and each dim takes its
// pair's cosine and sine from the lane that holds them (its own lane when r/2 is a multiple of 32).
// Computed per dim inside the dim's branch, each dim had put one inverse-frequency load and one
// double-precision sincos in series with the next (four of each a lane at r = 128, two of them
// repeats), on the path from the q/k/v projection to the attention.
__device__ __forceinline__ void rotate_row_segment(WarpRowSegment<float>& x, const float* inv_freq, std::int32_t position,
                                                   int rotary_dim, int lane) {
  const int half = rotary_dim / 2;
  constexpr int kPairSlots = kWarpRowSlots / 2;  // half <= kWarpRowElems / 2 pairs
  float freq[kPairSlots];
#pragma unroll
  for (int m = 0; m < kPairSlots; ++m) freq[m] = lane + 32 * m < half ? inv_freq[lane + 32 * m] : 0.f;
  float cos_of[kPairSlots], sin_of[kPairSlots];
#pragma unroll
  for (int m = 0; m < kPairSlots; ++m) {
    cos_of[m] = 1.f;
    sin_of[m] = 0.f;
    if (32 * m < half) rotary_cos_sin(position, freq[m], &cos_of[m], &sin_of[m]);  // the same for the whole warp
  }
  float partner[kWarpRowSlots];
#pragma unroll
  for (int j = 0; j < kWarpRowSlots; ++j) {
    const int e = lane + 32 * j;
    const int p = e < half ? e + half : e - half;  // meaningful for e < rotary_dim only
    float v = 0.f;
#pragma unroll
    for (int slot = 0; slot < kWarpRowSlots; ++slot) {
      const float t = __shfl_sync(0xffffffffu, x.x[slot], p & 31);
      if (slot == p >> 5) v = t;
    }
    partner[j] = v;
  }
  const bool own_lane = half % 32 == 0;  // the same for the whole warp
#pragma unroll
  for (int j = 0; j < kWarpRowSlots; ++j) {
    const int e = lane + 32 * j;
    const int f = e < half ? e : e - half;  // the pair of dim e (meaningful for e < rotary_dim only)
    float c = 1.f, s = 0.f;
#pragma unroll
    for (int m = 0; m < kPairSlots; ++m) {
      if (32 * m >= half) break;
      const float tc = own_lane ? cos_of[m] : __shfl_sync(0xffffffffu, cos_of[m], f & 31);
      const float ts = own_lane ? sin_of[m] : __shfl_sync(0xffffffffu, sin_of[m], f & 31);
      if (m == f >> 5) {
        c = tc;
        s = ts;
      }
    }
    if (e < rotary_dim) {
      const bool low = e < half;
      const float own = __fmul_rn(x.x[j], c), other = __fmul_rn(partner[j], s);
      x.x[j] = low ? __fsub_rn(own, other) : __fadd_rn(own, other);
    }
  }
}

// Elements [0, d) of a row (d <= kWarpRowElems) as floats in a warp's registers, 0 past d (the
// rotation's shuffles read every slot).
template <class T>
__device__ __forceinline__ WarpRowSegment<float> widen_row(const WarpRowSegment<T>& seg, int d, int lane) {
  WarpRowSegment<float> x;
#pragma unroll
  for (int j = 0; j < kWarpRowSlots; ++j) x.x[j] = lane + 32 * j < d ? to_float(seg.x[j]) : 0.f;
  return x;
}

// A Q head rotated in place (StoreKvRotary::q): one warp, the row loaded whole before it is written.
template <class T>
__device__ void rotate_q_head(const StoreKvRotary<T>& r, int i, int h, int d, int lane) {
  T* row = r.q + i * r.q_row_stride + std::int64_t(h) * d;
  WarpRowSegment<T> seg;
  seg.load(row, 0, d, lane);
  WarpRowSegment<float> x = widen_row(seg, d, lane);
  rotate_row_segment(x, r.inv_freq, r.position[i], r.rotary_dim, lane);
  x.store(row, 0, r.rotary_dim, lane, [](float v) { return from_float<std::remove_const_t<T>>(v); });
}

// One warp per (row i, KV head h), then (with rotary Q) one per (row i, Q head). The first
// kWarpRowElems elements of the K and V rows are loaded into registers before anything else
// (core/warp_rows.cuh): their loads overlap the seq/pos and block-table lookups, and no store sits in
// front of them. The per-token amax is a warp max of per-lane maxima, which is order-independent, so
// the scale equals the host's bit for bit (for a rotated K row: the host's amax of its own rotation).
template <class View, class T>
__global__ void store_kv_kernel(View kv, StoreKvLaunch<T> launch) {
  using KT = std::remove_const_t<typename View::value_type>;
  const StoreKvParams<T>& p = launch.p;
  wait_for_primary_grid();  // Exec::dependent_launch: the rows to store are the previous kernel's output
  const std::int64_t pair = std::int64_t(blockIdx.x) * kStoreKvWarpsPerBlock + threadIdx.x / 32;
  const std::int64_t kv_pairs = std::int64_t(p.n) * kv.num_kv_heads;
  const bool rotate = p.rotary.inv_freq != nullptr;
  const int lane = threadIdx.x % 32;
  const int d = kv.head_dim;
  if (pair >= kv_pairs) {  // whole warps leave together
    if (rotate && p.rotary.q && pair < kv_pairs + std::int64_t(p.n) * p.rotary.num_q_heads) {
      const std::int64_t qp = pair - kv_pairs;
      rotate_q_head(p.rotary, int(qp / p.rotary.num_q_heads), int(qp % p.rotary.num_q_heads), d, lane);
    }
    return;
  }
  const int i = int(pair / kv.num_kv_heads), h = int(pair % kv.num_kv_heads);
  const T* src[2] = {p.k + i * p.row_stride + h * p.head_stride, p.v + i * p.row_stride + h * p.head_stride};
  WarpRowSegment<T> seg[2];
  seg[0].load(src[0], 0, d, lane);
  seg[1].load(src[1], 0, d, lane);
  // Loaded before the rotation, whose sincos calls the compiler does not move loads across: after
  // it, they were one more L2 round trip in series.
  const int b = p.seq[i], t = p.pos[i];
  // The K row as float, rotated (rotate only; the row is one segment, cuda::store_kv checks).
  WarpRowSegment<float> kr;
  if (rotate) {
    kr = widen_row(seg[0], d, lane);
    rotate_row_segment(kr, p.rotary.inv_freq, p.rotary.position[i], p.rotary.rotary_dim, lane);
  }
  if (!store_row_in_range(b, t, kv.batch, launch.capacity)) return;
  // A page outside the pool: nothing is written (a write there would land in someone else's memory).
  if (!kv_row_in_pool(kv, b, t)) {
    if (lane == 0 && h == 0)
      record_data_error(launch.data_error, DataErrorOp::kStoreKv, DataErrorKind::kPageOutOfPool, b, h, t, kv_page_of(kv, b, t));
    return;  // whole warps leave together
  }
  KT* const dst[2] = {kv.k_row(b, h, t), kv.v_row(b, h, t)};
  float scale[2] = {1.f, 1.f};
  [[maybe_unused]] bool per_token = false;
  [[maybe_unused]] std::int64_t scale_at = 0;
  if constexpr (is_fp8_dtype<KT>::value) {
    float* const scales[2] = {kv.scales.k, kv.scales.v};
    scale_at = kv.scale_offset(b, h, t);
    per_token = kv.scales.granularity == ScaleGranularity::kPerToken;
#pragma unroll
    for (int kvi = 0; kvi < 2; ++kvi) {
      if (per_token) {
        float amax = 0.f;
        if (d <= kWarpRowElems) {  // the row is in the registers
#pragma unroll
          for (int j = 0; j < kWarpRowSlots; ++j)
            if (lane + 32 * j < d) amax = fold_amax(amax, rotate && kvi == 0 ? kr.x[j] : to_float(seg[kvi].x[j]));
        } else {
          for (int e = lane; e < d; e += 32) amax = fold_amax(amax, to_float(src[kvi][e]));
        }
        scale[kvi] = per_token_scale<KT>(warp_max(amax));
      } else {
        scale[kvi] = scales[kvi][scale_at];
      }
    }
  }
  for (int base = 0; base < d; base += kWarpRowElems) {
    if (base > 0) {  // rows longer than one segment (head_dim > kWarpRowElems)
      seg[0].load(src[0], base, d, lane);
      seg[1].load(src[1], base, d, lane);
    }
#pragma unroll
    for (int kvi = 0; kvi < 2; ++kvi) {
      const float s = scale[kvi];
      if (rotate && kvi == 0) kr.store(dst[0], base, d, lane, [s](float x) { return quantize_element<KT>(x, s); });
      else seg[kvi].store(dst[kvi], base, d, lane, [s](T x) { return quantize_element<KT>(to_float(x), s); });
    }
  }
  if constexpr (is_fp8_dtype<KT>::value)
    if (per_token && lane == 0) {
      kv.scales.k[scale_at] = scale[0];
      kv.scales.v[scale_at] = scale[1];
    }
}

}  // namespace detail
}  // namespace kvsift
