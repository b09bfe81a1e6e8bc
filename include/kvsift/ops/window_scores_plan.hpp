#pragma once
/// \file
/// \brief The launch plan of window_scores and the workspace queries of window_scores and
/// scored_prefix_lengths (contract in window_scores.hpp).
///
/// The CUDA passes are sized from shapes alone: the query rows a (sequence, KV head) can have (the
/// window queries of its G query heads, or every prompt position for H2O-prefill), the key chunks of
/// the log-sum-exp pass, both from params.max_length (or the view's capacity), never from the lengths
/// in device memory, so a call can be captured in a CUDA graph. The workspace holds the log-sum-exp
/// pass's per-(row, chunk) softmax partials and per-row results; nothing when the caller gives lse,
/// nothing for the host reference.
///
/// Three CUDA paths, chosen here: the ring path (16-bit Q and K of one type, head_dim 64/128/256,
/// 16-byte aligned K rows, and for one row per query head a group that divides 8;
/// detail/window_scores_ring.cuh), whose grid and partial slots follow the SM count; the general
/// tensor-core path (the same types otherwise); the CUDA-core path (everything else). The ring path's
/// column sums fall back to the general kernel (same log-sum-exp layout) when a head's rows span
/// several tiles and the query rows are not 16-byte aligned.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kvsift/core/check.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/query_rows.hpp"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/kv/row_alignment.hpp"
#include "kvsift/ops/window_scores.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kLseKeyChunk = 2048;  // keys per block of the general paths' log-sum-exp pass

// The ring path: rows per segment (a CTA's resident rows), keys (or streamed rows) per ring tile, and
// CTAs per SM it is sized for (head_dim 64 and 128: 4 warps of 32 rows, 3 CTAs by registers; 256: 8
// warps of 16 rows, one CTA by registers and shared memory). window_partials_per_row assumes no
// head_dim takes more than 64's. Head_dim 128 as 8 warps of 16 rows (113-128 registers, 2 CTAs: 16
// warps an SM instead of 12) was slower: the column sums 122 -> 136 us, ClusterAttn B=8 +12% (H100,
// docs/performance.md, twenty-fifth session); each tile's fixed work is paid by twice the warps.
// The column sums with two tiles in flight (the next tile's wgmma under this one's exponentials, two
// accumulator sets: ~250 registers, 2 CTAs) were slower still: 122 -> 150 us (ncu), the engine-LSE
// window scores 128 -> 143 us, and 137 with the same 2 CTAs and no overlap (H100, twenty-sixth
// session). A warp's tile is a chain of fixed-latency waits (MUFU, shuffles, the barrier) that the
// third CTA's warps hide and an overlapped wgmma does not.
inline constexpr int kWindowRingRows = 128;
inline constexpr int kWindowRingKeys = 64;
KVSIFT_HD constexpr int window_ring_ctas_per_sm(int head_dim) { return head_dim <= 128 ? 3 : 1; }
KVSIFT_HD constexpr int window_ring_warp_rows(int head_dim) { return head_dim <= 128 ? 32 : 16; }  // resident rows a warp
KVSIFT_HD constexpr int window_ring_warps(int head_dim) { return kWindowRingRows / window_ring_warp_rows(head_dim); }
// Ring slots: 2-3 tiles in flight per CTA; with 3 CTAs an SM (head_dim <= 128) that is 100+ KiB per SM,
// three times the ~33 KiB that one microsecond of HBM latency at an SM's share of 4.4 TB/s asks for.
KVSIFT_HD constexpr int window_ring_stages(int head_dim) { return head_dim == 128 ? 3 : 4; }

// A ring slot's layout (detail/window_scores_ring.cuh): byte offset of 16-byte chunk c of row k (a key,
// or a streamed query row) of a slot of kWindowRingKeys rows. The row's 64-element column groups lie
// one after another (kWindowRingKeys rows of 128 bytes each), chunk c % 8 of a 128-byte row at
// (c % 8) ^ (k % 8): the layout Hopper's wgmma reads through a 128-byte-swizzle descriptor (groups of 8
// rows 1,024 bytes apart), and 8 rows of one chunk (an ldmatrix) fall on 8 different bank quads.
KVSIFT_HD constexpr int window_ring_chunk_offset(int k, int c) {
  return (c >> 3) * (kWindowRingKeys * 128) + k * 128 + (((c & 7) ^ (k & 7)) << 4);
}
// First row of m-tile m (16 rows) of warp w among a CTA's kWindowRingRows resident rows: the m-tiles of
// one m go to the warps in order, so each 4-warp warpgroup holds 64 consecutive rows (a wgmma's M).
KVSIFT_HD constexpr int window_ring_row16(int head_dim, int m, int w) { return 16 * (window_ring_warps(head_dim) * m + w); }

