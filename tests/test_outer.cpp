// The outer optimizer against a hand-computed sequence, and the adaptive rank
// controller's rules (DESIGN.md 2.6): effective rank, growth, window smoothing,
// clamps. (H following the rank is OuterLoop's: test_fragments.cpp.)
#include <dilocox/adaptive.hpp>
#include <dilocox/outer.hpp>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace dx = dilocox;

TEST(NesterovOuterOptimizer, MatchesHandComputedSequence) {
  // lr 0.7, mu 0.9, deltas 0.5, 0.25, -0.1 from theta = 1:
  //  v = 0.5;  theta = 1 - 0.7 (0.5 + 0.45)          = 0.335
  //  v = 0.7;  theta = 0.335 - 0.7 (0.25 + 0.63)     = -0.281
  //  v = 0.53; theta = -0.281 - 0.7 (-0.1 + 0.477)   = -0.5449
  dx::NesterovOuterOptimizer opt(1, {.lr = 0.7f, .momentum = 0.9f});
  std::vector<float> theta{1.0f};
  const float want[] = {0.335f, -0.281f, -0.5449f};
  const float deltas[] = {0.5f, 0.25f, -0.1f};
  for (int t = 0; t < 3; ++t) {
    std::vector<float> d{deltas[t]};
    opt.step(theta, d);
    EXPECT_NEAR(theta[0], want[t], 1e-6f) << "step " << t;
  }
}

// Momentum at the replica: momentum_direction() on the replica's own delta, then
// descend() by the (here: one replica's) reduced direction is the same sequence.
TEST(NesterovOuterOptimizer, SplitStepMatchesTheWholeStep) {
  for (bool nesterov : {true, false}) {
    dx::NesterovOuterOptimizer whole(1, {.lr = 0.7f, .momentum = 0.9f, .nesterov = nesterov});
    dx::NesterovOuterOptimizer split(1, {.lr = 0.7f, .momentum = 0.9f, .nesterov = nesterov});
    std::vector<float> a{1.0f}, b{1.0f};
    for (float delta : {0.5f, 0.25f, -0.1f}) {
      std::vector<float> d{delta}, dir{delta};
      whole.step(a, d);
      split.momentum_direction(dir);
      split.descend(b, dir);
      EXPECT_NEAR(a[0], b[0], 1e-6f);
    }
  }
  dx::NesterovOuterOptimizer opt(2, {});
  std::vector<float> one(1), two(2);
  EXPECT_THROW(opt.momentum_direction(one), dx::Error);
  EXPECT_THROW(opt.descend(two, one), dx::Error);
}

TEST(NesterovOuterOptimizer, HeavyBallWithoutNesterov) {
  // theta = 1 - 0.7 * 0.5 = 0.65; v = 0.7: 0.16; v = 0.53: -0.211
  dx::NesterovOuterOptimizer opt(1, {.lr = 0.7f, .momentum = 0.9f, .nesterov = false});
  std::vector<float> theta{1.0f};
  const float want[] = {0.65f, 0.16f, -0.211f};
  const float deltas[] = {0.5f, 0.25f, -0.1f};
  for (int t = 0; t < 3; ++t) {
    std::vector<float> d{deltas[t]};
    opt.step(theta, d);
    EXPECT_NEAR(theta[0], want[t], 1e-6f);
  }
}

TEST(NesterovOuterOptimizer, DefaultsAreTheMeasuredOnes) {
  const dx::NesterovConfig c;  // docs/RESULTS.md, "Defaults that converge"
  EXPECT_EQ(c.lr, 0.7f);
  EXPECT_EQ(c.momentum, 0.5f);
  EXPECT_TRUE(c.nesterov);
}

TEST(NesterovOuterOptimizer, LrOneNoMomentumIsPlainAveraging) {
  dx::NesterovOuterOptimizer opt(3, {.lr = 1.0f, .momentum = 0.0f});
  std::vector<float> theta{1, 2, 3}, d{0.5f, -1, 0};
  opt.step(theta, d);
  EXPECT_EQ(theta, (std::vector<float>{0.5f, 3, 3}));
}

TEST(NesterovOuterOptimizer, RejectsBadConfigAndSizes) {
  EXPECT_THROW(dx::NesterovOuterOptimizer(1, {.lr = 0}), dx::Error);
  EXPECT_THROW(dx::NesterovOuterOptimizer(1, {.momentum = 1.0f}), dx::Error);
  dx::NesterovOuterOptimizer opt(2, {});
  std::vector<float> a(2), b(3);
  EXPECT_THROW(opt.step(a, b), dx::Error);
}

