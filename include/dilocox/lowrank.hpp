// dilocox/lowrank.hpp: the PowerSGD power-iteration projector on the host (Eigen).
// Two-phase API so that P and Q can be reduced across replicas between the steps:
//   P = X Q  ->  reduce P  ->  P = orth(P)  ->  Q = X^T P  ->  reduce Q  ->  X_hat = P Q^T
// and, for one process, step(): the same iteration reading X once (P = X Q and X^T P
// from one sweep, Q = X^T P R^-1). Orthonormalization is classical Gram-Schmidt twice;
// columns that vanish (zero or rank-deficient input) become deterministic random
// directions, so P stays orthonormal and finite and replicas that see the same P agree.
// No allocation after construction except in set_rank().
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

// ---- One sweep over X: P = X Q and W^T = P^T X from the same rows ----------------
// The one-process step reads X from memory once: each block of rows (sized to stay
// in cache) gives its rows of P = X Q (dot products along the rows), then adds
// P_b^T X_b to W^T, reading the block again from cache. Written with Eigen's packet
// primitives, so the kernels vectorize with whatever SIMD the consumer compiles for
// (scalars under EIGEN_DONT_VECTORIZE). The tile sizes and the rules below were
// measured on one AVX2 core (Zen 3); docs/RESULTS.md has the figures.
using PacketF = Eigen::internal::packet_traits<float>::type;
inline constexpr std::size_t packet_floats = sizeof(PacketF) / sizeof(float);  // 1 without SIMD
inline constexpr std::size_t pack_width = 3 * packet_floats;  // columns per tile of W^T and of packed rows
// Rows per block: about this many bytes of X, and at least 16 (32 from rank 16 on), so
// that each tile of W^T is loaded and stored once per that many rows.
inline constexpr std::size_t sweep_block_bytes = 256 << 10;
// Dot products run over whole rows (one stream per row for the prefetcher) up to this
// rank; above it, over chunks of sweep_depth columns, which stay in L2 between the
// column tiles that re-read them.
inline constexpr std::size_t whole_row_rank = 16;
inline constexpr std::size_t sweep_depth = 1024;
// From this rank on, W^T's kernel reads the block from a contiguous copy: it re-reads
// each tile of X r/4 times, and rows a power of two apart collide in L1.
inline constexpr std::size_t pack_rank = 32;
// left() alone (not in a sweep) runs left_rows() up to this rank and Eigen's GEMM above
// it: 2048 x 2048 on one AVX-512 core, rank 4 0.9 against 1.9 ms, rank 16 4.3 against 2.0.
inline constexpr std::size_t row_left_rank = 8;

// Keeps a packet in a register. GCC otherwise folds its load into each FMA that uses
// it, which makes the kernels load-bound (Eigen's GEBP kernel does the same).
inline void pin(PacketF& v) {
#if defined(__GNUC__) && defined(__SSE2__) && !defined(EIGEN_DONT_VECTORIZE)
  __asm__("" : "+x"(v));
#else
  (void)v;
#endif
}

// The rows [0, b) of a block, copied for right_rows(): the tile of columns
// [t w, t w + w) (w = pack_width) of row i sits at data[(t b + i) w]. Columns from
// `end` on are not copied (end = 0: nothing is).
struct PackedRows {
  float* data;      // (tiles * b, w) row-major, host
  std::size_t b;    // rows in the block
  std::size_t end;  // columns copied: a multiple of pack_width
  float* at(std::size_t i, std::size_t col) const {
    return data + ((col / pack_width) * b + i) * pack_width + col % pack_width;
  }
};

// p(i, c) += sum_k x(i, k) qt(c, k) over k < len, for RT rows of x and CT rows of qt.
// Not inlined: its callers' context made GCC spill the accumulators.
template <int RT, int CT>
EIGEN_DONT_INLINE void dot_tile(const float* x, std::size_t ldx, const float* qt, std::size_t ldq, std::size_t len,
                                float* p, std::size_t ldp) {
  namespace ei = Eigen::internal;
  PacketF acc[RT][CT];
  for (auto& row : acc)
    for (auto& a : row) a = ei::pset1<PacketF>(0.0f);
  std::size_t k = 0;
  for (; k + packet_floats <= len; k += packet_floats) {
    PacketF q[CT];
    for (int c = 0; c < CT; ++c) q[c] = ei::ploadu<PacketF>(qt + c * ldq + k), pin(q[c]);
    for (int i = 0; i < RT; ++i) {
      PacketF xv = ei::ploadu<PacketF>(x + i * ldx + k);
      pin(xv);
      for (int c = 0; c < CT; ++c) acc[i][c] = ei::pmadd(xv, q[c], acc[i][c]);
    }
  }
  for (int i = 0; i < RT; ++i)
    for (int c = 0; c < CT; ++c) {
      float s = ei::predux(acc[i][c]);
      for (std::size_t t = k; t < len; ++t) s += x[i * ldx + t] * qt[c * ldq + t];
      p[i * ldp + c] += s;
    }
}