// Dynamic shared memory of the ring path's kernels at head_dim d: the ring of K (or Q) tiles, plus the
// staged-key flags (log-sum-exp), plus the flags and the double-buffered per-warp column sums of
// heads_out rows a head (Q-resident column sums), or plus the streamed rows' log-sum-exps (K-resident).
KVSIFT_HD constexpr std::size_t window_ring_bytes(int d) { return std::size_t(window_ring_stages(d)) * kWindowRingKeys * 2 * d; }
KVSIFT_HD constexpr std::size_t window_ring_flag_bytes(int d) { return std::size_t(window_ring_stages(d)) * kWindowRingKeys; }
KVSIFT_HD constexpr std::size_t window_ring_col_bytes(int d, int heads_out) {
  return std::size_t(2) * window_ring_warps(d) * heads_out * kWindowRingKeys * sizeof(float);
}
KVSIFT_HD constexpr std::size_t window_ring_lse_bytes(int d) {
  return std::size_t(window_ring_stages(d)) * kWindowRingKeys * sizeof(float);
}
// The ring starts on a 1,024-byte boundary (wgmma's swizzled operands, detail/wgmma_ptx.cuh): every
// launch asks for this much more, the kernels skip to the boundary.
inline constexpr int kWindowRingAlign = 1024;
// The most any of them takes.
KVSIFT_HD constexpr std::size_t window_ring_max_smem(int d, int heads_out) {
  const std::size_t q_resident = window_ring_flag_bytes(d) + window_ring_col_bytes(d, heads_out);
  return kWindowRingAlign + window_ring_bytes(d) +
         (q_resident > window_ring_lse_bytes(d) ? q_resident : window_ring_lse_bytes(d));
}

// Q and K of one 16-bit type (bf16 or fp16, CUDA's or kvsift's spelling): the tensor-core paths apply.
template <class View, class QT>
constexpr bool window_scores_tensor_core_types() {
  using KT = std::remove_const_t<typename View::value_type>;
  using Q = std::remove_const_t<QT>;
  return sizeof(KT) == 2 && sizeof(Q) == 2 && dtype_traits<KT>::dtype == dtype_traits<Q>::dtype;
}

inline int window_rows_capacity(const WindowScoreParams& p, int max_length, int q_capacity, int group) {
  const int nq = p.num_queries == kAllQueries ? max_length : p.num_queries;
  return (nq < q_capacity ? nq : q_capacity) * group;
}

template <class View>
int window_max_length(const View& kv, const WindowScoreParams& p) {
  return p.max_length > 0 ? p.max_length : kv_capacity(kv);
}

// What the CUDA passes need besides the contract's views and params.
struct WindowScorePlan {
  std::int64_t cols = 0;  // scores.cols
  float scale = 0.f;      // resolved sm_scale
  int max_length = 0;     // launch bound on the prompt length
  int row_capacity = 0;   // query rows per (sequence, KV head): nq * G
  int chunks = 0;         // log-sum-exp partials per row: key chunks, or the ring path's slots
  int tensor_cores = 0;   // head_dim of a tensor-core path (64, 128 or 256), 0 for the CUDA cores
  int ring_grid = 0;      // the ring path's log-sum-exp grid (0: the general paths)
  int ring_columns = 0;   // the ring path's column sums: kRingColumnsQ, kRingColumnsK or 0 (general)
};

// The ring path's column-sum kernels: Q resident, keys streamed (one row tile per head), or K resident,
// rows streamed (several row tiles: H2O-prefill, large windows; needs 16-byte aligned Q rows).
inline constexpr int kRingColumnsQ = 1;
inline constexpr int kRingColumnsK = 2;

