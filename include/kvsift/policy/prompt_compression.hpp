#pragma once
// Prompt KV-cache compression: ClusterAttn and its baselines SnapKV, StreamingLLM and H2O-prefill,
// as one three-stage pipeline of shared ops, written once for both backends.
//
//   1. scores      window_scores           (ClusterAttn, SnapKV: last W queries; H2O: all queries)
//   2. transform   pool_scores             (SnapKV)
//                  cluster_flags           (ClusterAttn: flagged cluster tokens rank first)
//   3. select      topk                    (budget K = Cp - W per row, ties to the lower position;
//                                           StreamingLLM: forced 4 sinks + K - 4 recent, no scores)
//      compact     compact_kv              (kept prefix + the W window tokens -> destination view)
//
// Call compress_prompt once per layer after prefill, with that layer's post-RoPE window queries and
// prompt cache. Every head of a sequence keeps the same count, min(K, L - W) + min(W, L), so the
// compressed cache is an ordinary cache of that length; a prompt with L <= Cp is copied whole. Decode
// continues at the original positions L + t (keys keep their RoPE). One call handles a ragged batch.
// No allocation and no host synchronisation inside: with cuda::Exec the call is graph-capturable;
// size the workspace first with compress_prompt_workspace_bytes.

#include <cstddef>
#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/contiguous_kv.hpp"
#include "kvsift/kv/index_set.hpp"
#include "kvsift/ops/cluster_flags.hpp"
#include "kvsift/ops/compact_kv.hpp"
#include "kvsift/ops/score_pooling.hpp"
#include "kvsift/ops/topk.hpp"
#include "kvsift/ops/topk_reference.hpp"
#include "kvsift/ops/window_scores.hpp"

namespace kvsift {

enum class CompressionPolicy : int { kClusterAttn, kSnapKV, kStreamingLLM, kH2OPrefill };

inline const char* to_string(CompressionPolicy p) {
  switch (p) {
    case CompressionPolicy::kClusterAttn: return "ClusterAttn";
    case CompressionPolicy::kSnapKV: return "SnapKV";
    case CompressionPolicy::kStreamingLLM: return "StreamingLLM";
    case CompressionPolicy::kH2OPrefill: return "H2O-prefill";
  }
  return "unknown";
}

struct PromptCompressionConfig {
  CompressionPolicy policy = CompressionPolicy::kClusterAttn;
  int capacity = 1024;  // Cp: tokens kept per head, window included
  int window = 32;      // W: observation window = the last W prompt tokens, always kept
  float sm_scale = 0.f; // <= 0: 1 / sqrt(head_dim)
  ScoreHeads heads = ScoreHeads::kKvHeadMean;
  // ClusterAttn (budget is filled in from capacity - window)
  int num_block = 128;
  float theta = 2e-3f;
  BlockRule block_rule = BlockRule::kPrefixSplit;
  RadiusRule radius_rule = RadiusRule::kHalfBlock;
  int fixed_radius = 0;
  // SnapKV
  PoolParams pool = {PoolKind::kMax, 7};
  // StreamingLLM
  int sinks = 4;

  int budget() const { return capacity - window; }
  ClusterParams cluster() const {
    return ClusterParams{num_block, theta, budget(), block_rule, radius_rule, fixed_radius};
  }
};

// Shapes the workspace is sized for: the largest batch and prompt the call will see.
struct PromptCompressionShape {
  int batch = 0;
  int num_kv_heads = 0;
  int num_q_heads = 0;
  int max_prompt_len = 0;

