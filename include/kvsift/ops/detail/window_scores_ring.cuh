#pragma once
// The ring path of window_scores: Q and K of one 16-bit type, head_dim 64, 128 or 256, 16-byte aligned
// K rows (plan_window_scores chooses it; per-head score rows need a group G dividing 8). Same two
// passes and results as the general paths (window_scores_mma.cuh, window_scores_simt.cuh); the
// log-sum-exp partials have their own slots and merge (below).
//
// Why: the general tensor-core kernels load each 64-key tile and then compute on it, two barriers
// apart, 8 warps reading every K fragment from shared memory with two 32-bit loads per mma: measured
// at 51 TFLOP/s, 10x their bytes floor (ClusterAttn B=1, 128K). Here one operand stays in registers
// and the other streams through a cp.async ring of kStages slots of 64 rows, one barrier a tile; a
// slot holds its rows' 64-element column groups one after another, each row's 128 bytes XOR-swizzled
// by 16-byte chunk (WindowRing::at): the layout Hopper's wgmma reads through a 128-byte-swizzle
// descriptor, and one ldmatrix reads without bank conflicts. The logits (ring_logits) are mma.sync
// m16n8k16, or wgmma m64n64k16 under KVSIFT_WGMMA (sm_90a, kvsift's default target, unless KVSIFT_NO_WGMMA:
// detail/wgmma_ptx.cuh). ncu on the H200 (2026-12-05) found the mma.sync kernels at 168 registers, 3
// CTAs an SM, spilling, latency-bound at 178 TFLOP/s: what the wgmma form is for. A warp holds
// kWarpM x 16 resident rows: 32 for head_dim <= 128 (4 warps, one warpgroup), 16 for 256 (8 warps,
// two); m-tile m of warp w is rows 16 (kWarps m + w), so a warpgroup's 4 warps hold the 64 rows of one
// wgmma. Exponentials in base 2 (exp2f) on logits scaled by sm_scale x log2(e), one FMA each.
//
// Pass 1 (log-sum-exp), Q resident: a segment is 128 rows of one (sequence, KV head), seg = bh x row
// tiles + row tile; K streams by. Per row, a tile is one max over the thread's 16 logits, one rescale
// and 16 exponentials.
// - Up to a few waves of segments (SnapKV's and ClusterAttn's windows, W x G <= 128 rows: one segment
//   a head, at any batch): a persistent grid of at most window_ring_ctas_per_sm CTAs per SM; CTA c takes the tiles
//   [c N / grid, (c + 1) N / grid) of the N = segments x tiles, so every CTA gets within one tile of the
//   same work and the ring runs on across segment boundaries. A CTA's tiles of one segment fold into
//   one (max, sum) per row, written to slot c - (first CTA of that segment) of the row's partials
//   (plan.chunks slots; every CTA whose span touches the segment writes its slot, (-inf, 0) when it had
//   no live tile there); lse_merge_ring_kernel folds a row's slots in a fixed order, a warp per row.
// - Many waves of segments (H2O-prefill): a CTA per segment, over all the keys its rows see; one
//   slot. The last row tiles, which see the most keys, launch first.
// Tiles past what a segment's rows see are skipped by the producer and the consumer alike.
//
// Pass 2 (column sums):
// - One row tile per head, Q resident (column_sums_ring_kernel): the persistent grid over the heads'
//   key tiles, each CTA's span walked last tile first (pass 1's last reads are still in L2); per
//   tile, exp2(logit - lse) summed over the warp's rows (a warp reduction over the lanes of one query
//   head: with G dividing 8, row r = i G + g of a thread's fragments always has g = (lane / 4) % G),
//   then over the warps through shared memory, in a fixed order. The warps' sums of a tile are read
//   after the next tile's barrier (double-buffered): one barrier a tile.
// - Several row tiles, K resident (column_sums_keys_kernel): 128 keys a CTA, the rows that see them
//   streamed; see there.
//
// Masks cost nothing inside the sequence: a tile all of whose keys every row sees (and, for a paged
// view, all on pages of the pool) takes the unmasked code; only the tiles at the causal diagonal, a
// sequence's last tile and tiles with a bad page test each logit.

#include <cstdint>

#include "kvsift/core/dependent_launch.cuh"
#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/core/online_softmax.hpp"
#include "kvsift/ops/detail/kv_rows.cuh"
#include "kvsift/ops/detail/smem_ring_ptx.cuh"
#include "kvsift/ops/detail/window_scores_common.cuh"
#include "kvsift/ops/detail/window_scores_mma.cuh"
#include "kvsift/ops/detail/wgmma_ptx.cuh"

