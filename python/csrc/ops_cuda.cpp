// CUDA implementations: the same argument handling as the CPU ones (op_args.hpp), then kvsift's CUDA
// launchers (launch_cuda.hpp) on torch's current stream of the tensors' device. No host sync and no
// read of device data: lengths, counts and block tables stay on the device, so the calls can be
// captured in a CUDA graph. The workspace comes from torch's caching allocator.
#include <torch/library.h>

#include "cuda_context.hpp"
#include "launch_cuda.hpp"
#include "op_args.hpp"

namespace kvsift_torch {
namespace {

std::tuple<at::Tensor, at::Tensor> topk_cuda(const at::Tensor& scores, std::int64_t k,
                                             const c10::optional<at::Tensor>& lengths,
                                             const c10::optional<at::Tensor>& per_row_k, std::int64_t sink,
                                             std::int64_t recent) {
  CudaContext ctx(scores, "topk");
  TopkCall c = prepare_topk(scores, k, lengths, per_row_k, sink, recent);
  dispatch_dtype(scores.scalar_type(), "topk", [&](auto t) {
    using T = decltype(t);
    throw_if_error(cuda_launch::topk<T>(ctx.stream, ctx.facts, scores_view<T>(scores, c), c.params, c.out,
                                        ctx.allocator()),
                   "topk");
  });
  return {c.indices, c.counts};
}

std::tuple<at::Tensor, at::Tensor> decode_attention_cuda(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& kv_lengths,
    c10::string_view kv_layout, const c10::optional<at::Tensor>& block_table, c10::optional<double> sm_scale,
    std::int64_t max_kv_length, at::IntArrayRef sparse_heads, const c10::optional<at::Tensor>& indices,
    const c10::optional<at::Tensor>& index_counts, std::int64_t index_block_size) {
  CudaContext ctx(q, "decode_attention");
  DecodeCall c = prepare_decode(q, k_cache, v_cache, kv_lengths, std::string(kv_layout), block_table, sm_scale,
                                max_kv_length, sparse_heads, indices, index_counts, index_block_size);
  dispatch_dtype(q.scalar_type(), "decode_attention", [&](auto t) {
    using T = decltype(t);
    const auto p = decode_params<T>(q, c);
    if (is_paged(c.layout)) {
      // Page ids are not checked here (that would read the block table back to the host); the
      // kernels trust them, as kvsift's C++ contract says. The CPU path checks them.
      const auto kv = paged_view<T>(k_cache, v_cache, *block_table, kv_lengths, c);
      throw_if_error(cuda_launch::decode_attention(ctx.stream, ctx.facts, kv, p, ctx.allocator()), "decode_attention");
    } else {
      const auto kv = layout_view<T>(k_cache, v_cache, kv_lengths, c.layout, "decode_attention");
      throw_if_error(cuda_launch::decode_attention(ctx.stream, ctx.facts, kv, p, ctx.allocator()), "decode_attention");
    }
  });
  return {c.out, returned_lse(c)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> compress_prompt_cuda(
    const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& kv_lengths, const at::Tensor& queries,
    c10::string_view policy, std::int64_t capacity, std::int64_t window, c10::string_view kv_layout,
    c10::optional<double> sm_scale, c10::string_view heads, const c10::optional<at::Tensor>& lse,
    std::int64_t num_block, double theta, c10::string_view block_rule, c10::string_view radius_rule,
    std::int64_t fixed_radius, c10::string_view pool, std::int64_t pool_kernel, std::int64_t sinks) {
  const char* op = "compress_prompt";
  CudaContext ctx(k_cache, op);
  CompressCall c = prepare_compress(k_cache, v_cache, kv_lengths, queries, std::string(policy), capacity, window,
                                    std::string(kv_layout), sm_scale, std::string(heads), lse, num_block, theta,
                                    std::string(block_rule), std::string(radius_rule), fixed_radius,
                                    std::string(pool), pool_kernel, sinks);
  dispatch_dtype(k_cache.scalar_type(), op, [&](auto t) {
    using T = decltype(t);
    const auto src = layout_view<T>(k_cache, v_cache, kv_lengths, c.layout, op);
    const auto dst = layout_view<T>(c.k_out, c.v_out, c.dst_lengths, c.layout, op);
    throw_if_error(cuda_launch::compress_prompt<T>(ctx.stream, ctx.facts, c.config, c.shape, src,
                                                   compress_queries<T>(queries, c), c.lse, dst, compress_outputs(c),
                                                   ctx.allocator()),
                   op);
  });
  return {c.k_out, c.v_out, c.new_lengths, c.positions};
}

}  // namespace
}  // namespace kvsift_torch

TORCH_LIBRARY_IMPL(kvsift, CUDA, m) {
  m.impl("topk", &kvsift_torch::topk_cuda);
  m.impl("decode_attention", &kvsift_torch::decode_attention_cuda);
  m.impl("compress_prompt", &kvsift_torch::compress_prompt_cuda);
}
