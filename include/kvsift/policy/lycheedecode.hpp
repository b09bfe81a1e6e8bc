#pragma once
// LycheeDecode: hybrid-head sparse decoding, written once for both backends (host::Exec, cuda::Exec).
// Guide: docs/ops/lycheedecode.md. Spec: specs/lycheedecode.md.
//
// Per decode step the engine calls decode_layer for layers 0 .. num_layers-1, in order, after
// appending the new token's K/V to that layer's cache. One call:
//
//   1. decode_attention   one launch for the whole layer: retrieval KV heads attend densely over the
//                         sequence and emit the raw group-mean-query score of every token (or the max
//                         per block) in the same pass; sparse KV heads attend only to the entries of
//                         their index-table row; splits balanced across both kinds;
//   2. handoff            (layers with retrieval heads) top-k of each retrieval head's scores, forced
//                         sink/recent inside the budget, written to that head's table row for the
//                         sparse heads of later layers (lycheedecode_handoff.hpp).
//
// Every pointer (view, io, state, workspace) is in the backend's memory space; nothing is allocated,
// nothing waits on the host, and launch shapes come from the configuration's capacities: a whole
// multi-layer step captures into one CUDA graph and replays as lengths change.
//
// Cache correction (off by default): at a step where correction_due(step) holds, the engine runs
// correct_layer for every layer instead: dense causal attention of the last correction_interval
// positions (q_len = interval) over the whole cache, after recomputing those positions' K/V from a
// dense forward; the last row's output yields the next token. See the guide for the engine's side.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kvsift/core/check.hpp"
#include "kvsift/core/dtype.hpp"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/index_set.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/ops/decode_attention.hpp"
#include "kvsift/ops/topk.hpp"
#include "kvsift/ops/topk_plan.hpp"
#include "kvsift/ops/topk_reference.hpp"
#include "kvsift/policy/lycheedecode_config.hpp"
#include "kvsift/policy/lycheedecode_handoff.hpp"
#include "kvsift/policy/lycheedecode_state.hpp"

