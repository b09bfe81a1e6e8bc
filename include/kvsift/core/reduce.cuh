#pragma once
/// \file
/// \brief Warp and block reductions for kernels. Warp level uses shuffles (the fastest form when a warp
/// owns a row); block level wraps cub::BlockReduce so the shared-memory layout is CUB's.

#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>


namespace kvsift {

/// Addition as a reduction operator (device code).
struct SumOp {
  /// a + b.
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
/// Maximum as a reduction operator (device code): `a > b ? a : b`, so a NaN `b` is returned.
struct MaxOp {
  /// The larger of a and b.
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a > b ? a : b; }
};

/// Butterfly reduction over `Width` consecutive lanes (a power of two <= 32); every lane gets the result.
template <int Width = 32, class T, class Op>
__device__ __forceinline__ T warp_allreduce(T v, Op op) {
  static_assert(Width > 0 && Width <= 32 && (Width & (Width - 1)) == 0, "Width must be a power of two <= 32");
#pragma unroll
  for (int offset = Width / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset, Width));
  return v;
}
/// warp_allreduce with SumOp: the sum over `Width` lanes, in every lane.
template <int Width = 32, class T>
__device__ __forceinline__ T warp_sum(T v) { return warp_allreduce<Width>(v, SumOp{}); }
/// warp_allreduce with MaxOp: the maximum over `Width` lanes, in every lane.
template <int Width = 32, class T>
__device__ __forceinline__ T warp_max(T v) { return warp_allreduce<Width>(v, MaxOp{}); }

/// Block-wide reduction whose result every thread receives. `Threads` is the block size.
/// Temp storage lives in shared memory declared by the caller:
///   __shared__ typename BlockAllReduce<float, 256>::TempStorage tmp;
template <class T, int Threads>
struct BlockAllReduce {
  using Reduce = cub::BlockReduce<T, Threads>;  ///< the CUB reduction underneath
  /// Shared memory for one reduction: CUB's storage plus the broadcast slot. Reusable right after run.
  struct TempStorage {
    typename Reduce::TempStorage reduce;  ///< CUB's part
    T result;                             ///< thread 0's result, broadcast to the block
  };

  /// Reduces `v` over the block with `op`; every thread must call it, and every thread gets the result.
  /// Synchronises the block twice.
  template <class Op>
  __device__ __forceinline__ static T run(TempStorage& tmp, T v, Op op) {
    const T r = Reduce(tmp.reduce).Reduce(v, op);
    if (threadIdx.x == 0) tmp.result = r;
    __syncthreads();
    const T out = tmp.result;
    __syncthreads();  // tmp may be reused right after
    return out;
  }
  /// run with SumOp.
  __device__ __forceinline__ static T sum(TempStorage& tmp, T v) { return run(tmp, v, SumOp{}); }
  /// run with MaxOp.
  __device__ __forceinline__ static T max(TempStorage& tmp, T v) { return run(tmp, v, MaxOp{}); }
};

}  // namespace kvsift
