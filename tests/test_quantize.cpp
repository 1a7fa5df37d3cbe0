// Int8 / int4 block quantizers against a double-precision reference: error bounds,
// exact sizes, edge magnitudes, stochastic rounding, determinism and rejected input.
#include <dilocox/quantize.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace dx = dilocox;
using ::testing::HasSubstr;

namespace {

std::vector<float> random_values(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = d(gen);
  return x;
}

std::vector<std::size_t> sweep_sizes(std::size_t block) {
  return {0, 1, 2, 31, block - 1, block + 1, 4097, 200003};
}

struct Encoded {
  std::vector<std::byte> bytes;
  std::vector<float> decoded;
};

Encoded round_trip(const std::vector<float>& x, const dx::QuantConfig& c) {
  Encoded e{std::vector<std::byte>(dx::encoded_size(x.size(), c)), std::vector<float>(x.size())};
  dx::quantize(x, e.bytes, c);
  dx::dequantize(e.bytes, e.decoded, c);
  return e;
}

float stored_scale(const Encoded& e, std::size_t block_index, const dx::QuantConfig& c) {
  return dx::detail::load_scale(e.bytes.data() + block_index * dx::scale_bytes(c.scale), c.scale);
}

// Every element within `steps` quantization steps of its block's stored scale, and
// the stored scale close to absmax / qmax computed in double.
void expect_within_steps(const std::vector<float>& x, const Encoded& e, const dx::QuantConfig& c, double steps) {
  const double qmax = dx::quant_max(c.bits);
  for (std::size_t b = 0; b * c.block < x.size(); ++b) {
    const std::size_t lo = b * c.block, hi = std::min(x.size(), lo + c.block);
    double absmax = 0;
    for (std::size_t i = lo; i < hi; ++i) absmax = std::max(absmax, std::fabs(static_cast<double>(x[i])));
    const double ref = absmax / qmax, s = stored_scale(e, b, c);
    const double rel = c.scale == dx::ScaleFormat::bf16 ? 1.0 / 128 : 1e-6;
    ASSERT_GE(s, ref * (1 - rel)) << "block " << b;
    ASSERT_LE(s, ref * (1 + rel) + 1e-45) << "block " << b;
    for (std::size_t i = lo; i < hi; ++i) {
      const double err = std::fabs(static_cast<double>(x[i]) - static_cast<double>(e.decoded[i]));
      // float rounding of x * (1/s) and of q * s adds a few ulps of |x| at exact ties
      const double slack = 4 * std::numeric_limits<float>::epsilon() * (std::fabs(x[i]) + s) + 1e-45;
      ASSERT_LE(err, steps * s + slack) << "element " << i << " x=" << x[i] << " got " << e.decoded[i];
    }
  }
}

dx::QuantConfig config(int bits, std::size_t block, dx::ScaleFormat f = dx::ScaleFormat::fp32,
                       dx::Rounding r = dx::Rounding::nearest, std::uint64_t seed = 0) {
  return {.bits = bits, .block = block, .rounding = r, .seed = seed, .scale = f};
}

}  // namespace

class Quantizer : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(Bits, Quantizer, ::testing::Values(4, 8), [](const auto& info) {
  return "Int" + std::to_string(info.param);
});

TEST_P(Quantizer, RoundTripErrorWithinHalfStep) {
  for (std::size_t block : {32, 128, 256})
    for (auto f : {dx::ScaleFormat::fp32, dx::ScaleFormat::bf16})
      for (std::size_t n : sweep_sizes(block)) {
        SCOPED_TRACE("n=" + std::to_string(n) + " block=" + std::to_string(block) +
                     " bf16=" + std::to_string(f == dx::ScaleFormat::bf16));
        const auto c = config(GetParam(), block, f);
        const auto x = random_values(n, static_cast<std::uint32_t>(n + block));
        expect_within_steps(x, round_trip(x, c), c, 0.5);
      }
}

