// dilocox/lowrank.hpp: the PowerSGD power-iteration projector on the host (Eigen).
// Two-phase API so that P and Q can be reduced across replicas between the steps:
//   P = X Q  ->  reduce P  ->  P = orth(P)  ->  Q = X^T P  ->  reduce Q  ->  X_hat = P Q^T
// Orthonormalization is classical Gram-Schmidt applied twice, with columns that
// vanish (zero or rank-deficient input) replaced by deterministic random
// directions, so P stays orthonormal and finite and every replica that sees the same
// P computes the same result. No allocation after construction except in set_rank().
// Not here: quantization of the factors (quantize.hpp), device code (cuda/lowrank.cuh).
#pragma once

#include <Eigen/Core>
#include <Eigen/Eigenvalues>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>

#include "dilocox/config.hpp"
#include "dilocox/random.hpp"
#include "dilocox/state.hpp"
#include "dilocox/tensor.hpp"

namespace dilocox {

struct LowRankConfig {
  int rank = 4;
  bool warm_start = true;    // reuse Q from the last call (PowerSGD's warm start)
  std::uint64_t seed = 0;    // initial Q and replacement directions; same seed on every replica
  float epsilon = 1e-8f;     // a column with norm <= epsilon after orthogonalization is replaced
};

namespace detail {
using RowMatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The checks the host and device projectors share; `where` names the class.
inline void check_projector_config(std::size_t rows, std::size_t cols, const LowRankConfig& c, const std::string& where) {
  require(rows > 0 && cols > 0, where.c_str(),
          "matrix must be non-empty, got " + std::to_string(rows) + " x " + std::to_string(cols));
  require(std::isfinite(c.epsilon) && c.epsilon >= 0.0f, where.c_str(), "epsilon must be finite and >= 0");
}
inline int checked_projector_rank(std::size_t rows, std::size_t cols, int r, const std::string& where) {
  const std::size_t limit = std::min(rows, cols);
  require(r >= 1 && static_cast<std::size_t>(r) <= limit, where.c_str(),
          "rank must be in [1, " + std::to_string(limit) + "] for a " + std::to_string(rows) + " x " +
              std::to_string(cols) + " matrix, got " + std::to_string(r));
  return r;
}
// An input or output matrix: present, and (rows, cols).
template <class M>
void check_projector_operand(const M& m, std::size_t rows, std::size_t cols, const std::string& where,
                             const char* what) {
  require(m.rows == rows && m.cols == cols && m.data != nullptr, where.c_str(),
          std::string(what) + " is " + std::to_string(m.rows) + " x " + std::to_string(m.cols) + ", expected " +
              std::to_string(rows) + " x " + std::to_string(cols));
}

// A column vanished in orthonormalization (zero or dependent input) when its norm after
// is <= vanishing_norm(c) or <= dependent_fraction of its norm before. Shared by the
// host and device projectors.
inline constexpr float dependent_fraction = 1e-4f;
inline float vanishing_norm(const LowRankConfig& c) { return std::max(c.epsilon, std::numeric_limits<float>::min()); }

// The right factor q (cols, r0) resized to rank r: shrinking rotates it onto its
// singular directions and keeps the r largest; growing appends standard normal columns
// drawn from `seed` (advancing `draws`). Shared by the host and device projectors.
inline RowMatrixF resized_factor(const RowMatrixF& q, int r, std::uint64_t seed, std::uint64_t& draws) {
  const auto r0 = static_cast<int>(q.cols());
  const auto cols = static_cast<std::uint64_t>(q.rows());
  RowMatrixF src = q;
  if (r < r0) {
    Eigen::MatrixXd g = (q.transpose() * q).cast<double>();
    Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(g);
    const Eigen::MatrixXf v = es.eigenvectors().rowwise().reverse().leftCols(r).cast<float>();
    src = (q * v).eval();
  }
  RowMatrixF out = RowMatrixF::Zero(q.rows(), r);
  out.leftCols(std::min(r0, r)) = src.leftCols(std::min(r0, r));
  for (int j = r0; j < r; ++j)
    for (std::uint64_t i = 0; i < cols; ++i)
      out(static_cast<Eigen::Index>(i), j) = counter_normal(seed, (++draws) * cols + i);
  return out;
}
}  // namespace detail

class PowerIterationProjector {
 public:
  using RowMatrix = detail::RowMatrixF;
  // Salts of the random streams (the device projector draws the same numbers).
  static constexpr std::uint64_t replacement_salt = 0x5a17b9e3c1d2f4a6ULL;
  static constexpr std::uint64_t growth_salt = 0x2b7e151628aed2a6ULL;

