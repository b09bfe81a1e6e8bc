#pragma once
// The CUDA launch of one LycheeDecode layer call (lycheedecode_cuda.cpp), declared with kvsift's types only
// so that the .cu files never include torch. Defined in launch_lycheedecode.cuh, instantiated per KV
// element type (launch_lycheedecode_{f32,f16,bf16}.cu) for contiguous and paged caches.
#include <cuda_runtime_api.h>

#include <kvsift/policy/lycheedecode.hpp>

#include "launch_cuda.hpp"

namespace kvsift_torch {
namespace cuda_launch {

/// policy.decode_layer (or correct_layer) on `stream`, with the workspace policy.workspace_bytes<T> asks for
/// from `allocate`. `state`'s table is device memory.
template <class View, class T>
kvsift::Status lycheedecode_layer(cudaStream_t stream, const kvsift::DeviceFacts& facts,
                                  const kvsift::LycheeDecodePolicy& policy, kvsift::LycheeDecodeState& state, int layer,
                                  bool correction, const View& kv, const kvsift::QueryIO<T>& io, const Allocate& allocate);

}  // namespace cuda_launch
}  // namespace kvsift_torch
