#pragma once
/// \file
/// \brief LycheeDecode: hybrid-head sparse decoding, written once for both backends (host::Exec, cuda::Exec).
/// Guide: docs/ops/lycheedecode.md; the method: docs/algorithms/lycheedecode.md.
///
/// Per decode step the engine calls decode_layer for layers 0 .. num_layers-1, in order, after
/// appending the new token's K/V to that layer's cache. One call:
///
///   1. decode_attention   one launch for the whole layer: retrieval KV heads attend densely over the
///                         sequence and emit the raw group-mean-query score of every token (or the max
///                         per block) in the same pass; sparse KV heads attend only to the entries of
///                         their index-table row; splits balanced across both kinds;
///   2. handoff            (layers with retrieval heads) top-k of each retrieval head's scores, forced
///                         sink/recent inside the budget, written in place to that head's table row
///                         (indices and count) for the sparse heads of later layers; the sparse heads'
///                         rows are left as they are (lycheedecode_handoff.hpp).
///
/// attend_layer and hand_off_layer are the same two parts as separate calls, for an engine that runs
/// the handoff on a second stream beside its own next kernels (only later layers read its output).
///
/// Every pointer (view, io, state, workspace) is in the backend's memory space; nothing is allocated,
/// nothing waits on the host, and launch shapes come from the configuration's capacities and the
/// Exec's device facts: a whole multi-layer step captures into one CUDA graph and replays as lengths
/// change, with no host bookkeeping between replays.
///
/// Cache correction (off by default): at a step where correction_due(step) holds (step = the engine's
/// count of decode steps since the prompt), the engine runs
/// correct_layer for every layer instead: dense causal attention of the last correction_interval
/// positions (q_len = interval) over the whole cache, after recomputing those positions' K/V from a
/// dense forward; the last row's output yields the next token. See the guide for the engine's side.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <type_traits>
#include <vector>

#include "kvsift/core/check.hpp"
#include "kvsift/core/dtype.hpp"
#include "kvsift/core/query_rows.hpp"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/index_set.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/ops/decode_attention.hpp"
#include "kvsift/ops/decode_attention_plan.hpp"
#include "kvsift/ops/decode_attention_reference.hpp"
#include "kvsift/ops/topk.hpp"
#include "kvsift/ops/topk_plan.hpp"
#include "kvsift/ops/topk_reference.hpp"
#include "kvsift/policy/lycheedecode_config.hpp"
#include "kvsift/policy/lycheedecode_handoff.hpp"
#include "kvsift/policy/lycheedecode_state.hpp"