namespace kvsift {
namespace detail {

template <int D>
struct WindowRing {
  static constexpr int kWarpM = window_ring_warp_rows(D) / 16;  // m16 tiles (16 rows each) per warp
  static constexpr int kWarps = window_ring_warps(D);           // 4 or 8
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kCtasPerSm = window_ring_ctas_per_sm(D);
  static constexpr int kKeys = kWindowRingKeys;
  static constexpr int kRowBytes = 2 * D;
  static constexpr int kChunks = kRowBytes / 16;                 // 16-byte chunks per K row
  static constexpr int kStageBytes = kKeys * kRowBytes;
  static constexpr int kStages = window_ring_stages(D);
  static constexpr int kCopies = kKeys * kChunks / kThreads;     // 16-byte copies per thread per tile
  // A thread copies chunk tid % kChunks of the slot's rows tid / kChunks + i kCopyRows. kCopyRows is a
  // multiple of 8, so the swizzle puts copy i at copy 0's offset + i kCopyRows x 128 bytes.
  static constexpr int kCopyRows = kThreads / kChunks;
  static_assert(kCopyRows % 8 == 0 && kKeys / kCopyRows == kCopies, "a thread's copies share a swizzle phase");
  static constexpr int kRingBytes = int(window_ring_bytes(D));
  static constexpr int kFlagBytes = int(window_ring_flag_bytes(D));  // per slot: which keys were staged
  static_assert(kRingBytes == kStages * kStageBytes, "the plan's ring size is the kernels'");
  static_assert(kKeys * kChunks % kThreads == 0, "whole copies per thread");
  static_assert(kCtasPerSm <= window_ring_ctas_per_sm(64), "window_partials_per_row sizes for 64's CTAs per SM");
  static constexpr int kGroupBytes = kKeys * 128;  // one 64-element column group of a slot's rows
  // Byte offset of chunk c of key k inside a slot, and the first row of m-tile m of warp w
  // (window_scores_plan.hpp: the layout and the row order, checked on the host).
  static __device__ __forceinline__ unsigned at(int k, int c) { return unsigned(window_ring_chunk_offset(k, c)); }
  static __device__ __forceinline__ int row16(int m, int w) { return window_ring_row16(D, m, w); }
};

// 2^x in one MUFU.EX2 (ex2.approx.ftz: 2 ulp; -inf gives +0). exp2f also scales denormal arguments
// around the MUFU, a compare, two multiplies and a select per call: 467 of the 4174 static
// instructions of the log-sum-exp kernel's loop (head_dim 128, sm_90 SASS). The arguments here are
// <= 0 and the results are summed, so results below 2^-126 flushing to zero is far under the sums'
// fp32 rounding.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The ring's start in the dynamic shared memory: the next 1,024-byte boundary (the launches ask for
// kWindowRingAlign bytes more), where wgmma's swizzled operand groups must start.
__device__ __forceinline__ unsigned char* ring_smem_aligned(unsigned char* raw) {
  const unsigned at = unsigned(__cvta_generic_to_shared(raw));
  return raw + ((kWindowRingAlign - at % kWindowRingAlign) % kWindowRingAlign);
}

// Wait for this thread's copies up to the tile about to be read (all but the kPending newest groups),
// then for everyone's. The copies are generic-proxy writes; wgmma reads through the async proxy, so
// under KVSIFT_WGMMA each thread fences its writes for it first.
template <int kPending>
__device__ __forceinline__ void ring_tile_landed() {
  cp_async_wait<kPending>();
#if KVSIFT_WGMMA
  fence_proxy_async_shared();
#endif
  __syncthreads();
}

// A 16-byte aligned global address for the zero-filling copies (source size 0: nothing is read, but
// cp.async's 16-byte form wants an aligned operand): the query rows' base rounded down to 16 bytes,
// inside the same allocation for any allocator that aligns to 16 or more (cudaMalloc: 256).
template <class QT>
__device__ __forceinline__ const void* ring_dummy_source(const QT* data) {
  return reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(data) & ~std::uintptr_t(15));
}

// CTA of the persistent grid whose span holds item `item` of `n` (spans [c n / grid, (c + 1) n / grid)).
KVSIFT_HD inline int window_ring_cta_of(std::int64_t item, std::int64_t n, int grid) {
  return int(((item + 1) * grid - 1) / n);
}

// A thread's copies of a slot's rows row0 + tid / kChunks + i kCopyRows (chunk tid % kChunks), whose
// sources lie `step` bytes apart from `src` (the first one's chunk): copy i to dst + i kCopyRows x 128
// (dst: the first one's place), rows at or past `end` zero-filled from `dummy` (nothing is read). A
// slot whose rows all come before `end` (most) issues its copies without predicates. The adds are asm,
// which the compiler keeps: left to itself it forms each copy's address by a 64-bit multiply again.
template <class R>
__device__ __forceinline__ void ring_copy_stepped(unsigned dst, const void* src, std::uint64_t step, int row0, int end,
                                                  const void* dummy) {
  std::uint64_t at = reinterpret_cast<std::uint64_t>(src);
  if (row0 + R::kKeys <= end) {
#pragma unroll
    for (int i = 0; i < R::kCopies; ++i) {
      cp_async16(dst + unsigned(i * R::kCopyRows * 128), reinterpret_cast<const void*>(at), 16);
      asm("add.u64 %0, %0, %1;" : "+l"(at) : "l"(step));
    }
  } else {
    const int first = row0 + int(threadIdx.x) / R::kChunks;
#pragma unroll
    for (int i = 0; i < R::kCopies; ++i) {
      const bool ok = first + i * R::kCopyRows < end;
      cp_async16(dst + unsigned(i * R::kCopyRows * 128), ok ? reinterpret_cast<const void*>(at) : dummy, ok ? 16 : 0);
      asm("add.u64 %0, %0, %1;" : "+l"(at) : "l"(step));
    }
  }
}

// The K ring's producer: issue() fills a slot with keys key0 .. key0 + 63 of the head last set by
// to_head(bh), bh = b x Hkv + hk (zeros for keys past the sequence or on a page off the pool,
// recorded; flags say which were staged), and commits one cp.async group, an empty one once the span
// is done, so the consumer's wait counts stay fixed. Its cursor's walk (ring_produce) calls to_head
// when it enters a segment.
// Per tile, only what changes is computed. The head is kept from the segment before (two divisions
// every tile), and on an affine view (KvRows::kAffine: contiguous caches) the copies stop at the
// cursor's key_end, the end of the keys the segment's rows use, instead of the sequence's length (a
// dependent load that every tile's copies waited for): keys past it are masked or never written
// either way. A thread's copies (WindowRing::kCopyRows) land at immediate offsets from its first, and
// on an affine view their sources are kCopyRows rows apart: one add a copy. Forming each copy's
// address from (b, hk, key) took ~50 instructions a copy, 430 of the log-sum-exp kernel's ~1000 a tile
// (head_dim 128, sm_90a SASS).
template <int D, class View, class QT>
struct WindowRingProducer {
  using R = WindowRing<D>;
  using Rows = KvRows<View>;
  static_assert(!Rows::kAffine || kv_rows_always_in_pool<View>, "an affine view has every row");
  const View& kv;
  const WindowScoresLaunch& launch;
  const void* dummy;  // a valid global address for zero-filled copies (nothing is read)
  unsigned ring;      // shared-memory address of slot 0
  unsigned char* flags;
  int b = 0, hk = 0, len = 0;  // the head to_head set (and its length, for views not affine)
  // Affine views: this thread's first copy's source at key 0 of the head, and the bytes from one key's
  // row to the next (set by to_head; forming them from (b, hk) every tile took ~25 instructions).
  const char* k_src = nullptr;
  std::int64_t k_row_bytes = 0;

