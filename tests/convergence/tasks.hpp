// tests/convergence/tasks.hpp: the four tasks of the convergence suite, each one
// replica's model and data stream (replicas share the initial weights, not the data):
//   least_squares   heterogeneous linear regression (each replica its own target), full
//                   batch, 48 x 64 weight; its loss is the mean objective over the replicas
//   mlp_regression  a 128-512-128 tanh MLP fitting a random teacher MLP, batches of 32
//   wide_mlp        the same model at a trainer's settings: twice the steps, SGD at lr 0.05
//   classifier      a 64-128-10 tanh MLP on a 10-class Gaussian mixture, cross-entropy
//   gpt             the reference trainer's `tiny` GPT (vocabulary 256, context 32) on a
//                   synthetic Markov-chain language
// Every task computes a loss and its gradient for batch `step` of its replica, and a
// validation loss of any parameters. Not here: optimizers and the loop (run_convergence).
#pragma once

#include "model/gpt_stage.hpp"

#include <dilocox/compress/compressor.hpp>
#include <dilocox/random.hpp>

#include <Eigen/Dense>
#include <cmath>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../least_squares.hpp"

namespace convergence {

namespace dx = dilocox;
using RowM = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
// Parameters and gradients at Eigen's alignment: its reductions over a Map peel a head
// whose length depends on the address, so heap-aligned buffers would make a run's last
// digits depend on what the process allocated before it (the suite against one run).
using Buffer = std::vector<float, Eigen::aligned_allocator<float>>;

class Task {
 public:
  virtual ~Task() = default;
  virtual std::vector<dx::TensorSpec> layout() const = 0;  // tensors, contiguous in params()
  virtual std::span<float> params() = 0;
  virtual std::span<float> grads() = 0;
  // Loss of this replica's batch `step` at params(); fills grads().
  virtual double train(std::int64_t step) = 0;
  // Validation loss of params().
  virtual double eval() = 0;
};

inline RowM normal(std::uint64_t seed, Eigen::Index rows, Eigen::Index cols, float scale) {
  RowM m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = scale * dx::counter_normal(seed, static_cast<std::uint64_t>(i));
  return m;
}

// ---- least squares ---------------------------------------------------------------
class LeastSquaresTask final : public Task {
 public:
  LeastSquaresTask(int replica, int replicas, std::uint64_t seed)
      : prob_(replicas, kIn, kOut, 256, 0.1f, seed), rep_(prob_, replica, 0.0f), p_(kOut * kIn + kOut), g_(p_.size()) {}
  static constexpr int kIn = 64, kOut = 48;
  std::vector<dx::TensorSpec> layout() const override { return {{"w", {kOut, kIn}}, {"b", {kOut}}}; }
  std::span<float> params() override { return p_; }
  std::span<float> grads() override { return g_; }
  double train(std::int64_t) override { return loss_grad(rep_.r, true); }
  double eval() override {  // the mean objective over every replica's data (its optimum: optimum())
    double s = 0;
    for (int r = 0; r < prob_.k; ++r) s += loss_grad(r, false);
    return s / prob_.k;
  }

 private:
  double loss_grad(int r, bool grad) {
    Eigen::Map<const RowM> w(p_.data(), kOut, kIn);
    Eigen::Map<const Eigen::VectorXf> b(p_.data() + kOut * kIn, kOut);
    Eigen::MatrixXf resid = prob_.x[r] * w.transpose();
    resid.rowwise() += b.transpose();
    resid -= prob_.y[r];
    if (grad) {
      Eigen::Map<RowM> gw(g_.data(), kOut, kIn);
      Eigen::Map<Eigen::VectorXf> gb(g_.data() + kOut * kIn, kOut);
      gw = resid.transpose() * prob_.x[r] / static_cast<float>(prob_.n);
      gb = resid.colwise().sum().transpose() / static_cast<float>(prob_.n);
    }
    return 0.5 * resid.squaredNorm() / prob_.n;
  }
  double optimum() {  // the mean objective at the solution of the normal equations (reported)
    if (optimum_) return *optimum_;
    const Buffer saved = p_;
    Eigen::Map<RowM>(p_.data(), kOut, kIn) = prob_.w_opt.cast<float>();
    Eigen::Map<Eigen::VectorXf>(p_.data() + kOut * kIn, kOut) = prob_.b_opt.cast<float>();
    double s = 0;
    for (int r = 0; r < prob_.k; ++r) s += loss_grad(r, false);
    p_ = saved;
    optimum_ = s / prob_.k;
    return *optimum_;
  }
  LeastSquares prob_;
  LeastSquaresReplica rep_;  // its replica index and data
  std::optional<double> optimum_;
  Buffer p_, g_;
};

// ---- two-layer tanh MLP (regression or classification) ------------------------------
// params: w1 (H, I), b1 (H), w2 (O, H), b2 (O), contiguous.
class MlpTask : public Task {
 public:
  MlpTask(int in, int hidden, int out, std::uint64_t init_seed)
      : I_(in), H_(hidden), O_(out), p_(static_cast<std::size_t>(hidden * in + hidden + out * hidden + out)),
        g_(p_.size()) {
    w1() = normal(init_seed, H_, I_, 1.0f / std::sqrt(static_cast<float>(I_)));
    w2() = normal(init_seed + 1, O_, H_, 1.0f / std::sqrt(static_cast<float>(H_)));
  }
  std::vector<dx::TensorSpec> layout() const override {
    using S = std::size_t;
    return {{"w1", {S(H_), S(I_)}}, {"b1", {S(H_)}}, {"w2", {S(O_), S(H_)}}, {"b2", {S(O_)}}};
  }
  std::span<float> params() override { return p_; }
  std::span<float> grads() override { return g_; }

