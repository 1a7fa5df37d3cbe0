// reference_trainer/model/cpu/attention.hpp: causal multi-head self-attention on the
// CPU, forward and backward, one (sequence, head) pair per task over the threads. Rows
// of queries go in blocks of 32: a block's products stop at its last key, so the masked
// upper triangle is neither multiplied nor exponentiated (0.6x the products at T = 128).
// Not flash attention: the probabilities (B, NH, T, T) are kept for backward.
#pragma once

#include "model/cpu/elementwise.hpp"
#include "model/cpu/gemm.hpp"
#include "model/cpu/parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace dilocox::trainer::cpu {

inline constexpr int attention_row_block = 32;

// One (sequence, head): q, k, v (T, hs) with row stride 3C; out (T, hs) with stride C;
// att (T, T) the probabilities, zero above the diagonal.
template <class T>
void attention_head_forward(T* out, T* att, const T* q, int Tn, int C, int hs) {
  const int C3 = 3 * C;
  const T *k = q + C, *v = q + 2 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int r0 = 0; r0 < Tn; r0 += attention_row_block) {
    const int r1 = std::min(Tn, r0 + attention_row_block), rows = r1 - r0;
    T* a = att + static_cast<std::size_t>(r0) * Tn;
    gemm(Op::none, Op::trans, rows, r1, hs, scale, q + static_cast<std::size_t>(r0) * C3, C3, k, C3, T(0), a, Tn);
    for (int t = r0; t < r1; ++t) {
      T* row = att + static_cast<std::size_t>(t) * Tn;
      softmax_row(row, static_cast<std::size_t>(t) + 1);
      std::fill(row + t + 1, row + Tn, T(0));
    }
    gemm(Op::none, Op::none, rows, hs, r1, T(1), a, Tn, v, C3, T(0), out + static_cast<std::size_t>(r0) * C, C);
  }
}

// Causal self-attention on qkv (B, T, 3C) -> out (B, T, C); att (B, NH, T, T) keeps
// the softmax probabilities (zero above the diagonal) for backward.
template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH) {
  const int hs = C / NH;
  parallel_for(static_cast<std::size_t>(B) * NH, [&](std::size_t i) {
    const std::size_t b = i / NH, h = i % NH;
    attention_head_forward(out + b * Tn * C + h * hs, att + i * Tn * Tn, qkv + b * Tn * 3 * C + h * hs, Tn, C, hs);
  });
}

// One (sequence, head) backward: dq, dk, dv (T, hs) with stride 3C (overwritten) from
// d (T, hs) with stride C; ds: (T, T) scratch.
template <class T>
void attention_head_backward(T* dq, T* ds, const T* d, const T* q, const T* att, int Tn, int C, int hs) {
  const int C3 = 3 * C;
  const T *k = q + C, *v = q + 2 * C;
  T *dk = dq + C, *dv = dq + 2 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int t = 0; t < Tn; ++t) {  // dk and dv accumulate over the row blocks
    std::fill(dk + static_cast<std::size_t>(t) * C3, dk + static_cast<std::size_t>(t) * C3 + hs, T(0));
    std::fill(dv + static_cast<std::size_t>(t) * C3, dv + static_cast<std::size_t>(t) * C3 + hs, T(0));
  }
  for (int r0 = 0; r0 < Tn; r0 += attention_row_block) {
    const int r1 = std::min(Tn, r0 + attention_row_block), rows = r1 - r0;
    const T *a = att + static_cast<std::size_t>(r0) * Tn, *dr = d + static_cast<std::size_t>(r0) * C;
    T* s = ds + static_cast<std::size_t>(r0) * Tn;
    gemm(Op::trans, Op::none, r1, hs, rows, T(1), a, Tn, dr, C, T(1), dv, C3);  // dv += att^T d
    gemm(Op::none, Op::trans, rows, r1, hs, T(1), dr, C, v, C3, T(0), s, Tn);   // d(att) = d v^T
    for (int t = r0; t < r1; ++t) {  // softmax backward, then the scale
      T* row = ds + static_cast<std::size_t>(t) * Tn;
      const T* p = att + static_cast<std::size_t>(t) * Tn;
      T dot = 0;
      for (int j = 0; j <= t; ++j) dot += p[j] * row[j];
      for (int j = 0; j <= t; ++j) row[j] = p[j] * (row[j] - dot) * scale;
      std::fill(row + t + 1, row + r1, T(0));
    }
    gemm(Op::none, Op::none, rows, hs, r1, T(1), s, Tn, k, C3, T(0), dq + static_cast<std::size_t>(r0) * C3, C3);
    gemm(Op::trans, Op::none, r1, hs, rows, T(1), s, Tn, q + static_cast<std::size_t>(r0) * C3, C3, T(1), dk, C3);
  }
}

// dqkv (B, T, 3C) = attention'(dout (B, T, C)); scratch: threads() x (T, T).
template <class T>
void attention_backward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att, int B, int Tn, int C,
                        int NH) {
  const int hs = C / NH;
  parallel_ranges(static_cast<std::size_t>(B) * NH, 1, [&](int part, std::size_t i0, std::size_t i1) {
    T* ds = scratch + static_cast<std::size_t>(part) * Tn * Tn;
    for (std::size_t i = i0; i < i1; ++i) {
      const std::size_t b = i / NH, h = i % NH, off = b * Tn * 3 * C + h * hs;
      attention_head_backward(dqkv + off, ds, dout + b * Tn * C + h * hs, qkv + off, att + i * Tn * Tn, Tn, C, hs);
    }
  });
}

}  // namespace dilocox::trainer::cpu