namespace kvsift {

// Queries in and attention outputs out of one layer call are a QueryIO (core/query_rows.hpp):
// q [batch, q_len, num_q_heads, head_dim] post-RoPE, out the same shape and dtype, optional LSE;
// q_len is 1 for decode_layer and correction_interval for correct_layer. make_query_io builds one
// for dense tensors.

namespace detail {

/// A view with a shape and nothing behind it: lets the workspace query plan the attention launches
/// before any cache exists. Only its value_type's size matters (tensor-core vs CUDA-core tiles).
template <class T>
struct ShapeOnlyKV {
  using value_type = T;
  int batch = 0, num_kv_heads = 0, head_dim = 0;
  KVSIFT_HD T* k_row(int, int, int) const { return nullptr; }
  KVSIFT_HD T* v_row(int, int, int) const { return nullptr; }
  KVSIFT_HD int length(int) const { return 0; }
  KVSIFT_HD float k_scale(int, int, int) const { return 1.f; }  // fp8 KT: the view concept wants scales
  KVSIFT_HD float v_scale(int, int, int) const { return 1.f; }
  Status validate() const { return Status(); }
};

/// The decode_attention parameters of one layer call; the same function builds the workspace query's
/// parameters, so the query and the launch plan identically. The QueryIO passes through unchanged.
template <class T>
DecodeAttentionParams<T> lycheedecode_attention_params(const LycheeDecodeConfig& c, const QueryIO<T>& io, int q_len,
                                                       const HeadRoleMask& roles, const ConstIndexSet& table,
                                                       float* scores, std::int64_t score_stride) {
  DecodeAttentionParams<T> p;
  p.io = io;
  p.num_q_heads = c.num_q_heads;
  p.head_dim = c.head_dim;
  p.q_len = q_len;
  p.sm_scale = c.sm_scale > 0.f ? c.sm_scale : 1.f / std::sqrt(float(c.head_dim));
  p.max_kv_length = c.max_kv_length;
  p.roles = roles;
  if (roles.count_sparse(c.num_kv_heads) > 0) p.index_set = table;
  if (scores != nullptr) {
    p.scores = scores;
    p.score_row_stride = score_stride;
    p.score_block_size = lycheedecode_entry_tokens(c);
  }
  return p;
}

/// Scratch of one layer call, carved from the caller's workspace in a fixed order; decode_attention
/// gets the rest. Nothing in it outlives the call, so one workspace serves every layer (and other
/// ops in between).
struct LycheeDecodeScratch {
  float* scores = nullptr;  ///< [max_batch * num_kv_heads, score_stride]: retrieval rows written per layer
  int score_cols = 0;
  std::int64_t score_stride = 0;
  std::int32_t* row_lengths = nullptr;  ///< [rows] entries top-k ranks per row
  std::int32_t* row_budget = nullptr;   ///< [rows] ratio mode
  std::int32_t* recent_from = nullptr;  ///< [rows] block mode
  std::int32_t* candidate_counts = nullptr;     ///< [rows, candidate_count_stride]: score candidates' counts
  std::int32_t* candidate_positions = nullptr;  ///< [rows, score_stride]: their positions
  int candidate_count_stride = 0;
  Workspace selection;                  ///< top-k's
  Workspace attention;                  ///< decode_attention's: everything after the above
};

}  // namespace detail

/// The LycheeDecode policy: a validated configuration plus the per-layer calls of a decode step
/// (decode_layer) and of a cache-correction step (correct_layer), templated on the Exec (see the file
/// comment). Holds no device memory: the state and the workspace are the caller's.
class LycheeDecodePolicy {
 public:
  /// Validates the configuration (messages name the parameter). Nothing device-specific happens here:
  /// workspace sizes come from workspace_bytes(exec), which sees the Exec's device facts.
  static Status create(const LycheeDecodeConfig& config, LycheeDecodePolicy* out) {
    KVSIFT_REQUIRE_NOT_NULL(out, "out");
    KVSIFT_TRY(validate_lycheedecode_config(config));
    LycheeDecodePolicy d;
    d.config_ = config;
    *out = std::move(d);
    return Status();
  }

  /// The configuration it was created with.
  const LycheeDecodeConfig& config() const { return config_; }
  /// Entries per index row of the state's table (lycheedecode_index_capacity).
  int index_capacity() const { return lycheedecode_index_capacity(config_); }
  /// Roles of `layer` (set bit = sparse head: attends through the index table).
  const HeadRoleMask& roles(int layer) const { return config_.roles.layer(layer); }
  /// Retrieval heads of `layer`; a layer with none runs no top-k.
  int retrieval_heads(int layer) const { return roles(layer).count_retrieval(config_.num_kv_heads); }

  /// Bytes of state memory to allocate for make_state (lycheedecode_state_bytes).
  std::size_t state_bytes() const { return lycheedecode_state_bytes(config_); }
  /// Lays a state for this configuration out in `memory` (make_lycheedecode_state): `bytes` >=
  /// state_bytes(), 256-byte aligned, in the memory space of the Exec the layer calls will use.
  Status make_state(void* memory, std::size_t bytes, LycheeDecodeState* state) const {
    return make_lycheedecode_state(config_, memory, bytes, state);
  }

  /// Bytes of workspace a layer call on `exec` needs, for KV element type KT (the view's value_type).
  /// Computed from the capacities and the device facts only; one workspace serves every layer and
  /// every batch up to max_batch.
  template <class KT, class Exec>
  Status workspace_bytes(const Exec& exec, std::size_t* bytes) const {
    KVSIFT_REQUIRE_NOT_NULL(bytes, "bytes");
    std::size_t attention = 0;
    KVSIFT_TRY(attention_workspace_bytes<KT>(exec, &attention));
    WorkspaceCarver ws(nullptr, 0);
    carve_fixed_scratch(ws);
    *bytes = ws.required_bytes() + align_up(attention);
    return Status();
  }

