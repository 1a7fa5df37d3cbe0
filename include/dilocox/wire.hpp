// dilocox/wire.hpp: the versioned, checksummed format of one tensor payload on the
// wire. Layout (little-endian), 96-byte header then name, body, checksum:
//   0 magic "DLCX" | 4 u16 version | 6 u16 kind | 8 u8 ndim | 9 u8 bits | 10 u8 rounding
//   11 u8 scale format | 12 u32 block | 16 u64 seed | 24 u64 dims[6] | 72 u64 count
//   80 u16 name length | 82 u16 zero | 84 u32 nnz (sparse: entries; tiled: per tile)
//   88 u64 body length | 96 name | body | u64 checksum
// Every field, byte by byte, with each kind's body: docs/WIRE.md.
// The checksum (checksum.hpp) covers every byte before it. Needs only the standard
// library and quantize.hpp's config; does not compress (the body is given).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "dilocox/checksum.hpp"
#include "dilocox/config.hpp"
#include "dilocox/quantize.hpp"
#include "dilocox/sparse_code.hpp"
#include "dilocox/tensor.hpp"

namespace dilocox {

inline constexpr std::uint16_t wire_version = 1;
inline constexpr std::size_t wire_header_bytes = 96;
inline constexpr std::size_t wire_checksum_bytes = 8;
inline constexpr std::size_t wire_max_name = 1024;

enum class PayloadKind : std::uint16_t {
  dense_f32 = 1,         // body: count floats
  quantized = 2,         // body: quantize() output for count floats under `quant`
  dense_f16 = 3,         // body: count IEEE binary16 values
  dense_bf16 = 4,        // body: count bfloat16 values
  sparse_quantized = 5,  // body: nnz u32 indices (< count), then quantize() of nnz values
  // 6 is retired (a flat chunked top-k code); a reader refuses it as unknown.
  sparse_tiled = 7,      // body: encode_tiled() of the tensor `shape`, tile side = quant.block, k = nnz, bits 2
};
inline constexpr std::uint16_t max_payload_kind = 7;

inline bool uses_quant(PayloadKind k) { return k == PayloadKind::quantized || k == PayloadKind::sparse_quantized; }

// The tiled code a sparse_tiled header describes (range_sigmas only shapes encoding).
inline TiledCode tiled_code(const QuantConfig& q, std::uint32_t nnz) { return {q.block, nnz}; }

struct PayloadHeader {
  PayloadKind kind = PayloadKind::dense_f32;
  Shape shape;             // count = shape.numel()
  QuantConfig quant;       // for quantized and sparse payloads
  std::uint32_t nnz = 0;   // for sparse payloads: entries carried
};

// Body bytes a payload of this header carries.
inline std::size_t body_size(const PayloadHeader& h) {
  switch (h.kind) {
    case PayloadKind::dense_f32: return h.shape.numel() * sizeof(float);
    case PayloadKind::quantized: return encoded_size(h.shape.numel(), h.quant);
    case PayloadKind::dense_f16:
    case PayloadKind::dense_bf16: return h.shape.numel() * 2;
    case PayloadKind::sparse_quantized: return std::size_t{h.nnz} * 4 + encoded_size(h.nnz, h.quant);
    case PayloadKind::sparse_tiled: return tiled_encoded_size(h.shape, tiled_code(h.quant, h.nnz));
  }
  throw Error("wire: unknown payload kind " + std::to_string(static_cast<int>(h.kind)));
}

// The header of a tensor of `shape` under the tiled code c.
inline PayloadHeader tiled_header(const Shape& shape, const TiledCode& c) {
  PayloadHeader h{PayloadKind::sparse_tiled, shape, {}, c.k};
  h.quant.bits = 2;
  h.quant.block = c.tile;
  return h;
}

// Total bytes of a payload with this header and name.
inline std::size_t payload_size(const PayloadHeader& h, std::string_view name) {
  return wire_header_bytes + name.size() + body_size(h) + wire_checksum_bytes;
}

namespace detail {
template <class T>
void put(std::byte* base, std::size_t off, T v) {
  std::memcpy(base + off, &v, sizeof v);
}
template <class T>
T get(const std::byte* base, std::size_t off) {
  T v;
  std::memcpy(&v, base + off, sizeof v);
  return v;
}
}  // namespace detail

// Writes header and name into `out` (at least payload_size bytes) and returns the
// body, for the caller to fill (quantize straight into it); then call seal_payload.
inline std::span<std::byte> begin_payload(const PayloadHeader& h, std::string_view name, std::span<std::byte> out) {
  using detail::put;
  detail::require(name.size() <= wire_max_name, "begin_payload",
                  "name longer than " + std::to_string(wire_max_name) + " bytes");
  detail::require(h.shape.ndim <= max_ndim, "begin_payload", "shape has too many dimensions");
  if (uses_quant(h.kind)) validate(h.quant);
  if (h.kind == PayloadKind::sparse_tiled) {
    validate(tiled_code(h.quant, h.nnz));
    detail::require(h.quant.bits == 2 && h.quant.rounding == Rounding::nearest && h.quant.seed == 0 &&
                        h.quant.scale == ScaleFormat::fp32,
                    "begin_payload", "a tiled sparse payload has bits 2, nearest rounding, seed 0 and fp32 scales");
  } else {
    detail::require(h.kind == PayloadKind::sparse_quantized ? h.nnz <= h.shape.numel() : h.nnz == 0, "begin_payload",
                    "nnz " + std::to_string(h.nnz) + " does not fit the kind and shape");
  }
  const std::size_t body = body_size(h), total = payload_size(h, name);
  detail::require(out.size() >= total, "begin_payload",
                  "output holds " + std::to_string(out.size()) + " bytes, needs " + std::to_string(total));
  std::byte* b = out.data();
  std::memset(b, 0, wire_header_bytes);
  std::memcpy(b, "DLCX", 4);
  put<std::uint16_t>(b, 4, wire_version);
  put<std::uint16_t>(b, 6, static_cast<std::uint16_t>(h.kind));
  put<std::uint8_t>(b, 8, static_cast<std::uint8_t>(h.shape.ndim));
  if (uses_quant(h.kind) || h.kind == PayloadKind::sparse_tiled) {
    put<std::uint8_t>(b, 9, static_cast<std::uint8_t>(h.quant.bits));
    put<std::uint8_t>(b, 10, static_cast<std::uint8_t>(h.quant.rounding));
    put<std::uint8_t>(b, 11, static_cast<std::uint8_t>(h.quant.scale));
    put<std::uint32_t>(b, 12, static_cast<std::uint32_t>(h.quant.block));
    put<std::uint64_t>(b, 16, h.quant.seed);
  }
  for (std::size_t i = 0; i < h.shape.ndim; ++i) put<std::uint64_t>(b, 24 + 8 * i, h.shape.dims[i]);
  put<std::uint64_t>(b, 72, h.shape.numel());
  put<std::uint16_t>(b, 80, static_cast<std::uint16_t>(name.size()));
  put<std::uint32_t>(b, 84, h.nnz);
  put<std::uint64_t>(b, 88, body);
  if (!name.empty()) std::memcpy(b + wire_header_bytes, name.data(), name.size());
  return out.subspan(wire_header_bytes + name.size(), body);
}

// Computes and stores the checksum of a payload begun with begin_payload.
inline void seal_payload(std::span<std::byte> payload) {
  detail::require(payload.size() >= wire_header_bytes + wire_checksum_bytes, "seal_payload", "buffer too short");
  const std::size_t n = wire_header_bytes + detail::get<std::uint16_t>(payload.data(), 80) +
                        detail::get<std::uint64_t>(payload.data(), 88);
  detail::require(payload.size() >= n + wire_checksum_bytes, "seal_payload", "buffer shorter than the payload");
  detail::put<std::uint64_t>(payload.data(), n, checksum64(payload.first(n)));
}

// begin_payload + copy of `body` + seal_payload. Returns the bytes written.
inline std::size_t write_payload(const PayloadHeader& h, std::string_view name, std::span<const std::byte> body,
                                 std::span<std::byte> out) {
  std::span<std::byte> dst = begin_payload(h, name, out);
  detail::require(body.size() == dst.size(), "write_payload",
                  "body has " + std::to_string(body.size()) + " bytes, header says " + std::to_string(dst.size()));
  if (!body.empty()) std::memcpy(dst.data(), body.data(), body.size());
  const std::size_t total = payload_size(h, name);
  seal_payload(out.first(total));
  return total;
}

struct PayloadView {
  PayloadHeader header;
  std::string_view name;
  std::span<const std::byte> body;
  std::size_t size = 0;  // bytes of `in` this payload occupies, checksum included
};

// Decodes the payload at the start of `in` (more may follow). Throws Error when it
// is truncated, corrupted, of another version, or inconsistent.
inline PayloadView read_payload(std::span<const std::byte> in) {
  using detail::get;
  auto fail = [](const std::string& what) { throw Error("read_payload: " + what); };
  if (in.size() < wire_header_bytes + wire_checksum_bytes)
    fail("truncated: " + std::to_string(in.size()) + " bytes, a header alone is " + std::to_string(wire_header_bytes));
  const std::byte* b = in.data();
  if (std::memcmp(b, "DLCX", 4) != 0) fail("bad magic (not a dilocox payload)");
  const auto version = get<std::uint16_t>(b, 4);
  if (version != wire_version)
    fail("version " + std::to_string(version) + ", this build reads version " + std::to_string(wire_version));
  const auto name_len = get<std::uint16_t>(b, 80);
  const auto body_len = get<std::uint64_t>(b, 88);
  if (name_len > wire_max_name) fail("name length " + std::to_string(name_len) + " too long");
  if (in.size() < wire_header_bytes + wire_checksum_bytes + name_len) fail("truncated inside the name");
  const std::size_t room = in.size() - wire_header_bytes - wire_checksum_bytes - name_len;
  if (body_len > room)
    fail("truncated: header announces " + std::to_string(body_len) + " body bytes, " +
         std::to_string(in.size()) + " bytes given");
  const std::size_t end = wire_header_bytes + name_len + body_len;
  if (get<std::uint64_t>(b, end) != checksum64(in.first(end))) fail("checksum mismatch (corrupted payload)");

  PayloadView v;
  const auto kind = get<std::uint16_t>(b, 6);
  if (kind < 1 || kind > max_payload_kind || kind == 6) fail("unknown kind " + std::to_string(kind));
  v.header.kind = static_cast<PayloadKind>(kind);
  const auto ndim = get<std::uint8_t>(b, 8);
  if (ndim > max_ndim) fail("ndim " + std::to_string(ndim) + " > " + std::to_string(max_ndim));
  v.header.shape.ndim = ndim;
  std::uint64_t count = 1;
  for (std::size_t i = 0; i < max_ndim; ++i) {
    const auto d = get<std::uint64_t>(b, 24 + 8 * i);
    if (i >= ndim) {
      if (d != 0) fail("dimension " + std::to_string(i) + " set beyond ndim");
      continue;
    }
    if (d != 0 && count > std::numeric_limits<std::uint64_t>::max() / d) fail("shape overflows");
    count *= d;
    v.header.shape.dims[i] = d;
  }
  if (count != get<std::uint64_t>(b, 72)) fail("count does not match the shape " + v.header.shape.str());
  if (get<std::uint16_t>(b, 82) != 0) fail("reserved header bytes are not zero");
  v.header.nnz = get<std::uint32_t>(b, 84);
  const bool tiled = v.header.kind == PayloadKind::sparse_tiled;
  if (!tiled && (v.header.kind == PayloadKind::sparse_quantized ? v.header.nnz > count : v.header.nnz != 0))
    fail("nnz " + std::to_string(v.header.nnz) + " does not fit the kind and count");
  if (tiled) {
    v.header.quant.bits = get<std::uint8_t>(b, 9);
    v.header.quant.rounding = static_cast<Rounding>(get<std::uint8_t>(b, 10));
    v.header.quant.scale = static_cast<ScaleFormat>(get<std::uint8_t>(b, 11));
    v.header.quant.block = get<std::uint32_t>(b, 12);
    v.header.quant.seed = get<std::uint64_t>(b, 16);
    if (v.header.quant.bits != 2 || v.header.quant.rounding != Rounding::nearest || v.header.quant.seed != 0 ||
        v.header.quant.scale != ScaleFormat::fp32)
      fail("a tiled sparse payload has bits 2, nearest rounding, seed 0 and fp32 scales");
    try {
      validate(tiled_code(v.header.quant, v.header.nnz));
    } catch (const Error& e) {
      fail(e.what());
    }
    // At least one entry is kept per 4096 elements: bound the count by the body before sizing it.
    if (count / (max_sparse_tile * max_sparse_tile) > body_len)
      fail("body of " + std::to_string(body_len) + " bytes is too short for " + std::to_string(count) + " elements");
  } else if (uses_quant(v.header.kind)) {
    v.header.quant.bits = get<std::uint8_t>(b, 9);
    v.header.quant.rounding = static_cast<Rounding>(get<std::uint8_t>(b, 10));
    v.header.quant.scale = static_cast<ScaleFormat>(get<std::uint8_t>(b, 11));
    v.header.quant.block = get<std::uint32_t>(b, 12);
    v.header.quant.seed = get<std::uint64_t>(b, 16);
    try {
      validate(v.header.quant);
    } catch (const Error& e) {
      fail(e.what());
    }
  } else {
    for (std::size_t i = 9; i < 24; ++i)
      if (b[i] != std::byte{0}) fail("dense payload with quantization fields set");
  }
  // body_size of a huge count may overflow: compare in the direction that cannot.
  std::uint64_t elem_bound = body_len * 2 + 2;  // quantized: at least half a byte per element
  if (v.header.kind == PayloadKind::dense_f32) elem_bound = body_len / 4;
  if (v.header.kind == PayloadKind::dense_f16 || v.header.kind == PayloadKind::dense_bf16) elem_bound = body_len / 2;
  if (v.header.kind == PayloadKind::sparse_quantized || tiled) elem_bound = count;  // bounded by nnz, tiles
  if (count > elem_bound) fail("body of " + std::to_string(body_len) + " bytes is too short for " + std::to_string(count) + " elements");
  if (body_size(v.header) != body_len)
    fail("body of " + std::to_string(body_len) + " bytes, expected " + std::to_string(body_size(v.header)));
  v.name = std::string_view(reinterpret_cast<const char*>(b + wire_header_bytes), name_len);
  v.body = in.subspan(wire_header_bytes + name_len, body_len);
  if (v.header.kind == PayloadKind::sparse_quantized) {
    for (std::uint32_t i = 0; i < v.header.nnz; ++i)
      if (get<std::uint32_t>(v.body.data(), 4 * std::size_t{i}) >= count)
        fail("sparse index " + std::to_string(i) + " outside the tensor");
  }
  if (tiled) {
    try {
      check_tiled(v.body, v.header.shape, tiled_code(v.header.quant, v.header.nnz));
    } catch (const Error& e) {
      fail(e.what());
    }
  }
  v.size = end + wire_checksum_bytes;
  return v;
}

}  // namespace dilocox