namespace kvsift {

// Queries in and attention outputs out of one layer call, through element strides (head_dim
// contiguous): q [batch, q_len, num_q_heads, head_dim] post-RoPE, out the same shape and dtype.
// q_len is 1 for decode_layer and correction_interval for correct_layer.
template <class T>
struct LycheeLayerIO {
  const T* q = nullptr;
  std::int64_t q_batch_stride = 0, q_token_stride = 0, q_head_stride = 0;
  T* out = nullptr;
  std::int64_t out_batch_stride = 0, out_token_stride = 0, out_head_stride = 0;
  float* lse = nullptr;  // optional [batch, q_len, num_q_heads], natural-log LSE of the scaled logits
};

// IO for dense q/out tensors [batch, q_len, num_q_heads, head_dim].
template <class T>
LycheeLayerIO<T> make_lychee_io(const T* q, T* out, int q_len, int num_q_heads, int head_dim) {
  LycheeLayerIO<T> io;
  io.q = q;
  io.out = out;
  io.q_head_stride = io.out_head_stride = head_dim;
  io.q_token_stride = io.out_token_stride = std::int64_t(num_q_heads) * head_dim;
  io.q_batch_stride = io.out_batch_stride = std::int64_t(q_len) * num_q_heads * head_dim;
  return io;
}

namespace detail {

// A view with a shape and nothing behind it: lets the workspace query plan the attention launches
// before any cache exists. Only its value_type's size matters (tensor-core vs CUDA-core tiles).
template <class T>
struct ShapeOnlyKV {
  using value_type = T;
  int batch = 0, num_kv_heads = 0, head_dim = 0;
  KVSIFT_HD T* k_row(int, int, int) const { return nullptr; }
  KVSIFT_HD T* v_row(int, int, int) const { return nullptr; }
  KVSIFT_HD int length(int) const { return 0; }
  Status validate() const { return Status(); }
};

// The decode_attention parameters of one layer call; the same function builds the workspace query's
// parameters, so the query and the launch plan identically.
template <class T>
DecodeAttentionParams<T> lycheedecode_attention_params(const LycheeDecodeConfig& c, const LycheeLayerIO<T>& io, int q_len,
                                                 const HeadRoleMask& sparse, const ConstIndexSet& table,
                                                 float* scores, std::int64_t score_stride) {
  DecodeAttentionParams<T> p;
  p.q = io.q;
  p.q_batch_stride = io.q_batch_stride;
  p.q_token_stride = io.q_token_stride;
  p.q_head_stride = io.q_head_stride;
  p.out = io.out;
  p.out_batch_stride = io.out_batch_stride;
  p.out_token_stride = io.out_token_stride;
  p.out_head_stride = io.out_head_stride;
  p.lse = io.lse;
  p.num_q_heads = c.num_q_heads;
  p.head_dim = c.head_dim;
  p.q_len = q_len;
  p.sm_scale = c.sm_scale > 0.f ? c.sm_scale : 1.f / std::sqrt(float(c.head_dim));
  p.max_kv_length = c.max_kv_length;
  p.roles = sparse;
  if (sparse.count_sparse(c.num_kv_heads) > 0) p.gather = table;
  if (scores != nullptr) {
    p.scores = scores;
    p.score_row_stride = score_stride;
    p.score_block_size = lycheedecode_entry_tokens(c);
  }
  p.num_sms = c.num_sms;
  return p;
}

// Scratch of one layer call, carved from the caller's workspace in a fixed order. Nothing in it
// outlives the call, so one workspace serves every layer (and other ops in between).
struct LycheeDecodeScratch {
  float* scores = nullptr;  // [max_batch * num_kv_heads, score_stride]: retrieval rows written per layer
  int score_cols = 0;
  std::int64_t score_stride = 0;
  std::int32_t* row_lengths = nullptr;      // [rows] entries top-k ranks per row
  std::int32_t* row_budget = nullptr;       // [rows] ratio mode
  std::int32_t* recent_from = nullptr;      // [rows] block mode
  std::int32_t* selected_counts = nullptr;  // [rows] top-k's counts before the commit
  void* attention = nullptr;
  std::size_t attention_bytes = 0;
  void* selection = nullptr;
  std::size_t selection_bytes = 0;
};

}  // namespace detail

class LycheeDecodePolicy {
 public:
  // Validates the configuration (messages name the parameter) and plans the workspace once.
  static Status create(const LycheeDecodeConfig& config, LycheeDecodePolicy* out) {
    KVSIFT_REQUIRE_NOT_NULL(out, "out");
    KVSIFT_TRY(validate_lycheedecode_config(config));
    LycheeDecodePolicy d;
    d.config_ = config;
    d.sparse_.resize(std::size_t(config.num_layers));
    for (int l = 0; l < config.num_layers; ++l)
      for (int h = 0; h < config.num_kv_heads; ++h) d.sparse_[l].set_sparse(h, !config.roles.is_retrieval(l, h));
    KVSIFT_TRY(d.plan_attention_workspace<half_t>(&d.attention_bytes_16bit_));
    KVSIFT_TRY(d.plan_attention_workspace<float>(&d.attention_bytes_32bit_));
    *out = std::move(d);
    return Status();
  }

  const LycheeDecodeConfig& config() const { return config_; }
  int index_capacity() const { return lycheedecode_index_capacity(config_); }
  // Heads of `layer` that attend through the index table (set bit = sparse head).
  const HeadRoleMask& sparse_heads(int layer) const { return sparse_[std::size_t(layer)]; }
  int retrieval_heads(int layer) const {
    return config_.num_kv_heads - sparse_heads(layer).count_sparse(config_.num_kv_heads);
  }

  std::size_t state_bytes() const { return lycheedecode_state_bytes(config_); }
  Status make_state(void* memory, std::size_t bytes, LycheeDecodeState* state) const {
    return make_lycheedecode_state(config_, memory, bytes, state);
  }

  // Bytes of workspace a layer call needs, for KV element type KT (the view's value_type). Computed
  // from the capacities only; one workspace serves every layer and every batch up to max_batch.
  template <class KT>
  std::size_t workspace_bytes() const {
    WorkspaceCarver ws(nullptr, 0);
    carve_scratch<KT>(ws);
    return ws.required_bytes();
  }

