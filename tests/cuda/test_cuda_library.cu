// tests/cuda/test_cuda_library.cu (label gpu): the device quantizers against the host
// ones byte for byte, device error feedback, and the device projector against the host
// projector within float tolerance. Skips without a CUDA device.
#include <dilocox/cuda/error_feedback.cuh>
#include <dilocox/cuda/lowrank.cuh>
#include <dilocox/cuda/quantize.cuh>
#include <dilocox/lowrank.hpp>
#include <dilocox/quantize.hpp>
#include <dilocox/random.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "gpu_test.hpp"

namespace dx = dilocox;
using dx::test::GpuTest;
using dx::test::to_device;
using dx::test::to_host;

namespace {

std::vector<float> normal_data(std::size_t n, std::uint64_t seed, float scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * dx::counter_normal(seed, i);
  return v;
}

// Quantizes x[offset:] on the host and on the device; the bytes must be equal.
void expect_same_bytes(const std::vector<float>& x, std::size_t offset, const dx::QuantConfig& c,
                       cudaStream_t stream) {
  const std::span<const float> in(x.data() + offset, x.size() - offset);
  const std::size_t bytes = dx::encoded_size(in.size(), c);
  std::vector<std::byte> host(bytes);
  dx::quantize(in, host, c);
  auto dx_in = to_device<float>(std::span<const float>(x));
  dx::cuda::DeviceBuffer<std::byte> d_out(bytes + 1);
  d_out.zero();
  dx::cuda::FaultFlag fault;
  dx::quantize(dx::TensorView<const float, dx::cuda_space>{dx_in.data() + offset, {in.size()}},
               dx::TensorView<std::byte, dx::cuda_space>{d_out.data(), {bytes}}, c, stream, &fault);
  fault.fetch(stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_FALSE(fault.raised());
  const auto dev = to_host(d_out.data(), bytes + 1);
  EXPECT_EQ(dev[bytes], std::byte{0}) << "wrote past encoded_size";
  std::size_t first_diff = bytes;
  for (std::size_t i = 0; i < bytes && first_diff == bytes; ++i)
    if (dev[i] != host[i]) first_diff = i;
  EXPECT_EQ(first_diff, bytes) << "first differing byte of " << bytes;

  // Decoding: device dequantize of the host bytes equals the host dequantize exactly.
  std::vector<float> want(in.size());
  dx::dequantize(host, want, c);
  auto d_bytes = to_device<std::byte>(std::span<const std::byte>(host));
  dx::cuda::DeviceBuffer<float> d_y(in.size());
  dx::dequantize(dx::TensorView<const std::byte, dx::cuda_space>{d_bytes.data(), {bytes}},
                 dx::TensorView<float, dx::cuda_space>{d_y.data(), {in.size()}}, c, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(to_host(d_y.data(), in.size()), want);
}

}  // namespace

class CudaQuantizer : public GpuTest {};

TEST_F(CudaQuantizer, BytesIdenticalToHost) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (std::size_t block : {32, 128, 256, 6}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{31}, block - 1, block + 1,
                          std::size_t{4097}, std::size_t{(1 << 20) + 3}}) {
      const auto x = normal_data(n + 1, 7 * n + block, 3.0f);
      for (int bits : {4, 8})
        for (auto rounding : {dx::Rounding::nearest, dx::Rounding::stochastic})
          for (auto scale : {dx::ScaleFormat::fp32, dx::ScaleFormat::bf16})
            for (std::size_t offset : {std::size_t{0}, std::size_t{1}}) {  // 1: not 16-byte aligned
              const dx::QuantConfig c{.bits = bits, .block = block, .rounding = rounding, .seed = 42 + n, .scale = scale};
              SCOPED_TRACE("n " + std::to_string(n) + " block " + std::to_string(block) + " bits " +
                           std::to_string(bits) + " stochastic " + std::to_string(rounding == dx::Rounding::stochastic) +
                           " bf16 " + std::to_string(scale == dx::ScaleFormat::bf16) + " offset " + std::to_string(offset));
              expect_same_bytes(x, offset, c, stream);
            }
    }
  }
  cudaStreamDestroy(stream);
}

TEST_F(CudaQuantizer, ExtremeMagnitudesIdenticalToHost) {
  std::vector<float> x = {0.0f, -0.0f, 1e30f, -1e-30f, 3e38f, 1e-40f, -1e-42f, 5.0f};
  x.resize(512, 0.0f);                                  // all-zero blocks too
  for (std::size_t i = 300; i < 340; ++i) x[i] = 1e-41f * static_cast<float>(i % 7);  // a subnormal block
  for (int bits : {4, 8})
    for (auto scale : {dx::ScaleFormat::fp32, dx::ScaleFormat::bf16}) {
      SCOPED_TRACE(std::to_string(bits) + " bits, bf16 " + std::to_string(scale == dx::ScaleFormat::bf16));
      expect_same_bytes(x, 0, dx::QuantConfig{.bits = bits, .block = 32, .scale = scale}, nullptr);
    }
}