// dot_tile over the b rows of x for CT rows of qt: pairs of rows, then the last one.
template <int CT>
inline void dot_col_tile(const float* x, std::size_t b, std::size_t ldx, const float* qt, std::size_t ldq,
                         std::size_t len, float* p, std::size_t ldp) {
  std::size_t i = 0;
  for (; i + 2 <= b; i += 2) dot_tile<2, CT>(x + i * ldx, ldx, qt, ldq, len, p + i * ldp, ldp);
  if (i < b) dot_tile<1, CT>(x + i * ldx, ldx, qt, ldq, len, p + i * ldp, ldp);
}

// p (b, r) row-major = x (b, n) row-major times qt^T, qt (r, n) row-major. Column tiles
// outside row tiles: a tile of qt stays in L1 while the block's rows stream past it.
inline void left_rows(const float* x, std::size_t b, std::size_t n, const float* qt, std::size_t r, float* p) {
  std::fill(p, p + b * r, 0.0f);
  const std::size_t depth = r <= whole_row_rank ? n : sweep_depth;
  for (std::size_t k0 = 0; k0 < n; k0 += depth) {
    const std::size_t len = std::min(depth, n - k0);
    std::size_t c = 0;
    for (; c + 4 <= r; c += 4) dot_col_tile<4>(x + k0, b, n, qt + c * n + k0, n, len, p + c, r);
    switch (r - c) {
      case 3: dot_col_tile<3>(x + k0, b, n, qt + c * n + k0, n, len, p + c, r); break;
      case 2: dot_col_tile<2>(x + k0, b, n, qt + c * n + k0, n, len, p + c, r); break;
      case 1: dot_col_tile<1>(x + k0, b, n, qt + c * n + k0, n, len, p + c, r); break;
      default: break;
    }
  }
}

// Copies the whole tiles of the rows of x (pack.b, n) row-major into pack.
inline void pack_rows(const float* x, std::size_t n, const PackedRows& pack) {
  namespace ei = Eigen::internal;
  for (std::size_t i = 0; i < pack.b; ++i) {
    float* dst = pack.at(i, 0);
    for (std::size_t k = 0; k < pack.end; k += pack_width, dst += pack.b * pack_width)
      for (std::size_t v = 0; v < pack_width; v += packet_floats)
        ei::pstoreu(dst + v, ei::ploadu<PacketF>(x + i * n + k + v));
  }
}

// wt(c, k) += sum_i p(i, c) x(i, k) over i < b, for CT rows of wt and KV packets of k.
template <int CT, int KV>
EIGEN_DONT_INLINE void axpy_tile(const float* x, std::size_t ldx, std::size_t b, const float* p, std::size_t ldp,
                                 float* wt, std::size_t ldw) {
  namespace ei = Eigen::internal;
  PacketF acc[CT][KV];
  for (auto& row : acc)
    for (auto& a : row) a = ei::pset1<PacketF>(0.0f);
  for (std::size_t i = 0; i < b; ++i) {
    PacketF xv[KV];
    for (int v = 0; v < KV; ++v) xv[v] = ei::ploadu<PacketF>(x + i * ldx + v * packet_floats), pin(xv[v]);
    for (int c = 0; c < CT; ++c) {
      const PacketF pc = ei::pset1<PacketF>(p[i * ldp + c]);
      for (int v = 0; v < KV; ++v) acc[c][v] = ei::pmadd(pc, xv[v], acc[c][v]);
    }
  }
  for (int c = 0; c < CT; ++c)
    for (int v = 0; v < KV; ++v) {
      float* w = wt + c * ldw + v * packet_floats;
      ei::pstoreu(w, ei::padd(ei::ploadu<PacketF>(w), acc[c][v]));
    }
}

