#pragma once
/// \file
/// \brief decode_attention: attention of the newest q_len query positions over a KV view, for decoding.
/// This header is the contract (params and their validation). The split plan and the workspace query
/// are in decode_attention_plan.hpp, the host reference in decode_attention_reference.hpp, the CUDA
/// launcher in decode_attention.cuh. Guide: docs/ops/decode_attention.md.
///
/// Per (batch b, KV head h) the keys are either
///   retrieval head: tokens [0, len), len = min(kv.length(b), max_kv_length), or
///   sparse head:    the entries of index-set row b * num_kv_heads + h (tokens, or blocks of
///                   block_size tokens), with entries outside the sequence skipped;
/// the layer's HeadRoleMask chooses, so retrieval and sparse heads run in one launch (LycheeDecode's
/// hybrid layer); the default mask (every head retrieval) is plain dense attention. The
/// G = num_q_heads / num_kv_heads query heads of a KV head share its keys (GQA): query head hq reads
/// KV head hq / G.
///
/// Queries are the last q_len positions of the sequence: query position i (0-based) sits at token
/// len - q_len + i and sees tokens t <= len - q_len + i (causal); an index entry obeys the same mask.
///
///   io.q    QueryRows [batch, q_len, num_q_heads, head_dim] (head_dim contiguous, any strides)
///   io.out  OutputRows of the same shape and dtype, own strides; every element of every row is written
///   io.lse  optional float [batch, q_len, num_q_heads], natural log of sum_t exp(sm_scale * q.k_t)
///
/// fp8 KV (a view of fp8_e4m3_t / fp8_e5m2_t, kv/kv_scales.hpp): element i of K row (b, h, t) stands for
/// to_float(code) * kv.k_scale(b, h, t), V likewise with v_scale; queries and outputs are bf16 or fp16
/// (a float query is kUnsupported), accumulation fp32 on the GPU and double in the host reference.
///
/// Rows with no visible key (length 0, an empty or fully out-of-range index row, a query position
/// before the start of the sequence) give out = 0 and lse = -inf, never NaN.
///
/// Values: Q, K and V are finite, and every logit sm_scale * q.k_t and every weighted sum of V rows
/// fits a float; the GPU accumulates in fp32. Outside that (an inf or NaN element, or products near
/// FLT_MAX) the results are unspecified: the GPU may give inf or NaN where the double-precision host
/// reference still has a finite answer.
///
/// Duplicate entries in an index row are separate keys: a token listed twice is attended twice (its
/// weight doubles), exactly as if the cache held two copies. The kernels never deduplicate, so an
/// index row costs what it lists; producers such as top-k never emit duplicates.
///
/// Score emission (retrieval heads only, for LycheeDecode's top-k): with `scores` set, the raw score
/// of the group-mean query of the last position, s_t = (1/G) sum_g q_g . k_t (no sm_scale, no
/// softmax), is written to row b * num_kv_heads + h of `scores`, fused into the same pass over K:
///   score_block_size == 1:   entry t = s_t for t < len, -inf for len <= t < max_kv_length
///   score_block_size >= 16:  entry j = max of s_t over block j's tokens below len, -inf if none;
///                            j < ceil(max_kv_length / score_block_size)
/// Rows of sparse heads are not touched.
///
/// Score candidates (ops/score_candidates.hpp), with per-token scores: `candidates` set, the same
/// pass also lists, per row, the positions t < len with s_t >= candidates.thresholds[row] in segments
/// of its split length, for a top-k that selects from them (LycheeDecode's handoff).
///
/// Launch geometry and the workspace depend only on host values (shapes, max_kv_length, the index
/// set's capacity, the role mask, the Exec's device facts), never on device lengths, so a call can be
/// captured in a CUDA graph and replayed for any lengths up to max_kv_length.

#include <cmath>
#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/query_rows.hpp"
#include "kvsift/kv/head_roles.hpp"
#include "kvsift/kv/index_set.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/ops/score_candidates.hpp"