TEST_P(Quantizer, NearestMatchesDoubleReferenceCodes) {
  const auto c = config(GetParam(), 128);
  const auto x = random_values(4097, 3);
  const auto e = round_trip(x, c);
  const double qmax = dx::quant_max(c.bits);
  std::size_t off_by_one = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double s = stored_scale(e, i / c.block, c);
    const double q = std::nearbyint(std::clamp(static_cast<double>(x[i]) / s, -qmax, qmax));
    const double got = std::nearbyint(static_cast<double>(e.decoded[i]) / s);
    ASSERT_LE(std::fabs(got - q), 1.0) << i;
    off_by_one += got != q;  // only at ties, where 1/s rounding may decide
  }
  EXPECT_LE(off_by_one, 2u);
}

TEST_P(Quantizer, EncodedSizeIsExactAndNothingPastItIsWritten) {
  for (std::size_t n : sweep_sizes(128)) {
    SCOPED_TRACE(n);
    for (auto f : {dx::ScaleFormat::fp32, dx::ScaleFormat::bf16}) {
      const auto c = config(GetParam(), 128, f);
      const std::size_t blocks = (n + 127) / 128;
      const std::size_t codes = GetParam() == 8 ? n : (n + 1) / 2;
      const std::size_t want = blocks * (f == dx::ScaleFormat::fp32 ? 4 : 2) + codes;
      ASSERT_EQ(dx::encoded_size(n, c), want);
      std::vector<std::byte> out(want + 16, std::byte{0xAB});
      const auto x = random_values(n, 11);
      dx::quantize(x, out, c);
      for (std::size_t i = want; i < out.size(); ++i) ASSERT_EQ(out[i], std::byte{0xAB});
      if (want > 0) {
        std::vector<std::byte> short_out(want - 1);
        EXPECT_THROW(dx::quantize(x, short_out, c), dx::Error);
      }
    }
  }
}

TEST_P(Quantizer, AllZeroBlocksDecodeToZeroWithoutNaN) {
  const auto c = config(GetParam(), 64);
  std::vector<float> x(300, 0.0f);
  for (std::size_t i = 128; i < 192; ++i) x[i] = 1.0f;  // one non-zero block among zero ones
  const auto e = round_trip(x, c);
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(std::isfinite(e.decoded[i]));
    ASSERT_EQ(e.decoded[i], x[i]) << i;
  }
}

TEST_P(Quantizer, ExtremeMagnitudesStayWithinHalfStep) {
  for (float mag : {1e30f, 1e-30f, 3e38f}) {
    for (auto f : {dx::ScaleFormat::fp32, dx::ScaleFormat::bf16}) {
      SCOPED_TRACE(mag);
      auto x = random_values(1000, 5, 0.25f);
      for (auto& v : x) v = std::clamp(v, -1.0f, 1.0f) * mag;
      const auto c = config(GetParam(), 128, f);
      expect_within_steps(x, round_trip(x, c), c, 0.5);
    }
  }
}

TEST_P(Quantizer, SubnormalInputsStayFiniteAndClose) {
  auto x = random_values(512, 8);
  for (auto& v : x) v *= 1e-40f;  // subnormal floats
  const auto c = config(GetParam(), 128);
  const auto e = round_trip(x, c);
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(std::isfinite(e.decoded[i]));
    ASSERT_LE(std::fabs(e.decoded[i] - x[i]), 4e-40f / dx::quant_max(c.bits) + 1e-44f) << i;
  }
}