 protected:
  Eigen::Map<RowM> w1() { return {p_.data(), H_, I_}; }
  Eigen::Map<Eigen::VectorXf> b1() { return {p_.data() + H_ * I_, H_}; }
  Eigen::Map<RowM> w2() { return {p_.data() + H_ * I_ + H_, O_, H_}; }
  Eigen::Map<Eigen::VectorXf> b2() { return {p_.data() + H_ * I_ + H_ + O_ * H_, O_}; }

  // out (N, O) = the MLP of x (N, I); keeps the hidden activation for backward.
  RowM forward(const RowM& x) {
    h_ = (x * w1().transpose()).rowwise() + b1().transpose();
    h_ = h_.array().tanh().matrix();
    return (h_ * w2().transpose()).rowwise() + b2().transpose();
  }
  // Gradients from d(out) (N, O) for input x.
  void backward(const RowM& x, const RowM& dout) {
    Eigen::Map<RowM> gw1(g_.data(), H_, I_), gw2(g_.data() + H_ * I_ + H_, O_, H_);
    Eigen::Map<Eigen::VectorXf> gb1(g_.data() + H_ * I_, H_), gb2(g_.data() + H_ * I_ + H_ + O_ * H_, O_);
    gw2 = dout.transpose() * h_;
    gb2 = dout.colwise().sum().transpose();
    const RowM dh = ((dout * w2()).array() * (1.0f - h_.array().square())).matrix();
    gw1 = dh.transpose() * x;
    gb1 = dh.colwise().sum().transpose();
  }

  int I_, H_, O_;
  Buffer p_, g_;
  RowM h_;  // (N, H) hidden activation of the last forward
};

// Regression onto a random teacher MLP of the same shape (different weights).
class MlpRegressionTask final : public MlpTask {
 public:
  MlpRegressionTask(int replica, std::uint64_t seed)
      : MlpTask(128, 512, 128, seed), replica_(replica), seed_(seed),
        tw1_(normal(seed + 100, 512, 128, 1.0f / std::sqrt(128.0f))),
        tw2_(normal(seed + 101, 128, 512, 1.0f / std::sqrt(512.0f))),
        xv_(normal(seed + 200, 1024, 128, 1.0f)), yv_(teacher(xv_)) {}
  double train(std::int64_t step) override {
    const RowM x = normal(dx::stream_seed(seed_ + 300, static_cast<std::uint64_t>(step), static_cast<std::uint32_t>(replica_)), 32, 128, 1.0f);
    const RowM d = forward(x) - teacher(x);
    backward(x, d / 32.0f);
    return 0.5 * d.squaredNorm() / 32.0;
  }
  double eval() override { return 0.5 * (forward(xv_) - yv_).squaredNorm() / static_cast<double>(xv_.rows()); }

 private:
  RowM teacher(const RowM& x) const { return (x * tw1_.transpose()).array().tanh().matrix() * tw2_.transpose(); }
  int replica_;
  std::uint64_t seed_;
  RowM tw1_, tw2_, xv_, yv_;
};

// A 10-class Gaussian mixture in 64 dimensions (means at distance ~ the noise).
class ClassifierTask final : public MlpTask {
 public:
  ClassifierTask(int replica, std::uint64_t seed)
      : MlpTask(64, 128, 10, seed), replica_(replica), seed_(seed), means_(normal(seed + 100, 10, 64, 0.3f)) {
    sample(dx::stream_seed(seed + 200, 0, 0xe1), 2048, xv_, lv_);
  }
  double train(std::int64_t step) override {
    RowM x;
    std::vector<int> l;
    sample(dx::stream_seed(seed_ + 300, static_cast<std::uint64_t>(step), static_cast<std::uint32_t>(replica_)), 64, x, l);
    RowM d;
    const double loss = ce(forward(x), l, &d);
    backward(x, d / 64.0f);
    return loss;
  }
  double eval() override { return ce(forward(xv_), lv_, nullptr); }

