// float instantiations of launch_lycheedecode.cuh (one element type per file: two cores compile them in parallel).
#include "launch_lycheedecode.cuh"

KVSIFT_TORCH_INSTANTIATE_LYCHEEDECODE(float)
