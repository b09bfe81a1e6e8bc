// The decoder, the decode loop and the step profile compiled for the CPU backend, once: everything
// else links to these.

#include "engine/host_engine.hpp"

namespace minimal_decoder {

template class Decoder<HostBackend>;
template GenerationReport generate<HostBackend>(HostBackend&, const ModelConfig&, const BackendWeights<HostBackend>&,
                                                const GenerationRequest&);
template StepProfile profile_step<HostBackend>(HostBackend&, const ModelConfig&, const BackendWeights<HostBackend>&,
                                               const GenerationRequest&, int);

}  // namespace minimal_decoder