  bool correction_due(std::int64_t step) const { return kvsift::correction_due(config_, step); }
  bool correction_due(const LycheeDecodeState& state) const { return kvsift::correction_due(config_, state.steps); }

  // One layer of a sparse decode step (q_len = 1). `kv` already holds the new token at position
  // length - 1. Pointers of kv, io, state and workspace are in the memory space of `exec`.
  template <class Exec, class View, class T>
  Status decode_layer(Exec exec, LycheeDecodeState& state, int layer, const View& kv, const LycheeLayerIO<T>& io,
                      void* workspace, std::size_t workspace_bytes) const {
    static_assert(check_kv_view<View>());
    KVSIFT_TRY(check_layer_call(state, layer, kv));
    KVSIFT_REQUIRE_NOT_NULL(workspace, "workspace (ask workspace_bytes<KT>())");
    WorkspaceCarver ws(workspace, workspace_bytes);
    const detail::LycheeDecodeScratch x = carve_scratch<typename View::value_type>(ws);
    KVSIFT_TRY(ws.status());

    const HeadRoleMask& sparse = sparse_heads(layer);
    const bool selects = retrieval_heads(layer) > 0;
    const auto attention = detail::lycheedecode_attention_params(config_, io, 1, sparse, as_const(state.table),
                                                           selects ? x.scores : nullptr, x.score_stride);
    KVSIFT_TRY(decode_attention(exec, kv, attention, x.attention, x.attention_bytes));
    if (selects) KVSIFT_TRY(hand_off(exec, state, sparse, kv, x));
    advance(state, layer, kv.batch);
    return Status();
  }

  // One layer of a cache-correction step: dense causal attention of the last correction_interval
  // positions (io holds q_len = correction_interval query rows) over the whole cache, every head
  // dense, the index table untouched. The sequences must hold at least correction_interval tokens.
  template <class Exec, class View, class T>
  Status correct_layer(Exec exec, LycheeDecodeState& state, int layer, const View& kv, const LycheeLayerIO<T>& io,
                       void* workspace, std::size_t workspace_bytes) const {
    static_assert(check_kv_view<View>());
    KVSIFT_REQUIRE(config_.correction_interval > 0, kInvalidArgument,
                   "correction_interval = 0: cache correction is off (the workspace has no room for it)");
    KVSIFT_TRY(check_layer_call(state, layer, kv));
    KVSIFT_REQUIRE_NOT_NULL(workspace, "workspace (ask workspace_bytes<KT>())");
    WorkspaceCarver ws(workspace, workspace_bytes);
    const detail::LycheeDecodeScratch x = carve_scratch<typename View::value_type>(ws);
    KVSIFT_TRY(ws.status());
    const auto attention = detail::lycheedecode_attention_params(config_, io, config_.correction_interval,
                                                           HeadRoleMask::all_retrieval(), ConstIndexSet(), nullptr, 0);
    KVSIFT_TRY(decode_attention(exec, kv, attention, x.attention, x.attention_bytes));
    advance(state, layer, kv.batch);
    return Status();
  }

 private:
  int score_cols() const {
    const int unit = lycheedecode_entry_tokens(config_);
    return (config_.max_kv_length + unit - 1) / unit;
  }
  // Rows start on 16 bytes so top-k streams them with vector loads.
  std::int64_t score_stride() const { return (std::int64_t(score_cols()) + 3) / 4 * 4; }
  int rows() const { return config_.max_batch * config_.num_kv_heads; }

