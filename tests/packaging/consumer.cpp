// A user's program: compresses one matrix through the umbrella header and checks the
// round trip. Built by the packaging tests against an installed dilocox and through
// add_subdirectory; exits non-zero when anything is off.
#include <dilocox/dilocox.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  std::vector<float> x(64 * 32);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.1f * static_cast<float>(i));
  dilocox::QuantConfig cfg{.bits = 8, .block = 64};
  std::vector<std::byte> enc(dilocox::encoded_size(x.size(), cfg));
  dilocox::quantize(x, enc, cfg);
  std::vector<float> y(x.size());
  dilocox::dequantize(enc, y, cfg);
  float worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::fmax(worst, std::fabs(x[i] - y[i]));
  dilocox::PowerIterationProjector proj(64, 32, {.rank = 2});
  std::vector<float> out(x.size());
  proj.approximate({x.data(), 64, 32}, {out.data(), 64, 32});
  std::printf("dilocox %d.%d.%d consumer: int8 max error %.3g\n", DILOCOX_VERSION_MAJOR, DILOCOX_VERSION_MINOR,
              DILOCOX_VERSION_PATCH, static_cast<double>(worst));
  return worst <= 0.5f / 127.0f + 1e-6f ? 0 : 1;
}
