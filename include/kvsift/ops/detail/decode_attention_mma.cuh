#pragma once
// Tensor-core split kernel for 16-bit K/V (fp16 or bf16), streaming K and V through a cp.async ring.
//
// One block = one (batch, KV head, split, row tile), 4 warps. The split's positions are consumed in
// stages of 64: all 128 threads copy a stage's K and V rows into one slot of a kDecodeStages-deep
// shared-memory ring with cp.async, and the warps compute on the oldest slot while the newer ones
// fill. Registers no longer bound the bytes in flight (the previous design prefetched into
// registers, 242 of them, and streamed at 64-82% of the read ceiling). Each warp takes 16 positions
// of a stage:
//   S   = Q K^T       mma.m16n8k16, M = 16 query rows (R = 16), N = 8 positions, K = head_dim
//   S^T = K Q^T       M = 16 positions, N = 8 query rows (R = 8: no padded MMA rows)
//   O^T = V^T P^T     M = 16 output dims, N = 8 query rows, K = 16 positions
// K fragments come from ldmatrix, V^T fragments from ldmatrix.trans, Q from registers loaded once;
// the accumulator layout of S equals the B-operand layout of P^T (S^T's reaches it by movmatrix), so
// P never leaves registers. Every K/V element is read once from HBM for all G query heads of the
// group (GQA in the MMA rows).
//
// Shared-memory rows are XOR-swizzled by 16-byte chunk (chunk c of position p sits at c ^ (p & 7)),
// so the eight rows an ldmatrix phase reads fall in eight different bank groups.
//
// fp8 K/V (e4m3, e5m2) run the same kernel on fp16 tensor cores: codes are widened in registers
// (exact: every fp8 value is an fp16 value) and the scales applied in fp32 - a K scale multiplies the
// scores of its token, a V scale the softmax weight of its token before P V (per-head scales are the
// same number for every token). The 16-byte chunks of a 128-byte fp8 row hold 16 dims, so the k-index
// of Q K^T and the m-index of V^T P^T are permuted to what ldmatrix delivers (the dot product does not
// care about the order of its terms, and each output dim is written to its true place at the end).
//
// A dense split over an affine view (ContiguousKV) streams consecutive tokens by advancing pointers
// (AffineCursor). Elsewhere a position becomes a row address through a lookahead chain, so no thread
// waits on a dependent load inside the loop: a sparse head's index entries ride the ring itself (an
// entry ring in shared memory, filled a whole ring depth ahead), the token ids of a stage are formed
// two stages before its copies are issued, its row handles (the block-table load of a paged view) one
// stage before. Masked positions are zero-filled (cp.async with source size 0), so a
// stale slot can never put a NaN into P V; their token id -1 in the slot's id table masks their
// scores. A token whose page lies outside the pool (a bad block-table entry) is masked the same way,
// and recorded.

#include "kvsift/ops/detail/decode_attention_common.cuh"
#include "kvsift/ops/detail/smem_ring_ptx.cuh"

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

// The 8x8 16-bit matrix whose fragments the warp holds (thread (g, j): row g, columns 2j, 2j + 1),
// transposed: thread (g, j) receives elements (2j, g) and (2j + 1, g).
__device__ __forceinline__ std::uint32_t movmatrix_trans(std::uint32_t x) {
  std::uint32_t r;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x));
  return r;
}


inline constexpr int kStageTokens = kDecodeWarps * 16;  // one 16-position step per warp
// One ring slot: K and V of kStageTokens positions (swizzled rows of D elements of EB bytes), their
// token ids, and for fp8 their per-token K and V scales.
template <int D, int EB>
struct StageLayout {
  static constexpr int kRowBytes = D * EB;
  static constexpr int kChunks = kRowBytes / 16;  // 16-byte chunks per row
  static constexpr int kSwizzle = (kChunks < 8 ? kChunks : 8) - 1;
  static constexpr int kKBytes = kStageTokens * kRowBytes;
  static constexpr int kIdsBytes = kStageTokens * int(sizeof(int));
  static constexpr int kScaleBytes = EB == 1 ? kStageTokens * int(sizeof(float)) : 0;
  static constexpr int kSlotBytes = 2 * kKBytes + kIdsBytes + 2 * kScaleBytes;
  static constexpr int kRingBytes = kDecodeStages<kRowBytes> * kSlotBytes;
  // Threads sharing one row's copies: eight lanes move 128 contiguous bytes per instruction (16 per
  // row measured no better).
  static constexpr int kLoadThreadsPerRow = kChunks < 8 ? kChunks : 8;
  static constexpr int kLoadRowsPerPass = kDecodeThreads / kLoadThreadsPerRow;
  static constexpr int kLoadTokensPerThread = kStageTokens / kLoadRowsPerPass;
  static constexpr int kChunksPerThread = kChunks / kLoadThreadsPerRow;
  // Byte offset of chunk c of position p inside a K or V tile.
  static __device__ __forceinline__ unsigned at(int p, int c) { return unsigned(p * kRowBytes + ((c ^ (p & kSwizzle)) << 4)); }
};

// Four fp8 codes widened to two packed fp16 pairs, exactly: bytes 0, 1 to `lo` and bytes 2, 3 to `hi`
// (low half first). The e4m3 conversions read the two 16-bit halves of `four` in place (ptxas selects
// the high half as an operand), so the upper pair costs no shift.
template <class T>
__device__ __forceinline__ void widen_fp8x4(std::uint32_t four, std::uint32_t& lo, std::uint32_t& hi) {
  if constexpr (dtype_traits<T>::dtype == DType::kFp8E4M3) {
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}"
        : "=r"(lo), "=r"(hi)
        : "r"(four));
  } else {  // e5m2 is the top byte of an fp16
    lo = __byte_perm(four, 0u, 0x1404);
    hi = __byte_perm(four, 0u, 0x3424);
  }
}


