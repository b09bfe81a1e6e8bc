#pragma once
/// \file
/// \brief Prompt KV-cache compression: ClusterAttn and its baselines SnapKV, StreamingLLM and H2O-prefill,
/// as one three-stage pipeline of shared ops, written once for both backends.
///
///   1. scores      window_scores           (ClusterAttn, SnapKV: last W queries; H2O: all queries)
///   2. transform   pool_scores             (SnapKV)
///                  cluster_flags           (ClusterAttn: flagged cluster tokens rank first)
///   3. select      topk                    (budget K = Cp - W per row, ties to the lower position;
///                                           StreamingLLM: forced 4 sinks + K - 4 recent, no scores)
///      compact     compact_kv              (kept prefix + the W window tokens -> destination view)
///
/// Call compress_prompt once per layer after prefill, with that layer's post-RoPE window queries and
/// prompt cache. Every head of a sequence keeps the same count, min(K, L - W) + min(W, L), so the
/// compressed cache is an ordinary cache of that length; a prompt with L <= Cp is copied whole. Decode
/// continues at the original positions L + t (keys keep their RoPE). One call handles a ragged batch.
/// No allocation and no host synchronisation inside: with cuda::Exec the call is graph-capturable;
/// size the workspace first with compress_prompt_workspace_bytes (from the shape alone, once).
/// validate(config) and validate(config, shape) check a configuration before any buffer is sized.

#include <cstddef>
#include <cstdint>

#include <algorithm>

#include "kvsift/core/check.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/query_rows.hpp"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/contiguous_kv.hpp"
#include "kvsift/kv/index_set.hpp"
#include "kvsift/ops/cluster_flags.hpp"
#include "kvsift/ops/cluster_flags_plan.hpp"
#include "kvsift/ops/cluster_flags_reference.hpp"
#include "kvsift/ops/compact_kv.hpp"
#include "kvsift/ops/compact_kv_plan.hpp"
#include "kvsift/ops/compact_kv_reference.hpp"
#include "kvsift/ops/score_pooling.hpp"
#include "kvsift/ops/score_pooling_plan.hpp"
#include "kvsift/ops/score_pooling_reference.hpp"
#include "kvsift/ops/topk.hpp"
#include "kvsift/ops/topk_plan.hpp"
#include "kvsift/ops/topk_reference.hpp"
#include "kvsift/ops/window_scores.hpp"
#include "kvsift/ops/window_scores_plan.hpp"
#include "kvsift/ops/window_scores_reference.hpp"

namespace kvsift {

/// Which prompt-compression method compress_prompt runs (the stages of each are in the file comment).
enum class CompressionPolicy : int { kClusterAttn, kSnapKV, kStreamingLLM, kH2OPrefill };

/// "ClusterAttn", "SnapKV", "StreamingLLM" or "H2O-prefill" ("unknown" outside the enumeration).
inline const char* to_string(CompressionPolicy p) {
  switch (p) {
    case CompressionPolicy::kClusterAttn: return "ClusterAttn";
    case CompressionPolicy::kSnapKV: return "SnapKV";
    case CompressionPolicy::kStreamingLLM: return "StreamingLLM";
    case CompressionPolicy::kH2OPrefill: return "H2O-prefill";
  }
  return "unknown";
}

/// What compress_prompt does to every layer: the policy, its budget and the parameters of its stages;
/// validate(config) checks it. Fields of the other policies' stages are ignored.
struct PromptCompressionConfig {
  CompressionPolicy policy = CompressionPolicy::kClusterAttn;  ///< the method
  int capacity = 1024;  ///< Cp: tokens kept per head, window included; > window
  int window = 32;      ///< W: observation window = the last W prompt tokens, always kept; >= 1
  float sm_scale = 0.f; ///< logit scale of the window scores; <= 0: 1 / sqrt(head_dim)
  ScoreHeads heads = ScoreHeads::kKvHeadMean;  ///< the score rows and so the heads of the compressed cache
  // ClusterAttn (budget is filled in from capacity - window)
  int num_block = 128;  ///< ClusterAttn: ClusterParams::num_block, >= 1 (calibrate_num_block picks it)
  float theta = 2e-3f;  ///< ClusterAttn: ClusterParams::theta, the density threshold on P, >= 0
  BlockRule block_rule = BlockRule::kPrefixSplit;  ///< ClusterAttn: ClusterParams::block_rule
  RadiusRule radius_rule = RadiusRule::kHalfBlock;  ///< ClusterAttn: ClusterParams::radius_rule
  int fixed_radius = 0;  ///< ClusterAttn: ClusterParams::fixed_radius (RadiusRule::kFixed), >= 0
  // SnapKV
  PoolParams pool = {PoolKind::kMax, 7};  ///< SnapKV: the pool applied to the scores before top-k
  // StreamingLLM
  int sinks = 4;  ///< StreamingLLM: sink tokens kept, in [0, budget()]; the rest of the budget is recent

