// dilocox/codec.hpp: how a dense float vector is put on the wire (fp32, fp16, bf16,
// int8/int4 quantized) as one checksummed payload, and how any payload, sparse ones
// included, is added back into a dense vector. The building block of the reducers.
// Standard library only. Not here: choosing what to send (compressor.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dilocox/config.hpp"
#include "dilocox/half.hpp"
#include "dilocox/quantize.hpp"
#include "dilocox/wire.hpp"

namespace dilocox {

enum class Encoding : std::uint8_t { f32, f16, bf16, quantized };

struct Codec {
  Encoding encoding = Encoding::quantized;
  QuantConfig quant;  // for Encoding::quantized
  friend bool operator==(const Codec&, const Codec&) = default;
};

inline std::string to_string(const Codec& c) {
  switch (c.encoding) {
    case Encoding::f32: return "fp32";
    case Encoding::f16: return "fp16";
    case Encoding::bf16: return "bf16";
    case Encoding::quantized: return "int" + std::to_string(c.quant.bits) + "/b" + std::to_string(c.quant.block);
  }
  return "?";
}

inline PayloadHeader codec_header(const Codec& c, std::size_t n) {
  switch (c.encoding) {
    case Encoding::f32: return {PayloadKind::dense_f32, {n}, {}};
    case Encoding::f16: return {PayloadKind::dense_f16, {n}, {}};
    case Encoding::bf16: return {PayloadKind::dense_bf16, {n}, {}};
    case Encoding::quantized: return {PayloadKind::quantized, {n}, c.quant};
  }
  throw Error("codec: unknown encoding " + std::to_string(static_cast<int>(c.encoding)));
}

// Bytes of the payload that carries n floats under codec c.
inline std::size_t codec_payload_size(const Codec& c, std::size_t n) { return payload_size(codec_header(c, n), ""); }

// Encodes x into `out` (codec_payload_size bytes) as a sealed payload; `seed`
// replaces the quantizer's seed (stochastic rounding). Throws on NaN/Inf.
inline void encode(const Codec& c, std::span<const float> x, std::span<std::byte> out, std::uint64_t seed = 0) {
  PayloadHeader h = codec_header(c, x.size());
  h.quant.seed = seed;
  const std::span<std::byte> body = begin_payload(h, "", out);
  switch (c.encoding) {
    case Encoding::f32:
      if (!x.empty()) std::memcpy(body.data(), x.data(), x.size_bytes());
      break;
    case Encoding::f16:
    case Encoding::bf16:
      for (std::size_t i = 0; i < x.size(); ++i) {
        const std::uint16_t v = c.encoding == Encoding::f16 ? float_to_half(x[i]) : float_to_bf16(x[i]);
        std::memcpy(body.data() + 2 * i, &v, 2);
      }
      break;
    case Encoding::quantized: quantize(x, body, h.quant); break;
  }
  seal_payload(out.first(payload_size(h, "")));
}

// out += the values a decoded payload carries (out.size() must be its count).
inline void decode_add(const PayloadView& v, std::span<float> out) {
  const PayloadHeader& h = v.header;
  detail::require(h.shape.numel() == out.size(), "decode_add",
                  "payload carries " + std::to_string(h.shape.numel()) + " values, output has " +
                      std::to_string(out.size()));
  const std::byte* b = v.body.data();
  switch (h.kind) {
    case PayloadKind::dense_f32:
      for (std::size_t i = 0; i < out.size(); ++i) {
        float f;
        std::memcpy(&f, b + 4 * i, 4);
        out[i] += f;
      }
      return;
    case PayloadKind::dense_f16:
    case PayloadKind::dense_bf16:
      for (std::size_t i = 0; i < out.size(); ++i) {
        std::uint16_t u;
        std::memcpy(&u, b + 2 * i, 2);
        out[i] += h.kind == PayloadKind::dense_f16 ? half_to_float(u) : bf16_to_float(u);
      }
      return;
    case PayloadKind::quantized: dequantize_add(v.body, out, h.quant); return;
    case PayloadKind::sparse_tiled: decode_tiled_add(v.body, h.shape, tiled_code(h.quant, h.nnz), out); return;
    case PayloadKind::sparse_quantized: {
      thread_local std::vector<float> values;  // (nnz) decoded entries
      values.resize(h.nnz);
      dequantize(v.body.subspan(4 * std::size_t{h.nnz}), values, h.quant);
      for (std::uint32_t i = 0; i < h.nnz; ++i) {
        std::uint32_t idx;
        std::memcpy(&idx, b + 4 * std::size_t{i}, 4);
        out[idx] += values[i];  // indices were checked by read_payload
      }
      return;
    }
  }
}

// out = the mean of the payloads that an all-gather left in `gathered` (rank q's at
// bytes [q p, (q + 1) p)) over the ranks with contributes[q] != 0, added in rank order
// (the same sum on every rank); `check(q, header)` throws Error on a payload its caller
// cannot take. Returns how many ranks contributed; out is zero when none did.
template <class Check>
int decode_mean(std::span<const std::byte> gathered, std::size_t p, std::span<const std::uint8_t> contributes,
                std::span<float> out, Check&& check) {
  std::fill(out.begin(), out.end(), 0.0f);
  int contributors = 0;
  for (std::size_t q = 0; q < contributes.size(); ++q) {
    if (contributes[q] == 0) continue;
    const PayloadView v = read_payload(gathered.subspan(q * p, p));
    check(static_cast<int>(q), v.header);
    decode_add(v, out);
    ++contributors;
  }
  const float inv = contributors != 0 ? 1.0f / static_cast<float>(contributors) : 0.0f;
  for (float& v : out) v *= inv;
  return contributors;
}

// out = what the receivers decode from x under codec c (what this rank transmitted, for
// error feedback); `work` is the caller's payload workspace (grown as needed).
inline void encode_then_decode(const Codec& c, std::span<const float> x, std::span<float> out,
                               std::vector<std::byte>& work, std::uint64_t seed = 0) {
  work.resize(codec_payload_size(c, x.size()));
  encode(c, x, work, seed);
  std::fill(out.begin(), out.end(), 0.0f);
  decode_add(read_payload(work), out);
}

}  // namespace dilocox
