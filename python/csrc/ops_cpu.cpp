// CPU implementations: kvsift's host references (kvsift::host::*, double accumulation) on CPU tensors.
#include <torch/library.h>

#include "op_args.hpp"

namespace kvsift_torch {
namespace {

std::tuple<at::Tensor, at::Tensor> topk_cpu(const at::Tensor& scores, std::int64_t k,
                                            const c10::optional<at::Tensor>& lengths,
                                            const c10::optional<at::Tensor>& per_row_k, std::int64_t sink,
                                            std::int64_t recent) {
  TopkCall c = prepare_topk(scores, k, lengths, per_row_k, sink, recent);
  const kvsift::host::Exec exec;
  dispatch_dtype(scores.scalar_type(), "topk", [&](auto t) {
    using T = decltype(t);
    throw_if_error(kvsift::host::topk(exec, scores_view<T>(scores, c), c.params, c.out), "topk");
  });
  return {c.indices, c.counts};
}

std::tuple<at::Tensor, at::Tensor> decode_attention_cpu(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& kv_lengths,
    c10::string_view kv_layout, const c10::optional<at::Tensor>& block_table, c10::optional<double> sm_scale,
    std::int64_t max_kv_length, at::IntArrayRef sparse_heads, const c10::optional<at::Tensor>& indices,
    const c10::optional<at::Tensor>& index_counts, std::int64_t index_block_size) {
  DecodeCall c = prepare_decode(q, k_cache, v_cache, kv_lengths, std::string(kv_layout), block_table, sm_scale,
                                max_kv_length, sparse_heads, indices, index_counts, index_block_size);
  const kvsift::host::Exec exec;
  dispatch_dtype(q.scalar_type(), "decode_attention", [&](auto t) {
    using T = decltype(t);
    const auto p = decode_params<T>(q, c);
    if (is_paged(c.layout)) {
      const auto kv = paged_view<T>(k_cache, v_cache, *block_table, kv_lengths, c);
      // Host memory: check every page id the sequences use, which the CUDA path cannot do without a sync.
      throw_if_error(kv.validate(), "decode_attention");
      throw_if_error(kv.validate_block_table_host(), "decode_attention");
      throw_if_error(kvsift::host::decode_attention(exec, kv, p), "decode_attention");
    } else {
      throw_if_error(kvsift::host::decode_attention(exec, layout_view<T>(k_cache, v_cache, kv_lengths, c.layout, "decode_attention"), p),
                     "decode_attention");
    }
  });
  return {c.out, returned_lse(c)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> compress_prompt_cpu(
    const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& kv_lengths, const at::Tensor& queries,
    c10::string_view policy, std::int64_t capacity, std::int64_t window, c10::string_view kv_layout,
    c10::optional<double> sm_scale, c10::string_view heads, const c10::optional<at::Tensor>& lse,
    std::int64_t num_block, double theta, c10::string_view block_rule, c10::string_view radius_rule,
    std::int64_t fixed_radius, c10::string_view pool, std::int64_t pool_kernel, std::int64_t sinks) {
  const char* op = "compress_prompt";
  CompressCall c = prepare_compress(k_cache, v_cache, kv_lengths, queries, std::string(policy), capacity, window,
                                    std::string(kv_layout), sm_scale, std::string(heads), lse, num_block, theta,
                                    std::string(block_rule), std::string(radius_rule), fixed_radius,
                                    std::string(pool), pool_kernel, sinks);
  const kvsift::host::Exec exec;
  std::size_t bytes = 0;
  throw_if_error(kvsift::compress_prompt_workspace_bytes(exec, c.config, c.shape, &bytes), op);
  // kvsift's workspace is kWorkspaceAlignment-aligned; over-allocate and align the base.
  at::Tensor ws = at::empty({static_cast<std::int64_t>(bytes + kvsift::kWorkspaceAlignment)},
                            k_cache.options().dtype(at::kByte));
  void* base = reinterpret_cast<void*>(kvsift::align_up(reinterpret_cast<std::uintptr_t>(ws.data_ptr())));
  dispatch_dtype(k_cache.scalar_type(), op, [&](auto t) {
    using T = decltype(t);
    const auto src = layout_view<T>(k_cache, v_cache, kv_lengths, c.layout, op);
    const auto dst = layout_view<T>(c.k_out, c.v_out, c.dst_lengths, c.layout, op);
    throw_if_error(kvsift::compress_prompt(exec, c.config, c.shape, src, compress_queries<T>(queries, c), c.lse, dst,
                                           compress_outputs(c), kvsift::Workspace{base, bytes}),
                   op);
  });
  return {c.k_out, c.v_out, c.new_lengths, c.positions};
}

}  // namespace
}  // namespace kvsift_torch

TORCH_LIBRARY_IMPL(kvsift, CPU, m) {
  m.impl("topk", &kvsift_torch::topk_cpu);
  m.impl("decode_attention", &kvsift_torch::decode_attention_cpu);
  m.impl("compress_prompt", &kvsift_torch::compress_prompt_cpu);
}
