#pragma once
/// \file
/// \brief The split-KV plan of decode_attention and its workspace query (contract in decode_attention.hpp).
///
/// The CUDA launcher runs one block per (batch, KV head, split, row tile): every head's keys are cut
/// into splits of `chunk` tokens so that about one wave of kDecodeCtasPerSm blocks per SM covers the
/// whole call (a head gets one split when its blocks alone fill the GPU), and when some head has more
/// than one split a second, dependent kernel combines the splits' partial softmax states by
/// log-sum-exp (its grid is planned here too). The plan is a pure function
/// of host values (shapes, capacities, roles, the Exec's SM count), so the workspace query and the
/// launcher agree by construction, and a captured graph replays for any device lengths.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kvsift/core/check.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/online_softmax.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/ops/decode_attention.hpp"

namespace kvsift {
namespace detail {

inline constexpr int kDecodeCtaTokens = 64;    ///< tokens one block consumes per step (4 warps x 16)
inline constexpr int kDecodeMaxChunk = 32768;  ///< bounds the block-max scratch in shared memory
/// Splits per head at most: every split costs a partial written and read back through L2. Measured on
/// the H200, 1 retrieval + 7 sparse heads, B = 1, 128K (with an earlier merge done by the head's last
/// block): ~300 splits 80.8 us, at most 128 splits 61.2 us, at most 64 69.4 us. With the merge kernel,
/// 256 and 512 were measured again, since a layer with one or two retrieval heads then leaves half its
/// block slots empty (177 blocks of 396 at B = 1, 128K, each streaming 16 stages): the same times or
/// 1-2.5% slower in bench_decode_attention, and LycheeDecode's decode step at 128K within noise
/// (docs/performance.md, twenty-seventh, thirtieth and thirty-seventh sessions). A lone 128K head takes
/// the same time in 128 blocks as in 342: such calls are their bytes at the read ceiling plus a fixed
/// cost per call, whatever the block count (forty-first session).
inline constexpr int kDecodeMaxSplits = 128;
/// What one position of a token-gathered sparse head costs a split, against one of a retrieval head's
/// contiguous tokens: each gathered row is its own random 256-byte read, and a stage of them takes
/// ~1.5x as long (H200, batch 8: 4.5 us per 64-row stage of a 4096-token gather against 3.0 us per stage
/// of dense 32K streaming). Block-gathered heads (block size > 1) stream runs and count 1.
inline constexpr double kDecodeTokenGatherCost = 1.5;
/// Backfill (DecodePlan::backfill) is built and tested but off: on an H100 it was 0.5-1% slower in two
/// runs, and its premise (a block streams at a pace of its own, so too few blocks cannot hold HBM's
/// rate) is refuted there (docs/performance.md, fortieth and forty-first sessions). An H200 A/B is the
/// one measurement left; a build with KVSIFT_DECODE_BACKFILL=1 plans it (docs/ops/decode_attention.md).
#ifndef KVSIFT_DECODE_BACKFILL
#define KVSIFT_DECODE_BACKFILL 0
#endif
inline constexpr bool kDecodeBackfill = KVSIFT_DECODE_BACKFILL != 0;
/// Backfill: a one-wave mixed plan whose sparse blocks are shorter than this
/// share of its retrieval blocks (cost-weighted) is replanned, since its wave thins out when the sparse
/// blocks end and the retrieval blocks stream the rest alone (the thirty-ninth session's reason, that
/// too few blocks then fall below HBM's rate, did not survive the forty-first).
inline constexpr double kDecodeBackfillRatio = 0.75;
/// Positions per split of a sparse head in a backfilling plan: short, so that the blocks the retrieval
/// heads leave free keep turning over to the end of the call (a 64-position stage is one ring step).
inline constexpr int kDecodeBackfillChunk = 512;
/// Splits one merge thread reads with all its loads in flight (the merge is a chain of L2 round trips).
inline constexpr int kDecodeMergeBatch = 16;
/// Threads of a merge block.
inline constexpr int kDecodeMergeThreads = 128;
/// Splits per head that merge inside a thread-block cluster (DecodePlan::cluster): the portable
/// cluster size, so a cluster always fits one GPC.
inline constexpr int kDecodeMaxClusterSplits = 8;

/// Ring depth of the tensor-core kernel and the blocks per SM it is sized for (its launch bounds),
/// by the bytes of one K or V row (head_dim x element size). Measured on the H200 with 256-byte rows
/// (bf16, d 128): two 32 KiB stages with three blocks per SM match three stages with two blocks on
/// dense calls and are 10% faster on token gathers (more blocks hide the index and block-table
/// loads); one block with four stages was 20-60% slower. 128-byte rows (bf16 d 64, fp8 d 128) take
/// four stages in the same shared memory; 512-byte rows (bf16 d 256) leave room for one block.
constexpr int decode_stages(int row_bytes) { return row_bytes <= 128 ? 4 : row_bytes <= 256 ? 2 : 3; }
template <int RowBytes>
inline constexpr int kDecodeStages = decode_stages(RowBytes);
/// Blocks resident per SM the split plan assumes (see kDecodeStages). Three blocks cap a thread at 170
/// registers, which head_dim 256 (fp8) overflows by ~250 bytes of spills, so it takes two.
constexpr int decode_mma_ctas_per_sm(int row_bytes, int head_dim) { return row_bytes > 256 ? 1 : head_dim >= 256 ? 2 : 3; }
template <int RowBytes, int D>
inline constexpr int kDecodeCtasPerSm = decode_mma_ctas_per_sm(RowBytes, D);

/// kDecodeCtasPerSm for run-time sizes; the CUDA-core kernel (float K/V) plans for two.
inline int decode_ctas_per_sm(bool tensor_cores, int head_dim, int row_bytes) {
  return tensor_cores ? decode_mma_ctas_per_sm(row_bytes, head_dim) : 2;
}

/// The tensor-core kernel serves 16-bit and fp8 K/V (fp8 is widened to fp16 in registers); float K/V
/// take the CUDA-core kernel.
template <class View>
constexpr bool decode_uses_tensor_cores() {
  using KT = std::remove_const_t<typename View::value_type>;
  return sizeof(KT) == 2 || is_fp8_dtype<KT>::value;
}

struct DecodePlan {
  int batch = 0, num_kv_heads = 0, group = 0, head_dim = 0;
  int max_len = 0;        ///< tokens a retrieval head covers
  int sparse_tokens = 0;  ///< positions a sparse head covers: index capacity * block size
  int rows = 0;           ///< query rows per KV head: q_len * group, plus the score row
  int row_tile = 0;       ///< rows per block (8 or 16)
  int row_tiles = 0;
  int num_retrieval = 0, num_sparse = 0;
  int chunk = 0;          ///< tokens per split of a retrieval head (a multiple of kDecodeCtaTokens and of the score block)
  int sparse_chunk = 0;   ///< positions per split of a sparse head (a multiple of kDecodeCtaTokens and of the index block)
  int retrieval_splits = 0, sparse_splits = 0;
  int ctas_per_tile = 0;  ///< grid.x: num_retrieval * retrieval_splits + num_sparse * sparse_splits
  int score_cols = 0;     ///< entries per score row (0 without scores)
  /// The merge kernel (when merge_kernel()): merged heads = the heads of each role that has more than one
  /// split; every merged head's R x head_dim / 4 output float4s are cut into merge_blocks_per_head
  /// blocks, and each output float4 is merged by merge_parts threads (a power of two, each reading at
  /// most kDecodeMergeBatch splits, so a thread's loads are all in flight at once).
  int merged_heads = 0, merge_parts = 1, merge_blocks_per_head = 0;
  /// When > 1: every head of the call has exactly `cluster` splits, the splits of a head form one
  /// thread-block cluster, and they merge through distributed shared memory at the end of the split
  /// kernel: no partials in the workspace and no merge kernel. Planned for small calls (one block per
  /// SM at most), where the merge kernel's launch, the partials' round trip through L2 and the wait for
  /// the whole grid were a fixed cost comparable to the call itself.
  int cluster = 0;
  /// When true, the grid holds more blocks than one wave: the retrieval heads take their cost-weighted
  /// share of the wave's slots in long splits, the sparse heads come in many short ones
  /// (kDecodeBackfillChunk), and the grid's linear order (the order the hardware starts blocks in) puts
  /// every tile's retrieval blocks first (decode_backfill_place), so they all start together and the
  /// short sparse blocks fill the other slots as they free, keeping the wave full to the end.
  bool backfill = false;
  float scale_log2 = 0.f; ///< sm_scale * log2(e): the kernels run the softmax in base 2
  std::uint8_t head_at[kMaxKvHeads] = {};  ///< retrieval heads first, then sparse, by head index
  std::uint8_t rank_of[kMaxKvHeads] = {};  ///< position of a head among those of its role

