// reference_trainer/model/cpu/kernels.hpp: the GPT layers on the CPU, forward and
// backward, templated on the scalar (float for training, double for the gradient
// check). Matmuls go through Eigen; the rest are plain loops the compiler vectorizes.
// Conventions (llm.c's): activations are (B, T, C) row-major; a Linear weight is
// (out, in) like PyTorch's; backward kernels ADD into parameter gradients (they
// accumulate over micro-batches) and write (or add, where noted) activation gradients.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace dilocox::trainer::cpu {

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MatMap = Eigen::Map<RowMat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using ConstMatMap = Eigen::Map<const RowMat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using VecMap = Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>;

template <class T>
MatMap<T> mat(T* p, std::ptrdiff_t rows, std::ptrdiff_t cols, std::ptrdiff_t stride) {
  return MatMap<T>(p, rows, cols, Eigen::OuterStride<>(stride));
}
template <class T>
ConstMatMap<T> cmat(const T* p, std::ptrdiff_t rows, std::ptrdiff_t cols, std::ptrdiff_t stride) {
  return ConstMatMap<T>(p, rows, cols, Eigen::OuterStride<>(stride));
}

// out (N, C) = wte[tokens] + wpe[position]; N = B * T tokens.
template <class T>
void embedding_forward(T* out, const std::int32_t* tokens, const T* wte, const T* wpe, int B, int Tn, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t) {
      T* o = out + (static_cast<std::size_t>(b) * Tn + t) * C;
      const T* e = wte + static_cast<std::size_t>(tokens[b * Tn + t]) * C;
      const T* p = wpe + static_cast<std::size_t>(t) * C;
      for (int i = 0; i < C; ++i) o[i] = e[i] + p[i];
    }
}

template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const std::int32_t* tokens, int B, int Tn, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t) {
      const T* d = dout + (static_cast<std::size_t>(b) * Tn + t) * C;
      T* e = dwte + static_cast<std::size_t>(tokens[b * Tn + t]) * C;
      T* p = dwpe + static_cast<std::size_t>(t) * C;
      for (int i = 0; i < C; ++i) e[i] += d[i], p[i] += d[i];
    }
}

// out = (x - mean) * rstd * w + b over the last dim; keeps mean and rstd (N) for backward.
template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b, int N, int C) {
  const T eps = T(1e-5);
  for (int n = 0; n < N; ++n) {
    const T* xi = x + static_cast<std::size_t>(n) * C;
    T m = 0;
    for (int i = 0; i < C; ++i) m += xi[i];
    m /= C;
    T v = 0;
    for (int i = 0; i < C; ++i) v += (xi[i] - m) * (xi[i] - m);
    v /= C;
    const T s = T(1) / std::sqrt(v + eps);
    T* o = out + static_cast<std::size_t>(n) * C;
    for (int i = 0; i < C; ++i) o[i] = (xi[i] - m) * s * w[i] + b[i];
    mean[n] = m;
    rstd[n] = s;
  }
}

