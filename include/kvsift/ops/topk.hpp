#pragma once
/// \file
/// \brief topk: batched per-row top-k selection with ragged lengths, forced sink/recent ranges and key
/// transforms. This header is the contract: parameters, key policies, the per-row plan every backend
/// computes the same way, and validation. The launch plan and workspace query are in topk_plan.hpp,
/// the host reference in topk_reference.hpp, the CUDA radix select in topk.cuh. Guide: docs/ops/topk.md.
///
/// Row r of `scores` uses positions [0, len_r), len_r = lengths[r] clamped to [0, scores.cols]
/// (scores.cols when `lengths` is null). Its budget is k_r = per_row_k[r] (or params.k) clamped to
/// [0, out.capacity]. The first `sink` and the last `recent` positions are always selected and count
/// inside the budget; the rest of the budget goes to the best keys of the positions in between. The
/// row's output is written to out.row(r) in ascending position order, its size to out.counts[r]:
///
///   forced = |[0, sink) ∪ [len - recent, len)| (clipped to the row)
///   count  = forced + clamp(k_r - forced, 0, len - forced)      == max(forced, min(k_r, len))
///
/// Row filter: with num_kv_heads > 0, row r belongs to KV head r % num_kv_heads, and the rows of the
/// heads `roles` marks sparse are left untouched (no index, no count written): LycheeDecode's retrieval
/// heads write their rows of the index table in place while the sparse heads' rows keep what an
/// earlier layer selected. With num_kv_heads = 0 (the default) every row is written.
///
/// Order: a larger key is better; equal keys go to the lower position, so the result is unique and
/// every backend returns the same bits. With the default ScoreKey, NaN ranks below every number,
/// -inf < finite < +inf, and -0 equals +0.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"
#include "kvsift/core/dtype.hpp"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/kv/head_roles.hpp"
#include "kvsift/kv/index_set.hpp"
#include "kvsift/ops/score_candidates.hpp"

