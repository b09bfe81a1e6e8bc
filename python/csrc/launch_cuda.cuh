#pragma once
// Definitions of launch_cuda.hpp: the workspace query, the allocation, the kvsift::cuda launch.
#include <kvsift/kvsift.cuh>

#include "launch_cuda.hpp"

namespace kvsift_torch {
namespace cuda_launch {

inline kvsift::cuda::Exec make_exec(cudaStream_t stream, const kvsift::DeviceFacts& facts) {
  kvsift::cuda::Exec exec;
  exec.stream = stream;
  exec.device = facts;
  return exec;
}

/// The workspace the query asked for, or an empty one (a zero-byte allocation is skipped).
inline kvsift::Workspace workspace_of(std::size_t bytes, const Allocate& allocate) {
  kvsift::Workspace ws;
  if (bytes > 0) {
    ws.data = allocate(bytes);
    ws.bytes = bytes;
  }
  return ws;
}

template <class T>
kvsift::Status topk(cudaStream_t stream, const kvsift::DeviceFacts& facts, kvsift::StridedView2D<const T> scores,
                    const kvsift::TopKParams& params, kvsift::IndexSet out, const Allocate& allocate) {
  const auto exec = make_exec(stream, facts);
  std::size_t bytes = 0;
  KVSIFT_TRY(kvsift::topk_workspace_bytes(exec, scores, params, out, &bytes));
  return kvsift::cuda::topk(exec, scores, params, out, static_cast<T*>(nullptr), kvsift::ScoreKey<T>{},
                            workspace_of(bytes, allocate));
}

template <class View, class T>
kvsift::Status decode_attention(cudaStream_t stream, const kvsift::DeviceFacts& facts, const View& kv,
                                const kvsift::DecodeAttentionParams<T>& params, const Allocate& allocate) {
  const auto exec = make_exec(stream, facts);
  std::size_t bytes = 0;
  KVSIFT_TRY(kvsift::decode_attention_workspace_bytes(exec, kv, params, &bytes));
  return kvsift::cuda::decode_attention(exec, kv, params, workspace_of(bytes, allocate));
}

template <class T>
kvsift::Status compress_prompt(cudaStream_t stream, const kvsift::DeviceFacts& facts,
                               const kvsift::PromptCompressionConfig& config, const kvsift::PromptCompressionShape& shape,
                               const kvsift::ContiguousKV<T>& src, const kvsift::QueryRows<T>& queries, const float* lse,
                               const kvsift::ContiguousKV<T>& dst, kvsift::CompactOutputs out, const Allocate& allocate) {
  const auto exec = make_exec(stream, facts);
  std::size_t bytes = 0;
  KVSIFT_TRY(kvsift::compress_prompt_workspace_bytes(exec, config, shape, &bytes));
  return kvsift::compress_prompt(exec, config, shape, src, queries, lse, dst, out, workspace_of(bytes, allocate));
}

}  // namespace cuda_launch
}  // namespace kvsift_torch

// One element type's instantiations (the per-dtype .cu files expand this once each).
#define KVSIFT_TORCH_INSTANTIATE_CUDA(T)                                                                        \
  template kvsift::Status kvsift_torch::cuda_launch::topk<T>(cudaStream_t, const kvsift::DeviceFacts&,           \
                                                             kvsift::StridedView2D<const T>,                   \
                                                             const kvsift::TopKParams&, kvsift::IndexSet,       \
                                                             const kvsift_torch::cuda_launch::Allocate&);       \
  template kvsift::Status kvsift_torch::cuda_launch::decode_attention<kvsift::ContiguousKV<T>, T>(               \
      cudaStream_t, const kvsift::DeviceFacts&, const kvsift::ContiguousKV<T>&,                                \
      const kvsift::DecodeAttentionParams<T>&, const kvsift_torch::cuda_launch::Allocate&);                     \
  template kvsift::Status kvsift_torch::cuda_launch::decode_attention<kvsift::PagedKV<T>, T>(                    \
      cudaStream_t, const kvsift::DeviceFacts&, const kvsift::PagedKV<T>&, const kvsift::DecodeAttentionParams<T>&, \
      const kvsift_torch::cuda_launch::Allocate&);                                                              \
  template kvsift::Status kvsift_torch::cuda_launch::compress_prompt<T>(                                          \
      cudaStream_t, const kvsift::DeviceFacts&, const kvsift::PromptCompressionConfig&,                          \
      const kvsift::PromptCompressionShape&, const kvsift::ContiguousKV<T>&, const kvsift::QueryRows<T>&,        \
      const float*, const kvsift::ContiguousKV<T>&, kvsift::CompactOutputs, const kvsift_torch::cuda_launch::Allocate&);
