// PowerIterationProjector against Eigen's SVD: near-optimal rank-r error and singular
// values on decaying spectra, orthonormal finite factors on degenerate input,
// warm start, rank changes, determinism and rejected input; the one-sweep step()
// against the two-phase API (left, orthonormalize_left, right) it replaces in one process.
// LowRankCompressor's int8 factors blocked by column against by row on a steep spectrum.
#include <dilocox/compress/lowrank.hpp>
#include <dilocox/lowrank.hpp>
#include <gtest/gtest.h>

#include <Eigen/QR>
#include <Eigen/SVD>
#include <cmath>
#include <vector>

#include "thread_ranks.hpp"

namespace dx = dilocox;
using RowM = dx::PowerIterationProjector::RowMatrix;

namespace {

Eigen::MatrixXd random_orthonormal(int rows, int cols, unsigned seed) {
  std::srand(seed);
  Eigen::MatrixXd g = Eigen::MatrixXd::Random(rows, cols);
  Eigen::HouseholderQR<Eigen::MatrixXd> qr(g);
  return qr.householderQ() * Eigen::MatrixXd::Identity(rows, cols);
}

// X = U diag(s) V^T with random orthonormal U, V.
RowM with_spectrum(int m, int n, const std::vector<double>& s, unsigned seed) {
  const int k = static_cast<int>(s.size());
  const Eigen::MatrixXd u = random_orthonormal(m, k, seed), v = random_orthonormal(n, k, seed + 1);
  const Eigen::VectorXd d = Eigen::Map<const Eigen::VectorXd>(s.data(), k);
  return (u * d.asDiagonal() * v.transpose()).cast<float>();
}

std::vector<double> geometric(int k, double ratio) {
  std::vector<double> s(k);
  for (int i = 0; i < k; ++i) s[i] = std::pow(ratio, i);
  return s;
}

double frob_error(const RowM& a, const RowM& b) { return (a.cast<double>() - b.cast<double>()).norm(); }

dx::MatrixView<const float> view(const RowM& x) {
  return {x.data(), static_cast<std::size_t>(x.rows()), static_cast<std::size_t>(x.cols())};
}
dx::MatrixView<float> view(RowM& x) {
  return {x.data(), static_cast<std::size_t>(x.rows()), static_cast<std::size_t>(x.cols())};
}

double orthonormality_error(dx::MatrixView<float> p) {
  Eigen::Map<RowM> m(p.data, static_cast<Eigen::Index>(p.rows), static_cast<Eigen::Index>(p.cols));
  return (m.transpose().cast<double>() * m.cast<double>() - Eigen::MatrixXd::Identity(m.cols(), m.cols())).norm();
}

}  // namespace

TEST(PowerIterationProjector, WarmStartReachesOptimalErrorAndSingularValues) {
  struct Case { int m, n, r; double ratio; };
  for (const Case c : {Case{256, 128, 4, 0.7}, Case{300, 500, 8, 0.8}, Case{512, 384, 16, 0.85}}) {
    SCOPED_TRACE(std::to_string(c.m) + "x" + std::to_string(c.n) + " r=" + std::to_string(c.r));
    const RowM x = with_spectrum(c.m, c.n, geometric(std::min(c.m, c.n), c.ratio), 7);
    Eigen::BDCSVD<Eigen::MatrixXd> svd(x.cast<double>());
    const auto& sigma = svd.singularValues();
    const double optimal = sigma.tail(sigma.size() - c.r).norm();

    dx::PowerIterationProjector proj(c.m, c.n, {.rank = c.r, .seed = 1});
    RowM out(c.m, c.n);
    for (int call = 0; call < 6; ++call) proj.approximate(view(x), view(out));
    EXPECT_LE(frob_error(x, out), 1.02 * optimal);
    const auto est = proj.singular_values();
    ASSERT_EQ(est.size(), static_cast<std::size_t>(c.r));
    for (int i = 0; i < c.r; ++i) EXPECT_NEAR(est[i], sigma[i], 0.05 * sigma[i]) << "sigma_" << i;
  }
}

