// Int8 / int4 block quantizers against a double-precision reference: error bounds,
// exact sizes, edge magnitudes, stochastic rounding, determinism and rejected input,
// on every kernel this CPU runs; and the AVX2 kernels against the portable reference,
// byte for byte, with the run-time choice between them.
#include <dilocox/quantize.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <tuple>
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

using Kernel = dx::detail::QuantKernel;

// Runs the calls in its scope on kernel `k`, then restores the previous one.
class KernelScope {
 public:
  explicit KernelScope(Kernel k) : previous_(dx::detail::quant_kernel()) { dx::detail::set_quant_kernel(k); }
  ~KernelScope() { dx::detail::set_quant_kernel(previous_); }
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  Kernel previous_;
};

}  // namespace

// Every test below runs once per kernel (the avx2 instances skip on CPUs without AVX2).
class Quantizer : public ::testing::TestWithParam<std::tuple<int, Kernel>> {
 protected:
  void SetUp() override {
    if (kernel() == Kernel::avx2 && !dx::detail::cpu_has_avx2()) GTEST_SKIP() << "no AVX2 kernel on this CPU/build";
    scope_.emplace(kernel());
  }
  void TearDown() override { scope_.reset(); }
  static int bits() { return std::get<0>(GetParam()); }
  static Kernel kernel() { return std::get<1>(GetParam()); }

 private:
  std::optional<KernelScope> scope_;
};
INSTANTIATE_TEST_SUITE_P(Bits, Quantizer,
                         ::testing::Combine(::testing::Values(4, 8), ::testing::Values(Kernel::portable, Kernel::avx2)),
                         [](const auto& info) {
                           return "Int" + std::to_string(std::get<0>(info.param)) + "_" +
                                  dx::detail::quant_kernel_name(std::get<1>(info.param));
                         });

TEST_P(Quantizer, RoundTripErrorWithinHalfStep) {
  for (std::size_t block : {32, 128, 256})
    for (auto f : {dx::ScaleFormat::fp32, dx::ScaleFormat::bf16})
      for (std::size_t n : sweep_sizes(block)) {
        SCOPED_TRACE("n=" + std::to_string(n) + " block=" + std::to_string(block) +
                     " bf16=" + std::to_string(f == dx::ScaleFormat::bf16));
        const auto c = config(bits(), block, f);
        const auto x = random_values(n, static_cast<std::uint32_t>(n + block));
        expect_within_steps(x, round_trip(x, c), c, 0.5);
      }
}

TEST_P(Quantizer, NearestMatchesDoubleReferenceCodes) {
  const auto c = config(bits(), 128);
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
      const auto c = config(bits(), 128, f);
      const std::size_t blocks = (n + 127) / 128;
      const std::size_t codes = bits() == 8 ? n : (n + 1) / 2;
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
  const auto c = config(bits(), 64);
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
      const auto c = config(bits(), 128, f);
      expect_within_steps(x, round_trip(x, c), c, 0.5);
    }
  }
}

TEST_P(Quantizer, SubnormalInputsStayFiniteAndClose) {
  auto x = random_values(512, 8);
  for (auto& v : x) v *= 1e-40f;  // subnormal floats
  const auto c = config(bits(), 128);
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
  dx::QuantConfig c = config(bits(), 64, dx::ScaleFormat::fp32, dx::Rounding::stochastic);
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
  auto c = config(bits(), 128, dx::ScaleFormat::fp32, dx::Rounding::stochastic, 42);
  const auto a = round_trip(x, c), b = round_trip(x, c);
  EXPECT_EQ(a.bytes, b.bytes);
  c.seed = 43;
  EXPECT_NE(round_trip(x, c).bytes, a.bytes);
}

