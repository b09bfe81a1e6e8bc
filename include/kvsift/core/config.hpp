#pragma once
/// \file
/// \brief Compiler glue shared by every kvsift header: host/device qualifiers (and, through version.hpp,
/// the version).

#include "kvsift/version.hpp"

#if defined(__CUDACC__) || defined(__HIPCC__)
/// `__host__ __device__` under a CUDA (or HIP) compiler, nothing in a plain C++ build: for functions
/// that run on both sides (views, dtype conversions, the per-row helpers).
#define KVSIFT_HD __host__ __device__
/// `__device__` under a CUDA (or HIP) compiler, nothing in a plain C++ build.
#define KVSIFT_DEVICE __device__
/// 1 when the translation unit is compiled by nvcc (or hipcc), else 0.
#define KVSIFT_HAS_CUDA_COMPILER 1
#else
#define KVSIFT_HD
#define KVSIFT_DEVICE
#define KVSIFT_HAS_CUDA_COMPILER 0
#endif

/// `inline` with the compiler's always-inline attribute (GCC, Clang, nvcc), for small hot helpers.
#define KVSIFT_FORCEINLINE inline __attribute__((always_inline))