TEST(PowerIterationProjector, TwoPhaseApiIsDeterministicAndEqualsApproximate) {
  const RowM x = with_spectrum(96, 64, geometric(64, 0.8), 3);
  dx::PowerIterationProjector a(96, 64, {.rank = 5, .seed = 9}), b(96, 64, {.rank = 5, .seed = 9}),
      c(96, 64, {.rank = 5, .seed = 9});
  RowM out_a(96, 64), out_b(96, 64), out_c(96, 64);
  a.approximate(view(x), view(out_a));
  for (auto* proj : {&b, &c}) {
    const auto p = proj->left(view(x));
    EXPECT_EQ(p.rows, 96u);
    EXPECT_EQ(p.cols, 5u);
    proj->orthonormalize_left();
    EXPECT_LT(orthonormality_error(p), 1e-5);
    const auto q = proj->right(view(x));
    EXPECT_EQ(q.rows, 64u);
    EXPECT_EQ(q.cols, 5u);
  }
  b.reconstruct(view(out_b));
  c.reconstruct(view(out_c));
  EXPECT_EQ(out_b, out_c);  // bit-identical: same seed, same operations (what replicas rely on)
  EXPECT_LT(frob_error(out_a, out_b), 1e-5 * x.norm());  // one sweep instead of two: rounding apart
}

TEST(PowerIterationProjector, ZeroMatrixGivesFiniteOrthonormalFactors) {
  const RowM x = RowM::Zero(40, 30);
  dx::PowerIterationProjector proj(40, 30, {.rank = 8});
  RowM out(40, 30);
  for (int call = 0; call < 3; ++call) {
    const auto p = proj.left(view(x));
    proj.orthonormalize_left();
    EXPECT_LT(orthonormality_error(p), 1e-5);
    proj.right(view(x));
    proj.reconstruct(view(out));
    ASSERT_TRUE(out.allFinite());
    EXPECT_EQ(out.norm(), 0.0f);
    for (float s : proj.singular_values()) EXPECT_EQ(s, 0.0f);
  }
  EXPECT_GT(proj.replaced_columns(), 0u);
}

TEST(PowerIterationProjector, RankOneMatrixAtRankEightIsExactAndFinite) {
  const RowM x = with_spectrum(50, 70, {3.0}, 5);
  dx::PowerIterationProjector proj(50, 70, {.rank = 8});
  RowM out(50, 70);
  for (int call = 0; call < 3; ++call) {
    const auto p = proj.left(view(x));
    proj.orthonormalize_left();
    EXPECT_LT(orthonormality_error(p), 1e-4);
    proj.right(view(x));
    proj.reconstruct(view(out));
    ASSERT_TRUE(out.allFinite());
    EXPECT_LT(frob_error(x, out), 1e-5 * x.norm());
    const auto s = proj.singular_values();
    EXPECT_NEAR(s[0], 3.0f, 1e-4f);
    for (int i = 1; i < 8; ++i) EXPECT_LT(s[i], 1e-5f);
  }
}

TEST(PowerIterationProjector, WarmStartBeatsColdStart) {
  const RowM x = with_spectrum(200, 200, geometric(200, 0.9), 11);
  dx::PowerIterationProjector warm(200, 200, {.rank = 8, .warm_start = true});
  dx::PowerIterationProjector cold(200, 200, {.rank = 8, .warm_start = false});
  RowM out_w(200, 200), out_c(200, 200);
  for (int call = 0; call < 5; ++call) {
    warm.approximate(view(x), view(out_w));
    cold.approximate(view(x), view(out_c));
  }
  EXPECT_LT(frob_error(x, out_w), 0.95 * frob_error(x, out_c));
}

TEST(PowerIterationProjector, SetRankKeepsLeadingDirections) {
  const RowM x = with_spectrum(128, 96, geometric(96, 0.75), 13);
  Eigen::BDCSVD<Eigen::MatrixXd> svd(x.cast<double>());
  const auto& sigma = svd.singularValues();
  dx::PowerIterationProjector proj(128, 96, {.rank = 8});
  RowM out(128, 96);
  for (int call = 0; call < 5; ++call) proj.approximate(view(x), view(out));
  proj.set_rank(4);
  EXPECT_EQ(proj.rank(), 4);
  proj.approximate(view(x), view(out));  // one call after shrinking: already near optimal
  EXPECT_LE(frob_error(x, out), 1.02 * sigma.tail(sigma.size() - 4).norm());
  proj.set_rank(12);
  for (int call = 0; call < 6; ++call) proj.approximate(view(x), view(out));
  ASSERT_TRUE(out.allFinite());
  EXPECT_LE(frob_error(x, out), 1.02 * sigma.tail(sigma.size() - 12).norm());
}