namespace kvsift {

/// The shortest segment of a candidate list: a split of a retrieval head covers whole block steps of
/// 64 tokens (kDecodeCtaTokens, decode_attention_plan.hpp), so a row has at most
/// ceil(max_kv_length / 64) segments.
inline constexpr int kDecodeCandidateMinSegment = 64;

/// ScoreCandidates::count_stride for decode_attention's lists over rows of up to max_kv_length tokens.
KVSIFT_HD constexpr int decode_candidate_count_stride(int max_kv_length) {
  return score_candidate_count_stride((max_kv_length + kDecodeCandidateMinSegment - 1) / kDecodeCandidateMinSegment);
}

/// Everything of one decode_attention call but the KV view and the Exec (see the file comment for the
/// semantics). Build it with make_decode_attention_params, then set roles, index_set and scores.
template <class T>
struct DecodeAttentionParams {
  using value_type = T;  ///< the element type of queries and outputs: the KV view's, or bf16 / fp16 over fp8 KV
  QueryIO<T> io;     ///< queries in, outputs (and optional LSE) out
  int num_q_heads = 0;   ///< query heads, a positive multiple of kv.num_kv_heads
  int head_dim = 0;  ///< must equal kv.head_dim; 64, 128 or 256
  int q_len = 1;         ///< newest query positions per sequence, >= 1 (q_len * G <= 4095)
  float sm_scale = 0.f;  ///< logit scale, finite (usually 1/sqrt(head_dim))
  /// Upper bound on the lengths of this call: sizes the grid. 0 takes the view's capacity
  /// (ContiguousKV, PagedKV); a custom view must set it. Keys at or past it are ignored.
  int max_kv_length = 0;
  HeadRoleMask roles;  ///< default: every head retrieval (dense attention)
  /// Rows b * num_kv_heads + h for the sparse heads; token or block granularity (block_size a power
  /// of two >= 16). Unused, and may be empty, when no head is sparse.
  ConstIndexSet index_set;
  float* scores = nullptr;  ///< optional, see the header comment
  std::int64_t score_row_stride = 0;  ///< entries between score rows, >= ceil(max_kv_length / score_block_size)
  int score_block_size = 1;  ///< 1: per token; a power of two >= 16: max per block
  /// Optional, with per-token scores: the positions at or above a threshold (see the header comment).
  /// counts needs kScoreCandidateHeader + ceil(max_kv_length / kDecodeCandidateMinSegment) ints a row.
  ScoreCandidates candidates;
};

/// Params for dense q/out tensors [batch, q_len, num_q_heads, head_dim] and sm_scale = 1/sqrt(d).
template <class T>
DecodeAttentionParams<T> make_decode_attention_params(const T* q, T* out, int q_len, int num_q_heads, int head_dim) {
  DecodeAttentionParams<T> p;
  p.io = make_query_io(q, out, q_len, num_q_heads, head_dim);
  p.num_q_heads = num_q_heads;
  p.head_dim = head_dim;
  p.q_len = q_len;
  p.sm_scale = 1.f / std::sqrt(float(head_dim));
  return p;
}

namespace detail {

inline int ceil_div(std::int64_t a, std::int64_t b) { return int((a + b - 1) / b); }
inline int round_up(int a, int b) { return ceil_div(a, b) * b; }

/// Tokens a view can hold (kv_capacity), 0 for a view that does not say: sizes the grid when
/// max_kv_length = 0.
template <class V>
int view_capacity(const V& kv) {
  const int cap = kv_capacity(kv);
  return cap > 0 ? cap : 0;
}

/// The lengths a call covers: max_kv_length, or the view's capacity.
template <class View, class T>
int decode_max_length(const View& kv, const DecodeAttentionParams<T>& p) {
  return p.max_kv_length > 0 ? p.max_kv_length : view_capacity(kv);
}

/// The query and output rows a call with sequences must have (the part of validation the size query skips).
template <class View, class T>
Status validate_decode_attention_rows(const View& kv, const DecodeAttentionParams<T>& p) {
  if (kv.batch == 0) return Status();
  KVSIFT_REQUIRE_NOT_NULL(p.io.q.data, "io.q.data");
  KVSIFT_REQUIRE_NOT_NULL(p.io.out.data, "io.out.data");
  return Status();
}

/// Shapes and values; `check_pointers` is off for the workspace-size query, which needs no data.
template <class View, class T>
Status validate_decode_attention(const View& kv, const DecodeAttentionParams<T>& p, bool check_pointers = true) {
  KVSIFT_TRY(kv.validate());
  // fp8 K/V are widened to 16 bits for the MMA with 16-bit queries; a float query has no such pairing.
  KVSIFT_REQUIRE(!is_fp8_view_v<View> || dtype_traits<T>::dtype == DType::kBFloat16 ||
                     dtype_traits<T>::dtype == DType::kFloat16,
                 kUnsupported, "fp8 KV needs bf16 or fp16 queries (got ", dtype_traits<T>::name, ")");
  KVSIFT_REQUIRE(p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256, kUnsupported, "head_dim = ", p.head_dim,
                 " is not supported (64, 128 or 256)");
  KVSIFT_REQUIRE(kv.head_dim == p.head_dim, kInvalidArgument, "kv.head_dim = ", kv.head_dim,
                 " must equal params.head_dim = ", p.head_dim);
  KVSIFT_REQUIRE(kv.num_kv_heads <= kMaxKvHeads, kUnsupported, "kv.num_kv_heads = ", kv.num_kv_heads, " exceeds ",
                 kMaxKvHeads);
  KVSIFT_REQUIRE(p.num_q_heads > 0 && p.num_q_heads % kv.num_kv_heads == 0, kInvalidArgument, "num_q_heads = ",
                 p.num_q_heads, " must be a positive multiple of kv.num_kv_heads = ", kv.num_kv_heads);
  KVSIFT_REQUIRE(p.q_len >= 1, kInvalidArgument, "q_len = ", p.q_len, " must be >= 1");
  KVSIFT_REQUIRE(std::isfinite(p.sm_scale), kInvalidArgument, "sm_scale = ", p.sm_scale, " must be finite");
  KVSIFT_REQUIRE(p.max_kv_length >= 0, kInvalidArgument, "max_kv_length = ", p.max_kv_length, " must be >= 0");
  KVSIFT_REQUIRE(p.max_kv_length > 0 || view_capacity(kv) > 0 || kv.batch == 0, kInvalidArgument,
                 "max_kv_length = 0 needs a view with a known capacity; set it for this view");
  const int group = p.num_q_heads / kv.num_kv_heads;
  KVSIFT_REQUIRE(std::int64_t(p.q_len) * group + 1 <= 4096, kUnsupported, "q_len * num_q_heads / num_kv_heads = ",
                 std::int64_t(p.q_len) * group, " exceeds 4095 query rows per KV head");
  if (p.roles.count_sparse(kv.num_kv_heads) > 0) {
    KVSIFT_TRY(p.index_set.validate("index_set"));
    KVSIFT_REQUIRE(p.index_set.rows >= kv.batch * kv.num_kv_heads, kInvalidArgument, "index_set.rows = ",
                   p.index_set.rows, " must be >= batch * num_kv_heads = ", kv.batch * kv.num_kv_heads);
    KVSIFT_REQUIRE(p.index_set.granularity == Granularity::kToken || p.index_set.block_size >= 16, kInvalidArgument,
                   "index_set.block_size = ", p.index_set.block_size, " must be a power of two >= 16");
    KVSIFT_REQUIRE(std::int64_t(p.index_set.capacity) * p.index_set.block_size <= INT32_MAX, kUnsupported,
                   "index_set.capacity * block_size = ", std::int64_t(p.index_set.capacity) * p.index_set.block_size,
                   " exceeds the int32 position range");
  }
  if (p.scores) {
    KVSIFT_REQUIRE(p.score_block_size == 1 || (is_power_of_two(p.score_block_size) && p.score_block_size >= 16),
                   kInvalidArgument, "score_block_size = ", p.score_block_size, " must be 1 or a power of two >= 16");
    const int cols = ceil_div(decode_max_length(kv, p), p.score_block_size);
    KVSIFT_REQUIRE(p.score_row_stride >= cols, kInvalidArgument, "score_row_stride = ", p.score_row_stride,
                   " must be >= ceil(max_kv_length / score_block_size) = ", cols);
  }
  if (p.candidates.enabled()) {
    KVSIFT_REQUIRE(p.scores != nullptr && p.score_block_size == 1, kInvalidArgument,
                   "candidates need per-token scores (scores set, score_block_size = 1)");
  }
  // One segment per split of a retrieval head; a split is at least one block step of tokens.
  KVSIFT_TRY(validate_score_candidates(p.candidates, ceil_div(decode_max_length(kv, p), kDecodeCandidateMinSegment),
                                       "candidates"));
  return check_pointers ? validate_decode_attention_rows(kv, p) : Status();
}

}  // namespace detail
}  // namespace kvsift