namespace kvsift {

/// Per-call parameters. Pointers live in the backend's memory space (host memory for host::Exec,
/// device memory for cuda::Exec) and are read only by the op, never by the launcher.
struct TopKParams {
  int k = 0;                              ///< budget per row when per_row_k is null
  const std::int32_t* per_row_k = nullptr;  ///< [rows] optional; values are clamped to [0, out.capacity]
  const std::int32_t* lengths = nullptr;    ///< [rows] optional; values are clamped to [0, scores.cols]
  int sink = 0;                           ///< first `sink` positions always selected
  int recent = 0;                         ///< last `recent` positions always selected
  HeadRoleMask roles;                     ///< with num_kv_heads > 0: rows of sparse heads are skipped
  int num_kv_heads = 0;                   ///< rows per sequence for the filter; 0 = write every row
  /// Optional, fp32 scores under ScoreKey<float> only: the positions the pass that wrote `scores`
  /// listed at or above each row's threshold (ops/score_candidates.hpp; positions has the scores'
  /// row stride). A speculation the result never depends on: the CUDA register select (a few long
  /// rows) selects from a row's list when it holds the budget, and writes the row's next threshold;
  /// other paths and the host reference ignore it. The list must be the one made with these scores.
  ScoreCandidates candidates;
};

/// True when the row filter leaves row r untouched.
KVSIFT_HD inline bool topk_skips_row(const TopKParams& p, std::int64_t row) {
  return p.num_kv_heads > 0 && p.roles.is_sparse(int(row % p.num_kv_heads));
}

/// Rows of a `rows`-row call that the row filter lets through: all of them without a filter, else
/// the retrieval heads' rows of every whole sequence plus those of a partial last one. The CUDA
/// backend plans and launches for these rows only (LycheeDecode: batch x retrieval heads, not batch x
/// KV heads), so a layer with one retrieval head of 8 gets the launch shape of batch rows.
KVSIFT_HD inline std::int64_t topk_written_rows(const TopKParams& p, std::int64_t rows) {
  if (p.num_kv_heads <= 0) return rows;
  const std::int64_t h = p.num_kv_heads;
  return rows / h * p.roles.count_retrieval(p.num_kv_heads) + p.roles.count_retrieval(int(rows % h));
}

/// The row of the `i`-th written row, i in [0, topk_written_rows(p, rows)): sequence i / R, its
/// (i mod R)-th retrieval head, R = the retrieval heads per sequence (> 0 whenever a row is written).
KVSIFT_HD inline std::int64_t topk_written_row(const TopKParams& p, std::int64_t i) {
  if (p.num_kv_heads <= 0) return i;
  const std::int64_t r = p.roles.count_retrieval(p.num_kv_heads);
  return i / r * p.num_kv_heads + p.roles.nth_retrieval(int(i % r), p.num_kv_heads);
}

namespace detail {

/// Monotone map from a float to uint32: a > b  <=>  key(a) > key(b). NaN maps to 0, below -inf
/// (whose key is 0x007fffff); -0 is folded onto +0 so the two tie and the lower position wins.
KVSIFT_HD inline std::uint32_t float_order_key(float x) {
  std::uint32_t u = float_to_bits(x);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  u = u == 0x80000000u ? 0u : u;
  // Negative: all bits flipped; otherwise the sign bit set. Branch-free selects, no early return: the
  // register kernels convert 16-32 keys a thread, and a branchy form made the compiler keep a flag
  // per key in bit fields (~10 instructions a key instead of ~6).
  const std::uint32_t flip = std::uint32_t(std::int32_t(u) >> 31) | 0x80000000u;
  return nan ? 0u : u ^ flip;
}

/// The float t with `x >= t` exactly when `float_order_key(x) >= key`, for key > 0 (key 0 admits NaN,
/// which no float compare does). Keys order the non-NaN floats (+0 and -0 as one) and NaN is key 0,
/// so the bound is the key's inverse, except that keys at or below -inf's (0x007fffff) admit every
/// non-NaN x (t = -inf) and keys above +inf's admit none (their inverse is a NaN, which compares
/// false). The stream select filters plain scores with it: one compare instead of the conversion.
KVSIFT_HD inline float float_order_threshold(std::uint32_t key) {
  if (key <= 0x007fffffu) return bits_to_float(0xff800000u);
  return bits_to_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

template <int Bits>
using order_key_t = std::conditional_t<(Bits > 32), std::uint64_t, std::uint32_t>;

}  // namespace detail

// Key policies. A policy is a small trivially-copyable type with
//   static constexpr int kBits;             significant low bits of the key (<= 64)
//   using key_type = uint32_t or uint64_t;  large enough for kBits
//   key_type operator()(T score, int64_t row, int32_t position) const;   larger key = better
//   Status validate() const;                 host-side check of the policy's own pointers
// The kernels run their radix passes over exactly kBits bits, so narrow keys cost fewer passes.

/// The plain score. fp16 and bf16 keep only the bits their values can differ in (19 and 16), which
/// saves a radix pass; the order is the same as for the widened float.
template <class T>
struct ScoreKey {
  /// Significant key bits: 32 for float, 19 for fp16, 16 for bf16.
  static constexpr int kBits = dtype_traits<T>::dtype == DType::kFloat32   ? 32
                               : dtype_traits<T>::dtype == DType::kFloat16 ? 19
                                                                           : 16;
  using key_type = detail::order_key_t<kBits>;  ///< uint32_t (kBits <= 32)
  /// The order-preserving key of `score`, reduced to its top kBits bits; row and position are unused.
  KVSIFT_HD key_type operator()(T score, std::int64_t /*row*/, std::int32_t /*position*/) const {
    return key_type(detail::float_order_key(dtype_traits<T>::to_float(score)) >> (32 - kBits));
  }
  /// Always ok: the plain score key has no pointers.
  Status validate() const { return Status(); }
};

/// Flagged positions first, then by score: ClusterAttn keeps every token inside a density cluster ahead of
/// all others (key = flag << score_bits | score key). flags[row * row_stride + position] != 0 marks
/// a flagged position; the pointer lives in the backend's memory space.
template <class T>
struct FlagFirstKey {
  static constexpr int kScoreBits = ScoreKey<T>::kBits;  ///< bits of the score part (ScoreKey's)
  static constexpr int kBits = kScoreBits + 1;           ///< the flag bit on top of the score bits
  using key_type = detail::order_key_t<kBits>;           ///< uint32_t or uint64_t, wide enough for kBits

  const std::uint8_t* flags = nullptr;  ///< [rows, row_stride] bytes, nonzero = flagged; required
  std::int64_t row_stride = 0;          ///< bytes between flag rows, >= 0