  template <class KT>
  detail::LycheeDecodeScratch carve_scratch(WorkspaceCarver& ws) const {
    detail::LycheeDecodeScratch x;
    x.score_cols = score_cols();
    x.score_stride = score_stride();
    const std::size_t r = std::size_t(rows());
    x.scores = ws.take<float>(r * std::size_t(x.score_stride));
    x.row_lengths = ws.take<std::int32_t>(r);
    x.row_budget = ws.take<std::int32_t>(r);
    x.recent_from = ws.take<std::int32_t>(r);
    x.selected_counts = ws.take<std::int32_t>(r);
    x.attention_bytes = sizeof(KT) == 2 ? attention_bytes_16bit_ : attention_bytes_32bit_;
    x.attention = ws.take<unsigned char>(x.attention_bytes);
    const StridedView2D<const float> shape{nullptr, std::int64_t(r), x.score_cols, x.score_stride};
    std::size_t by_score = 0, by_recent = 0;
    (void)topk_workspace_bytes<float, ScoreKey<float>>(host::Exec{}, shape, TopKParams(), IndexSet(), &by_score);
    (void)topk_workspace_bytes<float, RecentBlocksFirstKey>(host::Exec{}, shape, TopKParams(), IndexSet(), &by_recent);
    x.selection_bytes = std::max(by_score, by_recent);
    x.selection = ws.take<unsigned char>(x.selection_bytes);
    return x;
  }

  // The largest decode_attention workspace over every batch up to max_batch, every role mix of the
  // layers and the correction pass (the split plan depends on all three).
  template <class KT>
  Status plan_attention_workspace(std::size_t* bytes) const {
    static const std::int32_t kShapeOnly = 0;  // validation wants non-null pointers; never read
    ConstIndexSet table;
    table.indices = table.counts = &kShapeOnly;
    table.rows = rows();
    table.capacity = table.row_stride = index_capacity();
    table.granularity = lycheedecode_granularity(config_);
    table.block_size = lycheedecode_entry_tokens(config_);
    std::vector<int> seen_sparse_counts;
    std::vector<const HeadRoleMask*> mixes;
    for (const HeadRoleMask& m : sparse_) {
      const int n = m.count_sparse(config_.num_kv_heads);
      if (std::find(seen_sparse_counts.begin(), seen_sparse_counts.end(), n) != seen_sparse_counts.end()) continue;
      seen_sparse_counts.push_back(n);
      mixes.push_back(&m);
    }
    float score_shape = 0.f;  // a non-null score pointer for the plan; never written
    const LycheeLayerIO<float> io{};
    *bytes = 0;
    for (int batch = 1; batch <= config_.max_batch; ++batch) {
      detail::ShapeOnlyKV<KT> kv;
      kv.batch = batch;
      kv.num_kv_heads = config_.num_kv_heads;
      kv.head_dim = config_.head_dim;
      std::size_t need = 0;
      for (const HeadRoleMask* m : mixes) {
        const bool selects = m->count_sparse(config_.num_kv_heads) < config_.num_kv_heads;
        const auto p = detail::lycheedecode_attention_params(config_, io, 1, *m, table, selects ? &score_shape : nullptr,
                                                       score_stride());
        KVSIFT_TRY(decode_attention_workspace_bytes(kv, p, &need));
        *bytes = std::max(*bytes, need);
      }
      if (config_.correction_interval > 0) {
        const auto p = detail::lycheedecode_attention_params(config_, io, config_.correction_interval,
                                                       HeadRoleMask::all_retrieval(), ConstIndexSet(), nullptr, 0);
        KVSIFT_TRY(decode_attention_workspace_bytes(kv, p, &need));
        *bytes = std::max(*bytes, need);
      }
    }
    return Status();
  }

