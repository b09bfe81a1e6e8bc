#pragma once
// Definition of launch_lycheedecode.hpp: the policy's calls with a cuda::Exec resolve to kvsift's CUDA
// decode_attention (score emission included), selection-row and topk launchers.
#include <kvsift/policy/lycheedecode.cuh>

#include "launch_cuda.cuh"
#include "launch_lycheedecode.hpp"

namespace kvsift_torch {
namespace cuda_launch {

template <class View, class T>
kvsift::Status lycheedecode_layer(cudaStream_t stream, const kvsift::DeviceFacts& facts,
                                  const kvsift::LycheeDecodePolicy& policy, kvsift::LycheeDecodeState& state, int layer,
                                  bool correction, const View& kv, const kvsift::QueryIO<T>& io, const Allocate& allocate) {
  const auto exec = make_exec(stream, facts);
  std::size_t bytes = 0;
  KVSIFT_TRY(policy.workspace_bytes<typename View::value_type>(exec, &bytes));
  const kvsift::Workspace ws = workspace_of(bytes, allocate);
  return correction ? policy.correct_layer(exec, state, layer, kv, io, ws) : policy.decode_layer(exec, state, layer, kv, io, ws);
}

}  // namespace cuda_launch
}  // namespace kvsift_torch

#define KVSIFT_TORCH_INSTANTIATE_LYCHEEDECODE(T)                                                                   \
  template kvsift::Status kvsift_torch::cuda_launch::lycheedecode_layer<kvsift::ContiguousKV<T>, T>(               \
      cudaStream_t, const kvsift::DeviceFacts&, const kvsift::LycheeDecodePolicy&, kvsift::LycheeDecodeState&, int, \
      bool, const kvsift::ContiguousKV<T>&, const kvsift::QueryIO<T>&, const kvsift_torch::cuda_launch::Allocate&); \
  template kvsift::Status kvsift_torch::cuda_launch::lycheedecode_layer<kvsift::PagedKV<T>, T>(                    \
      cudaStream_t, const kvsift::DeviceFacts&, const kvsift::LycheeDecodePolicy&, kvsift::LycheeDecodeState&, int, \
      bool, const kvsift::PagedKV<T>&, const kvsift::QueryIO<T>&, const kvsift_torch::cuda_launch::Allocate&);