// One thread's rows of the next stage of a dense split over an affine view (KvRows::kAffine): the
// first of its kLoadTokensPerThread rows, the byte steps to the next one, and how many of the split's
// positions remain from it on. Each stage's rows are the previous stage's moved by kStageTokens tokens,
// so issuing a stage adds to pointers instead of forming every token's address from its id: measured on
// the fp8 B=8 128K row, that per-token work (id, handle, 64-bit products, bad-data checks) was about
// half of the loop's instructions in a kernel that was issue-bound.
struct AffineCursor {
  const char* k = nullptr;
  const char* v = nullptr;
  std::int64_t k_step = 0, v_step = 0;  // bytes between this thread's consecutive rows of a stage
  int left = 0;                         // split positions from the first row on
  // fp8 per-token scales of a stage, 2 x kStageTokens floats: one 4-byte copy per thread (K to the
  // first half of the threads, V to the rest: position tid % kStageTokens), or, when a head's scales
  // are consecutive in the token and 16-byte aligned (`vec`), one 16-byte copy by each of the first
  // 32 threads (K to threads 0-15, V to 16-31: positions 4 (tid % 16) .. + 3). The per-thread copies
  // cost an L2 request per scale, as many as the K/V rows themselves (ncu, B=8 128K with [batch,
  // token, head] scales: L2 94% busy at 87.5% of DRAM peak).
  const float* scale = nullptr;
  std::int64_t scale_step = 0;  // floats between stages
  bool vec = false;
};
template <class Rows>
__device__ __forceinline__ AffineCursor affine_cursor(const Rows& rows, int first_token, int left, int rows_apart) {
  AffineCursor c;
  if constexpr (Rows::kAffine) {
    using T = typename Rows::T;
    c.k = reinterpret_cast<const char*>(rows.k(first_token));
    c.v = reinterpret_cast<const char*>(rows.v(first_token));
    c.k_step = rows.k_stride * rows_apart * std::int64_t(sizeof(T));
    c.v_step = rows.v_stride * rows_apart * std::int64_t(sizeof(T));
    c.left = left;
  }
  return c;
}
// The scale part of the cursor (fp8 per-token scales): split_base is the split's first token.
template <class Rows>
__device__ __forceinline__ void affine_scales(AffineCursor& c, const Rows& rows, const KvScales& scales, int split_base,
                                              int tid) {
  if constexpr (Rows::kAffine) {
    const std::int64_t first = rows.scale_at(split_base);
    c.vec = rows.scale_token_stride == 1 &&
            ((reinterpret_cast<std::uintptr_t>(scales.k + first) | reinterpret_cast<std::uintptr_t>(scales.v + first)) & 15) == 0;
    if (c.vec)
      c.scale = (tid < 16 ? scales.k : scales.v) + first + 4 * (tid % 16);
    else
      c.scale = (tid < kStageTokens ? scales.k : scales.v) + first + (tid % kStageTokens) * rows.scale_token_stride;
    c.scale_step = rows.scale_token_stride * kStageTokens;
  }
}

inline constexpr unsigned kSmemLine = 128;  // the ring's alignment (see the kernel)

/// Bytes of the ring, which the epilogue's SplitSmem reuses: the offset of the block-max scratch.
template <int D, int R, int EB>
__host__ __device__ constexpr std::size_t mma_ring_bytes() {
  const std::size_t ring = std::size_t(StageLayout<D, EB>::kRingBytes);
  const std::size_t merge = sizeof(SplitSmem<D, R>);
  return ring > merge ? ring : merge;
}

// The index entries of a sparse split, staged in shared memory well before the copies that need them
// (see the kernel): kEntrySlots stages' worth, up to kStageTokens entries a stage.
inline constexpr int kEntrySlots = 8;
inline constexpr std::size_t kEntryRingBytes = std::size_t(kEntrySlots) * kStageTokens * sizeof(std::int32_t);

/// Dynamic shared memory of the tensor-core kernel: up to one line of padding to align the ring, the
/// ring, the entry ring, then the block-max scratch of score emission.
template <int D, int R, int EB>
constexpr std::size_t mma_smem_bytes(int score_blocks) {
  return kSmemLine + mma_ring_bytes<D, R, EB>() + kEntryRingBytes + std::size_t(score_blocks) * sizeof(unsigned);
}