  /// Whether decode step `step` (the engine's 0-based count of decode steps since the prompt) is a
  /// cache-correction step.
  bool correction_due(std::int64_t step) const { return kvsift::correction_due(config_, step); }

  /// One layer of a sparse decode step (q_len = 1). `kv` already holds the new token at position
  /// length - 1. Pointers of kv, io, state and workspace are in the memory space of `exec`.
  template <class Exec, class View, class T>
  Status decode_layer(const Exec& exec, LycheeDecodeState& state, int layer, const View& kv, const QueryIO<T>& io,
                      Workspace workspace) const {
    KVSIFT_TRY(attend_layer(exec, state, layer, kv, io, workspace));
    return hand_off_layer(exec, state, layer, kv, workspace);
  }

  /// decode_layer in two calls, so that an engine can run the handoff beside its own next work: the
  /// top-k's output is read only by the sparse heads of later layers, so on the GPU it may run on a
  /// second stream while the layer's o-projection and MLP and the next layer's projections run on the
  /// first (docs/ops/lycheedecode.md, "The handoff on a second stream"). attend_layer is decode_layer's
  /// attention launch, retrieval heads' scores written into the workspace; hand_off_layer is the top-k
  /// of those scores into the index table. decode_layer(l) and attend_layer(l) then hand_off_layer(l)
  /// give the same bits. The rules (each checked on the host, where it can be):
  ///  - hand_off_layer(l) follows attend_layer(l) of the same step, before the next layer call, with
  ///    the same kv (lengths) and the same workspace; a layer without retrieval heads has nothing to
  ///    hand off (hand_off_layer returns at once, and may be skipped);
  ///  - on the device, its launches are ordered after attend_layer's (the same stream, or a stream
  ///    that waits for an event recorded after it), and the next attend_layer, decode_layer or
  ///    correct_layer after them (they read the table it writes);
  ///  - nothing else writes the workspace until hand_off_layer's launches are done (the scores live
  ///    there), nor the view's lengths (the handoff's row plan reads them);
  ///  - a failed hand_off_layer leaves the handoff due: every layer call then fails until restart_step().
  template <class Exec, class View, class T>
  Status attend_layer(const Exec& exec, LycheeDecodeState& state, int layer, const View& kv, const QueryIO<T>& io,
                      Workspace workspace) const {
    static_assert(check_kv_view<View>());
    KVSIFT_TRY(check_layer_call(state, layer, kv));
    detail::LycheeDecodeScratch x;
    KVSIFT_TRY(carve_scratch(workspace, &x));
    const bool selects = retrieval_heads(layer) > 0;
    auto attention = detail::lycheedecode_attention_params(config_, io, 1, roles(layer), as_const(state.table),
                                                           selects ? x.scores : nullptr, x.score_stride);
    if (selects && lists_candidates(exec, state, layer, kv.batch)) attention.candidates = candidates(state, layer, x);
    KVSIFT_TRY(decode_attention(exec, kv, attention, x.attention));
    advance(state, layer, kv.batch);
    if (selects) {
      state.handoff_layer = layer;
      state.handoff_scores = x.scores;
    }
    return Status();
  }

