#pragma once
// The merge kernel of decode attention: when some head has more than one split, the split kernel's
// blocks store normalised partial outputs and their base-2 log-sum-exp (finish_split), and this
// kernel, launched right behind it as a programmatic dependent (core/dependent_launch.cuh), combines
// them into the final rows. It replaces a merge by each head's last block to finish, which needed an
// atomic ticket per head (zeroed by a memset before every call), a fence per block, and left one
// block of 128 threads to read all of a head's partials alone.
//
// Work: the merged heads (plan.merged_heads: the heads of each role that has more than one split),
// each cut into plan.merge_blocks_per_head blocks of output float4s; each float4 is owned by
// plan.merge_parts threads, each of which reads at most kDecodeMergeBatch splits' partials with all
// its loads in flight, so the merge is one L2 round trip plus a combine in shared memory. Empty
// splits carry LSE -inf and zeros, so a zero weight never meets a NaN.

#include "kvsift/core/dependent_launch.cuh"
#include "kvsift/ops/detail/decode_attention_common.cuh"

namespace kvsift {
namespace detail {

__device__ __forceinline__ MergedState combine(const MergedState& a, const MergedState& q) {
  const float m = fmaxf(a.m, q.m);
  if (m == -INFINITY) return a;  // neither has attended anything
  const float fa = a.m == -INFINITY ? 0.f : exp2f(a.m - m), fq = q.m == -INFINITY ? 0.f : exp2f(q.m - m);
  MergedState r;
  r.m = m;
  r.l = a.l * fa + q.l * fq;
  r.o = make_float4(a.o.x * fa + q.o.x * fq, a.o.y * fa + q.o.y * fq, a.o.z * fa + q.o.z * fq, a.o.w * fa + q.o.w * fq);
  return r;
}

template <int D, int R, class View, class QT>
__global__ void __launch_bounds__(kDecodeMergeThreads) decode_merge_kernel(const __grid_constant__ DecodeLaunch<View, QT> a) {
  constexpr int kVec = D / 4;  // float4 columns per row
  const DecodePlan& pl = a.plan;
  const int b = blockIdx.z, tile = blockIdx.y;
  const int slot = blockIdx.x / pl.merge_blocks_per_head;
  const int slice = blockIdx.x - slot * pl.merge_blocks_per_head;
  // The merged heads are the retrieval heads (when they split), then the sparse ones (when they split),
  // in the order of the split kernel's grid.x.
  const int merged_retrieval = pl.retrieval_splits > 1 ? pl.num_retrieval : 0;
  int h, splits, first;  // the head, its splits, and its first split's blockIdx.x in the split kernel
  if (slot < merged_retrieval) {
    h = pl.head_at[slot];
    splits = pl.retrieval_splits;
    first = slot * pl.retrieval_splits;
  } else {
    const int rank = slot - merged_retrieval;
    h = pl.head_at[pl.num_retrieval + rank];
    splits = pl.sparse_splits;
    first = pl.num_retrieval * pl.retrieval_splits + rank * pl.sparse_splits;
  }
  const int per_block = kDecodeMergeThreads / pl.merge_parts;  // float4 items of this block
  const int item = slice * per_block + int(threadIdx.x) % per_block;
  const int part = int(threadIdx.x) / per_block;
  const int r = item / kVec, c4 = item % kVec;
  const int q_rows = a.p.q_len * pl.group;
  const int out_rows = min(R, q_rows - tile * R);  // the score row, if in this tile, has no output
  const bool live = r < out_rows;
  const std::size_t p0 = (std::size_t(b) * pl.row_tiles + tile) * pl.ctas_per_tile + first;

  wait_for_primary_grid();  // the split kernel's partials are complete and visible from here on

  MergedState acc{-INFINITY, 0.f, make_float4(0.f, 0.f, 0.f, 0.f)};
  if (live) {
    float lv[kDecodeMergeBatch];
    float4 po[kDecodeMergeBatch];
#pragma unroll
    for (int u = 0; u < kDecodeMergeBatch; ++u) {
      const int sp = part + u * pl.merge_parts;
      lv[u] = -INFINITY;
      po[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (sp < splits) {
        lv[u] = __ldcg(a.partial_lse + (p0 + sp) * R + r);
        po[u] = __ldcg(reinterpret_cast<const float4*>(a.partial_out + ((p0 + sp) * R + r) * D) + c4);
      }
    }
    acc = merge_splits(lv, po);
  }
  // The parts of an item meet in shared memory; part 0 finishes it.
  __shared__ MergedState red[kDecodeMergeThreads];
  red[threadIdx.x] = acc;
  __syncthreads();
  allow_dependent_grids();  // what follows on the stream may be scheduled (it waits for this grid)
  if (part != 0 || !live) return;
  for (int q = 1; q < pl.merge_parts; ++q) acc = combine(acc, red[q * per_block + threadIdx.x]);
  store_merged(a, b, h, tile * R + r, c4, acc);
}

}  // namespace detail
}  // namespace kvsift
