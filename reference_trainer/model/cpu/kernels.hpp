// reference_trainer/model/cpu/kernels.hpp: the GPT layers on the CPU, forward and
// backward, templated on the scalar (float for training, double for the gradient
// check). Products go through gemm (BLAS or Eigen), attention is in attention.hpp, the
// rest are loops the compiler vectorizes, split over the threads by rows (or, for sums
// over rows, by columns) so that no result depends on the thread count.
// Conventions (llm.c's): activations are (B, T, C) row-major; a Linear weight is
// (out, in) like PyTorch's; backward kernels ADD into parameter gradients (they
// accumulate over micro-batches) and write (or add, where noted) activation gradients.
#pragma once

#include "model/cpu/attention.hpp"
#include "model/cpu/elementwise.hpp"
#include "model/cpu/gemm.hpp"
#include "model/cpu/parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace dilocox::trainer::cpu {

// ---------------------------------------------------------------- embeddings

// out (N, C) = wte[tokens] + wpe[position]; N = B * T tokens.
template <class T>
void embedding_forward(T* out, const std::int32_t* tokens, const T* wte, const T* wpe, int B, int Tn, int C) {
  parallel_for(static_cast<std::size_t>(B) * Tn, [&](std::size_t n) {
    T* o = out + n * C;
    const T* e = wte + static_cast<std::size_t>(tokens[n]) * C;
    const T* p = wpe + (n % static_cast<std::size_t>(Tn)) * C;
    for (int i = 0; i < C; ++i) o[i] = e[i] + p[i];
  });
}

// dwte[tokens] += dout, dwpe[position] += dout; split by columns, tokens in order (a
// token repeated in the batch adds in the same order for every thread count).
template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const std::int32_t* tokens, int B, int Tn, int C) {
  parallel_ranges(static_cast<std::size_t>(C), 16, [&](int, std::size_t c0, std::size_t c1) {
    for (std::size_t n = 0; n < static_cast<std::size_t>(B) * Tn; ++n) {
      const T* d = dout + n * C;
      T* e = dwte + static_cast<std::size_t>(tokens[n]) * C;
      T* p = dwpe + (n % static_cast<std::size_t>(Tn)) * C;
      for (std::size_t i = c0; i < c1; ++i) e[i] += d[i], p[i] += d[i];
    }
  });
}

// ---------------------------------------------------------------- LayerNorm

// out = (x - mean) * rstd * w + b over the last dim; keeps mean and rstd (N) for backward.
template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b, int N, int C) {
  const T eps = T(1e-5);
  const auto c = static_cast<std::size_t>(C);
  parallel_for(static_cast<std::size_t>(N), [&](std::size_t n) {
    const T* xi = x + n * c;
    const T m = sum_in_index_order(xi, c) / static_cast<T>(C);
    const T v = sum_in_index_order<T>(c, [&](std::size_t i) { return (xi[i] - m) * (xi[i] - m); }) / static_cast<T>(C);
    const T s = T(1) / std::sqrt(v + eps);
    T* o = out + n * c;
    for (std::size_t i = 0; i < c; ++i) o[i] = (xi[i] - m) * s * w[i] + b[i];
    mean[n] = m;
    rstd[n] = s;
  });
}

// dx += LayerNorm'(dout) row by row; dw, db accumulate over the rows in order, split by columns.
template <class T>
void layernorm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, const T* mean, const T* rstd,
                        int N, int C) {
  const auto c = static_cast<std::size_t>(C);
  parallel_for(static_cast<std::size_t>(N), [&](std::size_t n) {
    const T *d = dout + n * c, *xi = x + n * c;
    T* dxi = dx + n * c;
    const T m = mean[n], s = rstd[n];
    const T dnorm_mean = sum_in_index_order<T>(c, [&](std::size_t i) { return w[i] * d[i]; }) / static_cast<T>(C);
    const T dnorm_norm_mean =
        sum_in_index_order<T>(c, [&](std::size_t i) { return w[i] * d[i] * ((xi[i] - m) * s); }) / static_cast<T>(C);
    for (std::size_t i = 0; i < c; ++i) dxi[i] += (w[i] * d[i] - dnorm_mean - (xi[i] - m) * s * dnorm_norm_mean) * s;
  });
  parallel_ranges(c, 16, [&](int, std::size_t c0, std::size_t c1) {
    for (std::size_t n = 0; n < static_cast<std::size_t>(N); ++n) {
      const T *d = dout + n * c, *xi = x + n * c;
      const T m = mean[n], s = rstd[n];
      for (std::size_t i = c0; i < c1; ++i) {
        db[i] += d[i];
        dw[i] += (xi[i] - m) * s * d[i];
      }
    }
  });
}

// ---------------------------------------------------------------- Linear