  /// The second half of decode_layer (see attend_layer): the top-k of layer `layer`'s retrieval
  /// scores, written into the index table. `exec` may hold another stream than attend_layer's.
  template <class Exec, class View>
  Status hand_off_layer(const Exec& exec, LycheeDecodeState& state, int layer, const View& kv, Workspace workspace) const {
    static_assert(check_kv_view<View>());
    KVSIFT_REQUIRE(layer >= 0 && layer < config_.num_layers, kInvalidArgument, "layer = ", layer,
                   " is out of range [0, num_layers = ", config_.num_layers, ")");
    if (retrieval_heads(layer) == 0) {  // nothing selected, nothing to hand off; but not past one that is due
      KVSIFT_REQUIRE(state.handoff_layer < 0, kInvalidArgument, "hand_off_layer(layer = ", layer,
                     "): layer ", state.handoff_layer, "'s handoff is due first");
      return Status();
    }
    KVSIFT_REQUIRE(state.handoff_layer == layer, kInvalidArgument, "hand_off_layer(layer = ", layer,
                   ") has no attention to hand off: it must follow attend_layer(", layer, ") of the same step",
                   " (the handoff due is layer ", state.handoff_layer, "'s; -1: none)");
    KVSIFT_REQUIRE(kv.batch == state.step_batch && kv.num_kv_heads == config_.num_kv_heads &&
                       kv.head_dim == config_.head_dim,
                   kInvalidArgument, "kv (batch ", kv.batch, ", num_kv_heads ", kv.num_kv_heads, ", head_dim ",
                   kv.head_dim, ") is not the view attend_layer(", layer, ") saw (batch ", state.step_batch, ")");
    detail::LycheeDecodeScratch x;
    KVSIFT_TRY(carve_scratch(workspace, &x));
    KVSIFT_REQUIRE(x.scores == state.handoff_scores, kInvalidArgument, "hand_off_layer(layer = ", layer,
                   "): the workspace is not the one attend_layer(", layer, ") wrote its scores into");
    // Cleared only once the launches are queued: after a failed top-k the handoff stays due, so the
    // next layer call fails too (restart_step abandons the step) instead of reading a stale table.
    KVSIFT_TRY(hand_off(exec, state, layer, kv, x));
    state.handoff_layer = -1;
    state.handoff_scores = nullptr;
    return Status();
  }

  /// One layer of a cache-correction step: dense causal attention of the last correction_interval
  /// positions (io holds q_len = correction_interval query rows) over the whole cache, every head
  /// retrieval, the index table untouched. The sequences must hold at least correction_interval tokens.
  template <class Exec, class View, class T>
  Status correct_layer(const Exec& exec, LycheeDecodeState& state, int layer, const View& kv, const QueryIO<T>& io,
                       Workspace workspace) const {
    static_assert(check_kv_view<View>());
    KVSIFT_REQUIRE(config_.correction_interval > 0, kInvalidArgument,
                   "correction_interval = 0: cache correction is off (the workspace has no room for it)");
    KVSIFT_TRY(check_layer_call(state, layer, kv));
    detail::LycheeDecodeScratch x;
    KVSIFT_TRY(carve_scratch(workspace, &x));
    const auto attention = detail::lycheedecode_attention_params(config_, io, config_.correction_interval,
                                                                 HeadRoleMask::all_retrieval(), ConstIndexSet(), nullptr, 0);
    KVSIFT_TRY(decode_attention(exec, kv, attention, x.attention));
    advance(state, layer, kv.batch);
    return Status();
  }

 private:
  int score_cols() const {
    const int unit = lycheedecode_entry_tokens(config_);
    return (config_.max_kv_length + unit - 1) / unit;
  }
  /// Rows start on 16 bytes so top-k streams them with vector loads.
  std::int64_t score_stride() const { return (std::int64_t(score_cols()) + 3) / 4 * 4; }
  int rows() const { return config_.max_batch * config_.num_kv_heads; }

