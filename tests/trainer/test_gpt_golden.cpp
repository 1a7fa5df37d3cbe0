// The GPT against PyTorch: golden/gpt_golden.bin holds weights, one batch and what
// PyTorch (float64) computes from them (make_gpt_golden.py). The C++ model runs the
// same batch in double and in float. Tolerances:
//  - double: 1e-9 relative. Both sides compute in float64; only the order of the sums
//    differs (a few ulp per op, ~30 ops deep), far below 1e-9.
//  - float: 1e-4 of each tensor's largest gradient, 2e-5 of the loss. float32 has 2^-24
//    ~ 6e-8 per op; dot products of length <= 64 and ~30 layers of ops in sequence
//    give ~1e-6-1e-5 relative; 10x margin above what we see.
#include "model/gpt_stage.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <vector>

using namespace dilocox::trainer;

namespace {

struct Golden {
  int V, C, NH, L, maxT, B, T, n;
  std::vector<std::int32_t> tokens, targets;
  std::vector<double> params, logits, grads;
  double loss;
};

Golden load_golden() {
  std::ifstream f(DILOCOX_GOLDEN_FILE, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " DILOCOX_GOLDEN_FILE);
  char magic[8];
  f.read(magic, 8);
  if (std::memcmp(magic, "DLXGOLD1", 8) != 0) throw std::runtime_error("bad golden magic");
  Golden g{};
  std::int32_t h[8];
  f.read(reinterpret_cast<char*>(h), sizeof h);
  g.V = h[0], g.C = h[1], g.NH = h[2], g.L = h[3], g.maxT = h[4], g.B = h[5], g.T = h[6], g.n = h[7];
  auto read = [&](auto& v, std::size_t count) {
    v.resize(count);
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(v[0])));
  };
  const std::size_t bt = static_cast<std::size_t>(g.B) * g.T;
  read(g.tokens, bt);
  read(g.targets, bt);
  read(g.params, static_cast<std::size_t>(g.n));
  read(g.logits, bt * static_cast<std::size_t>(g.V));
  f.read(reinterpret_cast<char*>(&g.loss), 8);
  read(g.grads, static_cast<std::size_t>(g.n));
  if (!f) throw std::runtime_error("golden file truncated");
  return g;
}

GptConfig golden_config(const Golden& g) {
  GptConfig c;
  c.n_layer = g.L, c.n_embd = g.C, c.n_head = g.NH, c.vocab = g.V, c.max_seq = g.maxT;
  return c;
}

template <class T>
void check_against_torch(double value_tol, double grad_tol) {
  const Golden g = load_golden();
  GptStage<T> m(golden_config(g), 1, 0, g.B, g.T, 1);
  ASSERT_EQ(m.params().size(), static_cast<std::size_t>(g.n));
  for (int i = 0; i < g.n; ++i) m.params()[static_cast<std::size_t>(i)] = static_cast<T>(g.params[static_cast<std::size_t>(i)]);
  const std::size_t N = static_cast<std::size_t>(g.B) * g.T;
  const double loss = m.forward(0, g.tokens.data(), g.targets.data()) / static_cast<double>(N);
  EXPECT_NEAR(loss, g.loss, value_tol * std::abs(g.loss));

  // Probabilities = softmax of PyTorch's logits, row by row.
  const auto probs = m.probabilities(0);
  double worst = 0;
  for (std::size_t n = 0; n < N; ++n) {
    const double* row = g.logits.data() + n * static_cast<std::size_t>(g.V);
    double mx = row[0], sum = 0;
    for (int i = 1; i < g.V; ++i) mx = std::max(mx, row[i]);
    for (int i = 0; i < g.V; ++i) sum += std::exp(row[i] - mx);
    for (int i = 0; i < g.V; ++i)
      worst = std::max(worst, std::abs(static_cast<double>(probs[n * static_cast<std::size_t>(g.V) + static_cast<std::size_t>(i)]) -
                                       std::exp(row[i] - mx) / sum));
  }
  EXPECT_LT(worst, value_tol) << "largest probability difference";

  m.zero_grads();
  m.backward(0, static_cast<T>(1.0 / static_cast<double>(N)));
  m.finish_backward();
  for (const auto& t : m.tensors()) {
    SCOPED_TRACE(t.name);
    const auto gr = m.grad(t);
    double scale = 0, diff = 0;
    for (std::size_t i = 0; i < gr.size(); ++i) {
      const double ref = g.grads[t.offset + i];
      scale = std::max(scale, std::abs(ref));
      diff = std::max(diff, std::abs(static_cast<double>(gr[i]) - ref));
    }
    ASSERT_GT(scale, 0.0) << "the reference gradient of every tensor is non-zero";
    EXPECT_LE(diff, grad_tol * scale);
  }
}

}  // namespace

TEST(GptGolden, DoubleMatchesPyTorch) { check_against_torch<double>(1e-9, 1e-9); }
TEST(GptGolden, FloatMatchesPyTorch) { check_against_torch<float>(2e-5, 1e-4); }