  __device__ void to_head(int bh) {
    b = bh / kv.num_kv_heads;
    hk = bh - b * kv.num_kv_heads;
    if constexpr (Rows::kAffine) {
      const Rows rows(kv, b, hk);
      const char* k0 = reinterpret_cast<const char*>(rows.k(0));
      k_row_bytes = reinterpret_cast<const char*>(rows.k(1)) - k0;
      k_src = k0 + k_row_bytes * (int(threadIdx.x) / R::kChunks) + int(threadIdx.x) % R::kChunks * 16;
    } else {
      len = kv.length(b);
    }
  }

  __device__ void issue(int key0, int key_end, bool live, int slot) {
    if (live) {
      const int ch = int(threadIdx.x) % R::kChunks, k_first = int(threadIdx.x) / R::kChunks;
      const unsigned dst = ring + unsigned(slot * R::kStageBytes) + R::at(k_first, ch);
      if constexpr (Rows::kAffine) {
        ring_copy_stepped<R>(dst, k_src + k_row_bytes * key0, std::uint64_t(k_row_bytes * R::kCopyRows), key0, key_end, dummy);
      } else {
        const Rows rows(kv, b, hk);
        int bad_key = -1;
#pragma unroll
        for (int i = 0; i < R::kCopies; ++i) {
          const int k = k_first + i * R::kCopyRows, key = key0 + k;
          const bool in = key < len;  // the view's rows past the sequence are not asked for
          typename Rows::Handle hd{};
          if (in) hd = rows.handle(key);
          const bool ok = in && rows.valid(hd);
          const void* src = ok ? static_cast<const void*>(reinterpret_cast<const char*>(rows.k_at(hd)) + ch * 16) : dummy;
          cp_async16(dst + unsigned(i * R::kCopyRows * 128), src, ok ? 16 : 0);
          if constexpr (!kv_rows_always_in_pool<View>) {
            if (ch == 0) flags[slot * R::kKeys + k] = ok;
            if (in && !ok) bad_key = key;
          }
        }
        if constexpr (!kv_rows_always_in_pool<View>)
          if (bad_key >= 0) record_bad_score_key(kv, launch, b, hk, bad_key);
      }
    }
    cp_async_commit();
  }
};

// One slot of the producer's walk: the cursor's tile (or an empty group once the span is done), then
// the cursor to its next live tile, and the producer to that tile's head when the segment changes.
// head_of maps the cursor's segment to its (sequence, KV head).
template <class Producer, class Cursor, class KeyEnd, class HeadOf>
__device__ __forceinline__ void ring_produce(Producer& producer, Cursor& cursor, int slot, const KeyEnd& key_end_of,
                                             const HeadOf& head_of) {
  const bool live = cursor.live();
  producer.issue(cursor.key0(), cursor.key_end, live, slot);
  if (live) {
    const int seg = cursor.seg;
    cursor.next(key_end_of);
    if (cursor.live() && cursor.seg != seg) producer.to_head(head_of(cursor.seg));
  }
}

// Logits of the warp's kWarpM x 16 rows (m-tile m: rows row16(m, warp) ..) against the 64 keys of a
// slot: acc[m][n][0..1] are (row g of the m-tile, keys 8 n + 2 t, + 1), acc[m][n][2..3] the same keys
// for row g + 8. Under KVSIFT_WGMMA each warpgroup runs kWarpM x D / 16 wgmma m64n64k16, A
// (its 64 rows of an m) from the registers, B from the slot; otherwise mma.sync m16n8k16 with
// ldmatrix B fragments. The same products; how wgmma adds them inside a k-step is unspecified, so the
// two builds may differ in the last bits.
template <int D, class QT>
__device__ __forceinline__ void ring_logits(unsigned slot, const std::uint32_t (&qa)[WindowRing<D>::kWarpM][D / 16][4],
                                           float (&acc)[WindowRing<D>::kWarpM][8][4]) {
  using R = WindowRing<D>;
#if KVSIFT_WGMMA
  auto fence_accumulators = [&] {
#pragma unroll
    for (int m = 0; m < R::kWarpM; ++m)
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) wgmma_fence_operand(acc[m][n][e]);
  };
  __syncwarp();  // .sync.aligned: the warp converged (every caller is CTA-uniform here)
  fence_accumulators();
  wgmma_fence();
  const std::uint64_t desc0 = wgmma_desc_k128(slot);
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
    const std::uint64_t desc = wgmma_desc_advance(desc0, unsigned((s / 4) * R::kGroupBytes + (s % 4) * 32));
#pragma unroll
    for (int m = 0; m < R::kWarpM; ++m)
      wgmma_m64n64k16_rs<is_bf16_storage<QT>::value>(reinterpret_cast<float(&)[32]>(acc[m]), qa[m][s], desc, s > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators();
#else
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int m = 0; m < R::kWarpM; ++m)
#pragma unroll
    for (int n = 0; n < 8; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.f;
  // One ldmatrix.x4 reads chunks 4 kp .. 4 kp + 3 of 8 keys: the B fragments of k-steps 2 kp, 2 kp + 1.
#pragma unroll
  for (int kp = 0; kp < R::kChunks / 4; ++kp)
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      std::uint32_t bf[4];
      ldmatrix_x4(bf, slot + R::at(8 * n + (lane & 7), 4 * kp + (lane >> 3)));
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2)
#pragma unroll
        for (int m = 0; m < R::kWarpM; ++m) mma_16816<QT>(acc[m][n], qa[m][2 * kp + h2], bf[2 * h2], bf[2 * h2 + 1]);
    }
#endif
}

// Bit 2 n + c: whether key 8 n + 2 t + c of the slot was staged (paged views; all ones otherwise).
template <class View>
__device__ __forceinline__ std::uint32_t ring_staged_mask(const unsigned char* slot_flags) {
  if constexpr (kv_rows_always_in_pool<View>) {
    (void)slot_flags;
    return 0xffffu;
  } else {
    const int t = threadIdx.x % 4;
    std::uint32_t mask = 0;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) mask |= std::uint32_t(slot_flags[8 * n + 2 * t + c] != 0) << (2 * n + c);
    return mask;
  }
}

