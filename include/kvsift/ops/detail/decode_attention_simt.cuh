#pragma once
// CUDA-core split kernel, used for float K/V (the tensor-core kernel needs 16-bit operands).
// It keeps full fp32 precision: each warp takes one token at a time, every lane owns head_dim / 32
// dimensions, and the dot products are warp reductions. Same work decomposition, workspace and
// epilogue as the tensor-core kernel; rows come in tiles of 8.

#include "kvsift/ops/detail/decode_attention_common.cuh"

namespace kvsift {
namespace detail {

template <int D, class View, class QT>
__global__ void __launch_bounds__(kDecodeThreads) decode_split_simt_kernel(const __grid_constant__ DecodeLaunch<View, QT> a) {
  using T = std::remove_const_t<typename View::value_type>;
  constexpr int R = 8;
  constexpr int kPer = D / 32;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<SplitSmem<D, R>*>(smem_raw);

  dependent_kernel_start();  // Exec::dependent_launch: q and the new K/V rows are earlier kernels' output; the merge waits
  const DecodeWork w = locate_work(a);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const KvRows<View> rows(a.kv, w.b, w.h);

  const int q_rows = a.p.q_len * a.plan.group;
  const bool score_tile = a.p.scores != nullptr && !w.sparse && q_rows / R == w.tile;
  const int score_row = q_rows - w.tile * R;
  const bool block_scores = a.p.score_block_size > 1;
  unsigned* scratch = block_max_scratch(sm);
  if (score_tile && block_scores)
    for (int i = threadIdx.x; i < a.plan.chunk / a.p.score_block_size; i += blockDim.x) scratch[i] = ordered_key(-INFINITY);
  __shared__ int s_listed;  // score candidates: the split's list (see the tensor-core kernel)
  const CandidateSegment cand = candidate_segment(a, w, score_tile);
  if (threadIdx.x == 0) s_listed = 0;
  __syncthreads();

  float q[R][kPer], o[R][kPer], m[R], l[R];
  int limit[R];
  bool live[R];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int r = w.tile * R + rr;
    live[rr] = r < a.plan.rows;
    limit[rr] = w.len - 1;
    m[rr] = -INFINITY;
    l[rr] = 0.f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) q[rr][i] = o[rr][i] = 0.f;
    if (r < q_rows) {
      const int qpos = r / a.plan.group;
      const QT* qp = a.p.io.q.row(w.b, qpos, w.h * a.plan.group + r % a.plan.group);
#pragma unroll
      for (int i = 0; i < kPer; ++i) q[rr][i] = to_float(qp[lane * kPer + i]);
      limit[rr] = w.len - a.p.q_len + qpos;
    } else if (r == q_rows && a.p.scores != nullptr) {
      for (int gg = 0; gg < a.plan.group; ++gg) {
        const QT* qp = a.p.io.q.row(w.b, a.p.q_len - 1, w.h * a.plan.group + gg);
#pragma unroll
        for (int i = 0; i < kPer; ++i) q[rr][i] += to_float(qp[lane * kPer + i]);
      }
#pragma unroll
      for (int i = 0; i < kPer; ++i) q[rr][i] /= a.plan.group;
    }
  }

  for (int pos = warp; pos < w.positions; pos += kDecodeWarps) {
    const int t = w.token(pos);
    if (t < 0) {  // uniform across the warp; an entry out of range is recorded
      if (t <= -2 && lane == 0) record_bad_entry(a, w, -2 - t);
      continue;
    }
    const auto hd = rows.handle(t);
    if (!rows.valid(hd)) {  // its page is outside the pool: skipped (score -inf), recorded
      if (lane == 0) {
        record_bad_page(a, w, t, rows.bad_value(t));
        if (score_tile && !block_scores)
          a.p.scores[(std::int64_t(w.b) * a.kv.num_kv_heads + w.h) * a.p.score_row_stride + t] = -INFINITY;
      }
      continue;
    }
    const T* kp = rows.k_at(hd) + lane * kPer;
    const T* vp = rows.v_at(hd) + lane * kPer;
    float k[kPer], v[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      k[i] = to_float(kp[i]);
      v[i] = to_float(vp[i]);
    }
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      if (!live[rr]) continue;
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) dot = fmaf(q[rr][i], k[i], dot);
      dot = warp_sum(dot);
      if (score_tile && rr == score_row && lane == 0) {
        if (block_scores)
          atomicMax(scratch + pos / a.p.score_block_size, ordered_key(dot));
        else {
          a.p.scores[(std::int64_t(w.b) * a.kv.num_kv_heads + w.h) * a.p.score_row_stride + t] = dot;
          cand.add(&s_listed, t, dot);
        }
      }
      if (t > limit[rr]) continue;
      const float x = dot * a.plan.scale_log2;
      const float m_new = fmaxf(m[rr], x);
      const float alpha = exp2f(m[rr] - m_new);
      const float p = exp2f(x - m_new);
      l[rr] = l[rr] * alpha + p;
      m[rr] = m_new;
#pragma unroll
      for (int i = 0; i < kPer; ++i) o[rr][i] = fmaf(o[rr][i], alpha, p * v[i]);
    }
  }

#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    if (lane == 0) {
      sm.m[warp][rr] = m[rr];
      sm.l[warp][rr] = l[rr];
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) sm.o[warp][rr][lane * kPer + i] = o[rr][i];
  }
  finish_split(a, w, sm);
  if (score_tile) finish_scores(a, w, scratch, s_listed);
}

}  // namespace detail
}  // namespace kvsift