TEST_P(Quantizer, DequantizeAddAccumulates) {
  const auto c = config(bits(), 128);
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
  const auto c = config(bits(), 128);
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

// --- the AVX2 kernels against the portable reference, byte for byte ----------------

namespace {

// Blocks that reach every branch of the kernels: ordinary values, all-zero blocks,
// subnormal scales (those blocks divide), near-overflow magnitudes, blocks whose
// elements all sit at +-qmax (codes at the ends of the range, where stochastic
// rounding is most delicate), and exact ties (scale a power of two, x / scale = k + 1/2).
std::vector<float> mixed_values(std::size_t n, std::size_t block, int bits, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int qmax = dx::quant_max(bits);
  std::vector<float> x(n);
  for (std::size_t lo = 0; lo < n; lo += block) {
    const unsigned kind = gen() % 6;
    for (std::size_t i = lo; i < std::min(n, lo + block); ++i) {
      const float v = normal(gen), sign = (gen() & 1) ? 1.0f : -1.0f;
      const int k = static_cast<int>(gen() % static_cast<unsigned>(2 * qmax)) - qmax;  // [-qmax, qmax)
      switch (kind) {
        case 1: x[i] = sign * 0.0f; break;
        case 2: x[i] = v * 1e-39f; break;
        case 3: x[i] = std::clamp(v, -1.0f, 1.0f) * 3e38f; break;
        case 4: x[i] = sign * static_cast<float>(qmax); break;
        case 5: x[i] = i == lo ? 0.25f * static_cast<float>(qmax) : 0.25f * (static_cast<float>(k) + 0.5f); break;
        default: x[i] = v;
      }
    }
  }
  return x;
}

// Code of element i of an n-element encoding, read straight from the layout.
int code_at(const std::vector<std::byte>& e, std::size_t n, std::size_t i, const dx::QuantConfig& c) {
  const std::size_t first_code = dx::num_blocks(n, c.block) * dx::scale_bytes(c.scale);
  const auto* codes = reinterpret_cast<const std::uint8_t*>(e.data() + first_code);
  if (c.bits == 8) return static_cast<std::int8_t>(codes[i]);
  return ((i % 2) ? codes[i / 2] >> 4 : codes[i / 2] & 0xf) - 8;
}

struct KernelRun {
  std::vector<std::byte> bytes;  // encoded_size bytes (copied out of an offset buffer)
  std::vector<float> decoded;    // dequantize
  std::vector<float> summed;     // acc + decoded by dequantize_add
};

// quantize / dequantize / dequantize_add on kernel `k`, with the input `in_offset`
// floats and the encoding `out_offset` bytes into their buffers (unaligned pointers).
KernelRun run_kernel(Kernel k, const std::vector<float>& x, const std::vector<float>& acc, const dx::QuantConfig& c,
                     std::size_t in_offset, std::size_t out_offset) {
  KernelScope scope(k);
  const std::size_t n = x.size(), size = dx::encoded_size(n, c);
  std::vector<float> in(n + in_offset);
  std::copy(x.begin(), x.end(), in.begin() + static_cast<std::ptrdiff_t>(in_offset));
  std::vector<std::byte> enc(size + out_offset);
  const std::span<std::byte> body(enc.data() + out_offset, size);
  dx::quantize(std::span<const float>(in.data() + in_offset, n), body, c);
  KernelRun r{std::vector<std::byte>(body.begin(), body.end()), std::vector<float>(n), acc};
  dx::dequantize(body, std::span<float>(r.decoded), c);
  dx::dequantize_add(body, std::span<float>(r.summed), c);
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

class KernelsAgree : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!dx::detail::cpu_has_avx2()) GTEST_SKIP() << "no AVX2 kernel on this CPU/build";
  }
};
INSTANTIATE_TEST_SUITE_P(Bits, KernelsAgree, ::testing::Values(4, 8),
                         [](const auto& info) { return "Int" + std::to_string(info.param); });

TEST_P(KernelsAgree, SameBytesAndValuesOverSizesBlocksModesAndAlignments) {
  const int bits = GetParam();
  const std::vector<std::size_t> blocks =
      bits == 8 ? std::vector<std::size_t>{1, 7, 32, 33, 64, 128, 250, 256, 1000}
                : std::vector<std::size_t>{2, 6, 32, 34, 64, 128, 250, 256, 1000};
  std::mt19937 pick(2024);
  const std::size_t large = 100000 + pick() % 300000;
  const std::vector<std::pair<std::size_t, std::size_t>> offsets{{0, 0}, {1, 1}, {3, 0}};  // (floats in, bytes out)
  for (std::size_t block : blocks) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{31}, block - 1, block + 1,
                          std::size_t{4097}, large}) {
      const auto x = mixed_values(n, block, bits, static_cast<std::uint32_t>(n * 31 + block));
      const auto acc = random_values(n, static_cast<std::uint32_t>(n + 5));
      for (auto r : {dx::Rounding::nearest, dx::Rounding::stochastic})
        for (auto f : {dx::ScaleFormat::fp32, dx::ScaleFormat::bf16})
          for (auto [in_off, out_off] : offsets) {
            SCOPED_TRACE("n=" + std::to_string(n) + " block=" + std::to_string(block) +
                         " stochastic=" + std::to_string(r == dx::Rounding::stochastic) +
                         " bf16=" + std::to_string(f == dx::ScaleFormat::bf16) + " offsets=" + std::to_string(in_off) +
                         "," + std::to_string(out_off));
            const auto c = config(bits, block, f, r, 77 + n);
            const KernelRun want = run_kernel(Kernel::portable, x, acc, c, in_off, out_off);
            const KernelRun got = run_kernel(Kernel::avx2, x, acc, c, in_off, out_off);
            ASSERT_EQ(got.bytes, want.bytes);
            ASSERT_TRUE(same_bits(got.decoded, want.decoded));
            // dequantize_add on avx2: one rounding of q * scale + acc, element by element.
            for (std::size_t i = 0; i < n; ++i) {
              const float s = dx::detail::load_scale(want.bytes.data() + (i / block) * dx::scale_bytes(f), f);
              const float q = static_cast<float>(code_at(want.bytes, n, i, c));
              const float fused = std::fma(q, s, acc[i]);
              ASSERT_EQ(std::bit_cast<std::uint32_t>(got.summed[i]), std::bit_cast<std::uint32_t>(fused)) << i;
              ASSERT_EQ(std::bit_cast<std::uint32_t>(want.decoded[i]), std::bit_cast<std::uint32_t>(q * s)) << i;
            }
          }
    }
  }
}

