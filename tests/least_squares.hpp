// Test helper: a problem with a known answer for OuterLoop. Replica k minimizes
//   L_k(W, b) = ||X_k W^T + 1 b^T - Y_k||^2 / (2 N)
// with its own data (targets from a replica-specific W_k*), by full-batch AdamW.
// The global optimum of mean_k L_k comes from the normal equations in double.
#pragma once

#include <dilocox/random.hpp>

#include <Eigen/Dense>
#include <cmath>
#include <vector>

struct LeastSquares {
  int k, din, dout, n;
  std::vector<Eigen::MatrixXf> x, y;  // (n, din), (n, dout) per replica
  Eigen::MatrixXd w_opt;              // (dout, din)
  Eigen::VectorXd b_opt;              // (dout)

  LeastSquares(int replicas, int din_, int dout_, int samples, float heterogeneity, std::uint64_t seed)
      : k(replicas), din(din_), dout(dout_), n(samples) {
    auto normal = [&](std::uint64_t s, Eigen::Index rows, Eigen::Index cols) {
      Eigen::MatrixXf m(rows, cols);
      for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = dilocox::counter_normal(s, static_cast<std::uint64_t>(i));
      return m;
    };
    // A shared low-rank-plus-small-noise target, and a small replica-specific shift.
    const Eigen::MatrixXf w_star = normal(seed, dout, 4) * normal(seed + 1, 4, din) / 2.0f + 0.05f * normal(seed + 2, dout, din);
    Eigen::MatrixXd ata = Eigen::MatrixXd::Zero(din + 1, din + 1), aty = Eigen::MatrixXd::Zero(din + 1, dout);
    for (int r = 0; r < k; ++r) {
      const Eigen::MatrixXf xr = normal(seed + 10 + r, n, din);
      const Eigen::MatrixXf wr = w_star + heterogeneity * normal(seed + 50 + r, dout, din);
      const Eigen::VectorXf br = Eigen::VectorXf::Constant(dout, 0.5f) + heterogeneity * normal(seed + 90 + r, dout, 1);
      Eigen::MatrixXf yr = xr * wr.transpose();
      yr.rowwise() += br.transpose();
      yr += 0.01f * normal(seed + 130 + r, n, dout);
      Eigen::MatrixXd a(n, din + 1);
      a << xr.cast<double>(), Eigen::MatrixXd::Ones(n, 1);
      ata += a.transpose() * a;
      aty += a.transpose() * yr.cast<double>();
      x.push_back(xr);
      y.push_back(yr);
    }
    const Eigen::MatrixXd sol = ata.ldlt().solve(aty);  // (din + 1, dout)
    w_opt = sol.topRows(din).transpose();
    b_opt = sol.row(din).transpose();
  }

  // Relative distance of (W, b) to the optimum.
  double distance(const float* w, const float* b) const {
    const Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> wm(w, dout, din);
    const Eigen::Map<const Eigen::VectorXf> bv(b, dout);
    const double num = (wm.cast<double>() - w_opt).squaredNorm() + (bv.cast<double>() - b_opt).squaredNorm();
    const double den = w_opt.squaredNorm() + b_opt.squaredNorm();
    return std::sqrt(num / den);
  }
};

// One replica's model and AdamW state (weight decay 0: the optimum is unregularized).
struct LeastSquaresReplica {
  using RowM = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const LeastSquares* p;
  int r;
  RowM w;             // (dout, din) row-major: the tensor OuterLoop sees
  Eigen::VectorXf b;  // (dout)
  RowM mw, vw;
  Eigen::VectorXf mb, vb;
  int t = 0;
  float lr;

  LeastSquaresReplica(const LeastSquares& prob, int rank, float lr_)
      : p(&prob), r(rank), w(RowM::Zero(prob.dout, prob.din)), b(Eigen::VectorXf::Zero(prob.dout)),
        mw(RowM::Zero(prob.dout, prob.din)), vw(RowM::Zero(prob.dout, prob.din)),
        mb(Eigen::VectorXf::Zero(prob.dout)), vb(Eigen::VectorXf::Zero(prob.dout)), lr(lr_) {}

  void adam_step() {
    Eigen::MatrixXf resid = p->x[r] * w.transpose();
    resid.rowwise() += b.transpose();
    resid -= p->y[r];                                                  // (n, dout)
    const RowM gw = resid.transpose() * p->x[r] / static_cast<float>(p->n);  // (dout, din)
    const Eigen::VectorXf gb = resid.colwise().sum().transpose() / static_cast<float>(p->n);
    ++t;
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const float c1 = 1 - std::pow(b1, static_cast<float>(t)), c2 = 1 - std::pow(b2, static_cast<float>(t));
    mw = b1 * mw + (1 - b1) * gw;
    vw = b2 * vw + (1 - b2) * gw.cwiseAbs2();
    mb = b1 * mb + (1 - b1) * gb;
    vb = b2 * vb + (1 - b2) * gb.cwiseAbs2();
    w.array() -= lr * (mw.array() / c1) / ((vw.array() / c2).sqrt() + eps);
    b.array() -= lr * (mb.array() / c1) / ((vb.array() / c2).sqrt() + eps);
  }
};
