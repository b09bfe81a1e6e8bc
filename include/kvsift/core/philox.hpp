#pragma once
/// \file
/// \brief Philox4x32-10, the counter-based generator of Salmon et al. (SC'11, "Parallel random numbers: as
/// easy as 1, 2, 3"), usable on host and device.
///
/// A counter-based generator has no sequential state: the output is a pure function of a 128-bit
/// counter and a 64-bit key. That is what makes sampling reproducible across backends and under CUDA
/// graph replay: host and device compute the same bits for the same (seed, offset, index), and a
/// replayed graph that is handed a new offset draws new numbers without any state living on the device.
///
/// kvsift's stream convention (PhiloxStream): key = seed; counter = (index, offset) with the element
/// index in words 0-1 and the caller's offset (for example the training step) in words 2-3. One
/// counter yields four 32-bit words; kvsift uses word 0 for a float uniform and words 0-1 for a double.
///
/// Checked against the Random123 known-answer vectors (tests/host/test_hardkuma.cpp).

#include <cstdint>

#include "kvsift/core/config.hpp"

namespace kvsift {

/// A 128-bit Philox counter, or one output block of four 32-bit words.
struct PhiloxBlock {
  std::uint32_t w[4];  ///< the four words, word 0 first
};
/// A 64-bit Philox key (kvsift: the stream's seed, low word first).
struct PhiloxKey {
  std::uint32_t w[2];  ///< the two words, low word first
};

namespace detail {

inline constexpr std::uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr std::uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr std::uint32_t kPhiloxW0 = 0x9E3779B9u;  ///< golden ratio
inline constexpr std::uint32_t kPhiloxW1 = 0xBB67AE85u;  ///< sqrt(3) - 1

KVSIFT_HD inline std::uint32_t mul_hi_lo(std::uint32_t a, std::uint32_t b, std::uint32_t* hi) {
#if defined(__CUDA_ARCH__)
  *hi = __umulhi(a, b);
  return a * b;
#else
  const std::uint64_t p = std::uint64_t(a) * std::uint64_t(b);
  *hi = std::uint32_t(p >> 32);
  return std::uint32_t(p);
#endif
}

KVSIFT_HD inline PhiloxBlock philox_round(PhiloxBlock c, PhiloxKey k) {
  std::uint32_t hi0, hi1;
  const std::uint32_t lo0 = mul_hi_lo(kPhiloxM0, c.w[0], &hi0);
  const std::uint32_t lo1 = mul_hi_lo(kPhiloxM1, c.w[2], &hi1);
  return PhiloxBlock{{hi1 ^ c.w[1] ^ k.w[0], lo1, hi0 ^ c.w[3] ^ k.w[1], lo0}};
}

}  // namespace detail

/// The raw generator: ten rounds with the key bumped (Weyl sequence) between rounds.
KVSIFT_HD inline PhiloxBlock philox4x32_10(PhiloxBlock counter, PhiloxKey key) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key.w[0] += detail::kPhiloxW0;
      key.w[1] += detail::kPhiloxW1;
    }
    counter = detail::philox_round(counter, key);
  }
  return counter;
}

/// Uniforms strictly inside (0, 1), symmetric about 1/2, exact on both backends: (m + 1/2) 2^-p with
/// p = 23 (float) or 52 (double) bits, so the largest value 1 - 2^-(p+1) is still representable below 1
/// (with p = 24 it would round up to 1). Integer-to-float conversion of p bits and a power-of-two
/// scaling are exact, so host and device produce identical values.
KVSIFT_HD inline float uniform_float_from_bits(std::uint32_t bits) {
  return (float(bits >> 9) + 0.5f) * (1.0f / 8388608.0f);  // 2^-23
}
/// The double uniform from 52 bits: the top 32 of `hi` and the top 20 of `lo`, as described above.
KVSIFT_HD inline double uniform_double_from_bits(std::uint32_t hi, std::uint32_t lo) {
  const std::uint64_t m = (std::uint64_t(hi) << 20) | (lo >> 12);  // 52 bits
  return (double(m) + 0.5) * (1.0 / 4503599627370496.0);          // 2^-52
}

/// A named stream of random numbers: `seed` selects the stream, `offset` the draw within it (use the
/// training step), and the element index is supplied per call.
struct PhiloxStream {
  std::uint64_t seed = 0;    ///< the key: which stream
  std::uint64_t offset = 0;  ///< counter words 2-3: which draw of the stream (e.g. the training step)

  /// The four random words of element `index` (counter words 0-1) of this draw.
  KVSIFT_HD PhiloxBlock bits(std::uint64_t index) const {
    const PhiloxBlock counter{{std::uint32_t(index), std::uint32_t(index >> 32), std::uint32_t(offset),
                               std::uint32_t(offset >> 32)}};
    const PhiloxKey key{{std::uint32_t(seed), std::uint32_t(seed >> 32)}};
    return philox4x32_10(counter, key);
  }
};

/// Uniform in (0, 1) for element `index` of the stream, in float or double.
template <class T>
KVSIFT_HD inline T philox_uniform(const PhiloxStream& stream, std::uint64_t index);
/// The float uniform: uniform_float_from_bits of word 0.
template <>
KVSIFT_HD inline float philox_uniform<float>(const PhiloxStream& stream, std::uint64_t index) {
  return uniform_float_from_bits(stream.bits(index).w[0]);
}
/// The double uniform: uniform_double_from_bits of words 0 and 1.
template <>
KVSIFT_HD inline double philox_uniform<double>(const PhiloxStream& stream, std::uint64_t index) {
  const PhiloxBlock b = stream.bits(index);
  return uniform_double_from_bits(b.w[0], b.w[1]);
}

}  // namespace kvsift
