// libFuzzer target for the wire decoder: any byte string is either rejected with
// dilocox::Error or decodes to a payload whose body dequantizes cleanly. The first
// call also feeds a valid payload so that mutations start from real structure.
#include <dilocox/wire.hpp>

#include <cstdlib>
#include <vector>

namespace dx = dilocox;

static void decode(std::span<const std::byte> in) {
  try {
    const auto v = dx::read_payload(in);
    if (v.size > in.size() || v.body.size() > in.size()) std::abort();
    if (v.header.kind == dx::PayloadKind::quantized && v.header.shape.numel() <= (1u << 20)) {
      std::vector<float> out(v.header.shape.numel());
      dx::dequantize(v.body, out, v.header.quant);
    }
  } catch (const dx::Error&) {
  }
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool seeded = [] {
    const dx::PayloadHeader h{dx::PayloadKind::quantized, {8, 4}, {.bits = 4, .block = 8}};
    std::vector<float> x(32, 0.5f);
    std::vector<std::byte> p(dx::payload_size(h, "w"));
    dx::quantize(x, dx::begin_payload(h, "w", p), h.quant);
    dx::seal_payload(p);
    decode(p);
    return true;
  }();
  (void)seeded;
  decode({reinterpret_cast<const std::byte*>(data), size});
  return 0;
}