template <int D, int R, class View, class QT>
__global__ void __launch_bounds__(kDecodeThreads, kDecodeCtasPerSm<D * int(sizeof(typename View::value_type)), D>)
    decode_split_mma_kernel(const __grid_constant__ DecodeLaunch<View, QT> a) {
  using T = std::remove_const_t<typename View::value_type>;
  constexpr bool kFp8 = is_fp8_dtype<T>::value;
  using L = StageLayout<D, int(sizeof(T))>;
  constexpr bool kBF16 = !kFp8 && is_bf16_v<T>;  // fp8 widens to fp16
  constexpr int kStages = kDecodeStages<L::kRowBytes>;
  constexpr int kKSteps = D / 16;
  constexpr int kMTiles = D / 16;
  constexpr int kHalves = R / 8;
  constexpr int kLoadThreadsPerRow = L::kLoadThreadsPerRow;
  constexpr int kLoadRowsPerPass = L::kLoadRowsPerPass;
  constexpr int kLoadTokensPerThread = L::kLoadTokensPerThread;
  constexpr int kChunksPerThread = L::kChunksPerThread;
  extern __shared__ __align__(16) unsigned char smem_dynamic[];
  // The epilogue's static shared memory sits before the dynamic block, which therefore starts only
  // 16-byte aligned; the ring is moved to a 128-byte line. A 128-byte global segment copied across two
  // shared-memory lines is split into two L2 requests: measured with ncu (dense B=8 128K, H200), 134 M
  // requests for 268 M sectors before, 33.6 M for 134 M after, DRAM 78.7% -> 93.0% of peak.
  unsigned char* smem_raw =
      smem_dynamic + ((kSmemLine - (unsigned(__cvta_generic_to_shared(smem_dynamic)) & (kSmemLine - 1))) & (kSmemLine - 1));
  auto& sm = *reinterpret_cast<SplitSmem<D, R>*>(smem_raw);  // valid only after the loop
  std::int32_t* entry_ring = reinterpret_cast<std::int32_t*>(smem_raw + mma_ring_bytes<D, R, int(sizeof(T))>());
  unsigned* scratch = reinterpret_cast<unsigned*>(smem_raw + mma_ring_bytes<D, R, int(sizeof(T))>() + kEntryRingBytes);
  const unsigned ring = unsigned(__cvta_generic_to_shared(smem_raw));
  auto slot_k = [&](int slot) { return ring + unsigned(slot * L::kSlotBytes); };
  auto slot_v = [&](int slot) { return ring + unsigned(slot * L::kSlotBytes + L::kKBytes); };
  auto slot_tok = [&](int slot) { return reinterpret_cast<int*>(smem_raw + slot * L::kSlotBytes + 2 * L::kKBytes); };
  // fp8 per-token scales of a slot: K at [0, 64), V at [64, 128).
  auto slot_scale = [&](int slot) {
    return reinterpret_cast<float*>(smem_raw + slot * L::kSlotBytes + 2 * L::kKBytes + L::kIdsBytes);
  };

  dependent_kernel_start();  // Exec::dependent_launch: q and the new K/V rows are earlier kernels' output; the merge waits
  // The block's place, then its length: loaded first, used (bound_work) once the early stage below is
  // in flight.
  DecodeWork w = locate_split(a);
  const WorkBounds bounds = load_bounds(a, w);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, j = lane & 3;
  const KvRows<View> rows(a.kv, w.b, w.h);
  using Handle = typename KvRows<View>::Handle;
  // fp8: per-token scales ride the ring; a per-head scale is one number for the whole block.
  bool per_token_scales = false;
  float k_head_scale = 1.f, v_head_scale = 1.f;
  if constexpr (kFp8) {
    per_token_scales = a.kv.scales.granularity == ScaleGranularity::kPerToken;
    if (!per_token_scales) {
      k_head_scale = a.kv.scales.k[w.h];
      v_head_scale = a.kv.scales.v[w.h];
    }
  }

  // The score row (group-mean query of the last position) is row q_rows of the head.
  const int q_rows = a.p.q_len * a.plan.group;
  const bool score_tile = a.p.scores != nullptr && !w.sparse && q_rows / R == w.tile;
  const int score_row = q_rows - w.tile * R;  // in this tile, when score_tile
  const bool block_scores = a.p.score_block_size > 1;
  if (score_tile && block_scores)
    for (int i = tid; i < a.plan.chunk / a.p.score_block_size; i += blockDim.x) scratch[i] = ordered_key(-INFINITY);
  // Score candidates: the split's list grows by shared atomics (the first add is past the stream
  // loop's first barrier) and its count is published after the loop (finish_scores).
  __shared__ int s_listed;
  const CandidateSegment cand = candidate_segment(a, w, score_tile);
  if (tid == 0) s_listed = 0;

  // ---- the copy side: this thread's positions and chunks within every stage ----
  const int load_row = tid / kLoadThreadsPerRow, load_chunk = tid % kLoadThreadsPerRow;
  int tok_next[kLoadTokensPerThread];   // token ids of the stage after the one to issue
  int tok_issue[kLoadTokensPerThread];  // token ids of the stage to issue
  Handle hdl_issue[kLoadTokensPerThread];
  // A sparse split's index entries reach the token ids through the entry ring: the entries of stage y
  // (those of its positions, from entry (y kStageTokens) >> block_shift on) sit in slot y % kEntrySlots.
  // They travel in the cp.async group of the rows of stage y - kStages - 1, so they get the ring's whole
  // depth to land and are waited with those rows, before advance() turns them into ids. Read from
  // global memory one iteration ahead instead, each stage's ids had one iteration to land whatever the
  // ring's depth: fp8 gathers, with three stages of rows in flight, were no faster than 16-bit ones
  // with one. (Blocks of a stage or more, 32 stages to a 128-byte line that L1 keeps, had no such wait;
  // they take the ring too: a per-block choice of paths measured slower on them than either path.)
  // A slot is rewritten kEntrySlots stages after its stage: the prologue fills stages 0 .. 2 kStages - 1
  // before any is read, so they need distinct slots.
  static_assert(2 * kStages <= kEntrySlots, "the entry ring holds the prologue's stages");
  auto stage_entries = [&](int y) {
    if (!w.sparse) return;
    const int j0 = (y * kStageTokens) >> w.block_shift;
    const int n = min(max(kStageTokens >> w.block_shift, 1), (w.positions >> w.block_shift) - j0);
    if (tid < n)
      cp_async4(unsigned(__cvta_generic_to_shared(entry_ring + (y % kEntrySlots) * kStageTokens + tid)), w.entries + j0 + tid, 4);
  };
  auto read_tokens = [&](int (&tok)[kLoadTokensPerThread], int stage) {
    const std::int32_t* entries = entry_ring + (stage % kEntrySlots) * kStageTokens - ((stage * kStageTokens) >> w.block_shift);
#pragma unroll
    for (int i = 0; i < kLoadTokensPerThread; ++i) {
      const int p = stage * kStageTokens + load_row + i * kLoadRowsPerPass;
      tok[i] = p >= w.positions ? -1 : !w.sparse ? w.base + p : w.entry_token(p, entries[p >> w.block_shift]);
    }
  };
  // Bad engine data met by this thread's loads (a token whose page is outside the pool, an entry of the
  // split out of range): skipped here, noted, and recorded once after the loop, so the unrolled loads
  // hold no call.
  int bad_page_token = -1, bad_entry = -1;
  auto advance = [&](int stage_after_next) {
#pragma unroll
    for (int i = 0; i < kLoadTokensPerThread; ++i) {
      int t = tok_next[i];
      if (t <= -2) {
        bad_entry = -2 - t;
        t = -1;
      }
      tok_issue[i] = t;
      hdl_issue[i] = t >= 0 ? rows.handle(t) : Handle();
      if (t >= 0 && !rows.valid(hdl_issue[i])) {  // its page is outside the pool: skip it
        bad_page_token = t;
        // Its score is -inf, as for every token nobody can attend (block maxima ignore it anyway).
        if (score_tile && !block_scores && load_chunk == 0)
          a.p.scores[(std::int64_t(w.b) * a.kv.num_kv_heads + w.h) * a.p.score_row_stride + t] = -INFINITY;
        tok_issue[i] = -1;
      }
    }
    read_tokens(tok_next, stage_after_next);
  };
  // A valid global address for the zero-filling copies of masked positions (nothing is read).
  const void* dummy = a.p.io.q.data;
  auto issue = [&](int stage) {
    const int slot = stage % kStages;
    const unsigned kd = slot_k(slot), vd = slot_v(slot);
    int* ids = slot_tok(slot);
#pragma unroll
    for (int i = 0; i < kLoadTokensPerThread; ++i) {
      const int p = load_row + i * kLoadRowsPerPass;
      const bool ok = tok_issue[i] >= 0;
      const char* kp = ok ? reinterpret_cast<const char*>(rows.k_at(hdl_issue[i])) : nullptr;
      const char* vp = ok ? reinterpret_cast<const char*>(rows.v_at(hdl_issue[i])) : nullptr;
#pragma unroll
      for (int u = 0; u < kChunksPerThread; ++u) {
        const int c = load_chunk + u * kLoadThreadsPerRow;
        cp_async16(kd + L::at(p, c), ok ? static_cast<const void*>(kp + c * 16) : dummy, ok ? 16 : 0);
        cp_async16(vd + L::at(p, c), ok ? static_cast<const void*>(vp + c * 16) : dummy, ok ? 16 : 0);
      }
      if constexpr (kFp8) {
        if (per_token_scales && load_chunk == 0) {
          const std::int64_t at = ok ? rows.scale_at(hdl_issue[i]) : 0;
          const unsigned sd = unsigned(__cvta_generic_to_shared(slot_scale(slot) + p));
          cp_async4(sd, ok ? static_cast<const void*>(a.kv.scales.k + at) : dummy, ok ? 4 : 0);
          cp_async4(sd + kStageTokens * 4, ok ? static_cast<const void*>(a.kv.scales.v + at) : dummy, ok ? 4 : 0);
        }
      }
      if (load_chunk == 0) ids[p] = tok_issue[i];
    }
  };
  // A dense split over an affine view streams consecutive tokens: no ids, handles or lookahead, and no
  // bad engine data to meet (its tokens lie in [0, len)). Its masked positions (past the split's end,
  // in the last stage only) are zero-filled as above; compute() derives the token ids from positions.
  const bool affine = KvRows<View>::kAffine && !w.sparse;
  static_assert(kDecodeThreads == 2 * kStageTokens, "one per-token scale per thread and stage");
  // Such a split's first stage is issued before its length is known (the early stage, below), as if
  // the sequence ran to the most tokens the call covers that have an address: min(max_len, capacity)
  // bounds every length, so the early positions are never fewer than the split's own.
  int early_positions = 0;
  if constexpr (KvRows<View>::kAffine) {
    const int end = a.plan.max_len < a.kv.capacity ? a.plan.max_len : a.kv.capacity;
    early_positions = affine ? max(0, min(a.plan.chunk, end - w.base)) : 0;
  }
  AffineCursor cur = affine ? affine_cursor(rows, w.base + load_row, early_positions - load_row, kLoadRowsPerPass) : AffineCursor{};
  if constexpr (kFp8)
    if (affine && per_token_scales) affine_scales(cur, rows, a.kv.scales, w.base, tid);
  auto issue_affine = [&](int stage) {
    const int slot = stage % kStages;
    const unsigned kd = slot_k(slot), vd = slot_v(slot);
    // Every stage but a split's last is whole: its copies take no mask and no stand-in address.
    auto copy_rows = [&](auto whole) {
#pragma unroll
      for (int i = 0; i < kLoadTokensPerThread; ++i) {
        const int p = load_row + i * kLoadRowsPerPass;
        const bool ok = decltype(whole)::value || i * kLoadRowsPerPass < cur.left;
        const char* kp = cur.k + i * cur.k_step;
        const char* vp = cur.v + i * cur.v_step;
#pragma unroll
        for (int u = 0; u < kChunksPerThread; ++u) {
          const int c = load_chunk + u * kLoadThreadsPerRow;
          cp_async16(kd + L::at(p, c), ok ? static_cast<const void*>(kp + c * 16) : dummy, ok ? 16 : 0);
          cp_async16(vd + L::at(p, c), ok ? static_cast<const void*>(vp + c * 16) : dummy, ok ? 16 : 0);
        }
      }
    };
    if (cur.left > (kLoadTokensPerThread - 1) * kLoadRowsPerPass)
      copy_rows(std::true_type{});
    else
      copy_rows(std::false_type{});
    if constexpr (kFp8) {
      if (per_token_scales) {
        const int stage_left = cur.left + load_row;  // positions of the split from this stage's first on
        if (cur.vec) {
          if (tid < 32) {  // a partial last vector copies its valid scales and zero-fills the rest
            const int q = 4 * (tid % 16), n = stage_left - q < 0 ? 0 : (stage_left - q > 4 ? 4 : stage_left - q);
            const unsigned sd = unsigned(__cvta_generic_to_shared(slot_scale(slot) + (tid / 16) * kStageTokens + q));
            cp_async16(sd, n > 0 ? static_cast<const void*>(cur.scale) : dummy, 4 * n);
          }
        } else {
          const bool ok = tid % kStageTokens < stage_left;
          cp_async4(unsigned(__cvta_generic_to_shared(slot_scale(slot) + tid)), ok ? static_cast<const void*>(cur.scale) : dummy,
                    ok ? 4 : 0);
        }
        cur.scale += cur.scale_step;
      }
    }
    cur.k += kLoadTokensPerThread * cur.k_step;
    cur.v += kLoadTokensPerThread * cur.v_step;
    cur.left -= kStageTokens;
  };

  // This thread's Q elements are loaded before the ring starts and converted after it: issued behind
  // the first stage, they queued behind every block's K/V requests (measured on the H200, B = 1: the
  // prologue ended 6.1 us into the kernel, the first stage had landed 0.1 us later, so Q came last).
  // Thread (g, j) holds dims 16 ks + 2j + {0, 1} and 16 ks + 8 + 2j + {0, 1} of its row; for fp8
  // the k-index follows the bytes ldmatrix delivers: dims 16 ks + 4j + {0, 1} and + {2, 3}.
  const int d_lo = kFp8 ? 4 * j : 2 * j, d_hi = kFp8 ? 4 * j + 2 : 8 + 2 * j;
  QT q_raw[kHalves][kKSteps][4];
#pragma unroll
  for (int rh = 0; rh < kHalves; ++rh) {
    const int r = w.tile * R + rh * 8 + g;
    const QT* q = r < q_rows ? a.p.io.q.row(w.b, r / a.plan.group, w.h * a.plan.group + r % a.plan.group) : nullptr;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const int at[4] = {16 * ks + d_lo, 16 * ks + d_lo + 1, 16 * ks + d_hi, 16 * ks + d_hi + 1};
#pragma unroll
      for (int e = 0; e < 4; ++e) q_raw[rh][ks][e] = q ? q[at[e]] : from_float<QT>(0.f);
    }
  }

  // The early stage: an affine split's stage 0 goes out after the length's load is issued and before
  // it is used, so the length's round trip overlaps the first rows' instead of preceding it (the block timeline, H100, B = 1: the
  // length landed 1.0-1.5 us into the kernel, the first stage 1.3-2.3 us after that). Rows it copies
  // past the split's real end are zeroed once the length says so (a zero weight must not meet a NaN
  // in V); they are valid memory, below the capacity.
  // A sparse split's early stage is its index entries: those of the first kStages + 1 stages, copied
  // as if its row held `capacity` entries (valid memory: a row has row_stride >= capacity), through
  // w.positions set to that bound until bound_work sets the real one. Entries past the real count are
  // never turned into tokens (read_tokens masks positions by the count).
  if (affine) {
    issue_affine(0);
    cp_async_commit();
  } else if (w.sparse) {
    const int per_split = a.plan.sparse_chunk >> w.block_shift;
    w.positions = max(0, min(per_split, a.p.index_set.capacity - w.first_entry)) << w.block_shift;
    for (int y = 0; y <= kStages; ++y) stage_entries(y);
    cp_async_commit();
  }
  bound_work(a, w, bounds);
  const int steps = (w.positions + kStageTokens - 1) / kStageTokens;
  if (affine) {
    cur.left += w.positions - early_positions;  // the cursor now ends at the split's real end
    const int early_rows = min(early_positions, kStageTokens), real_rows = min(w.positions, kStageTokens);
    if (real_rows > 0 && real_rows < early_rows) {  // the rare split whose sequence ends in its first stage
      cp_async_wait<0>();
      __syncthreads();  // every thread's early copies landed; no other copy is in flight yet
      for (int i = tid; i < (early_rows - real_rows) * L::kChunks; i += blockDim.x) {
        const int p = real_rows + i / L::kChunks, c = i % L::kChunks;
        *reinterpret_cast<uint4*>(smem_raw + L::at(p, c)) = make_uint4(0u, 0u, 0u, 0u);
        *reinterpret_cast<uint4*>(smem_raw + L::kKBytes + L::at(p, c)) = make_uint4(0u, 0u, 0u, 0u);
      }
      if constexpr (kFp8)
        if (per_token_scales)
          for (int p = real_rows + tid; p < early_rows; p += blockDim.x) slot_scale(0)[p] = slot_scale(0)[kStageTokens + p] = 0.f;
      // Stage 0 is read after the stream loop's first barrier, which orders these stores before it.
    }
  }

  // The prologue issues the first kStages - 1 stages; a split of exactly kStages stages (the ring's
  // depth) is issued whole, so its last stage does not wait for the first to land: small calls merged
  // in clusters are cut into such splits (DecodePlan::cluster). Measured on an H100, 1024 tokens at
  // B=1: 11.7 us when the first wait also waited for the second stage, 11.3 as below; the B=1 gathers'
  // two-stage splits gained nothing.
  const bool whole = steps == kStages;
  const int ahead = whole ? kStages : kStages - 1;  // stages the prologue issues
  if (affine) {
#pragma unroll
    for (int s = 1; s < kStages; ++s) {  // stage 0 is the early stage, its group committed
      if (s == ahead) break;
      if (s < steps) issue_affine(s);
      cp_async_commit();
    }
  } else {
    if (w.sparse) {  // the early stage's entries (above) land before any row can be addressed
      cp_async_wait<0>();
      __syncthreads();
    }
    read_tokens(tok_next, 0);
    advance(1);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      if (s == ahead) break;
      if (s < steps) issue(s);
      stage_entries(s + kStages + 1);
      cp_async_commit();
      advance(s + 2);
    }
  }

  // Q as mma A fragments, rounded to the KV type; rows past the head's rows are 0.
  std::uint32_t qa[kKSteps][kHalves][2];
  int limit[kHalves];  // last token each of this thread's S rows may see