// Tiles of kWindowRingKeys keys a ring pass covers per (sequence, KV head), for keys [0, keys).
KVSIFT_HD inline int window_ring_tiles(std::int64_t keys) { return int((keys + kWindowRingKeys - 1) / kWindowRingKeys); }

// A walk over the live tiles of a CTA's span [begin, end) of items seg x tiles + tile: a tile is live
// when its first key is below the segment's key_end (pass 1: what its rows see; pass 2: the head's
// scored prefix), so a segment's live tiles are a prefix of its tiles. A segment is one row tile of one
// (sequence, KV head): seg = bh x row tiles + row tile (pass 2: seg = bh). The position is kept as
// (seg, tile) and stepped without 64-bit divisions (the span's bounds are divided once); key_end is
// asked only for segments inside the span, so no length past the batch is read.
// kBackward walks the same tiles last to first: the column sums (pass 2) share the log-sum-exp pass's
// spans, and a CTA that starts where its pass-1 span ended finds some of those tiles' keys, the last
// ones pass 1 read, still in L2. Measured on an H100 (2026-12-05): paged rows 2-3% faster than the
// forward walk, contiguous ones within 1%.
// On entering a segment the cursor works out the last tile it walks there (`bound`: forward the end,
// backward the first), so a step is a compare and an add, and live() one compare. Testing the span's
// ends and the key bound on every step took ~60 instructions a tile in the column sums (ncu source
// counters, H100, 2026-12-05), 10% of its stall samples.
template <bool kBackward = false>
struct RingCursor {
  int seg = 0, tile = 0, key_end = 0;
  int stop_seg = 0, stop_tile = 0;  // the span's end (exclusive) forward, its begin (inclusive) backward
  int tiles = 1;
  int bound = 0;  // the segment's walk: forward tiles [tile, bound), backward [bound, tile]

  template <class KeyEnd>
  KVSIFT_HD RingCursor(std::int64_t begin, std::int64_t end, int tiles_, const KeyEnd& key_end_of) : tiles(tiles_) {
    if constexpr (kBackward) {
      stop_seg = int(begin / tiles_);
      stop_tile = int(begin % tiles_);
      if (end > begin) enter(int((end - 1) / tiles_), int((end - 1) % tiles_), key_end_of);
      else enter(stop_seg, stop_tile - 1, key_end_of);  // an empty span: not live
    } else {
      stop_seg = int(end / tiles_);
      stop_tile = int(end % tiles_);
      enter(int(begin / tiles_), int(begin % tiles_), key_end_of);
    }
  }
  KVSIFT_HD bool live() const {
    if constexpr (kBackward) return tile >= bound;
    else return tile < bound;
  }
  KVSIFT_HD int key0() const { return tile * kWindowRingKeys; }
  template <class KeyEnd>
  KVSIFT_HD void next(const KeyEnd& key_end_of) {
    if constexpr (kBackward) {
      if (--tile < bound) enter(seg - 1, tiles - 1, key_end_of);
    } else {
      if (++tile >= bound) enter(seg + 1, 0, key_end_of);
    }
  }

 private:
  // To the first live tile at or past (s, t) in the walk's direction; not live once the span is done
  // (no key_end asked there).
  template <class KeyEnd>
  KVSIFT_HD void enter(int s, int t, const KeyEnd& key_end_of) {
    for (;;) {
      seg = s;
      tile = t;
      if constexpr (kBackward) {
        const int span_lo = s == stop_seg ? stop_tile : 0;  // the span's first tile of s
        if (s < stop_seg || t < span_lo) {
          bound = t + 1;
          return;
        }
        key_end = key_end_of(s);
        const int last_live = window_ring_tiles(key_end) - 1;
        if (last_live >= span_lo) {
          tile = t < last_live ? t : last_live;
          bound = span_lo;
          return;
        }
        s -= 1;
        t = tiles - 1;
      } else {
        const int span_hi = s < stop_seg ? tiles : s == stop_seg ? stop_tile : 0;  // past the span's last tile of s
        if (t >= span_hi) {
          bound = t;
          return;
        }
        key_end = key_end_of(s);
        const int live_tiles = window_ring_tiles(key_end);
        const int live_hi = live_tiles < span_hi ? live_tiles : span_hi;
        if (t < live_hi) {
          bound = live_hi;
          return;
        }
        s += 1;
        t = 0;
      }
    }
  }
};