TEST(PowerIterationProjector, BadInputThrows) {
  EXPECT_THROW(dx::PowerIterationProjector(0, 5, {}), dx::Error);
  EXPECT_THROW(dx::PowerIterationProjector(10, 5, {.rank = 0}), dx::Error);
  EXPECT_THROW(dx::PowerIterationProjector(10, 5, {.rank = 6}), dx::Error);
  EXPECT_THROW(dx::PowerIterationProjector(10, 5, {.rank = 2, .epsilon = NAN}), dx::Error);
  dx::PowerIterationProjector proj(10, 5, {.rank = 2});
  RowM wrong(5, 10), out(10, 5);
  EXPECT_THROW(proj.left(view(wrong)), dx::Error);
  EXPECT_THROW(proj.right(view(wrong)), dx::Error);
  EXPECT_THROW(proj.reconstruct(view(wrong)), dx::Error);
  EXPECT_THROW(proj.step(view(wrong)), dx::Error);
  EXPECT_THROW(proj.approximate(view(wrong), view(out)), dx::Error);
  EXPECT_THROW(proj.set_rank(6), dx::Error);
}

// ---- step(): one sweep over X ---------------------------------------------------

namespace {

// Runs `calls` steps of `one` (step) and of `two` (left, orthonormalize_left, right)
// on x and checks after each that P is orthonormal and that both P and Q agree to
// `tol` relative to their norms. With `any_sign`, a column of P and Q may have the
// opposite sign in both (set_rank's eigenvectors have no preferred sign).
void expect_step_matches_two_sweeps(dx::PowerIterationProjector& one, dx::PowerIterationProjector& two,
                                    const RowM& x, int calls, double tol, bool any_sign = false) {
  const auto m = static_cast<Eigen::Index>(x.rows()), n = static_cast<Eigen::Index>(x.cols());
  const Eigen::Index r = one.rank();
  for (int call = 0; call < calls; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    one.step(view(x));
    two.left(view(x));
    two.orthonormalize_left();
    two.right(view(x));
    const Eigen::Map<const RowM> p1(one.left_factor().data(), m, r), p2(two.left_factor().data(), m, r);
    const Eigen::Map<const RowM> q1(one.right_factor().data(), n, r), q2(two.right_factor().data(), n, r);
    ASSERT_TRUE(p1.allFinite() && q1.allFinite());
    EXPECT_LT(orthonormality_error({one.left_factor().data(), static_cast<std::size_t>(m), static_cast<std::size_t>(r)}),
              1e-4);
    Eigen::VectorXf sign = Eigen::VectorXf::Ones(r);
    if (any_sign)
      for (Eigen::Index j = 0; j < r; ++j) sign[j] = p1.col(j).dot(p2.col(j)) < 0 ? -1.0f : 1.0f;
    const RowM p1s = p1 * sign.asDiagonal(), q1s = q1 * sign.asDiagonal();
    EXPECT_LE(frob_error(p1s, p2), tol * std::sqrt(static_cast<double>(r)));
    EXPECT_LE(frob_error(q1s, q2), tol * q2.norm() + 1e-6 * x.norm());
  }
}

}  // namespace

TEST(PowerIterationProjectorStep, MatchesTwoSweepsAtEveryRankAndShape) {
  struct Shape { int m, n; };
  for (const Shape s : {Shape{128, 96}, Shape{96, 128}, Shape{300, 70}, Shape{70, 300}, Shape{97, 131}}) {
    const int k = std::min(s.m, s.n);
    const RowM x = with_spectrum(s.m, s.n, geometric(k, 0.93), 17);
    for (int r = 1; r <= std::min(k, 64); ++r) {
      SCOPED_TRACE(std::to_string(s.m) + "x" + std::to_string(s.n) + " r=" + std::to_string(r));
      dx::PowerIterationProjector one(s.m, s.n, {.rank = r, .seed = 4}), two(s.m, s.n, {.rank = r, .seed = 4});
      expect_step_matches_two_sweeps(one, two, x, 4, 1e-4);
      EXPECT_EQ(one.replaced_columns(), two.replaced_columns());
    }
  }
}

TEST(PowerIterationProjectorStep, ReadsXOnceOnWarmWellConditionedSteps) {
  for (const int r : {1, 4, 7, 16, 33, 64}) {
    SCOPED_TRACE("r=" + std::to_string(r));
    const RowM x = with_spectrum(256, 200, geometric(200, 0.97), 23);
    dx::PowerIterationProjector proj(256, 200, {.rank = r, .seed = 2});
    proj.step(view(x));
    const auto after_first = proj.second_sweeps();  // from a random start R may be ill-conditioned
    for (int call = 0; call < 5; ++call) proj.step(view(x));
    EXPECT_EQ(proj.second_sweeps(), after_first);
    EXPECT_EQ(proj.replaced_columns(), 0u);
  }
}