#pragma unroll
  for (int rh = 0; rh < kHalves; ++rh) {
    const int r = w.tile * R + rh * 8 + g;
    float f[kKSteps][4];
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks)
#pragma unroll
      for (int e = 0; e < 4; ++e) f[ks][e] = 0.f;
    limit[rh] = w.len - 1;
    auto add_row = [&](const QT* q, float scale) {
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        f[ks][0] += scale * to_float(q[16 * ks + d_lo]);
        f[ks][1] += scale * to_float(q[16 * ks + d_lo + 1]);
        f[ks][2] += scale * to_float(q[16 * ks + d_hi]);
        f[ks][3] += scale * to_float(q[16 * ks + d_hi + 1]);
      }
    };
    if (r < q_rows) {
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
#pragma unroll
        for (int e = 0; e < 4; ++e) f[ks][e] = to_float(q_raw[rh][ks][e]);
      limit[rh] = w.len - a.p.q_len + r / a.plan.group;
    } else if (r == q_rows && a.p.scores != nullptr) {
      const float inv = 1.f / a.plan.group;
      for (int gg = 0; gg < a.plan.group; ++gg) add_row(a.p.io.q.row(w.b, a.p.q_len - 1, w.h * a.plan.group + gg), inv);
    }
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      qa[ks][rh][0] = pack_pair<kBF16>(f[ks][0], f[ks][1]);
      qa[ks][rh][1] = pack_pair<kBF16>(f[ks][2], f[ks][3]);
    }
  }

  // R = 8 (up to 8 query rows per KV head: a GQA group of <= 8 at one position, Llama-3's and
  // LycheeDecode's shape) computes the scores transposed, S^T = K Q^T: M = 16 positions, N = 8 query
  // rows, so no MMA row is padding. That halves the Q K^T MMAs of S = Q K^T (whose rows 8-15 were zero)
  // and drops the moves that placed those zeros beside Q in the A operand. A thread then holds rows 2j,
  // 2j + 1 at positions g and g + 8: the rows of its O^T accumulators, so the rescale needs no shuffle,
  // and P^T reaches the B-operand layout of P V through one movmatrix.trans per 8 positions.
  constexpr bool kTransposedScores = R == 8;
  constexpr int kRowSlots = kTransposedScores ? 2 : kHalves;  // softmax rows a thread keeps
  int limit_t[2];  // transposed: last token rows 2j, 2j + 1 may see (rows past the head's see all)
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int r = w.tile * R + 2 * j + e;
    limit_t[e] = r < q_rows ? w.len - a.p.q_len + r / a.plan.group : w.len - 1;
  }
  float o[kHalves][kMTiles][4];
  float m[kRowSlots], l[kRowSlots];
