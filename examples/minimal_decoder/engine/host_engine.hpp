#pragma once
// The engine on the CPU backend: the decoder and the decode loop, compiled once in host_engine.cpp.

#include "engine/generate.hpp"
#include "engine/host_backend.hpp"

namespace minimal_decoder {

extern template class Decoder<HostBackend>;
extern template GenerationReport generate<HostBackend>(HostBackend&, const ModelConfig&,
                                                       const BackendWeights<HostBackend>&, const GenerationRequest&);

}  // namespace minimal_decoder