  PowerIterationProjector(std::size_t rows, std::size_t cols, LowRankConfig config)
      : rows_(rows), cols_(cols), config_(config) {
    detail::check_projector_config(rows, cols, config, "PowerIterationProjector");
    resize(checked_rank(config.rank));
    fill_random(q_, 0);
  }

  std::size_t rows() const { return rows_; }
  std::size_t cols() const { return cols_; }
  int rank() const { return rank_; }
  const LowRankConfig& config() const { return config_; }

  // P = X Q. Returns P (rows, r) row-major, which the caller may reduce in place.
  MatrixView<float> left(MatrixView<const float> x) {
    check_input(x, "left");
    if (!config_.warm_start) fill_random(q_, ++draws_);
    p_.noalias() = map(x) * q_;
    return {p_.data(), rows_, static_cast<std::size_t>(rank_)};
  }

  // P <- an orthonormal basis of span(P), column by column (P is reduced by now).
  void orthonormalize_left() {
    pc_ = p_;  // column-major copy: contiguous columns for the dot products
    const float tiny = detail::vanishing_norm(config_);
    for (int j = 0; j < rank_; ++j) {
      auto v = pc_.col(j);
      const float before = v.norm();
      float after = orthogonalize_twice(j);
      if (!(after > tiny && after > detail::dependent_fraction * before)) {  // also catches NaN
        for (Eigen::Index i = 0; i < v.size(); ++i)
          v[i] = counter_normal(config_.seed ^ replacement_salt, (draws_ * rank_ + j) * rows_ + i);
        ++replacements_;
        after = orthogonalize_twice(j);
      }
      v /= after;
    }
    p_ = pc_;
    ++draws_;
  }

  // Q = X^T P. Returns Q (cols, r) row-major, which the caller may reduce in place.
  MatrixView<float> right(MatrixView<const float> x) {
    check_input(x, "right");
    q_.noalias() = map(x).transpose() * p_;
    return {q_.data(), cols_, static_cast<std::size_t>(rank_)};
  }

  // out = P Q^T, (rows, cols) row-major.
  void reconstruct(MatrixView<float> out) const {
    detail::check_projector_operand(out, rows_, cols_, "PowerIterationProjector::reconstruct", "output");
    Eigen::Map<RowMatrix>(out.data, rows_, cols_).noalias() = p_ * q_.transpose();
  }

  // All four steps in one process: out = the rank-r approximation of x.
  void approximate(MatrixView<const float> x, MatrixView<float> out) {
    left(x);
    orthonormalize_left();
    right(x);
    reconstruct(out);
  }

  // Estimates of the top r singular values of X, descending: the singular values of
  // the current Q (valid once P is orthonormal, i.e. after right()). After Q has
  // been reduced they estimate the reduced matrix.
  std::span<const float> singular_values() const {
    gram_f_.noalias() = q_.transpose() * q_;
    gram_ = gram_f_.cast<double>();
    eigen_->compute(gram_, Eigen::EigenvaluesOnly);
    const auto& lambda = eigen_->eigenvalues();  // ascending
    for (int i = 0; i < rank_; ++i) sigma_[i] = static_cast<float>(std::sqrt(std::max(0.0, lambda[rank_ - 1 - i])));
    return {sigma_.data(), static_cast<std::size_t>(rank_)};
  }

  // ||Q||_F^2 = the energy the sketch captures (sum of sigma_i^2).
  double sketch_energy() const { return static_cast<double>(q_.squaredNorm()); }

