#pragma once
/// \file
/// \brief Row copies by one warp with every load of a row segment in flight before the first store.
///
/// Why: a copy loop `for (e = lane; e < n; e += 32) dst[e] = f(src[e])` keeps each iteration's load
/// behind the previous iteration's store, because the compiler cannot rule out that dst aliases src:
/// one memory round trip per 32 elements, one after another. The SASS of store_kv, compact_kv and
/// copy_kv_to_dense read LDG, STG, LDG, STG, ...: eight round trips for a 128-element K and V row
/// (compact_kv measured 9 µs for ClusterAttn's 4 MB at B=1, 128K). Here a warp first loads a segment
/// of up to kWarpRowElems elements of each of its rows into registers, then stores them.

#include <type_traits>

namespace kvsift {
namespace detail {

inline constexpr int kWarpRowSlots = 8;                   ///< elements a lane holds per segment
inline constexpr int kWarpRowElems = 32 * kWarpRowSlots;  ///< 256: a head_dim 256 row in one segment

/// One segment of a row in a warp's registers: element base + lane + 32 j in slot j of lane `lane`.
template <class T>
struct WarpRowSegment {
  std::remove_const_t<T> x[kWarpRowSlots];

  /// Elements [base, min(base + kWarpRowElems, n)) of src; the slots past n are left as they are.
  __device__ __forceinline__ void load(const T* src, int base, int n, int lane) {
#pragma unroll
    for (int j = 0; j < kWarpRowSlots; ++j) {
      const int e = base + lane + 32 * j;
      if (e < n) x[j] = src[e];
    }
  }
  /// dst[e] = f(element e) for the elements load() read.
  template <class D, class F>
  __device__ __forceinline__ void store(D* dst, int base, int n, int lane, F f) const {
#pragma unroll
    for (int j = 0; j < kWarpRowSlots; ++j) {
      const int e = base + lane + 32 * j;
      if (e < n) dst[e] = f(x[j]);
    }
  }
};

/// kd[e] = ks[e] and vd[e] = vs[e] for e < n (converted by the destinations' assignment), by one warp:
/// per segment both rows' loads, then both rows' stores (one round trip per kWarpRowElems elements).
template <class S, class D>
__device__ __forceinline__ void warp_copy_row_pair(const S* ks, const S* vs, D* kd, D* vd, int n, int lane) {
  const auto same = [](std::remove_const_t<S> x) { return x; };
  for (int base = 0; base < n; base += kWarpRowElems) {
    WarpRowSegment<S> k, v;
    k.load(ks, base, n, lane);
    v.load(vs, base, n, lane);
    k.store(kd, base, n, lane, same);
    v.store(vd, base, n, lane, same);
  }
}

}  // namespace detail
}  // namespace kvsift