// out (N, OC) = x (N, IC) W^T + b (+ residual (N, OC) when given), W (OC, IC); b may be
// null. Bias and residual go into C before the product (beta = 1): no pass of their own.
template <class T>
void matmul_forward(T* out, const T* x, const T* w, const T* b, int N, int IC, int OC, const T* residual = nullptr) {
  const auto oc = static_cast<std::size_t>(OC);
  const bool add = b || residual;
  parallel_ranges(static_cast<std::size_t>(N), gemm_row_align, [&](int, std::size_t r0, std::size_t r1) {
    for (std::size_t n = r0; add && n < r1; ++n) {
      T* o = out + n * oc;
      if (residual && b)
        for (std::size_t i = 0; i < oc; ++i) o[i] = residual[n * oc + i] + b[i];
      else if (residual)
        std::copy(residual + n * oc, residual + (n + 1) * oc, o);
      else
        std::copy(b, b + oc, o);
    }
    gemm(Op::none, Op::trans, static_cast<int>(r1 - r0), OC, IC, T(1), x + r0 * static_cast<std::size_t>(IC), IC, w,
         IC, add ? T(1) : T(0), out + r0 * oc, OC);
  });
}

// db (n) += the column sums of d (rows, n), each column summed in row order.
template <class T>
void column_sums_into(T* db, const T* d, int rows, int n) {
  parallel_ranges(static_cast<std::size_t>(n), 16, [&](int, std::size_t c0, std::size_t c1) {
    for (int r = 0; r < rows; ++r) {
      const T* row = d + static_cast<std::size_t>(r) * static_cast<std::size_t>(n);
      for (std::size_t c = c0; c < c1; ++c) db[c] += row[c];
    }
  });
}

// dx (N, IC) += dout W (or = when overwrite_dx), dW += dout^T x, db += column sums.
template <class T>
void matmul_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, int N, int IC, int OC,
                     bool overwrite_dx = false) {
  if (dx) gemm_rows(Op::none, Op::none, N, IC, OC, T(1), dout, OC, w, IC, overwrite_dx ? T(0) : T(1), dx, IC);
  gemm_rows(Op::trans, Op::none, OC, IC, N, T(1), dout, OC, x, IC, T(1), dw, IC);
  if (db) column_sums_into(db, dout, N, OC);
}

// ---------------------------------------------------------------- GELU

// GELU, tanh approximation (GPT-2's; PyTorch's approximate="tanh"), in blocks: Eigen's
// vectorized tanh for float (within 3e-7 of the exact value), std::tanh for double.
template <class T>
void gelu_forward(T* out, const T* x, std::size_t n) {
  const T k = static_cast<T>(0.7978845608028654), c = T(0.044715);
  parallel_ranges(n, 4096, [&](int, std::size_t b, std::size_t e) {
    for_blocks(out + b, x + b, e - b, [&](std::size_t, const Block<T>& xi) -> Block<T> {
      return T(0.5) * xi * (T(1) + (k * (xi + c * xi.cube())).tanh());
    });
  });
}

// dx = GELU'(x) dout; dx may be dout.
template <class T>
void gelu_backward(T* dx, const T* x, const T* dout, std::size_t n) {
  const T k = static_cast<T>(0.7978845608028654), c = T(0.044715);
  parallel_ranges(n, 4096, [&](int, std::size_t b, std::size_t e) {
    for_blocks(dx + b, x + b, e - b, [&](std::size_t i, const Block<T>& xi) -> Block<T> {
      const Block<T> th = (k * (xi + c * xi.cube())).tanh();
      const Block<T> d = load_block(dout + b, i, e - b);
      return (T(0.5) * (T(1) + th) + T(0.5) * xi * (T(1) - th * th) * k * (T(1) + T(3) * c * xi.square())) * d;
    });
  });
}

// ---------------------------------------------------------------- loss

// Per-token cross-entropy from logits (N, V), in place: logits become probabilities.
// Returns the sum of the N losses (in double, to keep the mean exact enough), added in
// token order whatever the threads.
template <class T>
double softmax_cross_entropy(T* logits, T* losses, const std::int32_t* targets, int N, int V) {
  parallel_for(static_cast<std::size_t>(N), [&](std::size_t n) {
    T* row = logits + n * static_cast<std::size_t>(V);
    const T target_logit = row[targets[n]];
    const auto [mx, sum] = softmax_row(row, static_cast<std::size_t>(V));
    losses[n] = std::log(sum) + mx - target_logit;  // = -log softmax, without underflow
  });
  double total = 0;
  for (int n = 0; n < N; ++n) total += static_cast<double>(losses[n]);
  return total;
}

// dlogits = (probs - onehot(target)) * scale, in place on the probabilities.
template <class T>
void cross_entropy_backward(T* probs, const std::int32_t* targets, int N, int V, T scale) {
  parallel_for(static_cast<std::size_t>(N), [&](std::size_t n) {
    T* row = probs + n * static_cast<std::size_t>(V);
    row[targets[n]] -= T(1);
    for (int i = 0; i < V; ++i) row[i] *= scale;
  });
}

}  // namespace dilocox::trainer::cpu
