#pragma once
/// \file
/// \brief dtype_traits for CUDA's own 16-bit and fp8 types, so views and kernels can be instantiated over an
/// engine's __half / __nv_bfloat16 / __nv_fp8_e4m3 / __nv_fp8_e5m2 buffers directly. They share the
/// conversions of kvsift's storage types.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

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

static_assert(sizeof(__nv_fp8_e4m3) == sizeof(fp8_e4m3_t) && alignof(__nv_fp8_e4m3) == alignof(fp8_e4m3_t),
              "kvsift::fp8_e4m3_t must be layout-compatible with __nv_fp8_e4m3");
static_assert(sizeof(__nv_fp8_e5m2) == sizeof(fp8_e5m2_t) && alignof(__nv_fp8_e5m2) == alignof(fp8_e5m2_t),
              "kvsift::fp8_e5m2_t must be layout-compatible with __nv_fp8_e5m2");

template <>
/// CUDA's `__nv_fp8_e4m3`: the tag, name and conversions of fp8_e4m3_t, on its raw byte `__x`.
struct dtype_traits<__nv_fp8_e4m3> {
  using accum_type = float;                        ///< the type arithmetic happens in
  static constexpr DType dtype = DType::kFp8E4M3;  ///< the run-time tag
  static constexpr const char* name = "float8_e4m3";  ///< the name used in messages and benchmark labels
  static constexpr float max_finite = 448.f;  ///< the largest finite value
  /// Widens to float (exact).
  KVSIFT_HD static float to_float(__nv_fp8_e4m3 x) { return dtype_traits<fp8_e4m3_t>::to_float(fp8_e4m3_t{x.__x}); }
  /// Narrows from float: round to nearest even, satfinite.
  KVSIFT_HD static __nv_fp8_e4m3 from_float(float x) {
    __nv_fp8_e4m3 r;
    r.__x = detail::float_to_e4m3_bits(x);
    return r;
  }
};

template <>
/// CUDA's `__nv_fp8_e5m2`: the tag, name and conversions of fp8_e5m2_t, on its raw byte `__x`.
struct dtype_traits<__nv_fp8_e5m2> {
  using accum_type = float;                        ///< the type arithmetic happens in
  static constexpr DType dtype = DType::kFp8E5M2;  ///< the run-time tag
  static constexpr const char* name = "float8_e5m2";  ///< the name used in messages and benchmark labels
  static constexpr float max_finite = 57344.f;  ///< the largest finite value
  /// Widens to float (exact).
  KVSIFT_HD static float to_float(__nv_fp8_e5m2 x) { return dtype_traits<fp8_e5m2_t>::to_float(fp8_e5m2_t{x.__x}); }
  /// Narrows from float: round to nearest even, satfinite.
  KVSIFT_HD static __nv_fp8_e5m2 from_float(float x) {
    __nv_fp8_e5m2 r;
    r.__x = detail::float_to_e5m2_bits(x);
    return r;
  }
};

}  // namespace kvsift