// Stochastic rounding at v = qmax (x = qmax, scale 1), with a seed where v + u rounds
// to qmax + 1 for some element: the code is clamped to qmax on the device as on the host.
TEST_F(CudaQuantizer, StochasticCodesAtQmaxClampedLikeHost) {
  const std::size_t n = 512;
  for (int bits : {4, 8}) {
    const float qmax = static_cast<float>(dx::quant_max(bits));
    auto decisive = [&](std::uint64_t seed) {
      for (std::size_t i = 0; i < n; ++i) {
        const float w = qmax + dx::bits_to_unit(dx::counter_bits(dx::counter_key(seed, i), i));
        if (std::floor(w) > qmax) return true;
      }
      return false;
    };
    std::uint64_t seed = 0;
    while (!decisive(seed)) ASSERT_LT(++seed, std::uint64_t{1} << 24);
    const std::vector<float> x(n + 1, qmax);
    const dx::QuantConfig c{.bits = bits, .block = 128, .rounding = dx::Rounding::stochastic, .seed = seed};
    std::vector<std::byte> host(dx::encoded_size(n, c));
    std::vector<float> decoded(n);
    dx::quantize(std::span<const float>(x.data(), n), host, c);
    dx::dequantize(host, decoded, c);
    EXPECT_EQ(decoded, std::vector<float>(n, qmax)) << bits << " bits, seed " << seed;
    for (std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
      SCOPED_TRACE(std::to_string(bits) + " bits, seed " + std::to_string(seed) + ", offset " + std::to_string(offset));
      expect_same_bytes(x, offset, c, nullptr);
    }
  }
}

TEST_F(CudaQuantizer, NonFiniteElementIsNamed) {
  auto x = normal_data(1000, 3, 1.0f);
  x[700] = std::numeric_limits<float>::infinity();
  x[77] = std::numeric_limits<float>::quiet_NaN();
  auto d = to_device<float>(std::span<const float>(x));
  const dx::QuantConfig c{.bits = 4, .block = 128};
  dx::cuda::DeviceBuffer<std::byte> out(dx::encoded_size(x.size(), c));
  dx::cuda::FaultFlag fault;
  fault.reset();
  dx::quantize(dx::TensorView<const float, dx::cuda_space>{d.data(), {x.size()}}, out.view(), c, nullptr, &fault);
  fault.fetch();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_TRUE(fault.raised());
  try {
    fault.throw_if_raised("compress");
    FAIL() << "no throw";
  } catch (const dx::Error& e) {
    EXPECT_STREQ(e.what(), "compress: element 77 is NaN");
  }
  x[77] = 0.0f;  // only the Inf left
  d = to_device<float>(std::span<const float>(x));
  fault.reset();
  dx::quantize(dx::TensorView<const float, dx::cuda_space>{d.data(), {x.size()}}, out.view(), c, nullptr, &fault);
  fault.fetch();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_THROW(fault.throw_if_raised("compress"), dx::Error);
}

TEST_F(CudaQuantizer, ShortBufferThrowsBeforeLaunch) {
  dx::cuda::DeviceBuffer<float> x(100);
  dx::cuda::DeviceBuffer<std::byte> out(10);
  EXPECT_THROW(dx::quantize(x.view(), out.view(), dx::QuantConfig{}), dx::Error);
  EXPECT_THROW(dx::dequantize(out.view(), x.view(), dx::QuantConfig{}), dx::Error);
}

class CudaErrorFeedback : public GpuTest {};

TEST_F(CudaErrorFeedback, InputsEqualSentPlusResidual) {
  const std::size_t n = 4099;
  dx::cuda::ErrorFeedback ef(n);
  const dx::QuantConfig c{.bits = 4, .block = 64};
  std::vector<double> total(n, 0.0), sent_total(n, 0.0);
  dx::cuda::DeviceBuffer<float> x(n), sent(n);
  dx::cuda::DeviceBuffer<std::byte> code(dx::encoded_size(n, c));
  for (int step = 0; step < 100; ++step) {
    const auto in = normal_data(n, 1000 + step, 1.0f);
    for (std::size_t i = 0; i < n; ++i) total[i] += in[i];
    x = to_device<float>(std::span<const float>(in));
    ef.add_to(x.view());
    dx::quantize(x.view(), code.view(), c);
    dx::dequantize(code.view(), sent.view(), c);
    ef.update(x.view(), sent.view());
    const auto s = to_host(sent.data(), n);
    for (std::size_t i = 0; i < n; ++i) sent_total[i] += s[i];
  }
  const auto e = to_host(ef.residual().data, n);
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(total[i] - (sent_total[i] + e[i])));
  EXPECT_LT(worst, 1e-3);
}

