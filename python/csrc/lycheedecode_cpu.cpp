// CPU implementation of the LycheeDecode layer op: kvsift's policy (lycheedecode_args.hpp) over
// host::Exec, i.e. the host references of decode_attention (with the retrieval heads' score
// emission), the selection inputs and topk, writing the index table in place.
#include <torch/library.h>

#include "lycheedecode_args.hpp"

namespace kvsift_torch {
namespace {

std::tuple<at::Tensor, at::Tensor> lycheedecode_layer_cpu(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& kv_lengths,
    at::Tensor& table_indices, at::Tensor& table_counts, std::int64_t layer, std::int64_t next_layer,
    std::int64_t step_batch, std::int64_t num_layers, std::int64_t num_q_heads, std::int64_t num_kv_heads,
    std::int64_t head_dim, at::IntArrayRef roles, std::int64_t max_batch, std::int64_t max_kv_length,
    c10::string_view selection, std::int64_t budget, double rho, std::int64_t sink, std::int64_t recent,
    std::int64_t block_size, std::int64_t num_blocks, std::int64_t sink_blocks, std::int64_t index_capacity,
    std::int64_t correction_interval, c10::optional<double> sm_scale, c10::string_view kv_layout,
    const c10::optional<at::Tensor>& block_table, bool correction) {
  const char* op = "lycheedecode_layer";
  const LycheeDecodeArgs args{num_layers, num_q_heads,  num_kv_heads, head_dim,  roles,          max_batch,
                              max_kv_length, std::string(selection), budget, rho, sink, recent, block_size,
                              num_blocks, sink_blocks, index_capacity, correction_interval, sm_scale};
  LycheeLayerCall call = prepare_lycheedecode_layer(q, k_cache, v_cache, kv_lengths, table_indices, table_counts, layer,
                                                    next_layer, step_batch, args, std::string(kv_layout), block_table,
                                                    correction);
  const kvsift::host::Exec exec;
  dispatch_dtype(q.scalar_type(), op, [&](auto t) {
    using T = decltype(t);
    std::size_t bytes = 0;
    throw_if_error(call.policy.workspace_bytes<T>(exec, &bytes), op);
    at::Tensor ws = at::empty({static_cast<std::int64_t>(bytes + kvsift::kWorkspaceAlignment)}, q.options().dtype(at::kByte));
    void* base = reinterpret_cast<void*>(kvsift::align_up(reinterpret_cast<std::uintptr_t>(ws.data_ptr())));
    const kvsift::Workspace workspace{base, bytes};
    const auto io = decode_params<T>(q, call.attention).io;
    auto run = [&](const auto& kv) {
      const int l = int(layer);
      throw_if_error(call.correction ? call.policy.correct_layer(exec, call.state, l, kv, io, workspace)
                                     : call.policy.decode_layer(exec, call.state, l, kv, io, workspace),
                     op);
    };
    if (is_paged(call.attention.layout)) {
      const auto kv = paged_view<T>(k_cache, v_cache, *block_table, kv_lengths, call.attention);
      // Host memory: every page id a sequence uses is checked, as decode_attention's CPU path does.
      throw_if_error(kv.validate(), op);
      throw_if_error(kv.validate_block_table_host(), op);
      run(kv);
    } else {
      run(layout_view<T>(k_cache, v_cache, kv_lengths, call.attention.layout, op));
    }
  });
  return {call.attention.out, returned_lse(call.attention)};
}

}  // namespace
}  // namespace kvsift_torch

TORCH_LIBRARY_IMPL(kvsift, CPU, m) { m.impl("lycheedecode_layer", &kvsift_torch::lycheedecode_layer_cpu); }
