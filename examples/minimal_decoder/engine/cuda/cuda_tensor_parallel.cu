// The decode loop over GPU ranks compiled for the CUDA backend (cuda_tensor_parallel.hpp): with
// kvsift.cuh included, each rank's kvsift calls resolve to the CUDA launchers.

#include <kvsift/kvsift.cuh>

#include "engine/cuda/cuda_tensor_parallel.hpp"

namespace minimal_decoder {

template GenerationReport generate_tensor_parallel<CudaBackend, NcclAllReduce>(NcclAllReduce&,
                                                                               const TensorParallelWeights<CudaBackend>&,
                                                                               const GenerationRequest&);
template GenerationReport generate_tensor_parallel<CudaBackend, NcclAllReduce>(const std::vector<CudaBackend*>&,
                                                                               NcclAllReduce&, const ModelConfig&,
                                                                               const HostWeights&, const GenerationRequest&);

}  // namespace minimal_decoder
