// tests/cuda/test_gemm_mapping.cpp (label unit, runs without a GPU): the row-major GEMM
// helper's translation into cuBLAS's column-major call (blas.hpp column_major_call),
// executed by a host model of cuBLAS's documented semantics and compared with the
// row-major product, for every transpose pair with padded strides; then the argument
// patterns the projector and the CUDA GPT use, against the math each one stands for.
#include <dilocox/cuda/blas.hpp>

#include <gtest/gtest.h>

#include <vector>

namespace {

using dilocox::cuda::column_major_call;

// cuBLAS: C (m, n) = alpha op(A) op(B) + beta C, all column-major with leading dims.
void cublas_model(cublasOperation_t opa, cublasOperation_t opb, int m, int n, int k, const double* A, int lda,
                  const double* B, int ldb, double* C, int ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int l = 0; l < k; ++l) {
        const double a = opa == CUBLAS_OP_N ? A[i + l * lda] : A[l + i * lda];
        const double b = opb == CUBLAS_OP_N ? B[l + j * ldb] : B[j + l * ldb];
        s += a * b;
      }
      C[i + j * ldc] = s;
    }
}

// Row-major C = op(A) op(B) through the mapping and the cuBLAS model.
std::vector<double> via_mapping(bool ta, bool tb, int m, int n, int k, const std::vector<double>& A, int lda,
                                const std::vector<double>& B, int ldb, int ldc) {
  std::vector<double> C(static_cast<std::size_t>(m) * ldc, 0.0);
  const auto c = column_major_call(ta, tb, m, n, k);
  cublas_model(c.op_first, c.op_second, c.m, c.n, c.k, B.data(), ldb, A.data(), lda, C.data(), ldc);
  return C;
}

std::vector<double> filled(std::size_t n, int seed) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<double>((i * 37 + static_cast<std::size_t>(seed) * 11) % 17) - 8;
  return v;
}

}  // namespace

TEST(GemmRowMajor, EveryTransposePairWithPaddedStrides) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int m = 5, n = 3, k = 4;
      const int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
      const int lda = a_cols + 2, ldb = b_cols + 1, ldc = n + 3;
      const auto A = filled(static_cast<std::size_t>(a_rows) * lda, 1), B = filled(static_cast<std::size_t>(b_rows) * ldb, 2);
      const auto C = via_mapping(ta, tb, m, n, k, A, lda, B, ldb, ldc);
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          double want = 0;
          for (int l = 0; l < k; ++l)
            want += (ta ? A[l * lda + i] : A[i * lda + l]) * (tb ? B[j * ldb + l] : B[l * ldb + j]);
          EXPECT_EQ(C[i * ldc + j], want) << "trans_a " << ta << " trans_b " << tb << " at " << i << ", " << j;
        }
    }
}

// Expects got (m, n), row stride ldc, == sum over l < k of a(i, l) * b(l, j).
template <class A, class B>
void expect_product(const std::vector<double>& got, int ldc, int m, int n, int k, A a, B b, const char* what) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double w = 0;
      for (int l = 0; l < k; ++l) w += a(i, l) * b(l, j);
      EXPECT_EQ(got[static_cast<std::size_t>(i) * ldc + j], w) << what << " at " << i << ", " << j;
    }
}

// The call patterns of cuda/lowrank.cuh and model/cuda/cuda_stage_model.cu.
TEST(GemmRowMajor, CallSitesComputeTheirProducts) {
  auto el = [](const std::vector<double>& v, int ld) {
    return [&v, ld](int i, int j) { return v[static_cast<std::size_t>(i) * ld + j]; };
  };
  auto tr = [](const std::vector<double>& v, int ld) {  // the transpose of stored v
    return [&v, ld](int i, int j) { return v[static_cast<std::size_t>(j) * ld + i]; };
  };
  const int R = 3, M = 6, Nn = 5;  // X (M, Nn), rank R
  const auto X = filled(static_cast<std::size_t>(M) * Nn, 3), Q = filled(static_cast<std::size_t>(Nn) * R, 4);
  const auto P = filled(static_cast<std::size_t>(M) * R, 5);
  expect_product(via_mapping(false, false, M, R, Nn, X, Nn, Q, R, R), R, M, R, Nn, el(X, Nn), el(Q, R), "P = X Q");
  expect_product(via_mapping(true, false, Nn, R, M, X, Nn, P, R, R), R, Nn, R, M, tr(X, Nn), el(P, R), "Q = X^T P");
  expect_product(via_mapping(false, true, M, Nn, R, P, R, Q, R, Nn), Nn, M, Nn, R, el(P, R), tr(Q, R), "P Q^T");
  const int N = 4, IC = 3, OC = 5;  // x (N, IC), W (OC, IC), dout (N, OC)
  const auto x = filled(static_cast<std::size_t>(N) * IC, 6), W = filled(static_cast<std::size_t>(OC) * IC, 7);
  const auto dout = filled(static_cast<std::size_t>(N) * OC, 8);
  expect_product(via_mapping(false, true, N, OC, IC, x, IC, W, IC, OC), OC, N, OC, IC, el(x, IC), tr(W, IC), "x W^T");
  expect_product(via_mapping(true, false, OC, IC, N, dout, OC, x, IC, IC), IC, OC, IC, N, tr(dout, OC), el(x, IC),
                 "dW = dout^T x");
  expect_product(via_mapping(false, false, N, IC, OC, dout, OC, W, IC, IC), IC, N, IC, OC, el(dout, OC), el(W, IC),
                 "dx = dout W");
}