  // Changes the rank. Shrinking keeps Q's leading singular directions; growing adds
  // random directions. Allocates.
  void set_rank(int r) {
    r = checked_rank(r);
    if (r == rank_) return;
    RowMatrix q = detail::resized_factor(q_, r, config_.seed ^ growth_salt, draws_);
    resize(r);
    q_ = q;
    config_.rank = r;
  }

  // The factors as flat row-major buffers, e.g. to write a reduced mean back.
  std::span<float> left_factor() { return {p_.data(), static_cast<std::size_t>(p_.size())}; }
  std::span<float> right_factor() { return {q_.data(), static_cast<std::size_t>(q_.size())}; }

  // The warm start and the random-draw counters (what the next call depends on).
  void save_state(StateWriter& w) const {
    w.value<std::int32_t>(rank_);
    w.value(draws_);
    w.value(replacements_);
    w.values(std::span<const float>(q_.data(), static_cast<std::size_t>(q_.size())));
  }
  void load_state(StateReader& r) {
    const int rank = r.value<std::int32_t>();
    if (rank != rank_) resize(checked_rank(rank)), config_.rank = rank;
    draws_ = r.value<std::uint64_t>();
    replacements_ = r.value<std::uint64_t>();
    r.values(std::span<float>(q_.data(), static_cast<std::size_t>(q_.size())));
  }

  // How many columns orthonormalize_left() replaced so far (diagnostics).
  std::uint64_t replaced_columns() const { return replacements_; }

 private:
  int checked_rank(int r) const { return detail::checked_projector_rank(rows_, cols_, r, "PowerIterationProjector"); }

  void resize(int r) {
    rank_ = r;
    const auto m = static_cast<Eigen::Index>(rows_), n = static_cast<Eigen::Index>(cols_);
    p_.setZero(m, r);
    pc_.setZero(m, r);
    q_.setZero(n, r);
    coef_.setZero(r);
    gram_f_.setZero(r, r);
    gram_.setZero(r, r);
    eigen_.emplace(r);  // constructed in place: Eigen leaves its status unset until compute()
    sigma_.setZero(r);
  }

  void fill_random(RowMatrix& m, std::uint64_t draw) const {
    const auto n = static_cast<std::uint64_t>(m.size());
    for (std::uint64_t i = 0; i < n; ++i) m.data()[i] = counter_normal(config_.seed, draw * n + i);
  }

  // Removes from column j its components along columns [0, j), twice; returns its norm.
  float orthogonalize_twice(int j) {
    auto v = pc_.col(j);
    for (int pass = 0; pass < 2 && j > 0; ++pass) {
      auto basis = pc_.leftCols(j);
      coef_.head(j).noalias() = basis.transpose() * v;
      v.noalias() -= basis * coef_.head(j);
    }
    return v.norm();
  }

  void check_input(MatrixView<const float> x, const char* step) const {
    detail::check_projector_operand(x, rows_, cols_, std::string("PowerIterationProjector::") + step, "input");
  }

  Eigen::Map<const RowMatrix> map(MatrixView<const float> x) const {
    return {x.data, static_cast<Eigen::Index>(x.rows), static_cast<Eigen::Index>(x.cols)};
  }

  std::size_t rows_, cols_;
  LowRankConfig config_;
  int rank_ = 0;
  std::uint64_t draws_ = 0;         // random draws so far (advances identically on every replica)
  std::uint64_t replacements_ = 0;
  RowMatrix p_;                     // (rows, r) row-major: the left factor
  RowMatrix q_;                     // (cols, r) row-major: the right factor, warm start
  Eigen::MatrixXf pc_;              // (rows, r) column-major: orthonormalization workspace
  Eigen::VectorXf coef_;            // (r) projection coefficients
  mutable Eigen::MatrixXf gram_f_;  // (r, r) Q^T Q
  mutable Eigen::MatrixXd gram_;    // (r, r) Q^T Q in double
  mutable std::optional<Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>> eigen_;  // workspace for (r, r)
  mutable Eigen::VectorXf sigma_;   // (r) singular value estimates, descending
};

}  // namespace dilocox