// axpy_tile over the r columns of p: tiles of 4, then the remainder.
template <int KV>
inline void axpy_col_tile(const float* x, std::size_t ldx, std::size_t b, const float* p, std::size_t r, float* wt,
                          std::size_t ldw) {
  std::size_t c = 0;
  for (; c + 4 <= r; c += 4) axpy_tile<4, KV>(x, ldx, b, p + c, r, wt + c * ldw, ldw);
  switch (r - c) {
    case 3: axpy_tile<3, KV>(x, ldx, b, p + c, r, wt + c * ldw, ldw); break;
    case 2: axpy_tile<2, KV>(x, ldx, b, p + c, r, wt + c * ldw, ldw); break;
    case 1: axpy_tile<1, KV>(x, ldx, b, p + c, r, wt + c * ldw, ldw); break;
    default: break;
  }
}

// wt (r, n) row-major += p^T x, p (b, r) and x (b, n) row-major; columns [0, pack.end)
// of x are read from its packed copy.
inline void right_rows(const float* x, std::size_t b, std::size_t n, const float* p, std::size_t r, float* wt,
                       const PackedRows& pack) {
  std::size_t k = 0;
  for (; k < pack.end; k += pack_width) axpy_col_tile<3>(pack.at(0, k), pack_width, b, p, r, wt + k, n);
  for (; k + pack_width <= n; k += pack_width) axpy_col_tile<3>(x + k, n, b, p, r, wt + k, n);
  for (; k + packet_floats <= n; k += packet_floats) axpy_col_tile<1>(x + k, n, b, p, r, wt + k, n);
  for (; k < n; ++k)
    for (std::size_t c = 0; c < r; ++c) {
      float s = 0.0f;
      for (std::size_t i = 0; i < b; ++i) s += p[i * r + c] * x[i * n + k];
      wt[c * n + k] += s;
    }
}

// ---- X_hat = P Q^T, each element written once --------------------------------------

// out(i, k) = sum_c p(i, c) qt(c, k) for RT rows and KV packets of k, summed over c < r.
template <int RT, int KV>
EIGEN_DONT_INLINE void outer_tile(const float* p, std::size_t ldp, const float* qt, std::size_t ldq, std::size_t r,
                                  float* out, std::size_t ldo) {
  namespace ei = Eigen::internal;
  PacketF acc[RT][KV];
  for (auto& row : acc)
    for (auto& a : row) a = ei::pset1<PacketF>(0.0f);
  for (std::size_t c = 0; c < r; ++c) {
    PacketF qv[KV];
    for (int v = 0; v < KV; ++v) qv[v] = ei::ploadu<PacketF>(qt + c * ldq + v * packet_floats), pin(qv[v]);
    for (int i = 0; i < RT; ++i) {
      const PacketF pc = ei::pset1<PacketF>(p[i * ldp + c]);
      for (int v = 0; v < KV; ++v) acc[i][v] = ei::pmadd(pc, qv[v], acc[i][v]);
    }
  }
  for (int i = 0; i < RT; ++i)
    for (int v = 0; v < KV; ++v) ei::pstoreu(out + i * ldo + v * packet_floats, acc[i][v]);
}

// outer_tile over columns [k0, k1) of RT rows: tiles of pack_width, of one packet, then scalars.
template <int RT>
inline void outer_row_tile(const float* p, std::size_t r, const float* qt, std::size_t n, std::size_t k0,
                           std::size_t k1, float* out) {
  std::size_t k = k0;
  for (; k + pack_width <= k1; k += pack_width) outer_tile<RT, 3>(p, r, qt + k, n, r, out + k, n);
  for (; k + packet_floats <= k1; k += packet_floats) outer_tile<RT, 1>(p, r, qt + k, n, r, out + k, n);
  for (; k < k1; ++k)
    for (int i = 0; i < RT; ++i) {
      float s = 0.0f;
      for (std::size_t c = 0; c < r; ++c) s += p[i * r + c] * qt[c * n + k];
      out[i * n + k] = s;
    }
}

