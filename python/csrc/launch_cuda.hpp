#pragma once
// The CUDA launches behind ops_cuda.cpp, declared with kvsift's types only so that the .cu files that
// define them never include torch (see CMakeLists.txt). Defined in launch_cuda.cuh, instantiated per
// element type in launch_cuda_{f32,f16,bf16}.cu.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>

#include <kvsift/kvsift.hpp>

namespace kvsift_torch {
namespace cuda_launch {

/// Returns `bytes` of device memory on the call's stream, 256-byte aligned: ops_cuda.cpp backs it with
/// an empty torch tensor, i.e. torch's caching allocator (graph-safe, no cudaMalloc per call).
using Allocate = std::function<void*(std::size_t bytes)>;

/// The current device's facts, queried once per device and cached (plans read the SM count).
kvsift::Status device_facts(int device, kvsift::DeviceFacts* facts);

template <class T>
kvsift::Status topk(cudaStream_t stream, const kvsift::DeviceFacts& facts, kvsift::StridedView2D<const T> scores,
                    const kvsift::TopKParams& params, kvsift::IndexSet out, const Allocate& allocate);

template <class View, class T>
kvsift::Status decode_attention(cudaStream_t stream, const kvsift::DeviceFacts& facts, const View& kv,
                                const kvsift::DecodeAttentionParams<T>& params, const Allocate& allocate);

template <class T>
kvsift::Status compress_prompt(cudaStream_t stream, const kvsift::DeviceFacts& facts,
                               const kvsift::PromptCompressionConfig& config, const kvsift::PromptCompressionShape& shape,
                               const kvsift::ContiguousKV<T>& src, const kvsift::QueryRows<T>& queries, const float* lse,
                               const kvsift::ContiguousKV<T>& dst, kvsift::CompactOutputs out, const Allocate& allocate);

}  // namespace cuda_launch
}  // namespace kvsift_torch