// Stochastic rounding next to qmax, where the float rounding of v + u decides. With x
// at the absmax and scale 1 (v = qmax), v + u rounds up to qmax + 1 when u is within
// half an ulp of 1; where x * (1 / scale) lands an ulp above qmax, v + u can reach
// qmax + 1 too. Either way the code is clamped to qmax (it once kept the low byte of
// qmax + 1, int8 -128, or its nibble, the code of -8: the block's largest element
// flipped sign). Both are rare: a search over seeds finds a block where each happens,
// and every code of both kernels must be qmax (the AVX2 kernel's block tail, the last
// 6 elements, goes through the reference).
TEST_P(KernelsAgree, StochasticCodesNextToQmaxAreClamped) {
  const int bits = GetParam();
  const int qmax = dx::quant_max(bits);
  const float fq = static_cast<float>(qmax);
  const std::size_t n = 134;
  auto ratio_of = [&](float absmax) {
    return dx::detail::block_ratio(dx::detail::block_scale(absmax, bits, dx::ScaleFormat::fp32));
  };
  float above = 1.0f;  // an absmax whose x * (1 / scale) exceeds qmax
  while (above * ratio_of(above).inv <= fq) above = std::nextafter(above, 2.0f);
  for (const float absmax : {fq, above}) {
    const float v = absmax * ratio_of(absmax).inv;
    // Seeds where, unclamped, some element's floor(v + u) (v + u rounded to float, as
    // the kernels add) is qmax + 1.
    auto decisive = [&](std::uint64_t seed) {
      for (std::size_t i = 0; i < n; ++i) {
        const float u = dx::bits_to_unit(dx::counter_bits(dx::counter_key(seed, i), i));
        const float w = v + u;
        if (std::floor(w) > fq) return true;
      }
      return false;
    };
    std::uint64_t seed = 0;
    while (!decisive(seed)) ASSERT_LT(++seed, std::uint64_t{1} << 24) << "absmax " << absmax;
    const std::vector<float> x(n, absmax);
    const auto c = config(bits, n, dx::ScaleFormat::fp32, dx::Rounding::stochastic, seed);
    const std::vector<float> acc(n, 0.0f);
    for (std::size_t off : {0, 1}) {
      SCOPED_TRACE("absmax " + std::to_string(absmax) + " seed " + std::to_string(seed) + " offset " +
                   std::to_string(off));
      const KernelRun want = run_kernel(Kernel::portable, x, acc, c, off, off);
      const KernelRun got = run_kernel(Kernel::avx2, x, acc, c, off, off);
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(code_at(want.bytes, n, i, c), qmax) << "portable, element " << i;
        ASSERT_EQ(code_at(got.bytes, n, i, c), qmax) << "avx2, element " << i;
      }
      EXPECT_EQ(got.bytes, want.bytes);
      const float s = dx::detail::load_scale(want.bytes.data(), c.scale);
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(want.decoded[i], fq * s) << i;
    }
  }
}

// Nearest rounding where x * (1 / scale) lands on or just past +-qmax, or a hair from
// a tie, at magnitudes from 2^-100 to 2^100: the AVX2 kernel does not clamp (the ratio
// of |x| <= absmax rounds to at most qmax), so its codes must still be the reference's.
TEST_P(KernelsAgree, NearestCodesAtTheEndsOfTheRangeAndNearTies) {
  const int bits = GetParam();
  const int qmax = dx::quant_max(bits);
  std::mt19937 gen(31);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const std::size_t n = 4 * 128 + 40;  // whole groups of four blocks and a tail
  std::vector<float> x(n);
  for (int trial = 0; trial < 3000; ++trial) {
    const float absmax = std::ldexp(1.0f + 0.5f * (unit(gen) + 1.0f), static_cast<int>(gen() % 201) - 100);
    const float step = absmax / static_cast<float>(qmax);
    for (auto& v : x) {
      const float sign = (gen() & 1) ? 1.0f : -1.0f;
      switch (gen() % 4) {
        case 0: v = sign * absmax; break;
        case 1: v = sign * std::nextafter(absmax, 0.0f); break;
        case 2: {  // an ulp either side of (k + 1/2) * step
          const float tie = (static_cast<float>(gen() % static_cast<unsigned>(qmax)) + 0.5f) * step;
          v = sign * std::min(absmax, std::nextafter(tie, (gen() & 1) ? absmax : 0.0f));
          break;
        }
        default: v = absmax * unit(gen);
      }
    }
    for (auto f : {dx::ScaleFormat::fp32, dx::ScaleFormat::bf16}) {
      SCOPED_TRACE("trial " + std::to_string(trial) + " bf16=" + std::to_string(f == dx::ScaleFormat::bf16));
      const auto c = config(bits, 128, f, dx::Rounding::nearest, 0);
      const std::vector<float> acc(n, 0.0f);
      ASSERT_EQ(run_kernel(Kernel::avx2, x, acc, c, 0, 0).bytes, run_kernel(Kernel::portable, x, acc, c, 0, 0).bytes);
    }
  }
}

