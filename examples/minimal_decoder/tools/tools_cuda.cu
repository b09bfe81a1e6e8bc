// The passkey tools compiled for the CUDA backend, once (passkey_tools.hpp): with kvsift.cuh
// included, their kvsift calls (calibrate_num_block, copy_kv_to_dense) on a cuda::Exec find the CUDA
// launchers.

#include <kvsift/kvsift.cuh>

#include "tools/passkey_tools.hpp"

namespace minimal_decoder {

template int run_passkey_tool<CudaBackend>(CudaBackend&, const PasskeyToolOptions&, const ModelConfig&,
                                           const BackendWeights<CudaBackend>&);

}  // namespace minimal_decoder