// A warp's Q fragments for its rows of a segment of (b, hk) starting at row seg_row0: kWarpM m-tiles.
template <int D, class View, class QT>
__device__ __forceinline__ void ring_q_fragments(const View& kv, const QueryRows<QT>& q, const ScoreProblem& sp, int b,
                                                 int hk, int seg_row0, std::uint32_t (&qa)[WindowRing<D>::kWarpM][D / 16][4]) {
  const int warp = int(threadIdx.x / 32);
#pragma unroll
  for (int m = 0; m < WindowRing<D>::kWarpM; ++m)
    load_q_fragments<D>(kv, q, sp, b, hk, seg_row0 + WindowRing<D>::row16(m, warp), qa[m]);
}

// Pass 1: per (row, slot) the (max, sum) of the CTA's keys of that row's segment: kWindowRingRows rows
// of one (sequence, KV head), seg = bh x row_tiles + row tile.
template <int D, class View, class QT>
__global__ void __launch_bounds__(WindowRing<D>::kThreads, WindowRing<D>::kCtasPerSm)
    lse_partials_ring_kernel(View kv, QueryRows<QT> q, WindowScoresLaunch launch) {
  dependent_kernel_start();  // Exec::dependent_launch
  using R = WindowRing<D>;
  constexpr int M = R::kWarpM;
  extern __shared__ __align__(128) unsigned char ring_smem_raw[];
  unsigned char* const ring_smem = ring_smem_aligned(ring_smem_raw);
  const int hkv = kv.num_kv_heads, row_capacity = launch.plan.row_capacity, slots = launch.plan.chunks;
  const int row_tiles = (row_capacity + kWindowRingRows - 1) / kWindowRingRows;
  const int tiles = window_ring_tiles(launch.plan.max_length);
  const int bh_count = kv.batch * hkv;
  const std::int64_t n = std::int64_t(bh_count) * row_tiles * tiles;
  // The CTA's place in the spans. With a CTA per segment, launch order goes by row tile, last first,
  // the heads inside: the segments that see the most keys start first, on every head alike.
  // A CTA per segment: its span is its segment and its slot 0 (computed so, not by the products of
  // the general formula, which would pass 2^63 near 2.4e7 segments).
  const bool per_segment = std::int64_t(gridDim.x) == std::int64_t(bh_count) * row_tiles;
  int vb = int(blockIdx.x);
  if (per_segment) vb = vb % bh_count * row_tiles + (row_tiles - 1 - vb / bh_count);
  const std::int64_t begin = per_segment ? std::int64_t(vb) * tiles : vb * n / gridDim.x;
  const std::int64_t end = per_segment ? begin + tiles : (vb + 1) * n / gridDim.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const float c2 = launch.plan.scale * kLog2e;
  float2* partials = reinterpret_cast<float2*>(launch.scratch.partials);

  // Keys a segment's rows see: up to its last row's last key; none past the scored rows, or when the
  // head has nothing to score (its log-sum-exp is never read).
  auto key_end_of = [&](int seg) {
    const ScoreProblem sp = score_problem(kv, q, launch, seg / row_tiles / hkv);
    const int row0 = seg % row_tiles * kWindowRingRows;
    if (sp.prefix <= 0 || row0 >= sp.rows()) return 0;
    return sp.last_key(min(row0 + kWindowRingRows, sp.rows()) - 1) + 1;
  };
  auto view_head = [&](int seg) { return seg / row_tiles; };  // the cursor's segment as a (b, hk) for the producer
  WindowRingProducer<D, View, QT> producer{kv, launch, ring_dummy_source(q.data), unsigned(__cvta_generic_to_shared(ring_smem)),
                                                 ring_smem + R::kRingBytes};
  RingCursor<> prod(begin, end, tiles, key_end_of), cons(begin, end, tiles, key_end_of);
  if (prod.live()) producer.to_head(view_head(prod.seg));
  auto produce = [&](int slot) { ring_produce(producer, prod, slot, key_end_of, view_head); };
#pragma unroll
  for (int s = 0; s < R::kStages - 1; ++s) produce(s);

  // The consumer's segment, its rows' Q fragments and running (max, sum) in base 2.
  std::uint32_t qa[M][D / 16][4];
  ScoreProblem sp{};
  int cur_seg = -1, seg_row0 = 0;
  int seen_by_all = 0;  // the segment's first row's last key: the keys every row of it sees end there
  float m2[M][2], d[M][2];
  // Every segment in [first, last] of the span gets this CTA's slot written, live tiles or not.
  int next_flush = int(begin / tiles);
  const int last_seg = int((end - 1) / tiles);
  auto flush_until = [&](int stop) {
    for (; next_flush < stop; ++next_flush) {
      const int seg = next_flush, bh = seg / row_tiles;
      const int slot = per_segment ? 0 : vb - window_ring_cta_of(std::int64_t(seg) * tiles, n, gridDim.x);
      const bool mine = seg == cur_seg;
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = mine ? m2[m][h] : -INFINITY, sum = mine ? d[m][h] : 0.f;
          // The 4 lanes of a row hold disjoint keys: merge them in lane order (same bits on each lane).
#pragma unroll
          for (int off = 1; off < 4; off *= 2) {
            const float om = __shfl_xor_sync(0xffffffffu, mx, off), od = __shfl_xor_sync(0xffffffffu, sum, off);
            const bool upper = t & off;
            const float lo_m = upper ? om : mx, lo_d = upper ? od : sum, hi_m = upper ? mx : om, hi_d = upper ? sum : od;
            const float top = fmaxf(lo_m, hi_m);
            mx = top;
            sum = top == -INFINITY ? 0.f : lo_d * exp2_ftz(lo_m - top) + hi_d * exp2_ftz(hi_m - top);
          }
          const int row = seg % row_tiles * kWindowRingRows + R::row16(m, warp) + g + 8 * h;
          const int rows = mine ? sp.rows() : row_capacity;
          if (t == 0 && row < rows && slot >= 0 && slot < slots)
            partials[(std::int64_t(bh) * row_capacity + row) * slots + slot] = make_float2(mx * kLn2, sum);
        }
    }
  };

  for (int it = 0; cons.live(); ++it) {
    ring_tile_landed<R::kStages - 2>();  // everyone's copies of tile `it`; slot (it - 1) % kStages no longer read
    const int slot = it % R::kStages;
    constexpr bool kIssueFirst = kv_rows_always_in_pool<View>;  // else the copies wait on page lookups
    if constexpr (kIssueFirst) produce((it + R::kStages - 1) % R::kStages);
    if (cons.seg != cur_seg) {  // a new segment: flush the ones before it, take its rows
      flush_until(cons.seg);
      cur_seg = cons.seg;
      const int bh = cur_seg / row_tiles;
      seg_row0 = cur_seg % row_tiles * kWindowRingRows;
      sp = score_problem(kv, q, launch, bh / hkv);
      seen_by_all = sp.last_key(seg_row0);  // a division: once a segment, not once a tile
      ring_q_fragments<D>(kv, q, sp, bh / hkv, bh % hkv, seg_row0, qa);
#pragma unroll
      for (int m = 0; m < M; ++m) m2[m][0] = m2[m][1] = -INFINITY, d[m][0] = d[m][1] = 0.f;
    }
    float acc[M][8][4];
    ring_logits<D, QT>(producer.ring + unsigned(slot * R::kStageBytes), qa, acc);
    const int key0 = cons.key0();
    const std::uint32_t staged = ring_staged_mask<View>(producer.flags + slot * R::kKeys);
    // Every row of the segment sees every key of the tile (the segment's first row sees the fewest).
    const bool interior = key0 + R::kKeys - 1 <= seen_by_all && staged == 0xffffu;
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = seg_row0 + R::row16(m, warp) + g + 8 * h;
        if (!interior) {  // rows past the scored ones, keys a row does not see, keys not staged: -inf
          const bool row_ok = row < sp.rows();
          const int last = sp.last_key(row);
#pragma unroll
          for (int nn = 0; nn < 8; ++nn)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const bool ok = row_ok && key0 + 8 * nn + 2 * t + c <= last && ((staged >> (2 * nn + c)) & 1u);
              if (!ok) acc[m][nn][2 * h + c] = -INFINITY;
            }
        }
        float top = acc[m][0][2 * h];
