// bfloat16 instantiations of launch_cuda.cuh.
#include "launch_cuda.cuh"

KVSIFT_TORCH_INSTANTIATE_CUDA(kvsift::bfloat16_t)
