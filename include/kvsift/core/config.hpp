#pragma once
// Compiler glue shared by every kvsift header: host/device qualifiers (and, through version.hpp,
// the version).

#include "kvsift/version.hpp"

#if defined(__CUDACC__) || defined(__HIPCC__)
#define KVSIFT_HD __host__ __device__
#define KVSIFT_DEVICE __device__
#define KVSIFT_HAS_CUDA_COMPILER 1
#else
#define KVSIFT_HD
#define KVSIFT_DEVICE
#define KVSIFT_HAS_CUDA_COMPILER 0
#endif

#define KVSIFT_FORCEINLINE inline __attribute__((always_inline))