TEST(PowerIterationProjectorStep, WithinSvdBoundOnLargerMatrices) {
  struct Case { int m, n, r; double ratio; };
  for (const Case c : {Case{600, 400, 4, 0.8}, Case{400, 600, 16, 0.9}, Case{512, 512, 64, 0.96}}) {
    SCOPED_TRACE(std::to_string(c.m) + "x" + std::to_string(c.n) + " r=" + std::to_string(c.r));
    const RowM x = with_spectrum(c.m, c.n, geometric(std::min(c.m, c.n), c.ratio), 29);
    Eigen::BDCSVD<Eigen::MatrixXd> svd(x.cast<double>());
    const auto& sigma = svd.singularValues();
    const double optimal = sigma.tail(sigma.size() - c.r).norm();
    dx::PowerIterationProjector one(c.m, c.n, {.rank = c.r, .seed = 3}), two(c.m, c.n, {.rank = c.r, .seed = 3});
    RowM out_one(c.m, c.n), out_two(c.m, c.n);
    for (int call = 0; call < 8; ++call) {
      one.approximate(view(x), view(out_one));
      two.left(view(x));
      two.orthonormalize_left();
      two.right(view(x));
      two.reconstruct(view(out_two));
    }
    const double e_one = frob_error(x, out_one), e_two = frob_error(x, out_two);
    EXPECT_LE(e_one, 1.02 * optimal);
    EXPECT_NEAR(e_one, e_two, 1e-5 * x.norm());  // the same error as the two-sweep iteration
  }
}

TEST(PowerIterationProjectorStep, ZeroMatrixFallsBackToASecondSweep) {
  const RowM x = RowM::Zero(40, 30);
  dx::PowerIterationProjector one(40, 30, {.rank = 8}), two(40, 30, {.rank = 8});
  RowM out(40, 30);
  for (int call = 0; call < 3; ++call) {
    one.approximate(view(x), view(out));
    ASSERT_TRUE(out.allFinite());
    EXPECT_EQ(out.norm(), 0.0f);
    EXPECT_LT(orthonormality_error({one.left_factor().data(), 40, 8}), 1e-5);
    for (float s : one.singular_values()) EXPECT_EQ(s, 0.0f);
    two.left(view(x));
    two.orthonormalize_left();
    two.right(view(x));
    // Every column was replaced, so step() read X twice, exactly as the two-sweep path.
    EXPECT_EQ(std::vector<float>(one.left_factor().begin(), one.left_factor().end()),
              std::vector<float>(two.left_factor().begin(), two.left_factor().end()));
  }
  EXPECT_EQ(one.second_sweeps(), 3u);
  EXPECT_EQ(one.replaced_columns(), two.replaced_columns());
}

TEST(PowerIterationProjectorStep, RankDeficientInputIsExactAndMatchesTwoSweeps) {
  for (const int rank_of_x : {1, 3}) {
    SCOPED_TRACE("rank(X)=" + std::to_string(rank_of_x));
    std::vector<double> s(rank_of_x);
    for (int i = 0; i < rank_of_x; ++i) s[i] = 3.0 - i;
    const RowM x = with_spectrum(50, 70, s, 5);
    dx::PowerIterationProjector one(50, 70, {.rank = 8}), two(50, 70, {.rank = 8});
    expect_step_matches_two_sweeps(one, two, x, 3, 1e-4);
    RowM out(50, 70);
    one.reconstruct(view(out));
    EXPECT_LT(frob_error(x, out), 1e-5 * x.norm());
    EXPECT_GT(one.replaced_columns(), 0u);
    EXPECT_EQ(one.second_sweeps(), 3u);  // a replaced column: Q = X^T P needs X again
  }
}

