#pragma once
/// \file
/// \brief The launch plan of topk and its workspace query (contract in topk.hpp).
///
/// The CUDA backend gives each row a group of CTAs (a hardware thread-block cluster on sm_90+) that
/// split the row into slices; the plan picks the group size, the slice, the kernel (the candidate
/// select when the slice and its candidate list fit shared memory, else the radix select) and the
/// CTA size from the shape of the score matrix, the key width and the device facts in the Exec, never
/// from lengths or k in device memory, so a call can be captured in a CUDA graph.

#include <cstddef>
#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/kv/index_set.hpp"
#include "kvsift/ops/topk.hpp"

namespace kvsift {
namespace detail {

/// Slices of about 64 KiB of keys stream well (eight 16-byte loads in flight per thread) and let two
/// CTAs share an SM; up to 128 KiB a slice is still cached rather than re-read on every pass.
inline constexpr std::size_t kTopkPreferredSliceBytes = std::size_t(64) << 10;
inline constexpr std::size_t kTopkMaxCachedSliceBytes = std::size_t(128) << 10;
inline constexpr int kTopkMinSlice = 2048;     ///< below this a CTA is mostly barriers
inline constexpr int kTopkMaxCtasPerRow = 8;   ///< the portable hardware cluster size
/// The candidate select addresses its candidates by 16-bit offsets into the slice.
inline constexpr int kTopkCandMaxSlice = 65536;
/// Static shared memory of the candidate select: two 2048-bin histograms plus the scan storage and
/// counters (under 1 KiB; ptxas reports the exact figure), counted when checking the opt-in limit.
inline constexpr std::size_t kTopkCandStaticSmem = 2 * 2048 * 4 + 1024;
/// Shared memory of the candidate select's bracket list (keys of the whole CTA group that lie inside
/// the sampled bracket, ops/detail/topk_bracket.hpp): about 2-6% of a 32K or 128K row for budgets of
/// 1-12% of it.
inline constexpr std::size_t kTopkBracketListBytes = std::size_t(32) << 10;
/// One-CTA rows up to this many positions get 256-thread CTAs: 8 keys per thread either way, and the
/// barriers of a smaller CTA are cheaper (the block-score case, 2048 positions).
inline constexpr int kTopkCandShortSlice = 4096;

enum class TopkKernel : int {
  kRadixSelect = 0,      ///< ops/detail/topk_radix_select.cuh: any slice; re-reads global memory past 128 KiB
  kCandidateSelect = 1,  ///< ops/detail/topk_candidate_select.cuh: slice and candidate list in shared memory
  kStreamSelect = 2,     ///< ops/detail/topk_stream_select.cuh: one CTA per row: a sparse sample, then one stream
  kRegisterSelect = 3,   ///< ops/detail/topk_register_select.cuh: a few long rows, keys in registers, one exchange
  kShortRowSelect = 4,   ///< ops/detail/topk_short_row_select.cuh: rows up to 4096 positions, one CTA, keys in registers
};

/// The register select: CTAs of 256 threads holding 8 or 16 keys a thread in registers, or of 512
/// threads holding 16 or 32 (rows that 256 x 16 keys a CTA do not cover), in CTA groups of up to 16 (a
/// non-portable cluster size on sm_90), every CTA drawing the row's whole sample of kTopkRegSamples
/// keys itself. Rows of more than kTopkRegMaxCols positions stay on the CTA-group plan.
inline constexpr int kTopkRegThreads = 256;
inline constexpr int kTopkRegWideThreads = 512;
inline constexpr int kTopkRegSamples = 2048;
inline constexpr int kTopkRegMaxGroup = 16;
inline constexpr int kTopkRegMaxKeys = 32;
inline constexpr int kTopkRegMinCols = 16384;   ///< shorter rows stay on the candidate select
inline constexpr int kTopkRegMaxCols = 131072;  ///< the longest rows it is measured on
/// Its lists: each CTA's own (keys of its slice inside the bracket) and the copy of the whole group's.
/// A 4096 budget of 128K lists about 4,200 keys in all; the copy's room is what a row of mostly equal
/// or sorted keys would need before the exact search takes over. 96 KiB with the 24 KiB of static
/// histograms also keeps one CTA per SM, so a group of 16 spreads over 16 SMs.
inline constexpr int kTopkRegOwnListKeys = 8192;
inline constexpr int kTopkRegCopyKeys = 16384;
inline constexpr std::size_t kTopkRegStaticSmem = 3 * 2048 * 4 + 512;  ///< its three histograms and scalars (about)

struct TopkPlan {
  int cols = 0;
  int ctas_per_row = 1;
  int slice = 0;  ///< positions per CTA, a multiple of 8 (16-byte vectors never straddle two CTAs)
  bool cached = false;
  bool vector_loads = false;  ///< every row starts 16-byte aligned
  std::size_t smem_bytes = 0;  ///< dynamic shared memory per CTA
  TopkKernel kernel = TopkKernel::kRadixSelect;
  int threads = 512;  ///< threads per CTA
  int bitmap_words = 0;   ///< stream select: 32-bit words per position bitmap (even; covers cols)
  /// Stream select: candidate (key, position) entries in shared memory. Register select: keys of a
  /// CTA's own list.
  int list_capacity = 0;
  int sample_period = 16;  ///< stream select: one 32-byte sector of every sample_period is sampled (>= 1)
  /// Candidate select in CTA groups: keys of the whole group's bracket list that fit shared memory
  /// (ops/detail/topk_bracket.hpp); 0 runs the exact digit searches only. Register select: keys of the
  /// copy of the group's lists (0 runs its exact search only).
  int bracket_capacity = 0;
};

/// Static shared memory of the stream select: its 8192-bin histogram plus scan storage and counters.
inline constexpr int kTopkStreamHistWords = 8192;
inline constexpr std::size_t kTopkStreamStaticSmem = kTopkStreamHistWords * 4 + 1024;
/// Below this many list entries the stream select would overflow on ordinary rows (a 4096 budget
/// passes 5-7K keys through the sampled threshold), so a second CTA per SM is given up first.
inline constexpr int kTopkStreamMinList = 8192;
/// Rows shorter than this stay on the candidate select whatever their number (2048-position rows:
/// 9.8-11.8 us there against 16.7-24 us streamed, H200).
inline constexpr int kTopkStreamMinCols = 16384;

/// The stream select's plan for rows of `cols` positions, with `list_capacity` 0 where it does not fit
/// shared memory: two CTAs per SM when the bitmaps leave room for a list of kTopkStreamMinList
/// entries (or one covering the row), else one CTA per SM with the largest list that fits. The list
/// holds the keys that pass the sampled threshold, about 1.1-1.5x the budget on ordinary rows.
template <class KeyT>
TopkPlan plan_topk_stream(int cols, const DeviceFacts& device) {
  TopkPlan s;
  s.cols = cols;
  s.kernel = TopkKernel::kStreamSelect;
  s.ctas_per_row = 1;
  s.slice = cols;
  s.threads = 512;
  s.cached = false;
  s.bitmap_words = int((std::int64_t(cols) + 63) / 64 * 2);
  // The tie bitmap lives in the histogram's 8192 words when it fits there (rows up to 262144).
  const int bitmap_count = s.bitmap_words <= kTopkStreamHistWords ? 1 : 2;
  const std::size_t bitmaps = std::size_t(s.bitmap_words) * bitmap_count * sizeof(std::uint32_t);
  const std::size_t entry = sizeof(KeyT) + sizeof(std::int32_t);
  // An SM has the opt-in maximum plus 1 KiB, and each resident CTA reserves 1 KiB of it.
  const std::size_t per_sm = device.max_smem_optin + 1024;
  const std::size_t two_per_sm = per_sm / 2 > 1024 + kTopkStreamStaticSmem ? per_sm / 2 - 1024 - kTopkStreamStaticSmem : 0;
  const std::size_t one_per_sm = device.max_smem_optin > kTopkStreamStaticSmem ? device.max_smem_optin - kTopkStreamStaticSmem : 0;
  const std::size_t wanted = std::size_t(cols < kTopkStreamMinList ? cols : kTopkStreamMinList);
  const std::size_t room = two_per_sm >= bitmaps + wanted * entry ? two_per_sm : one_per_sm;
  if (room < bitmaps + entry * 256) return s;  // list_capacity 0: does not fit
  std::size_t cap = (room - bitmaps) / entry;
  if (cap > std::size_t(cols)) cap = std::size_t(cols);
  s.list_capacity = int(cap);
  s.smem_bytes = bitmaps + cap * entry;
  return s;
}

/// Positions per CTA when a row of `cols` positions is split over `c` CTAs: rounded up to a multiple
/// of 8, so 16-byte vectors never straddle two CTAs.
inline int topk_slice(int cols, int c) { return int((std::int64_t(cols) + c - 1) / c + 7) / 8 * 8; }

/// The CTA-group plan for rows of `cols` positions in groups of `c` CTAs (c a power of two, 1 without
/// clusters): the candidate select where the slice's keys and offsets fit shared memory, with the
/// sampled bracket if `bracket` asks for it and its list fits beside the slice, else the radix select
/// (its slice cached in shared memory up to kTopkMaxCachedSliceBytes). plan_topk picks `c`; tests and
/// bench_topk call this directly to force a group size.
template <class KeyT>
TopkPlan plan_topk_group(int cols, int c, bool bracket, const DeviceFacts& device) {
  TopkPlan s;
  s.cols = cols;
  s.ctas_per_row = c;
  s.slice = topk_slice(cols, c);
  // The candidate select keeps the slice's keys and a list of 16-bit offsets in shared memory.
  const std::size_t candidate_bytes = std::size_t(s.slice) * (sizeof(KeyT) + sizeof(std::uint16_t));
  if (s.slice <= kTopkCandMaxSlice && candidate_bytes + kTopkCandStaticSmem <= device.max_smem_optin) {
    s.kernel = TopkKernel::kCandidateSelect;
    s.cached = true;
    s.smem_bytes = candidate_bytes;
    s.threads = c == 1 && s.slice <= kTopkCandShortSlice ? 256 : 512;
    if (bracket && c > 1 && candidate_bytes + kTopkBracketListBytes + kTopkCandStaticSmem <= device.max_smem_optin) {
      s.bracket_capacity = int(kTopkBracketListBytes / sizeof(KeyT));
      s.smem_bytes = candidate_bytes + kTopkBracketListBytes;
    }
    return s;
  }
  s.cached = std::size_t(s.slice) * sizeof(KeyT) <= kTopkMaxCachedSliceBytes &&
             std::size_t(s.slice) * sizeof(KeyT) <= device.max_smem_optin;
  s.smem_bytes = s.cached ? std::size_t(s.slice) * sizeof(KeyT) : 0;
  return s;
}

/// Whether `rows` groups of `c` CTAs at one CTA per SM exceed the CTAs the device runs at once: a group
/// of 16 needs 16 free SMs of one GPC, and 8 of them did not run at once on an H200 (two waves: 8 rows
/// of 32K 22.8 us against 14.4 in groups of 8); ncu counts 15 co-resident groups of 8 (7/8 of its SMs).
inline bool topk_register_groups_exceed_sms(std::int64_t rows, int c, const DeviceFacts& device) {
  return rows * c > (c == kTopkRegMaxGroup ? device.num_sms / 2 : device.num_sms * 7 / 8);
}

/// The register select's plan for `rows` rows of `cols` positions with a CTA group of `c` CTAs (0: the
/// plan's choice: groups of 16 up to half the SMs' worth of CTAs and smaller ones up to 7/8 of the
/// SMs, one CTA per SM) and CTAs of `threads` threads (0: the plan's choice: 256 where 16 keys a
/// thread cover the row in the group, else 512), or a plan whose kernel is not kRegisterSelect where
/// it does not apply: keys wider than 32 bits, no clusters, rows longer than kTopkRegMaxCols or than
/// the group's CTAs hold (256 x 16 or 512 x 32 keys each), or shared memory too small. The slice is
/// the smallest of the CTA size's two key counts that covers the row; the group then shrinks while
/// half of it still covers the row.
///
/// Where 256 threads would need 32 keys a thread, 512 threads with 16 or 32 keys are faster (H100,
/// 2026-12-07: one to four rows of 128K in groups of 16, 20.9-21.1 us against 19.6-19.9; eight rows in
/// groups of 8 at 512 x 32 keys, 24.2 us, against 28.0 for the 256-thread CTAs in groups of 16 packed
/// two an SM that this replaces), and slower where 256 threads suffice (one row of 32K in groups of
/// 16, 14.2 against 16.7). 1024-thread CTAs were slower everywhere (+4-6 us).
template <class KeyT>
TopkPlan plan_topk_register(std::int64_t rows, int cols, int c, const DeviceFacts& device, int threads = 0) {
  TopkPlan s;
  s.cols = cols;
  const std::size_t lists = std::size_t(kTopkRegOwnListKeys + kTopkRegCopyKeys) * sizeof(KeyT);
  if (sizeof(KeyT) != 4 || !device.clusters || lists + kTopkRegStaticSmem > device.max_smem_optin || rows < 1 ||
      cols > kTopkRegMaxCols || (threads != 0 && threads != kTopkRegThreads && threads != kTopkRegWideThreads))
    return s;
  if (c == 0) {
    c = kTopkRegMaxGroup;
    while (c > 2 && topk_register_groups_exceed_sms(rows, c, device)) c /= 2;
    if (rows * c > device.num_sms * 7 / 8) return s;
  }
  if (threads == 0)
    threads = std::int64_t(c) * kTopkRegThreads * (kTopkRegMaxKeys / 2) >= cols ? kTopkRegThreads : kTopkRegWideThreads;
  // Two key counts a CTA size (fewer kernels to build): 8 or 16 keys at 256 threads, 16 or 32 at 512.
  const int max_keys = threads == kTopkRegThreads ? kTopkRegMaxKeys / 2 : kTopkRegMaxKeys;
  int keys = max_keys / 2;
  if (std::int64_t(c) * threads * keys < cols) keys = max_keys;
  if (std::int64_t(c) * threads * keys < cols) return s;
  while (c > 2 && std::int64_t(c / 2) * threads * keys >= cols) c /= 2;
  s.kernel = TopkKernel::kRegisterSelect;
  s.threads = threads;
  s.ctas_per_row = c;
  s.slice = threads * keys;
  s.cached = true;
  s.list_capacity = kTopkRegOwnListKeys;
  s.bracket_capacity = kTopkRegCopyKeys;
  s.smem_bytes = std::size_t(s.list_capacity + s.bracket_capacity) * sizeof(KeyT);
  return s;
}

/// Few long rows get groups of up to 8 CTAs (enough CTAs to fill the GPU); many rows get the smallest
/// group whose slices fit shared memory. Rows of at least kTopkStreamMinCols positions whose groups
/// would need more than one wave take the stream select. Otherwise the candidate select runs
/// wherever its shared memory fits (fp32 rows up to 262144 positions, 33-bit flag-first keys up to
/// 131072, on an H200); the radix select takes the rest (longer rows, or GPUs without clusters or
/// with less shared memory), except that a GPU without clusters streams rows the radix select could
/// not keep in shared memory. `rows` is the number of rows the call writes (topk_written_rows).
template <class KeyT>
TopkPlan plan_topk_cta_groups(std::int64_t rows, int cols, const DeviceFacts& device) {
  const int max_group = device.clusters ? kTopkMaxCtasPerRow : 1;
  int c = 1;
  while (c < max_group && std::size_t(topk_slice(cols, c)) * sizeof(KeyT) > kTopkPreferredSliceBytes) c *= 2;
  // More CTAs per row only while the grid stays within about one CTA per SM (clusters of 8 do not
  // pack every SM: 7/8 of them). A grid of more CTAs shares SMs, and the candidate select's serial
  // chain is instruction-issue bound: 16 rows x 32K took 19.4 us in groups of 4 (64 CTAs) against 28.2
  // in groups of 8 (128 CTAs), 32 rows 24.7 in groups of 2 against 26.1 in groups of 4 (H200,
  // 2026-12-02, BM_TopKGroup). Padding shared memory to keep 128 CTAs one per SM was slower still
  // (37.9 us: 16 clusters of 8 are not co-resident), so the grid is kept small instead.
  // One wave: two 512-thread CTAs per SM (64 registers each), 7/8 of those slots for clusters.
  const std::int64_t one_wave = std::int64_t(device.num_sms) * 2 * 7 / 8;
  const std::int64_t one_cta_per_sm = std::int64_t(device.num_sms) * 7 / 8;
  while (c < max_group && rows * 2 * c <= one_cta_per_sm && topk_slice(cols, 2 * c) >= kTopkMinSlice) c *= 2;
  // Many long rows: once the CTA groups need more than one wave, each wave pays the whole serial
  // chain again; streaming each row through one CTA costs about 1.06x the bytes instead (a sixteenth
  // sampled). Within one wave the candidate select is faster (8 x 128K 28 against 45 us, 64 x 32K 25
  // against 26); past it the stream wins (32 x 128K in groups of 8, 1.1 waves: 63 against 47 us;
  // 256 x 32K: 41.8 against 64.6; H200, k 1024).
  if (cols >= kTopkStreamMinCols && rows * c > one_wave) {
    const TopkPlan stream = plan_topk_stream<KeyT>(cols, device);
    if (stream.list_capacity > 0) return stream;
  }
  // Groups of 8 whose grid still shares SMs (16 rows of 128K: 64 KiB slices) halve once more where the
  // larger slice still fits shared memory: 39.4 us in groups of 4 against 42.9 in groups of 8 (H200).
  if (c == kTopkMaxCtasPerRow && rows * c > one_cta_per_sm &&
      plan_topk_group<KeyT>(cols, c / 2, false, device).kernel == TopkKernel::kCandidateSelect)
    c /= 2;
  // Groups of 8 take the sampled bracket when their grid fits one CTA per SM and its list fits beside
  // the slice (8 rows of 32K: 19.3 us against 20.7 with the digit searches; 8 rows of 128K: 26.5 against
  // 30.4). Smaller groups have cheaper digit searches and lose with it (8 rows of 32K in groups of 4:
  // 20.5 against 19.1; 32 rows 30.1 against 26.1; H200, 2026-12-02), as it does where two CTAs share
  // an SM: the CTA's bracket is a few thousand instructions a thread.
  const TopkPlan s = plan_topk_group<KeyT>(cols, c, c == kTopkMaxCtasPerRow && rows * c <= one_cta_per_sm, device);
  // Without clusters an uncached radix select is one CTA per row too, re-reading the row on every
  // pass; the stream select reads it about 1.06 times.
  if (s.kernel == TopkKernel::kRadixSelect && !s.cached && !device.clusters) {
    const TopkPlan stream = plan_topk_stream<KeyT>(cols, device);
    if (stream.list_capacity > 0) return stream;
  }
  return s;
}

/// The short-row select: one 256-thread CTA per row holding 8 or 16 keys a thread in registers.
inline constexpr int kTopkShortMaxKeys = 16;
inline constexpr int kTopkShortMaxCols = kTopkRegThreads * kTopkShortMaxKeys;  ///< 4096 positions

/// The short-row select's plan for rows of `cols` positions, or a plan whose kernel is not
/// kShortRowSelect where it does not apply (rows longer than 4096). 32- and 64-bit keys (the 33-bit
/// flag-first and recent-blocks-first keys of fp32 scores) alike. It needs no cluster and no dynamic
/// shared memory (two 2048-bin histograms, about 16.5 KB, are static).
template <class KeyT>
TopkPlan plan_topk_short_row(int cols) {
  TopkPlan s;
  s.cols = cols;
  if ((sizeof(KeyT) != 4 && sizeof(KeyT) != 8) || cols > kTopkShortMaxCols || cols < 1) return s;
  s.kernel = TopkKernel::kShortRowSelect;
  s.threads = kTopkRegThreads;
  s.ctas_per_row = 1;
  s.slice = kTopkRegThreads * (cols <= kTopkRegThreads * 8 ? 8 : 16);
  s.cached = true;
  return s;
}

/// The plan cuda::topk launches: a few long rows with 32-bit keys take the register select (one
/// group exchange instead of the candidate select's rounds), rows of up to 4096 positions the
/// short-row select, everything else plan_topk_cta_groups. `rows` is the number of rows the
/// call writes (topk_written_rows). `register_select` false skips the register select (key policies
/// without a sentinel value: topk_plan_for).
template <class KeyT>
TopkPlan plan_topk(std::int64_t rows, int cols, const DeviceFacts& device, bool register_select = true) {
  // Only where groups of 8 or 16 fit one wave: in smaller groups it lost to the CTA-group plan (H200,
  // k 4096: 32 x 32K in groups of 4 32.7 us against 24.6; 16 x 32K in groups of 8, two waves, 25.8
  // against 19.4).
  if (register_select && cols >= kTopkRegMinCols && rows * 8 <= device.num_sms * 7 / 8) {
    const TopkPlan reg = plan_topk_register<KeyT>(rows, cols, 0, device);
    if (reg.kernel == TopkKernel::kRegisterSelect) return reg;
  }
  const TopkPlan short_row = plan_topk_short_row<KeyT>(cols);
  if (short_row.kernel == TopkKernel::kShortRowSelect) return short_row;
  return plan_topk_cta_groups<KeyT>(rows, cols, device);
}

}  // namespace detail

/// Scratch memory topk needs, from shapes alone (no device memory touched). Every current path keeps
/// its state in shared memory and needs none; callers still ask and pass what this returns, so a later
/// split-row path can use it without an API change. The host reference needs none either.
template <class T, class Key = ScoreKey<T>, class Exec>
Status topk_workspace_bytes(const Exec& exec, const StridedView2D<const T>& scores, const TopKParams& params,
                            const IndexSet& out, std::size_t* bytes) {
  (void)exec;
  (void)scores;
  (void)params;
  (void)out;
  KVSIFT_REQUIRE_NOT_NULL(bytes, "bytes");
  *bytes = 0;
  return Status();
}

}  // namespace kvsift
