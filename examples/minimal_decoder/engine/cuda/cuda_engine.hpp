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

namespace minimal_decoder {

extern template class Decoder<CudaBackend>;
extern template GenerationReport generate<CudaBackend>(CudaBackend&, const ModelConfig&,
                                                       const BackendWeights<CudaBackend>&, const GenerationRequest&);
extern template StepProfile profile_step<CudaBackend>(CudaBackend&, const ModelConfig&, const BackendWeights<CudaBackend>&,
                                                      const GenerationRequest&, int);

// Random weights generated on the GPU (random_device_weights.cpp), for shapes too large for the host.
BackendWeights<CudaBackend> random_device_weights(const CudaBackend& be, const ModelConfig& c, std::uint64_t seed);

}  // namespace minimal_decoder
