// dilocox/checksum.hpp: a 64-bit non-cryptographic checksum for payloads: four
// independent multiply-xor lanes over little-endian 8-byte words, then a final mix.
// Catches truncation, bit flips and reordering of words; not an authenticator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace dilocox {

namespace detail {
constexpr std::uint64_t mix64(std::uint64_t x) {  // splitmix64 finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
inline std::uint64_t lane_step(std::uint64_t h, std::uint64_t w) {
  h ^= w * 0x9e3779b97f4a7c15ULL;
  h = (h << 31) | (h >> 33);
  return h * 0xc2b2ae3d27d4eb4fULL;
}
}  // namespace detail

inline std::uint64_t checksum64(std::span<const std::byte> data) {
  std::uint64_t h[4] = {0x243f6a8885a308d3ULL, 0x13198a2e03707344ULL, 0xa4093822299f31d0ULL,
                        0x082efa98ec4e6c89ULL};
  const std::byte* p = data.data();
  const std::size_t n = data.size(), words = n / 8;
  std::size_t i = 0;
  for (; i + 4 <= words; i += 4) {
    std::uint64_t w[4];
    std::memcpy(w, p + 8 * i, 32);
    for (int l = 0; l < 4; ++l) h[l] = detail::lane_step(h[l], w[l]);
  }
  for (; i < words; ++i) {
    std::uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    h[i % 4] = detail::lane_step(h[i % 4], w);
  }
  std::uint64_t tail = 0;
  if (n % 8) std::memcpy(&tail, p + 8 * words, n % 8);
  std::uint64_t r = detail::mix64(h[0]) ^ detail::mix64(h[1] + 1) ^ detail::mix64(h[2] + 2) ^ detail::mix64(h[3] + 3);
  return detail::mix64(r ^ detail::mix64(tail ^ (static_cast<std::uint64_t>(n) << 3)));
}

}  // namespace dilocox
