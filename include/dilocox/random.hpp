// dilocox/random.hpp: a stateless counter-based generator: the value for
// (seed, index) is a pure function, so host and device, any thread split and any
// call order produce the same numbers. Not cryptographic; uniform and normal only.
#pragma once

#include <cmath>
#include <cstdint>

#include "dilocox/config.hpp"

namespace dilocox {

// A 32-bit integer mixer with full avalanche (xor-shift / multiply, constants
// from C. Wellons' hash-prospector "lowbias32").
DILOCOX_HOST_DEVICE constexpr std::uint32_t mix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// The key for the 2^32 counters starting at `hi << 32` under `seed`.
DILOCOX_HOST_DEVICE constexpr std::uint32_t counter_key(std::uint64_t seed, std::uint64_t index) {
  const auto lo = static_cast<std::uint32_t>(seed);
  const auto hi = static_cast<std::uint32_t>(seed >> 32);
  return mix32(lo ^ mix32(hi + 0x9e3779b9U * (static_cast<std::uint32_t>(index >> 32) + 1U)));
}

// 32 random bits for counter `index` under `key` (from counter_key).
DILOCOX_HOST_DEVICE constexpr std::uint32_t counter_bits(std::uint32_t key, std::uint64_t index) {
  return mix32(static_cast<std::uint32_t>(index) * 0x9e3779b9U + key);
}

// Uniform in [0, 1) with 24 random bits: exact in float.
DILOCOX_HOST_DEVICE constexpr float bits_to_unit(std::uint32_t bits) {
  return static_cast<float>(bits >> 8) * 0x1p-24f;
}

DILOCOX_HOST_DEVICE inline float counter_uniform(std::uint64_t seed, std::uint64_t index) {
  return bits_to_unit(counter_bits(counter_key(seed, index), index));
}

// Standard normal for counter `index` (Box-Muller on counters 2*index, 2*index+1).
DILOCOX_HOST_DEVICE inline float counter_normal(std::uint64_t seed, std::uint64_t index) {
  const double u1 = (static_cast<double>(counter_uniform(seed, 2 * index)) + 0x1p-25);  // (0, 1)
  const double u2 = static_cast<double>(counter_uniform(seed, 2 * index + 1));
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

// A seed for stream `index` of a run seeded with `seed` (e.g. one quantizer seed per
// sync), different per `salt` (one salt per use), the same on every replica.
DILOCOX_HOST_DEVICE constexpr std::uint64_t stream_seed(std::uint64_t seed, std::uint64_t index, std::uint32_t salt) {
  return seed ^ (static_cast<std::uint64_t>(mix32(static_cast<std::uint32_t>(index) * 2654435761U + salt)) << 32) ^
         index;
}

}  // namespace dilocox
