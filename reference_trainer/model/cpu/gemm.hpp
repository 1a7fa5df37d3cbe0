// reference_trainer/model/cpu/gemm.hpp: the matrix product of the CPU kernels,
// row-major C = alpha op(A) op(B) + beta C: on the BLAS the trainer links (CMake defines
// DILOCOX_TRAINER_BLAS: sgemm_/dgemm_, one BLAS thread; OpenBLAS, 1.35x Eigen's rate on
// this model's shapes) or on Eigen when none was found; and gemm_rows, which splits C's
// rows over the kernels' threads along the BLAS's tiles, so an element's arithmetic is
// the same for every thread count. Not a BLAS: only what the GPT layers call.
#pragma once

#include "model/cpu/parallel.hpp"

#include <Eigen/Core>

#include <cstddef>
#include <string>

#if defined(DILOCOX_TRAINER_BLAS)
// The Fortran BLAS ABI (column-major, arguments by pointer), as every BLAS exports it.
extern "C" {
void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c, const int* ldc);
void dgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc);
// OpenBLAS only (weak: absent from other BLAS libraries): its own thread count.
void openblas_set_num_threads(int) __attribute__((weak));
}
#endif

namespace dilocox::trainer::cpu {

enum class Op { none, trans };

// Which product the kernels run on: "blas" or "eigen" (benchmarks report it).
inline const char* gemm_backend() {
#if defined(DILOCOX_TRAINER_BLAS)
  return "blas";
#else
  return "eigen";
#endif
}

namespace detail {
#if defined(DILOCOX_TRAINER_BLAS)
// The kernels split the work themselves: the BLAS runs on the calling thread only.
inline void blas_single_thread() {
  static const bool once = [] {
    if (openblas_set_num_threads) openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}
inline void blas_gemm(char ta, char tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                      int ldb, float beta, float* c, int ldc) {
  sgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}
inline void blas_gemm(char ta, char tb, int m, int n, int k, double alpha, const double* a, int lda, const double* b,
                      int ldb, double beta, double* c, int ldc) {
  dgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}
#else
template <class T>
using RowMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, Eigen::Unaligned,
                          Eigen::OuterStride<>>;
template <class T>
using ConstRowMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>,
                               Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T, class A, class B>
void eigen_assign(RowMap<T>& c, const A& a, const B& b, T alpha, T beta) {
  if (beta == T(0))
    c.noalias() = alpha * (a * b);
  else {
    if (beta != T(1)) c *= beta;
    c.noalias() += alpha * (a * b);
  }
}
#endif
}  // namespace detail

// C (m, n) = alpha op(A) op(B) + beta C, row-major with leading dimensions (row strides)
// lda, ldb, ldc; op(A) is (m, k), op(B) (k, n). beta = 0 ignores C's contents. One thread.
template <class T>
void gemm(Op ta, Op tb, int m, int n, int k, T alpha, const T* a, int lda, const T* b, int ldb, T beta, T* c,
          int ldc) {
  if (m <= 0 || n <= 0) return;
#if defined(DILOCOX_TRAINER_BLAS)
  detail::blas_single_thread();
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  detail::blas_gemm(tb == Op::trans ? 'T' : 'N', ta == Op::trans ? 'T' : 'N', n, m, k, alpha, b, ldb, a, lda, beta, c,
                    ldc);
#else
  using detail::ConstRowMap;
  detail::RowMap<T> cm(c, m, n, Eigen::OuterStride<>(ldc));
  const bool at = ta == Op::trans, bt = tb == Op::trans;
  ConstRowMap<T> am(a, at ? k : m, at ? m : k, Eigen::OuterStride<>(lda));
  ConstRowMap<T> bm(b, bt ? n : k, bt ? k : n, Eigen::OuterStride<>(ldb));
  if (at && bt)
    detail::eigen_assign(cm, am.transpose(), bm.transpose(), alpha, beta);
  else if (at)
    detail::eigen_assign(cm, am.transpose(), bm, alpha, beta);
  else if (bt)
    detail::eigen_assign(cm, am, bm.transpose(), alpha, beta);
  else
    detail::eigen_assign(cm, am, bm, alpha, beta);
#endif
}

// Row blocks of a split product start at multiples of 48: a BLAS computes C in tiles of
// a few rows (OpenBLAS's float kernel on AVX2: 12; others 2, 4, 8, 16) and an edge tile
// sums in another order than a full one, so a split must not move the tile boundaries.
inline constexpr std::size_t gemm_row_align = 48;

// gemm with C's rows split over the threads: each block is one product of the same k
// with the tiles where the one-thread call has them, so every element comes out the same.
template <class T>
void gemm_rows(Op ta, Op tb, int m, int n, int k, T alpha, const T* a, int lda, const T* b, int ldb, T beta, T* c,
               int ldc) {
  parallel_ranges(static_cast<std::size_t>(m), gemm_row_align, [&](int, std::size_t r0, std::size_t r1) {
    const T* ar = ta == Op::trans ? a + r0 : a + r0 * static_cast<std::size_t>(lda);  // op(A)'s rows r0..r1
    gemm(ta, tb, static_cast<int>(r1 - r0), n, k, alpha, ar, lda, b, ldb, beta, c + r0 * static_cast<std::size_t>(ldc),
         ldc);
  });
}

}  // namespace dilocox::trainer::cpu
