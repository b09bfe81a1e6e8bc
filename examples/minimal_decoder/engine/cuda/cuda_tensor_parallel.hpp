#pragma once
// Tensor parallelism on GPU ranks (engine/tensor_parallel_decoder.hpp over CudaBackend, NCCL): the
// decode loop is compiled for it once, by nvcc, in cuda_tensor_parallel.cu, as cuda_engine.hpp
// explains for the unsharded decoder; host-compiled code (the CLI) links to that instantiation.
// Built when CMake finds NCCL (MINIMAL_DECODER_NCCL).

#include "engine/cuda/cuda_engine.hpp"
#include "engine/cuda/nccl_all_reduce.hpp"
#include "engine/tensor_parallel_decoder.hpp"

namespace minimal_decoder {

extern template GenerationReport generate_tensor_parallel<CudaBackend, NcclAllReduce>(
    NcclAllReduce&, const TensorParallelWeights<CudaBackend>&, const GenerationRequest&);
extern template GenerationReport generate_tensor_parallel<CudaBackend, NcclAllReduce>(const std::vector<CudaBackend*>&,
                                                                                      NcclAllReduce&, const ModelConfig&,
                                                                                      const HostWeights&,
                                                                                      const GenerationRequest&);

}  // namespace minimal_decoder
