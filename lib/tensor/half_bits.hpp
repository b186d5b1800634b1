// Bit-level float16 / bfloat16 <-> float, bit-exact with PyTorch's c10::Half / c10::BFloat16.
// Inline so that convert_elements' loops inline (and can vectorize) them; half.cpp wraps them
// for the public API. Integer-only, so the result never depends on the FP environment.
#pragma once

#include <cstdint>
#include <cstring>

namespace shmdist::detail {

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float float_from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Rounds `value >> shift` to nearest, ties to even. `shift` is in [1, 31].
inline std::uint32_t shift_right_round_even(std::uint32_t value, std::uint32_t shift) {
  const std::uint32_t kept = value >> shift;
  const std::uint32_t rest = value & ((std::uint32_t{1} << shift) - 1);
  const std::uint32_t half = std::uint32_t{1} << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

inline constexpr std::uint32_t kFloatInfBits = 0x7f800000u;

inline float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = (std::uint32_t{h} & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {
    // c10's software conversion goes through a float multiply, which quiets signalling NaNs.
    const std::uint32_t quiet = mantissa != 0 ? 0x400000u : 0u;
    return float_from_bits(sign | kFloatInfBits | quiet | (mantissa << 13));
  }
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24 is exact in float.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return float_from_bits(sign | float_bits(magnitude));
  }
  return float_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline std::uint16_t float_to_half_bits(float f) {
  constexpr std::uint32_t kHalfMinNormal = 0x38800000u;  // 2^-14
  constexpr std::uint32_t kRoundsToInf = 0x477ff000u;    // 65520: the tie above 65504
  constexpr std::uint32_t kRoundsToZero = 0x33000000u;   // 2^-25: the tie above 0
  const std::uint32_t u = float_bits(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t magnitude = u & 0x7fffffffu;
  std::uint32_t result;
  if (magnitude > kFloatInfBits) {
    result = 0x7e00u;  // c10 drops NaN payloads and keeps the sign
  } else if (magnitude >= kRoundsToInf) {
    result = 0x7c00u;
  } else if (magnitude >= kHalfMinNormal) {
    // Rebias the exponent (127 -> 15) and round 23 mantissa bits to 10; a carry out of the
    // mantissa correctly bumps the exponent.
    result = shift_right_round_even(magnitude - (112u << 23), 13);
  } else if (magnitude <= kRoundsToZero) {
    result = 0;
  } else {
    // Half subnormal: value = significand * 2^(exponent-150); in units of 2^-24 that is
    // significand >> (126 - exponent), with exponent <= 112 so the shift is in [14, 24].
    const std::uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
    result = shift_right_round_even(significand, 126u - (magnitude >> 23));
  }
  return static_cast<std::uint16_t>(sign | result);
}

inline float bfloat16_bits_to_float(std::uint16_t b) {
  return float_from_bits(std::uint32_t{b} << 16);
}

// c10::BFloat16(float): round to nearest even; every NaN becomes 0x7fc0.
inline std::uint16_t float_to_bfloat16_bits(float f) {
  const std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > kFloatInfBits) return 0x7fc0;
  const std::uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding_bias) >> 16);
}

}  // namespace shmdist::detail
