// dilocox/half.hpp: float <-> IEEE binary16 and bfloat16 conversion, round to
// nearest even, with infinities, NaN and subnormals handled; bit-exact and portable
// (no compiler _Float16 needed). Used by the fp16 / bf16 dense codecs.
#pragma once

#include <cstdint>
#include <cstring>

#include "dilocox/config.hpp"

namespace dilocox {

DILOCOX_HOST_DEVICE inline std::uint16_t float_to_half(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000U;
  const std::uint32_t absx = x & 0x7fffffffU;
  if (absx >= 0x7f800000U) return static_cast<std::uint16_t>(sign | (absx > 0x7f800000U ? 0x7e00U : 0x7c00U));
  if (absx >= 0x477ff000U) return static_cast<std::uint16_t>(sign | 0x7c00U);  // rounds past 65504: inf
  if (absx < 0x38800000U) {  // result subnormal (or zero): |f| < 2^-14
    if (absx < 0x33000000U) return static_cast<std::uint16_t>(sign);  // < 2^-25: rounds to zero
    const std::uint32_t mant = (absx & 0x7fffffU) | 0x800000U;
    const int shift = 126 - static_cast<int>(absx >> 23);  // 14..24 + 1
    const std::uint32_t q = mant >> shift, rem = mant & ((1U << shift) - 1), half = 1U << (shift - 1);
    return static_cast<std::uint16_t>(sign | (q + ((rem > half || (rem == half && (q & 1))) ? 1 : 0)));
  }
  const std::uint32_t biased = absx - 0x38000000U;  // rebias exponent 127 -> 15
  const std::uint32_t q = biased >> 13, rem = biased & 0x1fffU;
  return static_cast<std::uint16_t>(sign | (q + ((rem > 0x1000U || (rem == 0x1000U && (q & 1))) ? 1 : 0)));
}

DILOCOX_HOST_DEVICE inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000U) << 16;
  std::uint32_t e = (h >> 10) & 0x1fU, m = h & 0x3ffU, x;
  if (e == 0x1f) {
    x = sign | 0x7f800000U | (m << 13);
  } else if (e != 0) {
    x = sign | ((e + 112) << 23) | (m << 13);
  } else if (m == 0) {
    x = sign;
  } else {  // subnormal half: normalize
    e = 113;
    while (!(m & 0x400U)) m <<= 1, --e;
    x = sign | (e << 23) | ((m & 0x3ffU) << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

DILOCOX_HOST_DEVICE inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffU) > 0x7f800000U) return static_cast<std::uint16_t>((x >> 16) | 0x40U);  // quiet NaN
  x += 0x7fffU + ((x >> 16) & 1U);
  return static_cast<std::uint16_t>(x >> 16);
}

DILOCOX_HOST_DEVICE inline float bf16_to_float(std::uint16_t h) {
  const std::uint32_t x = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace dilocox