  /// flag << kScoreBits | the ScoreKey of `score`.
  KVSIFT_HD key_type operator()(T score, std::int64_t row, std::int32_t position) const {
    const key_type flag = flags[row * row_stride + position] != 0 ? 1u : 0u;
    return (flag << kScoreBits) | key_type(ScoreKey<T>{}(score, row, position));
  }
  /// kNullPointer for null flags, kInvalidArgument for a negative row_stride.
  Status validate() const {
    KVSIFT_REQUIRE_NOT_NULL(flags, "key.flags");
    KVSIFT_REQUIRE(row_stride >= 0, kInvalidArgument, "key.row_stride = ", row_stride, " must be >= 0");
    return Status();
  }
};

/// FlagFirstKey<float>'s order in 32 bits instead of 33, for fp32 scores that are never negative (or
/// NaN): window scores, sums of exponentials, and their pooled forms. A 33-bit key takes 64-bit
/// radix passes and keeps the top-k off its fastest kernel (the register select wants 32-bit keys:
/// 8 rows of 128K took 37.7 us in the candidate select with 33-bit keys, H200).
/// key = flag << 31 | s, where s is 0 for NaN, 1 for -0 and +0, and the float's bits + 1 above them
/// (up to 0x7f800001 for +inf): over NaN and [+0, +inf] the same order and the same ties as
/// FlagFirstKey<float>. A negative score ranks as +0 (ties to the lower position among them), so
/// give scores that may be negative FlagFirstKey.
struct FlagFirstNonNegativeKey {
  static constexpr int kBits = 32;  ///< the flag bit and 31 bits of score
  using key_type = std::uint32_t;   ///< 32-bit keys

  const std::uint8_t* flags = nullptr;  ///< [rows, row_stride] bytes, nonzero = flagged; required
  std::int64_t row_stride = 0;          ///< bytes between flag rows, >= 0

  /// flag << 31 | s(score): s 0 for NaN, 1 for any score <= 0, the float's bits + 1 above.
  KVSIFT_HD key_type operator()(float score, std::int64_t row, std::int32_t position) const {
    const std::uint32_t u = detail::float_to_bits(score);
    const std::uint32_t s = (u & 0x7fffffffu) > 0x7f800000u ? 0u : (u & 0x80000000u) ? 1u : u + 1u;
    return (flags[row * row_stride + position] != 0 ? 0x80000000u : 0u) | s;
  }
  /// kNullPointer for null flags, kInvalidArgument for a negative row_stride.
  Status validate() const {
    KVSIFT_REQUIRE_NOT_NULL(flags, "key.flags");
    KVSIFT_REQUIRE(row_stride >= 0, kInvalidArgument, "key.row_stride = ", row_stride, " must be >= 0");
    return Status();
  }
};

/// What one row selects; computed the same way by every backend (and by tests).
struct TopKRowPlan {
  int len = 0;           ///< live positions [0, len)
  int sink_end = 0;      ///< forced sink: [0, sink_end)
  int recent_begin = 0;  ///< forced recent: [recent_begin, len); scored region: [sink_end, recent_begin)
  int budget = 0;        ///< positions chosen by key from the scored region