  /// Everything but decode_attention's part, which takes the rest of the workspace.
  void carve_fixed_scratch(WorkspaceCarver& ws, detail::LycheeDecodeScratch* out = nullptr) const {
    detail::LycheeDecodeScratch x;
    x.score_cols = score_cols();
    x.score_stride = score_stride();
    const std::size_t r = std::size_t(rows());
    x.scores = ws.take<float>(r * std::size_t(x.score_stride));
    x.row_lengths = ws.take<std::int32_t>(r);
    x.row_budget = ws.take<std::int32_t>(r);
    x.recent_from = ws.take<std::int32_t>(r);
    // Score candidates (token and ratio modes): a header and a count per segment of at least
    // kDecodeCandidateMinSegment tokens, then positions in the scores' shape.
    if (config_.score_candidates && config_.selection != LycheeDecodeSelection::kBlock) {
      x.candidate_count_stride = decode_candidate_count_stride(config_.max_kv_length);
      x.candidate_counts = ws.take<std::int32_t>(r * std::size_t(x.candidate_count_stride));
      x.candidate_positions = ws.take<std::int32_t>(r * std::size_t(x.score_stride));
    }
    // topk needs no scratch today; its query is asked anyway so that a later path can use some.
    const StridedView2D<const float> shape{nullptr, std::int64_t(r), x.score_cols, x.score_stride};
    std::size_t by_score = 0, by_recent = 0;
    (void)topk_workspace_bytes<float, ScoreKey<float>>(host::Exec{}, shape, TopKParams(), IndexSet(), &by_score);
    (void)topk_workspace_bytes<float, RecentBlocksFirstKey>(host::Exec{}, shape, TopKParams(), IndexSet(), &by_recent);
    x.selection.bytes = std::max(by_score, by_recent);
    x.selection.data = ws.take<unsigned char>(x.selection.bytes);
    if (out) *out = x;
  }

  Status carve_scratch(Workspace workspace, detail::LycheeDecodeScratch* x) const {
    KVSIFT_REQUIRE_NOT_NULL(workspace.data, "workspace.data (ask workspace_bytes<KT>(exec, &bytes))");
    WorkspaceCarver ws(workspace);
    carve_fixed_scratch(ws, x);
    KVSIFT_TRY(ws.status());
    const std::size_t used = ws.required_bytes();
    x->attention.data = static_cast<unsigned char*>(workspace.data) + used;
    x->attention.bytes = workspace.bytes - used;
    return Status();
  }