#pragma unroll
  for (int e = 0; e < kRowSlots; ++e) {
    m[e] = -INFINITY;
    l[e] = 0.f;
  }
#pragma unroll
  for (int rh = 0; rh < kHalves; ++rh)
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[rh][mt][c] = 0.f;

  // O^T += V^T P^T over one warp's 16 positions of a slot (pb: P^T as B fragments, per row half).
  auto accumulate_pv = [&](unsigned vb, int p0, const std::uint32_t (&pb)[kHalves][2]) {
    if constexpr (!kFp8) {
      // V^T fragments: matrices (positions 0-7 | 8-15) x (dims 16 mt + 0-7 | 8-15), transposed.
      const int vp = p0 + (lane & 7) + 8 * (lane >> 4);
      const int vc = (lane >> 3) & 1;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        std::uint32_t va[4];
        ldmatrix_x4_trans(va, vb + L::at(vp, 2 * mt + vc));
#pragma unroll
        for (int rh = 0; rh < kHalves; ++rh)
          mma_16816<kBF16>(o[rh][mt], va[0], va[1], va[2], va[3], pb[rh][0], pb[rh][1]);
      }
    } else {
      // fp8 V^T: a transposed 8x8 b16 matrix of 8 positions x one 16-dim chunk gives thread (g, j) the
      // codes of dims 2g, 2g + 1 at positions 2j, 2j + 1; regrouped by dim they are the A values of
      // m-slot g (dim 2g) and m-slot g + 8 (dim 2g + 1). Matrices: (positions 0-7 | 8-15) x
      // (chunks 2 mp | 2 mp + 1); one chunk is one m-tile.
      const int vp = p0 + (lane & 7) + 8 * ((lane >> 3) & 1);
      const int vc = lane >> 4;
#pragma unroll
      for (int mp = 0; mp < kMTiles / 2; ++mp) {
        std::uint32_t r[4];
        ldmatrix_x4_trans(r, vb + L::at(vp, 2 * mp + vc));
#pragma unroll
        for (int hm = 0; hm < 2; ++hm) {
          const std::uint32_t lo = r[2 * hm], hi = r[2 * hm + 1];  // positions 0-7, 8-15
          // Bytes 0, 2 (dim 2g at positions 2j, 2j + 1) and 1, 3 (dim 2g + 1) regrouped into halves.
          std::uint32_t a0, a1, a2, a3;
          widen_fp8x4<T>(__byte_perm(lo, 0u, 0x3120), a0, a1);
          widen_fp8x4<T>(__byte_perm(hi, 0u, 0x3120), a2, a3);
#pragma unroll
          for (int rh = 0; rh < kHalves; ++rh)
            mma_16816<kBF16>(o[rh][2 * mp + hm], a0, a1, a2, a3, pb[rh][0], pb[rh][1]);
        }
      }
    }
  };

  // One warp's 16 positions of a ring slot; `pos` is the first one's position in the split. `dense`
  // (std::true_type for an affine split) takes the token ids from the positions instead of the slot.
  auto compute = [&](int slot, int pos, auto dense) {
    const unsigned kb = slot_k(slot), vb = slot_v(slot);
    const int p0 = warp * 16;
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int c = 0; c < 4; ++c) s[nt][c] = 0.f;
      // One ldmatrix.x4 reads 4 chunks of 8 positions: 2 k-steps of 16-bit K, 4 of fp8 K.
