// The decoder, the decode loop and the step profile compiled for the CUDA backend: with kvsift.cuh
// included, the decoder's kvsift calls on a cuda::Exec resolve to the CUDA launchers. The one place the engine's
// templates meet nvcc; everything else links to these instantiations (cuda_engine.hpp).

#include <kvsift/kvsift.cuh>

#include "engine/cuda/cuda_engine.hpp"

namespace minimal_decoder {

template class Decoder<CudaBackend>;
template GenerationReport generate<CudaBackend>(CudaBackend&, const ModelConfig&, const BackendWeights<CudaBackend>&,
                                                const GenerationRequest&);
template StepProfile profile_step<CudaBackend>(CudaBackend&, const ModelConfig&, const BackendWeights<CudaBackend>&,
                                               const GenerationRequest&, int);

}  // namespace minimal_decoder
