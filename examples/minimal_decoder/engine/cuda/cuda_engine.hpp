#pragma once
// The engine on the CUDA backend. The decoder, the decode loop and the step profile are compiled for
// it once, by nvcc, in cuda_engine.cu (there kvsift's unqualified calls find its CUDA launchers);
// code compiled by the host compiler (the CLI, the tools, tests) includes this header and links to
// that instantiation. It goes through generate(), profile_step() and the tools' entry point, never
// through Decoder<CudaBackend>'s members: those are inline, and a compiler may instantiate an inline
// member where it is called. A .cu file that calls them itself (the GPU test) includes
// <kvsift/kvsift.cuh> before this header.

#include <cstdint>

#include "engine/cuda/cuda_backend.hpp"
#include "engine/generate.hpp"
#include "engine/step_profile.hpp"
#include "engine/tensor_parallel.hpp"

namespace minimal_decoder {

extern template class Decoder<CudaBackend>;
extern template GenerationReport generate<CudaBackend>(CudaBackend&, const ModelConfig&,
                                                       const BackendWeights<CudaBackend>&, const GenerationRequest&);
extern template StepProfile profile_step<CudaBackend>(CudaBackend&, const ModelConfig&, const BackendWeights<CudaBackend>&,
                                                      const GenerationRequest&, int);

// Random weights generated on the GPU (random_device_weights.cpp), for shapes too large for the host.
BackendWeights<CudaBackend> random_device_weights(const CudaBackend& be, const ModelConfig& c, std::uint64_t seed);
// Tensor-parallel rank `shard`'s weights of the same random model, generated on its own GPU (`be`,
// the current device): its slice of every sharded matrix (random_device_layout.hpp), the values the
// unsharded model has there, bit for bit; the embedding and the norms whole.
BackendWeights<CudaBackend> random_device_weights(const CudaBackend& be, const ModelConfig& full, std::uint64_t seed,
                                                  const TensorParallelShard& shard);

}  // namespace minimal_decoder