  /// K = Cp - W: prefix tokens kept per head (the budget of top-k).
  int budget() const { return capacity - window; }
  /// The ClusterAttn fields as the ClusterParams of cluster_flags, with budget = budget().
  ClusterParams cluster() const {
    return ClusterParams{num_block, theta, budget(), block_rule, radius_rule, fixed_radius};
  }
};

/// Shapes the workspace is sized for: the largest batch and prompt the call will see.
struct PromptCompressionShape {
  int batch = 0;           ///< sequences, >= 0: an upper bound on src.batch
  int num_kv_heads = 0;    ///< KV heads per sequence, > 0: src.num_kv_heads
  int num_q_heads = 0;     ///< query heads, a positive multiple of num_kv_heads
  int max_prompt_len = 0;  ///< upper bound on every prompt length L, > window

  /// Heads of the score rows and of the compressed cache: num_kv_heads, or num_q_heads with
  /// ScoreHeads::kQueryHead.
  int score_heads(const PromptCompressionConfig& c) const {
    return c.heads == ScoreHeads::kKvHeadMean ? num_kv_heads : num_q_heads;
  }
  /// Score rows: batch * score_heads(c).
  std::int64_t rows(const PromptCompressionConfig& c) const { return std::int64_t(batch) * score_heads(c); }
};

/// The configuration alone: window, capacity, the policy and the parameters of its stages
/// (StreamingLLM's sinks, ClusterAttn's clustering, SnapKV's pooling); kInvalidArgument with a message
/// naming the field.
inline Status validate(const PromptCompressionConfig& c) {
  KVSIFT_REQUIRE(c.window >= 1, kInvalidArgument, "window = ", c.window, " must be >= 1");
  KVSIFT_REQUIRE(c.capacity > c.window, kInvalidArgument, "capacity = ", c.capacity, " must be > window = ",
                 c.window, " (Cp <= W keeps no prefix)");
  KVSIFT_REQUIRE(c.policy != CompressionPolicy::kStreamingLLM || (c.sinks >= 0 && c.sinks <= c.budget()),
                 kInvalidArgument, "sinks = ", c.sinks, " must be in [0, capacity - window = ", c.budget(), "]");
  KVSIFT_REQUIRE(c.policy == CompressionPolicy::kClusterAttn || c.policy == CompressionPolicy::kSnapKV ||
                     c.policy == CompressionPolicy::kStreamingLLM || c.policy == CompressionPolicy::kH2OPrefill,
                 kInvalidArgument, "policy = ", static_cast<int>(c.policy), " is not a CompressionPolicy");
  KVSIFT_TRY(detail::validate_score_heads(c.heads));
  if (c.policy == CompressionPolicy::kClusterAttn) KVSIFT_TRY(detail::validate_cluster_params(c.cluster()));
  if (c.policy == CompressionPolicy::kSnapKV) KVSIFT_TRY(detail::validate_pool_params(c.pool));
  return Status();
}

/// validate(c), then the configuration against the shapes the workspace is sized for (window <
/// max_prompt_len, head counts, batch >= 0); kInvalidArgument naming the field.
inline Status validate(const PromptCompressionConfig& c, const PromptCompressionShape& s) {
  KVSIFT_TRY(validate(c));
  KVSIFT_REQUIRE(s.max_prompt_len > c.window, kInvalidArgument, "window = ", c.window, " must be < max_prompt_len = ",
                 s.max_prompt_len, " (a window covering the prompt leaves nothing to score)");
  KVSIFT_REQUIRE(s.num_kv_heads > 0 && s.num_q_heads > 0 && s.num_q_heads % s.num_kv_heads == 0, kInvalidArgument,
                 "num_q_heads = ", s.num_q_heads, " must be a positive multiple of num_kv_heads = ", s.num_kv_heads);
  KVSIFT_REQUIRE(s.batch >= 0, kInvalidArgument, "batch = ", s.batch, " must be >= 0");
  return Status();
}

namespace detail {

// The window-score parameters of a policy (SnapKV and ClusterAttn: the window; H2O: all queries).
inline WindowScoreParams score_params(const PromptCompressionConfig& c, const PromptCompressionShape& s,
                                      const float* lse) {
  WindowScoreParams p;
  p.window = c.window;
  p.num_queries = c.policy == CompressionPolicy::kH2OPrefill ? kAllQueries : c.window;
  p.sm_scale = c.sm_scale;
  p.heads = c.heads;
  p.lse = lse;
  p.max_length = s.max_prompt_len;
  return p;
}

// Scratch of the stages' ops for the largest shape. The stages run one after another on the exec's
// stream, so they share one region, sized for the largest: the window scores' softmax partials
// (sized for the worst case: no lse from the engine, every prompt row a query for H2O), the
// clustering's block centres, and whatever the other ops' queries report. Stand-in views carry the
// shapes; no memory is touched.
template <class Exec>
Status compression_stage_bytes(const Exec& exec, const PromptCompressionConfig& c, const PromptCompressionShape& s,
                               std::size_t* bytes) {
  const std::int64_t rows = s.rows(c), cols = s.max_prompt_len;
  const int heads = s.score_heads(c), budget = c.budget() > 0 ? c.budget() : 0;
  ContiguousKV<float> kv;
  kv.batch = s.batch;
  kv.num_kv_heads = s.num_kv_heads;
  ContiguousKV<float> dst = kv;
  dst.num_kv_heads = heads;
  QueryRows<float> q;
  q.num_heads = s.num_q_heads;
  q.capacity = s.max_prompt_len;
  const auto scores = make_strided_view<float>(nullptr, rows, cols);
  const auto selection_scores = make_strided_view<const float>(nullptr, rows, cols);
  const auto flags = make_strided_view<std::uint8_t>(nullptr, rows, cols);
  const IndexSet kept = make_index_set(nullptr, nullptr, int(rows), budget);
  TopKParams select;
  select.k = budget;

  std::size_t need = 0, op = 0;
  KVSIFT_TRY(scored_prefix_lengths_workspace_bytes(exec, kv, c.window, heads, cols, nullptr, &op));
  need = std::max(need, op);
  if (c.policy != CompressionPolicy::kStreamingLLM) {
    KVSIFT_TRY(window_scores_workspace_bytes(exec, kv, q, score_params(c, s, nullptr), scores, &op));
    need = std::max(need, op);
  }
  if (c.policy == CompressionPolicy::kSnapKV) {
    KVSIFT_TRY(pool_scores_workspace_bytes(exec, selection_scores, nullptr, c.pool, scores, &op));
    need = std::max(need, op);
  }
  if (c.policy == CompressionPolicy::kClusterAttn) {
    KVSIFT_TRY(cluster_flags_workspace_bytes(exec, selection_scores, nullptr, c.cluster(), flags, &op));
    need = std::max(need, op);
    KVSIFT_TRY((topk_workspace_bytes<float, FlagFirstNonNegativeKey>(exec, selection_scores, select, kept, &op)));
  } else {
    KVSIFT_TRY(topk_workspace_bytes<float>(exec, selection_scores, select, kept, &op));
  }
  need = std::max(need, op);
  KVSIFT_TRY(compact_kv_workspace_bytes(exec, kv, as_const(kept), c.window, dst, CompactOutputs{}, &op));
  *bytes = std::max(need, op);
  return Status();
}

// Buffers of the pipeline, carved from one workspace in a fixed order.
struct CompressionScratch {
  float* scores = nullptr;
  float* pooled = nullptr;
  std::uint8_t* flags = nullptr;
  std::int32_t* row_lengths = nullptr;
  std::int32_t* kept = nullptr;
  std::int32_t* kept_counts = nullptr;
  Workspace stage;  // the current stage's op scratch (compression_stage_bytes)
};

inline CompressionScratch carve_compression(WorkspaceCarver& ws, const PromptCompressionConfig& c,
                                            const PromptCompressionShape& s, std::size_t stage_bytes) {
  const std::int64_t rows = s.rows(c), cols = s.max_prompt_len;
  CompressionScratch x;
  x.scores = ws.take<float>(std::size_t(rows * cols));
  if (c.policy == CompressionPolicy::kSnapKV) x.pooled = ws.take<float>(std::size_t(rows * cols));
  if (c.policy == CompressionPolicy::kClusterAttn) x.flags = ws.take<std::uint8_t>(std::size_t(rows * cols));
  x.row_lengths = ws.take<std::int32_t>(std::size_t(rows));
  x.kept = ws.take<std::int32_t>(std::size_t(rows * (c.budget() > 0 ? c.budget() : 0)));
  x.kept_counts = ws.take<std::int32_t>(std::size_t(rows));
  x.stage = Workspace{ws.take<unsigned char>(stage_bytes), stage_bytes};
  return x;
}

}  // namespace detail

/// Workspace compress_prompt needs for every call up to `shape`, from the shapes alone (no device
/// memory touched): the score matrix, the flags or pooled scores, the selection and the stages' op
/// scratch. Validates the configuration first (validate(config, shape)); kNullPointer for a null `bytes`.
template <class Exec>
Status compress_prompt_workspace_bytes(const Exec& exec, const PromptCompressionConfig& config,
                                       const PromptCompressionShape& shape, std::size_t* bytes) {
  KVSIFT_REQUIRE_NOT_NULL(bytes, "bytes");
  KVSIFT_TRY(validate(config, shape));
  std::size_t stage_bytes = 0;
  KVSIFT_TRY(detail::compression_stage_bytes(exec, config, shape, &stage_bytes));
  WorkspaceCarver ws(nullptr, 0);
  detail::carve_compression(ws, config, shape, stage_bytes);
  *bytes = ws.required_bytes();
  return Status();
}

/// One layer. `queries` holds the window's post-RoPE queries (all prompt queries for H2O-prefill);
/// `lse` (optional) each scored query's log-sum-exp from the prefill; `dst` receives the compressed
/// cache (its heads: num_kv_heads, or num_q_heads with ScoreHeads::kQueryHead); `out` the new lengths
/// and, optionally, each slot's original position. `workspace` holds compress_prompt_workspace_bytes
/// bytes for this exec, config and shape. Pointers are in the Exec's memory space. Fails before any
/// launch with a Status naming the parameter: a bad config or shape, src or dst not matching the
/// shape, an Exec without device facts, a null or short workspace.
template <class Exec, class Src, class QT, class Dst>
Status compress_prompt(const Exec& exec, const PromptCompressionConfig& config, const PromptCompressionShape& shape,
                       const Src& src, const QueryRows<QT>& queries, const float* lse, const Dst& dst,
                       CompactOutputs out, Workspace workspace) {
  KVSIFT_TRY(validate(config, shape));
  KVSIFT_TRY(exec.device.validate("compress_prompt"));
  KVSIFT_REQUIRE(src.batch <= shape.batch && src.num_kv_heads == shape.num_kv_heads, kInvalidArgument,
                 "src (batch ", src.batch, ", kv heads ", src.num_kv_heads, ") does not match the shape (batch ",
                 shape.batch, ", kv heads ", shape.num_kv_heads, ")");
  const int heads = shape.score_heads(config);
  KVSIFT_REQUIRE(dst.num_kv_heads == heads, kInvalidArgument, "dst.num_kv_heads = ", dst.num_kv_heads,
                 " must be ", heads, " for this ScoreHeads mode");
  std::size_t stage_bytes = 0;
  KVSIFT_TRY(detail::compression_stage_bytes(exec, config, shape, &stage_bytes));
  WorkspaceCarver ws(workspace);
  const detail::CompressionScratch x = detail::carve_compression(ws, config, shape, stage_bytes);
  KVSIFT_REQUIRE(workspace.data != nullptr, kNullPointer,
                 "workspace.data is null (ask compress_prompt_workspace_bytes)");
  KVSIFT_TRY(ws.status());

  const std::int64_t rows = std::int64_t(src.batch) * heads, cols = shape.max_prompt_len;
  const int budget = config.budget();
  // The score stages write each row's scored prefix only, and top-k loads whole rows (its loads go out
  // before a row's length arrives, and it uses nothing past the length). Clearing the matrices first
  // keeps those loads off memory nothing wrote (compute-sanitizer initcheck counted 14,552 such reads);
  // on the GPU one memset, ~2 us for 8 heads x 128K against a ~1.3 ms compression.
  KVSIFT_TRY(zero_memory(exec, x.scores, std::size_t(rows * cols) * sizeof(float)));
  if (x.pooled) KVSIFT_TRY(zero_memory(exec, x.pooled, std::size_t(rows * cols) * sizeof(float)));
  KVSIFT_TRY(scored_prefix_lengths(exec, src, config.window, heads, cols, x.row_lengths, x.stage));
  auto scores = make_strided_view(x.scores, rows, cols);
  auto selection_scores = make_strided_view<const float>(x.scores, rows, cols);
  IndexSet kept = make_index_set(x.kept, x.kept_counts, int(rows), budget);
  TopKParams select;
  select.k = budget;
  select.lengths = x.row_lengths;
  float* const no_values = nullptr;

  switch (config.policy) {
    case CompressionPolicy::kStreamingLLM:
      // Forced ranges fill the whole budget, so no score is read.
      select.sink = config.sinks;
      select.recent = budget - config.sinks;
      KVSIFT_TRY(topk(exec, selection_scores, select, kept, no_values, ScoreKey<float>{}, x.stage));
      break;
    case CompressionPolicy::kSnapKV:
    case CompressionPolicy::kH2OPrefill: {
      KVSIFT_TRY(window_scores(exec, src, queries, detail::score_params(config, shape, lse), scores, x.stage));
      if (config.policy == CompressionPolicy::kSnapKV) {
        const auto pooled = make_strided_view(x.pooled, rows, cols);
        KVSIFT_TRY(pool_scores(exec, selection_scores, x.row_lengths, config.pool, pooled, x.stage));
        selection_scores = make_strided_view<const float>(x.pooled, rows, cols);
      }
      KVSIFT_TRY(topk(exec, selection_scores, select, kept, no_values, ScoreKey<float>{}, x.stage));
      break;
    }
    case CompressionPolicy::kClusterAttn: {
      KVSIFT_TRY(window_scores(exec, src, queries, detail::score_params(config, shape, lse), scores, x.stage));
      auto flags = make_strided_view(x.flags, rows, cols);
      KVSIFT_TRY(cluster_flags(exec, selection_scores, x.row_lengths, config.cluster(), flags, x.stage));
      FlagFirstNonNegativeKey key;  // window scores are never negative: 32-bit keys, the register select
      key.flags = x.flags;
      key.row_stride = cols;
      KVSIFT_TRY(topk(exec, selection_scores, select, kept, no_values, key, x.stage));
      break;
    }
  }
  return compact_kv(exec, src, as_const(kept), config.window, dst, out, x.stage);
}

}  // namespace kvsift