#pragma unroll
        for (int nn = 0; nn < 8; ++nn) top = fmaxf(top, fmaxf(acc[m][nn][2 * h], acc[m][nn][2 * h + 1]));
        const float m_new = fmaxf(m2[m][h], top * c2);  // c2 > 0: the max of the scaled logits
        if (m_new == -INFINITY) continue;               // nothing seen yet
        float sum = 0.f;
#pragma unroll
        for (int nn = 0; nn < 8; ++nn)
#pragma unroll
          for (int c = 0; c < 2; ++c) sum += exp2_ftz(fmaf(acc[m][nn][2 * h + c], c2, -m_new));
        d[m][h] = d[m][h] * exp2_ftz(m2[m][h] - m_new) + sum;
        m2[m][h] = m_new;
      }
    if constexpr (!kIssueFirst) produce((it + R::kStages - 1) % R::kStages);
    cons.next(key_end_of);
  }
  cp_async_wait<0>();  // no copy outlives the CTA
  flush_until(last_seg + 1);
}

// Per scored row: fold its slots (the CTAs whose spans touched its segment) in slot order on each lane,
// then across the lanes in a fixed order; write the log-sum-exp. A warp per row.
template <class View, class QT>
__global__ void lse_merge_ring_kernel(View kv, QueryRows<QT> q, WindowScoresLaunch launch) {
  dependent_kernel_start();  // Exec::dependent_launch
  const int bh = blockIdx.y, b = bh / kv.num_kv_heads;
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  const ScoreProblem sp = score_problem(kv, q, launch, b);
  if (row >= sp.rows() || sp.prefix <= 0) return;  // warp-uniform
  const int tiles = window_ring_tiles(launch.plan.max_length), slots = launch.plan.chunks;
  const int row_tiles = (launch.plan.row_capacity + kWindowRingRows - 1) / kWindowRingRows;
  const std::int64_t n = std::int64_t(kv.batch) * kv.num_kv_heads * row_tiles * tiles;
  const std::int64_t seg = std::int64_t(bh) * row_tiles + row / kWindowRingRows;
  int used = 1;  // a CTA per segment
  if (std::int64_t(launch.plan.ring_grid) != std::int64_t(kv.batch) * kv.num_kv_heads * row_tiles) {
    const int first = window_ring_cta_of(seg * tiles, n, launch.plan.ring_grid);
    const int last = window_ring_cta_of(seg * tiles + tiles - 1, n, launch.plan.ring_grid);
    used = min(last - first + 1, slots);
  }
  const float2* partials = reinterpret_cast<const float2*>(launch.scratch.partials);
  const float2* mine = partials + (std::int64_t(bh) * launch.plan.row_capacity + row) * slots;
  SoftmaxState st;
  for (int s = lane; s < used; s += 32) {
    const float2 md = mine[s];
    SoftmaxState o;
    o.m = md.x;
    o.d = md.y;
    float fs, fo;
    st.merge(o, &fs, &fo);
  }
  st = merge_lanes_in_order<32>(st);
  if (lane == 0) launch.scratch.lse_rows[std::int64_t(bh) * launch.plan.row_capacity + row] = st.lse();
}

// One level of ring_warp_column_sums' reduce-scatter: lanes whose bit 2 kHalf is set keep the upper
// kHalf of v[0, 2 kHalf), the others the lower, each adding its partner's copy of what it keeps into
// v[0, kHalf). (A template, so v's indices are constants: a loop over the levels left v in local memory.)
template <int kHalf>
__device__ __forceinline__ void ring_column_sums_level(float (&v)[16], int lane) {
  const bool upper = lane & (2 * kHalf);
#pragma unroll
  for (int k = 0; k < kHalf; ++k) {
    const float send = upper ? v[k] : v[k + kHalf], keep = upper ? v[k + kHalf] : v[k];
    v[k] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * kHalf);
  }
}

