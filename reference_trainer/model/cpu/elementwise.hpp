// reference_trainer/model/cpu/elementwise.hpp: element-wise math on the CPU that gives
// the same bits wherever a buffer lies in memory: Eigen's vectorized exp and tanh applied
// to fixed-size blocks (every element through the same vector code; on a plain Map,
// Eigen would send the elements before the first aligned address through the scalar
// std::exp instead), and a sum whose order depends on the indices only.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cstddef>
#include <utility>

namespace dilocox::trainer::cpu {

// 16 values: whole AVX2 and AVX-512 registers of float and double alike.
inline constexpr std::size_t block_len = 16;
template <class T>
using Block = Eigen::Array<T, static_cast<int>(block_len), 1>;

// body(i, x) for the blocks of [0, n) read from `in` (the last one zero-padded); body
// returns the block to store at out + i (len = min(16, n - i) values are written).
template <class T, class Body>
void for_blocks(T* out, const T* in, std::size_t n, Body&& body) {
  for (std::size_t i = 0; i < n; i += block_len) {
    const std::size_t len = std::min(block_len, n - i);
    Block<T> x = Block<T>::Zero();
    std::copy(in + i, in + i + len, x.data());
    const Block<T> y = body(i, x);
    std::copy(y.data(), y.data() + len, out + i);
  }
}

// The block of p (n values) that starts at i, zero-padded past n.
template <class T>
Block<T> load_block(const T* p, std::size_t i, std::size_t n) {
  Block<T> x = Block<T>::Zero();
  std::copy(p + i, p + std::min(n, i + block_len), x.data());
  return x;
}

// sum of term(i) for i in [0, n) in an order fixed by the indices alone (8 interleaved
// partial sums, then their sum; vectorizes): Eigen's sum() starts its vector lanes at
// the first aligned address, so its result depends on where the buffer lies.
template <class T, class Term>
T sum_in_index_order(std::size_t n, Term&& term) {
  constexpr std::size_t lanes = 8;
  T acc[lanes] = {};
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (std::size_t j = 0; j < lanes; ++j) acc[j] += term(i + j);
  for (std::size_t j = 0; i < n; ++i, ++j) acc[j] += term(i);
  T s = 0;
  for (std::size_t j = 0; j < lanes; ++j) s += acc[j];
  return s;
}
template <class T>
T sum_in_index_order(const T* x, std::size_t n) {
  return sum_in_index_order<T>(n, [x](std::size_t i) { return x[i]; });
}

// Softmax of a row of n values in place; returns the row's max and the sum of
// exp(x - max) (the cross-entropy wants both).
template <class T>
std::pair<T, T> softmax_row(T* row, std::size_t n) {
  const T mx = *std::max_element(row, row + n);
  for_blocks(row, row, n, [&](std::size_t, const Block<T>& x) -> Block<T> { return (x - mx).exp(); });
  const T sum = sum_in_index_order(row, n);
  const T inv = T(1) / sum;
  for (std::size_t i = 0; i < n; ++i) row[i] *= inv;
  return {mx, sum};
}

}  // namespace dilocox::trainer::cpu
