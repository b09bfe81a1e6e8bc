// The decoder and the decode loop compiled for the CPU backend, once: everything else links to these.

#include "engine/host_engine.hpp"

namespace minimal_decoder {

template class Decoder<HostBackend>;
template GenerationReport generate<HostBackend>(HostBackend&, const ModelConfig&, const BackendWeights<HostBackend>&,
                                                const GenerationRequest&);

}  // namespace minimal_decoder