// dx += LayerNorm'(dout); dw, db accumulate.
template <class T>
void layernorm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, const T* mean, const T* rstd,
                        int N, int C) {
  for (int n = 0; n < N; ++n) {
    const T* d = dout + static_cast<std::size_t>(n) * C;
    const T* xi = x + static_cast<std::size_t>(n) * C;
    T* dxi = dx + static_cast<std::size_t>(n) * C;
    const T m = mean[n], s = rstd[n];
    T dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int i = 0; i < C; ++i) {
      const T norm = (xi[i] - m) * s;
      const T dnorm = w[i] * d[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int i = 0; i < C; ++i) {
      const T norm = (xi[i] - m) * s;
      db[i] += d[i];
      dw[i] += norm * d[i];
      dxi[i] += (w[i] * d[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

// out (N, OC) = x (N, IC) W^T + b, W (OC, IC).
template <class T>
void matmul_forward(T* out, const T* x, const T* w, const T* b, int N, int IC, int OC) {
  auto o = mat(out, N, OC, OC);
  o.noalias() = cmat(x, N, IC, IC) * cmat(w, OC, IC, IC).transpose();
  if (b) o.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(b, OC);
}

// dx (N, IC) += dout W (or = when overwrite_dx), dW += dout^T x, db += column sums.
template <class T>
void matmul_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, int N, int IC, int OC,
                     bool overwrite_dx = false) {
  auto d = cmat(dout, N, OC, OC);
  if (dx) {
    auto dxm = mat(dx, N, IC, IC);
    if (overwrite_dx)
      dxm.noalias() = d * cmat(w, OC, IC, IC);
    else
      dxm.noalias() += d * cmat(w, OC, IC, IC);
  }
  mat(dw, OC, IC, IC).noalias() += d.transpose() * cmat(x, N, IC, IC);
  if (db) VecMap<T>(db, OC) += d.colwise().sum();
}

// Causal self-attention on qkv (B, T, 3C) -> out (B, T, C); att (B, NH, T, T) keeps
// the softmax probabilities (zero above the diagonal) for backward.
template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const T* base = qkv + static_cast<std::size_t>(b) * Tn * C3 + h * hs;
      auto q = cmat(base, Tn, hs, C3);
      auto k = cmat(base + C, Tn, hs, C3);
      auto v = cmat(base + 2 * C, Tn, hs, C3);
      T* a = att + (static_cast<std::size_t>(b) * NH + h) * Tn * Tn;
      auto am = mat(a, Tn, Tn, Tn);
      am.noalias() = (q * k.transpose()) * scale;
      for (int t = 0; t < Tn; ++t) {
        T* row = a + static_cast<std::size_t>(t) * Tn;
        T mx = row[0];
        for (int j = 1; j <= t; ++j) mx = std::max(mx, row[j]);
        T sum = 0;
        for (int j = 0; j <= t; ++j) sum += (row[j] = std::exp(row[j] - mx));
        const T inv = T(1) / sum;
        for (int j = 0; j <= t; ++j) row[j] *= inv;
        for (int j = t + 1; j < Tn; ++j) row[j] = 0;
      }
      mat(out + static_cast<std::size_t>(b) * Tn * C + h * hs, Tn, hs, C).noalias() = am * v;
    }
}

// dqkv (B, T, 3C) = attention'(dout); scratch holds (T, T).
template <class T>
void attention_backward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att, int B, int Tn, int C,
                        int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const std::size_t off = static_cast<std::size_t>(b) * Tn * C3 + h * hs;
      auto q = cmat(qkv + off, Tn, hs, C3);
      auto k = cmat(qkv + off + C, Tn, hs, C3);
      auto v = cmat(qkv + off + 2 * C, Tn, hs, C3);
      auto dq = mat(dqkv + off, Tn, hs, C3);
      auto dk = mat(dqkv + off + C, Tn, hs, C3);
      auto dv = mat(dqkv + off + 2 * C, Tn, hs, C3);
      const T* a = att + (static_cast<std::size_t>(b) * NH + h) * Tn * Tn;
      auto am = cmat(a, Tn, Tn, Tn);
      auto d = cmat(dout + static_cast<std::size_t>(b) * Tn * C + h * hs, Tn, hs, C);
      auto ds = mat(scratch, Tn, Tn, Tn);
      dv.noalias() = am.transpose() * d;
      ds.noalias() = d * v.transpose();  // d(att)
      for (int t = 0; t < Tn; ++t) {      // softmax backward, then the scale
        T* row = scratch + static_cast<std::size_t>(t) * Tn;
        const T* p = a + static_cast<std::size_t>(t) * Tn;
        T dot = 0;
        for (int j = 0; j <= t; ++j) dot += p[j] * row[j];
        for (int j = 0; j <= t; ++j) row[j] = p[j] * (row[j] - dot) * scale;
        for (int j = t + 1; j < Tn; ++j) row[j] = 0;
      }
      dq.noalias() = ds * k;
      dk.noalias() = ds.transpose() * q;
    }
}

// GELU, tanh approximation (GPT-2's; PyTorch's approximate="tanh").
template <class T>
void gelu_forward(T* out, const T* x, std::size_t n) {
  const T k = static_cast<T>(0.7978845608028654), c = T(0.044715);
  for (std::size_t i = 0; i < n; ++i) {
    const T xi = x[i];
    out[i] = T(0.5) * xi * (T(1) + std::tanh(k * (xi + c * xi * xi * xi)));
  }
}

template <class T>
void gelu_backward(T* dx, const T* x, const T* dout, std::size_t n) {
  const T k = static_cast<T>(0.7978845608028654), c = T(0.044715);
  for (std::size_t i = 0; i < n; ++i) {
    const T xi = x[i];
    const T u = k * (xi + c * xi * xi * xi);
    const T th = std::tanh(u);
    const T sech2 = T(1) - th * th;
    dx[i] = (T(0.5) * (T(1) + th) + T(0.5) * xi * sech2 * k * (T(1) + T(3) * c * xi * xi)) * dout[i];
  }
}

template <class T>
void add_into(T* y, const T* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += x[i];
}

// Per-token cross-entropy from logits (N, V), in place: logits become probabilities.
// Returns the sum of the N losses (in double, to keep the mean exact enough).
template <class T>
double softmax_cross_entropy(T* logits, T* losses, const std::int32_t* targets, int N, int V) {
  double total = 0;
  for (int n = 0; n < N; ++n) {
    T* row = logits + static_cast<std::size_t>(n) * V;
    T mx = row[0];
    for (int i = 1; i < V; ++i) mx = std::max(mx, row[i]);
    const T target_logit = row[targets[n]];
    T sum = 0;
    for (int i = 0; i < V; ++i) sum += (row[i] = std::exp(row[i] - mx));
    const T inv = T(1) / sum;
    for (int i = 0; i < V; ++i) row[i] *= inv;
    losses[n] = std::log(sum) + mx - target_logit;  // = -log softmax, without underflow
    total += static_cast<double>(losses[n]);
  }
  return total;
}

// dlogits = (probs - onehot(target)) * scale, in place on the probabilities.
template <class T>
void cross_entropy_backward(T* probs, const std::int32_t* targets, int N, int V, T scale) {
  for (int n = 0; n < N; ++n) {
    T* row = probs + static_cast<std::size_t>(n) * V;
    row[targets[n]] -= T(1);
    for (int i = 0; i < V; ++i) row[i] *= scale;
  }
}

}  // namespace dilocox::trainer::cpu
