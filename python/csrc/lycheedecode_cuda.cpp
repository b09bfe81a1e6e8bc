// CUDA implementation of the LycheeDecode layer op: the argument handling of the CPU one
// (lycheedecode_args.hpp), then kvsift's policy over cuda::Exec (launch_lycheedecode.hpp) on torch's
// current stream, the workspace from torch's caching allocator. Nothing is read back: lengths, the
// table and block tables stay on the device, so a whole step can be captured in a CUDA graph. Page ids
// are not checked here (that would need a sync); the CPU path checks them.
#include <torch/library.h>

#include "cuda_context.hpp"
#include "launch_lycheedecode.hpp"
#include "lycheedecode_args.hpp"

namespace kvsift_torch {
namespace {

std::tuple<at::Tensor, at::Tensor> lycheedecode_layer_cuda(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& kv_lengths,
    at::Tensor& table_indices, at::Tensor& table_counts, std::int64_t layer, std::int64_t next_layer,
    std::int64_t step_batch, std::int64_t num_layers, std::int64_t num_q_heads, std::int64_t num_kv_heads,
    std::int64_t head_dim, at::IntArrayRef roles, std::int64_t max_batch, std::int64_t max_kv_length,
    c10::string_view selection, std::int64_t budget, double rho, std::int64_t sink, std::int64_t recent,
    std::int64_t block_size, std::int64_t num_blocks, std::int64_t sink_blocks, std::int64_t index_capacity,
    std::int64_t correction_interval, c10::optional<double> sm_scale, c10::string_view kv_layout,
    const c10::optional<at::Tensor>& block_table, bool correction) {
  const char* op = "lycheedecode_layer";
  CudaContext ctx(q, op);
  const LycheeDecodeArgs args{num_layers, num_q_heads,  num_kv_heads, head_dim,  roles,          max_batch,
                              max_kv_length, std::string(selection), budget, rho, sink, recent, block_size,
                              num_blocks, sink_blocks, index_capacity, correction_interval, sm_scale};
  LycheeLayerCall call = prepare_lycheedecode_layer(q, k_cache, v_cache, kv_lengths, table_indices, table_counts, layer,
                                                    next_layer, step_batch, args, std::string(kv_layout), block_table,
                                                    correction);
  dispatch_dtype(q.scalar_type(), op, [&](auto t) {
    using T = decltype(t);
    const auto io = decode_params<T>(q, call.attention).io;
    if (is_paged(call.attention.layout)) {
      const auto kv = paged_view<T>(k_cache, v_cache, *block_table, kv_lengths, call.attention);
      throw_if_error(cuda_launch::lycheedecode_layer(ctx.stream, ctx.facts, call.policy, call.state, int(layer),
                                                     call.correction, kv, io, ctx.allocator()),
                     op);
    } else {
      const auto kv = layout_view<T>(k_cache, v_cache, kv_lengths, call.attention.layout, op);
      throw_if_error(cuda_launch::lycheedecode_layer(ctx.stream, ctx.facts, call.policy, call.state, int(layer),
                                                     call.correction, kv, io, ctx.allocator()),
                     op);
    }
  });
  return {call.attention.out, returned_lse(call.attention)};
}

}  // namespace
}  // namespace kvsift_torch

TORCH_LIBRARY_IMPL(kvsift, CUDA, m) { m.impl("lycheedecode_layer", &kvsift_torch::lycheedecode_layer_cuda); }