#if DILOCOX_QUANTIZE_AVX2
// The AVX2 codes of one block (its helpers inline only into code built for AVX2).
template <int Bits>
__attribute__((target("avx2,fma"))) void avx2_stochastic_codes(const float* x, std::size_t len, float inv,
                                                                std::uint64_t index, std::uint32_t key, std::byte* out) {
  dx::detail::avx2::quantize_codes<Bits, true>(x, len, inv, index, key, out);
}

// Element indices past 2^32 (a tensor over 16 GiB, too large for a test): the AVX2
// codes of one block at such an index against the reference's, called directly.
TEST_P(KernelsAgree, StochasticCodesAtIndicesPast2To32) {
  const int bits = GetParam();
  const std::size_t len = 128;
  const std::uint64_t seed = 0x1234567890ULL;
  auto xs = random_values(len, 9);
  for (auto& v : xs) v = std::clamp(v, -1.0f, 1.0f);  // absmax <= 1: the ratio of absmax 1 fits
  const auto ratio = dx::detail::block_ratio(dx::detail::block_scale(1.0f, bits, dx::ScaleFormat::fp32));
  for (std::uint64_t index : {std::uint64_t{0}, (std::uint64_t{1} << 32) - len, (std::uint64_t{7} << 32) + 1000}) {
    std::vector<std::byte> want(len), got(len);
    const std::uint32_t key = dx::counter_key(seed, index);
    if (bits == 8) {
      dx::detail::quantize_block<8, true>(xs.data(), len, index, ratio, seed, want.data());
      avx2_stochastic_codes<8>(xs.data(), len, ratio.inv, index, key, got.data());
    } else {
      dx::detail::quantize_block<4, true>(xs.data(), len, index, ratio, seed, want.data());
      avx2_stochastic_codes<4>(xs.data(), len, ratio.inv, index, key, got.data());
    }
    EXPECT_EQ(got, want) << "index " << index;
  }
}
#endif

// The pick follows the CPU, not the compiler flags: a build without -march=native runs
// the AVX2 kernel too wherever /proc/cpuinfo lists avx2 and fma.
TEST(QuantKernel, PickFollowsTheCpu) {
  if (std::getenv("DILOCOX_QUANT_KERNEL") != nullptr) GTEST_SKIP() << "DILOCOX_QUANT_KERNEL overrides the pick";
  std::ifstream cpuinfo("/proc/cpuinfo");
  if (!cpuinfo) GTEST_SKIP() << "no /proc/cpuinfo";
  bool avx2 = false, fma = false;
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    for (std::string w; words >> w;) avx2 |= w == "avx2", fma |= w == "fma";
    break;
  }
  const bool x86 = DILOCOX_QUANTIZE_AVX2 != 0;
  EXPECT_EQ(dx::detail::initial_quant_kernel(), x86 && avx2 && fma ? Kernel::avx2 : Kernel::portable);
}

TEST(QuantKernel, EnvironmentOverridesThePick) {
  const char* before = std::getenv("DILOCOX_QUANT_KERNEL");
  const std::optional<std::string> saved = before ? std::optional<std::string>(before) : std::nullopt;
  ::setenv("DILOCOX_QUANT_KERNEL", "portable", 1);
  EXPECT_EQ(dx::detail::initial_quant_kernel(), Kernel::portable);
  ::setenv("DILOCOX_QUANT_KERNEL", "sse9", 1);
  EXPECT_THROW(
      {
        try {
          (void)dx::detail::initial_quant_kernel();
        } catch (const dx::Error& e) {
          EXPECT_THAT(e.what(), HasSubstr("DILOCOX_QUANT_KERNEL"));
          throw;
        }
      },
      dx::Error);
  if (saved) ::setenv("DILOCOX_QUANT_KERNEL", saved->c_str(), 1);
  else ::unsetenv("DILOCOX_QUANT_KERNEL");
}