// The column sums of all of a warp's rows (the mean over a group's heads) of a tile's weights acc
// (ring_logits' layout), into col[0 .. 63]. The 8 lanes of quad column t (lane bits 2-4) hold the same
// 16 columns 8 nn + 2 t + c of different rows: a reduce-scatter over those bits, halving the columns a
// lane holds at each of its 3 levels (8 + 4 + 2 shuffles), leaves lane (g, t) the sums of columns
// 8 g + 2 t and + 1. Reducing each of the 16 columns over all 3 bits took 48 shuffles, in a loop whose
// bound (the heads a sum covers) the compiler did not know: ~290 instructions a tile.
template <int M>
__device__ __forceinline__ void ring_warp_column_sums(const float (&acc)[M][8][4], float* col, int lane) {
  float v[16];  // v[2 nn + c]: column 8 nn + 2 t + c
#pragma unroll
  for (int nn = 0; nn < 8; ++nn)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float x = acc[0][nn][c] + acc[0][nn][2 + c];
#pragma unroll
      for (int m = 1; m < M; ++m) x += acc[m][nn][c] + acc[m][nn][2 + c];
      v[2 * nn + c] = x;
    }
  ring_column_sums_level<8>(v, lane);
  ring_column_sums_level<4>(v, lane);
  ring_column_sums_level<2>(v, lane);
  *reinterpret_cast<float2*>(col + 8 * (lane / 4) + 2 * (lane % 4)) = make_float2(v[0], v[1]);
}

// Pass 2: the column sums of exp(logit - lse) over the rows of each (sequence, KV head), for the keys of
// its scored prefix; per query head (kQueryHead, G dividing 8) or the mean of the group's heads.
template <int D, class View, class QT>
__global__ void __launch_bounds__(WindowRing<D>::kThreads, WindowRing<D>::kCtasPerSm)
    column_sums_ring_kernel(View kv, QueryRows<QT> q, WindowScoresLaunch launch) {
  dependent_kernel_start();  // Exec::dependent_launch
  using R = WindowRing<D>;
  constexpr int M = R::kWarpM;
  extern __shared__ __align__(128) unsigned char ring_smem_raw[];
  unsigned char* const ring_smem = ring_smem_aligned(ring_smem_raw);
  const WindowScoreParams& p = launch.params;
  const int hkv = kv.num_kv_heads, bh_count = kv.batch * hkv, group = q.num_heads / hkv;
  const bool per_head = p.heads == ScoreHeads::kQueryHead;
  const int heads_out = per_head ? group : 1;
  const int tiles = window_ring_tiles(launch.plan.cols < launch.plan.max_length ? launch.plan.cols
                                                                                : std::int64_t(launch.plan.max_length));
  const std::int64_t n = std::int64_t(bh_count) * tiles;
  const std::int64_t begin = blockIdx.x * n / gridDim.x, end = (blockIdx.x + 1) * n / gridDim.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const float c2 = launch.plan.scale * kLog2e;
  float* col = reinterpret_cast<float*>(ring_smem + R::kRingBytes);  // [2][warps][heads_out][64]
  auto col_at = [&](int buf, int w, int head) { return col + ((buf * R::kWarps + w) * heads_out + head) * R::kKeys; };

  auto key_end_of = [&](int bh) { return score_problem(kv, q, launch, bh / hkv).prefix; };
  WindowRingProducer<D, View, QT> producer{kv, launch, ring_dummy_source(q.data), unsigned(__cvta_generic_to_shared(ring_smem)),
                                                 ring_smem + R::kRingBytes + window_ring_col_bytes(D, heads_out)};
  // Backward over the same spans as the log-sum-exp pass (RingCursor): each CTA starts on the tiles
  // whose keys that pass read last.
  RingCursor<true> prod(begin, end, tiles, key_end_of), cons(begin, end, tiles, key_end_of);
  auto head_of = [](int seg) { return seg; };  // pass 2's segments are the heads
  if (prod.live()) producer.to_head(prod.seg);
  auto produce = [&](int slot) { ring_produce(producer, prod, slot, key_end_of, head_of); };
#pragma unroll
  for (int s = 0; s < R::kStages - 1; ++s) produce(s);

  std::uint32_t qa[M][D / 16][4];
  ScoreProblem sp{};
  int cur_bh = -1;
  float lse2[M][2];  // this thread's rows' log-sum-exp in base 2; +inf for rows past the scored ones
  // The head's first score row (per query head: the group's rows follow row_stride apart), set on
  // entering it: forming it from (b, hk) every tile took a division and 64-bit multiplies, ~50
  // instructions a tile. The mean divides by G, or multiplies by 1 / G where G is a power of two
  // (the same result, exactly).
  float* cur_out = nullptr;
  const float inv_group = 1.f / float(group);
  const bool group_pow2 = (group & (group - 1)) == 0;
  // The tile whose warp sums wait in col[buf] for the next barrier: its head's first score row, first
  // key, prefix.
  float* pend_out = nullptr;
  int pend_key0 = 0, pend_prefix = 0, pend_buf = 0;
  auto write_pending = [&] {
    if (pend_out == nullptr) return;
    for (int e = threadIdx.x; e < heads_out * R::kKeys; e += R::kThreads) {
      const int head = e / R::kKeys, k = e % R::kKeys, key = pend_key0 + k;
      if (key >= pend_prefix) continue;
      float total = 0.f;
      for (int w = 0; w < R::kWarps; ++w) total += col_at(pend_buf, w, head)[k];
      if (per_head) pend_out[head * launch.scores.row_stride + key] = total;
      else pend_out[key] = group_pow2 ? total * inv_group : total / float(group);
    }
  };

  for (int it = 0; cons.live(); ++it) {
    ring_tile_landed<R::kStages - 2>();  // tile `it`; slot (it - 1) % kStages and col[(it - 1) % 2] are complete
    const int slot = it % R::kStages;
    constexpr bool kIssueFirst = kv_rows_always_in_pool<View>;
    auto refill = [&] { produce((it + R::kStages - 1) % R::kStages); };
    if constexpr (kIssueFirst) refill();
    write_pending();
    if (cons.seg != cur_bh) {
      cur_bh = cons.seg;
      const int b = cur_bh / hkv, hk = cur_bh % hkv;
      sp = score_problem(kv, q, launch, b);
      cur_out = launch.scores.row(per_head ? std::int64_t(b) * q.num_heads + hk * group : std::int64_t(b) * hkv + hk);
      ring_q_fragments<D>(kv, q, sp, b, hk, 0, qa);
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = R::row16(m, warp) + g + 8 * h;
          float lse = INFINITY;
          if (row < sp.rows()) {
            const int i = row / sp.group, hq = hk * sp.group + row % sp.group;
            lse = p.lse ? p.lse[(std::int64_t(b) * q.num_heads + hq) * q.capacity + i]
                        : launch.scratch.lse_rows[std::int64_t(cur_bh) * launch.plan.row_capacity + row];
          }
          lse2[m][h] = lse * kLog2e;
        }
    }
    float acc[M][8][4];
    ring_logits<D, QT>(producer.ring + unsigned(slot * R::kStageBytes), qa, acc);
    const int key0 = cons.key0();
    const std::uint32_t staged = ring_staged_mask<View>(producer.flags + slot * R::kKeys);
    // Keys at or past the prefix are never written, so only the prefix's keys need every row to see them.
    const int last_scored = min(key0 + R::kKeys, sp.prefix) - 1;
    const bool interior = last_scored <= sp.len - sp.nq && staged == 0xffffu;
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int last = sp.last_key(R::row16(m, warp) + g + 8 * h);
#pragma unroll
        for (int nn = 0; nn < 8; ++nn)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float& x = acc[m][nn][2 * h + c];
            x = exp2_ftz(fmaf(x, c2, -lse2[m][h]));  // rows past the scored ones: lse +inf, so 0
            if (!interior && !(key0 + 8 * nn + 2 * t + c <= last && ((staged >> (2 * nn + c)) & 1u))) x = 0.f;
          }
      }
    // Column sums of the thread's rows, then over the lanes of one query head (or all of them).
    const int buf = it & 1;
    if (heads_out == 1) {
      ring_warp_column_sums(acc, col_at(buf, warp, 0), lane);
    } else {
#pragma unroll
      for (int nn = 0; nn < 8; ++nn)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float v = 0.f;
#pragma unroll
          for (int m = 0; m < M; ++m) v += acc[m][nn][c] + acc[m][nn][2 + c];
          for (int off = 4 * heads_out; off < 32; off *= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
          if (g < heads_out) col_at(buf, warp, g)[8 * nn + 2 * t + c] = v;
        }
    }
    pend_out = cur_out;
    pend_key0 = key0;
    pend_prefix = sp.prefix;
    pend_buf = buf;
    if constexpr (!kIssueFirst) refill();
    cons.next(key_end_of);
  }
  cp_async_wait<0>();
  __syncthreads();
  write_pending();
}

