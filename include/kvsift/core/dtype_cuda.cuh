#pragma once
/// \file
/// \brief dtype_traits for CUDA's own 16-bit types, so views and kernels can be instantiated over an engine's
/// __half / __nv_bfloat16 buffers directly. They share the conversions of kvsift's storage types.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kvsift/core/dtype.hpp"

namespace kvsift {

static_assert(sizeof(__half) == sizeof(half_t) && alignof(__half) == alignof(half_t),
              "kvsift::half_t must be layout-compatible with __half");
static_assert(sizeof(__nv_bfloat16) == sizeof(bfloat16_t) && alignof(__nv_bfloat16) == alignof(bfloat16_t),
              "kvsift::bfloat16_t must be layout-compatible with __nv_bfloat16");

template <>
/// CUDA's `__half`: the same tag, name and rounding as half_t, through CUDA's conversion intrinsics.
struct dtype_traits<__half> {
  using accum_type = float;                        ///< the type arithmetic happens in
  static constexpr DType dtype = DType::kFloat16;  ///< the run-time tag
  static constexpr const char* name = "float16";  ///< the name used in messages and benchmark labels
  /// Widens to float (exact).
  KVSIFT_HD static float to_float(__half x) { return __half2float(x); }
  /// Narrows from float, rounding to nearest even.
  KVSIFT_HD static __half from_float(float x) { return __float2half_rn(x); }
};

template <>
/// CUDA's `__nv_bfloat16`: the same tag, name and rounding as bfloat16_t, through CUDA's intrinsics.
struct dtype_traits<__nv_bfloat16> {
  using accum_type = float;                         ///< the type arithmetic happens in
  static constexpr DType dtype = DType::kBFloat16;  ///< the run-time tag
  static constexpr const char* name = "bfloat16";  ///< the name used in messages and benchmark labels
  /// Widens to float (exact).
  KVSIFT_HD static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  /// Narrows from float, rounding to nearest even.
  KVSIFT_HD static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};

}  // namespace kvsift