  /// The largest decode_attention workspace over every batch up to max_batch, every role mix of the
  /// layers and the correction pass (the split plan depends on all three).
  template <class KT, class Exec>
  Status attention_workspace_bytes(const Exec& exec, std::size_t* bytes) const {
    static const std::int32_t kShapeOnly = 0;  // validation wants non-null pointers; never read
    ConstIndexSet table;
    table.indices = table.counts = &kShapeOnly;
    table.rows = rows();
    table.capacity = table.row_stride = index_capacity();
    table.granularity = lycheedecode_granularity(config_);
    table.block_size = lycheedecode_entry_tokens(config_);
    std::vector<int> seen_sparse_counts;
    std::vector<const HeadRoleMask*> mixes;
    for (const HeadRoleMask& m : config_.roles.masks) {
      const int n = m.count_sparse(config_.num_kv_heads);
      if (std::find(seen_sparse_counts.begin(), seen_sparse_counts.end(), n) != seen_sparse_counts.end()) continue;
      seen_sparse_counts.push_back(n);
      mixes.push_back(&m);
    }
    float score_shape = 0.f;  // a non-null score pointer for the plan; never written
    // The query type does not change the plan; fp8 KV takes 16-bit queries (a float one is rejected).
    using QT = std::conditional_t<is_fp8_dtype<KT>::value, bfloat16_t, float>;
    const QueryIO<QT> io{};
    detail::ShapeOnlyKV<KT> kv;
    kv.batch = config_.max_batch;  // the query covers every batch up to this one
    kv.num_kv_heads = config_.num_kv_heads;
    kv.head_dim = config_.head_dim;
    *bytes = 0;
    std::size_t need = 0;
    for (const HeadRoleMask* m : mixes) {
      const bool selects = m->count_retrieval(config_.num_kv_heads) > 0;
      const auto p = detail::lycheedecode_attention_params(config_, io, 1, *m, table, selects ? &score_shape : nullptr,
                                                           score_stride());
      KVSIFT_TRY(decode_attention_workspace_bytes(exec, kv, p, &need));
      *bytes = std::max(*bytes, need);
    }
    if (config_.correction_interval > 0) {
      const auto p = detail::lycheedecode_attention_params(config_, io, config_.correction_interval,
                                                           HeadRoleMask::all_retrieval(), ConstIndexSet(), nullptr, 0);
      KVSIFT_TRY(decode_attention_workspace_bytes(exec, kv, p, &need));
      *bytes = std::max(*bytes, need);
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
    KVSIFT_REQUIRE(state.handoff_layer < 0, kInvalidArgument, "layer ", state.handoff_layer,
                   "'s hand_off_layer has not run: it must come before the next layer call");
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

  /// Top-k of this layer's retrieval rows, written in place into the index table (indices and counts;
  /// the rows of sparse heads untouched): the handoff to later layers.
  template <class Exec, class View>
  Status hand_off(const Exec& exec, LycheeDecodeState& state, int layer, const View& kv,
                  const detail::LycheeDecodeScratch& x) const {
    const LycheeDecodeConfig& c = config_;
    const HeadRoleMask& layer_roles = roles(layer);
    const int rows = kv.batch * c.num_kv_heads;
    const bool ratio = c.selection == LycheeDecodeSelection::kRatio, block = c.selection == LycheeDecodeSelection::kBlock;
    SelectionRowsArgs limits;
    limits.num_kv_heads = c.num_kv_heads;
    limits.max_kv_length = c.max_kv_length;
    limits.entry_tokens = lycheedecode_entry_tokens(c);
    limits.keep = lycheedecode_keep_fraction(c);
    limits.ratio = ratio;
    limits.recent = c.recent;
    limits.row_lengths = x.row_lengths;
    limits.row_budget = ratio ? x.row_budget : nullptr;
    limits.recent_from = block ? x.recent_from : nullptr;
    KVSIFT_TRY(plan_selection_rows(exec, kv, limits));

    IndexSet out = state.table;
    out.rows = rows;
    const StridedView2D<const float> scores{x.scores, rows, x.score_cols, x.score_stride};
    TopKParams select;
    select.lengths = x.row_lengths;
    select.roles = layer_roles;  // only retrieval heads' rows are this layer's to write
    select.num_kv_heads = c.num_kv_heads;
    if (block) {
      select.k = c.num_blocks;
      select.sink = c.sink_blocks;
      RecentBlocksFirstKey key;
      key.recent_from = x.recent_from;
      return topk(exec, scores, select, out, static_cast<float*>(nullptr), key, x.selection);
    }
    select.k = ratio ? 0 : c.budget;
    select.per_row_k = ratio ? x.row_budget : nullptr;
    select.sink = c.sink;
    select.recent = c.recent;
    if (lists_candidates(exec, state, layer, kv.batch)) select.candidates = candidates(state, layer, x);
    return topk(exec, scores, select, out, static_cast<float*>(nullptr), ScoreKey<float>(), x.selection);
  }

  /// Whether a layer's score pass lists candidates and its top-k reads them: the same answer in
  /// attend_layer and hand_off_layer. Only where the top-k takes its register select (the one path
  /// that reads a list, and writes the next threshold: elsewhere a stale threshold would make the
  /// pass list in vain, step after step). A state laid out by hand without thresholds lists none.
  template <class Exec>
  bool lists_candidates(const Exec& exec, const LycheeDecodeState& state, int layer, int batch) const {
    if (!config_.score_candidates || config_.selection == LycheeDecodeSelection::kBlock || state.thresholds == nullptr)
      return false;
    const std::int64_t rows = std::int64_t(batch) * retrieval_heads(layer);
    return rows > 0 &&
           detail::plan_topk<std::uint32_t>(rows, score_cols(), exec.device).kernel == detail::TopkKernel::kRegisterSelect;
  }
  ScoreCandidates candidates(const LycheeDecodeState& state, int layer, const detail::LycheeDecodeScratch& x) const {
    ScoreCandidates c;
    c.thresholds = state.thresholds + std::size_t(layer) * std::size_t(rows());
    c.counts = x.candidate_counts;
    c.positions = x.candidate_positions;
    c.count_stride = x.candidate_count_stride;
    return c;
  }

  void advance(LycheeDecodeState& state, int layer, int batch) const {
    if (layer == 0) state.step_batch = batch;
    state.next_layer = layer + 1 == config_.num_layers ? 0 : layer + 1;
  }

  LycheeDecodeConfig config_;
};

}  // namespace kvsift
