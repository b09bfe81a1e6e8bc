#pragma once
// Tensor-core split kernel for 16-bit K/V (fp16 or bf16).
//
// One block = one (batch, KV head, split, row tile); its 4 warps take 16-token steps in turn, so the
// block reads 64 consecutive positions at a time. A warp computes, with mma.m16n8k16:
//   S   = Q K^T       M = 16 query rows (R = 8 or 16 used), N = 8 tokens, K = head_dim
//   O^T = V^T P^T     M = 16 output dims, N = 8 query rows, K = 16 tokens
// so every K/V element is read once from HBM for all G query heads of the group (GQA), straight
// into registers with 16-byte loads, and the next step's loads are issued before this step's math.
//
// Why the operands need no shared memory: a dot product does not care in which order the head_dim
// terms are summed, and an output dimension can be written wherever it lives. So each thread loads
// whole 16-byte pieces of its K and V rows and we *define* the k-index (QK) and the m-index (PV) of
// the mma to be whatever those registers hold; Q is loaded with the same permutation, and the
// epilogue writes each output dimension to its true place. The S accumulator layout of QK equals the
// B-operand layout of P in the transposed PV, so P never leaves registers.
//
// Thread (g = lane / 4, j = lane % 4) of a warp, per 16-token step at positions pos .. pos + 15:
//   K: tokens pos + g and pos + 8 + g, 16-byte chunks j, j + 4, j + 8, ... of the row (D / 32 of them)
//   V: tokens pos + {2j, 2j+1, 8+2j, 9+2j}, chunks g, g + 8, ... (D / 64 of them)
//   S: rows g (and g + 8), tokens pos + {2j, 2j+1, 8+2j, 9+2j}: the same tokens as its V rows
//   O: query rows 2j, 2j + 1 (and + 8), dims 8 (g + 8 ci) + 2 w + {0, 1}

#include "kvsift/ops/detail/decode_attention_common.cuh"