  KVSIFT_HD int region() const { return recent_begin - sink_end; }  ///< positions in the scored region
  KVSIFT_HD int forced() const { return len - region(); }           ///< sink and recent positions, always kept
  KVSIFT_HD int count() const { return forced() + budget; }          ///< entries the row's output gets
};

/// The plan of one row with `cols` score columns, length `len` (clamped to [0, cols]), budget `k`
/// (clamped to [0, capacity]) and `sink` / `recent` forced positions, as the file comment defines it.
KVSIFT_HD inline TopKRowPlan plan_topk_row(int cols, int len, int k, int capacity, int sink, int recent) {
  TopKRowPlan p;
  p.len = len < 0 ? 0 : (len > cols ? cols : len);
  const int budget = k < 0 ? 0 : (k > capacity ? capacity : k);
  p.sink_end = sink < p.len ? sink : p.len;
  const int recent_start = recent < p.len ? p.len - recent : 0;
  p.recent_begin = recent_start > p.sink_end ? recent_start : p.sink_end;
  const int wanted = budget - p.forced();
  p.budget = wanted < 0 ? 0 : (wanted > p.region() ? p.region() : wanted);
  return p;
}

namespace detail {

template <class Key, class = void>
struct has_key_policy_members : std::false_type {};
template <class Key>
struct has_key_policy_members<Key, std::void_t<decltype(Key::kBits), typename Key::key_type,
                                               decltype(std::declval<const Key&>().validate())>>
    : std::true_type {};

template <class T, class Key>
constexpr bool check_key_policy() {
  static_assert(has_key_policy_members<Key>::value,
                "a top-k key policy needs kBits, key_type, operator()(T, int64_t, int32_t) and validate()");
  static_assert(Key::kBits > 0 && Key::kBits <= 64, "Key::kBits must be in [1, 64]");
  static_assert(std::is_same_v<typename Key::key_type, std::uint32_t> ||
                    std::is_same_v<typename Key::key_type, std::uint64_t>,
                "Key::key_type must be uint32_t or uint64_t");
  static_assert(Key::kBits <= int(8 * sizeof(typename Key::key_type)), "Key::kBits does not fit Key::key_type");
  static_assert(std::is_trivially_copyable_v<Key>, "a key policy is passed to kernels by value");
  return true;
}

template <class T, class Key>
Status validate_topk(const StridedView2D<const T>& scores, const TopKParams& p, const IndexSet& out,
                     const T* values, const Key& key) {
  KVSIFT_TRY(scores.validate("scores"));
  KVSIFT_REQUIRE(scores.cols <= INT32_MAX, kInvalidArgument, "scores.cols = ", scores.cols,
                 " must fit int32 positions");
  KVSIFT_REQUIRE(scores.row_stride >= 0, kInvalidArgument, "scores.row_stride = ", scores.row_stride,
                 " must be >= 0");
  KVSIFT_REQUIRE(reinterpret_cast<std::uintptr_t>(scores.data) % alignof(T) == 0, kMisaligned,
                 "scores.data = ", static_cast<const void*>(scores.data), " must be aligned to ", alignof(T),
                 " bytes");
  KVSIFT_TRY(out.validate("out"));
  KVSIFT_REQUIRE(out.rows >= scores.rows, kInvalidArgument, "out.rows = ", out.rows, " must be >= scores.rows = ",
                 scores.rows);
  KVSIFT_REQUIRE(p.k >= 0, kInvalidArgument, "k = ", p.k, " must be >= 0");
  KVSIFT_REQUIRE(p.k <= out.capacity, kInvalidArgument, "k = ", p.k, " exceeds out.capacity = ", out.capacity);
  KVSIFT_REQUIRE(p.sink >= 0, kInvalidArgument, "sink = ", p.sink, " must be >= 0");
  KVSIFT_REQUIRE(p.recent >= 0, kInvalidArgument, "recent = ", p.recent, " must be >= 0");
  KVSIFT_REQUIRE(p.num_kv_heads >= 0 && p.num_kv_heads <= kMaxKvHeads, kInvalidArgument, "num_kv_heads = ",
                 p.num_kv_heads, " must be in [0, ", kMaxKvHeads, "]");
  KVSIFT_REQUIRE(std::int64_t(p.sink) + p.recent <= out.capacity, kInvalidArgument, "sink + recent = ",
                 std::int64_t(p.sink) + p.recent, " exceeds out.capacity = ", out.capacity,
                 " (forced positions must fit the output)");
  if (scores.rows > 0 && out.capacity > 0) {
    KVSIFT_REQUIRE(reinterpret_cast<std::uintptr_t>(out.indices) % alignof(std::int32_t) == 0, kMisaligned,
                   "out.indices = ", static_cast<const void*>(out.indices), " must be aligned to 4 bytes");
  }
  KVSIFT_REQUIRE(reinterpret_cast<std::uintptr_t>(values) % alignof(T) == 0, kMisaligned, "values = ",
                 static_cast<const void*>(values), " must be aligned to ", alignof(T), " bytes");
  KVSIFT_TRY(key.validate());
  if (p.candidates.enabled())
    KVSIFT_REQUIRE((std::is_same_v<T, float> && std::is_same_v<Key, ScoreKey<float>>), kInvalidArgument,
                   "candidates need fp32 scores under ScoreKey<float> (a threshold on the score is a bound on the key)");
  KVSIFT_TRY(validate_score_candidates(p.candidates, 0, "candidates"));
  return Status();
}

}  // namespace detail

}  // namespace kvsift
