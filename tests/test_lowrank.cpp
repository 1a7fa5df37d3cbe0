// PowerIterationProjector against Eigen's SVD: near-optimal rank-r error and singular
// values on decaying spectra, orthonormal finite factors on degenerate input,
// warm start, rank changes, determinism and rejected input.
#include <dilocox/lowrank.hpp>
#include <gtest/gtest.h>

#include <Eigen/QR>
#include <Eigen/SVD>
#include <cmath>
#include <vector>

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

TEST(PowerIterationProjector, TwoPhaseApiEqualsApproximate) {
  const RowM x = with_spectrum(96, 64, geometric(64, 0.8), 3);
  dx::PowerIterationProjector a(96, 64, {.rank = 5, .seed = 9}), b(96, 64, {.rank = 5, .seed = 9});
  RowM out_a(96, 64), out_b(96, 64);
  a.approximate(view(x), view(out_a));
  const auto p = b.left(view(x));
  EXPECT_EQ(p.rows, 96u);
  EXPECT_EQ(p.cols, 5u);
  b.orthonormalize_left();
  EXPECT_LT(orthonormality_error(p), 1e-5);
  const auto q = b.right(view(x));
  EXPECT_EQ(q.rows, 64u);
  EXPECT_EQ(q.cols, 5u);
  b.reconstruct(view(out_b));
  EXPECT_EQ(out_a, out_b);  // bit-identical: same seed, same operations
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
  EXPECT_THROW(proj.set_rank(6), dx::Error);
}