namespace kvsift {
namespace detail {

template <class T>
inline constexpr bool is_bf16_v = dtype_traits<T>::dtype == DType::kBFloat16;

// Two floats to a packed 16-bit pair, lo in the low half.
template <bool kBF16>
__device__ __forceinline__ std::uint32_t pack_pair(float lo, float hi) {
  std::uint32_t r;
  if constexpr (kBF16)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

template <bool kBF16>
__device__ __forceinline__ void mma_16816(float (&c)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                          std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
  if constexpr (kBF16)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ std::uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <int D>
struct MmaFrag {
  static constexpr int kKChunks = D / 32;
  static constexpr int kVChunks = D / 64;
  uint4 k[2][kKChunks];  // tokens pos + g, pos + 8 + g
  uint4 v[4][kVChunks];  // tokens pos + {2j, 2j+1, 8+2j, 9+2j}
  int tok[4];            // those four tokens, -1 when masked out
};

template <int D, int R, bool kPrefetch, class View, class QT>
__global__ void __launch_bounds__(kDecodeThreads, kDecodeCtasPerSm)
    decode_split_mma_kernel(const __grid_constant__ DecodeLaunch<View, QT> a) {
  using T = std::remove_const_t<typename View::value_type>;
  constexpr bool kBF16 = is_bf16_v<T>;
  constexpr int kKSteps = D / 16;
  constexpr int kKChunks = D / 32;
  constexpr int kVChunks = D / 64;
  constexpr int kMTiles = D / 16;
  constexpr int kHalves = R / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<SplitSmem<D, R>*>(smem_raw);

  const DecodeWork w = locate_work(a);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, j = lane & 3;
  const KvRows<View> rows(a.kv, w.b, w.h);

  // The score row (group-mean query of the last position) is row q_rows of the head.
  const int q_rows = a.p.q_len * a.plan.group;
  const bool score_tile = a.p.scores != nullptr && !w.sparse && q_rows / R == w.tile;
  const int score_row = q_rows - w.tile * R;  // in this tile, when score_tile
  const bool block_scores = a.p.score_block_size > 1;
  unsigned* scratch = block_max_scratch(sm);
  if (score_tile && block_scores)
    for (int i = threadIdx.x; i < a.plan.chunk / a.p.score_block_size; i += blockDim.x) scratch[i] = ordered_key(-INFINITY);
  __syncthreads();

  // Q as mma A fragments in the K permutation, rounded to the KV type; rows past the head's rows are 0.
  std::uint32_t qa[kKSteps][kHalves][2];
  int limit[kHalves];  // last token each of this thread's S rows may see
#pragma unroll
  for (int rh = 0; rh < kHalves; ++rh) {
    const int r = w.tile * R + rh * 8 + g;
    float f[kKChunks][8];
#pragma unroll
    for (int i = 0; i < kKChunks; ++i)
#pragma unroll
      for (int e = 0; e < 8; ++e) f[i][e] = 0.f;
    limit[rh] = w.len - 1;
    if (r < q_rows) {
      const int qpos = r / a.plan.group;
      const QT* q = a.p.io.q.row(w.b, qpos, w.h * a.plan.group + r % a.plan.group);
#pragma unroll
      for (int i = 0; i < kKChunks; ++i)
#pragma unroll
        for (int e = 0; e < 8; ++e) f[i][e] = to_float(q[(j + 4 * i) * 8 + e]);
      limit[rh] = w.len - a.p.q_len + qpos;
    } else if (r == q_rows && a.p.scores != nullptr) {
      const float inv = 1.f / a.plan.group;
      for (int gg = 0; gg < a.plan.group; ++gg) {
        const QT* q = a.p.io.q.row(w.b, a.p.q_len - 1, w.h * a.plan.group + gg);
#pragma unroll
        for (int i = 0; i < kKChunks; ++i)
#pragma unroll
          for (int e = 0; e < 8; ++e) f[i][e] += to_float(q[(j + 4 * i) * 8 + e]) * inv;
      }
    }
#pragma unroll
    for (int i = 0; i < kKChunks; ++i) {
      qa[2 * i][rh][0] = pack_pair<kBF16>(f[i][0], f[i][1]);
      qa[2 * i][rh][1] = pack_pair<kBF16>(f[i][2], f[i][3]);
      qa[2 * i + 1][rh][0] = pack_pair<kBF16>(f[i][4], f[i][5]);
      qa[2 * i + 1][rh][1] = pack_pair<kBF16>(f[i][6], f[i][7]);
    }
  }

  float o[kHalves][kMTiles][4];
  float m[kHalves], l[kHalves];
#pragma unroll
  for (int rh = 0; rh < kHalves; ++rh) {
    m[rh] = -INFINITY;
    l[rh] = 0.f;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[rh][mt][c] = 0.f;
  }

  auto load = [&](MmaFrag<D>& fr, int pos) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int t = w.token(pos + nt * 8 + g);
      if (t >= 0) {
        const T* p = rows.k(t);
#pragma unroll
        for (int i = 0; i < kKChunks; ++i) fr.k[nt][i] = load_stream16(p + (j + 4 * i) * 8);
      } else {
#pragma unroll
        for (int i = 0; i < kKChunks; ++i) fr.k[nt][i] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int t = w.token(pos + (s >> 1) * 8 + 2 * j + (s & 1));
      fr.tok[s] = t;
      if (t >= 0) {
        const T* p = rows.v(t);
#pragma unroll
        for (int ci = 0; ci < kVChunks; ++ci) fr.v[s][ci] = load_stream16(p + (g + 8 * ci) * 8);
      } else {
#pragma unroll
        for (int ci = 0; ci < kVChunks; ++ci) fr.v[s][ci] = make_uint4(0, 0, 0, 0);
      }
    }
  };

  auto compute = [&](const MmaFrag<D>& fr, int pos) {
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int c = 0; c < 4; ++c) s[nt][c] = 0.f;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        const uint4& kc = fr.k[nt][ks / 2];
        const std::uint32_t b0 = (ks & 1) ? kc.z : kc.x;
        const std::uint32_t b1 = (ks & 1) ? kc.w : kc.y;
        const std::uint32_t a1 = kHalves > 1 ? qa[ks][kHalves - 1][0] : 0u;
        const std::uint32_t a3 = kHalves > 1 ? qa[ks][kHalves - 1][1] : 0u;
        mma_16816<kBF16>(s[nt], qa[ks][0][0], a1, qa[ks][0][1], a3, b0, b1);
      }
    }
    if (score_tile) {  // raw group-mean scores, before masking by causality
      const int rh = score_row / 8, gs = score_row % 8;
      float v[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) v[q] = fr.tok[q] >= 0 ? s[q >> 1][rh * 2 + (q & 1)] : -INFINITY;
      if (block_scores) {
        float mx = fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        if (g == gs && j == 0) atomicMax(scratch + pos / a.p.score_block_size, ordered_key(mx));
      } else if (g == gs) {
        float* row = a.p.scores + (std::int64_t(w.b) * a.kv.num_kv_heads + w.h) * a.p.score_row_stride;
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (fr.tok[q] >= 0) row[fr.tok[q]] = v[q];
      }
    }
    std::uint32_t pb[kHalves][2];
#pragma unroll
    for (int rh = 0; rh < kHalves; ++rh) {
      float x[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int t = fr.tok[q];
        x[q] = (t >= 0 && t <= limit[rh]) ? s[q >> 1][rh * 2 + (q & 1)] * a.plan.scale_log2 : -INFINITY;
      }
      float mx = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[rh], mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // an all-masked row stays exactly empty
      const float alpha = exp2f(m[rh] - m_use);
      float p[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) p[q] = exp2f(x[q] - m_use);
      l[rh] = l[rh] * alpha + ((p[0] + p[1]) + (p[2] + p[3]));
      m[rh] = m_new;
      pb[rh][0] = pack_pair<kBF16>(p[0], p[1]);
      pb[rh][1] = pack_pair<kBF16>(p[2], p[3]);
      // This thread's output rows are 2j and 2j + 1; their factors live in the threads with g = row.
      const float a_even = __shfl_sync(0xffffffffu, alpha, (2 * j) * 4);
      const float a_odd = __shfl_sync(0xffffffffu, alpha, (2 * j + 1) * 4);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        o[rh][mt][0] *= a_even;
        o[rh][mt][1] *= a_odd;
        o[rh][mt][2] *= a_even;
        o[rh][mt][3] *= a_odd;
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      const int ci = mt / 4, wd = mt % 4;
      const std::uint32_t va0 = word_of(fr.v[0][ci], wd), vb0 = word_of(fr.v[1][ci], wd);
      const std::uint32_t va1 = word_of(fr.v[2][ci], wd), vb1 = word_of(fr.v[3][ci], wd);
      const std::uint32_t a0 = __byte_perm(va0, vb0, 0x5410), a1 = __byte_perm(va0, vb0, 0x7632);
      const std::uint32_t a2 = __byte_perm(va1, vb1, 0x5410), a3 = __byte_perm(va1, vb1, 0x7632);
#pragma unroll
      for (int rh = 0; rh < kHalves; ++rh) mma_16816<kBF16>(o[rh][mt], a0, a1, a2, a3, pb[rh][0], pb[rh][1]);
    }
  };

