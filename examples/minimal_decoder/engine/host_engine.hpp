#pragma once
// The engine on the CPU backend: the decoder, the decode loop and the step profile, compiled once in
// host_engine.cpp.

#include "engine/generate.hpp"
#include "engine/host_backend.hpp"
#include "engine/step_profile.hpp"

namespace minimal_decoder {

extern template class Decoder<HostBackend>;
extern template GenerationReport generate<HostBackend>(HostBackend&, const ModelConfig&,
                                                       const BackendWeights<HostBackend>&, const GenerationRequest&);
extern template StepProfile profile_step<HostBackend>(HostBackend&, const ModelConfig&, const BackendWeights<HostBackend>&,
                                                      const GenerationRequest&, int);

}  // namespace minimal_decoder