TEST(PowerIterationProjectorStep, IllConditionedSketchReadsXTwice) {
  // Spectrum 1, 0.1, 0.01, ...: the second sketch X X^T P weighs the top direction
  // ~1e6 times the fourth, so R's columns are nearly parallel (scaled inverse ~1e5 >
  // max_solve_amplification) although none vanishes: Q must come from X again.
  // Both paths orthonormalize that sketch, so their P differ by ~eps * cond (1e-2 in
  // the fourth column): compare what they approximate X with, not P itself.
  const std::vector<double> s = geometric(90, 0.1);
  const RowM x = with_spectrum(120, 90, s, 31);
  const double optimal = Eigen::Map<const Eigen::VectorXd>(s.data() + 4, 86).norm();
  dx::PowerIterationProjector one(120, 90, {.rank = 4, .seed = 6}), two(120, 90, {.rank = 4, .seed = 6});
  RowM out_one(120, 90), out_two(120, 90);
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    one.approximate(view(x), view(out_one));
    two.left(view(x));
    two.orthonormalize_left();
    two.right(view(x));
    two.reconstruct(view(out_two));
    EXPECT_LT(orthonormality_error({one.left_factor().data(), 120, 4}), 1e-4);
    // ~1e-4 each; rounding through that sketch moves it by ~1e-6 (build-dependent)
    EXPECT_NEAR(frob_error(x, out_one), frob_error(x, out_two), 1e-5 * x.norm());
  }
  EXPECT_LE(frob_error(x, out_one), 1.02 * optimal + 1e-6 * x.norm());
  EXPECT_GE(one.second_sweeps(), 1u);
  EXPECT_EQ(one.replaced_columns(), 0u);
}

TEST(PowerIterationProjectorStep, ColdStartMatchesTwoSweeps) {
  const RowM x = with_spectrum(150, 110, geometric(110, 0.9), 37);
  dx::PowerIterationProjector one(150, 110, {.rank = 6, .warm_start = false, .seed = 8});
  dx::PowerIterationProjector two(150, 110, {.rank = 6, .warm_start = false, .seed = 8});
  expect_step_matches_two_sweeps(one, two, x, 3, 1e-4);
}

TEST(PowerIterationProjectorStep, RankChangesKeepTheSweepConsistent) {
  const RowM x = with_spectrum(160, 140, geometric(140, 0.9), 41);
  dx::PowerIterationProjector one(160, 140, {.rank = 8, .seed = 1}), two(160, 140, {.rank = 8, .seed = 1});
  expect_step_matches_two_sweeps(one, two, x, 3, 1e-4);
  for (const int r : {3, 37, 12}) {
    SCOPED_TRACE("set_rank " + std::to_string(r));
    one.set_rank(r);
    two.set_rank(r);
    expect_step_matches_two_sweeps(one, two, x, 3, 1e-3, true);
  }
}

TEST(PowerIterationProjectorStep, ApproximateWritesTheSameProductAsReconstruct) {
  struct Case { int m, n, r; };
  for (const Case c : {Case{1, 1, 1}, Case{2, 9, 2}, Case{9, 2, 2}, Case{5, 3, 1}, Case{5, 3, 3}, Case{97, 131, 1}, Case{97, 131, 5}, Case{64, 200, 13},
                       Case{203, 77, 64}, Case{256, 256, 32}}) {
    SCOPED_TRACE(std::to_string(c.m) + "x" + std::to_string(c.n) + " r=" + std::to_string(c.r));
    const RowM x = with_spectrum(c.m, c.n, geometric(std::min(c.m, c.n), 0.9), 43);
    dx::PowerIterationProjector proj(c.m, c.n, {.rank = c.r, .seed = 2});
    RowM out(c.m, c.n), want(c.m, c.n);
    for (int call = 0; call < 2; ++call) {
      proj.approximate(view(x), view(out));
      proj.reconstruct(view(want));  // P Q^T by Eigen's GEMM, from the same factors
      ASSERT_TRUE(out.allFinite());
      EXPECT_LE(frob_error(out, want), 1e-6 * want.norm());
    }
  }
}

TEST(PowerIterationProjectorStep, ApproximateInPlace) {
  const RowM x = with_spectrum(90, 70, geometric(70, 0.8), 47);
  RowM y = x, out(90, 70);
  dx::PowerIterationProjector a(90, 70, {.rank = 6, .seed = 5}), b(90, 70, {.rank = 6, .seed = 5});
  a.approximate(view(x), view(out));
  b.approximate(view(y), view(y));  // out aliases x: X is read before X_hat is written
  EXPECT_EQ(y, out);
}

