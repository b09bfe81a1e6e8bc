#pragma once
// A block's row in registers, one segment at a time: thread t holds elements base + t + k * blockDim.x
// (k < kRowSlots) of a segment of kRowSlots * blockDim.x elements.
//
// Why: the decoder's row kernels (the norms, the embedding, the norm in the GEMV's prologue) looped
// `for (i = t; i < dim; i += blockDim.x) { v = x[i] ...; y[i] = f(v); }`. A load after a store that
// may alias it cannot move above that store, and the store waits for its own load, so the SASS ran
// LDG, STG, LDG, STG, ...: 16 memory round trips in series for a 4096-wide row at 256 threads (two
// such loops per norm, two fused norms and two norm kernels a layer). Loading a whole segment first
// puts its loads in flight together: one round trip for a row of up to kRowSlots * blockDim.x
// elements. A thread's elements keep their order (k ascending, segments ascending), so per-thread
// partial sums over them are added in the order of the old loops and give the same bits.

namespace minimal_decoder {
namespace kernels {

constexpr int kRowSlots = 16;  // 4096 columns at 256 threads in one segment

// Elements of a segment in this block's order (the segment starting at element `base`).
__device__ inline int row_segment_index(int base, int k) { return base + int(threadIdx.x) + k * int(blockDim.x); }
__device__ inline int row_segment_size() { return kRowSlots * int(blockDim.x); }

// v[k] = load(i) for this thread's elements i < dim of the segment at `base`, 0 past dim; every load is
// issued before any use.
template <class Load>
__device__ inline void load_row_segment(Load load, int dim, int base, float (&v)[kRowSlots]) {
#pragma unroll
  for (int k = 0; k < kRowSlots; ++k) {
    const int i = row_segment_index(base, k);
    v[k] = i < dim ? load(i) : 0.f;
  }
}

// store(i, v[k]) for this thread's elements i < dim of the segment at `base`.
template <class Store>
__device__ inline void store_row_segment(Store store, int dim, int base, const float (&v)[kRowSlots]) {
#pragma unroll
  for (int k = 0; k < kRowSlots; ++k) {
    const int i = row_segment_index(base, k);
    if (i < dim) store(i, v[k]);
  }
}

}  // namespace kernels
}  // namespace minimal_decoder