// out (m, n) row-major = p (m, r) row-major times qt (r, n) row-major, by chunks of
// columns whose rows of qt (256 KiB of them, half a Zen 3 L2) stay in cache while every
// row of out is written. At small rank a chunk is whole rows, so out is written front
// to back: 2048 x 2048 at rank 4 took ~12% longer by chunks of 512 columns (the writes
// come back to every page four times).
inline void outer_rows(const float* p, std::size_t m, std::size_t r, const float* qt, std::size_t n, float* out) {
  constexpr std::size_t qt_floats = (std::size_t{256} << 10) / sizeof(float);  // 256 KiB of qt
  const std::size_t chunk = std::max<std::size_t>(512, qt_floats / std::max<std::size_t>(r, 1));
  for (std::size_t k0 = 0; k0 < n; k0 += chunk) {
    const std::size_t k1 = std::min(n, k0 + chunk);
    std::size_t i = 0;
    for (; i + 4 <= m; i += 4) outer_row_tile<4>(p + i * r, r, qt, n, k0, k1, out + i * n);
    for (; i < m; ++i) outer_row_tile<1>(p + i * r, r, qt, n, k0, k1, out + i * n);
  }
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
    const auto r = static_cast<std::size_t>(rank_);
    if (r <= detail::row_left_rank) {
      qt_ = q_.transpose();
      detail::left_rows(x.data, rows_, cols_, qt_.data(), r, p_.data());
    } else {
      p_.noalias() = map(x) * q_;
    }
    return {p_.data(), rows_, r};
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
      r_(j, j) = after;
      v /= after;
    }
    p_ = pc_;
    ++draws_;
  }

  // Q = X^T P. Returns Q (cols, r) row-major, which the caller may reduce in place.
  MatrixView<float> right(MatrixView<const float> x) {
    check_input(x, "right");
    sweep(x, false);
    q_ = wt_.transpose();
    return {q_.data(), cols_, static_cast<std::size_t>(rank_)};
  }

  // out = P Q^T, (rows, cols) row-major.
  void reconstruct(MatrixView<float> out) const {
    detail::check_projector_operand(out, rows_, cols_, "PowerIterationProjector::reconstruct", "output");
    qt_ = q_.transpose();
    detail::outer_rows(p_.data(), rows_, static_cast<std::size_t>(rank_), qt_.data(), cols_, out.data);
  }

  // left, orthonormalize_left and right in one process, reading X once: one sweep
  // gives P = X Q and W = X^T P together; P = P_orth R (Gram-Schmidt, as above) and
  // Q = X^T P_orth = W R^-1. Same subspace iteration and, to rounding, the same P and
  // Q as the three calls. Not for replicas: there Q must be computed from the reduced
  // P, which needs a second sweep (the two-phase API). Steps where orthonormalization
  // replaced a column (zero or rank-deficient input) or where R would amplify
  // rounding more than max_solve_amplification read X a second time (Q = X^T P).
  void step(MatrixView<const float> x) {
    check_input(x, "step");
    if (!config_.warm_start) fill_random(q_, ++draws_);
    sweep(x, true);
    const std::uint64_t replaced_before = replacements_;
    orthonormalize_left();
    if (replacements_ != replaced_before || !right_from_sweep()) {
      right(x);
      ++second_sweeps_;
    }
  }

  // step() and out = P Q^T: the rank-r approximation of x, one process.
  void approximate(MatrixView<const float> x, MatrixView<float> out) {
    detail::check_projector_operand(out, rows_, cols_, "PowerIterationProjector::approximate", "output");
    step(x);
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
  // How many step() calls read X a second time (diagnostics).
  std::uint64_t second_sweeps() const { return second_sweeps_; }

  // The bound on ||R_s^-1||_F (R with unit columns) under which step() takes Q from its
  // sweep: Q = W R^-1 then adds at most about this times the rounding of X^T P.
  static constexpr float max_solve_amplification = 100.0f;

 private:
  int checked_rank(int r) const { return detail::checked_projector_rank(rows_, cols_, r, "PowerIterationProjector"); }

  void resize(int r) {
    rank_ = r;
    const auto m = static_cast<Eigen::Index>(rows_), n = static_cast<Eigen::Index>(cols_);
    p_.setZero(m, r);
    pc_.setZero(m, r);
    q_.setZero(n, r);
    coef_.setZero(r);
    qt_.setZero(r, n);
    wt_.setZero(r, n);
    packed_.setZero(r >= static_cast<int>(detail::pack_rank) ? static_cast<Eigen::Index>(sweep_block_rows() * cols_) : 0);
    r_.setZero(r, r);
    rinv_.setZero(r, r);
    rinv_f_.setZero(r, r);
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
  // Their sum goes to R(0:j, j), so that P before = P after * R (R upper triangular).
  float orthogonalize_twice(int j) {
    auto v = pc_.col(j);
    auto rj = r_.col(j);
    rj.setZero();
    for (int pass = 0; pass < 2 && j > 0; ++pass) {
      auto basis = pc_.leftCols(j);
      coef_.head(j).noalias() = basis.transpose() * v;
      v.noalias() -= basis * coef_.head(j);
      rj.head(j) += coef_.head(j);
    }
    return v.norm();
  }

  // wt_ = p_^T X by blocks of rows; with_left: also p_ = X q_ first in each block, so
  // that one sweep over X gives both products (a block stays in cache between them).
  void sweep(MatrixView<const float> x, bool with_left) {
    const std::size_t n = cols_, r = static_cast<std::size_t>(rank_);
    const std::size_t block = sweep_block_rows();
    const std::size_t packed_cols = r >= detail::pack_rank ? n / detail::pack_width * detail::pack_width : 0;
    if (with_left) qt_ = q_.transpose();
    wt_.setZero();
    for (std::size_t i0 = 0; i0 < rows_; i0 += block) {
      const std::size_t b = std::min(block, rows_ - i0);
      const float* xb = x.data + i0 * n;
      float* pb = p_.data() + i0 * r;
      const detail::PackedRows pack{packed_.data(), b, packed_cols};
      if (with_left) detail::left_rows(xb, b, n, qt_.data(), r, pb);
      detail::pack_rows(xb, n, pack);
      detail::right_rows(xb, b, n, pb, r, wt_.data(), pack);
    }
  }

  std::size_t sweep_block_rows() const {
    const std::size_t min_rows = static_cast<std::size_t>(rank_) >= detail::whole_row_rank ? 32 : 16;
    return std::min(rows_, std::max(min_rows, detail::sweep_block_bytes / (cols_ * sizeof(float))));
  }

  // Q = W R^-1 (W = wt_^T, R from orthonormalize_left), unless R is too ill-conditioned
  // for that: then returns false and leaves q_ as it was.
  bool right_from_sweep() {
    // R^-1 by back substitution (in double; Eigen's triangular solvers do not build under nvcc).
    rinv_.setZero();
    for (int j = rank_ - 1; j >= 0; --j) {
      rinv_(j, j) = 1.0 / r_(j, j);
      for (int i = j - 1; i >= 0; --i) {
        double s = 0.0;
        for (int l = i + 1; l <= j; ++l) s += static_cast<double>(r_(i, l)) * rinv_(l, j);
        rinv_(i, j) = -s / r_(i, i);
      }
    }
    double amplification = 0.0;  // ||R_s^-1||_F^2, R_s^-1 = diag(|R(:, j)|) R^-1
    for (int j = 0; j < rank_; ++j)
      amplification += static_cast<double>(r_.col(j).squaredNorm()) * rinv_.row(j).squaredNorm();
    if (!(std::sqrt(amplification) <= max_solve_amplification)) return false;  // also catches NaN
    rinv_f_ = rinv_.cast<float>();
    q_.noalias() = Eigen::Map<const Eigen::MatrixXf>(wt_.data(), static_cast<Eigen::Index>(cols_), rank_) * rinv_f_;
    return true;
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
  std::uint64_t second_sweeps_ = 0;
  RowMatrix p_;                     // (rows, r) row-major: the left factor
  RowMatrix q_;                     // (cols, r) row-major: the right factor, warm start
  Eigen::MatrixXf pc_;              // (rows, r) column-major: orthonormalization workspace
  Eigen::VectorXf coef_;            // (r) projection coefficients
  Eigen::MatrixXf r_;               // (r, r) upper triangular: P before orthonormalization = P after * R
  Eigen::MatrixXd rinv_;            // (r, r) R^-1
  Eigen::MatrixXf rinv_f_;          // (r, r) R^-1 in float, for Q = W R^-1
  mutable RowMatrix qt_;            // (r, cols) row-major: Q^T, read by left(), the sweep and reconstruct()
  RowMatrix wt_;                    // (r, cols) row-major: W^T = P^T X, summed by the sweep
  Eigen::VectorXf packed_;          // (block rows * cols) from pack_rank on, else empty: a block of X the sweep copies
  mutable Eigen::MatrixXf gram_f_;  // (r, r) Q^T Q
  mutable Eigen::MatrixXd gram_;    // (r, r) Q^T Q in double
  mutable std::optional<Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>> eigen_;  // workspace for (r, r)
  mutable Eigen::VectorXf sigma_;   // (r) singular value estimates, descending
};

}  // namespace dilocox