// One wave of the ring path's CTAs.
inline std::int64_t window_ring_wave(int num_sms, int head_dim) {
  return std::int64_t(num_sms) * window_ring_ctas_per_sm(head_dim);
}

// The persistent grid for `items` tiles: one wave, at most one CTA per tile.
inline int window_ring_grid(std::int64_t items, int num_sms, int head_dim) {
  const std::int64_t wave = window_ring_wave(num_sms, head_dim);
  return int(items < wave ? items : wave);
}

// Whether every scored query row can be copied in 16-byte pieces (the K-resident column sums).
template <class QT>
bool query_rows_16byte_aligned(const QueryRows<QT>& q) {
  constexpr std::int64_t e = 16 / std::int64_t(sizeof(QT));
  return reinterpret_cast<std::uintptr_t>(q.data) % 16 == 0 && q.batch_stride % e == 0 && q.position_stride % e == 0 &&
         q.head_stride % e == 0;
}

template <class View, class QT>
WindowScorePlan plan_window_scores(const View& kv, const QueryRows<QT>& q, const WindowScoreParams& p,
                                   const StridedView2D<float>& scores, const DeviceFacts& device) {
  const int num_sms = device.num_sms;
  WindowScorePlan plan;
  plan.cols = scores.cols;
  plan.scale = resolve_sm_scale(p.sm_scale, kv.head_dim);
  plan.max_length = window_max_length(kv, p);
  const int group = kv.num_kv_heads > 0 ? q.num_heads / kv.num_kv_heads : 0;
  plan.row_capacity = window_rows_capacity(p, plan.max_length, q.capacity, group);
  plan.chunks = (plan.max_length + kLseKeyChunk - 1) / kLseKeyChunk;
  const int d = kv.head_dim;
  if constexpr (window_scores_tensor_core_types<View, QT>())
    if ((d == 64 || d == 128 || d == 256) && check_rows_16byte_aligned(kv).ok()) plan.tensor_cores = d;
  // The ring path keeps a query head's rows on fixed lanes (row % G = lane / 4 % G, or (2 (lane % 4) + c)
  // % G, when G divides 8) so that per-head column sums stay register and warp reductions.
  const bool heads_fit = p.heads == ScoreHeads::kKvHeadMean || (group > 0 && 8 % group == 0);
  // Its kernels' shared memory must fit a block's opt-in (head_dim 256 takes up to 160 KiB: not on
  // parts with 99 KiB); 0, unknown, keeps the general path.
  const int heads_out = p.heads == ScoreHeads::kQueryHead ? group : 1;
  const bool smem_fits = plan.tensor_cores && heads_out <= 8 && window_ring_max_smem(d, heads_out) <= device.max_smem_optin;
  const std::int64_t bh = std::int64_t(kv.batch) * kv.num_kv_heads;
  if (smem_fits && heads_fit && num_sms > 0 && bh > 0 && plan.max_length > 0 && plan.row_capacity > 0) {
    // Log-sum-exp: segments of kWindowRingRows rows of one (sequence, KV head). Up to a few waves of
    // segments (the window queries, at any batch): CTA c takes tiles [c N / grid, (c + 1) N / grid) of
    // the N = segments x tiles, so a segment is touched by at most grid / segments + 2 CTAs (and at
    // most its tiles), each writing one partial per row into its own slot. Many waves of segments
    // (H2O-prefill, whose causal segments see from 1 to all tiles, so equal spans of tiles would be
    // unequal work): a CTA per segment, all of its keys, one slot, the hardware balancing the waves.
    const std::int64_t segments = bh * ((plan.row_capacity + kWindowRingRows - 1) / kWindowRingRows);
    const int tiles = window_ring_tiles(plan.max_length);
    const std::int64_t many_waves = 4 * window_ring_wave(num_sms, d);
    if (segments >= many_waves && segments <= 0x7fffffff) {
      plan.ring_grid = int(segments);
      plan.chunks = 1;
    } else if (segments < many_waves) {
      plan.ring_grid = window_ring_grid(segments * tiles, num_sms, d);
      const std::int64_t slots = plan.ring_grid / segments + 2;
      plan.chunks = int(slots < tiles ? slots : tiles);
    }
    // The K-resident grid is (heads, 128-key blocks): at most 65535 blocks of keys.
    const bool k_blocks_fit = (std::int64_t(plan.max_length) + kWindowRingRows - 1) / kWindowRingRows <= 65535;
    if (plan.ring_grid > 0)
      plan.ring_columns = plan.row_capacity <= kWindowRingRows              ? kRingColumnsQ
                          : query_rows_16byte_aligned(q) && k_blocks_fit ? kRingColumnsK
                                                                          : 0;
  }
  return plan;
}

