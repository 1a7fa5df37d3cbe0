// Error feedback: conservation (inputs = sent + residual) and the drift it prevents.
#include <dilocox/error_feedback.hpp>
#include <dilocox/quantize.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace dx = dilocox;

namespace {
// One compressed step: returns what the receivers decode of x (int4, block 64).
std::vector<float> compress(const std::vector<float>& x) {
  const dx::QuantConfig c{.bits = 4, .block = 64};
  std::vector<std::byte> enc(dx::encoded_size(x.size(), c));
  dx::quantize(x, enc, c);
  std::vector<float> out(x.size());
  dx::dequantize(enc, out, c);
  return out;
}

std::vector<float> gradient(std::size_t n, std::mt19937& gen) {
  // One large entry per block of 64 sets the int4 step to 20/7; the others carry a
  // persistent bias of 0.2 (under a third of a step, so int4 rounds it to zero) plus noise.
  std::normal_distribution<float> noise(0.0f, 0.02f);
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = (i % 64 == 0 ? 20.0f : 0.2f) + noise(gen);
  return g;
}
}  // namespace

TEST(ErrorFeedback, InputsEqualSentPlusResidualOverHundredSteps) {
  const std::size_t n = 1000;
  std::mt19937 gen(1);
  dx::ErrorFeedback ef(n);
  std::vector<double> inputs(n, 0.0), sent(n, 0.0);
  for (int step = 0; step < 100; ++step) {
    auto x = gradient(n, gen);
    for (std::size_t i = 0; i < n; ++i) inputs[i] += x[i];
    ef.add_to(x);
    const auto s = compress(x);
    ef.update(x, s);
    for (std::size_t i = 0; i < n; ++i) sent[i] += s[i];
  }
  const auto e = ef.residual();
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_NEAR(inputs[i], sent[i] + e[i], 1e-3 * (1.0 + std::fabs(inputs[i]))) << i;
}

TEST(ErrorFeedback, RunningSumTracksTruthOnlyWithFeedback) {
  const std::size_t n = 1000;
  const double half_step = 0.5 * 20.0 / 7.0 * 1.01;  // the largest residual feedback leaves
  std::mt19937 gen(2);
  dx::ErrorFeedback ef(n);
  std::vector<double> truth(n, 0.0), with_ef(n, 0.0), without(n, 0.0);
  auto max_gap = [&](const std::vector<double>& sum) {
    double m = 0;
    for (std::size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(sum[i] - truth[i]));
    return m;
  };
  double gap_plain_50 = 0;
  for (int step = 1; step <= 100; ++step) {
    auto x = gradient(n, gen);
    const auto s_plain = compress(x);  // the same stream, compressed without feedback
    for (std::size_t i = 0; i < n; ++i) truth[i] += x[i], without[i] += s_plain[i];
    ef.add_to(x);
    const auto s = compress(x);
    ef.update(x, s);
    for (std::size_t i = 0; i < n; ++i) with_ef[i] += s[i];
    ASSERT_LE(max_gap(with_ef), half_step) << "step " << step;  // bounded at every step
    if (step == 50) gap_plain_50 = max_gap(without);
  }
  // Without feedback the bias is dropped every step: the gap grows with the step count.
  EXPECT_GT(gap_plain_50, 9.0);
  EXPECT_GT(max_gap(without), 1.9 * gap_plain_50);
  EXPECT_GT(max_gap(without), 10 * half_step);
}

TEST(ErrorFeedback, SizeMismatchThrows) {
  dx::ErrorFeedback ef(4);
  std::vector<float> x(5), s(4);
  EXPECT_THROW(ef.add_to(x), dx::Error);
  EXPECT_THROW(ef.update(x, s), dx::Error);
  EXPECT_THROW(ef.assign(x), dx::Error);
}

TEST(ErrorFeedback, AssignThenSubtractInPlaceEqualsUpdate) {
  std::mt19937 gen(3);
  const auto x = gradient(300, gen);
  const auto s = compress(x);
  dx::ErrorFeedback by_update(x.size()), in_place(x.size());
  by_update.update(x, s);
  const auto e = in_place.assign(x);  // what the low-rank compressor does with e -= P Q^T
  for (std::size_t i = 0; i < e.size(); ++i) e[i] -= s[i];
  EXPECT_TRUE(std::ranges::equal(by_update.residual(), in_place.residual()));
}