// Pass 2 when a head's rows span several row tiles (H2O-prefill, windows of more than 128 rows), the
// roles swapped: a CTA holds 128 keys of one (sequence, KV head) as mma A fragments (S^T = K Q^T, warp
// w's m-tile m the keys row16(m, w) ..), and streams the rows that see them through the ring, 64 a tile: their Q rows
// and log-sum-exps, copied with cp.async (16-byte aligned Q rows, plan: kRingColumnsK). A key's weight
// sum is a row sum of S^T, so each thread adds its keys' weights over every tile in registers and one
// quad reduction ends the CTA: no barrier but the ring's, nothing through shared memory per tile.
// Causality: the first row that sees key j is (j - (L - nq)) G; rows past the diagonal tile see every
// key of the block, so only the diagonal tiles and the last (partial) one test each weight. The grid
// is (heads, key blocks), launched heads first, so every head's first blocks, which have the most rows,
// start first.
template <int D, class View, class QT>
__global__ void __launch_bounds__(WindowRing<D>::kThreads, WindowRing<D>::kCtasPerSm)
    column_sums_keys_kernel(View kv, QueryRows<QT> q, WindowScoresLaunch launch) {
  dependent_kernel_start();  // Exec::dependent_launch
  using R = WindowRing<D>;
  constexpr int M = R::kWarpM;
  constexpr int kRows = R::kKeys;  // streamed rows per tile
  extern __shared__ __align__(128) unsigned char ring_smem_raw[];
  unsigned char* const ring_smem = ring_smem_aligned(ring_smem_raw);
  const WindowScoreParams& p = launch.params;
  const int hkv = kv.num_kv_heads, bh = blockIdx.x, b = bh / hkv, hk = bh % hkv;
  const ScoreProblem sp = score_problem(kv, q, launch, b);
  const int block_key0 = blockIdx.y * kWindowRingRows;
  if (block_key0 >= sp.prefix) return;  // block-uniform
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int group = sp.group;
  const bool per_head = p.heads == ScoreHeads::kQueryHead;
  const float c2 = launch.plan.scale * kLog2e;
  const unsigned ring = unsigned(__cvta_generic_to_shared(ring_smem));
  float* lse_ring = reinterpret_cast<float*>(ring_smem + R::kRingBytes);  // [kStages][64] natural-log lse

  // This thread's keys: key_of(m, h) = block_key0 + row16(m, warp) + g + 8 h; their K fragments
  // (zeros for keys past the sequence or off the pool) and which were staged.
  auto key_of = [&](int m, int h) { return block_key0 + R::row16(m, warp) + g + 8 * h; };
  std::uint32_t ka[M][D / 16][4];
  std::uint32_t staged = 0;  // bit 2 m + h
  {
    int bad_key = -1;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const std::uint16_t* rows[2] = {nullptr, nullptr};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int key = key_of(m, h);
        if (score_key_staged(kv, b, sp.len, key)) {
          rows[h] = reinterpret_cast<const std::uint16_t*>(kv.k_row(b, hk, key));
          staged |= 1u << (2 * m + h);
        } else if (key < sp.len) {
          bad_key = key;
        }
      }
#pragma unroll
      for (int s = 0; s < D / 16; ++s) {
        const int c = 16 * s + 2 * t;
        ka[m][s][0] = rows[0] ? pack_pair(rows[0] + c) : 0u;
        ka[m][s][1] = rows[1] ? pack_pair(rows[1] + c) : 0u;
        ka[m][s][2] = rows[0] ? pack_pair(rows[0] + c + 8) : 0u;
        ka[m][s][3] = rows[1] ? pack_pair(rows[1] + c + 8) : 0u;
      }
    }
    if constexpr (!kv_rows_always_in_pool<View>)
      if (bad_key >= 0) record_bad_score_key(kv, launch, b, hk, bad_key);
  }

  // The rows that see the block's first key, in tiles of 64 from the tile that holds the first one.
  const int first_row = max(0, block_key0 - (sp.len - sp.nq)) * group;
  const int tile_begin = first_row / kRows, tile_end = (sp.rows() + kRows - 1) / kRows;
  const float* lse_src = p.lse ? p.lse : launch.scratch.lse_rows;
  // Where G divides kCopyRows (a multiple of 8; every per-head call, and the mean over 1, 2, 4 or 8
  // heads), a tile's rows are whole positions and a thread's copies of them share its first row's
  // head: the thread's sources of tile 0 are fixed here, a tile adds 64 / G positions, a copy
  // kCopyRows / G (no division per copy or tile). Other groups (the mean over 3 or 6 heads) divide
  // per copy.
  const int ch = int(threadIdx.x) % R::kChunks, k_first = int(threadIdx.x) / R::kChunks;
  const bool stepped = R::kCopyRows % group == 0;
  const int tile_positions = kRows / group;  // stepped only
  const QT* q_first = q.row(b, k_first / group, hk * group + k_first % group) + ch * 8;
  const std::int64_t q_tile = std::int64_t(tile_positions) * q.position_stride;
  const std::uint64_t q_copy = std::uint64_t(R::kCopyRows / group) * std::uint64_t(q.position_stride) * sizeof(QT);
  auto lse_at = [&](int row) {
    return p.lse ? (std::int64_t(b) * q.num_heads + hk * group + row % group) * q.capacity + row / group
                 : std::int64_t(bh) * launch.plan.row_capacity + row;
  };
  const int lse_row = int(threadIdx.x) % kRows;  // the log-sum-exp a thread copies (threads < kRows)
  const std::int64_t lse_first = lse_at(lse_row);
  const int lse_tile = p.lse ? tile_positions : kRows;  // stepped only
  auto issue = [&](int tile, int slot) {
    if (tile < tile_end) {
      const unsigned dst = ring + unsigned(slot * R::kStageBytes) + R::at(k_first, ch);
      const int row0 = tile * kRows + k_first;
      if (stepped) {
        ring_copy_stepped<R>(dst, q_first + tile * q_tile, q_copy, tile * kRows, sp.rows(), ring_dummy_source(q.data));
      } else {
#pragma unroll
        for (int i = 0; i < R::kCopies; ++i) {
          const int row = row0 + i * R::kCopyRows;
          const bool ok = row < sp.rows();
          const void* src = ok ? static_cast<const void*>(q.row(b, row / group, hk * group + row % group) + ch * 8)
                               : ring_dummy_source(q.data);
          cp_async16(dst + unsigned(i * R::kCopyRows * 128), src, ok ? 16 : 0);
        }
      }
      if (threadIdx.x < kRows) {
        const int row = tile * kRows + lse_row;
        const bool ok = row < sp.rows();
        const std::int64_t at = !ok ? 0 : stepped ? lse_first + std::int64_t(tile) * lse_tile : lse_at(row);
        cp_async4(unsigned(__cvta_generic_to_shared(lse_ring + slot * kRows + lse_row)), lse_src + at, ok ? 4 : 0);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < R::kStages - 1; ++s) issue(tile_begin + s, s);

  // sum[m][h][c]: this thread's key (m, h) over the rows 8 n + 2 t + c of every tile: with G dividing 8
  // those rows all belong to query head (2 t + c) % G.
  float sum[M][2][2] = {};
  for (int tile = tile_begin, it = 0; tile < tile_end; ++tile, ++it) {
    ring_tile_landed<R::kStages - 2>();
    const int slot = it % R::kStages;
    issue(tile + R::kStages - 1, (it + R::kStages - 1) % R::kStages);
    float acc[M][8][4];
    ring_logits<D, QT>(ring + unsigned(slot * R::kStageBytes), ka, acc);
    const int row0 = tile * kRows;
    // Every row of the tile is scored and sees every key of the block (its first row sees the fewest).
    const bool interior = row0 + kRows <= sp.rows() && block_key0 + kWindowRingRows - 1 <= sp.last_key(row0);
    const float* lse = lse_ring + slot * kRows;
#pragma unroll
    for (int nn = 0; nn < 8; ++nn) {
      const float2 l = *reinterpret_cast<const float2*>(lse + 8 * nn + 2 * t);
      const float lse2[2] = {l.x * kLog2e, l.y * kLog2e};
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = exp2_ftz(fmaf(acc[m][nn][e], c2, -lse2[e % 2]));
          if (!interior) {
            const int row = row0 + 8 * nn + 2 * t + e % 2, key = key_of(m, e / 2);
            if (row >= sp.rows() || key > sp.last_key(row)) x = 0.f;
          }
          sum[m][e / 2][e % 2] += x;
        }
    }
  }
  cp_async_wait<0>();

  // Fold the quad: lanes t and t' hold the same query head where 2 t = 2 t' (mod G), i.e. t = t' (mod G / 2);
  // the mean over heads folds everything.
  const int heads_out = per_head ? group : 1;
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v0 = sum[m][h][0], v1 = sum[m][h][1];
      if (heads_out == 1) v0 += v1;
      const int lanes = heads_out <= 2 ? 4 : 8 / heads_out;  // lanes t of the quad sharing a head: 4, 2, 1
      for (int off = 4 / lanes; off < 4; off *= 2) {
        v0 += __shfl_xor_sync(0xffffffffu, v0, off);
        v1 += __shfl_xor_sync(0xffffffffu, v1, off);
      }
      const int key = key_of(m, h);
      if (key >= sp.prefix) continue;
      const bool ok = (staged >> (2 * m + h)) & 1u;  // a key off the pool: no attention
      if (heads_out == 1) {
        if (t == 0) launch.scores(std::int64_t(b) * hkv + hk, key) = ok ? v0 / float(group) : 0.f;
      } else if (2 * t < heads_out) {  // lane t holds heads 2 t and 2 t + 1
        launch.scores(std::int64_t(b) * q.num_heads + hk * group + 2 * t, key) = ok ? v0 : 0.f;
        if (2 * t + 1 < heads_out) launch.scores(std::int64_t(b) * q.num_heads + hk * group + 2 * t + 1, key) = ok ? v1 : 0.f;
      }
    }
}

}  // namespace detail
}  // namespace kvsift
