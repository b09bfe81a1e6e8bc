#pragma once
/// \file
/// \brief Element types and their traits, usable on host and device.
///
/// kvsift::half_t and kvsift::bfloat16_t are 16-bit storage types with the bit layout of CUDA's
/// __half and __nv_bfloat16, so an engine reinterprets its buffers without a copy, and host-only code
/// (compiled by g++ without the CUDA toolkit) still has them. The .cuh side adds traits for __half
/// and __nv_bfloat16 themselves (core/dtype_cuda.cuh), so views can also be instantiated over those.
/// Arithmetic always happens in the accumulator type, float.

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kvsift/core/config.hpp"

namespace kvsift {

/// IEEE binary16 storage with the bit layout of CUDA's `__half`; convert with to_float / from_float.
struct alignas(2) half_t {
  std::uint16_t bits;  ///< the raw binary16 bit pattern
};
/// bfloat16 storage (the top 16 bits of a float) with the bit layout of CUDA's `__nv_bfloat16`.
struct alignas(2) bfloat16_t {
  std::uint16_t bits;  ///< the raw bfloat16 bit pattern
};

/// Run-time tag of an element type (dtype_traits<T>::dtype), for messages and type-erased callers.
enum class DType : int { kFloat32, kFloat16, kBFloat16 };

/// The type's name: "float32", "float16" or "bfloat16" ("unknown" outside the enumeration).
inline const char* to_string(DType d) {
  switch (d) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

namespace detail {

KVSIFT_HD inline float bits_to_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
KVSIFT_HD inline std::uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

/// bfloat16 is the top half of a float: widening is a shift; narrowing rounds to nearest even.
KVSIFT_HD inline float bf16_bits_to_float(std::uint16_t b) { return bits_to_float(std::uint32_t(b) << 16); }
KVSIFT_HD inline std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t u = float_to_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return std::uint16_t((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}

/// IEEE binary16 conversions in software for the host; device code uses the hardware instructions.
KVSIFT_HD inline float half_bits_to_float(std::uint16_t h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    // Subnormal: normalise the mantissa.
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    man &= 0x3ffu;
    return bits_to_float(sign | (std::uint32_t(127 - 15 - e) << 23) | (man << 13));
  }
  return bits_to_float(sign | ((exp + 127 - 15) << 23) | (man << 13));
#endif
}
KVSIFT_HD inline std::uint16_t float_to_half_bits(float f) {
#if defined(__CUDA_ARCH__)
  std::uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  const std::uint32_t u = float_to_bits(f);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) return std::uint16_t(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  if (abs >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): shift the full mantissa right and round to nearest even.
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    const std::uint32_t exp = abs >> 23;
    const std::uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - exp;  // 14 - (exp - 127) + 10 - 23 + 23
    std::uint32_t result = man >> shift;
    const std::uint32_t rem = man & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (result & 1u))) ++result;
    return std::uint16_t(sign | result);
  }
  std::uint32_t r = abs - 0x38000000u;  // rebias exponent from 127 to 15
  r += 0xfffu + ((r >> 13) & 1u);       // round to nearest even at bit 13
  return std::uint16_t(sign | (r >> 13));
#endif
}

}  // namespace detail

/// dtype_traits<T>: the value type's name, its DType tag, the accumulator type, and conversions.
template <class T, class Enable = void>
struct dtype_traits;  ///< not defined: an unsupported element type fails at compile time

template <>
/// float: the identity conversions.
struct dtype_traits<float> {
  using accum_type = float;                        ///< the type arithmetic happens in
  static constexpr DType dtype = DType::kFloat32;  ///< the run-time tag
  static constexpr const char* name = "float32";  ///< the name used in messages and benchmark labels
  /// Widens to float (here: unchanged).
  KVSIFT_HD static float to_float(float x) { return x; }
  /// Narrows from float (here: unchanged).
  KVSIFT_HD static float from_float(float x) { return x; }
};

template <>
/// half_t: software binary16 conversions on the host, the hardware `cvt` instructions on the device
/// (bit-identical, round to nearest even).
struct dtype_traits<half_t> {
  using accum_type = float;                        ///< the type arithmetic happens in
  static constexpr DType dtype = DType::kFloat16;  ///< the run-time tag
  static constexpr const char* name = "float16";  ///< the name used in messages and benchmark labels
  /// Widens to float (exact).
  KVSIFT_HD static float to_float(half_t x) { return detail::half_bits_to_float(x.bits); }
  /// Narrows from float, rounding to nearest even (overflow gives infinity, NaN stays NaN).
  KVSIFT_HD static half_t from_float(float x) { return half_t{detail::float_to_half_bits(x)}; }
};

template <>
/// bfloat16_t: widening is a shift, narrowing rounds to nearest even, on host and device alike.
struct dtype_traits<bfloat16_t> {
  using accum_type = float;                         ///< the type arithmetic happens in
  static constexpr DType dtype = DType::kBFloat16;  ///< the run-time tag
  static constexpr const char* name = "bfloat16";  ///< the name used in messages and benchmark labels
  /// Widens to float (exact).
  KVSIFT_HD static float to_float(bfloat16_t x) { return detail::bf16_bits_to_float(x.bits); }
  /// Narrows from float, rounding to nearest even (NaN stays a quiet NaN).
  KVSIFT_HD static bfloat16_t from_float(float x) { return bfloat16_t{detail::float_to_bf16_bits(x)}; }
};

/// The traits of const T are those of T, so views over const data work unchanged.
template <class T>
struct dtype_traits<const T> : dtype_traits<T> {};

/// Widens an element of any supported type to float: `dtype_traits<T>::to_float(x)`.
template <class T>
KVSIFT_HD inline float to_float(T x) {
  return dtype_traits<T>::to_float(x);
}
/// Narrows a float to element type T (round to nearest even): `dtype_traits<T>::from_float(x)`.
template <class T>
KVSIFT_HD inline T from_float(float x) {
  return dtype_traits<T>::from_float(x);
}

/// True for the element types that have dtype_traits (float, half_t, bfloat16_t, and with
/// core/dtype_cuda.cuh `__half` and `__nv_bfloat16`), also through const.
template <class T, class = void>
struct is_supported_dtype : std::false_type {};
template <class T>
struct is_supported_dtype<T, std::void_t<decltype(dtype_traits<T>::dtype)>> : std::true_type {};

}  // namespace kvsift
