#pragma once
// Compiler glue shared by every kvsift header: host/device qualifiers and the version.

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

#define KVSIFT_VERSION_MAJOR 0
#define KVSIFT_VERSION_MINOR 1
#define KVSIFT_VERSION_PATCH 0

namespace kvsift {
inline constexpr int kVersionMajor = KVSIFT_VERSION_MAJOR;
inline constexpr int kVersionMinor = KVSIFT_VERSION_MINOR;
inline constexpr int kVersionPatch = KVSIFT_VERSION_PATCH;
}  // namespace kvsift
