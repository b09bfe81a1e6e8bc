#pragma once
// What every CUDA op implementation needs from torch: the device guard, torch's current stream on the
// tensors' device, kvsift's device facts (queried once per device) and an allocator backed by torch's
// caching allocator. Shared by ops_cuda.cpp, gates_cuda.cpp and lycheedecode_cuda.cpp.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <vector>

#include "launch_cuda.hpp"
#include "op_args.hpp"

namespace kvsift_torch {

/// The stream, the device facts and an allocator whose buffers live as long as this object (until the
/// op returns; the caching allocator keeps a freed block from reuse by other streams until the work
/// queued on this one is done).
struct CudaContext {
  c10::cuda::CUDAGuard guard;
  cudaStream_t stream;
  kvsift::DeviceFacts facts;
  std::vector<at::Tensor> buffers;
  c10::TensorOptions options;

  /// `with_facts`: the ops whose plans read the SM count query them (cached); the gate ops need none.
  CudaContext(const at::Tensor& like, const char* op, bool with_facts = true)
      : guard(like.device()), stream(c10::cuda::getCurrentCUDAStream(like.device().index()).stream()),
        options(like.options().dtype(at::kByte)) {
    if (with_facts) throw_if_error(cuda_launch::device_facts(like.device().index(), &facts), op);
  }
  cuda_launch::Allocate allocator() {
    return [this](std::size_t bytes) -> void* {
      buffers.push_back(at::empty({static_cast<std::int64_t>(bytes)}, options));
      return buffers.back().data_ptr();
    };
  }
};

}  // namespace kvsift_torch