 private:
  void sample(std::uint64_t s, int n, RowM& x, std::vector<int>& labels) const {
    x = normal(s, n, 64, 1.0f);
    labels.resize(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      labels[i] = static_cast<int>(dx::counter_bits(dx::counter_key(s ^ 0x5bd1e995, 0), static_cast<std::uint64_t>(i)) % 10);
      x.row(i) += means_.row(labels[i]);
    }
  }
  // Mean cross-entropy; d = softmax - onehot when asked.
  static double ce(const RowM& logits, const std::vector<int>& l, RowM* d) {
    double loss = 0;
    if (d) d->resize(logits.rows(), logits.cols());
    for (Eigen::Index i = 0; i < logits.rows(); ++i) {
      const float m = logits.row(i).maxCoeff();
      const Eigen::RowVectorXf e = (logits.row(i).array() - m).exp().matrix();
      const float z = e.sum();
      loss += std::log(z) + m - logits(i, l[i]);
      if (d) {
        d->row(i) = e / z;
        (*d)(i, l[i]) -= 1.0f;
      }
    }
    return loss / static_cast<double>(logits.rows());
  }
  int replica_;
  std::uint64_t seed_;
  RowM means_, xv_;
  std::vector<int> lv_;
};

// ---- tiny GPT on a synthetic language -----------------------------------------------
// Tokens from a fixed Markov chain over 256 symbols: each symbol has 4 likely
// successors (90%) and otherwise a uniform one. Best achievable loss ~1.9 nats.
class GptTask final : public Task {
 public:
  static dilocox::trainer::GptConfig config() {
    dilocox::trainer::GptConfig c = dilocox::trainer::gpt_preset("tiny");
    c.vocab = 256;
    c.max_seq = 32;
    return c;
  }
  GptTask(int replica, std::uint64_t seed)
      : replica_(replica), seed_(seed), model_(config(), 1, 0, kBatch, kSeq, 1), tokens_(kBatch * kSeq + 1) {
    model_.init(seed);
  }
  std::vector<dx::TensorSpec> layout() const override {
    std::vector<dx::TensorSpec> s;
    for (const auto& t : model_.tensors()) s.push_back({t.name, t.dims()});
    return s;
  }
  std::span<float> params() override { return model_.params(); }
  std::span<float> grads() override { return model_.grads(); }
  double train(std::int64_t step) override {
    return run(dx::stream_seed(seed_ + 300, static_cast<std::uint64_t>(step), static_cast<std::uint32_t>(replica_)), true);
  }
  double eval() override {
    double s = 0;
    for (int i = 0; i < 8; ++i) s += run(dx::stream_seed(seed_ + 900, static_cast<std::uint64_t>(i), 0xe7), false);
    return s / 8;
  }

 private:
  static constexpr int kBatch = 4, kSeq = 32;
  double run(std::uint64_t s, bool grad) {
    std::uint32_t tok = dx::counter_bits(dx::counter_key(s, 0), 0) % 256;
    for (std::size_t i = 0; i < tokens_.size(); ++i) {
      tokens_[i] = static_cast<std::int32_t>(tok);
      const std::uint32_t u = dx::counter_bits(dx::counter_key(s, 1), i);
      tok = u % 10 < 9 ? (tok * 37 + 11 + 53 * (u / 10 % 4)) % 256 : (u / 40) % 256;
    }
    model_.zero_grads();
    const double sum = model_.forward(0, tokens_.data(), tokens_.data() + 1);
    const double n = static_cast<double>(kBatch) * kSeq;
    if (grad) {
      model_.backward(0, static_cast<float>(1.0 / n));
      model_.finish_backward();
    }
    return sum / n;
  }
  int replica_;
  std::uint64_t seed_;
  dilocox::trainer::GptStage<float> model_;
  std::vector<std::int32_t> tokens_;  // (B T + 1) the batch and its next-token targets
};

inline std::unique_ptr<Task> make_task(const std::string& name, int replica, int replicas, std::uint64_t seed) {
  if (name == "least_squares") return std::make_unique<LeastSquaresTask>(replica, replicas, seed);
  if (name == "mlp_regression" || name == "wide_mlp") return std::make_unique<MlpRegressionTask>(replica, seed);
  if (name == "classifier") return std::make_unique<ClassifierTask>(replica, seed);
  if (name == "gpt") return std::make_unique<GptTask>(replica, seed);
  throw dx::Error("unknown task '" + name + "' (least_squares, mlp_regression, wide_mlp, classifier, gpt)");
}

}  // namespace convergence
