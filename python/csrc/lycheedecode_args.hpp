#pragma once
// From torch arguments to one call of kvsift's LycheeDecode policy (policy/lycheedecode.hpp), shared by
// the CPU and CUDA implementations of the lycheedecode_layer op.
//
// The op is stateless on the C++ side: every call rebuilds the policy from the configuration (its
// validation is a few comparisons and one pass over the roles) and the LycheeDecodeState from the
// caller's table tensors and layer cursor, then runs the policy's decode_layer / correct_layer, which
// writes the retrieval heads' selections into the table in place. The table (device memory) and the
// cursor (host ints) are the Python step object's (kvsift/lycheedecode.py), so the op is a plain
// function of its arguments, traceable and graph-capturable like the others.

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <string>
#include <vector>

#include <kvsift/policy/lycheedecode.hpp>

#include "op_args.hpp"

namespace kvsift_torch {

/// The configuration fields of the op schema, in schema order (see ops.cpp).
struct LycheeDecodeArgs {
  std::int64_t num_layers, num_q_heads, num_kv_heads, head_dim;
  at::IntArrayRef roles;  ///< [num_layers * num_kv_heads], 1 = retrieval, layer-major
  std::int64_t max_batch, max_kv_length;
  std::string selection;
  std::int64_t budget;
  double rho;
  std::int64_t sink, recent, block_size, num_blocks, sink_blocks, index_capacity, correction_interval;
  c10::optional<double> sm_scale;
};

inline kvsift::LycheeDecodeSelection parse_selection(const std::string& s, const char* op) {
  if (s == "token") return kvsift::LycheeDecodeSelection::kToken;
  if (s == "ratio") return kvsift::LycheeDecodeSelection::kRatio;
  if (s == "block") return kvsift::LycheeDecodeSelection::kBlock;
  TORCH_CHECK_VALUE(false, "kvsift.", op, ": selection = '", s, "' must be 'token', 'ratio' or 'block'");
}

/// The validated policy (LycheeDecodePolicy::create: messages name the config field).
inline kvsift::LycheeDecodePolicy make_policy(const LycheeDecodeArgs& a, const char* op) {
  kvsift::LycheeDecodeConfig c;
  c.num_layers = to_int(a.num_layers, op, "num_layers");
  c.num_q_heads = to_int(a.num_q_heads, op, "num_q_heads");
  c.num_kv_heads = to_int(a.num_kv_heads, op, "num_kv_heads");
  c.head_dim = to_int(a.head_dim, op, "head_dim");
  TORCH_CHECK_VALUE(c.num_layers > 0 && c.num_kv_heads > 0, "kvsift.", op, ": num_layers = ", c.num_layers,
                    " and num_kv_heads = ", c.num_kv_heads, " must be > 0");
  const std::int64_t gates = std::int64_t(c.num_layers) * c.num_kv_heads;
  TORCH_CHECK_VALUE(std::int64_t(a.roles.size()) == gates, "kvsift.", op, ": roles has ", a.roles.size(),
                    " entries but num_layers * num_kv_heads = ", gates);
  std::vector<std::uint8_t> bytes(a.roles.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    TORCH_CHECK_VALUE(a.roles[i] == 0 || a.roles[i] == 1, "kvsift.", op, ": roles[", i, "] = ", a.roles[i],
                      " must be 1 (retrieval) or 0 (sparse)");
    bytes[i] = std::uint8_t(a.roles[i]);
  }
  throw_if_error(kvsift::make_head_roles(c.num_layers, c.num_kv_heads, bytes.data(), &c.roles), op);
  c.max_batch = to_int(a.max_batch, op, "max_batch");
  c.max_kv_length = to_int(a.max_kv_length, op, "max_kv_length");
  c.selection = parse_selection(a.selection, op);
  c.budget = to_int(a.budget, op, "budget");
  c.rho = a.rho;
  c.sink = to_int(a.sink, op, "sink");
  c.recent = to_int(a.recent, op, "recent");
  c.block_size = to_int(a.block_size, op, "block_size");
  c.num_blocks = to_int(a.num_blocks, op, "num_blocks");
  c.sink_blocks = to_int(a.sink_blocks, op, "sink_blocks");
  c.index_capacity = to_int(a.index_capacity, op, "index_capacity");
  c.correction_interval = to_int(a.correction_interval, op, "correction_interval");
  c.sm_scale = a.sm_scale ? float(*a.sm_scale) : 0.f;
  TORCH_CHECK_VALUE(!a.sm_scale || *a.sm_scale > 0.0, "kvsift.", op, ": sm_scale = ", *a.sm_scale, " must be > 0");
  kvsift::LycheeDecodePolicy policy;
  throw_if_error(kvsift::LycheeDecodePolicy::create(c, &policy), op);
  return policy;
}

/// The index table's shape for a configuration: [rows = max_batch * num_kv_heads, capacity], and the
/// tokens per entry (1, or block_size in block mode). What the step object allocates.
inline std::vector<std::int64_t> lycheedecode_table_shape(const LycheeDecodeArgs& a) {
  const kvsift::LycheeDecodePolicy policy = make_policy(a, "lycheedecode_table_shape");
  const kvsift::LycheeDecodeConfig& c = policy.config();
  return {std::int64_t(c.max_batch) * c.num_kv_heads, policy.index_capacity(), kvsift::lycheedecode_entry_tokens(c)};
}

/// The schema-level function of lycheedecode_table_shape (ops.cpp): the config fields as the op takes them.
inline std::vector<std::int64_t> lycheedecode_table_shape_op(
    std::int64_t num_layers, std::int64_t num_q_heads, std::int64_t num_kv_heads, std::int64_t head_dim,
    std::vector<std::int64_t> roles, std::int64_t max_batch, std::int64_t max_kv_length, std::string selection,
    std::int64_t budget, double rho, std::int64_t sink, std::int64_t recent, std::int64_t block_size,
    std::int64_t num_blocks, std::int64_t sink_blocks, std::int64_t index_capacity, std::int64_t correction_interval,
    c10::optional<double> sm_scale) {
  return lycheedecode_table_shape(LycheeDecodeArgs{num_layers, num_q_heads, num_kv_heads, head_dim, roles, max_batch,
                                                   max_kv_length, selection, budget, rho, sink, recent, block_size,
                                                   num_blocks, sink_blocks, index_capacity, correction_interval,
                                                   sm_scale});
}

/// One layer call: the policy, the state over the caller's table, and the attention call's tensors.
struct LycheeLayerCall {
  kvsift::LycheeDecodePolicy policy;
  kvsift::LycheeDecodeState state;
  DecodeCall attention;  ///< q's shape, the out and lse tensors, the KV layout
  bool correction = false;
};

inline LycheeLayerCall prepare_lycheedecode_layer(const at::Tensor& q, const at::Tensor& k_cache,
                                                  const at::Tensor& v_cache, const at::Tensor& kv_lengths,
                                                  const at::Tensor& table_indices, const at::Tensor& table_counts,
                                                  std::int64_t layer, std::int64_t next_layer, std::int64_t step_batch,
                                                  const LycheeDecodeArgs& args, const std::string& kv_layout,
                                                  const c10::optional<at::Tensor>& block_table, bool correction) {
  const char* op = "lycheedecode_layer";
  LycheeLayerCall call;
  call.policy = make_policy(args, op);
  call.correction = correction;
  const kvsift::LycheeDecodeConfig& c = call.policy.config();
  // The attention call's argument checks (dtypes, layouts, shapes, block table) and its outputs.
  call.attention = prepare_decode(q, k_cache, v_cache, kv_lengths, kv_layout, block_table, args.sm_scale,
                                  c.max_kv_length, {}, c10::nullopt, c10::nullopt, 1);
  const DecodeCall& d = call.attention;
  TORCH_CHECK_VALUE(d.num_q_heads == c.num_q_heads, "kvsift.", op, ": q has ", d.num_q_heads,
                    " query heads but num_q_heads = ", c.num_q_heads);
  TORCH_CHECK_VALUE(d.head_dim == c.head_dim, "kvsift.", op, ": q has head_dim ", d.head_dim, " but head_dim = ",
                    c.head_dim);
  TORCH_CHECK_VALUE(!correction || c.correction_interval > 0, "kvsift.", op,
                    ": correction_interval = 0: cache correction is off");
  const int want_q_len = correction ? c.correction_interval : 1;
  TORCH_CHECK_VALUE(d.q_len == want_q_len, "kvsift.", op, ": q_len = ", d.q_len, " must be ", want_q_len,
                    correction ? " (correction_interval: a correction step re-runs that many positions)"
                               : " (one new token per sequence; correct_layer takes correction_interval)");

  const c10::Device device = q.device();
  const std::int64_t rows = std::int64_t(c.max_batch) * c.num_kv_heads, capacity = call.policy.index_capacity();
  check_tensor(table_indices, op, "table_indices", 2, device, {at::kInt});
  TORCH_CHECK_VALUE(table_indices.size(0) == rows && table_indices.size(1) == capacity && table_indices.is_contiguous(),
                    "kvsift.", op, ": table_indices must be a contiguous int32 [max_batch * num_kv_heads, capacity] = [",
                    rows, ", ", capacity, "] tensor (got shape ", table_indices.sizes(), ")");
  check_int_vector(table_counts, op, "table_counts", rows, device);

  kvsift::LycheeDecodeState& s = call.state;
  s.table = kvsift::make_index_set(table_indices.data_ptr<std::int32_t>(), table_counts.data_ptr<std::int32_t>(),
                                   int(rows), int(capacity), kvsift::lycheedecode_granularity(c),
                                   kvsift::lycheedecode_entry_tokens(c));
  s.num_layers = c.num_layers;
  // The cursor is the step object's; the policy checks the order against it (layer == next_layer) and
  // the batch against the one layer 0 ran with.
  s.next_layer = to_int(next_layer, op, "next_layer");
  s.step_batch = to_int(step_batch, op, "step_batch");
  to_int(layer, op, "layer");
  return call;
}

}  // namespace kvsift_torch