  template <class View>
  Status check_layer_call(const LycheeDecodeState& state, int layer, const View& kv) const {
    const LycheeDecodeConfig& c = config_;
    KVSIFT_REQUIRE(state.num_layers == c.num_layers && state.table.rows == rows() &&
                       state.table.capacity == index_capacity() && state.table.indices != nullptr,
                   kInvalidArgument, "state was not made for this configuration (make it with make_state)");
    KVSIFT_REQUIRE(layer >= 0 && layer < c.num_layers, kInvalidArgument, "layer = ", layer,
                   " is out of range [0, num_layers = ", c.num_layers, ")");
    KVSIFT_REQUIRE(layer == state.next_layer, kInvalidArgument, "layer = ", layer,
                   " is out of order: this step expects layer ", state.next_layer,
                   " (layers run 0 .. num_layers - 1 once per step; restart_step() abandons a step)");
    KVSIFT_REQUIRE(kv.num_kv_heads == c.num_kv_heads, kInvalidArgument, "kv.num_kv_heads = ", kv.num_kv_heads,
                   " must equal num_kv_heads = ", c.num_kv_heads);
    KVSIFT_REQUIRE(kv.head_dim == c.head_dim, kInvalidArgument, "kv.head_dim = ", kv.head_dim,
                   " must equal head_dim = ", c.head_dim);
    KVSIFT_REQUIRE(kv.batch >= 0 && kv.batch <= c.max_batch, kInvalidArgument, "kv.batch = ", kv.batch,
                   " must be in [0, max_batch = ", c.max_batch, "]");
    KVSIFT_REQUIRE(layer == 0 || kv.batch == state.step_batch, kInvalidArgument, "kv.batch = ", kv.batch,
                   " changed within a step (its layer 0 ran with batch ", state.step_batch, ")");
    return Status();
  }

  // Top-k of this layer's retrieval rows into the index table (the handoff to later layers).
  template <class Exec, class View>
  Status hand_off(Exec exec, LycheeDecodeState& state, const HeadRoleMask& sparse, const View& kv,
                  const detail::LycheeDecodeScratch& x) const {
    const LycheeDecodeConfig& c = config_;
    const int rows = kv.batch * c.num_kv_heads;
    const bool ratio = c.selection == LycheeDecodeSelection::kRatio, block = c.selection == LycheeDecodeSelection::kBlock;
    SelectionRowsArgs plan;
    plan.sparse = sparse;
    plan.num_kv_heads = c.num_kv_heads;
    plan.max_kv_length = c.max_kv_length;
    plan.entry_tokens = lycheedecode_entry_tokens(c);
    plan.keep = lycheedecode_keep_fraction(c);
    plan.ratio = ratio;
    plan.recent = c.recent;
    plan.row_lengths = x.row_lengths;
    plan.row_budget = ratio ? x.row_budget : nullptr;
    plan.recent_from = block ? x.recent_from : nullptr;
    KVSIFT_TRY(plan_selection_rows(exec, kv, plan));

    // A layer without sparse heads (layer 0) rewrites every row: top-k writes the table directly.
    const bool has_sparse = sparse.count_sparse(c.num_kv_heads) > 0;
    IndexSet out = state.table;
    out.rows = rows;
    if (has_sparse) out.counts = x.selected_counts;
    const StridedView2D<const float> scores{x.scores, rows, x.score_cols, x.score_stride};
    TopKParams select;
    select.lengths = x.row_lengths;
    if (block) {
      select.k = c.num_blocks;
      select.sink = c.sink_blocks;
      RecentBlocksFirstKey key;
      key.recent_from = x.recent_from;
      KVSIFT_TRY(topk(exec, scores, select, out, static_cast<float*>(nullptr), key, Workspace{x.selection, x.selection_bytes}));
    } else {
      select.k = ratio ? 0 : c.budget;
      select.per_row_k = ratio ? x.row_budget : nullptr;
      select.sink = c.sink;
      select.recent = c.recent;
      KVSIFT_TRY(topk(exec, scores, select, out, static_cast<float*>(nullptr), ScoreKey<float>(),
                      Workspace{x.selection, x.selection_bytes}));
    }
    if (!has_sparse) return Status();
    CommitSelectionArgs commit;
    commit.sparse = sparse;
    commit.num_kv_heads = c.num_kv_heads;
    commit.selected_counts = x.selected_counts;
    commit.table_counts = state.table.counts;
    return commit_selection(exec, rows, commit);
  }

  void advance(LycheeDecodeState& state, int layer, int batch) const {
    if (layer == 0) state.step_batch = batch;
    state.next_layer = layer + 1;
    if (state.next_layer == config_.num_layers) {
      state.next_layer = 0;
      ++state.steps;
    }
  }

  LycheeDecodeConfig config_;
  std::vector<HeadRoleMask> sparse_;  // per layer: set bit = sparse head
  std::size_t attention_bytes_16bit_ = 0, attention_bytes_32bit_ = 0;
};

}  // namespace kvsift