  int score_heads(const PromptCompressionConfig& c) const {
    return c.heads == ScoreHeads::kKvHeadMean ? num_kv_heads : num_q_heads;
  }
  std::int64_t rows(const PromptCompressionConfig& c) const { return std::int64_t(batch) * score_heads(c); }
};

namespace detail {

// Scratch buffers of the pipeline, carved from one workspace in a fixed order.
struct CompressionScratch {
  float* scores = nullptr;
  float* pooled = nullptr;
  std::uint8_t* flags = nullptr;
  void* cluster_ws = nullptr;
  std::int32_t* row_lengths = nullptr;
  std::int32_t* kept = nullptr;
  std::int32_t* kept_counts = nullptr;
  std::size_t cluster_ws_bytes = 0;
  void* scores_ws = nullptr;
  std::size_t scores_ws_bytes = 0;
};

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

// Window-score scratch for the largest shape, from a stand-in view and query rows (only their
// shapes matter).
inline std::size_t compression_score_ws_bytes(const PromptCompressionConfig& c, const PromptCompressionShape& s,
                                              bool lse_given, int q_capacity) {
  if (c.policy == CompressionPolicy::kStreamingLLM || lse_given) return 0;
  ContiguousKV<float> shape_kv;
  shape_kv.batch = s.batch;
  shape_kv.num_kv_heads = s.num_kv_heads;
  QueryRows<float> shape_q;
  shape_q.num_heads = s.num_q_heads;
  shape_q.capacity = q_capacity;
  return window_scores_workspace_bytes(shape_kv, shape_q, score_params(c, s, nullptr));
}

inline CompressionScratch carve_compression(WorkspaceCarver& ws, const PromptCompressionConfig& c,
                                            const PromptCompressionShape& s) {
  const std::int64_t rows = s.rows(c), cols = s.max_prompt_len;
  CompressionScratch x;
  x.scores = ws.take<float>(std::size_t(rows * cols));
  if (c.policy == CompressionPolicy::kSnapKV) x.pooled = ws.take<float>(std::size_t(rows * cols));
  if (c.policy == CompressionPolicy::kClusterAttn) {
    x.flags = ws.take<std::uint8_t>(std::size_t(rows * cols));
    x.cluster_ws_bytes = cluster_flags_workspace_bytes(rows, cols);
    x.cluster_ws = ws.take<unsigned char>(x.cluster_ws_bytes);
  }
  x.row_lengths = ws.take<std::int32_t>(std::size_t(rows));
  x.kept = ws.take<std::int32_t>(std::size_t(rows * (c.budget() > 0 ? c.budget() : 0)));
  x.kept_counts = ws.take<std::int32_t>(std::size_t(rows));
  // Sized for the worst case (no lse from the engine, every prompt row a query for H2O).
  x.scores_ws_bytes = compression_score_ws_bytes(c, s, false, s.max_prompt_len);
  x.scores_ws = ws.take<unsigned char>(x.scores_ws_bytes);
  return x;
}

inline Status validate_compression_config(const PromptCompressionConfig& c, const PromptCompressionShape& s) {
  KVSIFT_REQUIRE(c.window >= 1, kInvalidArgument, "window = ", c.window, " must be >= 1");
  KVSIFT_REQUIRE(c.capacity > c.window, kInvalidArgument, "capacity = ", c.capacity, " must be > window = ",
                 c.window, " (Cp <= W keeps no prefix)");
  KVSIFT_REQUIRE(s.max_prompt_len > c.window, kInvalidArgument, "window = ", c.window,
                 " must be < max_prompt_len = ", s.max_prompt_len, " (a window covering the prompt leaves nothing to score)");
  KVSIFT_REQUIRE(s.num_kv_heads > 0 && s.num_q_heads > 0 && s.num_q_heads % s.num_kv_heads == 0, kInvalidArgument,
                 "num_q_heads = ", s.num_q_heads, " must be a positive multiple of num_kv_heads = ", s.num_kv_heads);
  KVSIFT_REQUIRE(c.policy != CompressionPolicy::kStreamingLLM || (c.sinks >= 0 && c.sinks <= c.budget()),
                 kInvalidArgument, "sinks = ", c.sinks, " must be in [0, capacity - window = ", c.budget(), "]");
  KVSIFT_REQUIRE(c.policy == CompressionPolicy::kClusterAttn || c.policy == CompressionPolicy::kSnapKV ||
                     c.policy == CompressionPolicy::kStreamingLLM || c.policy == CompressionPolicy::kH2OPrefill,
                 kInvalidArgument, "policy = ", static_cast<int>(c.policy), " is not a CompressionPolicy");
  return Status();
}

}  // namespace detail

inline std::size_t compress_prompt_workspace_bytes(const PromptCompressionConfig& config,
                                                   const PromptCompressionShape& shape) {
  WorkspaceCarver ws(nullptr, 0);
  detail::carve_compression(ws, config, shape);
  return ws.required_bytes();
}

// One layer. `queries` holds the window's post-RoPE queries (all prompt queries for H2O-prefill);
// `lse` (optional) each scored query's log-sum-exp from the prefill; `dst` receives the compressed
// cache (its heads: num_kv_heads, or num_q_heads with ScoreHeads::kQueryHead); `out` the new lengths
// and, optionally, each slot's original position.
template <class Exec, class Src, class QT, class Dst>
Status compress_prompt(Exec exec, const PromptCompressionConfig& config, const PromptCompressionShape& shape,
                       const Src& src, const QueryRows<QT>& queries, const float* lse, const Dst& dst,
                       CompactOutputs out, void* workspace, std::size_t workspace_bytes) {
  KVSIFT_TRY(detail::validate_compression_config(config, shape));
  KVSIFT_REQUIRE(src.batch <= shape.batch && src.num_kv_heads == shape.num_kv_heads, kInvalidArgument,
                 "src (batch ", src.batch, ", kv heads ", src.num_kv_heads, ") does not match the shape (batch ",
                 shape.batch, ", kv heads ", shape.num_kv_heads, ")");
  const int heads = shape.score_heads(config);
  KVSIFT_REQUIRE(dst.num_kv_heads == heads, kInvalidArgument, "dst.num_kv_heads = ", dst.num_kv_heads,
                 " must be ", heads, " for this ScoreHeads mode");
  WorkspaceCarver ws(workspace, workspace_bytes);
  const detail::CompressionScratch x = detail::carve_compression(ws, config, shape);
  KVSIFT_REQUIRE(workspace != nullptr, kNullPointer, "workspace is null (ask compress_prompt_workspace_bytes)");
  KVSIFT_TRY(ws.status());

  const std::int64_t rows = std::int64_t(src.batch) * heads, cols = shape.max_prompt_len;
  const int budget = config.budget();
  KVSIFT_TRY(scored_prefix_lengths(exec, src, config.window, heads, cols, x.row_lengths));
  auto scores = make_strided_view(x.scores, rows, cols);
  auto selection_scores = make_strided_view<const float>(x.scores, rows, cols);
  IndexSet kept = make_index_set(x.kept, x.kept_counts, int(rows), budget);
  TopKParams select;
  select.k = budget;
  select.lengths = x.row_lengths;

  switch (config.policy) {
    case CompressionPolicy::kStreamingLLM:
      // Forced ranges fill the whole budget, so no score is read.
      select.sink = config.sinks;
      select.recent = budget - config.sinks;
      KVSIFT_TRY(topk(exec, selection_scores, select, kept));
      break;
    case CompressionPolicy::kSnapKV:
    case CompressionPolicy::kH2OPrefill: {
      KVSIFT_TRY(window_scores(exec, src, queries, detail::score_params(config, shape, lse), scores, x.scores_ws,
                               x.scores_ws_bytes));
      if (config.policy == CompressionPolicy::kSnapKV) {
        KVSIFT_TRY(pool_scores(exec, selection_scores, x.row_lengths, config.pool, make_strided_view(x.pooled, rows, cols)));
        selection_scores = make_strided_view<const float>(x.pooled, rows, cols);
      }
      KVSIFT_TRY(topk(exec, selection_scores, select, kept));
      break;
    }
    case CompressionPolicy::kClusterAttn: {
      KVSIFT_TRY(window_scores(exec, src, queries, detail::score_params(config, shape, lse), scores, x.scores_ws,
                               x.scores_ws_bytes));
      auto flags = make_strided_view(x.flags, rows, cols);
      KVSIFT_TRY(cluster_flags(exec, selection_scores, x.row_lengths, config.cluster(), flags, x.cluster_ws,
                               x.cluster_ws_bytes));
      FlagFirstKey<float> key;
      key.flags = x.flags;
      key.row_stride = cols;
      KVSIFT_TRY(topk(exec, selection_scores, select, kept, static_cast<float*>(nullptr), key));
      break;
    }
  }
  return compact_kv(exec, src, as_const(kept), config.window, dst, out);
}

}  // namespace kvsift