// bf16 storage: half the bytes, within bf16's rounding of the fp32 buffer's theta after 50
// steps, and a checkpoint continues bit for bit.
TEST(NesterovOuterOptimizer, Bf16StorageHalvesTheBufferAndTracksFp32) {
  const std::size_t n = 1000;
  dx::NesterovOuterOptimizer full(n, {.momentum = 0.9f}), half(n, {.momentum = 0.9f}, dx::MomentumStorage::bf16);
  EXPECT_EQ(full.state_bytes(), 4 * n);
  EXPECT_EQ(half.state_bytes(), 2 * n);
  std::vector<float> a(n, 1.0f), b(n, 1.0f), d(n);
  for (int t = 0; t < 50; ++t) {
    for (std::size_t i = 0; i < n; ++i) d[i] = 0.01f * std::sin(0.37f * static_cast<float>(i * (t + 1)));
    full.step(a, d);
    half.step(b, d);
  }
  double moved = 0, diff = 0;
  for (std::size_t i = 0; i < n; ++i) moved += std::fabs(a[i] - 1.0f), diff += std::fabs(a[i] - b[i]);
  EXPECT_GT(diff, 0.0) << "the bf16 buffer rounds nothing";
  EXPECT_LT(diff, 0.01 * moved);
  dx::StateWriter w;
  half.save_state(w);
  const auto bytes = w.bytes();
  dx::NesterovOuterOptimizer again(n, {.momentum = 0.9f}, dx::MomentumStorage::bf16);
  dx::StateReader r(bytes);
  again.load_state(r);
  std::vector<float> c = b;
  half.step(b, d);
  again.step(c, d);
  EXPECT_EQ(b, c);
}

namespace {
std::vector<float> geometric(int n, float ratio) {
  std::vector<float> s(n);
  for (int i = 0; i < n; ++i) s[i] = std::pow(ratio, static_cast<float>(i));
  return s;
}
double energy(const std::vector<float>& s) {
  double e = 0;
  for (float v : s) e += static_cast<double>(v) * v;
  return e;
}
}  // namespace

TEST(AdaptiveRankController, EffectiveRankKeepsRhoOfTheEnergy) {
  dx::AdaptiveRankController c({}, 16);
  const auto s = geometric(16, 0.5f);  // energies 0.25^i: 75%, 94%, ... -> 2 at rho 0.9
  EXPECT_EQ(c.effective_rank(s, energy(s), energy(s)), 2);
  const auto flat = std::vector<float>(16, 1.0f);  // 0.9 of 16 equal values -> 15
  EXPECT_EQ(c.effective_rank(flat, 16, 16), 15);
  EXPECT_EQ(c.effective_rank(std::vector<float>(16, 0.0f), 0, 0), 2);  // nothing: r_min
}

TEST(AdaptiveRankController, RankFallsOnDecayingSpectrumWithWindowSmoothing) {
  dx::AdaptiveRankController c({.window = 5}, 16);
  const auto s = geometric(16, 0.5f);
  // the window starts as five 16s; each round adds a 2: ceil(66/5)=14, ceil(52/5)=11, 8, 5, 2
  const int want[] = {14, 11, 8, 5, 2, 2};
  for (int t = 0; t < 6; ++t) {
    c.observe(s, energy(s), energy(s) / 0.95);
    EXPECT_EQ(c.rank(), want[t]) << "round " << t;
    EXPECT_EQ(c.last_effective_rank(), 2);
  }
}

TEST(AdaptiveRankController, RankGrowsWhenTheSketchMissesTheEnergy) {
  dx::AdaptiveRankController c({.window = 1, .r_max = 64}, 8);
  const auto s = geometric(8, 0.9f);
  c.observe(s, energy(s), 10 * energy(s));  // the sketch holds 10% < rho_total 50%
  EXPECT_EQ(c.last_effective_rank(), 16);
  EXPECT_EQ(c.rank(), 16);
}

TEST(AdaptiveRankController, ClampsToRminAndRmax) {
  dx::AdaptiveRankController lo({.window = 1, .r_min = 4, .r_max = 32}, 8);
  const auto s = geometric(8, 0.1f);
  lo.observe(s, energy(s), energy(s));
  EXPECT_EQ(lo.rank(), 4);
  dx::AdaptiveRankController hi({.window = 1, .r_min = 4, .r_max = 12}, 8);
  hi.observe(geometric(8, 0.99f), 1, 100);  // grow to 16, clamped to 12
  EXPECT_EQ(hi.rank(), 12);
}

TEST(AdaptiveRankController, RejectsBadConfig) {
  EXPECT_THROW(dx::AdaptiveRankController({.rho = 0}, 4), dx::Error);
  EXPECT_THROW(dx::AdaptiveRankController({.window = 0}, 4), dx::Error);
  EXPECT_THROW(dx::AdaptiveRankController({.r_min = 8, .r_max = 4}, 4), dx::Error);
  EXPECT_THROW(dx::AdaptiveRankController({}, 100), dx::Error);
  EXPECT_THROW(dx::AdaptiveRankController({.rho_total = 1.5}, 4), dx::Error);
}
