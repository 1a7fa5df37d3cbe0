// Gradient check of the `tiny` preset in double: the analytic gradient of every
// parameter tensor against central finite differences at sampled coordinates.
// With h = 1e-5 in double, truncation (h^2 f''') and rounding (eps f / h) errors are
// ~1e-10; the tolerance, 1e-7 + 1e-5 |g|, is far above that and far below any real bug.
#include "model/gpt_stage.hpp"

#include <dilocox/random.hpp>

#include <gtest/gtest.h>

#include <vector>

using namespace dilocox::trainer;

TEST(GptGradcheck, TinyMatchesFiniteDifferences) {
  GptConfig cfg = gpt_preset("tiny");
  const int B = 2, T = 16;
  GptStage<double> m(cfg, 1, 0, B, T, 1);
  m.init(7);
  // Perturb the norms and biases away from 1 and 0, so their gradients are generic.
  for (const auto& t : m.tensors())
    if (t.shape.size() == 1) {
      auto p = m.param(t);
      for (std::size_t i = 0; i < p.size(); ++i)
        p[i] += 0.1 * dilocox::counter_normal(99 + static_cast<std::uint64_t>(t.global_id), i);
    }
  std::vector<std::int32_t> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) {
    tokens[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(dilocox::counter_bits(3, static_cast<std::uint64_t>(i)) % 4096);
    targets[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(dilocox::counter_bits(4, static_cast<std::uint64_t>(i)) % 4096);
  }
  const double N = B * T;
  auto loss = [&] { return m.forward(0, tokens.data(), targets.data()) / N; };
  loss();
  m.zero_grads();
  m.backward(0, 1.0 / N);
  m.finish_backward();
  const std::vector<double> analytic(m.grads().begin(), m.grads().end());

  const double h = 1e-5;
  int checked = 0;
  for (const auto& t : m.tensors()) {
    SCOPED_TRACE(t.name);
    auto p = m.param(t);
    std::vector<std::size_t> picks;
    if (t.name == "wte") picks = {static_cast<std::size_t>(tokens[0]) * 64 + 5, static_cast<std::size_t>(targets[3]) * 64 + 17};
    for (std::uint64_t k = 0; k < 6; ++k) picks.push_back(dilocox::counter_bits(11 + static_cast<std::uint32_t>(t.global_id), k) % p.size());
    for (auto i : picks) {
      const double keep = p[i];
      p[i] = keep + h;
      const double up = loss();
      p[i] = keep - h;
      const double down = loss();
      p[i] = keep;
      const double fd = (up - down) / (2 * h);
      const double an = analytic[t.offset + i];
      EXPECT_NEAR(an, fd, 1e-7 + 1e-5 * std::abs(an)) << "element " << i;
      ++checked;
    }
  }
  EXPECT_GT(checked, 6 * 28);
}
