// The passkey tools compiled for the CPU backend, once (passkey_tools.hpp).

#include "tools/passkey_tools.hpp"

namespace minimal_decoder {

template int run_passkey_tool<HostBackend>(HostBackend&, const PasskeyToolOptions&, const ModelConfig&,
                                           const BackendWeights<HostBackend>&);

}  // namespace minimal_decoder
