// write_payloads: writes dilocox wire payloads back to back, for the example tests
// (compress_tensors_cli.sh, wire_python_reader.sh), and prints what the library decodes
// from them, one tensor a line: "name dims v0 v1 ..." (%.9g: exact for a float).
//   write_payloads OUT NAME:KIND:DIMS...
// KIND: f32 f16 bf16 int8 int4 int8.bf16 int4.bf16 (block 6) sparse (int8, every 3rd
// element) tiled (SparseLoCo: tiles of up to 8 x 8, k 4). Values x_i = sin(0.7 i + 0.3) (1 + i % 3). Test helper only.
#include <dilocox/codec.hpp>
#include <dilocox/sparse_code.hpp>
#include <dilocox/wire.hpp>

#include "tensor_file.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace dx = dilocox;

// The header of a payload of `kind` and shape s (nnz set by the caller for sparse kinds).
dx::PayloadHeader header_for(const std::string& kind, const dx::Shape& s) {
  const dx::ScaleFormat scale = kind.ends_with(".bf16") ? dx::ScaleFormat::bf16 : dx::ScaleFormat::fp32;
  if (kind == "f32") return {dx::PayloadKind::dense_f32, s, {}};
  if (kind == "f16") return {dx::PayloadKind::dense_f16, s, {}};
  if (kind == "bf16") return {dx::PayloadKind::dense_bf16, s, {}};
  if (kind.starts_with("int8") || kind.starts_with("int4"))
    return {dx::PayloadKind::quantized, s, {.bits = kind[3] == '8' ? 8 : 4, .block = 6, .scale = scale}};
  if (kind == "sparse") return {dx::PayloadKind::sparse_quantized, s, {.bits = 8, .block = 6}};
  if (kind == "tiled") return dx::tiled_header(s, {.tile = 8, .k = 4});
  throw dx::Error("unknown kind '" + kind + "'");
}

// Appends one payload named `name` carrying x (x.size() == h.shape.numel()) to out.
void append_payload(dx::PayloadHeader h, const std::string& name, const std::vector<float>& x,
                    std::vector<std::byte>& out) {
  std::vector<std::uint32_t> picked;  // (nnz) sparse_quantized: flat indices; tiled: positions in each tile
  if (h.kind == dx::PayloadKind::sparse_quantized)
    for (std::uint32_t i = 0; i < x.size(); i += 3) picked.push_back(i);
  if (h.kind == dx::PayloadKind::sparse_quantized) h.nnz = static_cast<std::uint32_t>(picked.size());
  if (h.kind == dx::PayloadKind::sparse_tiled) {
    const dx::TileGrid g = dx::tile_grid(h.shape, dx::tiled_code(h.quant, h.nnz));
    for (std::size_t t = 0; t < g.tiles(); ++t)
      for (std::uint32_t p = 0; p < g.kept; ++p) picked.push_back(p);
  }
  const std::size_t at = out.size();
  out.resize(at + dx::payload_size(h, name));
  const std::span<std::byte> body = dx::begin_payload(h, name, std::span(out).subspan(at));
  switch (h.kind) {
    case dx::PayloadKind::dense_f32: std::memcpy(body.data(), x.data(), body.size()); break;
    case dx::PayloadKind::dense_f16:
    case dx::PayloadKind::dense_bf16:
      for (std::size_t i = 0; i < x.size(); ++i) {
        const std::uint16_t v =
            h.kind == dx::PayloadKind::dense_f16 ? dx::float_to_half(x[i]) : dx::float_to_bf16(x[i]);
        std::memcpy(body.data() + 2 * i, &v, 2);
      }
      break;
    case dx::PayloadKind::quantized: dx::quantize(x, body, h.quant); break;
    case dx::PayloadKind::sparse_quantized: {
      std::vector<float> values;  // (nnz) the picked elements
      for (std::uint32_t i : picked) values.push_back(x[i]);
      std::memcpy(body.data(), picked.data(), picked.size() * 4);
      dx::quantize(values, body.subspan(picked.size() * 4), h.quant);
      break;
    }
    case dx::PayloadKind::sparse_tiled: dx::encode_tiled(x, h.shape, picked, dx::tiled_code(h.quant, h.nnz), body); break;
  }
  dx::seal_payload(std::span(out).subspan(at));
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: write_payloads OUT NAME:KIND:DIMS...\n");
    return 2;
  }
  try {
    std::vector<std::byte> out;
    for (int a = 2; a < argc; ++a) {
      const std::string spec = argv[a];
      const auto c1 = spec.find(':'), c2 = spec.rfind(':');
      if (c1 == std::string::npos || c1 == c2) throw dx::Error("expected NAME:KIND:DIMS, got '" + spec + "'");
      const dx::Shape s = dx::examples::parse_shape(spec.substr(c2 + 1));
      std::vector<float> x(s.numel());  // (numel) row-major values
      for (std::size_t i = 0; i < x.size(); ++i)
        x[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i) + 0.3) * (1 + i % 3));
      append_payload(header_for(spec.substr(c1 + 1, c2 - c1 - 1), s), spec.substr(0, c1), x, out);
    }
    std::ofstream f(argv[1], std::ios::binary);
    f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
    if (!f) throw dx::Error(std::string("cannot write ") + argv[1]);
    for (std::size_t at = 0; at < out.size();) {  // what a reader must decode
      const dx::PayloadView v = dx::read_payload(std::span<const std::byte>(out).subspan(at));
      std::vector<float> y(v.header.shape.numel(), 0.0f);  // (numel) decoded values
      dx::decode_add(v, y);
      std::printf("%.*s ", static_cast<int>(v.name.size()), v.name.data());
      for (std::size_t i = 0; i < v.header.shape.ndim; ++i) std::printf("%s%zu", i ? "x" : "", v.header.shape[i]);
      for (float f32 : y) std::printf(" %.9g", static_cast<double>(f32));
      std::printf("\n");
      at += v.size;
    }
  } catch (const dx::Error& e) {
    std::fprintf(stderr, "write_payloads: %s\n", e.what());
    return 1;
  }
  return 0;
}