// Scratch of the CUDA path: per (row, key chunk or slot) softmax partials (max, sum) and per row the
// merged log-sum-exp. Nothing when the caller supplies lse.
struct WindowScoreScratch {
  float* partials = nullptr;  // pairs
  float* lse_rows = nullptr;
};

// Partials per row that any path may use: the general paths' key chunks or the ring path's slots at
// its most CTAs per SM (segments >= bh, so bh bounds its slots). Independent of the element types and
// head_dim, so a query made with stand-in views of the right shapes (as the compression policies make
// it) sizes every path.
inline std::int64_t window_partials_per_row(int max_length, std::int64_t bh, int num_sms) {
  const std::int64_t chunks = (max_length + kLseKeyChunk - 1) / kLseKeyChunk;
  const std::int64_t tiles = window_ring_tiles(max_length);
  std::int64_t slots = std::int64_t(num_sms) * window_ring_ctas_per_sm(64) / (bh > 0 ? bh : 1) + 2;
  if (slots > tiles) slots = tiles;
  return chunks > slots ? chunks : slots;
}

template <class View>
WindowScoreScratch carve_window_scores(WorkspaceCarver& ws, const View& kv, const WindowScoreParams& p,
                                       const WindowScorePlan& plan, int num_sms) {
  WindowScoreScratch s;
  if (p.lse || plan.max_length <= 0 || plan.row_capacity <= 0) return s;
  const std::int64_t bh = std::int64_t(kv.batch) * kv.num_kv_heads;
  const std::size_t rows = std::size_t(bh) * plan.row_capacity;
  s.partials = ws.take<float>(rows * std::size_t(window_partials_per_row(plan.max_length, bh, num_sms)) * 2);
  s.lse_rows = ws.take<float>(rows);
  return s;
}

}  // namespace detail

/// Scratch memory window_scores needs, from shapes alone (no device memory touched): 0 when
/// params.lse is given and for the host reference; otherwise the log-sum-exp pass's partials, sized
/// from params.max_length (or the view's capacity), q.capacity, the head counts and, on the window
/// path, exec.device.num_sms. kNullPointer for a null `bytes`; kInvalidArgument for a CUDA Exec
/// without its device facts.
template <class Exec, class View, class QT>
Status window_scores_workspace_bytes(const Exec& exec, const View& kv, const QueryRows<QT>& q,
                                     const WindowScoreParams& params, const StridedView2D<float>& scores,
                                     std::size_t* bytes) {
  (void)exec;
  (void)kv;
  (void)q;
  (void)params;
  (void)scores;
  KVSIFT_REQUIRE_NOT_NULL(bytes, "bytes");
  *bytes = 0;
  if constexpr (!is_host_exec<Exec>::value) {
    KVSIFT_TRY(exec.device.validate("window_scores"));
    WorkspaceCarver ws(nullptr, 0);
    detail::carve_window_scores(ws, kv, params, detail::plan_window_scores(kv, q, params, scores, exec.device),
                                exec.device.num_sms);
    *bytes = ws.required_bytes();
  }
  return Status();
}

/// scored_prefix_lengths needs no scratch on either backend: `*bytes` = 0 (kNullPointer for a null
/// `bytes`).
template <class Exec, class View>
Status scored_prefix_lengths_workspace_bytes(const Exec&, const View&, int /*window*/, int /*heads_per_sequence*/,
                                             std::int64_t /*cols*/, const std::int32_t* /*row_lengths*/,
                                             std::size_t* bytes) {
  KVSIFT_REQUIRE_NOT_NULL(bytes, "bytes");
  *bytes = 0;
  return Status();
}

}  // namespace kvsift
