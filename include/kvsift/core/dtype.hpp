#pragma once
/// \file
/// \brief Element types and their traits, usable on host and device.
///
/// kvsift::half_t and kvsift::bfloat16_t are 16-bit storage types with the bit layout of CUDA's
/// __half and __nv_bfloat16, and kvsift::fp8_e4m3_t / fp8_e5m2_t 8-bit ones with the bit layout of
/// __nv_fp8_e4m3 / __nv_fp8_e5m2, so an engine reinterprets its buffers without a copy, and host-only
/// code (compiled by g++ without the CUDA toolkit) still has them. fp8 is a KV-cache storage type
/// only (is_kv_dtype): queries and outputs stay 16 or 32 bits (is_supported_dtype), and an fp8 row is
/// read as float(fp8) * scale (kv/kv_scales.hpp). The .cuh side adds traits for __half
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

/// fp8 E4M3 storage (1 sign, 4 exponent bits with bias 7, 3 mantissa bits) with the bit layout of
/// CUDA's `__nv_fp8_e4m3`: no infinity, NaN = 0x7f / 0xff, largest finite value 448.
struct alignas(1) fp8_e4m3_t {
  std::uint8_t bits;  ///< the raw E4M3 bit pattern
};
/// fp8 E5M2 storage (1 sign, 5 exponent bits with bias 15, 2 mantissa bits: the top byte of a binary16)
/// with the bit layout of CUDA's `__nv_fp8_e5m2`: IEEE-like infinities and NaNs, largest finite 57344.
struct alignas(1) fp8_e5m2_t {
  std::uint8_t bits;  ///< the raw E5M2 bit pattern
};

/// Run-time tag of an element type (dtype_traits<T>::dtype), for messages and type-erased callers.
enum class DType : int { kFloat32, kFloat16, kBFloat16, kFp8E4M3, kFp8E5M2 };

/// The type's name: "float32", "float16", "bfloat16", "float8_e4m3" or "float8_e5m2" ("unknown"
/// outside the enumeration).
inline const char* to_string(DType d) {
  switch (d) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFp8E4M3: return "float8_e4m3";
    case DType::kFp8E5M2: return "float8_e5m2";
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
  // NaN becomes the canonical 0x7fffffff, as the device's cvt.f32.f16 makes it, so host and device
  // widen every half (and every fp8 code, which widens through half) to the same bits.
  if (exp == 0x1f) return bits_to_float(man ? 0x7fffffffu : (sign | 0x7f800000u));  // NaN / inf
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


/// E4M3 -> binary16 bits, exactly as CUDA's host emulation (__nv_cvt_fp8_to_halfraw) does it: every
/// E4M3 value is a binary16 value; NaN (0x7f / 0xff) gives the canonical binary16 NaN 0x7fff, sign
/// dropped. The device path (sm_89+) is `cvt.rn.f16x2.e4m3x2`, which a GPU test checks bit by bit.
KVSIFT_HD inline std::uint16_t e4m3_bits_to_half_bits_soft(std::uint8_t b) {
  const std::uint16_t sign = std::uint16_t((b & 0x80u) << 8);
  const std::uint32_t mag = b & 0x7fu;
  if (mag == 0x7fu) return 0x7fffu;
  if (mag == 0) return sign;
  std::uint32_t exp = mag >> 3, man = mag & 7u;
  if (exp == 0) {
    // Subnormal E4M3 (man * 2^-9) is a normal binary16: shift the leading one out.
    exp = 1;
    while ((man & 8u) == 0) {
      man <<= 1;
      --exp;
    }
    man &= 7u;
  }
  return std::uint16_t(sign | ((exp + 15 - 7) << 10) | (man << 7));
}

/// E4M3 -> binary16 bits: the hardware conversion on sm_89+, the software one elsewhere (bit-identical).
KVSIFT_HD inline std::uint16_t e4m3_bits_to_half_bits(std::uint8_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  std::uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(std::uint16_t(b)));
  return std::uint16_t(h2 & 0xffffu);
#else
  return e4m3_bits_to_half_bits_soft(b);
#endif
}

/// Two E4M3 codes (low byte: element 0) -> two binary16 values (low half: element 0), for kernels that
/// widen pairs: one `cvt.rn.f16x2.e4m3x2` on sm_89+; the same bits as e4m3_bits_to_half_bits per byte.
KVSIFT_HD inline std::uint32_t e4m3x2_bits_to_half2_bits(std::uint16_t b2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  std::uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(b2));
  return h2;