  int pos = warp * 16;
  if (pos < w.positions) {
    MmaFrag<D> cur;
    load(cur, pos);
    for (;;) {
      const bool more = pos + kDecodeWarps * 16 < w.positions;
      if constexpr (kPrefetch) {
        MmaFrag<D> next;
        if (more) load(next, pos + kDecodeWarps * 16);
        compute(cur, pos);
        if (!more) break;
        cur = next;
      } else {
        compute(cur, pos);
        if (!more) break;
        load(cur, pos + kDecodeWarps * 16);
      }
      pos += kDecodeWarps * 16;
    }
  }

  // Warp state to shared memory: m and the quad-summed l per S row, O^T back in true dimensions.
#pragma unroll
  for (int rh = 0; rh < kHalves; ++rh) {
    float lsum = l[rh];
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
    if (j == 0) {
      sm.m[warp][rh * 8 + g] = m[rh];
      sm.l[warp][rh * 8 + g] = lsum;
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      const int dim = 8 * (g + 8 * (mt / 4)) + 2 * (mt % 4);
      const int row = rh * 8 + 2 * j;
      *reinterpret_cast<float2*>(&sm.o[warp][row][dim]) = make_float2(o[rh][mt][0], o[rh][mt][2]);
      *reinterpret_cast<float2*>(&sm.o[warp][row + 1][dim]) = make_float2(o[rh][mt][1], o[rh][mt][3]);
    }
  }
  store_block_partial(sm, a.partial_out, a.partial_lse, w.partial);
  if (score_tile) finish_scores(a, w, sm);
}

}  // namespace detail
}  // namespace kvsift
