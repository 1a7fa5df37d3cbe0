// dilocox/sparse_code.hpp: the chunked top-k code of SparseLoCo: a vector cut into
// chunks of `chunk` elements, k entries kept per chunk (min(k, chunk length)), each kept
// value sent in 2 bits (sign, and whether it is in the larger or the smaller half of
// its chunk's magnitudes), with two magnitudes per chunk (the mean of each half).
// Layout of `encode_chunked` (little-endian, bit streams LSB first):
//   [scales: per chunk lo, hi (fp32 or bf16)] [indices: ceil(log2 chunk) bits each, per
//   chunk ascending] [codes: 2 bits each, bit 0 = negative, bit 1 = larger half]
// Standard library only. Not here: choosing what to keep (compress/sparse.hpp).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "dilocox/config.hpp"
#include "dilocox/quantize.hpp"

namespace dilocox {

struct ChunkedCode {
  std::size_t chunk = 4096;  // elements per chunk
  std::uint32_t k = 64;      // entries kept per chunk
  ScaleFormat scale = ScaleFormat::fp32;
  friend bool operator==(const ChunkedCode&, const ChunkedCode&) = default;
};

inline void validate(const ChunkedCode& c) {
  detail::require(c.chunk >= 2 && c.chunk <= max_quant_block, "ChunkedCode",
                  "chunk must be in [2, 2^24], got " + std::to_string(c.chunk));
  detail::require(c.k >= 1 && c.k <= c.chunk, "ChunkedCode",
                  "k must be in [1, chunk], got " + std::to_string(c.k));
  detail::require(c.scale == ScaleFormat::fp32 || c.scale == ScaleFormat::bf16, "ChunkedCode",
                  "unknown scale format " + std::to_string(static_cast<int>(c.scale)));
}

// Bits per index: enough for positions [0, chunk).
inline int chunk_index_bits(std::size_t chunk) { return std::max(1, static_cast<int>(std::bit_width(chunk - 1))); }

// Entries kept in total for n elements.
inline std::size_t chunked_kept(std::size_t n, const ChunkedCode& c) {
  const std::size_t full = n / c.chunk, tail = n % c.chunk;
  return full * c.k + std::min<std::size_t>(c.k, tail);
}

inline std::size_t chunked_encoded_size(std::size_t n, const ChunkedCode& c) {
  validate(c);
  const std::size_t chunks = (n + c.chunk - 1) / c.chunk, kept = chunked_kept(n, c);
  return chunks * 2 * scale_bytes(c.scale) + (kept * static_cast<std::size_t>(chunk_index_bits(c.chunk)) + 7) / 8 +
         (kept * 2 + 7) / 8;
}

namespace detail {

// A little-endian bit stream over bytes (writes assume zeroed storage).
struct BitWriter {
  std::byte* out;
  std::size_t bit = 0;
  void put(std::uint32_t v, int bits) {
    for (int b = 0; b < bits; ++b, ++bit)
      if ((v >> b) & 1U) out[bit / 8] |= std::byte{static_cast<unsigned char>(1U << (bit % 8))};
  }
};
struct BitReader {
  const std::byte* in;
  std::size_t bit = 0;
  std::uint32_t get(int bits) {
    std::uint32_t v = 0;
    for (int b = 0; b < bits; ++b, ++bit)
      v |= static_cast<std::uint32_t>((std::to_integer<unsigned>(in[bit / 8]) >> (bit % 8)) & 1U) << b;
    return v;
  }
};

struct ChunkedLayout {  // byte offsets of the three sections
  std::size_t chunks, kept, index_at, code_at;
  int ib;
  ChunkedLayout(std::size_t n, const ChunkedCode& c)
      : chunks((n + c.chunk - 1) / c.chunk), kept(chunked_kept(n, c)), ib(chunk_index_bits(c.chunk)) {
    index_at = chunks * 2 * scale_bytes(c.scale);
    code_at = index_at + (kept * static_cast<std::size_t>(ib) + 7) / 8;
  }
};

}  // namespace detail

// Encodes, for each chunk, the entries given by `picked` (per chunk, ascending positions
// within the chunk, min(k, chunk length) of them, concatenated over chunks) of x into
// out (chunked_encoded_size bytes). The two magnitudes of a chunk are the means of the
// smaller and the larger half of its picked magnitudes (halves split at k / 2, ties by
// position). Throws Error on NaN/Inf among the picked values or a bad `picked`.
inline void encode_chunked(std::span<const float> x, std::span<const std::uint32_t> picked, const ChunkedCode& c,
                           std::span<std::byte> out) {
  const detail::ChunkedLayout l(x.size(), c);
  detail::require(out.size() >= chunked_encoded_size(x.size(), c), "encode_chunked", "output buffer too short");
  detail::require(picked.size() == l.kept, "encode_chunked",
                  std::to_string(picked.size()) + " positions given, the code keeps " + std::to_string(l.kept));
  std::fill(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(chunked_encoded_size(x.size(), c)), std::byte{0});
  detail::BitWriter idx{out.data() + l.index_at}, code{out.data() + l.code_at};
  thread_local std::vector<std::uint32_t> order;  // (k) one chunk's pick slots sorted by magnitude
  thread_local std::vector<std::uint8_t> large;    // (k) 1: the slot is in the larger half
  const std::size_t sb = scale_bytes(c.scale);
  std::size_t at = 0;
  for (std::size_t ch = 0; ch < l.chunks; ++ch) {
    const std::size_t base = ch * c.chunk, len = std::min(c.chunk, x.size() - base);
    const std::size_t kc = std::min<std::size_t>(c.k, len);
    const auto pk = picked.subspan(at, kc);
    for (std::size_t i = 0; i < kc; ++i) {
      detail::require(pk[i] < len && (i == 0 || pk[i] > pk[i - 1]), "encode_chunked",
                      "chunk " + std::to_string(ch) + ": positions must ascend within the chunk");
      detail::require(std::isfinite(x[base + pk[i]]), "encode_chunked",
                      "element " + std::to_string(base + pk[i]) + " is not finite");
    }
    // Halves by magnitude: ranks [0, kc/2) small, [kc/2, kc) large.
    order.resize(kc);
    for (std::size_t i = 0; i < kc; ++i) order[i] = static_cast<std::uint32_t>(i);
    std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
      const float fa = std::fabs(x[base + pk[a]]), fb = std::fabs(x[base + pk[b]]);
      return fa != fb ? fa < fb : a < b;
    });
    const std::size_t half = kc / 2;
    double lo = 0, hi = 0;
    for (std::size_t i = 0; i < kc; ++i) (i < half ? lo : hi) += std::fabs(x[base + pk[order[i]]]);
    const float lo_s = half ? static_cast<float>(lo / static_cast<double>(half)) : 0.0f;
    const float hi_s = kc > half ? static_cast<float>(hi / static_cast<double>(kc - half)) : 0.0f;
    detail::store_scale(out.data() + ch * 2 * sb, lo_s, c.scale);
    detail::store_scale(out.data() + ch * 2 * sb + sb, hi_s, c.scale);
    large.assign(kc, 0);
    for (std::size_t i = half; i < kc; ++i) large[order[i]] = 1;
    for (std::size_t i = 0; i < kc; ++i) {
      idx.put(pk[i], l.ib);
      const bool neg = std::signbit(x[base + pk[i]]);
      const bool big = large[i] != 0;
      code.put((neg ? 1U : 0U) | (big ? 2U : 0U), 2);
    }
    at += kc;
  }
}