class CudaProjector : public GpuTest {};

// After 6 warm calls the device and host projectors agree: reconstruction within
// 1e-4 of ||X||, singular values within 1e-3 relative.
TEST_F(CudaProjector, MatchesHostProjector) {
  struct Case { std::size_t m, n; int r; };
  for (const Case k : {Case{256, 128, 4}, Case{300, 500, 8}, Case{512, 384, 16}}) {
    SCOPED_TRACE(std::to_string(k.m) + " x " + std::to_string(k.n) + " r" + std::to_string(k.r));
    // A matrix with a decaying spectrum: sum of rank-one terms.
    std::vector<float> x(k.m * k.n, 0.0f);
    for (int t = 0; t < 24; ++t) {
      const auto u = normal_data(k.m, 100 + t, 1.0f), v = normal_data(k.n, 200 + t, 1.0f / (1.0f + t));
      for (std::size_t i = 0; i < k.m; ++i)
        for (std::size_t j = 0; j < k.n; ++j) x[i * k.n + j] += u[i] * v[j];
    }
    const dx::LowRankConfig cfg{.rank = k.r, .seed = 5};
    dx::PowerIterationProjector host(k.m, k.n, cfg);
    dx::cuda::PowerIterationProjector dev(k.m, k.n, cfg);
    std::vector<float> want(x.size());
    auto d_x = to_device<float>(std::span<const float>(x));
    dx::cuda::DeviceBuffer<float> d_out(x.size());
    for (int call = 0; call < 6; ++call) {
      host.approximate({x.data(), k.m, k.n}, {want.data(), k.m, k.n});
      dev.approximate({d_x.data(), k.m, k.n}, {d_out.data(), k.m, k.n});
    }
    const auto got = to_host(d_out.data(), x.size());
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < x.size(); ++i) diff += std::pow(got[i] - want[i], 2), norm += std::pow(x[i], 2);
    EXPECT_LT(std::sqrt(diff / norm), 1e-4);
    const auto sh = host.singular_values();
    const auto sd = dev.singular_values();
    ASSERT_EQ(sd.size(), sh.size());
    for (std::size_t i = 0; i < sh.size(); ++i) EXPECT_NEAR(sd[i], sh[i], 1e-3 * sh[0]) << "sigma " << i;
  }
}

// A zero matrix and a rank-1 matrix at rank 8: P stays finite and orthonormal.
TEST_F(CudaProjector, DegenerateInputsGiveOrthonormalBasis) {
  const std::size_t m = 64, n = 48;
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<float> x(m * n, 0.0f);
    if (kind == 1)
      for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j) x[i * n + j] = static_cast<float>(i + 1) * static_cast<float>(j % 5);
    dx::cuda::PowerIterationProjector dev(m, n, {.rank = 8, .seed = 1});
    auto d_x = to_device<float>(std::span<const float>(x));
    dev.left({d_x.data(), m, n});
    dev.orthonormalize_left();
    const auto p = to_host(dev.left_factor().data, m * 8);
    for (int a = 0; a < 8; ++a)
      for (int b = 0; b < 8; ++b) {
        double dot = 0;
        for (std::size_t i = 0; i < m; ++i) dot += static_cast<double>(p[i * 8 + a]) * p[i * 8 + b];
        EXPECT_NEAR(dot, a == b ? 1.0 : 0.0, 1e-5) << "kind " << kind << " columns " << a << ", " << b;
      }
    EXPECT_GE(dev.replaced_columns(), kind == 0 ? 8u : 7u);
  }
}

TEST_F(CudaProjector, SetRankAndStateFollowTheHostFormat) {
  const std::size_t m = 96, n = 80;
  const auto x = normal_data(m * n, 9, 1.0f);
  auto d_x = to_device<float>(std::span<const float>(x));
  dx::cuda::PowerIterationProjector a(m, n, {.rank = 8, .seed = 3});
  a.left({d_x.data(), m, n});
  a.orthonormalize_left();
  a.right({d_x.data(), m, n});
  a.set_rank(4);
  EXPECT_EQ(a.rank(), 4);
  dx::StateWriter w;
  a.save_state(w);
  dx::cuda::PowerIterationProjector b(m, n, {.rank = 8, .seed = 3});
  const auto bytes = w.bytes();
  dx::StateReader r(bytes);
  b.load_state(r);
  EXPECT_EQ(b.rank(), 4);
  EXPECT_EQ(to_host(b.right_factor().data, n * 4), to_host(a.right_factor().data, n * 4));
  EXPECT_THROW(a.set_rank(0), dx::Error);
}