  std::size_t partials() const { return std::size_t(batch) * row_tiles * ctas_per_tile; }
  /// True when some head has more than one split.
  bool splits_any() const { return (num_retrieval > 0 && retrieval_splits > 1) || (num_sparse > 0 && sparse_splits > 1); }
  /// True when the splits merge in the merge kernel (partials in the workspace), not in their clusters.
  bool merge_kernel() const { return splits_any() && cluster <= 1; }
  /// Workspace: normalised partial outputs [partials, row_tile, head_dim] and their base-2 LSE.
  template <class Carve>
  void carve(Carve& ws, float** partial_out, float** partial_lse) const {
    const std::size_t n = merge_kernel() ? partials() : 0;
    *partial_out = ws.template take<float>(n * row_tile * head_dim);
    *partial_lse = ws.template take<float>(n * row_tile);
  }
  std::size_t workspace_bytes() const {
    WorkspaceCarver ws(nullptr, 0);
    float *o, *l;
    carve(ws, &o, &l);
    return ws.required_bytes();
  }
};

/// A block of the split kernel: its split slot x in [0, ctas_per_tile), its row tile and its sequence.
struct DecodeBlockPlace {
  int x, tile, b;
};

/// Where the block at `linear` (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)) works
/// in a backfilling plan: the first row_tiles * batch * retrieval_ctas blocks are every (sequence, row
/// tile)'s retrieval splits, the rest their sparse splits, each group ordered by (sequence, row tile,
/// split slot). A bijection of [0, batch * row_tiles * ctas_per_tile) (tested on the host).
KVSIFT_HD inline DecodeBlockPlace decode_backfill_place(int linear, int ctas_per_tile, int retrieval_ctas, int row_tiles,
                                                        int batch) {
  const int retrieval_blocks = retrieval_ctas * row_tiles * batch;
  int t, x;  // t: the (sequence, row tile) pair, b * row_tiles + tile
  if (linear < retrieval_blocks) {
    t = linear / retrieval_ctas;
    x = linear - t * retrieval_ctas;
  } else {
    const int sparse_ctas = ctas_per_tile - retrieval_ctas;
    const int l = linear - retrieval_blocks;
    t = l / sparse_ctas;
    x = retrieval_ctas + (l - t * sparse_ctas);
  }
  return DecodeBlockPlace{x, t % row_tiles, t / row_tiles};
}

/// Sizes the grid for about one wave of kDecodeCtasPerSm blocks per SM with equal tokens per block;
/// a retrieval head gets proportionally more splits than a sparse one.
template <class View, class T>
Status plan_decode_attention(const DeviceFacts& device, const View& kv, const DecodeAttentionParams<T>& p,
                             DecodePlan* plan) {
  KVSIFT_TRY(validate_decode_attention(kv, p, /*check_pointers=*/false));
  KVSIFT_TRY(device.validate("decode_attention"));
  DecodePlan& pl = *plan;
  pl = DecodePlan();
  pl.batch = kv.batch;
  pl.num_kv_heads = kv.num_kv_heads;
  pl.group = p.num_q_heads / kv.num_kv_heads;
  pl.head_dim = p.head_dim;
  pl.max_len = decode_max_length(kv, p);
  pl.rows = p.q_len * pl.group + (p.scores ? 1 : 0);
  pl.scale_log2 = p.sm_scale * kLog2e;
  pl.score_cols = p.scores ? ceil_div(pl.max_len, p.score_block_size) : 0;
  const bool mma = decode_uses_tensor_cores<View>();
  pl.row_tile = (!mma || pl.rows <= 8 || p.head_dim == 256) ? 8 : 16;
  pl.row_tiles = ceil_div(pl.rows, pl.row_tile);
  for (int h = 0; h < kv.num_kv_heads; ++h) {
    if (p.roles.is_sparse(h)) continue;
    pl.rank_of[h] = std::uint8_t(pl.num_retrieval);
    pl.head_at[pl.num_retrieval++] = std::uint8_t(h);
  }
  for (int h = 0; h < kv.num_kv_heads; ++h) {
    if (!p.roles.is_sparse(h)) continue;
    pl.rank_of[h] = std::uint8_t(pl.num_sparse);
    pl.head_at[pl.num_retrieval + pl.num_sparse++] = std::uint8_t(h);
  }
  // A sparse head covers every position its index row can list. Capping that at max_len would be
  // right only for sorted, distinct, in-range rows: a row with duplicates, unsorted entries or
  // entries past the sequence can hold in-range keys beyond its first max_len positions.
  if (pl.num_sparse > 0) pl.sparse_tokens = int(std::int64_t(p.index_set.capacity) * p.index_set.block_size);

  // A retrieval head's splits are multiples of the score blocks, a sparse head's of its index blocks.
  const int quantum_r = std::max(kDecodeCtaTokens, p.scores ? p.score_block_size : 1);
  const int quantum_s = std::max(kDecodeCtaTokens, pl.num_sparse > 0 ? p.index_set.block_size : 1);
  const int row_bytes = p.head_dim * int(sizeof(typename View::value_type));
  const int per_sm = decode_ctas_per_sm(mma, p.head_dim, row_bytes);
  const std::int64_t target = std::int64_t(device.num_sms) * per_sm;
  const std::int64_t tiles = std::int64_t(std::max(kv.batch, 1)) * pl.row_tiles;
  // Split counts (d per retrieval head, s per sparse head) for one wave of `target` blocks that all
  // finish together: the sparse heads' s is searched, the retrieval heads share the blocks left, and the
  // pair whose slowest block has the least (cost-weighted) positions wins; fewer blocks break ties.
  // Both counts are rounded down, so the grid never spills into a second, mostly idle wave (a plan that
  // sized one chunk for both roles could: 8 retrieval + 56 sparse heads took 432 blocks of 396 and
  // doubled the layer's time).
  const double sparse_cost = pl.num_sparse > 0 && p.index_set.block_size == 1 ? kDecodeTokenGatherCost : 1.0;
  const int most_d = pl.num_retrieval ? std::max(1, std::min(kDecodeMaxSplits, ceil_div(pl.max_len, quantum_r))) : 1;
  const int most_s = pl.num_sparse ? std::max(1, std::min(kDecodeMaxSplits, ceil_div(pl.sparse_tokens, quantum_s))) : 1;
  int best_d = 1, best_s = 1;
  double best = -1;
  for (int sg = 1; sg <= most_s; ++sg) {
    const std::int64_t sparse_blocks = tiles * pl.num_sparse * sg;
    const std::int64_t room = target - sparse_blocks;
    // More sparse splits only while one block per retrieval head still fits (with none: while the
    // sparse blocks fit).
    if (sg > 1 && room < tiles * pl.num_retrieval) break;
    const int sd = pl.num_retrieval ? int(std::clamp<std::int64_t>(room / (tiles * pl.num_retrieval), 1, most_d)) : 1;
    const double slowest = std::max(pl.num_retrieval ? double(ceil_div(pl.max_len, sd)) : 0.0,
                                    pl.num_sparse ? double(ceil_div(pl.sparse_tokens, sg)) * sparse_cost : 0.0);
    if (best < 0 || slowest < best) {
      best = slowest;
      best_d = sd;
      best_s = sg;
    }
  }
  // The chunks, rounded up to their quanta (so the split counts can only fall) and bounded by the
  // block-max scratch.
  pl.chunk = std::min(round_up(std::max(1, ceil_div(pl.max_len, best_d)), quantum_r), std::max(kDecodeMaxChunk, quantum_r));
  pl.sparse_chunk =
      std::min(round_up(std::max(1, ceil_div(pl.sparse_tokens, best_s)), quantum_s), std::max(kDecodeMaxChunk, quantum_s));
  pl.retrieval_splits = std::max(1, ceil_div(pl.max_len, pl.chunk));
  pl.sparse_splits = std::max(1, ceil_div(pl.sparse_tokens, pl.sparse_chunk));
  // Small calls merge in clusters (DecodePlan::cluster): every head gets the same split count c <= 8,
  // c the larger of the two roles' counts, or the chunks grow so that 8 splits cover a head when that
  // adds at most one ring's depth of positions to the slowest block (a split whose stages all fit in
  // the ring is issued whole before its first wait, so its copies still land together). Only grids of
  // at most one block per SM: a cluster then always finds its slots, so the grid never spills into a
  // second wave waiting for a GPC with room.
  if (mma && device.clusters && device.cc_major >= 9) {
    const int ring = decode_stages(row_bytes) * kDecodeCtaTokens;
    const int heads = pl.num_retrieval + pl.num_sparse;
    const int slowest = std::max(pl.num_retrieval ? pl.chunk : 0, pl.num_sparse ? pl.sparse_chunk : 0);
    int c = std::max(pl.num_retrieval ? pl.retrieval_splits : 1, pl.num_sparse ? pl.sparse_splits : 1);
    int chunk_r = pl.chunk, chunk_s = pl.sparse_chunk;
    if (c > kDecodeMaxClusterSplits) {
      c = kDecodeMaxClusterSplits;
      chunk_r = round_up(std::max(1, ceil_div(pl.max_len, c)), quantum_r);
      chunk_s = round_up(std::max(1, ceil_div(pl.sparse_tokens, c)), quantum_s);
      const int grown = std::max(pl.num_retrieval ? chunk_r : 0, pl.num_sparse ? chunk_s : 0);
      if (grown > slowest + ring || chunk_r > kDecodeMaxChunk || chunk_s > kDecodeMaxChunk) c = 0;
    }
    if (c > 1 && tiles * heads * c <= device.num_sms) {
      pl.cluster = c;
      pl.chunk = chunk_r;
      pl.sparse_chunk = chunk_s;
      pl.retrieval_splits = c;  // a role may end with empty splits: they carry LSE -inf and weigh nothing
      pl.sparse_splits = c;
    }
  }
  // Backfill (DecodePlan::backfill): a mixed one-wave plan of at least two blocks an SM whose sparse
  // blocks end well before its retrieval blocks. The retrieval heads get their cost-weighted share of
  // the slots, the sparse heads splits of kDecodeBackfillChunk, more than the slots left to them; only
  // when that leaves the retrieval blocks under one wave and gives the sparse heads more blocks than
  // their slots (else there is nothing to fill).
  if (kDecodeBackfill && mma && pl.cluster <= 1 && per_sm >= 2 && pl.num_retrieval > 0 && pl.num_sparse > 0 &&
      double(pl.sparse_chunk) * sparse_cost < kDecodeBackfillRatio * pl.chunk) {
    const double work_r = double(pl.num_retrieval) * pl.max_len;
    const double work_s = double(pl.num_sparse) * pl.sparse_tokens * sparse_cost;
    const std::int64_t share = std::int64_t(double(target) * work_r / (work_r + work_s));
    const int d = int(std::clamp<std::int64_t>(share / (tiles * pl.num_retrieval), 1, most_d));
    const int chunk_r = std::min(round_up(ceil_div(pl.max_len, d), quantum_r), std::max(kDecodeMaxChunk, quantum_r));
    const int chunk_s = std::min(round_up(std::max(kDecodeBackfillChunk, ceil_div(pl.sparse_tokens, kDecodeMaxSplits)), quantum_s),
                                 std::max(kDecodeMaxChunk, quantum_s));
    const int splits_r = std::max(1, ceil_div(pl.max_len, chunk_r));
    const int splits_s = std::max(1, ceil_div(pl.sparse_tokens, chunk_s));
    const std::int64_t blocks_r = tiles * pl.num_retrieval * splits_r;
    const std::int64_t blocks_s = tiles * pl.num_sparse * splits_s;
    if (blocks_r < target && blocks_s > target - blocks_r) {
      pl.backfill = true;
      pl.chunk = chunk_r;
      pl.sparse_chunk = chunk_s;
      pl.retrieval_splits = splits_r;
      pl.sparse_splits = splits_s;
    }
  }
  pl.ctas_per_tile = pl.num_retrieval * pl.retrieval_splits + pl.num_sparse * pl.sparse_splits;
  if (pl.merge_kernel()) {
    const bool merge_r = pl.num_retrieval > 0 && pl.retrieval_splits > 1;
    const bool merge_s = pl.num_sparse > 0 && pl.sparse_splits > 1;
    pl.merged_heads = (merge_r ? pl.num_retrieval : 0) + (merge_s ? pl.num_sparse : 0);
    const int most = std::max(merge_r ? pl.retrieval_splits : 0, merge_s ? pl.sparse_splits : 0);
    while (pl.merge_parts * kDecodeMergeBatch < most && pl.merge_parts < kDecodeMergeThreads) pl.merge_parts *= 2;
    const int items = pl.row_tile * (p.head_dim / 4);
    pl.merge_blocks_per_head = ceil_div(items, kDecodeMergeThreads / pl.merge_parts);
  }
  return Status();
}

}  // namespace detail

/// Bytes of workspace decode_attention needs on `exec` for these views and params (no device memory
/// needed; the host reference needs none). The split plan rounds per batch size, so a smaller batch
/// can need more scratch than a larger one: engines size once for their largest batch, and the query
/// reports the most any batch up to kv.batch needs.
template <class Exec, class View, class T>
Status decode_attention_workspace_bytes(const Exec& exec, const View& kv, const DecodeAttentionParams<T>& p,
                                        std::size_t* bytes) {
  static_assert(check_kv_view<View>());
  KVSIFT_REQUIRE_NOT_NULL(bytes, "bytes");
  *bytes = 0;
  if constexpr (is_host_exec<Exec>::value) {
    return detail::validate_decode_attention(kv, p, /*check_pointers=*/false);
  } else {
    View smaller = kv;
    for (int b = kv.batch < 1 ? kv.batch : 1; b <= kv.batch; ++b) {
      smaller.batch = b;
      detail::DecodePlan plan;
      KVSIFT_TRY(detail::plan_decode_attention(exec.device, smaller, p, &plan));
      *bytes = std::max(*bytes, plan.workspace_bytes());
    }
    return Status();
  }
}

}  // namespace kvsift