#pragma unroll
      for (int kp = 0; kp < L::kChunks / 4; ++kp) {
        std::uint32_t b[4];
        ldmatrix_x4(b, kb + L::at(p0 + 8 * nt + (lane & 7), 4 * kp + (lane >> 3)));
        constexpr int kStepsPerLoad = kFp8 ? 4 : 2;
#pragma unroll
        for (int h2 = 0; h2 < kStepsPerLoad; ++h2) {
          const int ks = kStepsPerLoad * kp + h2;
          const std::uint32_t a1 = kHalves > 1 ? qa[ks][kHalves - 1][0] : 0u;
          const std::uint32_t a3 = kHalves > 1 ? qa[ks][kHalves - 1][1] : 0u;
          std::uint32_t b0, b1;
          if constexpr (kFp8) {  // dims 4j .. 4j + 3 of the chunk: k-slots 2j, 2j + 1 | 2j + 8, 2j + 9
            widen_fp8x4<T>(b[h2], b0, b1);
          } else {
            b0 = b[2 * h2];
            b1 = b[2 * h2 + 1];
          }
          mma_16816<kBF16>(s[nt], qa[ks][0][0], a1, qa[ks][0][1], a3, b0, b1);
        }
      }
    }
    // This thread's S columns: positions 2j, 2j + 1 (n-tile 0) and 8 + 2j, 9 + 2j (n-tile 1).
    int tok[4];
    if constexpr (decltype(dense)::value) {
      const int col[4] = {2 * j, 2 * j + 1, 8 + 2 * j, 9 + 2 * j};
#pragma unroll
      for (int q = 0; q < 4; ++q) tok[q] = pos + col[q] < w.positions ? w.base + pos + col[q] : -1;
    } else {
      const int* ids = slot_tok(slot);
      const int2 t01 = *reinterpret_cast<const int2*>(ids + p0 + 2 * j);
      const int2 t89 = *reinterpret_cast<const int2*>(ids + p0 + 8 + 2 * j);
      tok[0] = t01.x, tok[1] = t01.y, tok[2] = t89.x, tok[3] = t89.y;
    }
    [[maybe_unused]] float v_scale[4] = {v_head_scale, v_head_scale, v_head_scale, v_head_scale};
    if constexpr (kFp8) {  // dequantize the scores: S = k_scale * (q . code)
      float k_scale[4] = {k_head_scale, k_head_scale, k_head_scale, k_head_scale};
      if (per_token_scales) {
        const float* sc = slot_scale(slot);
        const float2 k01 = *reinterpret_cast<const float2*>(sc + p0 + 2 * j);
        const float2 k89 = *reinterpret_cast<const float2*>(sc + p0 + 8 + 2 * j);
        const float2 v01 = *reinterpret_cast<const float2*>(sc + kStageTokens + p0 + 2 * j);
        const float2 v89 = *reinterpret_cast<const float2*>(sc + kStageTokens + p0 + 8 + 2 * j);
        k_scale[0] = k01.x, k_scale[1] = k01.y, k_scale[2] = k89.x, k_scale[3] = k89.y;
        v_scale[0] = v01.x, v_scale[1] = v01.y, v_scale[2] = v89.x, v_scale[3] = v89.y;
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) s[nt][c] *= k_scale[nt * 2 + (c & 1)];
    }
    if (score_tile) {  // raw group-mean scores, before masking by causality
      const bool upper = score_row >= 8;  // which half of the S rows holds the score row
      const int gs = score_row % 8;
      float v[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float sv = upper ? s[q >> 1][2 + (q & 1)] : s[q >> 1][q & 1];
        v[q] = tok[q] >= 0 ? sv : -INFINITY;
      }
      if (block_scores) {
        float mx = fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        if (g == gs && j == 0) atomicMax(scratch + pos / a.p.score_block_size, ordered_key(mx));
      } else if (g == gs) {
        float* row = a.p.scores + (std::int64_t(w.b) * a.kv.num_kv_heads + w.h) * a.p.score_row_stride;
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (tok[q] >= 0) row[tok[q]] = v[q];
#pragma unroll
        for (int q = 0; q < 4; ++q) cand.add(&s_listed, tok[q], v[q]);  // masked tokens: -inf, never listed
      }
    }
    std::uint32_t pb[kHalves][2];