#else
  return std::uint32_t(e4m3_bits_to_half_bits_soft(std::uint8_t(b2 & 0xffu))) |
         (std::uint32_t(e4m3_bits_to_half_bits_soft(std::uint8_t(b2 >> 8))) << 16);
#endif
}

/// E5M2 -> binary16 bits: E5M2 is the top byte of a binary16, so widening is a shift (NaN payloads kept),
/// on host and device alike.
KVSIFT_HD inline std::uint16_t e5m2_bits_to_half_bits(std::uint8_t b) { return std::uint16_t(std::uint16_t(b) << 8); }

/// float -> fp8 bits with round to nearest even and saturation to the largest finite value (CUDA's
/// `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...)`, whose host emulation this follows step by step):
/// |x| above the largest finite value, infinity included, gives +-max; NaN gives 0x7f (sign dropped,
/// as CUDA does); magnitudes at or below half the smallest subnormal give a signed zero.
/// ManBits = 3, Bias = 7, MaxCode = 0x7e for E4M3; ManBits = 2, Bias = 15, MaxCode = 0x7b for E5M2.
template <int ManBits, int Bias, std::uint32_t MaxCode>
KVSIFT_HD inline std::uint8_t float_to_fp8_bits_soft(float x) {
  const std::uint32_t u = float_to_bits(x);
  const std::uint32_t sign = (u >> 24) & 0x80u;
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7fu;  // NaN
  // The largest finite value plus half its ulp: at or above it the nearest-even result would leave the
  // finite range (E4M3: 464 ties to 448, the even neighbour, so only values above it saturate).
  constexpr int kMaxExp = int(MaxCode >> ManBits) - Bias;  // unbiased exponent of the largest finite
  constexpr std::uint32_t kMaxMan = MaxCode & ((1u << ManBits) - 1u);
  // float bits of max + half ulp: mantissa kMaxMan then a one at the first dropped position.
  constexpr std::uint32_t kOverflow = (std::uint32_t(kMaxExp + 127) << 23) | (kMaxMan << (23 - ManBits)) |
                                      (1u << (22 - ManBits));
  // E4M3's max mantissa is even, so the tie at kOverflow rounds down to max; E5M2's is odd, so it
  // rounds up out of range and saturates: the comparison is > for even and >= for odd max mantissas.
  if ((kMaxMan & 1u) ? abs >= kOverflow : abs > kOverflow) return std::uint8_t(sign | MaxCode);
  const int exp = int(abs >> 23) - 127;  // unbiased; abs is finite here
  constexpr int kMinNormalExp = 1 - Bias;
  if (exp >= kMinNormalExp) {
    // Normal: keep ManBits of the mantissa, round to nearest even on the dropped 23 - ManBits bits.
    constexpr int kDrop = 23 - ManBits;
    const std::uint32_t man = (abs >> kDrop) & ((1u << ManBits) - 1u);
    std::uint32_t res = (std::uint32_t(exp + Bias) << ManBits) | man;
    const std::uint32_t rem = abs & ((1u << kDrop) - 1u), half = 1u << (kDrop - 1);
    if (rem > half || (rem == half && (res & 1u))) ++res;  // a carry moves into the exponent correctly
    return std::uint8_t(sign | res);
  }
  // Subnormal result: value / 2^(kMinNormalExp - ManBits) rounded to an integer in [0, 2^ManBits]
  // (2^ManBits is the smallest normal's code). shift = bits of the 24-bit significand dropped.
  // sig = 1.m * 2^23; the result's unit is 2^(kMinNormalExp - ManBits), so drop
  // 23 - ManBits + (kMinNormalExp - exp) bits (>= 24 - ManBits here, since exp < kMinNormalExp).
  const int shift = 23 - ManBits + (kMinNormalExp - exp);
  if (shift > 24) return std::uint8_t(sign);  // below half the smallest subnormal (or a float denormal)
  const std::uint32_t sig = (abs & 0x7fffffu) | 0x800000u;
  std::uint32_t res = sig >> shift;
  const std::uint32_t rem = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (res & 1u))) ++res;
  return std::uint8_t(sign | res);
}

/// float -> E4M3 bits (round to nearest even, satfinite): `cvt.rn.satfinite.e4m3x2.f32` on sm_89+, the
/// software conversion elsewhere; bit-identical (a GPU test checks it).
KVSIFT_HD inline std::uint8_t float_to_e4m3_bits(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  std::uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.f), "f"(x));
  return std::uint8_t(r & 0xffu);
#else
  return float_to_fp8_bits_soft<3, 7, 0x7eu>(x);