// Throws Error unless every chunk's indices ascend inside the chunk (n elements).
inline void check_chunked_indices(std::span<const std::byte> in, std::size_t n, const ChunkedCode& c) {
  const detail::ChunkedLayout l(n, c);
  detail::require(in.size() >= chunked_encoded_size(n, c), "chunked code", "input too short");
  detail::BitReader idx{in.data() + l.index_at};
  for (std::size_t ch = 0; ch < l.chunks; ++ch) {
    const std::size_t len = std::min(c.chunk, n - ch * c.chunk), kc = std::min<std::size_t>(c.k, len);
    std::uint32_t prev = 0;
    for (std::size_t i = 0; i < kc; ++i) {
      const std::uint32_t p = idx.get(l.ib);
      detail::require(p < len && (i == 0 || p > prev), "chunked code",
                      "chunk " + std::to_string(ch) + ": index " + std::to_string(p) + " out of order or range");
      prev = p;
    }
  }
}

// out += the values the code carries (out.size() is the element count). Throws Error
// when an index is out of its chunk or not ascending.
inline void decode_chunked_add(std::span<const std::byte> in, std::span<float> out, const ChunkedCode& c) {
  const detail::ChunkedLayout l(out.size(), c);
  detail::require(in.size() >= chunked_encoded_size(out.size(), c), "decode_chunked_add", "input too short");
  detail::BitReader idx{in.data() + l.index_at}, code{in.data() + l.code_at};
  const std::size_t sb = scale_bytes(c.scale);
  for (std::size_t ch = 0; ch < l.chunks; ++ch) {
    const std::size_t base = ch * c.chunk, len = std::min(c.chunk, out.size() - base);
    const std::size_t kc = std::min<std::size_t>(c.k, len);
    const float lo = detail::load_scale(in.data() + ch * 2 * sb, c.scale);
    const float hi = detail::load_scale(in.data() + ch * 2 * sb + sb, c.scale);
    std::uint32_t prev = 0;
    for (std::size_t i = 0; i < kc; ++i) {
      const std::uint32_t p = idx.get(l.ib), q = code.get(2);
      detail::require(p < len && (i == 0 || p > prev), "decode_chunked_add",
                      "chunk " + std::to_string(ch) + ": index " + std::to_string(p) + " out of order or range");
      prev = p;
      const float mag = (q & 2U) ? hi : lo;
      out[base + p] += (q & 1U) ? -mag : mag;
    }
  }
}

}  // namespace dilocox