#pragma unroll
    for (int rh = 0; rh < kHalves; ++rh) {
      float x[4];
#pragma unroll
      for (int q = 0; q < 4; ++q)
        x[q] = (tok[q] >= 0 && tok[q] <= limit[rh]) ? s[q >> 1][rh * 2 + (q & 1)] * a.plan.scale_log2 : -INFINITY;
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
      if constexpr (kFp8) {  // P V with V = v_scale * code: the scale rides the weight
#pragma unroll
        for (int q = 0; q < 4; ++q) p[q] *= v_scale[q];
      }
      pb[rh][0] = pack_pair<kBF16>(p[0], p[1]);
      pb[rh][1] = pack_pair<kBF16>(p[2], p[3]);
      // Once a split has seen a few stages its maxima rarely move; when no row of the warp's moved,
      // every factor is exactly 1 and the rescale (2 shuffles and 4 * kMTiles products) is skipped.
      if (__any_sync(0xffffffffu, alpha != 1.f)) {
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
    }
    accumulate_pv(vb, p0, pb);
  };

  // The transposed form of compute() (kTransposedScores): this thread's S^T values are c[0], c[1] (rows
  // 2j, 2j + 1 at position g) and c[2], c[3] (the same rows at position g + 8).
  auto compute_t = [&](int slot, int pos, auto dense) {
    const unsigned kb = slot_k(slot), vb = slot_v(slot);
    const int p0 = warp * 16;
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    // One ldmatrix.x4 reads chunks (2 ld, 2 ld + 1) of positions 0-7 and 8-15: the A fragment of one
    // k-step of 16-bit K, or of two k-steps of fp8 K (one chunk each, dims 4j .. 4j + 3 of it as
    // k-slots 2j, 2j + 1 | 2j + 8, 2j + 9, the order Q was packed in).
    const int kp_row = p0 + (lane & 7) + 8 * ((lane >> 3) & 1), kp_chunk = lane >> 4;
#pragma unroll
    for (int ld = 0; ld < L::kChunks / 2; ++ld) {
      std::uint32_t r[4];
      ldmatrix_x4(r, kb + L::at(kp_row, 2 * ld + kp_chunk));
      if constexpr (kFp8) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          std::uint32_t a0, a1, a2, a3;
          widen_fp8x4<T>(r[2 * h], a0, a2);
          widen_fp8x4<T>(r[2 * h + 1], a1, a3);
          mma_16816<kBF16>(c, a0, a1, a2, a3, qa[2 * ld + h][0][0], qa[2 * ld + h][0][1]);
        }
      } else {
        mma_16816<kBF16>(c, r[0], r[1], r[2], r[3], qa[ld][0][0], qa[ld][0][1]);
      }
    }
    int tok[2];  // positions g, g + 8
    if constexpr (decltype(dense)::value) {
#pragma unroll
      for (int q = 0; q < 2; ++q) tok[q] = pos + g + 8 * q < w.positions ? w.base + pos + g + 8 * q : -1;
    } else {
      const int* ids = slot_tok(slot);
      tok[0] = ids[p0 + g];
      tok[1] = ids[p0 + g + 8];
    }
    [[maybe_unused]] float v_scale[2] = {v_head_scale, v_head_scale};
    if constexpr (kFp8) {  // dequantize the scores: S = k_scale * (q . code)
      float k_scale[2] = {k_head_scale, k_head_scale};
      if (per_token_scales) {
        const float* sc = slot_scale(slot);
        k_scale[0] = sc[p0 + g], k_scale[1] = sc[p0 + g + 8];
        v_scale[0] = sc[kStageTokens + p0 + g], v_scale[1] = sc[kStageTokens + p0 + g + 8];
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) c[q] *= k_scale[q >> 1];
    }
    if (score_tile) {  // raw group-mean scores, before masking by causality: row score_row = 2j + e
      const bool odd = score_row & 1;  // (selects, not an index: a runtime index would put c on the stack)
      const float v0 = tok[0] >= 0 ? (odd ? c[1] : c[0]) : -INFINITY, v1 = tok[1] >= 0 ? (odd ? c[3] : c[2]) : -INFINITY;
      if (block_scores) {
        float mx = fmaxf(v0, v1);
#pragma unroll
        for (int x = 4; x < 32; x *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
        if (g == 0 && j == score_row >> 1) atomicMax(scratch + pos / a.p.score_block_size, ordered_key(mx));
      } else if (j == score_row >> 1) {
        float* row = a.p.scores + (std::int64_t(w.b) * a.kv.num_kv_heads + w.h) * a.p.score_row_stride;
        if (tok[0] >= 0) row[tok[0]] = v0;
        if (tok[1] >= 0) row[tok[1]] = v1;
        cand.add(&s_listed, tok[0], v0);  // masked tokens: -inf, never listed
        cand.add(&s_listed, tok[1], v1);
      }
    }
    float p[2][2];  // [row 2j + e][position g, g + 8]
    float alpha[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float x[2];
#pragma unroll
      for (int q = 0; q < 2; ++q)
        x[q] = (tok[q] >= 0 && tok[q] <= limit_t[e]) ? c[2 * q + e] * a.plan.scale_log2 : -INFINITY;
      float mx = fmaxf(x[0], x[1]);
#pragma unroll
      for (int sh = 4; sh < 32; sh *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, sh));
      const float m_new = fmaxf(m[e], mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // an all-masked row stays exactly empty
      alpha[e] = exp2f(m[e] - m_use);
      p[e][0] = exp2f(x[0] - m_use);
      p[e][1] = exp2f(x[1] - m_use);
      l[e] = l[e] * alpha[e] + (p[e][0] + p[e][1]);  // this thread's positions; summed over g at the end
      m[e] = m_new;
      if constexpr (kFp8) {  // P V with V = v_scale * code: the scale rides the weight
        p[e][0] *= v_scale[0];
        p[e][1] *= v_scale[1];
      }
    }
    // As in compute(): when no row of the warp moved its maximum, every factor is exactly 1.
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        o[0][mt][0] *= alpha[0];
        o[0][mt][1] *= alpha[1];
        o[0][mt][2] *= alpha[0];
        o[0][mt][3] *= alpha[1];
      }
    }
    // P (positions x rows) in fragments of rows 2j, 2j + 1 at positions g (resp. g + 8), transposed
    // to P^T's B fragments: positions 2j, 2j + 1 (resp. + 8) of row g.
    std::uint32_t pb[kHalves][2];
    pb[0][0] = movmatrix_trans(pack_pair<kBF16>(p[0][0], p[1][0]));
    pb[0][1] = movmatrix_trans(pack_pair<kBF16>(p[0][1], p[1][1]));
    accumulate_pv(vb, p0, pb);
  };

  auto stream = [&](auto dense) {
    for (int st = 0; st < steps; ++st) {
      // Stage st landed: the groups committed after its own are the kStages - 2 stages issued ahead of
      // it, or kStages - 1 when the prologue issued the split whole (one group more; the loop then
      // issues nothing).
      if (whole)
        cp_async_wait<kStages - 1>();
      else
        cp_async_wait<kStages - 2>();
      __syncthreads();  // stage st landed for every thread; slot (st - 1) % kStages is free again
      const int next = st + kStages - 1;
      if constexpr (decltype(dense)::value) {
        if (!whole && next < steps) issue_affine(next);
        cp_async_commit();
      } else {
        if (!whole && next < steps) issue(next);
        stage_entries(next + kStages + 1);
        cp_async_commit();
        advance(next + 2);
      }
      if constexpr (kTransposedScores)
        compute_t(st % kStages, st * kStageTokens + warp * 16, dense);
      else
        compute(st % kStages, st * kStageTokens + warp * 16, dense);
    }
  };
  if (affine)
    stream(std::true_type{});
  else
    stream(std::false_type{});
  cp_async_wait<0>();
  __syncthreads();  // the ring becomes the epilogue's SplitSmem
  if (bad_page_token >= 0) record_bad_page(a, w, bad_page_token, rows.bad_value(bad_page_token));
  if (bad_entry >= 0) record_bad_entry(a, w, bad_entry);

  // Warp state to shared memory: m and the summed l per S row (over the quad of a row's S columns, or
  // for transposed scores over the 8 threads of its positions), O^T back to [row][dim].
  if constexpr (kTransposedScores) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float lsum = l[e];