TEST_P(Quantizer, StochasticRoundingIsUnbiasedAndWithinOneStep) {
  const std::size_t n = 256, draws = 4000;
  const auto x = random_values(n, 21);
  std::vector<double> mean(n, 0.0);
  dx::QuantConfig c = config(GetParam(), 64, dx::ScaleFormat::fp32, dx::Rounding::stochastic);
  Encoded e;
  for (std::size_t d = 0; d < draws; ++d) {
    c.seed = 1000 + d;
    e = round_trip(x, c);
    for (std::size_t i = 0; i < n; ++i) mean[i] += e.decoded[i];
  }
  expect_within_steps(x, e, c, 1.0);
  for (std::size_t i = 0; i < n; ++i) {
    const double s = stored_scale(e, i / c.block, c);
    // Var of one draw <= s^2 / 4, so the mean's standard error is <= s / (2 sqrt(draws)).
    ASSERT_NEAR(mean[i] / draws, x[i], 5 * s / (2 * std::sqrt(double(draws)))) << i;
  }
}

TEST_P(Quantizer, StochasticRoundingIsDeterministicPerSeed) {
  const auto x = random_values(4097, 4);
  auto c = config(GetParam(), 128, dx::ScaleFormat::fp32, dx::Rounding::stochastic, 42);
  const auto a = round_trip(x, c), b = round_trip(x, c);
  EXPECT_EQ(a.bytes, b.bytes);
  c.seed = 43;
  EXPECT_NE(round_trip(x, c).bytes, a.bytes);
}

TEST_P(Quantizer, DequantizeAddAccumulates) {
  const auto c = config(GetParam(), 128);
  const auto x = random_values(1000, 6);
  const auto e = round_trip(x, c);
  std::vector<float> acc(x.size(), 1.0f);
  dx::dequantize_add(e.bytes, acc, c);
  // The compiler may fuse q * scale + acc into one FMA: one rounding of the operands'
  // size apart from 1 + decoded.
  const float eps = std::numeric_limits<float>::epsilon();
  for (std::size_t i = 0; i < x.size(); ++i)
    ASSERT_NEAR(acc[i], 1.0f + e.decoded[i], eps * (1.0f + std::fabs(e.decoded[i]))) << i;
}

TEST_P(Quantizer, NonFiniteInputThrowsNamingTheElement) {
  const auto c = config(GetParam(), 128);
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    auto x = random_values(300, 1);
    x[217] = bad;
    std::vector<std::byte> out(dx::encoded_size(x.size(), c));
    try {
      dx::quantize(x, out, c);
      FAIL() << "no throw for " << bad;
    } catch (const dx::Error& err) {
      EXPECT_THAT(err.what(), HasSubstr("element 217"));
      EXPECT_THAT(err.what(), HasSubstr(std::isnan(bad) ? "NaN" : "Inf"));
    }
  }
}

TEST(QuantConfig, BadConfigsThrowNamingTheField) {
  auto msg = [](dx::QuantConfig c) {
    try {
      (void)dx::encoded_size(10, c);
    } catch (const dx::Error& e) {
      return std::string(e.what());
    }
    return std::string("no throw");
  };
  EXPECT_THAT(msg({.bits = 3}), HasSubstr("bits"));
  EXPECT_THAT(msg({.bits = 8, .block = 0}), HasSubstr("block"));
  EXPECT_THAT(msg({.bits = 4, .block = 33}), HasSubstr("even"));
  EXPECT_THAT(msg({.bits = 8, .block = std::size_t{1} << 30}), HasSubstr("block"));
  EXPECT_THAT(msg({.rounding = static_cast<dx::Rounding>(7)}), HasSubstr("rounding"));
  EXPECT_THAT(msg({.scale = static_cast<dx::ScaleFormat>(9)}), HasSubstr("scale"));
  EXPECT_EQ(msg({.bits = 8, .block = 33}), "no throw");
}

TEST(QuantConfig, ShortInputToDequantizeThrows) {
  const dx::QuantConfig c{.bits = 8, .block = 16};
  std::vector<std::byte> in(dx::encoded_size(100, c) - 1);
  std::vector<float> out(100);
  EXPECT_THROW(dx::dequantize(in, out, c), dx::Error);
  EXPECT_THROW(dx::dequantize_add(in, out, c), dx::Error);
}