#endif
}
/// float -> E5M2 bits (round to nearest even, satfinite): `cvt.rn.satfinite.e5m2x2.f32` on sm_89+.
KVSIFT_HD inline std::uint8_t float_to_e5m2_bits(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  std::uint16_t r;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.f), "f"(x));
  return std::uint8_t(r & 0xffu);
#else
  return float_to_fp8_bits_soft<2, 15, 0x7bu>(x);
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

template <>
/// fp8_e4m3_t: a KV storage type (is_kv_dtype, not is_supported_dtype). Widening is exact; narrowing
/// rounds to nearest even and saturates to +-448 (CUDA's satfinite), NaN stays NaN.
struct dtype_traits<fp8_e4m3_t> {
  using accum_type = float;                       ///< the type arithmetic happens in
  static constexpr DType dtype = DType::kFp8E4M3;  ///< the run-time tag
  static constexpr const char* name = "float8_e4m3";  ///< the name used in messages and benchmark labels
  static constexpr float max_finite = 448.f;  ///< the largest finite value: what narrowing saturates to
  /// Widens to float (exact; NaN codes give a NaN).
  KVSIFT_HD static float to_float(fp8_e4m3_t x) { return detail::half_bits_to_float(detail::e4m3_bits_to_half_bits(x.bits)); }
  /// Narrows from float: round to nearest even, saturate to +-448, NaN to 0x7f.
  KVSIFT_HD static fp8_e4m3_t from_float(float x) { return fp8_e4m3_t{detail::float_to_e4m3_bits(x)}; }
};

template <>
/// fp8_e5m2_t: a KV storage type (is_kv_dtype, not is_supported_dtype). Widening is exact; narrowing
/// rounds to nearest even and saturates to +-57344 (infinity too: CUDA's satfinite), NaN stays NaN.
struct dtype_traits<fp8_e5m2_t> {
  using accum_type = float;                       ///< the type arithmetic happens in
  static constexpr DType dtype = DType::kFp8E5M2;  ///< the run-time tag
  static constexpr const char* name = "float8_e5m2";  ///< the name used in messages and benchmark labels
  static constexpr float max_finite = 57344.f;  ///< the largest finite value: what narrowing saturates to
  /// Widens to float (exact).
  KVSIFT_HD static float to_float(fp8_e5m2_t x) { return detail::half_bits_to_float(detail::e5m2_bits_to_half_bits(x.bits)); }
  /// Narrows from float: round to nearest even, saturate to +-57344, NaN to 0x7f.
  KVSIFT_HD static fp8_e5m2_t from_float(float x) { return fp8_e5m2_t{detail::float_to_e5m2_bits(x)}; }
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

namespace detail {
template <class T, class = void>
struct has_dtype_traits : std::false_type {};
template <class T>
struct has_dtype_traits<T, std::void_t<decltype(dtype_traits<T>::dtype)>> : std::true_type {};
template <class T, bool = has_dtype_traits<T>::value>
struct is_fp8_tag : std::false_type {};
template <class T>
struct is_fp8_tag<T, true>
    : std::bool_constant<dtype_traits<T>::dtype == DType::kFp8E4M3 || dtype_traits<T>::dtype == DType::kFp8E5M2> {};
}  // namespace detail

/// True for the 8-bit float types (fp8_e4m3_t, fp8_e5m2_t, and with core/dtype_cuda.cuh
/// `__nv_fp8_e4m3` and `__nv_fp8_e5m2`), also through const: KV storage that is read with a scale.
template <class T>
struct is_fp8_dtype : detail::is_fp8_tag<T> {};

/// True for the element types of queries, outputs and 16/32-bit KV caches: float, half_t, bfloat16_t,
/// and with core/dtype_cuda.cuh `__half` and `__nv_bfloat16`, also through const. Not fp8 (is_kv_dtype).
template <class T>
struct is_supported_dtype : std::bool_constant<detail::has_dtype_traits<T>::value && !is_fp8_dtype<T>::value> {};

/// True for the element types a KV view may hold: every is_supported_dtype type and the fp8 types.
template <class T>
struct is_kv_dtype : std::bool_constant<is_supported_dtype<T>::value || is_fp8_dtype<T>::value> {};

/// The largest finite value of fp8 type T (448 for E4M3, 57344 for E5M2): per-token scales are
/// amax / fp8_max_finite<T>() so a row's largest magnitude lands on it.
template <class T>
KVSIFT_HD constexpr float fp8_max_finite() {
  static_assert(is_fp8_dtype<T>::value, "fp8_max_finite<T>: T must be an fp8 type");
  return dtype_traits<T>::max_finite;
}

}  // namespace kvsift