namespace {

// The mean of `replicas` replicas that all hold x, after `syncs` warm-started syncs of a
// fixed-rank int8 LowRankCompressor without error feedback (every rank's mean checked
// bit-identical).
RowM compressed_mean(const RowM& x, int rank, bool by_column, int replicas, int syncs) {
  const auto m = static_cast<std::size_t>(x.rows()), n = static_cast<std::size_t>(x.cols());
  std::vector<RowM> means(static_cast<std::size_t>(replicas), RowM(x.rows(), x.cols()));
  run_ranks(replicas, [&](dx::ThreadCommunicator& comm) {
    dx::LowRankCompressorConfig cfg;
    cfg.rank = rank, cfg.factor_quant.bits = 8, cfg.adaptive = false, cfg.error_feedback = false, cfg.min_ratio = 1;
    cfg.factor_blocks_by_column = by_column;
    dx::LowRankCompressor c(cfg);
    c.setup(std::vector<dx::TensorSpec>{{"w", dx::Shape{m, n}}});
    dx::AnyCommunicator any(comm);
    RowM& mean = means[static_cast<std::size_t>(comm.rank())];
    const std::vector<std::size_t> all{0};
    const std::vector<std::uint8_t> contributes(static_cast<std::size_t>(replicas), 1);
    for (int s = 0; s < syncs; ++s) {
      RowM in = x;
      std::vector<std::span<float>> xs{{in.data(), m * n}}, ms{{mean.data(), m * n}};
      c.sync(any, {all, contributes, static_cast<std::uint64_t>(s)}, xs, ms);
    }
  });
  for (const RowM& other : means) EXPECT_TRUE(other == means[0]) << "the replicas' means differ";
  return means[0];
}

}  // namespace

// Singular values 1/i: P's and Q's r columns differ in scale by up to r. Blocked by row,
// a block of 64 int8 values mixes the columns and the small ones lose their digits;
// blocked by column, the error is within 2% of the rank-r optimum (the SVD's).
TEST(LowRankCompressor, ColumnBlockedInt8FactorsKeepSteepSpectraNearOptimal) {
  const int m = 256, n = 192, r = 32;
  std::vector<double> s(n);
  for (int i = 0; i < n; ++i) s[static_cast<std::size_t>(i)] = 1.0 / (i + 1);
  const RowM x = with_spectrum(m, n, s, 7);
  double tail = 0;
  for (int i = r; i < n; ++i) tail += s[static_cast<std::size_t>(i)] * s[static_cast<std::size_t>(i)];
  const double optimal = std::sqrt(tail), norm = x.cast<double>().norm();
  const double by_column = frob_error(compressed_mean(x, r, true, 2, 8), x);
  const double by_row = frob_error(compressed_mean(x, r, false, 2, 8), x);
  EXPECT_LT(by_column, 1.02 * optimal) << "relative " << by_column / norm << ", optimum " << optimal / norm;
  EXPECT_GT(by_row, 1.2 * by_column) << "row blocks " << by_row / norm << ", column blocks " << by_column / norm;
}

// mean[j] aliasing x[j] (the DDP hook reduces a gradient in place): the same means, sync
// after sync, as separate buffers give, error feedback on, on 2 replicas with their own data.
TEST(LowRankCompressor, MeanIntoTheInputGivesTheSameMeansAsSeparateBuffers) {
  const std::size_t m = 96, n = 80, v = 24;
  std::vector<std::vector<float>> runs[2];
  for (int alias = 0; alias < 2; ++alias)
    run_ranks(2, [&](dx::ThreadCommunicator& comm) {
      dx::LowRankCompressorConfig cfg;
      cfg.rank = 4, cfg.adaptive = false;
      dx::LowRankCompressor c(cfg);
      c.setup(std::vector<dx::TensorSpec>{{"w", dx::Shape{m, n}}, {"b", dx::Shape{v}}});
      dx::AnyCommunicator any(comm);
      const std::vector<std::size_t> all{0, 1};
      const std::vector<std::uint8_t> contributes{1, 1};
      for (std::uint64_t s = 0; s < 4; ++s) {
        std::vector<float> w(m * n), b(v), mw(m * n), mb(v);
        for (std::size_t i = 0; i < w.size(); ++i) w[i] = dx::counter_normal(100 * s + comm.rank(), i);
        for (std::size_t i = 0; i < v; ++i) b[i] = dx::counter_normal(7 + 100 * s + comm.rank(), i);
        std::vector<std::span<float>> xs{w, b}, ms{mw, mb};
        if (alias) ms = xs;
        c.sync(any, {all, contributes, s}, xs, ms);
        if (comm.rank() == 0) {
          runs[alias].push_back(alias ? w : mw);
          runs[alias].push_back(alias ? b : mb);
        }
      }
    });
  ASSERT_EQ(runs[0].size(), 8u);
  for (std::size_t i = 0; i < runs[0].size(); ++i) EXPECT_TRUE(runs[0][i] == runs[1][i]) << "sync part " << i;
}
