#pragma once
/// \file
/// \brief calibrate_num_block: ClusterAttn's offline choice of cluster granularity.
///
/// The paper picks num_block per dataset by maximising the cosine similarity between full and
/// compressed attention distributions on a sample of the data. For one batch of prompts this runs
/// the ClusterAttn compression once per candidate num_block and scores it with attention_cosine over
/// the given decode queries (driving decode with the full cache, so both sides see the same queries):
///
///   score(num_block) = mean over sequences, query heads and decode queries of cos(a_full, a_kept)
///
/// To calibrate over a dataset, call it per batch and average the tables' scores (the table keeps
/// the candidates' order). This is an offline procedure: it reads the scores back to the host, which
/// synchronises a CUDA stream; never call it inside a decode step.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvsift/core/check.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/query_rows.hpp"
#include "kvsift/kv/contiguous_kv.hpp"
#include "kvsift/ops/attention_similarity.hpp"
#include "kvsift/ops/attention_similarity_plan.hpp"
#include "kvsift/ops/attention_similarity_reference.hpp"
#include "kvsift/policy/prompt_compression.hpp"

namespace kvsift {

/// One candidate's row of the calibration table.
struct NumBlockScore {
  int num_block = 0;         ///< the candidate
  double mean_cosine = 0.0;  ///< score(num_block) of the file comment, in [0, 1] (0 for an empty batch)
};

/// What calibrate_num_block returns: the table and its best entry (host memory).
struct NumBlockCalibration {
  int best_num_block = 0;          ///< the candidate with the highest mean cosine; the first on ties
  double best_mean_cosine = -1.0;  ///< its mean cosine (-1 until a candidate is scored)
  std::vector<NumBlockScore> table;  ///< one entry per candidate, in the given order
};

namespace detail {

// Buffers of the calibration, carved from one workspace in a fixed order.
struct CalibrationScratch {
  std::int32_t* positions = nullptr;
  std::int32_t* new_lengths = nullptr;
  float* cosine = nullptr;
  Workspace stage;  // compress_prompt's workspace, then attention_cosine's: they run one after another
};

inline CalibrationScratch carve_calibration(WorkspaceCarver& ws, const PromptCompressionConfig& c,
                                            const PromptCompressionShape& s, int num_decode_queries,
                                            std::size_t stage_bytes) {
  CalibrationScratch x;
  x.positions = ws.take<std::int32_t>(std::size_t(s.rows(c)) * c.capacity);
  x.new_lengths = ws.take<std::int32_t>(std::size_t(s.batch));
  x.cosine = ws.take<float>(std::size_t(s.batch) * s.num_q_heads * num_decode_queries);
  x.stage = Workspace{ws.take<unsigned char>(stage_bytes), stage_bytes};
  return x;
}

// The larger of compress_prompt's workspace and attention_cosine's, from the shapes alone.
template <class Exec>
Status calibration_stage_bytes(const Exec& exec, const PromptCompressionConfig& c, const PromptCompressionShape& s,
                               int num_decode_queries, std::size_t* bytes) {
  std::size_t compression = 0, cosine = 0;
  KVSIFT_TRY(compress_prompt_workspace_bytes(exec, c, s, &compression));
  ContiguousKV<float> kv;
  kv.batch = s.batch;
  kv.num_kv_heads = s.num_kv_heads;
  QueryRows<float> q;
  q.num_heads = s.num_q_heads;
  q.capacity = num_decode_queries;
  const int heads = s.score_heads(c);
  const KeptPositions kept{nullptr, s.batch * heads, heads, c.capacity, c.capacity};
  KVSIFT_TRY(attention_cosine_workspace_bytes(exec, kv, q, num_decode_queries, c.sm_scale, kept, nullptr, &cosine));
  *bytes = std::max(compression, cosine);
  return Status();
}

}  // namespace detail

/// Workspace calibrate_num_block needs, from the shapes alone (no device memory touched): the
/// positions, new lengths and cosines of one candidate plus the larger of compress_prompt's and
/// attention_cosine's workspace. Fails as compress_prompt_workspace_bytes does (a bad config or shape,
/// kNullPointer for a null `bytes`).
template <class Exec>
Status calibrate_num_block_workspace_bytes(const Exec& exec, const PromptCompressionConfig& config,
                                           const PromptCompressionShape& shape, int num_decode_queries,
                                           std::size_t* bytes) {
  KVSIFT_REQUIRE_NOT_NULL(bytes, "bytes");
  std::size_t stage_bytes = 0;
  KVSIFT_TRY(detail::calibration_stage_bytes(exec, config, shape, num_decode_queries, &stage_bytes));
  WorkspaceCarver ws(nullptr, 0);
  detail::carve_calibration(ws, config, shape, num_decode_queries, stage_bytes);
  *bytes = ws.required_bytes();
  return Status();
}

/// Runs compress_prompt with each of `candidates` as config.num_block (config.policy must be
/// kClusterAttn; each candidate >= 1), scores it with attention_cosine and fills `*result` (host
/// memory). `window_queries` and `lse` are compress_prompt's `queries` and `lse`.
/// `scratch_dst` receives each candidate's compressed cache (capacity >= config.capacity; its contents
/// are overwritten). `decode_queries` holds num_decode_queries (>= 1) post-RoPE queries per sequence.
/// `workspace` holds calibrate_num_block_workspace_bytes bytes for this exec, config and shape.
/// Synchronises: it reads each candidate's cosines back to the host (offline use only). Errors:
/// kInvalidArgument or kNullPointer naming the parameter, or those of the stages.
template <class Exec, class Src, class QT, class Dst>
Status calibrate_num_block(const Exec& exec, PromptCompressionConfig config, const PromptCompressionShape& shape,
                           const Src& src, const QueryRows<QT>& window_queries, const float* lse,
                           const QueryRows<QT>& decode_queries, int num_decode_queries,
                           const std::vector<int>& candidates, const Dst& scratch_dst, NumBlockCalibration* result,
                           Workspace workspace) {
  KVSIFT_REQUIRE(config.policy == CompressionPolicy::kClusterAttn, kInvalidArgument, "config.policy = ",
                 to_string(config.policy), " must be ClusterAttn");
  KVSIFT_REQUIRE(!candidates.empty(), kInvalidArgument, "candidates is empty");
  KVSIFT_REQUIRE(num_decode_queries >= 1, kInvalidArgument, "num_decode_queries = ", num_decode_queries,
                 " must be >= 1");
  KVSIFT_REQUIRE_NOT_NULL(result, "result");
  for (int nb : candidates) KVSIFT_REQUIRE(nb >= 1, kInvalidArgument, "candidate num_block = ", nb, " must be >= 1");
  std::size_t stage_bytes = 0;
  KVSIFT_TRY(detail::calibration_stage_bytes(exec, config, shape, num_decode_queries, &stage_bytes));
  WorkspaceCarver ws(workspace);
  const detail::CalibrationScratch x = detail::carve_calibration(ws, config, shape, num_decode_queries, stage_bytes);
  KVSIFT_REQUIRE(workspace.data != nullptr, kNullPointer,
                 "workspace.data is null (ask calibrate_num_block_workspace_bytes)");
  KVSIFT_TRY(ws.status());

  const int heads = shape.score_heads(config);
  const KeptPositions kept{x.positions, src.batch * heads, heads, config.capacity, config.capacity};
  const std::size_t n_cos = std::size_t(src.batch) * decode_queries.num_heads * num_decode_queries;
  std::vector<float> cosine(n_cos);
  result->table.clear();
  result->best_mean_cosine = -1.0;
  for (int nb : candidates) {
    config.num_block = nb;
    KVSIFT_TRY(compress_prompt(exec, config, shape, src, window_queries, lse, scratch_dst,
                               CompactOutputs{x.new_lengths, x.positions, config.capacity}, x.stage));
    KVSIFT_TRY(attention_cosine(exec, src, decode_queries, num_decode_queries, config.sm_scale, kept, x.cosine,
                                x.stage));
    KVSIFT_TRY(read_to_host(exec, cosine.data(), x.cosine, n_cos * sizeof(float)));
    double sum = 0;
    for (float c : cosine) sum += c;
    const double mean = n_cos ? sum / double(n_cos) : 0.0;
    result->table.push_back({nb, mean});
    if (mean > result->best_mean_cosine) {
      result->best_mean_cosine = mean;
      result->best_num_block = nb;
    }
  }
  return Status();
}

}  // namespace kvsift