#pragma unroll
      for (int sh = 4; sh < 32; sh *= 2) lsum += __shfl_xor_sync(0xffffffffu, lsum, sh);
      if (g == 0) {
        sm.m[warp][2 * j + e] = m[e];
        sm.l[warp][2 * j + e] = lsum;
      }
    }
  }
#pragma unroll
  for (int rh = 0; rh < kHalves; ++rh) {
    if constexpr (!kTransposedScores) {
      float lsum = l[rh];
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
      if (j == 0) {
        sm.m[warp][rh * 8 + g] = m[rh];
        sm.l[warp][rh * 8 + g] = lsum;
      }
    }
    const int row = rh * 8 + 2 * j;
    // m-slot g of m-tile mt is dim 16 mt + g (16-bit V) or 16 mt + 2g (fp8); slot g + 8 is + 8 or + 2g + 1.
    const int dim_g = kFp8 ? 2 * g : g, dim_g8 = kFp8 ? 2 * g + 1 : g + 8;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      sm.o[warp][row][16 * mt + dim_g] = o[rh][mt][0];
      sm.o[warp][row + 1][16 * mt + dim_g] = o[rh][mt][1];
      sm.o[warp][row][16 * mt + dim_g8] = o[rh][mt][2];
      sm.o[warp][row + 1][16 * mt + dim_g8] = o[rh][mt][3];
    }
  }
  finish_split(a, w, sm);
  if (score_tile) finish_scores(a, w, scratch, s_listed);
}

}  // namespace detail
}  // namespace kvsift
